//! Heartbeats of slot leases: a lease holding `concurrent` slots moves its rows' expiry on
//! while its holder lives, so a slot lasts as long as its call, not as long as a guess made
//! before it, and comes back within its TTL (plus the clock-skew margin) after its holder
//! dies or freezes.
//!
//! Each renewal is one conditional `UpdateItem` per slot row (one write unit for a row
//! under 1 KB), every third of the lease's TTL: 0.05 write units a second per held slot at
//! the default 60 s. A renewal is conditioned on the expiry its holder last set, and a
//! reclaim (by another client or the reconciler) on the expiry it saw: one of the two
//! wins, never both. A holder whose renewal lost, or that wakes past its expiry (a frozen
//! Lambda), no longer holds the slot, and what runs under it is stopped.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::clock::UnixMillis;
use crate::shared::Core;
use crate::store::LeaseKey;

/// What a held lease knows of its slot rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Held {
    /// The earliest expiry of its rows, as last renewed.
    until: UnixMillis,
    /// A renewal found a row gone or changed, or the holder woke past `until`.
    lost: bool,
}

/// The heartbeats of one lease's slot rows: a task owned by the lease, stopped when the
/// lease is dropped or released.
#[derive(Debug)]
pub(crate) struct Keeper {
    core: Arc<Core>,
    held: watch::Receiver<Held>,
    task: tokio::task::JoinHandle<()>,
}

impl Keeper {
    /// Starts renewing `rows`, written to expire at `expires_at` for a lease of `ttl`:
    /// `None` without rows to renew or outside a tokio runtime.
    pub(crate) fn start(
        core: &Arc<Core>,
        rows: Vec<LeaseKey>,
        expires_at: UnixMillis,
        ttl: Duration,
    ) -> Option<Keeper> {
        if rows.is_empty() {
            return None;
        }
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        let (tell, held) = watch::channel(Held {
            until: expires_at,
            lost: false,
        });
        let rows = rows.into_iter().map(|key| (key, expires_at)).collect();
        let ttl = ttl.max(Duration::from_millis(3));
        let task = runtime.spawn(beat(core.clone(), rows, ttl, tell));
        Some(Keeper {
            core: core.clone(),
            held,
            task,
        })
    }

    /// When the slot rows expire unless renewed again.
    pub(crate) fn until(&self) -> UnixMillis {
        self.held.borrow().until
    }

    /// Whether the slot is no longer this holder's.
    pub(crate) fn is_lost(&self) -> bool {
        let held = *self.held.borrow();
        held.lost || self.core.now() >= held.until
    }

    /// Resolves once the slot is no longer this holder's: a renewal lost to a reclaim, or
    /// its expiry passed by this client's clock without a renewal.
    pub(crate) fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut held = self.held.clone();
        let core = self.core.clone();
        async move {
            loop {
                let now = *held.borrow_and_update();
                if now.lost {
                    return;
                }
                let left = now.until.saturating_since(core.now());
                if left.is_zero() {
                    return;
                }
                tokio::select! {
                    changed = held.changed() => {
                        if changed.is_err() {
                            // The heartbeats stopped with the lease: nothing to lose.
                            return std::future::pending().await;
                        }
                    }
                    () = tokio::time::sleep(left) => {}
                }
            }
        }
    }
}

impl Drop for Keeper {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Renews `rows` every third of `ttl` (sooner after a failed renewal) until one is found
/// gone or changed, or the holder wakes past the earliest expiry.
async fn beat(
    core: Arc<Core>,
    mut rows: Vec<(LeaseKey, UnixMillis)>,
    ttl: Duration,
    tell: watch::Sender<Held>,
) {
    let every = ttl / 3;
    // Renewed once less than two thirds of the TTL is left by the client's clock: a clock
    // that stands still (a test's) never needs a renewal.
    let renew_within = ttl - every;
    let mut wait = every;
    loop {
        tokio::time::sleep(wait).await;
        let until = earliest(&rows);
        let now = core.now();
        let left = until.saturating_since(now);
        if !left.is_zero() && left > renew_within {
            wait = (left - renew_within).max(Duration::from_millis(1));
            continue;
        }
        if now >= until {
            tracing::warn!(
                late_ms = now.saturating_since(until).as_millis() as u64,
                "a slot lease woke past its expiry (the process was frozen or the store kept failing): its slot may be another caller's, so it is given up"
            );
            tell.send_replace(Held { until, lost: true });
            return;
        }
        let to = now.saturating_add(ttl);
        let mut failed = false;
        for (key, from) in &mut rows {
            match core.store.renew_lease(key, *from, to).await {
                Ok(true) => *from = to,
                Ok(false) => {
                    tracing::warn!(%key, "a slot lease's row was reclaimed before its renewal: its slot is no longer this holder's");
                    tell.send_replace(Held { until, lost: true });
                    return;
                }
                Err(error) => {
                    tracing::debug!(%key, %error, "a slot lease's renewal failed; trying again sooner");
                    failed = true;
                }
            }
        }
        crate::metrics::slot_renewed(rows.len(), failed);
        tell.send_replace(Held {
            until: earliest(&rows),
            lost: false,
        });
        wait = if failed {
            (every / 4).max(Duration::from_millis(1))
        } else {
            every
        };
    }
}

fn earliest(rows: &[(LeaseKey, UnixMillis)]) -> UnixMillis {
    rows.iter()
        .map(|(_, at)| *at)
        .min()
        .unwrap_or(UnixMillis::new(0))
}
