//! MySQL side of the reservation state machine. Every status change is a CAS on
//! `(status, version)`; a change that finishes a Redis step commits its outbox rows in the
//! same transaction, so an event exists if and only if the state change does.
//!
//! The row and what is written as a new one live here; the statements by job: the Try's
//! insert of PREPARING rows ([`insert`]), the reads ([`read`]), the CAS into an intermediate
//! step ([`begin`]) and out of it ([`complete`]), the recovery worker's and the operator's
//! writes ([`recovery`]) and the stale-reservation watch ([`stale`]).

mod begin;
mod complete;
mod insert;
mod read;
mod recovery;
mod stale;

pub use begin::{begin_step, begin_steps, Begin, Step};
pub use complete::{complete_one, complete_step, complete_steps, Completion};
pub use insert::{insert_preparing, insert_preparing_many};
pub use read::{find, find_by_item, list_by_order, list_by_orders};
pub use recovery::{
    claim_due, discard_unapplied_try, list_stuck, mark_dead, postpone, record_failure, revive,
};
pub use stale::{alert_stale, count_stale, find_stale};

use crate::clock::now;
use chrono::{NaiveDate, NaiveDateTime};
use stocksvr_core::reservation::{ReservationStatus, SyncStatus};

/// `inventory_reservation` row.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct Reservation {
    pub id: u64,
    pub order_id: u64,
    pub order_item_id: u64,
    pub merchant_id: u64,
    pub dish_id: u64,
    pub stock_bucket_id: String,
    pub stock_date: NaiveDate,
    pub quantity: u32,
    pub refunded_quantity: u32,
    pub pending_quantity: u32,
    pub order_type: i8,
    pub processing_time: Option<NaiveDateTime>,
    pub expire_at: NaiveDateTime,
    pub status: i8,
    pub resume_status: Option<i8>,
    pub reject_reason: Option<String>,
    pub current_operation_id: String,
    pub retry_count: u32,
    pub next_retry_at: NaiveDateTime,
    pub last_error: Option<String>,
    pub sync_status: i8,
    pub expected_redis_version: Option<u64>,
    pub synced_redis_version: u64,
    pub version: u32,
    pub created_at: NaiveDateTime,
    pub updated_at: NaiveDateTime,
    pub stale_alerted_at: Option<NaiveDateTime>,
    /// 1 once recovery gave up on the row.
    pub dead: i8,
    /// The order's milestones the row passed ([`stocksvr_core::reservation::Reached`]).
    pub reached: u8,
}

impl Reservation {
    /// The row's status; an unknown code means the table was written by something else.
    pub fn status(&self) -> Result<ReservationStatus, sqlx::Error> {
        u8::try_from(self.status)
            .ok()
            .and_then(ReservationStatus::from_code)
            .ok_or_else(|| {
                sqlx::Error::Decode(format!("unknown reservation status {}", self.status).into())
            })
    }

    /// Instant or scheduled (`order_type` 1 or 2; anything else reads as instant).
    pub fn order_type(&self) -> stocksvr_core::events::OrderType {
        u8::try_from(self.order_type)
            .ok()
            .and_then(stocksvr_core::events::OrderType::from_code)
            .unwrap_or(stocksvr_core::events::OrderType::Instant)
    }

    /// The status's name, `UNKNOWN` for a code no version of stocksvr writes.
    pub fn status_name(&self) -> &'static str {
        self.status()
            .map(ReservationStatus::name)
            .unwrap_or("UNKNOWN")
    }

    pub fn resume_status(&self) -> Option<ReservationStatus> {
        self.resume_status
            .and_then(|c| u8::try_from(c).ok())
            .and_then(ReservationStatus::from_code)
    }

    /// What the reservation still holds in its bucket.
    pub fn held(&self) -> u32 {
        self.quantity.saturating_sub(self.refunded_quantity)
    }
}

pub(crate) const COLUMNS: &str =
    "id, order_id, order_item_id, merchant_id, dish_id, stock_bucket_id, stock_date, \
    quantity, refunded_quantity, pending_quantity, order_type, processing_time, expire_at, status, \
    resume_status, reject_reason, current_operation_id, retry_count, next_retry_at, last_error, \
    sync_status, expected_redis_version, synced_redis_version, version, created_at, updated_at, \
    stale_alerted_at, dead, reached";

/// A reservation about to be written as PREPARING.
#[derive(Debug, Clone)]
pub struct NewReservation {
    pub id: u64,
    pub order_id: u64,
    pub order_item_id: u64,
    pub merchant_id: u64,
    pub dish_id: u64,
    pub stock_bucket_id: String,
    pub stock_date: NaiveDate,
    pub quantity: u32,
    pub order_type: i8,
    pub processing_time: Option<NaiveDateTime>,
    pub expire_at: NaiveDateTime,
    pub try_operation_id: String,
}

impl NewReservation {
    /// The row this reservation would be in `status` (what a rejection announces).
    pub fn to_row(&self, status: ReservationStatus, reject_reason: Option<&str>) -> Reservation {
        let mut row = self.to_row_at(status, reject_reason, now());
        row.next_retry_at = row.created_at;
        row
    }

    /// The row [`insert_preparing_many`] wrote at `now` (what a read would return).
    pub fn inserted_row(&self, now: NaiveDateTime) -> Reservation {
        self.to_row_at(ReservationStatus::Preparing, None, now)
    }

    fn to_row_at(
        &self,
        status: ReservationStatus,
        reject_reason: Option<&str>,
        now: NaiveDateTime,
    ) -> Reservation {
        Reservation {
            id: self.id,
            order_id: self.order_id,
            order_item_id: self.order_item_id,
            merchant_id: self.merchant_id,
            dish_id: self.dish_id,
            stock_bucket_id: self.stock_bucket_id.clone(),
            stock_date: self.stock_date,
            quantity: self.quantity,
            refunded_quantity: 0,
            pending_quantity: 0,
            order_type: self.order_type,
            processing_time: self.processing_time,
            expire_at: self.expire_at,
            status: status.code() as i8,
            resume_status: None,
            reject_reason: reject_reason.map(str::to_string),
            current_operation_id: self.try_operation_id.clone(),
            retry_count: 0,
            next_retry_at: now + STEP_GRACE,
            last_error: None,
            sync_status: SyncStatus::Pending.code() as i8,
            expected_redis_version: None,
            synced_redis_version: 0,
            version: 1,
            created_at: now,
            updated_at: now,
            stale_alerted_at: None,
            dead: 0,
            reached: 0,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum InsertOutcome {
    /// The order failed before this Try reached MySQL (its OrderCreatedFailed wrote the
    /// order fence): nothing was inserted and nothing may be held for it.
    OrderFailed,
    Inserted,
    /// `(order_item_id, dish_id)` already has a reservation: the Try is a repeat.
    Existing(Box<Reservation>),
}

/// How long a freshly started step belongs to the request running it before the recovery
/// worker may resume it (both would use the same operation id, so this only saves work).
/// As long as the leases (6 s): a killed instance's Trys in flight are resumed at the next
/// recovery round after it, within the 10 s every other takeover keeps. A step still running
/// after 6 s (a stalled Redis) is resumed beside its request, which costs a repeated Lua
/// call answered from its operation record, nothing more.
pub const STEP_GRACE: chrono::TimeDelta = chrono::TimeDelta::seconds(6);
