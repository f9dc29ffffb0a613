//! A [`BucketChange`] as one `UpdateItem`: `ADD` to the stored tokens (or `SET` them, for
//! a fill), `ADD` one to the version, on the change's conditions.

use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{ReturnValue, ReturnValuesOnConditionCheckFailure};

use super::billed::TOTAL;
use super::error::ConditionFailed;
use super::parts::Conditional;
use super::row::{self, Expr};
use super::{DynamoStore, EXISTS, Units};
use crate::bucket::{BucketState, Commute, Condition, LedgerChange, MAX_VERSION, TokensOp};
use crate::clock::UnixMillis;
use crate::dimension::Dimension;
use crate::store::{BucketChange, ChangeError, LeaseKey, StoreError};
use crate::tokens::Tokens;

/// A call's configuration that sends it once: what adds to a row must not be resent after
/// an answer that was lost (it may have applied), and throttling is answered above the
/// store (back-pressure, with the caller's deadline in view).
fn once() -> aws_sdk_dynamodb::config::Builder {
    aws_sdk_dynamodb::config::Builder::default()
        .retry_config(aws_sdk_dynamodb::config::retry::RetryConfig::disabled())
}

/// Sends a built request once (see [`once`]), asking what it consumed.
macro_rules! send_once {
    ($builder:expr) => {
        $builder
            .return_consumed_capacity(TOTAL)
            .customize()
            .config_override(once())
            .send()
    };
}

/// The update and condition expressions of `change`, with their names and values.
fn update_of(change: &BucketChange) -> (String, Expr) {
    let (e, clauses) = parts_of(change);
    (clauses.expression(), e)
}

/// The clauses of an update expression, by kind.
#[derive(Debug, Default)]
pub(super) struct Clauses {
    pub(super) sets: Vec<String>,
    pub(super) adds: Vec<String>,
    pub(super) removes: Vec<String>,
}

impl Clauses {
    /// `SET …` `ADD …` `REMOVE …`, each kind that has clauses.
    pub(super) fn expression(&self) -> String {
        let mut update = String::new();
        for (clause, parts) in [
            ("SET", &self.sets),
            ("ADD", &self.adds),
            ("REMOVE", &self.removes),
        ] {
            if !parts.is_empty() {
                if !update.is_empty() {
                    update.push(' ');
                }
                update.push_str(clause);
                update.push(' ');
                update.push_str(&parts.join(", "));
            }
        }
        update
    }
}

/// The conditions of `change` (its definition, its own) and its update clauses: the
/// tokens, the version, the refill.
pub(super) fn parts_of(change: &BucketChange) -> (Expr, Clauses) {
    let mut e = Expr::default();
    e.name("#key", row::KEY)
        .name("#t", row::TOKENS)
        .name("#v", row::VERSION)
        .value(":one", row::n(1))
        .value(":maxv", row::n(MAX_VERSION))
        .and("attribute_exists(#key)")
        .and("#v < :maxv");
    let key = change.dimension.key().is_some();
    row::same_definition(&mut e, &change.bucket, change.burst, key);
    conditions(&mut e, &change.commute);
    let mut c = Clauses {
        adds: vec!["#v :one".to_owned()],
        ..Clauses::default()
    };
    match change.commute.tokens {
        TokensOp::Add(delta) => {
            e.value(":delta", row::n(delta));
            c.adds.push("#t :delta".to_owned());
        }
        TokensOp::Set(tokens) => {
            e.value(":tokens", row::n(tokens));
            c.sets.push("#t = :tokens".to_owned());
        }
    }
    ledger(&mut e, &mut c, &change.ledger);
    if let Some(now) = change.commute.herd {
        // The lead's instant, or the herd's when it has one (see `Commute::herd`).
        e.name("#l", row::LAST_REFILL_AT)
            .name("#h", row::HERD_AT)
            .name("#rc", row::REFILL_CARRY)
            .value(":herd", row::n(now));
        c.sets.push("#l = if_not_exists(#h, :herd)".to_owned());
        c.sets.push("#h = if_not_exists(#h, :herd)".to_owned());
        c.removes.push("#rc".to_owned());
    }
    if let Some((at, carry)) = change.commute.refill {
        e.name("#l", row::LAST_REFILL_AT)
            .name("#rc", row::REFILL_CARRY)
            .name("#h", row::HERD_AT)
            .value(":last", row::n(at));
        c.sets.push("#l = :last".to_owned());
        c.removes.push("#h".to_owned());
        match row::carry_value(carry, at) {
            Some(value) => {
                e.value(":rc", value);
                c.sets.push("#rc = :rc".to_owned());
            }
            None => c.removes.push("#rc".to_owned()),
        }
    }
    if let Some(created) = change.created() {
        creating(&mut e, &mut c, change, &created);
    }
    (e, c)
}

/// Turns the parts of `change` into those of a write that also creates the row, as
/// `created` (see [`BucketChange::creates`]): on a missing item the condition holds and
/// the update writes the whole row (its definition, and what the change does to the full
/// bucket); on a stored row it is the change as it was, its definition the same.
fn creating(e: &mut Expr, c: &mut Clauses, change: &BucketChange, created: &BucketState) {
    e.or_absent();
    // The version and tokens added to, from the created row's on a missing item.
    c.adds.retain(|a| a != "#v :one" && a != "#t :delta");
    e.value(":first", row::n(created.version));
    c.sets
        .push("#v = if_not_exists(#v, :first) + :one".to_owned());
    if let TokensOp::Add(_) = change.commute.tokens {
        e.value(":full", row::n(created.tokens));
        c.sets
            .push("#t = if_not_exists(#t, :full) + :delta".to_owned());
    }
    if change.commute.refill.is_none() && change.commute.herd.is_none() {
        e.name("#l", row::LAST_REFILL_AT)
            .value(":created", row::n(created.last_refill_at));
        c.sets.push("#l = if_not_exists(#l, :created)".to_owned());
    }
    // The definition, as the stored row already has it (the condition says so).
    for (i, (attribute, value)) in row::definition_attributes(&created.bucket)
        .into_iter()
        .enumerate()
    {
        let (name, placeholder) = (format!("#d{i}"), format!(":d{i}"));
        e.name(&name, &attribute).value(&placeholder, value);
        c.sets.push(format!("{name} = {placeholder}"));
    }
}

/// Adds what `ledger` does to the row's shadow ledger to `e` and `c`: additions, and the
/// condition on what the row owes.
fn ledger(e: &mut Expr, c: &mut Clauses, ledger: &LedgerChange) {
    if ledger.owed != Tokens::ZERO || ledger.owed_was.is_some() {
        e.name("#so", row::SHADOW_OWED);
    }
    if ledger.owed != Tokens::ZERO {
        e.value(":sod", row::n(ledger.owed));
        c.adds.push("#so :sod".to_owned());
    }
    if ledger.refused > 0 {
        e.name("#sr", row::SHADOW_REFUSED)
            .value(":srd", row::n(ledger.refused));
        c.adds.push("#sr :srd".to_owned());
    }
    match ledger.owed_was {
        Some(was) if was == Tokens::ZERO => {
            e.value(":sow", row::n(was))
                .and("(attribute_not_exists(#so) OR #so = :sow)");
        }
        Some(was) => {
            e.value(":sow", row::n(was)).and("#so = :sow");
        }
        None => {}
    }
}

/// Adds the conditions of `c` to `e`: its first set, or any other set.
fn conditions(e: &mut Expr, c: &Commute) {
    // Other sets of conditions matter only beside a first one (an empty first set holds
    // for any row, as `Commute::holds` has it).
    let alternatives: Vec<&Vec<Condition>> = if c.when.is_empty() {
        Vec::new()
    } else {
        c.or_when.iter().filter(|set| !set.is_empty()).collect()
    };
    let when = clauses(e, &c.when, "w");
    if alternatives.is_empty() {
        for clause in when {
            e.and(clause);
        }
    } else {
        let mut any = vec![format!("({})", when.join(" AND "))];
        for (i, set) in alternatives.into_iter().enumerate() {
            let clauses = clauses(e, set, &format!("o{i}n"));
            any.push(format!("({})", clauses.join(" AND ")));
        }
        e.and(format!("({})", any.join(" OR ")));
    }
}

/// The clauses of `conditions`, their values named `:{prefix}0`, `:{prefix}1`…
fn clauses(e: &mut Expr, conditions: &[Condition], prefix: &str) -> Vec<String> {
    let mut clauses = Vec::with_capacity(conditions.len());
    for (i, condition) in conditions.iter().enumerate() {
        let v = format!(":{prefix}{i}");
        // The attributes a clause names: the refill timestamp, the herd's.
        if matches!(
            condition,
            Condition::RefilledAt(_)
                | Condition::RefilledSince(_)
                | Condition::RefilledBy(_)
                | Condition::StampIsHerd
        ) {
            e.name("#l", row::LAST_REFILL_AT);
        }
        if matches!(
            condition,
            Condition::HerdAbsent | Condition::StampIsHerd | Condition::HerdSince(_)
        ) {
            e.name("#h", row::HERD_AT);
        }
        let (clause, value) = match condition {
            Condition::TokensAtLeast(t) => (format!("#t >= {v}"), row::n(t)),
            Condition::TokensAtMost(t) => (format!("#t <= {v}"), row::n(t)),
            Condition::RefilledAt(at) => (format!("#l = {v}"), row::n(at)),
            Condition::RefilledSince(at) => (format!("#l >= {v}"), row::n(at)),
            Condition::RefilledBy(at) => (format!("#l <= {v}"), row::n(at)),
            Condition::HerdSince(at) => (format!("#h >= {v}"), row::n(at)),
            Condition::HerdAbsent => {
                clauses.push("attribute_not_exists(#h)".to_owned());
                continue;
            }
            Condition::StampIsHerd => {
                clauses.push("#l = #h".to_owned());
                continue;
            }
        };
        e.value(&v, value);
        clauses.push(clause);
    }
    clauses
}

impl DynamoStore {
    /// Applies `change` in one `UpdateItem`, never resent by the SDK (see
    /// [`Store::change`](crate::store::Store::change)): the row after it, or the row as it
    /// stands when a condition failed.
    pub(super) async fn change_row(
        &self,
        change: BucketChange,
    ) -> Result<BucketState, ChangeError> {
        let (update, e) = update_of(&change);
        let u = Conditional::new(change.dimension.as_str(), update, e.into_parts());
        let update = conditional!(self.client.update_item(), self.table.as_ref(), u)
            .return_values(ReturnValue::AllNew)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
        let request = send_once!(update);
        match self.billed(Units::Write, request).await {
            Ok(out) => {
                // Per dimension (see the metrics table in `crate::metrics`).
                let units = out
                    .consumed_capacity()
                    .map_or(0, super::billed::capacity_milliunits);
                // A key's row counts under its keyed bucket (one label, not one per key).
                let label = crate::dimension::by_template(change.dimension.as_str()).into_owned();
                ::metrics::counter!("sluice_bucket_write_units_total", "dimension" => label)
                    .increment(units.div_ceil(1_000));
                let Some(item) = out.attributes() else {
                    return Err(StoreError::service("an update answered without the row").into());
                };
                Ok(row::bucket_state(item)?)
            }
            Err(e) => match e.as_service_error() {
                Some(UpdateItemError::ConditionalCheckFailedException(c)) => {
                    let current = c.item().map(row::bucket_state).transpose()?;
                    Err(ChangeError::Condition(current.map(Box::new)))
                }
                _ => Err(self.err(e).into()),
            },
        }
    }

    /// Deletes the lease row `key` if it exists (and, with `expiring_at`, still expires
    /// then), never resent by the SDK; whether this call deleted it.
    pub(super) async fn end_lease_row(
        &self,
        key: &LeaseKey,
        expiring_at: Option<UnixMillis>,
    ) -> Result<bool, StoreError> {
        let mut delete = lease_delete!(self.client.delete_item(), self.table.as_ref(), key);
        if let Some(at) = expiring_at {
            delete = delete
                .condition_expression(format!("{EXISTS} AND #e = :e"))
                .expression_attribute_names("#e", row::EXPIRES_AT)
                .expression_attribute_values(":e", row::n(at));
        }
        let request = send_once!(delete);
        self.applied(self.billed(Units::Write, request).await)
    }

    /// Moves the lease row `key`'s expiry (and its TTL) from `from` to `to`, on condition
    /// that it exists and expires at `from` or already at `to`; whether it did.
    pub(super) async fn renew_lease_row(
        &self,
        key: &LeaseKey,
        from: UnixMillis,
        to: UnixMillis,
    ) -> Result<bool, StoreError> {
        let update = self
            .client
            .update_item()
            .table_name(self.table.as_ref())
            .set_key(Some(row::key(key.as_str())))
            .update_expression("SET #e = :to, #t = :ttl")
            .condition_expression(format!("{EXISTS} AND (#e = :from OR #e = :to)"))
            .expression_attribute_names("#e", row::EXPIRES_AT)
            .expression_attribute_names("#t", row::TTL)
            .expression_attribute_values(":from", row::n(from))
            .expression_attribute_values(":to", row::n(to))
            .expression_attribute_values(":ttl", row::n(to.as_secs_ceil() + row::TTL_GRACE_SECS));
        let request = send_once!(update);
        self.applied(self.billed(Units::Write, request).await)
    }

    /// Adds `weight` to the row's count of clients waiting in `epoch` and removes the
    /// counts of the epochs `forget`, in one `UpdateItem` on condition that the row exists
    /// (see [`Store::count_waiting`](crate::store::Store::count_waiting)); the row after.
    pub(super) async fn count_waiting_row(
        &self,
        dimension: &Dimension,
        epoch: u64,
        weight: u64,
        forget: &[u64],
    ) -> Result<Option<BucketState>, StoreError> {
        let mut update = self
            .client
            .update_item()
            .table_name(self.table.as_ref())
            .set_key(Some(row::key(dimension.as_str())))
            .condition_expression(EXISTS)
            .expression_attribute_names("#c", row::waiting_attribute(epoch))
            .expression_attribute_values(":zero", row::n(0))
            .expression_attribute_values(":w", row::n(weight))
            .return_values(ReturnValue::AllNew);
        let mut expression = "SET #c = if_not_exists(#c, :zero) + :w".to_owned();
        let stale: Vec<u64> = forget.iter().copied().filter(|e| *e != epoch).collect();
        for (i, e) in stale.iter().enumerate() {
            expression.push_str(if i == 0 { " REMOVE " } else { ", " });
            expression.push_str(&format!("#f{i}"));
            update =
                update.expression_attribute_names(format!("#f{i}"), row::waiting_attribute(*e));
        }
        let request = send_once!(update.update_expression(expression));
        match self.billed(Units::Write, request).await {
            Ok(out) => out.attributes().map(row::bucket_state).transpose(),
            Err(e)
                if e.as_service_error()
                    .is_some_and(UpdateItemError::is_conditional_check_failed_exception) =>
            {
                Ok(None)
            }
            Err(e) => Err(self.err(e)),
        }
    }

    /// Whether a conditional write applied: a failed condition is `false`.
    fn applied<T, E, R>(&self, outcome: Result<T, SdkError<E, R>>) -> Result<bool, StoreError>
    where
        E: ConditionFailed + ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
        R: std::fmt::Debug + Send + Sync + 'static,
    {
        match outcome {
            Ok(_) => Ok(true),
            Err(e)
                if e.as_service_error()
                    .and_then(ConditionFailed::item)
                    .is_some() =>
            {
                Ok(false)
            }
            Err(e) => Err(self.err(e)),
        }
    }
}

#[cfg(test)]
mod tests;
