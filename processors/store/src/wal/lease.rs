//! The worker's side of a WAL row: the lease that lets one worker run it, and the guarded
//! writes that finish it (complete with its outbox rows, fail, postpone) or make it due again.

use super::{WalRow, WalStatus, COLUMNS};
use crate::clock::now;
use crate::deadline::Deadline;
use crate::outbox::{write_outbox, NewOutbox};
use chrono::TimeDelta;
use sqlx::MySqlPool;

/// Takes (or renews) the lease on one row if it is unfinished, due (new, or past its backoff)
/// and nobody else holds a live lease. False when another worker holds it, it backs off, or
/// it is finished.
pub async fn try_lease(
    pool: &MySqlPool,
    id: u64,
    owner: &str,
    lease: TimeDelta,
) -> Result<bool, sqlx::Error> {
    let now = now();
    let done = sqlx::query(
        "UPDATE inventory_operation_wal SET status = ?, lease_owner = ?, lease_expire_at = ?, \
         next_retry_at = ?, updated_at = ? WHERE id = ? AND status IN (?, ?, ?) \
         AND (lease_owner IS NULL OR lease_owner = ? OR lease_expire_at < ?) \
         AND (status = ? OR next_retry_at <= ?)",
    )
    .bind(WalStatus::Executing as i8)
    .bind(owner)
    .bind(now + lease)
    .bind(now + lease)
    .bind(now)
    .bind(id)
    .bind(WalStatus::Init as i8)
    .bind(WalStatus::Executing as i8)
    .bind(WalStatus::Retry as i8)
    .bind(owner)
    .bind(now)
    // A row backing off is not due before its time, however many callers ask for it (a burst
    // of Trys must not burn an init's retry budget in a second).
    .bind(WalStatus::Init as i8)
    .bind(now)
    .execute(pool)
    .deadline()
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Claims up to `limit` unfinished rows that are due (`FOR UPDATE SKIP LOCKED` keeps
/// concurrent workers apart), leasing each to `owner`. A leased row is never due before its
/// lease ends: every write of a lease also sets `next_retry_at` to its expiry.
pub async fn claim_due(
    pool: &MySqlPool,
    owner: &str,
    lease: TimeDelta,
    limit: u32,
) -> Result<Vec<WalRow>, sqlx::Error> {
    let mut tx = crate::deadline::begin(pool).await?;
    let now = now();
    let rows: Vec<WalRow> = sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM inventory_operation_wal WHERE status IN (?, ?, ?) \
         AND next_retry_at <= ? \
         ORDER BY next_retry_at LIMIT ? FOR UPDATE SKIP LOCKED"
    ))
    .bind(WalStatus::Init as i8)
    .bind(WalStatus::Executing as i8)
    .bind(WalStatus::Retry as i8)
    .bind(now)
    .bind(limit)
    .fetch_all(&mut *tx)
    .deadline()
    .await?;
    for r in &rows {
        sqlx::query(
            "UPDATE inventory_operation_wal SET status = ?, lease_owner = ?, lease_expire_at = ?, \
             next_retry_at = ?, updated_at = ? WHERE id = ?",
        )
        .bind(WalStatus::Executing as i8)
        .bind(owner)
        .bind(now + lease)
        .bind(now + lease)
        .bind(now)
        .bind(r.id)
        .execute(&mut *tx)
        .deadline()
        .await?;
    }
    tx.commit().deadline().await?;
    Ok(rows)
}

/// What a successful completion changes besides the WAL row.
#[derive(Debug, Clone, Default)]
pub struct WalCompletion {
    pub result_payload: serde_json::Value,
    pub outbox: Vec<NewOutbox>,
    /// Set the baseline's bucket_status (archive completes the MySQL side here).
    pub bucket_status: Option<i8>,
}

/// Marks the row SUCCEEDED with its outbox rows in one transaction, only while it is still
/// EXECUTING under `owner`'s lease. False (nothing written) when the lease was lost: the
/// worker that took over completes it with the same replayed result.
pub async fn complete(
    pool: &MySqlPool,
    row: &WalRow,
    owner: &str,
    c: &WalCompletion,
) -> Result<bool, sqlx::Error> {
    let mut tx = crate::deadline::begin(pool).await?;
    let now = now();
    let done = sqlx::query(
        "UPDATE inventory_operation_wal SET status = ?, result_payload = ?, lease_owner = NULL, \
         lease_expire_at = NULL, last_error = NULL, updated_at = ? \
         WHERE id = ? AND status = ? AND lease_owner = ?",
    )
    .bind(WalStatus::Succeeded as i8)
    .bind(&c.result_payload)
    .bind(now)
    .bind(row.id)
    .bind(WalStatus::Executing as i8)
    .bind(owner)
    .execute(&mut *tx)
    .deadline()
    .await?;
    if done.rows_affected() != 1 {
        tx.rollback().deadline().await?;
        return Ok(false);
    }
    for o in &c.outbox {
        write_outbox(&mut *tx, o, true).await?;
    }
    if let Some(status) = c.bucket_status {
        sqlx::query(
            "UPDATE dish_stock_baseline SET bucket_status = ?, updated_at = ? WHERE stock_bucket_id = ?",
        )
        .bind(status)
        .bind(now)
        .bind(&row.stock_bucket_id)
        .execute(&mut *tx)
    .deadline()
        .await?;
    }
    tx.commit().deadline().await?;
    Ok(true)
}

/// Records a failed attempt and gives the lease back: RETRY due after `retry_after`, or DEAD
/// with its alert event when `dead` is given. Guarded by the lease like [`complete`].
pub async fn fail(
    pool: &MySqlPool,
    row: &WalRow,
    owner: &str,
    error: &str,
    retry_after: TimeDelta,
    dead: Option<&NewOutbox>,
) -> Result<bool, sqlx::Error> {
    let error: String = error.chars().take(1000).collect();
    let mut tx = crate::deadline::begin(pool).await?;
    let now = now();
    let status = if dead.is_some() {
        WalStatus::Dead
    } else {
        WalStatus::Retry
    };
    let done = sqlx::query(
        "UPDATE inventory_operation_wal SET status = ?, retry_count = retry_count + 1, \
         last_error = ?, next_retry_at = ?, lease_owner = NULL, lease_expire_at = NULL, updated_at = ? \
         WHERE id = ? AND status = ? AND lease_owner = ?",
    )
    .bind(status as i8)
    .bind(&error)
    .bind(now + retry_after)
    .bind(now)
    .bind(row.id)
    .bind(WalStatus::Executing as i8)
    .bind(owner)
    .execute(&mut *tx)
    .deadline()
    .await?;
    if done.rows_affected() != 1 {
        tx.rollback().deadline().await?;
        return Ok(false);
    }
    if let Some(alert) = dead {
        write_outbox(&mut *tx, alert, true).await?;
    }
    tx.commit().deadline().await?;
    Ok(true)
}

/// Gives the lease back without counting a failure: the row waits for another operation of
/// its bucket and is due again after `delay`. Guarded by the lease like [`complete`].
pub async fn postpone(
    pool: &MySqlPool,
    row: &WalRow,
    owner: &str,
    reason: &str,
    delay: TimeDelta,
) -> Result<bool, sqlx::Error> {
    let reason: String = reason.chars().take(1000).collect();
    let now = now();
    let done = sqlx::query(
        "UPDATE inventory_operation_wal SET status = ?, last_error = ?, next_retry_at = ?, \
         lease_owner = NULL, lease_expire_at = NULL, updated_at = ? \
         WHERE id = ? AND status = ? AND lease_owner = ?",
    )
    .bind(WalStatus::Retry as i8)
    .bind(&reason)
    .bind(now + delay)
    .bind(now)
    .bind(row.id)
    .bind(WalStatus::Executing as i8)
    .bind(owner)
    .execute(pool)
    .deadline()
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Rewrites the request of a row `owner` holds the lease of: a rebuild records the plan it
/// computed from MySQL before it touches Redis, so a retry after a crash between the script
/// and the completion announces exactly what the script wrote. False when the lease is lost.
pub async fn set_request(
    pool: &MySqlPool,
    id: u64,
    owner: &str,
    request: &serde_json::Value,
) -> Result<bool, sqlx::Error> {
    let done = sqlx::query(
        "UPDATE inventory_operation_wal SET request_payload = ?, updated_at = ? \
         WHERE id = ? AND status = ? AND lease_owner = ?",
    )
    .bind(request)
    .bind(now())
    .bind(id)
    .bind(WalStatus::Executing as i8)
    .bind(owner)
    .execute(pool)
    .deadline()
    .await?;
    Ok(done.rows_affected() == 1)
}

/// An operator's "retry now": a RETRY or DEAD row becomes due immediately. The attempt count
/// is kept (attempts name their Redis operation ids, which must not repeat), so a dead row
/// gets one more attempt. A row under a live lease is left alone (it is running).
pub async fn retry_now(pool: &MySqlPool, operation_id: &str) -> Result<bool, sqlx::Error> {
    let now = now();
    let done = sqlx::query(
        "UPDATE inventory_operation_wal SET status = ?, next_retry_at = ?, updated_at = ? \
         WHERE operation_id = ? AND status IN (?, ?, ?) AND (lease_owner IS NULL OR lease_expire_at < ?)",
    )
    .bind(WalStatus::Retry as i8)
    .bind(now)
    .bind(now)
    .bind(operation_id)
    .bind(WalStatus::Init as i8)
    .bind(WalStatus::Retry as i8)
    .bind(WalStatus::Dead as i8)
    .bind(now)
    .execute(pool)
    .deadline()
    .await?;
    Ok(done.rows_affected() == 1)
}
