//! Deleting the lease rows of many releases at once.
//!
//! A `requests`/`tokens` lease row ends with no condition (whoever deletes it gives nothing
//! back), so the releases of a process share their deletes: while one batch is in flight,
//! the rows released meanwhile queue, and go together in the next.

use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::oneshot;

use crate::store::{LeaseKey, Store, StoreError};

/// The releases waiting for their rows to be deleted.
#[derive(Debug, Default, Clone)]
pub(crate) struct Deletes(Arc<Mutex<Queue>>);

#[derive(Debug, Default)]
struct Queue {
    keys: Vec<LeaseKey>,
    replies: Vec<oneshot::Sender<Result<(), StoreError>>>,
    /// Whether a batch is in flight (its sender sends the queue after it).
    sending: bool,
}

impl Deletes {
    /// Deletes `keys` (rows already gone count as deleted), in one batch with every other
    /// release's rows queued meanwhile. The batch goes on if the caller stops waiting.
    pub(crate) async fn delete(
        &self,
        store: &Arc<dyn Store>,
        keys: Vec<LeaseKey>,
    ) -> Result<(), StoreError> {
        if keys.is_empty() {
            return Ok(());
        }
        let (reply, answer) = oneshot::channel();
        let start = {
            let mut queue = self.0.lock().unwrap_or_else(PoisonError::into_inner);
            queue.keys.extend(keys);
            queue.replies.push(reply);
            !std::mem::replace(&mut queue.sending, true)
        };
        if start {
            tokio::spawn(send(self.0.clone(), store.clone()));
        }
        answer.await.unwrap_or_else(|_| {
            Err(StoreError::service(
                "the batch deleting lease rows was dropped",
            ))
        })
    }
}

/// Sends the queue, then what queued meanwhile, until it is empty.
async fn send(queue: Arc<Mutex<Queue>>, store: Arc<dyn Store>) {
    let mut sender = Sender {
        queue: &queue,
        done: false,
    };
    loop {
        let (mut keys, replies) = {
            let mut q = queue.lock().unwrap_or_else(PoisonError::into_inner);
            if q.replies.is_empty() {
                q.sending = false;
                sender.done = true;
                return;
            }
            (std::mem::take(&mut q.keys), std::mem::take(&mut q.replies))
        };
        // A batch names each row once (DynamoDB refuses one that names a row twice).
        keys.sort();
        keys.dedup();
        let result = store.delete_leases(&keys).await;
        for reply in replies {
            let _ = reply.send(match &result {
                Ok(()) => Ok(()),
                Err(e) => Err(e.clone_lossy()),
            });
        }
    }
}

/// A sender that stopped before its queue was empty (its store panicked, its runtime shut
/// down): the releases it held hear so, and the next one sends.
struct Sender<'a> {
    queue: &'a Mutex<Queue>,
    done: bool,
}

impl Drop for Sender<'_> {
    fn drop(&mut self) {
        if !self.done {
            let mut q = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
            q.sending = false;
            q.keys.clear();
            q.replies.clear();
        }
    }
}

#[cfg(test)]
mod tests;
