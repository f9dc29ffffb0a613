//! Writing the lease rows of many grants and releases at once.
//!
//! A new lease row is written with no condition, and a `requests`/`tokens` lease row ends
//! with none (whoever deletes it gives nothing back), so the grants and releases of a
//! process share these writes: while one batch is in flight, the rows written and deleted
//! meanwhile queue, and go together in the next (DynamoDB's `BatchWriteItem`, 25 rows a
//! call).

use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::oneshot;

use crate::store::{LeaseKey, LeaseRecord, Store, StoreError};

/// The lease rows waiting to be written or deleted.
#[derive(Debug, Default, Clone)]
pub(crate) struct LeaseRows(Arc<Mutex<Queue>>);

#[derive(Debug, Default)]
struct Queue {
    puts: Vec<LeaseRecord>,
    keys: Vec<LeaseKey>,
    replies: Vec<oneshot::Sender<Result<(), StoreError>>>,
    /// Whether a batch is in flight (its sender sends the queue after it).
    sending: bool,
}

impl LeaseRows {
    /// Writes the new lease rows `records`, in one batch with every other row queued
    /// meanwhile. The batch goes on if the caller stops waiting.
    pub(crate) async fn put(
        &self,
        store: &Arc<dyn Store>,
        records: Vec<LeaseRecord>,
    ) -> Result<(), StoreError> {
        self.queue(store, records, Vec::new()).await
    }

    /// Deletes `keys` (rows already gone count as deleted), in one batch with every other
    /// row queued meanwhile. The batch goes on if the caller stops waiting.
    pub(crate) async fn delete(
        &self,
        store: &Arc<dyn Store>,
        keys: Vec<LeaseKey>,
    ) -> Result<(), StoreError> {
        self.queue(store, Vec::new(), keys).await
    }

    async fn queue(
        &self,
        store: &Arc<dyn Store>,
        puts: Vec<LeaseRecord>,
        keys: Vec<LeaseKey>,
    ) -> Result<(), StoreError> {
        if puts.is_empty() && keys.is_empty() {
            return Ok(());
        }
        let (reply, answer) = oneshot::channel();
        let start = {
            let mut queue = self.0.lock().unwrap_or_else(PoisonError::into_inner);
            queue.puts.extend(puts);
            queue.keys.extend(keys);
            queue.replies.push(reply);
            !std::mem::replace(&mut queue.sending, true)
        };
        if start {
            tokio::spawn(send(self.0.clone(), store.clone()));
        }
        answer.await.unwrap_or_else(|_| {
            Err(StoreError::service(
                "the batch writing lease rows was dropped",
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
        let (puts, mut keys, replies) = {
            let mut q = queue.lock().unwrap_or_else(PoisonError::into_inner);
            if q.replies.is_empty() {
                q.sending = false;
                sender.done = true;
                return;
            }
            (
                std::mem::take(&mut q.puts),
                std::mem::take(&mut q.keys),
                std::mem::take(&mut q.replies),
            )
        };
        // A batch names each row once (DynamoDB refuses one that names a row twice; a row
        // is deleted only once its write is over, so never in the batch that writes it).
        keys.sort();
        keys.dedup();
        let (put, deleted) = futures::join!(
            async {
                if puts.is_empty() {
                    Ok(())
                } else {
                    store.put_leases(&puts).await
                }
            },
            async {
                if keys.is_empty() {
                    Ok(())
                } else {
                    store.delete_leases(&keys).await
                }
            }
        );
        let result = put.and(deleted);
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
            q.puts.clear();
            q.keys.clear();
            q.replies.clear();
        }
    }
}

#[cfg(test)]
mod tests;
