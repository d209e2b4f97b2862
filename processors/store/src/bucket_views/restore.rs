//! What a repair or a rebuild reads besides the sums: the reservations whose fences and op
//! records it restores in Redis, their completed refunds, and the highest version MySQL has
//! seen of the bucket (a rebuilt bucket starts above it).

use crate::deadline::Deadline;
use crate::one_off::{in_list_of, OneOff};
use sqlx::{MySql, MySqlPool, QueryBuilder};
use stocksvr_core::codes::{RefundStatus, ReservationStatus};

/// A reservation as the rebuild needs it: what Redis held for it and the steps it took.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct RebuildRow {
    pub id: u64,
    pub status: i8,
    pub quantity: u32,
    pub refunded_quantity: u32,
    pub current_operation_id: String,
    pub expected_redis_version: Option<u64>,
    /// The status a REFUNDING row returns to (CONFIRMED or CREATED_RESERVED).
    pub resume_status: Option<i8>,
}

/// Every reservation of `bucket` that left a trace in Redis (not REJECTED, not PREPARING),
/// in id order, after `after`, at most `limit`.
pub async fn rebuild_rows(
    pool: &MySqlPool,
    bucket: &str,
    after: u64,
    limit: u32,
) -> Result<Vec<RebuildRow>, sqlx::Error> {
    sqlx::query_as(
        "SELECT id, status, quantity, refunded_quantity, current_operation_id, \
         expected_redis_version, resume_status FROM inventory_reservation \
         WHERE stock_bucket_id = ? AND status NOT IN (?, ?) AND id > ? ORDER BY id LIMIT ?",
    )
    .bind(bucket)
    .bind(ReservationStatus::Preparing.code())
    .bind(ReservationStatus::Rejected.code())
    .bind(after)
    .bind(limit)
    .fetch_all(pool)
    .deadline()
    .await
}

/// `rebuild_rows` of the given reservations of `bucket` (a repair restores their records).
pub async fn rows_by_id(
    pool: &MySqlPool,
    bucket: &str,
    ids: &[u64],
) -> Result<Vec<RebuildRow>, sqlx::Error> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let mut q = QueryBuilder::<MySql>::new(
        "SELECT id, status, quantity, refunded_quantity, current_operation_id, \
         expected_redis_version, resume_status FROM inventory_reservation WHERE stock_bucket_id = ",
    );
    q.push_bind(bucket);
    q.push(" AND id IN ");
    in_list_of(&mut q, ids.iter().copied());
    q.push(" ORDER BY id");
    q.one_off_as().fetch_all(pool).deadline().await
}

/// The completed refunds of `reservation_ids` (operation id, reservation, quantity), to
/// re-create their op records.
pub async fn completed_refunds(
    pool: &MySqlPool,
    reservation_ids: &[u64],
) -> Result<Vec<(u64, String, u32)>, sqlx::Error> {
    if reservation_ids.is_empty() {
        return Ok(Vec::new());
    }
    let mut q = QueryBuilder::<MySql>::new(
        "SELECT reservation_id, operation_id, quantity FROM inventory_refund WHERE status = ",
    );
    q.push_bind(RefundStatus::Done.code());
    q.push(" AND reservation_id IN ");
    in_list_of(&mut q, reservation_ids.iter().copied());
    q.push(" ORDER BY reservation_id, updated_at");
    q.one_off_as().fetch_all(pool).deadline().await
}

/// The highest bucket version MySQL knows of: the start of a rebuilt bucket must lie above
/// it, so every event after the rebuild is newer than anything the projector booked.
pub async fn highest_known_version(pool: &MySqlPool, bucket: &str) -> Result<u64, sqlx::Error> {
    let (v,): (u64,) = sqlx::query_as(
        "SELECT CAST(GREATEST( \
           COALESCE((SELECT MAX(redis_version) FROM inventory_ledger WHERE stock_bucket_id = ?), 0), \
           COALESCE((SELECT redis_version FROM dish_stock_snapshot WHERE stock_bucket_id = ?), 0), \
           COALESCE((SELECT MAX(expected_redis_version) FROM inventory_reservation WHERE stock_bucket_id = ?), 0), \
           COALESCE((SELECT MAX(CAST(JSON_VALUE(result_payload, '$.redis_version') AS UNSIGNED)) \
                     FROM inventory_operation_wal WHERE stock_bucket_id = ?), 0)) AS UNSIGNED)",
    )
    .bind(bucket)
    .bind(bucket)
    .bind(bucket)
    .bind(bucket)
    .fetch_one(pool)
    .deadline()
    .await?;
    Ok(v)
}
