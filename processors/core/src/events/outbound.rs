//! Events stocksvr produces, namespace `io.stocksvr.inventory`:
//! `inventory.stock-change.v1` (keyed by bucket, for the MySQL projection and audit) and
//! `inventory.lifecycle.v1` (keyed by order, for the order domain).

use serde::{Deserialize, Serialize};

use super::{EventData, EventKind, OrderType};

/// `io.stocksvr.inventory.StockAfter`: absolute bucket quantities after an operation.
///
/// The projector stores these (not the deltas) when `redis_version` is newer than the
/// snapshot's, so duplicated or reordered events cannot drift the snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StockAfter {
    pub total: i64,
    pub available: i64,
    pub reserved: i64,
    pub sold: i64,
}

impl StockAfter {
    /// The no-oversell invariant every bucket must satisfy at every version.
    pub fn is_consistent(&self) -> bool {
        self.available >= 0
            && self.reserved >= 0
            && self.sold >= 0
            && self.available + self.reserved + self.sold == self.total
    }
}

/// Avro enum `io.stocksvr.inventory.StockAction`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum StockAction {
    Try,
    Confirm,
    Cancel,
    Refund,
}

/// `io.stocksvr.inventory.StockChangeData`, the payload of every `InventoryRedis*` event.
///
/// One type for four events because the projector treats them alike (inbox, snapshot,
/// ledger); `action` decides which event a value is, so the two cannot disagree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StockChangeData {
    pub order_id: i64,
    pub merchant_id: i64,
    pub dish_id: i64,
    /// Bound at Try and never recomputed, so cross-day compensation hits the original day.
    pub stock_bucket_id: String,
    /// `YYYY-MM-DD` in the merchant's time zone.
    pub stock_date: String,
    pub order_type: OrderType,
    #[serde(default)]
    pub processing_time: Option<String>,
    pub reservation_id: i64,
    pub order_item_id: i64,
    /// Redis idempotency key; the ledger is unique on it.
    pub operation_id: String,
    pub action: StockAction,
    pub quantity: i32,
    pub available_delta: i64,
    pub reserved_delta: i64,
    pub sold_delta: i64,
    /// Bucket version after the operation; only a newer one may overwrite the snapshot.
    pub redis_version: i64,
    pub after: StockAfter,
    #[serde(default)]
    pub reason_code: Option<String>,
    /// Set for refunds started by `RefundRequested`, to trace partial refunds.
    #[serde(default)]
    pub refund_id: Option<String>,
    /// A Cancel that found no Try and only wrote the fence: all deltas are 0, yet the
    /// reservation still has to be recorded as canceled.
    #[serde(default)]
    pub empty_rollback: bool,
}

impl EventData for StockChangeData {
    fn kind(&self) -> EventKind {
        match self.action {
            StockAction::Try => EventKind::InventoryRedisReserved,
            StockAction::Confirm => EventKind::InventoryRedisConfirmed,
            StockAction::Cancel => EventKind::InventoryRedisCanceled,
            StockAction::Refund => EventKind::InventoryRedisRefunded,
        }
    }
    fn partition_key(&self) -> String {
        self.stock_bucket_id.clone()
    }
}

/// `io.stocksvr.inventory.StockBucketInitializedData` (WAL-driven, no reservation).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StockBucketInitializedData {
    pub operation_id: String,
    pub stock_bucket_id: String,
    pub merchant_id: i64,
    pub dish_id: i64,
    pub stock_date: String,
    /// IANA zone in which `stock_date` is the business day.
    pub timezone: String,
    /// Baseline the bucket was built from; reconciliation and rebuild start from it.
    pub baseline_version: i64,
    pub total: i64,
    pub redis_version: i64,
    pub after: StockAfter,
}

/// `io.stocksvr.inventory.StockBaselineAdjustedData` (WAL-driven, no reservation).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StockBaselineAdjustedData {
    pub operation_id: String,
    pub stock_bucket_id: String,
    pub merchant_id: i64,
    pub dish_id: i64,
    pub stock_date: String,
    pub baseline_version: i64,
    pub old_total: i64,
    /// What the merchant asked for; `after.total` is what applied.
    pub new_total: i64,
    pub available_delta: i64,
    /// Part of a decrease that could not be applied because the units were already
    /// reserved or sold: stock already promised to customers is never taken back.
    pub deficit: i64,
    pub redis_version: i64,
    pub after: StockAfter,
    #[serde(default)]
    pub reason_code: Option<String>,
}

/// `io.stocksvr.inventory.StockNumbers`: a bucket's five numbers as one view saw them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct StockNumbers {
    pub total: i64,
    pub available: i64,
    pub reserved: i64,
    pub sold: i64,
    pub deficit: i64,
}

/// `io.stocksvr.inventory.StockBucketRepairedData`: a versioned repair by the reconciler.
/// The deltas are what the ledger books (after minus the ledger's sums before), so the
/// ledger adds up to `after` whichever view was wrong.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StockBucketRepairedData {
    pub operation_id: String,
    pub stock_bucket_id: String,
    pub merchant_id: i64,
    pub dish_id: i64,
    pub stock_date: String,
    pub kinds: Vec<String>,
    /// Redis at the version the repair was computed against.
    pub before: StockNumbers,
    pub ledger_before: StockNumbers,
    pub total_delta: i64,
    pub available_delta: i64,
    pub reserved_delta: i64,
    pub sold_delta: i64,
    pub deficit: i64,
    pub redis_version: i64,
    pub after: StockAfter,
    #[serde(default)]
    pub reason_code: Option<String>,
}

/// `io.stocksvr.inventory.StockBucketRebuiltData`: a lost bucket recreated from MySQL.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StockBucketRebuiltData {
    pub operation_id: String,
    pub stock_bucket_id: String,
    pub merchant_id: i64,
    pub dish_id: i64,
    pub stock_date: String,
    pub baseline_version: i64,
    pub ledger_before: StockNumbers,
    pub total_delta: i64,
    pub available_delta: i64,
    pub reserved_delta: i64,
    pub sold_delta: i64,
    pub deficit: i64,
    pub redis_version: i64,
    pub after: StockAfter,
    pub fences_restored: i64,
    #[serde(default)]
    pub reason_code: Option<String>,
}

keyed_by_bucket! {
    StockBucketInitializedData => StockBucketInitialized,
    StockBaselineAdjustedData => StockBaselineAdjusted,
    StockBucketRepairedData => StockBucketRepaired,
    StockBucketRebuiltData => StockBucketRebuilt,
}

/// The reservation an inventory lifecycle event is about, the fields all five of them begin
/// with. Flattened into each event's payload: on the wire they stay fields of the event's
/// `data` record, as its schema declares them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReservationFields {
    pub order_id: i64,
    pub order_item_id: i64,
    pub reservation_id: i64,
    pub merchant_id: i64,
    pub dish_id: i64,
    /// Bound at Try and never recomputed, so cross-day compensation hits the original day.
    pub stock_bucket_id: String,
    /// `YYYY-MM-DD` in the merchant's time zone.
    pub stock_date: String,
    /// The units the event is about: those the Try asked for, those a Confirm sells (what is
    /// still held), those a refund returned (fewer than held for a partial refund).
    pub quantity: i32,
}

/// `io.stocksvr.inventory.InventoryReservedData`: Try succeeded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InventoryReservedData {
    #[serde(flatten)]
    pub reservation: ReservationFields,
    pub order_type: OrderType,
    #[serde(default)]
    pub processing_time: Option<String>,
    /// After this a still-RESERVED reservation is reported as stale; inventory never
    /// cancels on its own because only the order domain knows whether the order failed.
    pub expire_at: String,
    #[serde(default)]
    pub reason_code: Option<String>,
}

/// `io.stocksvr.inventory.InventoryRejectedData`: Try refused, nothing held.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InventoryRejectedData {
    #[serde(flatten)]
    pub reservation: ReservationFields,
    /// What Redis had left, so the order UI can offer a smaller quantity; `None` when the
    /// refusal was not about quantity (fenced, unknown bucket, disabled dish).
    #[serde(default)]
    pub available: Option<i64>,
    /// Mandatory: a rejection without a reason is not actionable for the order domain.
    pub reason_code: String,
}

/// `io.stocksvr.inventory.InventoryConfirmedData`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InventoryConfirmedData {
    #[serde(flatten)]
    pub reservation: ReservationFields,
    pub order_type: OrderType,
    #[serde(default)]
    pub reason_code: Option<String>,
}

/// `io.stocksvr.inventory.InventoryCanceledData`: released after `OrderCreatedFailed`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InventoryCanceledData {
    #[serde(flatten)]
    pub reservation: ReservationFields,
    /// Try never reached Redis: nothing returned, only the fence written.
    #[serde(default)]
    pub empty_rollback: bool,
    #[serde(default)]
    pub reason_code: Option<String>,
}

/// `io.stocksvr.inventory.InventoryRefundedData`: returned after `OrderCanceled` or
/// `RefundRequested`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InventoryRefundedData {
    #[serde(flatten)]
    pub reservation: ReservationFields,
    /// `None` for `OrderCanceled`, which has no refund id of its own.
    #[serde(default)]
    pub refund_id: Option<String>,
    /// A SCHEDULED order refunded before its confirm returned reserved, not sold, units.
    #[serde(default)]
    pub before_confirm: bool,
    #[serde(default)]
    pub reason_code: Option<String>,
}

// Keyed by the order of the reservation they are about, so the order domain reads an
// order's events in order.
keyed_by_order! {
    InventoryReservedData.reservation => InventoryReserved,
    InventoryRejectedData.reservation => InventoryRejected,
    InventoryConfirmedData.reservation => InventoryConfirmed,
    InventoryCanceledData.reservation => InventoryCanceled,
    InventoryRefundedData.reservation => InventoryRefunded,
}

/// `io.stocksvr.inventory.InventoryOperationDeadData`: recovery gave up and a human must look.
/// The row stays in its intermediate state; nothing was rolled back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InventoryOperationDeadData {
    /// `None` for non-order (WAL) operations.
    #[serde(default)]
    pub reservation_id: Option<i64>,
    pub operation_id: String,
    #[serde(default)]
    pub order_id: Option<i64>,
    pub stock_bucket_id: String,
    /// TRY, CONFIRM, ..., INIT_BUCKET, ADJUST, REPAIR. A string so new operations do not
    /// break existing readers the way a new enum symbol would.
    pub action: String,
    pub stuck_status: String,
    pub retry_count: i32,
    #[serde(default)]
    pub last_error: Option<String>,
    #[serde(default)]
    pub stuck_since: Option<String>,
}

impl EventData for InventoryOperationDeadData {
    fn kind(&self) -> EventKind {
        EventKind::InventoryOperationDead
    }
    /// Keyed by order so the order domain sees it in line with the order's other events;
    /// a WAL operation has no order and falls back to its bucket.
    fn partition_key(&self) -> String {
        match self.order_id {
            Some(order_id) => order_id.to_string(),
            None => self.stock_bucket_id.clone(),
        }
    }
}
