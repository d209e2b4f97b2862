//! Read-side queries about buckets: unfinished reservations (archive waits for them), the
//! dishes the daily job carries forward, and the projected snapshot.

use crate::baselines::Baseline;
use crate::deadline::Deadline;
use chrono::{NaiveDate, NaiveDateTime, TimeDelta};
use sqlx::MySqlPool;
use stocksvr_core::reservation::ReservationStatus;

/// Statuses that still hold or may still move stock in their bucket: archive waits until
/// none is left (docs/design.md, daily buckets and their lifecycle). CONFIRMED is settled (a
/// later refund is a new operation).
pub const OPEN_STATUSES: [ReservationStatus; 6] = [
    ReservationStatus::Preparing,
    ReservationStatus::Reserved,
    ReservationStatus::CreatedReserved,
    ReservationStatus::Confirming,
    ReservationStatus::Canceling,
    ReservationStatus::Refunding,
];

/// Unfinished reservations of a bucket.
pub async fn count_open_reservations<'e, E: sqlx::MySqlExecutor<'e>>(
    exec: E,
    bucket: &str,
) -> Result<i64, sqlx::Error> {
    let (n,): (i64,) = sqlx::query_as(
        "SELECT COUNT(*) FROM inventory_reservation WHERE stock_bucket_id = ? \
         AND status IN (?, ?, ?, ?, ?, ?)",
    )
    .bind(bucket)
    .bind(OPEN_STATUSES[0].code() as i8)
    .bind(OPEN_STATUSES[1].code() as i8)
    .bind(OPEN_STATUSES[2].code() as i8)
    .bind(OPEN_STATUSES[3].code() as i8)
    .bind(OPEN_STATUSES[4].code() as i8)
    .bind(OPEN_STATUSES[5].code() as i8)
    .fetch_one(exec)
    .deadline()
    .await?;
    Ok(n)
}

/// Baselines of the latest day before `date` for each dish whose latest day is within
/// `lookback_days`, in zone `timezone`, that have no baseline on `date` yet: the daily job
/// carries each dish's standing total forward to the new day (docs/design.md, daily buckets).
pub async fn baselines_to_carry(
    pool: &MySqlPool,
    timezone: &str,
    date: NaiveDate,
    lookback_days: i64,
    limit: u32,
) -> Result<Vec<Baseline>, sqlx::Error> {
    sqlx::query_as(
        "SELECT b.stock_bucket_id, b.merchant_id, b.dish_id, b.stock_date, b.timezone, b.total_stock, \
         b.baseline_version, b.stock_status, b.bucket_status, CAST(NULL AS DATETIME(3)) AS lost_at \
         FROM dish_stock_baseline b \
         JOIN (SELECT merchant_id, dish_id, MAX(stock_date) AS d FROM dish_stock_baseline \
               WHERE timezone = ? AND stock_date < ? AND stock_date >= ? GROUP BY merchant_id, dish_id) l \
           ON l.merchant_id = b.merchant_id AND l.dish_id = b.dish_id AND l.d = b.stock_date \
         WHERE NOT EXISTS (SELECT 1 FROM dish_stock_baseline t WHERE t.merchant_id = b.merchant_id \
               AND t.dish_id = b.dish_id AND t.stock_date = ?) \
         ORDER BY b.merchant_id, b.dish_id LIMIT ?",
    )
    .bind(timezone)
    .bind(date)
    .bind(date - TimeDelta::days(lookback_days))
    .bind(date)
    .bind(limit)
    .fetch_all(pool)
    .deadline()
    .await
}

/// The time zones baselines were created in: the daily job computes each one's business day.
pub async fn baseline_timezones(pool: &MySqlPool) -> Result<Vec<String>, sqlx::Error> {
    let rows: Vec<(String,)> =
        sqlx::query_as("SELECT DISTINCT timezone FROM dish_stock_baseline ORDER BY timezone")
            .fetch_all(pool)
            .deadline()
            .await?;
    Ok(rows.into_iter().map(|(t,)| t).collect())
}

/// `dish_stock_snapshot` row (what the projector built from the events).
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct Snapshot {
    pub stock_bucket_id: String,
    pub total_stock: i64,
    pub available_stock: i64,
    pub reserved_stock: i64,
    pub sold_stock: i64,
    pub deficit_stock: i64,
    pub redis_version: u64,
    pub updated_at: NaiveDateTime,
}

pub async fn find_snapshot(
    pool: &MySqlPool,
    bucket: &str,
) -> Result<Option<Snapshot>, sqlx::Error> {
    sqlx::query_as(
        "SELECT stock_bucket_id, total_stock, available_stock, reserved_stock, sold_stock, \
         deficit_stock, redis_version, updated_at FROM dish_stock_snapshot WHERE stock_bucket_id = ?",
    )
    .bind(bucket)
    .fetch_optional(pool)
    .deadline()
    .await
}
