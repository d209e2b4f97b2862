//! The operation WAL (seed §4.5) for stock operations that have no reservation: bucket
//! init, merchant adjust, repair, and the bucket lifecycle (close, archive). The row is
//! committed before Redis is touched, together with the baseline change it executes, so a
//! crash anywhere leaves a row a worker can resume with the same operation id.
//!
//! Execution is guarded by a lease (`lease_owner`, `lease_expire_at`): whoever holds it runs
//! the Lua step; when the holder dies the lease expires and another worker takes the row
//! over. Correctness does not rest on the lease alone: the Lua op record makes a second run
//! of the same operation id a replay of its first result, and completion is a guarded update
//! (still EXECUTING, still ours) committed together with the outbox rows, so an operation is
//! applied and announced once even if two workers overlap.

use crate::baselines::{insert_baseline, read_baseline, Baseline};
use crate::clock::now;
use crate::deadline::Deadline;
use crate::outbox::{write_outbox, NewOutbox};
use chrono::{NaiveDateTime, TimeDelta};
use sqlx::{MySql, MySqlPool, Transaction};
use stocksvr_core::bucket::BucketState;

pub use stocksvr_core::codes::{WalAction, WalStatus};

/// `inventory_operation_wal` row. The JSON columns are read as text (MariaDB stores JSON as
/// LONGTEXT) and parsed by the caller.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct WalRow {
    pub id: u64,
    pub operation_id: String,
    pub stock_bucket_id: String,
    pub action: i8,
    pub status: i8,
    pub request_payload: String,
    pub result_payload: Option<String>,
    pub retry_count: u32,
    pub next_retry_at: NaiveDateTime,
    pub lease_owner: Option<String>,
    pub lease_expire_at: Option<NaiveDateTime>,
    pub last_error: Option<String>,
    pub created_at: NaiveDateTime,
    pub updated_at: NaiveDateTime,
}

impl WalRow {
    pub fn action(&self) -> Option<WalAction> {
        WalAction::from_code(self.action)
    }

    pub fn status(&self) -> Option<WalStatus> {
        WalStatus::from_code(self.status)
    }
}

const COLUMNS: &str = "id, operation_id, stock_bucket_id, action, status, \
    CAST(request_payload AS CHAR) AS request_payload, CAST(result_payload AS CHAR) AS result_payload, \
    retry_count, next_retry_at, lease_owner, lease_expire_at, last_error, created_at, updated_at";

/// A WAL row to write, leased to its writer so a worker does not race the caller that is
/// about to execute it; if the writer dies the lease runs out and a worker takes over.
#[derive(Debug, Clone)]
pub struct NewWal {
    pub operation_id: String,
    pub stock_bucket_id: String,
    pub action: WalAction,
    pub request_payload: serde_json::Value,
    pub lease_owner: String,
    pub lease: TimeDelta,
}

/// Why a lifecycle or adjust request was refused before anything was written.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error("bucket {0} has no baseline")]
    NoBaseline(String),
    #[error("bucket {0} is archived")]
    Archived(String),
    #[error("bucket {bucket} must be CLOSED before it is archived (it is {status})")]
    NotClosed {
        bucket: String,
        status: &'static str,
    },
    #[error("bucket {bucket} still has {open} unfinished reservation(s); archive waits for them")]
    OpenReservations { bucket: String, open: i64 },
    #[error(transparent)]
    Mysql(#[from] sqlx::Error),
}

/// The bucket-status name for messages.
fn bucket_status_name(code: i8) -> &'static str {
    match code {
        10 => "OPEN",
        20 => "CLOSED",
        30 => "ARCHIVED",
        _ => "UNKNOWN",
    }
}

async fn insert_ignore(tx: &mut Transaction<'_, MySql>, w: &NewWal) -> Result<bool, sqlx::Error> {
    let now = now();
    let expire = now + w.lease;
    let done = sqlx::query(
        "INSERT IGNORE INTO inventory_operation_wal (operation_id, stock_bucket_id, action, status, \
         request_payload, next_retry_at, lease_owner, lease_expire_at, created_at, updated_at) \
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(&w.operation_id)
    .bind(&w.stock_bucket_id)
    .bind(w.action as i8)
    .bind(WalStatus::Init as i8)
    .bind(&w.request_payload)
    // Due for a worker only once the writer's lease ran out.
    .bind(expire)
    .bind(&w.lease_owner)
    .bind(expire)
    .bind(now)
    .bind(now)
    .execute(&mut **tx)
    .deadline()
    .await?;
    Ok(done.rows_affected() == 1)
}

async fn baseline_for_update(
    tx: &mut Transaction<'_, MySql>,
    bucket: &str,
) -> Result<Option<Baseline>, sqlx::Error> {
    read_baseline(&mut **tx, bucket, true).await
}

/// Creates the baseline (if missing) and the INIT_BUCKET WAL row of its version in one
/// transaction (seed §12.1 step 2). The WAL row is built by `wal` from the baseline as
/// stored, so an existing baseline keeps its values. Returns the stored baseline and whether
/// the WAL row is new.
pub async fn begin_init<F>(
    pool: &MySqlPool,
    b: &Baseline,
    wal: F,
) -> Result<(Baseline, bool), sqlx::Error>
where
    F: FnOnce(&Baseline) -> NewWal,
{
    let mut tx = crate::deadline::begin(pool).await?;
    insert_baseline(&mut *tx, b).await?;
    // A plain read, not FOR UPDATE: twenty concurrent lazy inits each hold a shared lock
    // from the INSERT IGNORE above, and upgrading them would deadlock. A concurrent adjust
    // is harmless here: the executor initialises from the baseline current at run time.
    let stored = read_baseline(&mut *tx, &b.stock_bucket_id, false)
        .await?
        .ok_or(sqlx::Error::RowNotFound)?;
    let new = insert_ignore(&mut tx, &wal(&stored)).await?;
    tx.commit().deadline().await?;
    Ok((stored, new))
}

/// A merchant adjustment, first half (seed §12.3): bumps the baseline version, stores the new
/// total and writes the ADJUST WAL row, in one transaction under the baseline's row lock, so
/// adjusts of one bucket get distinct, ordered versions. Returns the baseline before the
/// change and the WAL row.
pub async fn begin_adjust<F>(
    pool: &MySqlPool,
    bucket: &str,
    new_total: i64,
    wal: F,
) -> Result<(Baseline, WalRow), Refusal>
where
    F: FnOnce(&Baseline) -> NewWal,
{
    let mut tx = crate::deadline::begin(pool).await?;
    let before = baseline_for_update(&mut tx, bucket)
        .await?
        .ok_or_else(|| Refusal::NoBaseline(bucket.to_string()))?;
    if before.bucket_status == 30 {
        return Err(Refusal::Archived(bucket.to_string()));
    }
    sqlx::query(
        "UPDATE dish_stock_baseline SET total_stock = ?, baseline_version = baseline_version + 1, \
         updated_at = ? WHERE stock_bucket_id = ?",
    )
    .bind(new_total)
    .bind(now())
    .bind(bucket)
    .execute(&mut *tx)
    .deadline()
    .await?;
    let new = wal(&before);
    insert_ignore(&mut tx, &new).await?;
    let row = find_by_op(&mut *tx, &new.operation_id)
        .await?
        .ok_or_else(|| Refusal::Mysql(sqlx::Error::RowNotFound))?;
    tx.commit().deadline().await?;
    Ok((before, row))
}

/// Closing a bucket, first half: new Trys are refused from the moment this commits (the Try
/// path reads the baseline status); the CLOSE WAL row then carries the state to Redis, where
/// a Try already past the baseline check is refused by the script.
pub async fn begin_close(pool: &MySqlPool, bucket: &str, wal: NewWal) -> Result<WalRow, Refusal> {
    let mut tx = crate::deadline::begin(pool).await?;
    let b = baseline_for_update(&mut tx, bucket)
        .await?
        .ok_or_else(|| Refusal::NoBaseline(bucket.to_string()))?;
    if b.state() == Some(BucketState::Archived) {
        return Err(Refusal::Archived(bucket.to_string()));
    }
    sqlx::query(
        "UPDATE dish_stock_baseline SET bucket_status = ?, updated_at = ? \
         WHERE stock_bucket_id = ? AND bucket_status = ?",
    )
    .bind(BucketState::Closed.code())
    .bind(now())
    .bind(bucket)
    .bind(BucketState::Open.code())
    .execute(&mut *tx)
    .deadline()
    .await?;
    insert_ignore(&mut tx, &wal).await?;
    let row = find_by_op(&mut *tx, &wal.operation_id)
        .await?
        .ok_or_else(|| Refusal::Mysql(sqlx::Error::RowNotFound))?;
    tx.commit().deadline().await?;
    Ok(row)
}

/// Archiving, first half: only a CLOSED bucket without unfinished reservations. The bucket
/// is CLOSED, so no new reservation can appear in it (a Try racing the close is refused by
/// the script, never left open).
pub async fn begin_archive(pool: &MySqlPool, bucket: &str, wal: NewWal) -> Result<WalRow, Refusal> {
    let mut tx = crate::deadline::begin(pool).await?;
    let b = baseline_for_update(&mut tx, bucket)
        .await?
        .ok_or_else(|| Refusal::NoBaseline(bucket.to_string()))?;
    if b.bucket_status == 10 {
        return Err(Refusal::NotClosed {
            bucket: bucket.to_string(),
            status: bucket_status_name(b.bucket_status),
        });
    }
    let open = crate::buckets::count_open_reservations(&mut *tx, bucket).await?;
    if open > 0 {
        return Err(Refusal::OpenReservations {
            bucket: bucket.to_string(),
            open,
        });
    }
    insert_ignore(&mut tx, &wal).await?;
    let row = find_by_op(&mut *tx, &wal.operation_id)
        .await?
        .ok_or_else(|| Refusal::Mysql(sqlx::Error::RowNotFound))?;
    tx.commit().deadline().await?;
    Ok(row)
}

/// A repair or rebuild row: written as it is (idempotent on its operation id, which the
/// caller derives from what it repairs), no baseline change. Returns the stored row.
pub async fn begin_operation(pool: &MySqlPool, wal: NewWal) -> Result<WalRow, Refusal> {
    let mut tx = crate::deadline::begin(pool).await?;
    if read_baseline(&mut *tx, &wal.stock_bucket_id, false)
        .await?
        .is_none()
    {
        return Err(Refusal::NoBaseline(wal.stock_bucket_id.clone()));
    }
    insert_ignore(&mut tx, &wal).await?;
    let row = find_by_op(&mut *tx, &wal.operation_id)
        .await?
        .ok_or_else(|| Refusal::Mysql(sqlx::Error::RowNotFound))?;
    tx.commit().deadline().await?;
    Ok(row)
}

pub async fn find_by_op<'e, E: sqlx::MySqlExecutor<'e>>(
    exec: E,
    operation_id: &str,
) -> Result<Option<WalRow>, sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM inventory_operation_wal WHERE operation_id = ?"
    ))
    .bind(operation_id)
    .fetch_optional(exec)
    .deadline()
    .await
}

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
         AND JSON_VALUE(result_payload, '$.outcome') = 'SUCCEEDED'";
    let total: Option<(i64,)> = sqlx::query_as(&format!(
        "SELECT CAST(JSON_VALUE(result_payload, '$.after.total') AS SIGNED) \
         FROM inventory_operation_wal WHERE {applied} AND action IN (?, ?, ?, ?) \
         AND JSON_VALUE(result_payload, '$.after.total') IS NOT NULL ORDER BY id DESC LIMIT 1"
    ))
    .bind(WalStatus::Succeeded as i8)
    .bind(bucket)
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
    .bind(WalAction::InitBucket as i8)
    .bind(WalAction::Adjust as i8)
    .fetch_one(pool)
    .deadline()
    .await?;
    Ok(Some((total, version)))
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

/// Rows in the given statuses (all when empty), oldest first.
pub async fn list(
    pool: &MySqlPool,
    statuses: &[WalStatus],
    bucket: Option<&str>,
    limit: u32,
) -> Result<Vec<WalRow>, sqlx::Error> {
    let all = [
        WalStatus::Init,
        WalStatus::Executing,
        WalStatus::Succeeded,
        WalStatus::Retry,
        WalStatus::Dead,
    ];
    let statuses = if statuses.is_empty() {
        &all[..]
    } else {
        statuses
    };
    let marks = vec!["?"; statuses.len()].join(", ");
    let bucket_filter = if bucket.is_some() {
        " AND stock_bucket_id = ?"
    } else {
        ""
    };
    let sql = format!(
        "SELECT {COLUMNS} FROM inventory_operation_wal WHERE status IN ({marks}){bucket_filter} \
         ORDER BY id LIMIT ?"
    );
    let mut q = sqlx::query_as(&sql);
    for s in statuses {
        q = q.bind(*s as i8);
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
