//! Stock operations without a reservation (seed §4.5, §12): bucket init (daily job and lazy
//! init), merchant adjustments and the bucket lifecycle OPEN → CLOSED → ARCHIVED. Each goes
//! WAL → Lua → WAL SUCCEEDED + outbox, so the projector books snapshot and ledger and a crash
//! at any point leaves a WAL row that [`StockOps::work_once`] resumes with the same operation
//! id.
//!
//! Operation ids are deterministic per effect: `op_init_<m>_<d>_<yyyymmdd>_v<baseline>`
//! (one init per baseline version, so concurrent lazy inits and the daily job converge on one
//! row), `op_adjust_…_v<new baseline>`, `op_close_…`, `op_archive_…`.

use crate::outbox::{self, Adjusted};
use backon::{ExponentialBuilder, Retryable};
use chrono::{DateTime, NaiveDate, NaiveDateTime, TimeDelta, Utc};
use serde::Serialize;
use serde_json::json;
use sqlx::MySqlPool;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use stocksvr_core::bucket::{self, BucketKey, BucketState as DayState};
use stocksvr_store::lua::{BucketKeys, BucketState, ExecError, LuaExecutor, OpResult, Outcome};
use stocksvr_store::reservations::{self as repo, Baseline};
use stocksvr_store::wal::{self, NewWal, Refusal, WalAction, WalCompletion, WalRow, WalStatus};
use tokio::sync::watch;

pub mod names {
    pub const WAL_OPERATIONS: &str = "stocksvr_wal_operations_total";
    pub const WAL_BACKLOG: &str = "stocksvr_wal_backlog";
    pub const WAL_DEAD: &str = "stocksvr_wal_dead_total";
    pub const DEFICIT: &str = "stocksvr_bucket_deficit_total";
    pub const DAILY_PREPARED: &str = "stocksvr_daily_buckets_prepared_total";
}

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
            archive_ttl: Duration::from_secs(7 * 24 * 3600),
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

/// A WAL row as operators and the admin API see it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WalView {
    pub id: u64,
    pub operation_id: String,
    pub stock_bucket_id: String,
    pub action: &'static str,
    pub status: &'static str,
    pub retry_count: u32,
    pub next_retry_at: String,
    pub lease_owner: Option<String>,
    pub lease_expire_at: Option<String>,
    pub last_error: Option<String>,
    pub request: serde_json::Value,
    pub result: Option<serde_json::Value>,
    pub created_at: String,
    pub updated_at: String,
}

fn ts(t: NaiveDateTime) -> String {
    t.and_utc()
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

fn parse_json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or(serde_json::Value::String(text.to_string()))
}

impl WalView {
    pub fn from_row(r: &WalRow) -> Self {
        Self {
            id: r.id,
            operation_id: r.operation_id.clone(),
            stock_bucket_id: r.stock_bucket_id.clone(),
            action: r.action().map(WalAction::name).unwrap_or("UNKNOWN"),
            status: r.status().map(WalStatus::name).unwrap_or("UNKNOWN"),
            retry_count: r.retry_count,
            next_retry_at: ts(r.next_retry_at),
            lease_owner: r.lease_owner.clone(),
            lease_expire_at: r.lease_expire_at.map(ts),
            last_error: r.last_error.clone(),
            request: parse_json(&r.request_payload),
            result: r.result_payload.as_deref().map(parse_json),
            created_at: ts(r.created_at),
            updated_at: ts(r.updated_at),
        }
    }

    pub fn succeeded(&self) -> bool {
        self.status == WalStatus::Succeeded.name()
    }
}

/// One bucket as an operator needs to see it: the baseline, Redis (the truth for what can be
/// sold) next to the snapshot the projector built, and its recent stock operations.
#[derive(Debug, Clone, Serialize)]
pub struct BucketReport {
    pub stock_bucket_id: String,
    pub baseline: Option<BaselineView>,
    pub redis: Option<RedisView>,
    pub snapshot: Option<SnapshotView>,
    pub open_reservations: i64,
    pub operations: Vec<WalView>,
}

#[derive(Debug, Clone, Serialize)]
pub struct BaselineView {
    pub merchant_id: u64,
    pub dish_id: u64,
    pub stock_date: String,
    pub timezone: String,
    pub total_stock: i64,
    pub baseline_version: u64,
    pub stock_enabled: bool,
    pub bucket_status: &'static str,
}

#[derive(Debug, Clone, Serialize)]
pub struct RedisView {
    pub state: &'static str,
    pub total: i64,
    pub available: i64,
    pub reserved: i64,
    pub sold: i64,
    pub deficit: i64,
    pub version: u64,
    pub baseline_version: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct SnapshotView {
    pub total: i64,
    pub available: i64,
    pub reserved: i64,
    pub sold: i64,
    pub deficit: i64,
    pub redis_version: u64,
    pub updated_at: String,
}

fn bucket_state_name(code: i8) -> &'static str {
    match code {
        10 => "OPEN",
        20 => "CLOSED",
        30 => "ARCHIVED",
        _ => "UNKNOWN",
    }
}

/// `<m>_<d>_<yyyymmdd>`: the bucket id without its prefix, to keep operation ids short.
fn op_suffix(bucket_id: &str) -> &str {
    bucket_id.strip_prefix("bucket_").unwrap_or(bucket_id)
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

/// What one step of a WAL row ended in.
enum Step {
    Done(WalCompletion),
    /// Worth trying again later (Redis down, an unknown outcome, a transient refusal).
    Retry(String),
    /// No retry can help; an operator must look.
    Dead(String),
}

/// Outcome of one worker round.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WorkReport {
    pub succeeded: usize,
    pub failed: usize,
    pub dead: usize,
}

/// What a daily preparation round did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PrepareReport {
    /// Buckets initialised (baseline + WAL + Redis) in this round.
    pub prepared: usize,
    /// Buckets whose init did not finish now; the WAL worker retries them.
    pub pending: usize,
}

pub struct StockOps {
    pool: MySqlPool,
    lua: Arc<LuaExecutor>,
    config: OpsConfig,
    instance: String,
    seq: AtomicU64,
    outbox_written: Option<Arc<tokio::sync::Notify>>,
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
            outbox_written: None,
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
        if b.total_stock < 0 {
            return Err(OpsError::Invalid {
                field: "total",
                message: format!("must be >= 0, got {}", b.total_stock),
            });
        }
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

    /// Lazy initialisation (seed §12.1): a Try found no bucket in Redis. Same WAL row and Lua
    /// path as the daily job; concurrent first Trys share one row and one execution.
    pub async fn ensure_bucket(&self, b: &Baseline) -> Result<(), OpsError> {
        let view = self.init_bucket(b).await?;
        match view.status {
            s if s == WalStatus::Succeeded.name() => Ok(()),
            s if s == WalStatus::Dead.name() => Err(OpsError::Dead {
                operation_id: view.operation_id,
                reason: view.last_error.unwrap_or_default(),
            }),
            s => Err(OpsError::Pending {
                operation_id: view.operation_id,
                status: if s == WalStatus::Retry.name() {
                    "RETRY"
                } else {
                    "EXECUTING"
                },
                reason: view.last_error.unwrap_or_default(),
            }),
        }
    }

    /// A merchant's new total (seed §12.3): `available = max(0, total - reserved - sold)`; an
    /// adjust below what was already accepted records a deficit and never cancels orders.
    pub async fn adjust(&self, bucket: &str, new_total: i64) -> Result<WalView, OpsError> {
        if new_total < 0 {
            return Err(OpsError::Invalid {
                field: "total",
                message: format!("must be >= 0, got {new_total}"),
            });
        }
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
        let owner = self.token();
        let op = close_operation_id(bucket);
        let w = self.new_wal(&owner, op.clone(), bucket, WalAction::Close, json!({}));
        wal::begin_close(&self.pool, bucket, w).await?;
        self.drive(&op, &owner).await
    }

    /// ARCHIVED: refused while any reservation of the bucket is unfinished; the Redis key then
    /// gets `archive_ttl` to live.
    pub async fn archive(&self, bucket: &str) -> Result<WalView, OpsError> {
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
        let row = wal::find_by_op(&self.pool, operation_id)
            .await?
            .ok_or_else(|| OpsError::UnknownOperation(operation_id.to_string()))?;
        Ok(WalView::from_row(&row))
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

    /// Executes the row if it is unfinished and free (or ours); otherwise waits a bounded time
    /// for whoever holds it, then reports where it stands.
    async fn drive(&self, operation_id: &str, owner: &str) -> Result<WalView, OpsError> {
        let row = wal::find_by_op(&self.pool, operation_id)
            .await?
            .ok_or_else(|| OpsError::UnknownOperation(operation_id.to_string()))?;
        if matches!(
            row.status(),
            Some(WalStatus::Succeeded) | Some(WalStatus::Dead)
        ) {
            return Ok(WalView::from_row(&row));
        }
        if wal::try_lease(&self.pool, row.id, owner, self.config.lease).await? {
            let row = wal::find_by_op(&self.pool, operation_id)
                .await?
                .ok_or_else(|| OpsError::UnknownOperation(operation_id.to_string()))?;
            return self.execute(row, owner).await;
        }
        // Someone else executes it: the result is theirs to write; wait for it.
        let deadline = tokio::time::Instant::now() + self.config.peer_wait;
        loop {
            let row = wal::find_by_op(&self.pool, operation_id)
                .await?
                .ok_or_else(|| OpsError::UnknownOperation(operation_id.to_string()))?;
            let finished = matches!(
                row.status(),
                Some(WalStatus::Succeeded) | Some(WalStatus::Dead) | Some(WalStatus::Retry)
            );
            if finished || tokio::time::Instant::now() >= deadline {
                return Ok(WalView::from_row(&row));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Runs the Lua step of a leased row and records the outcome (guarded by the lease).
    async fn execute(&self, row: WalRow, owner: &str) -> Result<WalView, OpsError> {
        let action = row.action().map(WalAction::name).unwrap_or("UNKNOWN");
        let step = self.step(&row).await?;
        match step {
            Step::Done(completion) => {
                if wal::complete(&self.pool, &row, owner, &completion).await? {
                    metrics::counter!(names::WAL_OPERATIONS, "action" => action, "outcome" => "succeeded").increment(1);
                    tracing::info!(operation_id = %row.operation_id, bucket = %row.stock_bucket_id, action, result = %completion.result_payload, "stock operation succeeded");
                    if !completion.outbox.is_empty() {
                        if let Some(relay) = &self.outbox_written {
                            relay.notify_one();
                        }
                    }
                } else {
                    tracing::debug!(operation_id = %row.operation_id, "completion lost its lease; the worker that took over finishes it");
                }
            }
            Step::Retry(reason) => {
                let attempts = row.retry_count + 1;
                let dead = attempts >= self.config.max_attempts;
                self.record_failure(&row, owner, action, &reason, dead)
                    .await?;
            }
            Step::Dead(reason) => {
                self.record_failure(&row, owner, action, &reason, true)
                    .await?;
            }
        }
        let row = wal::find_by_op(&self.pool, &row.operation_id)
            .await?
            .ok_or_else(|| OpsError::UnknownOperation(row.operation_id.clone()))?;
        Ok(WalView::from_row(&row))
    }

    async fn record_failure(
        &self,
        row: &WalRow,
        owner: &str,
        action: &'static str,
        reason: &str,
        dead: bool,
    ) -> Result<(), OpsError> {
        let delay = {
            let factor = 1i32 << row.retry_count.min(20);
            (self.config.retry_delay * factor).min(self.config.max_retry_delay)
        };
        let stuck = row.status().map(WalStatus::name).unwrap_or("UNKNOWN");
        let alert = dead.then(|| outbox::wal_dead(row, action, stuck, reason));
        let landed = wal::fail(&self.pool, row, owner, reason, delay, alert.as_ref()).await?;
        if !landed {
            return Ok(());
        }
        if dead {
            metrics::counter!(names::WAL_DEAD, "action" => action).increment(1);
            metrics::counter!(names::WAL_OPERATIONS, "action" => action, "outcome" => "dead")
                .increment(1);
            tracing::error!(operation_id = %row.operation_id, bucket = %row.stock_bucket_id, action, retry_count = row.retry_count + 1, error = reason, "stock operation marked dead: operator action needed");
            if let Some(relay) = &self.outbox_written {
                relay.notify_one();
            }
        } else {
            metrics::counter!(names::WAL_OPERATIONS, "action" => action, "outcome" => "retry")
                .increment(1);
            tracing::warn!(operation_id = %row.operation_id, bucket = %row.stock_bucket_id, action, retry_in_ms = delay.num_milliseconds(), error = reason, "stock operation failed; will retry");
        }
        Ok(())
    }

    /// Calls a script, retrying an UNKNOWN outcome with the same operation id (the op record
    /// turns an applied call into a replay, so this never applies twice).
    async fn call<F, Fut>(&self, operation_id: &str, f: F) -> Result<OpResult, ExecError>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<OpResult, ExecError>>,
    {
        let backoff = ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(50))
            .with_max_delay(Duration::from_millis(500))
            .with_max_times(self.config.unknown_retries)
            .with_jitter();
        f.retry(backoff)
            .when(|e: &ExecError| e.is_unknown())
            .notify(|e, after| tracing::warn!(operation_id, error = %e, ?after, "redis outcome unknown; retrying with the same operation id"))
            .await
    }

    async fn step(&self, row: &WalRow) -> Result<Step, OpsError> {
        let Some(action) = row.action() else {
            return Ok(Step::Dead(format!(
                "unknown WAL action code {}",
                row.action
            )));
        };
        // The current baseline: an adjust may have moved it on since the row was written,
        // and every script here is idempotent per operation id and baseline version.
        let Some(baseline) = repo::find_baseline(&self.pool, &row.stock_bucket_id).await? else {
            return Ok(Step::Dead(format!(
                "bucket {} has no baseline",
                row.stock_bucket_id
            )));
        };
        let keys = match BucketKeys::new(
            baseline.merchant_id,
            baseline.dish_id,
            &baseline.stock_date.to_string(),
        ) {
            Ok(k) => k,
            Err(e) => return Ok(Step::Dead(e.to_string())),
        };
        let op = row.operation_id.as_str();
        let request = parse_json(&row.request_payload);
        let result = match action {
            WalAction::InitBucket => {
                self.call(op, || {
                    self.lua
                        .init_bucket(&keys, op, baseline.total_stock, baseline.baseline_version)
                })
                .await
            }
            WalAction::Adjust => {
                let (Some(new_total), Some(version)) = (
                    request.get("new_total").and_then(|v| v.as_i64()),
                    request.get("baseline_version").and_then(|v| v.as_u64()),
                ) else {
                    return Ok(Step::Dead(
                        "adjust request lacks new_total or baseline_version".into(),
                    ));
                };
                self.call(op, || self.lua.adjust(&keys, op, new_total, None, version))
                    .await
            }
            WalAction::Close => {
                self.call(op, || {
                    self.lua.set_state(&keys, op, BucketState::Closed, None)
                })
                .await
            }
            WalAction::Archive => {
                // The script records a refusal (stock still reserved) under its operation id,
                // and a refusal here is transient: each attempt gets its own id. Archiving
                // twice is harmless (same state, no change), unlike initialising twice.
                let attempt = format!("{op}_a{}", row.retry_count);
                let ttl = Some(self.config.archive_ttl);
                self.call(&attempt, || {
                    self.lua
                        .set_state(&keys, &attempt, BucketState::Archived, ttl)
                })
                .await
            }
            WalAction::Repair => {
                return Ok(Step::Dead(
                    "repair operations run with the reconciler, which this worker does not include"
                        .into(),
                ))
            }
        };
        let result = match result {
            Ok(r) => r,
            Err(e) if e.is_unknown() => return Ok(Step::Retry(e.to_string())),
            // A refused argument or a protocol error will not change on retry, but Redis may
            // have been mid-upgrade: retry with backoff up to the bound, then dead.
            Err(e) => return Ok(Step::Retry(e.to_string())),
        };
        Ok(self.conclude(row, action, &baseline, &request, &result))
    }

    /// Turns a script result into the WAL completion (outbox rows, baseline changes) or a
    /// retry/dead verdict.
    fn conclude(
        &self,
        row: &WalRow,
        action: WalAction,
        baseline: &Baseline,
        request: &serde_json::Value,
        result: &OpResult,
    ) -> Step {
        let op = row.operation_id.as_str();
        let summary = |extra: serde_json::Value| {
            let mut v = json!({
                "outcome": result.outcome.as_str(),
                "replayed": result.replayed,
                "redis_version": result.after.version,
                "after": {
                    "total": result.after.total,
                    "available": result.after.available,
                    "reserved": result.after.reserved,
                    "sold": result.after.sold,
                    "deficit": result.deficit,
                },
            });
            if let (Some(map), serde_json::Value::Object(extra)) = (v.as_object_mut(), extra) {
                map.extend(extra);
            }
            v
        };
        let done = |outbox, bucket_status, extra| {
            Step::Done(WalCompletion {
                result_payload: summary(extra),
                outbox,
                bucket_status,
            })
        };
        match (action, result.outcome) {
            (WalAction::InitBucket, Outcome::Succeeded) => {
                // Only a bucket that came into being is booked: an UNCHANGED init found a
                // bucket built from the same or a newer baseline, already in the ledger.
                let created = matches!(
                    result.phase.as_deref(),
                    Some("INITIALIZED") | Some("REINITIALIZED")
                );
                let outbox = if created {
                    vec![outbox::bucket_initialized(row.id, op, baseline, result)]
                } else {
                    Vec::new()
                };
                done(outbox, None, json!({ "effect": result.phase }))
            }
            (WalAction::InitBucket, Outcome::Conflict) => Step::Dead(format!(
                "bucket {} has traded under an older baseline; an init must not overwrite it (use adjust)",
                row.stock_bucket_id
            )),
            (WalAction::Adjust, Outcome::Succeeded) => {
                let old_total = request.get("old_total").and_then(|v| v.as_i64()).unwrap_or(0);
                let new_total = request
                    .get("new_total")
                    .and_then(|v| v.as_i64())
                    .unwrap_or(result.after.total);
                let version = request
                    .get("baseline_version")
                    .and_then(|v| v.as_u64())
                    .unwrap_or(baseline.baseline_version);
                // Adjust moves neither reserved nor sold, so what was available before follows
                // from the total before (the previous adjust's or the init's).
                let committed = result.after.reserved + result.after.sold;
                let available_delta = result.after.available - (old_total - committed).max(0);
                if result.deficit > 0 && !result.replayed {
                    metrics::counter!(names::DEFICIT).increment(1);
                    tracing::error!(bucket = %row.stock_bucket_id, operation_id = op, new_total, committed, deficit = result.deficit, "adjust below accepted orders: available is 0 and a deficit is recorded; accepted orders stand");
                }
                let event = outbox::baseline_adjusted(&Adjusted {
                    wal_id: row.id,
                    operation_id: op,
                    baseline,
                    baseline_version: version,
                    old_total,
                    new_total,
                    available_delta,
                    result,
                });
                done(vec![event], None, json!({ "old_total": old_total }))
            }
            // Not in Redis yet: the baseline carries the new total, and the bucket's init will
            // start from it.
            (WalAction::Adjust, Outcome::BucketMissing) => done(
                Vec::new(),
                None,
                json!({ "effect": "baseline only: the bucket is not in Redis yet and will be initialised from the new total" }),
            ),
            // A newer adjust already applied (this one arrived late): it is superseded.
            (WalAction::Adjust, Outcome::Conflict) => {
                done(Vec::new(), None, json!({ "effect": "superseded by a newer baseline" }))
            }
            (WalAction::Close, Outcome::Succeeded | Outcome::BucketMissing | Outcome::Conflict) => {
                done(Vec::new(), None, json!({}))
            }
            (WalAction::Archive, Outcome::Succeeded | Outcome::BucketMissing) => {
                done(Vec::new(), Some(DayState::Archived.code() as i8), json!({}))
            }
            // Stock is still reserved in Redis although MySQL has no unfinished reservation
            // left: a step is still settling; try again later, and alert if it never does.
            (WalAction::Archive, Outcome::Conflict) => Step::Retry(format!(
                "bucket {} still has {} reserved in Redis",
                row.stock_bucket_id, result.after.reserved
            )),
            (action, outcome) => Step::Dead(format!(
                "{} got {} from Redis",
                action.name(),
                outcome.as_str()
            )),
        }
    }

    /// One WAL worker round: claims due rows nobody holds a live lease on (including rows
    /// whose holder died) and executes them.
    pub async fn work_once(&self, batch: u32) -> Result<WorkReport, OpsError> {
        let owner = self.token();
        let rows = wal::claim_due(&self.pool, &owner, self.config.lease, batch).await?;
        let mut report = WorkReport::default();
        for row in rows {
            if row.lease_owner.is_some() {
                tracing::warn!(operation_id = %row.operation_id, previous_owner = row.lease_owner.as_deref().unwrap_or(""), "taking over a stock operation whose lease expired");
            }
            match self.execute(row, &owner).await {
                Ok(v) if v.succeeded() => report.succeeded += 1,
                Ok(v) if v.status == WalStatus::Dead.name() => report.dead += 1,
                Ok(_) => report.failed += 1,
                Err(OpsError::Mysql(e)) => return Err(OpsError::Mysql(e)),
                Err(e) => {
                    report.failed += 1;
                    tracing::warn!(error = %e, "stock operation attempt failed");
                }
            }
        }
        if let Ok(counts) = wal::count_by_status(&self.pool).await {
            for status in [
                WalStatus::Init,
                WalStatus::Executing,
                WalStatus::Retry,
                WalStatus::Dead,
            ] {
                let n = counts
                    .iter()
                    .find(|(s, _)| *s == status as i8)
                    .map(|(_, n)| *n)
                    .unwrap_or(0);
                metrics::gauge!(names::WAL_BACKLOG, "status" => status.name()).set(n as f64);
            }
        }
        Ok(report)
    }

    /// The daily job (seed §12.1): for every time zone baselines exist in, makes sure today's
    /// buckets exist (catch-up after downtime) and, within `lead` of the local midnight,
    /// tomorrow's, carrying each dish's latest total forward. Each goes baseline + WAL →
    /// Lua → outbox like any init.
    pub async fn prepare_days(
        &self,
        now: DateTime<Utc>,
        lead: TimeDelta,
        lookback_days: i64,
    ) -> Result<PrepareReport, OpsError> {
        let mut report = PrepareReport::default();
        for tz_name in wal::baseline_timezones(&self.pool).await? {
            let tz = match bucket::parse_timezone(&tz_name) {
                Ok(tz) => tz,
                Err(e) => {
                    tracing::warn!(timezone = %tz_name, error = %e, "baselines in an unknown time zone are not carried forward");
                    continue;
                }
            };
            let today = bucket::business_date(now, tz);
            let mut days = vec![today];
            if let Some(tomorrow) = today.succ_opt() {
                if until_local_midnight(now, tz, tomorrow) <= lead {
                    days.push(tomorrow);
                }
            }
            for day in days {
                self.prepare_day(&tz_name, day, lookback_days, &mut report)
                    .await?;
            }
        }
        if report.prepared + report.pending > 0 {
            tracing::info!(
                prepared = report.prepared,
                pending = report.pending,
                "daily buckets prepared"
            );
        }
        Ok(report)
    }

    async fn prepare_day(
        &self,
        tz_name: &str,
        day: NaiveDate,
        lookback_days: i64,
        report: &mut PrepareReport,
    ) -> Result<(), OpsError> {
        loop {
            let carry =
                wal::baselines_to_carry(&self.pool, tz_name, day, lookback_days, 200).await?;
            if carry.is_empty() {
                return Ok(());
            }
            for from in &carry {
                let key = BucketKey::new(from.merchant_id, from.dish_id, day);
                let b = Baseline {
                    stock_bucket_id: key.stock_bucket_id(),
                    merchant_id: from.merchant_id,
                    dish_id: from.dish_id,
                    stock_date: day,
                    timezone: from.timezone.clone(),
                    total_stock: from.total_stock,
                    baseline_version: 1,
                    stock_status: from.stock_status,
                    bucket_status: DayState::Open.code() as i8,
                };
                match self.init_bucket(&b).await {
                    Ok(v) if v.succeeded() => {
                        report.prepared += 1;
                        metrics::counter!(names::DAILY_PREPARED).increment(1);
                    }
                    Ok(v) => {
                        report.pending += 1;
                        tracing::warn!(bucket = %b.stock_bucket_id, status = v.status, "next-day bucket not initialised yet; the WAL worker retries it");
                    }
                    Err(OpsError::Mysql(e)) => return Err(OpsError::Mysql(e)),
                    Err(e) => {
                        report.pending += 1;
                        tracing::warn!(bucket = %b.stock_bucket_id, error = %e, "preparing a bucket failed");
                    }
                }
            }
        }
    }

    /// Baseline, Redis and snapshot of one bucket side by side.
    pub async fn show_bucket(&self, bucket_id: &str) -> Result<BucketReport, OpsError> {
        let key = bucket::parse_bucket_id(bucket_id).map_err(|e| OpsError::Invalid {
            field: "stock_bucket_id",
            message: e.to_string(),
        })?;
        let baseline = repo::find_baseline(&self.pool, bucket_id).await?;
        let keys = BucketKeys::new(key.merchant_id, key.dish_id, &key.stock_date.to_string())
            .map_err(|e| OpsError::Invalid {
                field: "stock_bucket_id",
                message: e.to_string(),
            })?;
        let redis = self
            .lua
            .read_bucket(&keys)
            .await
            .map_err(|e| OpsError::Redis(e.to_string()))?;
        let snapshot = wal::find_snapshot(&self.pool, bucket_id).await?;
        let open = wal::count_open_reservations(&self.pool, bucket_id).await?;
        let operations = self.list(&[], Some(bucket_id), 50).await?;
        Ok(BucketReport {
            stock_bucket_id: bucket_id.to_string(),
            baseline: baseline.map(|b| BaselineView {
                merchant_id: b.merchant_id,
                dish_id: b.dish_id,
                stock_date: b.stock_date.to_string(),
                timezone: b.timezone,
                total_stock: b.total_stock,
                baseline_version: b.baseline_version,
                stock_enabled: b.stock_status == 1,
                bucket_status: bucket_state_name(b.bucket_status),
            }),
            redis: redis.map(|r| RedisView {
                state: r.state.as_str(),
                total: r.total,
                available: r.available,
                reserved: r.reserved,
                sold: r.sold,
                deficit: r.deficit,
                version: r.version,
                baseline_version: r.baseline_version,
            }),
            snapshot: snapshot.map(|s| SnapshotView {
                total: s.total_stock,
                available: s.available_stock,
                reserved: s.reserved_stock,
                sold: s.sold_stock,
                deficit: s.deficit_stock,
                redis_version: s.redis_version,
                updated_at: ts(s.updated_at),
            }),
            open_reservations: open,
            operations,
        })
    }
}

/// Time from `now` to the start of `day` in `tz` (zero or negative once it has begun).
fn until_local_midnight(now: DateTime<Utc>, tz: chrono_tz::Tz, day: NaiveDate) -> TimeDelta {
    use chrono::TimeZone;
    let midnight = day.and_hms_opt(0, 0, 0).unwrap_or_default();
    // A zone that skips midnight (a DST jump) starts the day at the first valid instant.
    let start = tz
        .from_local_datetime(&midnight)
        .earliest()
        .or_else(|| {
            tz.from_local_datetime(&(midnight + TimeDelta::hours(1)))
                .earliest()
        })
        .map(|t| t.with_timezone(&Utc))
        .unwrap_or(now);
    start - now
}

/// Runs WAL rounds until `stop`.
pub async fn run_worker(
    ops: Arc<crate::ReservationService>,
    batch: u32,
    idle_poll: Duration,
    mut stop: watch::Receiver<bool>,
) -> Result<(), OpsError> {
    tracing::info!(batch, "operation WAL worker started");
    loop {
        let pause = match ops.ops().work_once(batch).await {
            Ok(r) if r.succeeded + r.failed + r.dead >= batch as usize => Duration::ZERO,
            Ok(_) => idle_poll,
            Err(e) => {
                tracing::warn!(error = %e, "WAL worker round failed; retrying");
                idle_poll * 5
            }
        };
        tokio::select! {
            _ = stop.wait_for(|s| *s) => break,
            _ = tokio::time::sleep(pause) => {}
        }
    }
    tracing::info!("operation WAL worker stopped");
    Ok(())
}

/// Configuration of the daily bucket job.
#[derive(Debug, Clone)]
pub struct DailyConfig {
    /// How often the job looks for buckets to prepare.
    pub interval: Duration,
    /// How long before the local midnight the next day's buckets are prepared.
    pub lead: TimeDelta,
    /// Dishes with no baseline in this many days are not carried forward any more.
    pub lookback_days: i64,
}

impl Default for DailyConfig {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(300),
            lead: TimeDelta::hours(2),
            lookback_days: 7,
        }
    }
}

/// Runs the daily job until `stop`.
pub async fn run_daily(
    service: Arc<crate::ReservationService>,
    config: DailyConfig,
    mut stop: watch::Receiver<bool>,
) -> Result<(), OpsError> {
    tracing::info!(
        interval_s = config.interval.as_secs(),
        lead_min = config.lead.num_minutes(),
        "daily bucket job started"
    );
    loop {
        if let Err(e) = service
            .ops()
            .prepare_days(Utc::now(), config.lead, config.lookback_days)
            .await
        {
            tracing::warn!(error = %e, "daily bucket round failed; retrying next round");
        }
        tokio::select! {
            _ = stop.wait_for(|s| *s) => break,
            _ = tokio::time::sleep(config.interval) => {}
        }
    }
    tracing::info!("daily bucket job stopped");
    Ok(())
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

    #[test]
    fn midnight_distance_follows_the_zone() {
        let tz: chrono_tz::Tz = "Asia/Shanghai".parse().unwrap();
        // 14:30 UTC is 22:30 in Shanghai: 90 minutes to the local midnight.
        let now = DateTime::parse_from_rfc3339("2026-07-26T14:30:00Z")
            .unwrap()
            .with_timezone(&Utc);
        let tomorrow = NaiveDate::from_ymd_opt(2026, 7, 27).unwrap();
        assert_eq!(
            until_local_midnight(now, tz, tomorrow),
            TimeDelta::minutes(90)
        );
        let utc_tomorrow = NaiveDate::from_ymd_opt(2026, 7, 27).unwrap();
        assert_eq!(
            until_local_midnight(now, chrono_tz::UTC, utc_tomorrow),
            TimeDelta::minutes(570)
        );
    }
}
