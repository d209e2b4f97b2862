//! `dish_stock_baseline` (the merchant's total per bucket; docs/design.md, tables) and the
//! merchants' time zones: what a bucket is initialised, adjusted and rebuilt from.

use crate::clock::now;
use crate::deadline::Deadline;
use chrono::NaiveDate;
use sqlx::MySqlPool;
use stocksvr_core::codes::{BucketState, StockStatus};

/// `dish_stock_baseline` as the Try path needs it.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct Baseline {
    pub stock_bucket_id: String,
    pub merchant_id: u64,
    pub dish_id: u64,
    pub stock_date: NaiveDate,
    pub timezone: String,
    pub total_stock: i64,
    pub baseline_version: u64,
    pub stock_status: i8,
    pub bucket_status: i8,
    /// Set while Redis has lost this bucket (see [`mark_lost`]): Trys are refused until a
    /// rebuild and a clean reconcile pass clear it.
    pub lost_at: Option<chrono::NaiveDateTime>,
}

impl Baseline {
    /// OPEN, CLOSED or ARCHIVED; None for a code no version of stocksvr writes.
    pub fn state(&self) -> Option<BucketState> {
        u8::try_from(self.bucket_status)
            .ok()
            .and_then(BucketState::from_code)
    }

    /// Whether the merchant switched the dish's stock on or off for the day; None for a code
    /// no version of stocksvr writes.
    pub fn stock_status(&self) -> Option<StockStatus> {
        StockStatus::from_code(self.stock_status)
    }

    /// The dish's stock is switched on (an unknown code reads as off: such a bucket refuses
    /// Trys rather than sells).
    pub fn stock_enabled(&self) -> bool {
        self.stock_status() == Some(StockStatus::Enabled)
    }
}

pub async fn find_baseline(
    pool: &MySqlPool,
    bucket_id: &str,
) -> Result<Option<Baseline>, sqlx::Error> {
    read_baseline(pool, bucket_id, false).await
}

/// The baseline row, locked for the rest of the transaction with `for_update`.
pub(crate) async fn read_baseline<'e, E: sqlx::MySqlExecutor<'e>>(
    exec: E,
    bucket_id: &str,
    for_update: bool,
) -> Result<Option<Baseline>, sqlx::Error> {
    let lock = if for_update { " FOR UPDATE" } else { "" };
    sqlx::query_as(&format!(
        "SELECT stock_bucket_id, merchant_id, dish_id, stock_date, timezone, total_stock, \
         baseline_version, stock_status, bucket_status, lost_at FROM dish_stock_baseline \
         WHERE stock_bucket_id = ?{lock}"
    ))
    .bind(bucket_id)
    .fetch_optional(exec)
    .deadline()
    .await
}

/// Creates the baseline row if missing (same bucket, same values: a no-op on repeat).
pub async fn ensure_baseline(pool: &MySqlPool, b: &Baseline) -> Result<(), sqlx::Error> {
    insert_baseline(pool, b).await
}

pub(crate) async fn insert_baseline<'e, E: sqlx::MySqlExecutor<'e>>(
    exec: E,
    b: &Baseline,
) -> Result<(), sqlx::Error> {
    let now = now();
    sqlx::query(
        "INSERT IGNORE INTO dish_stock_baseline (stock_bucket_id, merchant_id, dish_id, stock_date, \
         timezone, total_stock, baseline_version, stock_status, bucket_status, created_at, updated_at) \
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(&b.stock_bucket_id)
    .bind(b.merchant_id)
    .bind(b.dish_id)
    .bind(b.stock_date)
    .bind(&b.timezone)
    .bind(b.total_stock)
    .bind(b.baseline_version)
    .bind(b.stock_status)
    .bind(b.bucket_status)
    .bind(now)
    .bind(now)
    .execute(exec)
    .deadline()
    .await?;
    Ok(())
}

/// The merchant's IANA time zone, if configured.
pub async fn merchant_timezone(
    pool: &MySqlPool,
    merchant_id: u64,
) -> Result<Option<String>, sqlx::Error> {
    let row: Option<(String,)> =
        sqlx::query_as("SELECT timezone FROM merchant_settings WHERE merchant_id = ?")
            .bind(merchant_id)
            .fetch_optional(pool)
            .deadline()
            .await?;
    Ok(row.map(|(tz,)| tz))
}

pub async fn set_merchant_timezone(
    pool: &MySqlPool,
    merchant_id: u64,
    timezone: &str,
) -> Result<(), sqlx::Error> {
    let now = now();
    sqlx::query(
        "INSERT INTO merchant_settings (merchant_id, timezone, created_at, updated_at) VALUES (?, ?, ?, ?) \
         ON DUPLICATE KEY UPDATE timezone = VALUES(timezone), updated_at = VALUES(updated_at)",
    )
    .bind(merchant_id)
    .bind(timezone)
    .bind(now)
    .bind(now)
    .execute(pool)
    .deadline()
    .await?;
    Ok(())
}

/// Marks the bucket lost (Redis no longer has it although it was built). Idempotent: the
/// first mark's time is kept. True when this call marked it.
pub async fn mark_lost(pool: &MySqlPool, bucket_id: &str) -> Result<bool, sqlx::Error> {
    let done = sqlx::query(
        "UPDATE dish_stock_baseline SET lost_at = ?, updated_at = ? \
         WHERE stock_bucket_id = ? AND lost_at IS NULL",
    )
    .bind(now())
    .bind(now())
    .bind(bucket_id)
    .execute(pool)
    .deadline()
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Clears the lost mark after a rebuild and a clean reconcile pass: Trys are taken again.
pub async fn clear_lost(pool: &MySqlPool, bucket_id: &str) -> Result<bool, sqlx::Error> {
    let done = sqlx::query(
        "UPDATE dish_stock_baseline SET lost_at = NULL, updated_at = ? \
         WHERE stock_bucket_id = ? AND lost_at IS NOT NULL",
    )
    .bind(now())
    .bind(bucket_id)
    .execute(pool)
    .deadline()
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Buckets marked lost, oldest first.
pub async fn lost_buckets(pool: &MySqlPool, limit: u32) -> Result<Vec<String>, sqlx::Error> {
    let rows: Vec<(String,)> = sqlx::query_as(
        "SELECT stock_bucket_id FROM dish_stock_baseline WHERE lost_at IS NOT NULL \
         ORDER BY lost_at, stock_bucket_id LIMIT ?",
    )
    .bind(limit)
    .fetch_all(pool)
    .deadline()
    .await?;
    Ok(rows.into_iter().map(|(b,)| b).collect())
}

/// How many buckets are marked lost.
pub async fn count_lost(pool: &MySqlPool) -> Result<i64, sqlx::Error> {
    let (n,): (i64,) =
        sqlx::query_as("SELECT COUNT(*) FROM dish_stock_baseline WHERE lost_at IS NOT NULL")
            .fetch_one(pool)
            .deadline()
            .await?;
    Ok(n)
}
