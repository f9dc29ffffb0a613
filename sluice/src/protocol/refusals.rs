//! How a lane write answers the acquires it cannot grant: from memory where the freshness
//! rules allow it ([`remembered`](crate::shared::remembered)), else from the row the store
//! confirmed.

use crate::bucket::{BucketState, Take};
use crate::clock::UnixMillis;
use crate::error::{Error, RetryIn};
use crate::shared::Core;
use crate::shared::lanes::{AcquireJob, Lane, answer_each};
use crate::shared::remembered::Recall;
use crate::store::StoreError;
use crate::tokens::Tokens;

use super::slots::{Refusal, refused_now, slots_short};

/// Answers refusals computed from a remembered row, where memory may give them all;
/// otherwise hands every job back, to be decided from the store.
pub(super) fn from_memory(
    lane: &Lane,
    refused: Vec<AcquireJob>,
    now: UnixMillis,
) -> Result<(), Vec<AcquireJob>> {
    let mut memory = lane.memory();
    let recalled: Vec<Recall> = refused
        .iter()
        .map(|a| memory.recall(&a.wanted, now, a.fresh_after))
        .collect();
    if !recalled.iter().all(|r| matches!(r, Recall::Denied(_))) {
        return Err(refused);
    }
    for (a, recall) in refused.into_iter().zip(recalled) {
        if let Recall::Denied(wait) = recall {
            memory.answered(now.saturating_add(wait));
            let refusal = RetryIn::on(&a.wanted.dimension, wait, now);
            let _ = a.reply.send(Err(Error::RetryIn(refusal)));
        }
    }
    Ok(())
}

/// Answers refusals from `row`, which the store just confirmed (as it stands after this
/// write's grants), and opens the denial window. A short `concurrent` bucket looks up its
/// leases (reclaiming expired ones): when some were given back, the jobs to try again are
/// returned.
pub(super) async fn confirmed(
    core: &Core,
    lane: &Lane,
    row: &BucketState,
    refused: Vec<AcquireJob>,
    now: UnixMillis,
    looked_again: u32,
) -> Vec<AcquireJob> {
    let mut slots = Vec::new();
    let mut again = Vec::new();
    for a in refused {
        match a.wanted.take_from(row, now) {
            // Never after this write's grants; tried again all the same.
            Take::Granted { .. } => again.push(a),
            Take::Short { wait: None } => slots.push(a),
            _ => match refused_now(core, row, &a.wanted, now) {
                Some(Refusal::Wait(wait)) => {
                    lane.memory().answered(now.saturating_add(wait));
                    let refusal = RetryIn::on(&a.wanted.dimension, wait, now);
                    let _ = a.reply.send(Err(Error::RetryIn(refusal)));
                }
                Some(Refusal::Exceeds(error)) => {
                    let _ = a.reply.send(Err(error));
                }
                Some(Refusal::LookAgain) | None => again.push(a),
            },
        }
    }
    if slots.is_empty() {
        return again;
    }
    // A short `concurrent` bucket's refusal does not depend on the cost: one look answers
    // them all.
    // One look answers them all, for the lowest floor among them.
    let floor = slots
        .iter()
        .map(|a| a.wanted.floor(&row.bucket))
        .min()
        .unwrap_or(Tokens::ZERO);
    match slots_short(core, row, now, looked_again, floor).await {
        Ok(Refusal::LookAgain) => {
            lane.memory().forget();
            again.extend(slots);
        }
        Ok(Refusal::Wait(wait)) => {
            lane.memory().answered(now.saturating_add(wait));
            let refusal = RetryIn::on(&row.dimension, wait, now);
            answer_each(slots, |a| a.reply, || Error::RetryIn(refusal.clone()));
        }
        Ok(Refusal::Exceeds(_)) => again.extend(slots),
        Err(e) => {
            let e = e.to_string();
            answer_each(slots, |a| a.reply, || StoreError::service(&e).into());
        }
    }
    again
}
