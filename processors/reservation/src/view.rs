//! The reservation as callers see it.

use serde::Serialize;
use stocksvr_core::reservation::ReservationStatus;
use stocksvr_store::reservations::Reservation;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct ReservationView {
    /// Snowflake id; also the `inventory_reservation_ids` the order service puts in its events.
    pub reservation_id: String,
    pub order_id: u64,
    pub order_item_id: u64,
    pub merchant_id: u64,
    pub dish_id: u64,
    pub quantity: u32,
    pub refunded_quantity: u32,
    pub status: String,
    /// Why a Try was REJECTED (INSUFFICIENT_STOCK, BUCKET_CLOSED).
    pub reject_reason: Option<String>,
    pub stock_bucket_id: String,
    pub stock_date: String,
    pub order_type: String,
    pub processing_time: Option<String>,
    pub expire_at: String,
    pub created_at: String,
    pub updated_at: String,
}

impl ReservationView {
    pub fn from_row(row: &Reservation) -> Self {
        let status = row
            .status()
            .map(ReservationStatus::name)
            .unwrap_or("UNKNOWN")
            .to_string();
        let ts = |t: chrono::NaiveDateTime| {
            t.and_utc()
                .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
        };
        Self {
            // A string: snowflake ids exceed JavaScript's safe integer range.
            reservation_id: row.id.to_string(),
            order_id: row.order_id,
            order_item_id: row.order_item_id,
            merchant_id: row.merchant_id,
            dish_id: row.dish_id,
            quantity: row.quantity,
            refunded_quantity: row.refunded_quantity,
            status,
            reject_reason: row.reject_reason.clone(),
            stock_bucket_id: row.stock_bucket_id.clone(),
            stock_date: row.stock_date.to_string(),
            order_type: row.order_type().to_string(),
            processing_time: row.processing_time.map(ts),
            expire_at: ts(row.expire_at),
            created_at: ts(row.created_at),
            updated_at: ts(row.updated_at),
        }
    }
}

/// A reservation as an operator looking for stuck work sees it: where it stands plus the
/// recovery bookkeeping.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StuckView {
    #[serde(flatten)]
    pub reservation: ReservationView,
    pub current_operation_id: String,
    pub retry_count: u32,
    pub next_retry_at: String,
    pub last_error: Option<String>,
    pub dead: bool,
}

impl StuckView {
    pub fn from_row(row: &Reservation) -> Self {
        Self {
            reservation: ReservationView::from_row(row),
            current_operation_id: row.current_operation_id.clone(),
            retry_count: row.retry_count,
            next_retry_at: row
                .next_retry_at
                .and_utc()
                .to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            last_error: row.last_error.clone(),
            dead: row.dead != 0,
        }
    }
}
