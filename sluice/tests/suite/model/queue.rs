//! Callers waiting their turn (`acquire_within`) in the model: a reservation takes its cost
//! from the true bucket when it is written, going below the floor by no more than refills
//! within the wait, and its turn is exactly when the true bucket's refill has repaid it;
//! a caller the bucket cannot serve within its wait is refused with the exact RetryIn and
//! nothing taken; one that gives up (dropped after some polls, before or during its turn)
//! leaves nothing taken. The turns feed the window check: a grant counts when it may be
//! used.

use std::pin::pin;
use std::sync::atomic::Ordering;
use std::task::Poll;
use std::time::Duration;

use proptest::prelude::*;
use sluice::{Error, Tokens, store::Take};

use super::{Dim, Granted, Mode, PREFETCH, Target, Truth, World};

/// The TTL a waiting caller asks for: its lease expires this long after its turn, which is
/// how the model reads the turn back.
const TTL: Duration = Duration::from_secs(5);

/// What a waiting caller asks for.
pub(super) struct Asked {
    pub(super) client: usize,
    pub(super) target: Target,
    pub(super) cost: i64,
    pub(super) wait: Duration,
}

impl World {
    /// A caller of `asked.client` waiting up to `asked.wait` for its turn; dropped after
    /// `polls` polls if set.
    pub(super) async fn queue(
        &mut self,
        step: usize,
        asked: Asked,
        polls: Option<u8>,
        before: &Truth,
    ) -> Result<(), TestCaseError> {
        let Asked {
            client,
            target,
            cost,
            wait,
        } = asked;
        let c = &self.clients[client];
        let (mode, calls) = (c.mode, c.calls.load(Ordering::SeqCst));
        let now = self.now().as_millis();
        let request = target.request(cost).ttl(TTL);
        let started = tokio::time::Instant::now();
        let mut answer = None;
        {
            let mut waiting = pin!(c.sluice.acquire_within(request, wait));
            match polls {
                None => answer = Some(waiting.await),
                Some(polls) => {
                    for _ in 0..polls {
                        if let Poll::Ready(a) = futures::poll!(waiting.as_mut()) {
                            answer = Some(a);
                            break;
                        }
                    }
                }
            }
        }
        let calls = self.clients[client].calls.load(Ordering::SeqCst) - calls;
        super::settle().await;
        let after = self.truth().await;
        // The turn each dimension gives, from the true bucket (a millisecond of the wait is
        // kept clear of the deadline); only the fast path queues.
        let queue = wait.saturating_sub(Duration::from_millis(1));
        let mut turn = Duration::ZERO;
        let mut servable = true;
        for d in target.dims() {
            match self.take(before, d, cost, client) {
                Take::Granted { .. } => {}
                Take::Short { wait: Some(w) } if w <= queue && mode != Mode::Seed => {
                    turn = turn.max(w);
                }
                _ => servable = false,
            }
        }
        match answer {
            Some(Ok(lease)) => {
                let prefetched = lease.attempts() == 0;
                prop_assert!(
                    servable || prefetched,
                    "granted {target:?} x{cost} past its wait"
                );
                let ready = lease.expires_at().as_millis() - TTL.as_millis() as i64;
                if !prefetched {
                    prop_assert_eq!(
                        ready - now,
                        turn.as_millis() as i64,
                        "the turn of {:?} x{} (waiting up to {:?})",
                        target,
                        cost,
                        wait
                    );
                }
                for d in target.dims() {
                    let took = self.available(before, d) - self.available(&after, d);
                    let mut allowed = vec![Tokens::new(cost)];
                    if mode == Mode::Prefetch && d == Dim::L {
                        allowed.extend([Tokens::new(cost + PREFETCH), Tokens::ZERO]);
                    }
                    prop_assert!(
                        allowed.contains(&took),
                        "{d:?}: a turn of {cost} took {took}"
                    );
                    // The debt a reservation leaves is what refills within its wait.
                    let rate = after[&d].bucket.refill_rate();
                    let floor = self.floor(&after, d, client) - rate.refill_over(queue);
                    prop_assert!(
                        prefetched || self.available(&after, d) >= floor,
                        "{d:?}: a reservation left {} below {floor}",
                        self.available(&after, d)
                    );
                    self.grants.push(Granted {
                        step,
                        dim: d,
                        cost: Tokens::new(cost),
                        ready,
                    });
                }
                self.clients[client].leases.push(lease);
            }
            Some(Err(Error::RetryIn(sluice::RetryIn { delay: retry, .. }))) => {
                self.nothing_taken(before, &after, target)?;
                if calls == 0 {
                    // From memory: only inside a window the store opened.
                    let open = target
                        .dims()
                        .iter()
                        .any(|d| self.windows.get(&(client, *d)).is_some_and(|w| now < *w));
                    prop_assert!(
                        open,
                        "refused {target:?} x{cost} from memory outside a window"
                    );
                } else {
                    prop_assert!(
                        !servable || target == Target::Both,
                        "the store refused {target:?} x{cost}, servable within {wait:?}"
                    );
                    // Exact unless it waited and asked again (back-pressure, or a turn a
                    // millisecond short), and the deadline came first: then counted down.
                    if let Target::One(d) = target
                        && started.elapsed().is_zero()
                        && let Take::Short { wait: Some(exact) } =
                            self.take(before, d, cost, client)
                    {
                        prop_assert_eq!(retry, exact, "the RetryIn of {:?} x{}", d, cost);
                    }
                    // A RetryIn counted down by the wait's own (tokio) time, which the
                    // model's clock does not follow: memory keeps the store's answer.
                    let heard = self.longest_wait(before, target, cost, client);
                    let retry = retry.max(heard.unwrap_or_default());
                    self.refused_until(client, target, now + retry.as_millis() as i64);
                }
            }
            // On DynamoDB the paused clock runs to the deadline while a call is in flight:
            // the caller gives up then.
            Some(Err(Error::Timeout(t))) if polls.is_none() => {
                prop_assert_eq!(t, wait);
                self.gave_up(before, &after, (client, target, cost), now)?;
            }
            Some(Err(
                Error::CostExceedsCapacity { dimension, .. }
                | Error::CostExceedsShare { dimension, .. },
            )) => {
                // Never granted at this priority, however long it waits.
                let d = target
                    .dims()
                    .into_iter()
                    .find(|d| d.name() == dimension.as_str())
                    .unwrap();
                prop_assert!(
                    Tokens::new(cost) + self.floor(before, d, client)
                        > before[&d].bucket.capacity()
                );
                self.nothing_taken(before, &after, target)?;
            }
            Some(Err(e)) => prop_assert!(false, "unexpected error {e}"),
            None => self.gave_up(before, &after, (client, target, cost), now)?,
        }
        Ok(())
    }

    /// A caller that gave up before or during its turn: nothing of it stays taken (but a
    /// prefetching client's tokens taken ahead).
    fn gave_up(
        &mut self,
        before: &Truth,
        after: &Truth,
        (client, target, cost): (usize, Target, i64),
        now: i64,
    ) -> Result<(), TestCaseError> {
        let mode = self.clients[client].mode;
        for d in target.dims() {
            let took = self.available(before, d) - self.available(after, d);
            let mut allowed = vec![Tokens::ZERO];
            if mode == Mode::Prefetch && d == Dim::L {
                allowed.push(Tokens::new(PREFETCH));
            }
            prop_assert!(
                allowed.contains(&took),
                "{d:?}: a caller that gave up took {took}"
            );
        }
        // Its write may have refused it: memory may answer from that refusal.
        if let Some(w) = self.longest_wait(before, target, cost, client) {
            self.refused_until(client, target, now + w.as_millis() as i64);
        }
        Ok(())
    }

    /// The longest exact wait the true bucket gives `client` for `cost` on `target`, if
    /// any of its dimensions is short.
    fn longest_wait(
        &self,
        before: &Truth,
        target: Target,
        cost: i64,
        client: usize,
    ) -> Option<Duration> {
        target
            .dims()
            .into_iter()
            .filter_map(|d| match self.take(before, d, cost, client) {
                Take::Short { wait: Some(w) } => Some(w),
                _ => None,
            })
            .max()
    }

    /// A refusal took nothing from the refilling buckets of `target`.
    fn nothing_taken(
        &self,
        before: &Truth,
        after: &Truth,
        target: Target,
    ) -> Result<(), TestCaseError> {
        for d in target.dims() {
            prop_assert_eq!(
                self.available(before, d),
                self.available(after, d),
                "a refusal changed {:?}",
                d
            );
        }
        Ok(())
    }

    /// Memory may refuse `client`'s requests on `target` until `until` (ms).
    fn refused_until(&mut self, client: usize, target: Target, until: i64) {
        for d in target.dims() {
            let w = self.windows.entry((client, d)).or_insert(until);
            *w = (*w).max(until);
        }
    }
}
