//! Events stocksvr consumes: the order service's `order.lifecycle.v1` and our own time
//! wheel's `inventory.schedule.v1`. Namespaces `io.stocksvr.order` / `io.stocksvr.schedule`.

use serde::{Deserialize, Serialize};

use super::{EventData, EventKind, OrderType};

/// `io.stocksvr.order.OrderCreatedData`. Confirms INSTANT reservations now; moves SCHEDULED
/// ones to `CREATED_RESERVED`, after which only a Refund can release them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrderCreatedData {
    pub order_id: i64,
    pub merchant_id: i64,
    pub order_type: OrderType,
    /// RFC 3339; `None` for INSTANT orders.
    #[serde(default)]
    pub processing_time: Option<String>,
    pub inventory_reservation_ids: Vec<i64>,
}

/// `io.stocksvr.order.OrderCreatedFailedData`: the only event allowed to Cancel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrderCreatedFailedData {
    pub order_id: i64,
    pub merchant_id: i64,
    /// Possibly incomplete: a Try whose reply was lost is unknown to the order service, so
    /// the consumer must also cancel what it holds under `order_id`.
    pub inventory_reservation_ids: Vec<i64>,
    /// Free text for humans; never drives behaviour.
    #[serde(default)]
    pub reason: Option<String>,
}

/// `io.stocksvr.order.OrderCanceledData`. Despite the name this is a full Refund of a
/// created order, never a Cancel (docs/design.md,
/// reservation state machine).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrderCanceledData {
    pub order_id: i64,
    pub merchant_id: i64,
    pub inventory_reservation_ids: Vec<i64>,
    #[serde(default)]
    pub reason: Option<String>,
}

/// `io.stocksvr.order.RefundRequestedData`: a partial or full refund of a created order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefundRequestedData {
    pub order_id: i64,
    pub merchant_id: i64,
    /// Idempotency key of the refund: the same id twice returns stock once, two different
    /// ids on one reservation are two partial refunds.
    pub refund_id: String,
    pub items: Vec<RefundItem>,
    #[serde(default)]
    pub reason: Option<String>,
}

/// `io.stocksvr.order.RefundItem`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefundItem {
    pub inventory_reservation_id: i64,
    pub quantity: i32,
}

/// `io.stocksvr.schedule.InventoryConfirmDueData`. Emitted at least once per due scheduled
/// reservation (time wheel plus DB re-scan); the CAS from `CREATED_RESERVED` absorbs duplicates.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InventoryConfirmDueData {
    pub reservation_id: i64,
    pub order_id: i64,
    pub stock_bucket_id: String,
    /// The due time that fired; a trigger that no longer matches the reservation is stale.
    pub processing_time: String,
}

keyed_by_order! {
    OrderCreatedData => OrderCreated,
    OrderCreatedFailedData => OrderCreatedFailed,
    OrderCanceledData => OrderCanceled,
    RefundRequestedData => RefundRequested,
    InventoryConfirmDueData => InventoryConfirmDue,
}
