//! The operation WAL (docs/design.md, stock operations without a reservation) for stock
//! operations that have no reservation: bucket init, merchant adjust, repair, and the bucket
//! lifecycle (close, archive). The row is committed before Redis is touched, together with
//! the baseline change it executes, so a crash anywhere leaves a row a worker can resume with
//! the same operation id.
//!
//! Execution is guarded by a lease (`lease_owner`, `lease_expire_at`): whoever holds it runs
//! the Lua step; when the holder dies the lease expires and another worker takes the row
//! over. Correctness does not rest on the lease alone: the Lua op record makes a second run
//! of the same operation id a replay of its first result, and completion is a guarded update
//! (still EXECUTING, still ours) committed together with the outbox rows, so an operation is
//! applied and announced once even if two workers overlap.
//!
//! The row and its insert live here; the statements by job: writing a row with the change it
//! executes ([`begin`]), leasing, completing and failing it ([`lease`]), and the reads the
//! workers, the reconciler and the operator views make ([`read`]).

mod begin;
mod lease;
mod read;

pub use begin::{begin_adjust, begin_archive, begin_close, begin_init, begin_operation};
pub use lease::{
    claim_due, complete, fail, postpone, retry_now, set_request, try_lease, WalCompletion,
};
pub use read::{count_by_status, last_applied, list, succeeded_init, unfinished_before};
pub use stocksvr_core::codes::{WalAction, WalStatus};

use crate::clock::now;
use crate::deadline::Deadline;
use chrono::{NaiveDateTime, TimeDelta};
use sqlx::{MySql, Transaction};

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
