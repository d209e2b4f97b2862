//! A reservation row for the unit tests that build completions and events from one, the
//! same in each so their expectations read alike.

use chrono::NaiveDate;
use stocksvr_core::codes::SyncStatus;
use stocksvr_core::events::OrderType;
use stocksvr_core::reservation::ReservationStatus;
use stocksvr_store::reservations::Reservation;

/// An instant reservation of 3 units in `status`, its step `op` under way, 2 of them pending
/// (a refund's) and CONFIRMED to resume to.
pub fn reservation(status: ReservationStatus, op: &str) -> Reservation {
    let t = NaiveDate::from_ymd_opt(2026, 7, 26)
        .and_then(|d| d.and_hms_opt(12, 0, 0))
        .expect("valid time");
    Reservation {
        id: 100_123_001,
        order_id: 9,
        order_item_id: 91,
        merchant_id: 10_001,
        dish_id: 90_001,
        stock_bucket_id: "bucket_10001_90001_20260726".into(),
        stock_date: t.date(),
        quantity: 3,
        refunded_quantity: 0,
        pending_quantity: 2,
        order_type: OrderType::Instant.code() as i8,
        processing_time: None,
        expire_at: t,
        status: status.code() as i8,
        resume_status: Some(ReservationStatus::Confirmed.code() as i8),
        reject_reason: None,
        current_operation_id: op.into(),
        retry_count: 0,
        next_retry_at: t,
        last_error: None,
        sync_status: SyncStatus::Pending.code() as i8,
        expected_redis_version: None,
        synced_redis_version: 0,
        version: 1,
        created_at: t,
        updated_at: t,
        stale_alerted_at: None,
        dead: 0,
        reached: 0,
    }
}
