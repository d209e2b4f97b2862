//! The scan's queries (docs/design.md, scheduled confirms). Both use `idx_schedule_scan (status, processing_time)`.

use chrono::NaiveDateTime;
use sqlx::MySqlPool;
use stocksvr_core::events::OrderType;
use stocksvr_core::reservation::ReservationStatus;
use stocksvr_store::deadline::Deadline;

/// `inventory_reservation.order_type` of a SCHEDULED order.
pub const SCHEDULED: i8 = OrderType::Scheduled.code() as i8;

fn created_reserved() -> i8 {
    ReservationStatus::CreatedReserved.code() as i8
}

/// CREATED_RESERVED scheduled reservations due at or before `due_before` (UTC), oldest first.
pub async fn overdue(
    pool: &MySqlPool,
    due_before: NaiveDateTime,
    limit: u32,
) -> Result<Vec<(u64, NaiveDateTime)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT id, processing_time FROM inventory_reservation \
         WHERE order_type = ? AND status = ? AND processing_time <= ? \
         ORDER BY processing_time LIMIT ?",
    )
    .bind(SCHEDULED)
    .bind(created_reserved())
    .bind(due_before)
    .bind(limit)
    .fetch_all(pool)
    .deadline()
    .await
}

/// CREATED_RESERVED scheduled reservations due after `after` and at or before `until`, in
/// (processing_time, id) order, starting past the keyset cursor `after` (None: from the
/// start of the window). Page with the last row returned as the next cursor.
pub async fn upcoming(
    pool: &MySqlPool,
    from: NaiveDateTime,
    until: NaiveDateTime,
    after: Option<(NaiveDateTime, u64)>,
    limit: u32,
) -> Result<Vec<(u64, NaiveDateTime)>, sqlx::Error> {
    let (at, id) = after.unwrap_or((from, u64::MAX));
    sqlx::query_as(
        "SELECT id, processing_time FROM inventory_reservation \
         WHERE order_type = ? AND status = ? AND processing_time > ? AND processing_time <= ? \
         AND (processing_time > ? OR (processing_time = ? AND id > ?)) \
         ORDER BY processing_time, id LIMIT ?",
    )
    .bind(SCHEDULED)
    .bind(created_reserved())
    .bind(from)
    .bind(until)
    .bind(at)
    .bind(at)
    .bind(id)
    .bind(limit)
    .fetch_all(pool)
    .deadline()
    .await
}
