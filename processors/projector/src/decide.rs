//! Decide: from one decoded stock-change record to the rows it projects. Pure, so every
//! rule (which ledger action, which deltas, what makes a record invalid) is unit-tested
//! without a database; [`crate::store`] only executes what this module decided.
//!
//! Validation here is deliberately strict about everything MySQL would refuse in strict
//! mode (ids longer than their VARCHAR(64), negative values for UNSIGNED columns, a date
//! that is not a date): such a record can never be applied, so it must be reported
//! [`Failure::Invalid`](stocksvr_pipeline::consumer::Failure::Invalid) on its own instead
//! of failing the database transaction of the whole batch.

use chrono::{DateTime, NaiveDate, Utc};
use stocksvr_core::events::{
    Envelope, EventData, EventError, EventKind, StockAfter, StockBaselineAdjustedData,
    StockBucketInitializedData, StockBucketRebuiltData, StockBucketRepairedData, StockChangeData,
};
use stocksvr_pipeline::codec::{DecodeError, Decoded};

/// Length of the VARCHAR(64) id columns (event_id, operation_id, stock_bucket_id, ...).
pub const MAX_ID_LEN: usize = 64;

pub use stocksvr_core::codes::LedgerAction;

/// Everything one event writes, decided before any I/O.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Projection {
    pub kind: EventKind,
    /// `<operation_id>:<kind>` from the producer; only logged: the ledger's operation_id is
    /// what dedupes a redelivery.
    pub event_id: String,
    pub ledger: LedgerRow,
    /// `None` when the event carries no bucket version (an empty rollback on a bucket Redis
    /// has not created yet reports version 0): there is no Redis state to project.
    pub snapshot: Option<SnapshotRow>,
    /// Only reservation steps have a reservation; init and adjust come from the WAL.
    pub sync: Option<ReservationSync>,
    /// The envelope's `occurred_at`, the start of the projection delay. Only a metric needs
    /// it, so an unreadable one (`None`) does not make the event invalid.
    pub occurred_at: Option<DateTime<Utc>>,
}

/// `occurred_at` (RFC 3339 with an offset) as UTC.
pub fn occurred_at(raw: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(raw).ok().map(|t| t.to_utc())
}

/// One `inventory_ledger` row; unique on `operation_id`, so an operation is booked once and
/// a redelivered event is recognised by it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerRow {
    pub operation_id: String,
    pub reservation_id: Option<u64>,
    pub stock_bucket_id: String,
    pub order_id: Option<u64>,
    pub order_item_id: Option<u64>,
    pub merchant_id: u64,
    pub dish_id: u64,
    pub action: LedgerAction,
    pub quantity: u32,
    pub available_delta: i64,
    pub reserved_delta: i64,
    pub sold_delta: i64,
    pub total_delta: i64,
    /// `None` for version 0, which names no bucket state.
    pub redis_version: Option<u64>,
}

/// The absolute after-quantities of a bucket at `redis_version`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotRow {
    pub stock_bucket_id: String,
    pub merchant_id: u64,
    pub dish_id: u64,
    pub stock_date: NaiveDate,
    pub after: StockAfter,
    /// `Some` only for events that state the deficit (init resets it to 0, adjust reports
    /// it); reservation steps do not carry it, so the stored value is kept for them.
    pub deficit: Option<i64>,
    pub redis_version: u64,
}

/// Advances `inventory_reservation.synced_redis_version`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReservationSync {
    pub reservation_id: u64,
    pub redis_version: u64,
}

/// Why a record can never be projected; becomes `Failure::Invalid` (dead letter).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidEvent {
    #[error("{0} is not a stock-change event")]
    NotAStockChange(String),
    #[error("cannot read as a typed event: {0}")]
    Decode(#[from] DecodeError),
    #[error("envelope contradicts its data: {0}")]
    Contract(#[from] EventError),
    #[error("{event}: {field} {reason}")]
    Field {
        event: String,
        field: &'static str,
        reason: String,
    },
}

/// A repair and a rebuild carry the same fields under two record names (their schemas evolve
/// apart): one expansion reads either into [`Corrected`].
macro_rules! corrected_from {
    ($e:expr, $kind:expr, $action:expr) => {{
        let e = $e;
        let d = &e.data;
        corrected(
            &e.event_id,
            &e.occurred_at,
            $kind,
            $action,
            Corrected {
                operation_id: &d.operation_id,
                stock_bucket_id: &d.stock_bucket_id,
                merchant_id: d.merchant_id,
                dish_id: d.dish_id,
                stock_date: &d.stock_date,
                deltas: [
                    d.total_delta,
                    d.available_delta,
                    d.reserved_delta,
                    d.sold_delta,
                ],
                deficit: d.deficit,
                redis_version: d.redis_version,
                after: d.after,
            },
        )
    }};
}

/// Decodes `event` by its writer full name and turns it into the rows it projects.
pub fn decide(event: &Decoded) -> Result<Projection, InvalidEvent> {
    let kind = EventKind::from_full_name(&event.full_name)
        .ok_or_else(|| InvalidEvent::NotAStockChange(event.full_name.clone()))?;
    match kind {
        EventKind::InventoryRedisReserved
        | EventKind::InventoryRedisConfirmed
        | EventKind::InventoryRedisCanceled
        | EventKind::InventoryRedisRefunded => stock_change(typed(event)?),
        EventKind::StockBucketInitialized => bucket_initialized(typed(event)?),
        EventKind::StockBaselineAdjusted => baseline_adjusted(typed(event)?),
        EventKind::StockBucketRepaired => {
            let e: Envelope<StockBucketRepairedData> = typed(event)?;
            corrected_from!(e, EventKind::StockBucketRepaired, LedgerAction::Repair)
        }
        EventKind::StockBucketRebuilt => {
            let e: Envelope<StockBucketRebuiltData> = typed(event)?;
            corrected_from!(e, EventKind::StockBucketRebuilt, LedgerAction::Rebuild)
        }
        _ => Err(InvalidEvent::NotAStockChange(event.full_name.clone())),
    }
}

fn typed<D: EventData>(event: &Decoded) -> Result<Envelope<D>, InvalidEvent> {
    let envelope: Envelope<D> = event.clone().into_typed(&event.full_name)?;
    // An InventoryRedisReserved record whose action is CONFIRM, or a partition_key that is
    // not the bucket, is a producer bug: projecting it would book the wrong action.
    envelope.check(&event.full_name)?;
    Ok(envelope)
}

/// Field checks of one event, naming the event in every error.
struct Check<'a> {
    event: &'a str,
}

impl Check<'_> {
    fn fail(&self, field: &'static str, reason: impl Into<String>) -> InvalidEvent {
        InvalidEvent::Field {
            event: self.event.to_owned(),
            field,
            reason: reason.into(),
        }
    }

    fn id(&self, field: &'static str, value: &str) -> Result<String, InvalidEvent> {
        if value.is_empty() {
            return Err(self.fail(field, "is empty"));
        }
        if value.chars().count() > MAX_ID_LEN {
            return Err(self.fail(field, format!("is longer than {MAX_ID_LEN} characters")));
        }
        Ok(value.to_owned())
    }

    fn unsigned(&self, field: &'static str, value: i64) -> Result<u64, InvalidEvent> {
        u64::try_from(value).map_err(|_| self.fail(field, format!("is negative ({value})")))
    }

    fn quantity(&self, field: &'static str, value: i64) -> Result<u32, InvalidEvent> {
        u32::try_from(value).map_err(|_| self.fail(field, format!("{value} is out of range")))
    }

    fn date(&self, value: &str) -> Result<NaiveDate, InvalidEvent> {
        NaiveDate::parse_from_str(value, "%Y-%m-%d")
            .map_err(|e| self.fail("stock_date", format!("{value:?} is not YYYY-MM-DD: {e}")))
    }

    /// Redis refuses to write a negative quantity (`check_stock`), so one here was not
    /// produced by the scripts and must not reach the snapshot.
    fn after(&self, after: StockAfter) -> Result<StockAfter, InvalidEvent> {
        for (name, value) in [
            ("after.total", after.total),
            ("after.available", after.available),
            ("after.reserved", after.reserved),
            ("after.sold", after.sold),
        ] {
            if value < 0 {
                return Err(self.fail("after", format!("{name} is negative ({value})")));
            }
        }
        Ok(after)
    }
}

fn stock_change(e: Envelope<StockChangeData>) -> Result<Projection, InvalidEvent> {
    let c = Check { event: &e.event_id };
    let d = &e.data;
    let version = c.unsigned("redis_version", d.redis_version)?;
    let bucket = c.id("stock_bucket_id", &d.stock_bucket_id)?;
    let merchant_id = c.unsigned("merchant_id", d.merchant_id)?;
    let dish_id = c.unsigned("dish_id", d.dish_id)?;
    let reservation_id = c.unsigned("reservation_id", d.reservation_id)?;
    let snapshot = SnapshotRow {
        stock_bucket_id: bucket.clone(),
        merchant_id,
        dish_id,
        stock_date: c.date(&d.stock_date)?,
        after: c.after(d.after)?,
        // A cancel or refund pays a deficit down first; the scripts keep
        // available + reserved + sold = total + deficit, so `after` says what is left.
        deficit: Some(implied_deficit(&d.after)),
        redis_version: version,
    };
    let ledger = LedgerRow {
        operation_id: c.id("operation_id", &d.operation_id)?,
        reservation_id: Some(reservation_id),
        stock_bucket_id: bucket,
        order_id: Some(c.unsigned("order_id", d.order_id)?),
        order_item_id: Some(c.unsigned("order_item_id", d.order_item_id)?),
        merchant_id,
        dish_id,
        action: d.action.into(),
        quantity: c.quantity("quantity", d.quantity.into())?,
        // The deltas are what the reservation service computed for this step (an empty
        // rollback has all three at 0); the ledger books them as stated.
        available_delta: d.available_delta,
        reserved_delta: d.reserved_delta,
        sold_delta: d.sold_delta,
        total_delta: 0,
        redis_version: (version > 0).then_some(version),
    };
    Ok(Projection {
        kind: e.kind(),
        event_id: c.id("event_id", &e.event_id)?,
        ledger,
        snapshot: (version > 0).then_some(snapshot),
        sync: Some(ReservationSync {
            reservation_id,
            redis_version: version,
        }),
        occurred_at: occurred_at(&e.occurred_at),
    })
}

fn bucket_initialized(e: Envelope<StockBucketInitializedData>) -> Result<Projection, InvalidEvent> {
    let c = Check { event: &e.event_id };
    let d = &e.data;
    let version = c.unsigned("redis_version", d.redis_version)?;
    let bucket = c.id("stock_bucket_id", &d.stock_bucket_id)?;
    let merchant_id = c.unsigned("merchant_id", d.merchant_id)?;
    let dish_id = c.unsigned("dish_id", d.dish_id)?;
    let after = c.after(d.after)?;
    let ledger = LedgerRow {
        operation_id: c.id("operation_id", &d.operation_id)?,
        reservation_id: None,
        stock_bucket_id: bucket.clone(),
        order_id: None,
        order_item_id: None,
        merchant_id,
        dish_id,
        action: LedgerAction::Init,
        // The script's own argument (init_bucket records `total` as the op quantity).
        quantity: c.quantity("total", d.total)?,
        // The bucket comes into existence: every quantity moves from nothing to `after`.
        available_delta: after.available,
        reserved_delta: after.reserved,
        sold_delta: after.sold,
        total_delta: after.total,
        redis_version: (version > 0).then_some(version),
    };
    let snapshot = SnapshotRow {
        stock_bucket_id: bucket,
        merchant_id,
        dish_id,
        stock_date: c.date(&d.stock_date)?,
        after,
        // init_bucket always leaves deficit at 0, also when it re-initialises.
        deficit: Some(0),
        redis_version: version,
    };
    Ok(Projection {
        kind: EventKind::StockBucketInitialized,
        event_id: c.id("event_id", &e.event_id)?,
        ledger,
        snapshot: (version > 0).then_some(snapshot),
        sync: None,
        occurred_at: occurred_at(&e.occurred_at),
    })
}

fn baseline_adjusted(e: Envelope<StockBaselineAdjustedData>) -> Result<Projection, InvalidEvent> {
    let c = Check { event: &e.event_id };
    let d = &e.data;
    let version = c.unsigned("redis_version", d.redis_version)?;
    let bucket = c.id("stock_bucket_id", &d.stock_bucket_id)?;
    let merchant_id = c.unsigned("merchant_id", d.merchant_id)?;
    let dish_id = c.unsigned("dish_id", d.dish_id)?;
    let after = c.after(d.after)?;
    if d.deficit < 0 {
        return Err(c.fail("deficit", format!("is negative ({})", d.deficit)));
    }
    // The total before the adjust is a Redis quantity too, never negative; checking it also
    // keeps `after.total - old_total` below from overflowing (the decoder fuzz found an
    // old_total near i64::MIN panicking here, which would have stopped the projector on
    // every redelivery of the record).
    if d.old_total < 0 {
        return Err(c.fail("old_total", format!("is negative ({})", d.old_total)));
    }
    let ledger = LedgerRow {
        operation_id: c.id("operation_id", &d.operation_id)?,
        reservation_id: None,
        stock_bucket_id: bucket.clone(),
        order_id: None,
        order_item_id: None,
        merchant_id,
        dish_id,
        action: LedgerAction::Adjust,
        // The script's own argument (adjust records `new_total` as the op quantity).
        quantity: c.quantity("new_total", d.new_total)?,
        available_delta: d.available_delta,
        // Accepted orders are never taken back by an adjust.
        reserved_delta: 0,
        sold_delta: 0,
        // What actually applied: `after.total` may differ from `new_total` when part of a
        // decrease became a deficit, and summing the ledger must give the stored total.
        total_delta: after.total - d.old_total,
        redis_version: (version > 0).then_some(version),
    };
    let snapshot = SnapshotRow {
        stock_bucket_id: bucket,
        merchant_id,
        dish_id,
        stock_date: c.date(&d.stock_date)?,
        after,
        deficit: Some(d.deficit),
        redis_version: version,
    };
    Ok(Projection {
        kind: EventKind::StockBaselineAdjusted,
        event_id: c.id("event_id", &e.event_id)?,
        ledger,
        snapshot: (version > 0).then_some(snapshot),
        sync: None,
        occurred_at: occurred_at(&e.occurred_at),
    })
}

/// The deficit `after` implies: `available + reserved + sold - total` (never negative).
fn implied_deficit(after: &StockAfter) -> i64 {
    // Saturating: the numbers come off the wire, and a fuzzed or corrupt event must be
    // refused downstream, not overflow here.
    after
        .available
        .saturating_add(after.reserved)
        .saturating_add(after.sold)
        .saturating_sub(after.total)
        .max(0)
}

/// The fields a repair and a rebuild share: both book the deltas that make the ledger add
/// up to `after`, and put `after` in the snapshot.
struct Corrected<'a> {
    operation_id: &'a str,
    stock_bucket_id: &'a str,
    merchant_id: i64,
    dish_id: i64,
    stock_date: &'a str,
    /// total, available, reserved, sold.
    deltas: [i64; 4],
    deficit: i64,
    redis_version: i64,
    after: StockAfter,
}

fn corrected(
    event_id: &str,
    occurred: &str,
    kind: EventKind,
    action: LedgerAction,
    d: Corrected<'_>,
) -> Result<Projection, InvalidEvent> {
    let c = Check { event: event_id };
    let version = c.unsigned("redis_version", d.redis_version)?;
    if version == 0 {
        return Err(c.fail("redis_version", "is 0: a repaired bucket has a version"));
    }
    if d.deficit < 0 {
        return Err(c.fail("deficit", format!("is negative ({})", d.deficit)));
    }
    let bucket = c.id("stock_bucket_id", d.stock_bucket_id)?;
    let merchant_id = c.unsigned("merchant_id", d.merchant_id)?;
    let dish_id = c.unsigned("dish_id", d.dish_id)?;
    let after = c.after(d.after)?;
    let [total, available, reserved, sold] = d.deltas;
    let ledger = LedgerRow {
        operation_id: c.id("operation_id", d.operation_id)?,
        reservation_id: None,
        stock_bucket_id: bucket.clone(),
        order_id: None,
        order_item_id: None,
        merchant_id,
        dish_id,
        action,
        quantity: 0,
        available_delta: available,
        reserved_delta: reserved,
        sold_delta: sold,
        total_delta: total,
        redis_version: Some(version),
    };
    let snapshot = SnapshotRow {
        stock_bucket_id: bucket,
        merchant_id,
        dish_id,
        stock_date: c.date(d.stock_date)?,
        after,
        deficit: Some(d.deficit),
        redis_version: version,
    };
    Ok(Projection {
        kind,
        event_id: c.id("event_id", event_id)?,
        ledger,
        snapshot: Some(snapshot),
        sync: None,
        occurred_at: occurred_at(occurred),
    })
}

#[cfg(test)]
mod fuzz;
#[cfg(test)]
mod tests;
