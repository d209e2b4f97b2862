//! Stock operations without a reservation (docs/design.md, the section of that name): bucket init
//! (daily job and lazy init), merchant adjustments and the bucket lifecycle OPEN → CLOSED →
//! ARCHIVED. Each goes WAL → Lua → WAL SUCCEEDED + outbox, so the projector books snapshot and
//! ledger and a crash at any point leaves a WAL row that [`StockOps::work_once`] resumes with the
//! same operation id.
//!
//! Operation ids are deterministic per effect: `op_init_<m>_<d>_<yyyymmdd>_v<baseline>`
//! (one init per baseline version, so concurrent lazy inits and the daily job converge on one
//! row), `op_adjust_…_v<new baseline>`, `op_close_…`, `op_archive_…`.
//!
//! `execute` runs one WAL row (lease, Lua, completion or failure) and the worker; `daily` is
//! the next-day job; `view` is what operators see.

use crate::cache::BaselineCache;
use crate::outbox::{self, Adjusted};
use chrono::{DateTime, NaiveDate, NaiveDateTime, TimeDelta, Utc};
use serde::Serialize;
use serde_json::json;
use sqlx::MySqlPool;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use stocksvr_core::bucket::{self, BucketKey, BucketState};
use stocksvr_core::model::{OpCode, OpResult};
use stocksvr_store::baselines::Baseline;
use stocksvr_store::buckets;
use stocksvr_store::lua::{retry_unknown, ExecError, LuaExecutor, MAX_TOTAL};
use stocksvr_store::wal::{self, NewWal, Refusal, WalAction, WalCompletion, WalRow, WalStatus};
use tokio::sync::watch;

mod daily;
mod execute;
mod repair;
mod view;

pub use daily::{run_daily, DailyConfig, PrepareReport};
pub use execute::{run_worker, WorkReport};
pub use repair::{rebuild_operation_id, repair_operation_id, RebuildPlan, RepairPlan};
pub use view::{BaselineView, BucketReport, RedisView, SnapshotView, WalView};

#[derive(Debug, Clone)]
pub struct OpsConfig {
    /// How long a WAL row belongs to the worker that leased it; past that another takes over.
    pub lease: TimeDelta,
    /// First delay before a failed operation is retried; doubles per attempt.
    pub retry_delay: TimeDelta,
    pub max_retry_delay: TimeDelta,
    /// Failed attempts after which the row is marked dead and alerted.
    pub max_attempts: u32,
    /// Time-to-live of an archived bucket's Redis key.
    pub archive_ttl: Duration,
    /// Immediate retries of a Redis call whose outcome is unknown (same operation id).
    pub unknown_retries: usize,
    /// How long a caller waits for an operation another worker is executing.
    pub peer_wait: Duration,
}

impl Default for OpsConfig {
    fn default() -> Self {
        Self {
            lease: TimeDelta::seconds(30),
            retry_delay: TimeDelta::seconds(1),
            max_retry_delay: TimeDelta::minutes(5),
            max_attempts: 20,
            archive_ttl: Duration::from_secs(30 * 24 * 3600),
            unknown_retries: 3,
            peer_wait: Duration::from_secs(5),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum OpsError {
    #[error(transparent)]
    Refused(Refusal),
    #[error("{field}: {message}")]
    Invalid {
        field: &'static str,
        message: String,
    },
    #[error("no operation {0}")]
    UnknownOperation(String),
    /// Written and leased, not finished: the WAL worker completes it.
    #[error("operation {operation_id} is not finished ({status}): {reason}")]
    Pending {
        operation_id: String,
        status: &'static str,
        reason: String,
    },
    #[error("operation {operation_id} is dead: {reason}")]
    Dead {
        operation_id: String,
        reason: String,
    },
    /// The bucket was initialised before and is gone from Redis: fail closed until rebuilt.
    #[error("bucket {bucket} is missing from Redis although {init} built it; rebuild it from baseline and ledger")]
    BucketLost { bucket: String, init: String },
    #[error("mysql: {0}")]
    Mysql(#[from] sqlx::Error),
    #[error("redis: {0}")]
    Redis(String),
}

impl From<Refusal> for OpsError {
    fn from(r: Refusal) -> Self {
        match r {
            Refusal::Mysql(e) => OpsError::Mysql(e),
            other => OpsError::Refused(other),
        }
    }
}

/// `<m>_<d>_<yyyymmdd>`: the bucket id without its prefix, to keep operation ids short.
fn op_suffix(bucket_id: &str) -> &str {
    bucket_id.strip_prefix("bucket_").unwrap_or(bucket_id)
}

/// Refuses a total the scripts cannot hold (Lua numbers are exact up to 2^53) before anything
/// is written: a bad total would otherwise be retried, carried forward and fail every day.
fn check_total(total: i64) -> Result<(), OpsError> {
    if !(0..=MAX_TOTAL).contains(&total) {
        return Err(OpsError::Invalid {
            field: "total",
            message: format!("must be between 0 and {MAX_TOTAL}, got {total}"),
        });
    }
    Ok(())
}

/// Operation and event ids derive from the bucket id and live in 64-character columns; an id
/// too long for them is refused rather than truncated into another operation's id.
fn check_ids(bucket: &str) -> Result<(), OpsError> {
    if adjust_operation_id(bucket, u64::from(u32::MAX)).len() > 64 {
        return Err(OpsError::Invalid {
            field: "stock_bucket_id",
            message: format!(
                "{bucket} is too long for operation ids (merchant and dish ids of at most 32 digits together)"
            ),
        });
    }
    Ok(())
}

pub fn init_operation_id(bucket_id: &str, baseline_version: u64) -> String {
    format!("op_init_{}_v{baseline_version}", op_suffix(bucket_id))
}

pub fn adjust_operation_id(bucket_id: &str, baseline_version: u64) -> String {
    format!("op_adjust_{}_v{baseline_version}", op_suffix(bucket_id))
}

pub fn close_operation_id(bucket_id: &str) -> String {
    format!("op_close_{}", op_suffix(bucket_id))
}

pub fn archive_operation_id(bucket_id: &str) -> String {
    format!("op_archive_{}", op_suffix(bucket_id))
}

pub struct StockOps {
    pool: MySqlPool,
    lua: Arc<LuaExecutor>,
    config: OpsConfig,
    instance: String,
    seq: AtomicU64,
    outbox_written: Option<Arc<tokio::sync::Notify>>,
    /// Lazy inits in flight in this process, by bucket: the first Try that finds a bucket
    /// missing does the work, the others wait for its answer instead of polling the WAL row
    /// together (two thousand concurrent first Trys would otherwise take the pool).
    init_flights: std::sync::Mutex<HashMap<String, Arc<tokio::sync::Mutex<bool>>>>,
    /// The Try path's copy of baseline rows: an operation that finishes here drops its
    /// bucket's entry, so this process's next Try sees a close or reopen at once.
    baselines: Option<Arc<BaselineCache>>,
}

fn instance_name() -> String {
    let host = std::fs::read_to_string("/etc/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "host".into());
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or_default();
    format!("{host}:{}:{started}", std::process::id())
}

impl StockOps {
    pub fn new(pool: MySqlPool, lua: Arc<LuaExecutor>, config: OpsConfig) -> Self {
        Self {
            pool,
            lua,
            config,
            instance: instance_name(),
            seq: AtomicU64::new(0),
            init_flights: std::sync::Mutex::new(HashMap::new()),
            outbox_written: None,
            baselines: None,
        }
    }

    pub(crate) fn with_baseline_cache(mut self, cache: Arc<BaselineCache>) -> Self {
        self.baselines = Some(cache);
        self
    }

    /// Drops this process's cached baseline of `bucket` after an operation changed it.
    pub(super) fn baseline_changed(&self, bucket: &str) {
        if let Some(cache) = &self.baselines {
            cache.forget(&bucket.to_string());
        }
    }

    pub fn with_outbox_waker(mut self, relay: Arc<tokio::sync::Notify>) -> Self {
        self.outbox_written = Some(relay);
        self
    }

    pub fn config(&self) -> &OpsConfig {
        &self.config
    }

    /// A lease token unique to one execution, so two callers in one process do not share a
    /// lease (the lease says who executes; waiting callers then really wait).
    fn token(&self) -> String {
        format!(
            "{}#{}",
            self.instance,
            self.seq.fetch_add(1, Ordering::Relaxed)
        )
    }

    fn new_wal(
        &self,
        owner: &str,
        operation_id: String,
        bucket: &str,
        action: WalAction,
        request: serde_json::Value,
    ) -> NewWal {
        NewWal {
            operation_id,
            stock_bucket_id: bucket.to_string(),
            action,
            request_payload: request,
            lease_owner: owner.to_string(),
            lease: self.config.lease,
        }
    }

    /// Creates a day's bucket: the baseline (kept as it is when it exists) and its INIT WAL
    /// row in one transaction, then Lua. Idempotent: the same baseline version is one
    /// operation however often it is asked for.
    pub async fn init_bucket(&self, b: &Baseline) -> Result<WalView, OpsError> {
        check_total(b.total_stock)?;
        check_ids(&b.stock_bucket_id)?;
        let owner = self.token();
        let (stored, _) = wal::begin_init(&self.pool, b, |s| {
            self.new_wal(
                &owner,
                init_operation_id(&s.stock_bucket_id, s.baseline_version),
                &s.stock_bucket_id,
                WalAction::InitBucket,
                json!({
                    "merchant_id": s.merchant_id,
                    "dish_id": s.dish_id,
                    "stock_date": s.stock_date.to_string(),
                    "timezone": s.timezone,
                    "total": s.total_stock,
                    "baseline_version": s.baseline_version,
                }),
            )
        })
        .await?;
        let op = init_operation_id(&stored.stock_bucket_id, stored.baseline_version);
        self.drive(&op, &owner).await
    }

    /// Lazy initialisation (docs/design.md, daily buckets and their lifecycle): a Try found no
    /// bucket in Redis. Same WAL row and Lua path as the daily job; concurrent first Trys share one
    /// row and one execution.
    ///
    /// Only a bucket that never existed is created here. If an init of it succeeded before,
    /// Redis lost the bucket (a flush, a failover without persistence): creating it again
    /// would sell what is already reserved or sold, so the Try fails closed and an operator
    /// rebuilds it from baseline and ledger (docs/design.md, reconcile, repair, rebuild).
    pub async fn ensure_bucket(&self, b: &Baseline) -> Result<(), OpsError> {
        let flight = {
            let mut flights = self
                .init_flights
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            flights
                .entry(b.stock_bucket_id.clone())
                .or_default()
                .clone()
        };
        let mut done = flight.lock().await;
        if *done {
            return Ok(());
        }
        let result = self.ensure_bucket_once(b).await;
        if result.is_ok() {
            *done = true;
            // Later Trys find the bucket in Redis and never come here; the waiters still
            // hold the flight and read `done`.
            self.init_flights
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .remove(&b.stock_bucket_id);
        }
        result
    }

    /// What a "no stock hash" answer of Redis means for `bucket`, judged after the fact (the
    /// script ran before MySQL was read).
    pub(crate) async fn missing(
        &self,
        bucket: &str,
        keys: &BucketKey,
    ) -> Result<Missing, OpsError> {
        let Some(init) = wal::succeeded_init(&self.pool, bucket).await? else {
            return Ok(Missing::NeverBuilt);
        };
        let present = self
            .lua
            .read_bucket(keys)
            .await
            .map_err(|e| OpsError::Redis(e.to_string()))?
            .is_some();
        Ok(if present {
            Missing::BuiltMeanwhile
        } else {
            Missing::Lost { init }
        })
    }

    async fn ensure_bucket_once(&self, b: &Baseline) -> Result<(), OpsError> {
        let op = init_operation_id(&b.stock_bucket_id, b.baseline_version);
        let keys = BucketKey::new(b.merchant_id, b.dish_id, b.stock_date);
        match self.missing(&b.stock_bucket_id, &keys).await? {
            Missing::NeverBuilt => {}
            // Built meanwhile by a concurrent Try or the daily job.
            Missing::BuiltMeanwhile => return Ok(()),
            Missing::Lost { init: earlier } => {
                tracing::error!(bucket = %b.stock_bucket_id, init = %earlier, "bucket initialised before is missing from Redis: not re-created (it would resell what was reserved or sold); rebuild it from baseline and ledger");
                return Err(OpsError::BucketLost {
                    bucket: b.stock_bucket_id.clone(),
                    init: earlier,
                });
            }
        }
        // An init that went dead (Redis down for an hour, say) would fail every Try of the
        // day: the Try path gives it one more attempt per backoff period.
        if let Some(row) = wal::find_by_op(&self.pool, &op).await? {
            let stale =
                chrono::Utc::now().naive_utc() - row.updated_at >= self.config.max_retry_delay;
            if row.status() == Some(WalStatus::Dead) && stale {
                tracing::warn!(operation_id = %op, "retrying a dead bucket init for a Try");
                wal::retry_now(&self.pool, &op).await?;
            }
        }
        let view = self.init_bucket(b).await?;
        match WalStatus::from_name(view.status) {
            Some(WalStatus::Succeeded) => Ok(()),
            Some(WalStatus::Dead) => Err(OpsError::Dead {
                operation_id: view.operation_id,
                reason: view.last_error.unwrap_or_default(),
            }),
            status => Err(OpsError::Pending {
                operation_id: view.operation_id,
                status: status
                    .filter(|s| *s == WalStatus::Retry)
                    .unwrap_or(WalStatus::Executing)
                    .name(),
                reason: view.last_error.unwrap_or_default(),
            }),
        }
    }

    /// A merchant's new total (docs/design.md, adjustments and deficit):
    /// `available = max(0, total - reserved - sold)`; an adjust below what was already accepted
    /// records a deficit and never cancels orders.
    pub async fn adjust(&self, bucket: &str, new_total: i64) -> Result<WalView, OpsError> {
        check_total(new_total)?;
        check_ids(bucket)?;
        let owner = self.token();
        let (_, row) = wal::begin_adjust(&self.pool, bucket, new_total, |before| {
            let version = before.baseline_version + 1;
            self.new_wal(
                &owner,
                adjust_operation_id(bucket, version),
                bucket,
                WalAction::Adjust,
                json!({
                    "old_total": before.total_stock,
                    "new_total": new_total,
                    "baseline_version": version,
                }),
            )
        })
        .await?;
        self.drive(&row.operation_id, &owner).await
    }

    /// CLOSED: no new Try from the moment the baseline changes; Confirm, Cancel and Refund of
    /// existing reservations go on.
    pub async fn close(&self, bucket: &str) -> Result<WalView, OpsError> {
        check_ids(bucket)?;
        let owner = self.token();
        let op = close_operation_id(bucket);
        let w = self.new_wal(&owner, op.clone(), bucket, WalAction::Close, json!({}));
        wal::begin_close(&self.pool, bucket, w).await?;
        self.drive(&op, &owner).await
    }

    /// ARCHIVED: refused while any reservation of the bucket is unfinished; the Redis key then
    /// gets `archive_ttl` to live.
    pub async fn archive(&self, bucket: &str) -> Result<WalView, OpsError> {
        check_ids(bucket)?;
        let owner = self.token();
        let op = archive_operation_id(bucket);
        let w = self.new_wal(
            &owner,
            op.clone(),
            bucket,
            WalAction::Archive,
            json!({ "ttl_secs": self.config.archive_ttl.as_secs() }),
        );
        wal::begin_archive(&self.pool, bucket, w).await?;
        self.drive(&op, &owner).await
    }

    /// An operator's "retry now" for a RETRY or DEAD row (a finished one is shown as it is).
    /// It is one more attempt: a dead row that fails again is dead again.
    pub async fn retry_now(&self, operation_id: &str) -> Result<WalView, OpsError> {
        wal::retry_now(&self.pool, operation_id).await?;
        let owner = self.token();
        self.drive(operation_id, &owner).await
    }

    pub async fn find(&self, operation_id: &str) -> Result<WalView, OpsError> {
        Ok(WalView::from_row(&self.find_row(operation_id).await?))
    }

    pub async fn list(
        &self,
        statuses: &[WalStatus],
        bucket: Option<&str>,
        limit: u32,
    ) -> Result<Vec<WalView>, OpsError> {
        Ok(wal::list(&self.pool, statuses, bucket, limit)
            .await?
            .iter()
            .map(WalView::from_row)
            .collect())
    }
}

/// What a "no stock hash" answer of Redis means for a bucket.
pub(crate) enum Missing {
    /// No init ever succeeded: the bucket is simply not built yet.
    NeverBuilt,
    /// Present when read back: built after the script ran.
    BuiltMeanwhile,
    /// Built by `init` and gone now: Redis lost it; only a rebuild brings it back.
    Lost { init: String },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operation_ids_are_per_effect_and_fit_the_column() {
        let b = "bucket_10001_90001_20260726";
        assert_eq!(init_operation_id(b, 1), "op_init_10001_90001_20260726_v1");
        assert_eq!(
            adjust_operation_id(b, 3),
            "op_adjust_10001_90001_20260726_v3"
        );
        assert_eq!(close_operation_id(b), "op_close_10001_90001_20260726");
        assert_eq!(archive_operation_id(b), "op_archive_10001_90001_20260726");
        // Twelve-digit merchant and dish ids leave room for any realistic version.
        let day = NaiveDate::from_ymd_opt(2026, 12, 31).unwrap();
        let long = BucketKey::new(999_999_999_999, 999_999_999_999, day).stock_bucket_id();
        assert!(adjust_operation_id(&long, u32::MAX as u64).len() <= 64);
    }
}
