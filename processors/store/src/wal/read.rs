//! Reads of the WAL: what a row waits for, what a bucket's operations last applied, and the
//! operator's lists and the backlog gauge.

use super::{WalAction, WalRow, WalStatus, COLUMNS};
use crate::deadline::Deadline;
use sqlx::MySqlPool;
use stocksvr_core::codes::{placeholders, OpCode, StoredCode};

/// The operation id of an unfinished row of `row`'s bucket with `action`, other than `row`;
/// for adjusts only older rows count (adjusts apply in version order).
pub async fn unfinished_before(
    pool: &MySqlPool,
    row: &WalRow,
    action: Option<WalAction>,
) -> Result<Option<String>, sqlx::Error> {
    let older_only = action == Some(WalAction::Adjust);
    let found: Option<(String,)> = sqlx::query_as(
        "SELECT operation_id FROM inventory_operation_wal WHERE stock_bucket_id = ? AND id <> ? \
         AND status IN (?, ?, ?) AND (? IS NULL OR action = ?) AND (? = 0 OR id < ?) \
         ORDER BY id LIMIT 1",
    )
    .bind(&row.stock_bucket_id)
    .bind(row.id)
    .bind(WalStatus::Init as i8)
    .bind(WalStatus::Executing as i8)
    .bind(WalStatus::Retry as i8)
    .bind(action.map(|a| a as i8))
    .bind(action.map(|a| a as i8))
    .bind(i8::from(older_only))
    .bind(row.id)
    .fetch_optional(pool)
    .deadline()
    .await?;
    Ok(found.map(|(op,)| op))
}

/// The operation id of a SUCCEEDED init of the bucket, if any: the bucket existed in Redis.
pub async fn succeeded_init(pool: &MySqlPool, bucket: &str) -> Result<Option<String>, sqlx::Error> {
    let found: Option<(String,)> = sqlx::query_as(
        "SELECT operation_id FROM inventory_operation_wal WHERE stock_bucket_id = ? AND action = ? \
         AND status = ? ORDER BY id LIMIT 1",
    )
    .bind(bucket)
    .bind(WalAction::InitBucket as i8)
    .bind(WalStatus::Succeeded as i8)
    .fetch_optional(pool)
    .deadline()
    .await?;
    Ok(found.map(|(op,)| op))
}

/// The total and baseline version the bucket's stock operations last applied in Redis (the
/// latest INIT, ADJUST, REPAIR or REBUILD that succeeded with SUCCEEDED from its script):
/// what a rebuild restores while a newer adjust is still waiting to apply on top of it.
pub async fn last_applied(
    pool: &MySqlPool,
    bucket: &str,
) -> Result<Option<(i64, u64)>, sqlx::Error> {
    let applied = "status = ? AND stock_bucket_id = ? \
         AND JSON_VALUE(result_payload, '$.outcome') = ?";
    let total: Option<(i64,)> = sqlx::query_as(&format!(
        "SELECT CAST(JSON_VALUE(result_payload, '$.after.total') AS SIGNED) \
         FROM inventory_operation_wal WHERE {applied} AND action IN (?, ?, ?, ?) \
         AND JSON_VALUE(result_payload, '$.after.total') IS NOT NULL ORDER BY id DESC LIMIT 1"
    ))
    .bind(WalStatus::Succeeded as i8)
    .bind(bucket)
    .bind(OpCode::Succeeded.name())
    .bind(WalAction::InitBucket as i8)
    .bind(WalAction::Adjust as i8)
    .bind(WalAction::Repair as i8)
    .bind(WalAction::Rebuild as i8)
    .fetch_optional(pool)
    .deadline()
    .await?;
    let Some((total,)) = total else {
        return Ok(None);
    };
    let (version,): (u64,) = sqlx::query_as(&format!(
        "SELECT CAST(COALESCE(MAX(CAST(JSON_VALUE(request_payload, '$.baseline_version') AS UNSIGNED)), 0) AS UNSIGNED) \
         FROM inventory_operation_wal WHERE {applied} AND action IN (?, ?)"
    ))
    .bind(WalStatus::Succeeded as i8)
    .bind(bucket)
    .bind(OpCode::Succeeded.name())
    .bind(WalAction::InitBucket as i8)
    .bind(WalAction::Adjust as i8)
    .fetch_one(pool)
    .deadline()
    .await?;
    Ok(Some((total, version)))
}

/// Rows in the given statuses (all when empty), oldest first.
pub async fn list(
    pool: &MySqlPool,
    statuses: &[WalStatus],
    bucket: Option<&str>,
    limit: u32,
) -> Result<Vec<WalRow>, sqlx::Error> {
    let statuses: &[WalStatus] = if statuses.is_empty() {
        &WalStatus::ALL
    } else {
        statuses
    };
    let bucket_filter = if bucket.is_some() {
        " AND stock_bucket_id = ?"
    } else {
        ""
    };
    let sql = format!(
        "SELECT {COLUMNS} FROM inventory_operation_wal WHERE status IN ({}){bucket_filter} \
         ORDER BY id LIMIT ?",
        placeholders(statuses.len())
    );
    let mut q = sqlx::query_as(&sql);
    for code in WalStatus::codes(statuses) {
        q = q.bind(code);
    }
    if let Some(b) = bucket {
        q = q.bind(b);
    }
    q.bind(limit).fetch_all(pool).deadline().await
}

/// Unfinished or dead rows per status, for the backlog gauge.
pub async fn count_by_status(pool: &MySqlPool) -> Result<Vec<(i8, i64)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT status, COUNT(*) FROM inventory_operation_wal WHERE status <> ? GROUP BY status",
    )
    .bind(WalStatus::Succeeded as i8)
    .fetch_all(pool)
    .deadline()
    .await
}
