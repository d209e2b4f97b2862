//! The reconciler (seed §13, §15): compares every live bucket's Redis numbers with what MySQL
//! says two ways (the reservation table with the baseline's total, and the ledger's sums) and
//! with the projector's snapshot; reports a difference only when it persists across two
//! passes at an unchanged Redis version with nothing of the bucket in flight; repairs it with
//! a versioned WAL operation when asked to; and brings lost buckets back through the rebuild.
//!
//! Scheduled passes (a role in `stocksvr all`) split the buckets over shards by merchant and
//! dish; an instance checks a shard only while it holds the shard's lease, so several
//! instances share the work and no bucket is checked twice at once. Their memory of what was
//! seen is `inventory_reconcile_difference`. The on-demand check (`stocksvr reconcile`) makes
//! its two passes in memory, a few seconds apart, and writes nothing unless it repairs.

pub mod classify;

use crate::operations::{RepairPlan, WalView};
use crate::{OpsError, ReservationService, ServiceError};
use chrono::{TimeDelta, Utc};
use classify::{classify, BucketViews, DifferenceKind, InFlight, Verdict};
use serde::Serialize;
use std::collections::HashMap;
use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use stocksvr_core::bucket::BucketKey;
use stocksvr_pipeline::periodic::{self, Cadence, Round};
use stocksvr_store::lua::{StockNumbers, TargetNumbers};
use stocksvr_store::reconcile::{self as store, BucketFilter, LiveBucket};
use stocksvr_telemetry::names;
use tokio::sync::watch;

#[derive(Debug, Clone)]
pub struct ReconcileConfig {
    /// Shards the buckets are spread over (by merchant and dish).
    pub shards: u32,
    /// How long an instance holds a shard it checks.
    pub lease: TimeDelta,
    /// A shard is checked at most once per interval.
    pub interval: Duration,
    /// A bucket unchanged since its last clean check is checked in full (fences, op
    /// records, MySQL sums) only this often; zero: at every pass.
    pub full_check: Duration,
    /// Buckets read per round trip.
    pub chunk: u32,
    /// Held reservations whose fences and op records are read at once (bounds the memory
    /// a full check of a hot bucket takes).
    pub guard_page: u32,
    /// At most this many held reservations' fences and op records are read per second
    /// (0: no limit). Unpaced, the full check of a hot bucket read 30,000 a second and
    /// took Redis and the machine from the Trys and Confirms of that second; paced, it
    /// takes longer (held reservations / this rate) and the load stays level.
    pub guard_reads_per_sec: u32,
    /// Scheduled passes repair confirmed differences and rebuild lost buckets themselves;
    /// otherwise they detect and alert only.
    pub auto_repair: bool,
    /// Repairs and rebuilds one scheduled pass may start.
    pub max_repairs_per_pass: u32,
    /// The on-demand check's wait between its two passes; a scheduled pass that suspected
    /// a difference (or failed) makes its shard due again this long after it.
    pub settle: Duration,
    /// Attempts of one repair that keeps losing its version check.
    pub repair_attempts: u32,
    /// How long a rebuild waits for a clean pass before it reopens the bucket.
    pub reopen_timeout: Duration,
    /// Inbox rows older than this are purged (0: kept for ever).
    pub inbox_retention: TimeDelta,
}

impl Default for ReconcileConfig {
    fn default() -> Self {
        Self {
            shards: 16,
            lease: TimeDelta::seconds(120),
            interval: Duration::from_secs(60),
            full_check: Duration::from_secs(900),
            chunk: 200,
            guard_page: 5_000,
            guard_reads_per_sec: 10_000,
            auto_repair: false,
            max_repairs_per_pass: 10,
            settle: Duration::from_secs(2),
            repair_attempts: 5,
            reopen_timeout: Duration::from_secs(120),
            inbox_retention: TimeDelta::days(7),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("mysql: {0}")]
    Mysql(#[from] sqlx::Error),
    #[error("redis: {0}")]
    Redis(String),
    #[error(transparent)]
    Ops(#[from] OpsError),
    #[error(transparent)]
    Service(#[from] ServiceError),
    /// The process is stopping: a scheduled pass gave its shard back unfinished.
    #[error("stopped with the process before the pass ended")]
    Stopped,
}

/// One bucket as inspected: its baseline, its views and the verdict.
#[derive(Debug, Clone, Serialize)]
pub struct Inspection {
    pub bucket: LiveBucket,
    pub views: BucketViews,
    pub verdict: Verdict,
}

impl Inspection {
    fn kinds(&self) -> Vec<DifferenceKind> {
        match &self.verdict {
            Verdict::Differs(kinds) => kinds.clone(),
            _ => Vec::new(),
        }
    }

    fn version(&self) -> u64 {
        self.views.redis.map(|r| r.version).unwrap_or(0)
    }

    /// The versioned repair of this inspection (its numbers computed at its Redis version).
    pub fn plan(&self) -> Option<RepairPlan> {
        let redis = self.views.redis?;
        let l = self.views.ledger;
        Some(RepairPlan {
            stock_bucket_id: self.bucket.stock_bucket_id.clone(),
            expected_version: redis.version,
            target: self.views.expected,
            before: TargetNumbers {
                total: redis.total,
                available: redis.available,
                reserved: redis.reserved,
                sold: redis.sold,
                deficit: redis.deficit,
            },
            ledger_before: TargetNumbers {
                total: l.total,
                available: l.available,
                reserved: l.reserved,
                sold: l.sold,
                deficit: l.deficit,
            },
            kinds: self.kinds().iter().map(|k| k.name().to_string()).collect(),
            restore: self.views.records_missing.clone(),
            min_version: classify::version_floor(&self.views),
        })
    }
}

/// What a repair came to.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case", tag = "outcome")]
pub enum RepairOutcome {
    /// Written at the version it was computed for; the WAL row and its event.
    Repaired {
        operation_id: String,
    },
    /// Every attempt found the version moved (Trys kept running): nothing written.
    VersionChanged {
        attempts: u32,
    },
    /// No longer needed: the bucket agrees (or is in flight) when looked at again.
    NotNeeded {
        verdict: String,
    },
    Failed {
        reason: String,
    },
}

impl RepairOutcome {
    fn label(&self) -> &'static str {
        match self {
            RepairOutcome::Repaired { .. } => "repaired",
            RepairOutcome::VersionChanged { .. } => "version_changed",
            RepairOutcome::NotNeeded { .. } => "not_needed",
            RepairOutcome::Failed { .. } => "failed",
        }
    }
}

/// One bucket of an on-demand check.
#[derive(Debug, Clone, Serialize)]
pub struct Checked {
    pub inspection: Inspection,
    /// Differences seen on both passes at the same Redis version.
    pub confirmed: Vec<DifferenceKind>,
    pub repair: Option<RepairOutcome>,
}

/// What a scheduled pass over one shard did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PassReport {
    pub shard: u32,
    pub checked: u64,
    /// Checked buckets skipped as unchanged since their last clean check (also consistent).
    pub unchanged: u64,
    /// Checked buckets whose held reservations' fences and op records were read (a full
    /// check: due, never done by any instance, or numbers that differ).
    pub full: u64,
    pub consistent: u64,
    pub not_built: u64,
    pub held_back: u64,
    /// Held back by work in flight seen before their sums, which were not read.
    pub unsummed: u64,
    pub suspected: u64,
    pub confirmed: u64,
    pub lost: u64,
    pub repaired: u64,
    pub reopened: u64,
    /// Another shard was due when this one was leased.
    pub more_due: bool,
}

pub struct Reconciler {
    service: Arc<ReservationService>,
    config: ReconcileConfig,
    owner: String,
    /// The shard rows were written once by this instance (they are never deleted).
    shards_ensured: std::sync::atomic::AtomicBool,
    /// Buckets this instance last found consistent, and what they looked like then.
    clean: Mutex<HashMap<String, CleanMark>>,
    /// Held reservations a full check found not right and read again (see
    /// [`Self::suspects_read_again`]).
    read_again: std::sync::atomic::AtomicU64,
}

/// What a scheduled pass compares to decide that nothing touched a bucket since its last
/// clean check: every Lua step that moves a number bumps the Redis hash's version (and its
/// `updated_at_ms`), the projector moves the snapshot's version with every booking, and a
/// close or a baseline change moves the baseline row.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    redis: Option<StockNumbers>,
    snapshot_version: Option<u64>,
    baseline: (u64, i8, i64),
}

#[derive(Debug, Clone)]
struct CleanMark {
    seen: Seen,
    /// When the fences and op records of its held reservations were last read.
    full_at: Instant,
}

/// Buckets remembered as clean per instance (about 200 bytes each); beyond this, the rest
/// are checked at every pass as if never seen, which costs time, not correctness.
const MAX_CLEAN_MARKS: usize = 100_000;

impl Reconciler {
    pub fn new(service: Arc<ReservationService>, config: ReconcileConfig) -> Self {
        let owner = format!(
            "{}:{}",
            std::fs::read_to_string("/etc/hostname")
                .map(|h| h.trim().to_string())
                .unwrap_or_else(|_| "host".into()),
            std::process::id()
        );
        Self {
            service,
            config,
            owner,
            shards_ensured: std::sync::atomic::AtomicBool::new(false),
            clean: Mutex::new(HashMap::new()),
            read_again: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// How many held reservations this instance's full checks found not right at the first
    /// read and read again (row, then fence and op record) before calling them missing.
    pub fn suspects_read_again(&self) -> u64 {
        self.read_again.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn config(&self) -> &ReconcileConfig {
        &self.config
    }

    /// Reads every view of `buckets` (one chunk) and judges each.
    pub async fn inspect(
        &self,
        buckets: Vec<LiveBucket>,
    ) -> Result<Vec<Inspection>, ReconcileError> {
        let redis = self.read_redis(&buckets).await?;
        self.inspect_with(buckets, redis, &|_| true, false).await
    }

    /// The stock hashes of `buckets`, in their order (`None`: no key).
    async fn read_redis(
        &self,
        buckets: &[LiveBucket],
    ) -> Result<Vec<Option<StockNumbers>>, ReconcileError> {
        let keys: Vec<BucketKey> = buckets.iter().map(bucket_key).collect();
        self.service
            .lua()
            .read_buckets(&keys)
            .await
            .map_err(|e| ReconcileError::Redis(e.to_string()))
    }

    /// [`Self::inspect`] on the stock hashes `redis` already read (one per bucket), reading
    /// the fences and op records of held reservations only for the buckets `full` names
    /// (the numbers of every bucket are compared either way). With `skip_busy`, a bucket
    /// whose work in flight shows first is not summed ([`store::mysql_views_of`]): its
    /// verdict is "held back" all the same. A bucket without a stock hash is always summed,
    /// as its verdict does not rest on work in flight.
    async fn inspect_with(
        &self,
        buckets: Vec<LiveBucket>,
        redis: Vec<Option<StockNumbers>>,
        full: &(dyn Fn(&str) -> bool + Sync),
        skip_busy: bool,
    ) -> Result<Vec<Inspection>, ReconcileError> {
        let pool = self.service.pool();
        let ids: Vec<String> = buckets.iter().map(|b| b.stock_bucket_id.clone()).collect();
        let hashed: HashSet<&str> = ids
            .iter()
            .zip(&redis)
            .filter(|(_, numbers)| numbers.is_some())
            .map(|(id, _)| id.as_str())
            .collect();
        // Redis first (the caller read it), then MySQL: a step that completes in between
        // shows in MySQL as done and in Redis as not yet, which the two-pass rule (same
        // version twice) absorbs; the other order could pair a newer Redis with an older
        // MySQL just the same.
        let keys: Vec<BucketKey> = buckets.iter().map(bucket_key).collect();
        let mysql =
            store::mysql_views_of(pool, &ids, &|id| skip_busy && hashed.contains(id)).await?;
        // Redis was read before MySQL, so a bucket built in between looks lost (no key, an
        // init that succeeded): read those keys again before anyone calls them lost.
        let mut redis = redis;
        let suspects: Vec<usize> = (0..buckets.len())
            .filter(|&i| {
                redis[i].is_none()
                    && mysql
                        .built
                        .get(&buckets[i].stock_bucket_id)
                        .copied()
                        .unwrap_or(false)
            })
            .collect();
        let mut just_built = std::collections::HashSet::new();
        if !suspects.is_empty() {
            let again = self
                .service
                .lua()
                .read_buckets(&suspects.iter().map(|&i| keys[i]).collect::<Vec<_>>())
                .await
                .map_err(|e| ReconcileError::Redis(e.to_string()))?;
            for (&i, now) in suspects.iter().zip(again) {
                if now.is_some() {
                    just_built.insert(buckets[i].stock_bucket_id.clone());
                    redis[i] = now;
                }
            }
        }
        // A bucket without a stock hash has no fences to compare (its records are not
        // looked at; it is lost or not built): reading them would find every one missing,
        // and read each again.
        let guarded: Vec<String> = ids
            .iter()
            .zip(&redis)
            .filter(|(id, numbers)| numbers.is_some() && full(id))
            .map(|(id, _)| id.clone())
            .collect();
        let missing = self.missing_records(&buckets, &guarded).await?;
        let mut out = Vec::with_capacity(buckets.len());
        for (bucket, redis) in buckets.into_iter().zip(redis) {
            let id = bucket.stock_bucket_id.as_str();
            let r = mysql.reservations.get(id).copied().unwrap_or_default();
            let mut in_flight = Vec::new();
            if just_built.contains(id) {
                in_flight.push(InFlight::StockOperations(1));
            }
            let counts = mysql.in_flight(id);
            for (n, what) in [
                (
                    counts.reservations,
                    InFlight::Reservations as fn(i64) -> InFlight,
                ),
                (counts.stock_operations, InFlight::StockOperations),
                (counts.dead_operations, InFlight::DeadOperations),
                (counts.outbox, InFlight::Outbox),
                (counts.projection, InFlight::Projection),
            ] {
                if n > 0 {
                    in_flight.push(what(n));
                }
            }
            let views = BucketViews {
                bucket: id.to_string(),
                redis: redis.as_ref().map(Into::into),
                expected: TargetNumbers::from_accepted(bucket.total_stock, r.reserved, r.sold),
                ledger: mysql.ledger.get(id).copied().unwrap_or_default().into(),
                snapshot: mysql.snapshots.get(id).copied(),
                in_flight,
                built: mysql.built.get(id).copied().unwrap_or(false),
                marked_lost: bucket.lost_at.is_some(),
                records_missing: if redis.is_some() {
                    missing.get(id).cloned().unwrap_or_default()
                } else {
                    Vec::new()
                },
                sums_skipped: mysql.unsummed.contains(id),
            };
            let verdict = classify(&views);
            out.push(Inspection {
                bucket,
                views,
                verdict,
            });
        }
        Ok(out)
    }

    /// By bucket, the reservations holding units whose fence is missing or says otherwise,
    /// or whose Try op record is gone while it should still live (op records expire after
    /// the op TTL; a RESERVED fence never does).
    async fn missing_records(
        &self,
        buckets: &[LiveBucket],
        ids: &[String],
    ) -> Result<HashMap<String, Vec<u64>>, ReconcileError> {
        let pool = self.service.pool();
        let mut missing: HashMap<String, Vec<u64>> = HashMap::new();
        // Usually one read covers the chunk. A chunk holding more (a hot dish holds a
        // reservation per order of the day) is read page by page, bucket by bucket, so
        // memory stays at one page of rows and Redis replies however big the bucket.
        let limit = self.config.guard_page.max(1);
        let rows = store::guarded_rows(pool, ids, None, limit + 1).await?;
        if rows.len() <= limit as usize {
            self.check_guards(buckets, &rows, &mut missing).await?;
        } else {
            drop(rows);
            for id in ids {
                let mut after = 0;
                loop {
                    let page = store::guarded_rows(pool, ids, Some((id, after)), limit).await?;
                    self.check_guards(buckets, &page, &mut missing).await?;
                    match page.last() {
                        Some(last) if page.len() == limit as usize => after = last.id,
                        _ => break,
                    }
                }
            }
        }
        self.read_suspects_again(buckets, missing).await
    }

    /// Of the reservations `missing` names, those whose fence or op record is still not
    /// right when read again, row first, as the first read did. A Confirm, Cancel or Refund
    /// moves Redis first and MySQL a moment later, and a paced full check reads a page of
    /// rows at once and their fences over the next half second (5,000 at 10,000 a second):
    /// a row read before such a step met a fence read after it, a suspected difference
    /// that also made the next pass read the whole bucket again.
    async fn read_suspects_again(
        &self,
        buckets: &[LiveBucket],
        missing: HashMap<String, Vec<u64>>,
    ) -> Result<HashMap<String, Vec<u64>>, ReconcileError> {
        let mut still = HashMap::new();
        let page = self.config.guard_page.max(1) as usize;
        let suspects: usize = missing.values().map(Vec::len).sum();
        self.read_again
            .fetch_add(suspects as u64, std::sync::atomic::Ordering::Relaxed);
        for (bucket, ids) in missing {
            for ids in ids.chunks(page) {
                let rows = store::guarded_rows_by_id(self.service.pool(), &bucket, ids).await?;
                self.check_guards(buckets, &rows, &mut still).await?;
            }
        }
        Ok(still)
    }

    /// Adds to `missing` the reservations of `rows` whose fence or op record is not right.
    async fn check_guards(
        &self,
        buckets: &[LiveBucket],
        rows: &[store::GuardedRow],
        missing: &mut HashMap<String, Vec<u64>>,
    ) -> Result<(), ReconcileError> {
        use stocksvr_core::model::FencePhase;
        use stocksvr_core::reservation::{try_operation_id, ReservationStatus};
        if rows.is_empty() {
            return Ok(());
        }
        let keys: HashMap<&str, BucketKey> = buckets
            .iter()
            .map(|b| (b.stock_bucket_id.as_str(), bucket_key(b)))
            .collect();
        let guards: Vec<(BucketKey, u64, String)> = rows
            .iter()
            .filter_map(|r| {
                keys.get(r.stock_bucket_id.as_str())
                    .map(|k| (*k, r.id, try_operation_id(r.id)))
            })
            .collect();
        let mut found = Vec::with_capacity(guards.len());
        for slice in guards.chunks(GUARD_SLICE) {
            let started = Instant::now();
            found.extend(
                self.service
                    .lua()
                    .read_guards(slice)
                    .await
                    .map_err(|e| ReconcileError::Redis(e.to_string()))?,
            );
            metrics::counter!(names::RECONCILE_GUARDS_READ).increment(slice.len() as u64);
            let rest = guard_pace(slice.len(), self.config.guard_reads_per_sec)
                .saturating_sub(started.elapsed());
            if !rest.is_zero() {
                tokio::time::sleep(rest).await;
            }
        }
        let op_ttl = TimeDelta::from_std(self.service.config().op_ttl).unwrap_or(TimeDelta::MAX);
        let op_window_start = Utc::now().naive_utc() - op_ttl;
        for (r, (fence, op_exists)) in rows.iter().zip(found) {
            let phase = if r.status == ReservationStatus::Confirmed.code() as i8 {
                FencePhase::Confirmed
            } else {
                FencePhase::Reserved
            };
            let fence_right = fence.is_some_and(|f| {
                f.phase == phase && f.quantity == r.quantity && f.refunded == r.refunded_quantity
            });
            let op_due = r.created_at > op_window_start;
            if !fence_right || (op_due && !op_exists) {
                missing
                    .entry(r.stock_bucket_id.clone())
                    .or_default()
                    .push(r.id);
            }
        }
        Ok(())
    }

    /// Every live bucket matching `filter`, inspected chunk by chunk; `progress` hears the
    /// running count.
    pub async fn inspect_all(
        &self,
        filter: &BucketFilter,
        progress: &(dyn Fn(usize) + Sync),
    ) -> Result<Vec<Inspection>, ReconcileError> {
        let mut out = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let chunk = store::live_buckets(
                self.service.pool(),
                filter,
                after.as_deref(),
                self.config.chunk,
            )
            .await?;
            let Some(last) = chunk.last() else { break };
            after = Some(last.stock_bucket_id.clone());
            let full = chunk.len() as u32 == self.config.chunk;
            out.extend(self.inspect(chunk).await?);
            progress(out.len());
            if !full {
                break;
            }
        }
        Ok(out)
    }

    /// The on-demand check: two passes `settle` apart; a difference counts only when the
    /// second pass sees it again at the same Redis version. With `repair`, each confirmed
    /// difference is repaired (recomputed while the version keeps moving).
    pub async fn check(
        &self,
        filter: &BucketFilter,
        repair: bool,
        progress: &(dyn Fn(usize) + Sync),
    ) -> Result<Vec<Checked>, ReconcileError> {
        let first_pass = Instant::now();
        let first = self.inspect_all(filter, progress).await?;
        let suspects: Vec<LiveBucket> = first
            .iter()
            .filter(|i| matches!(i.verdict, Verdict::Differs(_)))
            .map(|i| i.bucket.clone())
            .collect();
        let mut second: HashMap<String, Inspection> = HashMap::new();
        if !suspects.is_empty() {
            tokio::time::sleep(self.config.settle).await;
            for chunk in suspects.chunks(self.config.chunk.max(1) as usize) {
                for i in self.inspect(chunk.to_vec()).await? {
                    second.insert(i.bucket.stock_bucket_id.clone(), i);
                }
            }
        }
        let mut out = Vec::with_capacity(first.len());
        for i in first {
            let again = second.remove(&i.bucket.stock_bucket_id);
            let confirmed = match &again {
                Some(a) if a.version() == i.version() => {
                    let before = i.kinds();
                    a.kinds()
                        .into_iter()
                        .filter(|k| before.contains(k))
                        .collect()
                }
                _ => Vec::new(),
            };
            let inspection = again.unwrap_or(i);
            let repair = if repair && !confirmed.is_empty() {
                Some(self.repair(&inspection, first_pass.elapsed()).await)
            } else {
                None
            };
            for kind in &confirmed {
                log_difference(&inspection, *kind);
            }
            out.push(Checked {
                inspection,
                confirmed,
                repair,
            });
        }
        Ok(out)
    }

    /// Repairs a bucket from `inspection`; when the version moved meanwhile it looks again
    /// (up to `repair_attempts`) and repairs what it finds then, if anything. `seen_for` is
    /// how long ago the difference was first seen: the repair-duration histogram measures
    /// from there to the repair.
    pub async fn repair(&self, inspection: &Inspection, seen_for: Duration) -> RepairOutcome {
        let started = Instant::now();
        let mut current = inspection.clone();
        let mut attempts = 0;
        let outcome = loop {
            let Some(plan) = current.plan().filter(|_| !current.kinds().is_empty()) else {
                break RepairOutcome::NotNeeded {
                    verdict: verdict_name(&current.verdict).to_string(),
                };
            };
            attempts += 1;
            match self.service.ops().repair(&plan).await {
                Ok(view) => match effect(&view).as_deref() {
                    Some("REPAIRED") => {
                        break RepairOutcome::Repaired {
                            operation_id: view.operation_id,
                        }
                    }
                    Some("VERSION_CHANGED") if attempts < self.config.repair_attempts => {
                        tracing::info!(bucket = %plan.stock_bucket_id, version = plan.expected_version, "repair lost its version check; computing again");
                    }
                    Some("VERSION_CHANGED") => break RepairOutcome::VersionChanged { attempts },
                    other => {
                        break RepairOutcome::Failed {
                            reason: format!(
                                "repair {} ended {} ({:?}): {}",
                                view.operation_id,
                                view.status,
                                other,
                                view.last_error.unwrap_or_default()
                            ),
                        }
                    }
                },
                Err(e) => {
                    break RepairOutcome::Failed {
                        reason: e.to_string(),
                    }
                }
            }
            let again = match self.inspect(vec![current.bucket.clone()]).await {
                Ok(mut v) if !v.is_empty() => v.remove(0),
                Ok(_) => {
                    break RepairOutcome::Failed {
                        reason: "the bucket disappeared".into(),
                    }
                }
                Err(e) => {
                    break RepairOutcome::Failed {
                        reason: e.to_string(),
                    }
                }
            };
            current = again;
        };
        metrics::counter!(names::RECONCILE_REPAIRS, "outcome" => outcome.label()).increment(1);
        if matches!(outcome, RepairOutcome::Repaired { .. }) {
            metrics::histogram!(names::RECONCILE_REPAIR_SECONDS)
                .record((seen_for + started.elapsed()).as_secs_f64());
        }
        tracing::warn!(bucket = %inspection.bucket.stock_bucket_id, outcome = ?outcome, "reconcile repair");
        outcome
    }

    /// Rebuilds a lost bucket without waiting to reopen it.
    pub async fn rebuild_only(&self, bucket: &str) -> Result<WalView, ReconcileError> {
        Ok(self.service.ops().rebuild(bucket).await?)
    }

    /// Rebuilds a lost bucket, waits until a pass finds it clean, then reopens it for Trys.
    /// Returns the rebuild's WAL row and whether the bucket was reopened.
    pub async fn rebuild(&self, bucket: &str) -> Result<(WalView, bool), ReconcileError> {
        let view = self.service.ops().rebuild(bucket).await?;
        if !view.succeeded() {
            return Ok((view, false));
        }
        let reopened = self.reopen(bucket, self.config.reopen_timeout).await?;
        Ok((view, reopened))
    }

    /// Reopens many rebuilt buckets together: passes over the ones still marked lost, a
    /// chunk at a time, clearing each that is consistent, until all are or `within` runs
    /// out. Returns the buckets reopened (a rebuild of thousands of buckets then waits for
    /// their events once, not once per bucket).
    pub async fn reopen_many(
        &self,
        buckets: &[String],
        within: Duration,
        progress: &(dyn Fn(usize) + Sync),
    ) -> Result<Vec<String>, ReconcileError> {
        let pool = self.service.pool();
        let deadline = Instant::now() + within;
        let mut waiting: Vec<String> = buckets.to_vec();
        let mut reopened = Vec::new();
        while !waiting.is_empty() {
            let mut still = Vec::new();
            for chunk in waiting.chunks(self.config.chunk.max(1) as usize) {
                let live = store::live_buckets_by_id(pool, chunk).await?;
                for i in self.inspect(live).await? {
                    let id = i.bucket.stock_bucket_id.clone();
                    if i.bucket.lost_at.is_none() {
                        reopened.push(id);
                    } else if i.verdict == Verdict::Consistent {
                        stocksvr_store::baselines::clear_lost(pool, &id).await?;
                        self.service.baseline_changed(&id);
                        reopened.push(id);
                    } else {
                        still.push(id);
                    }
                }
            }
            progress(reopened.len());
            waiting = still;
            if waiting.is_empty() || Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        Ok(reopened)
    }

    /// Clears a rebuilt bucket's lost mark once a pass finds it consistent (the rebuild's
    /// event booked, its reservations' steps settled); false when `within` ran out first.
    pub async fn reopen(&self, bucket: &str, within: Duration) -> Result<bool, ReconcileError> {
        let deadline = Instant::now() + within;
        let filter = BucketFilter {
            bucket: Some(bucket.to_string()),
            ..BucketFilter::default()
        };
        loop {
            let live = store::live_buckets(self.service.pool(), &filter, None, 1).await?;
            let Some(b) = live.into_iter().next() else {
                return Ok(false);
            };
            if b.lost_at.is_none() {
                return Ok(true);
            }
            let inspected = self.inspect(vec![b]).await?;
            if inspected.first().map(|i| &i.verdict) == Some(&Verdict::Consistent) {
                let cleared =
                    stocksvr_store::baselines::clear_lost(self.service.pool(), bucket).await?;
                self.service.baseline_changed(bucket);
                if cleared {
                    tracing::warn!(
                        bucket,
                        "rebuilt bucket found consistent: Trys are taken again"
                    );
                }
                return Ok(true);
            }
            if Instant::now() >= deadline {
                tracing::warn!(bucket, verdict = ?inspected.first().map(|i| &i.verdict), "rebuilt bucket not consistent yet; it stays refused (the scheduled reconciler reopens it once it is)");
                return Ok(false);
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// A scheduled pass's view of one chunk: the inspections of the buckets that moved since
    /// their last clean check (or are due a full one), and how many did not move.
    ///
    /// A bucket nothing touched is skipped: reading its held reservations' fences and op
    /// records would cost one Redis read per reservation at every pass, however idle the
    /// service (it was most of the idle CPU). A bucket that moved has its numbers compared;
    /// its fences and op records are read at most every `full_check`, or at once when its
    /// numbers differ, so a repair always knows which records to restore. The time of the last
    /// clean full check is kept in MySQL too (`full_checked_at`), so a restarted instance,
    /// or one that takes over a shard, does not read every held reservation again at once.
    /// Returns the inspections, the buckets skipped as unchanged and the full checks made.
    async fn inspect_changed(
        &self,
        chunk: Vec<LiveBucket>,
    ) -> Result<(Vec<Inspection>, u64, u64), ReconcileError> {
        let every = self.config.full_check;
        if every.is_zero() {
            let n = chunk.len() as u64;
            return Ok((self.inspect(chunk).await?, 0, n));
        }
        // Read once: the hashes of the buckets that moved are the ones they are inspected on.
        let redis = self.read_redis(&chunk).await?;
        let ids: Vec<String> = chunk.iter().map(|b| b.stock_bucket_id.clone()).collect();
        let snapshots = store::snapshot_versions(self.service.pool(), &ids).await?;
        let now = Instant::now();
        let wall_now = stocksvr_store::clock::now();
        let mut todo = Vec::new();
        let mut todo_redis = Vec::new();
        let mut seen = HashMap::new();
        let mut full = HashSet::new();
        // The last full check of a bucket not checked in full now, by whichever instance.
        let mut full_before = HashMap::new();
        let mut unchanged = 0;
        {
            let clean = self.clean.lock().unwrap_or_else(PoisonError::into_inner);
            for (bucket, numbers) in chunk.into_iter().zip(redis) {
                let id = bucket.stock_bucket_id.clone();
                let now_seen = Seen {
                    redis: numbers.clone(),
                    snapshot_version: snapshots.get(&id).copied(),
                    baseline: (
                        bucket.baseline_version,
                        bucket.bucket_status,
                        bucket.total_stock,
                    ),
                };
                let mark = clean.get(&id);
                // A clock behind the writer's reads a mark from the future as just made.
                let persisted = bucket
                    .full_checked_at
                    .and_then(|at| (wall_now - at).max(TimeDelta::zero()).to_std().ok())
                    .and_then(|age| now.checked_sub(age));
                match mark.map(|m| m.full_at).max(persisted) {
                    Some(full_at) if now.duration_since(full_at) < every => {
                        if mark.is_some_and(|m| m.seen == now_seen) && bucket.lost_at.is_none() {
                            unchanged += 1;
                            continue;
                        }
                        full_before.insert(id.clone(), full_at);
                    }
                    _ => {
                        full.insert(id.clone());
                    }
                }
                seen.insert(id, now_seen);
                todo.push(bucket);
                todo_redis.push(numbers);
            }
        }
        let mut inspections = self
            .inspect_with(todo, todo_redis, &|id| full.contains(id), true)
            .await?;
        let again: Vec<LiveBucket> = inspections
            .iter()
            .filter(|i| {
                !full.contains(&i.bucket.stock_bucket_id)
                    && matches!(i.verdict, Verdict::Differs(_) | Verdict::Lost)
            })
            .map(|i| i.bucket.clone())
            .collect();
        if !again.is_empty() {
            for redone in self.inspect(again).await? {
                full.insert(redone.bucket.stock_bucket_id.clone());
                if let Some(slot) = inspections
                    .iter_mut()
                    .find(|i| i.bucket.stock_bucket_id == redone.bucket.stock_bucket_id)
                {
                    *slot = redone;
                }
            }
        }
        let mut clean_in_full = Vec::new();
        {
            // The guard must be gone before the await below (the future is sent between threads).
            let mut clean = self.clean.lock().unwrap_or_else(PoisonError::into_inner);
            for i in &inspections {
                let id = &i.bucket.stock_bucket_id;
                // A full check held back by work in flight read every fence and op record
                // all the same, and found them right: it counts as the bucket's full check
                // (its numbers are compared again at the next pass). Before, it did not,
                // and a bucket always taking Trys was read in full at every pass.
                if full.contains(id)
                    && matches!(i.verdict, Verdict::HeldBack(_))
                    && i.views.redis.is_some()
                    && i.views.records_missing.is_empty()
                    && i.bucket.lost_at.is_none()
                {
                    clean_in_full.push(id.clone());
                }
                let mark = match (&i.verdict, seen.remove(id)) {
                    (Verdict::Consistent, Some(seen)) if i.bucket.lost_at.is_none() => {
                        let full_at = if full.contains(id) {
                            clean_in_full.push(id.clone());
                            now
                        } else {
                            full_before.get(id).copied().unwrap_or(now)
                        };
                        Some(CleanMark { seen, full_at })
                    }
                    _ => None,
                };
                match mark {
                    Some(mark) if clean.contains_key(id) || clean.len() < MAX_CLEAN_MARKS => {
                        clean.insert(id.clone(), mark);
                    }
                    Some(_) => {}
                    None => {
                        clean.remove(id);
                    }
                }
            }
        }
        store::mark_full_checked(self.service.pool(), &clean_in_full, wall_now).await?;
        Ok((inspections, unchanged, full.len() as u64))
    }

    /// One scheduled pass: leases a shard due for checking and compares its buckets,
    /// remembering sightings in MySQL. `None` when no shard is due.
    pub async fn pass_once(&self) -> Result<Option<PassReport>, ReconcileError> {
        self.pass_until(None).await
    }

    /// [`Self::pass_once`], given up when `stop` turns true: the shard is handed back due
    /// again after `settle`, as after a failed pass ([`ReconcileError::Stopped`]). A paced
    /// pass over a hot dish's day takes tens of seconds: on SIGTERM the bench's `stocksvr all`
    /// waited for it to the end of its 15 s drain, warned "drain did not finish" and exited
    /// with its shard leased to the dead process for the lease's 120 s. Giving up at
    /// an await point is safe: a pass reads, and each write it makes (a sighting, a repair's
    /// WAL operation) is one that a crash at the same point leaves for the next pass or the
    /// recovery worker to finish.
    pub async fn pass_until(
        &self,
        stop: Option<watch::Receiver<bool>>,
    ) -> Result<Option<PassReport>, ReconcileError> {
        let pool = self.service.pool();
        let interval = TimeDelta::from_std(self.config.interval).unwrap_or(TimeDelta::seconds(60));
        // The shard rows are written once per process, not before every claim: the claims
        // of an idle `stocksvr all` come every few seconds.
        if !self
            .shards_ensured
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            store::ensure_shards(pool, self.config.shards).await?;
            self.shards_ensured
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
        let Some(claim) = store::claim_shard(
            pool,
            &self.owner,
            self.config.shards,
            self.config.lease,
            interval,
        )
        .await?
        else {
            return Ok(None);
        };
        let shard = claim.shard;
        let result = match stop {
            None => self.pass_leased(shard).await,
            Some(mut stop) => {
                let stopped = async move {
                    // A dropped sender is no stop: the pass runs to its end.
                    if stop.wait_for(|stop| *stop).await.is_err() {
                        std::future::pending::<()>().await;
                    }
                };
                tokio::select! {
                    report = self.pass_leased(shard) => report,
                    () = stopped => Err(ReconcileError::Stopped),
                }
            }
        };
        // A suspicion is looked at again after `settle`, as the on-demand check's second
        // pass is, not a whole interval later: one born of lag (the projector behind) is
        // cleared once the lag is gone, and a real one is confirmed and reported in seconds.
        // A pass that failed checked nothing it could vouch for: the same.
        let recheck = match &result {
            Ok(report) if report.suspected == 0 => None,
            _ => Some(TimeDelta::from_std(self.config.settle).unwrap_or(TimeDelta::seconds(2))),
        };
        store::finish_shard(pool, shard, &self.owner, recheck).await?;
        let mut report = result?;
        report.more_due = claim.more;
        self.export_gauges(&report).await?;
        Ok(Some(report))
    }

    /// [`Self::pass_shard`] while its lease is renewed every third of the lease: a pass that
    /// outlasts the lease (a paced full check of a bucket with many held reservations) keeps
    /// its shard, so no other instance checks the same buckets at the same time.
    async fn pass_leased(&self, shard: u32) -> Result<PassReport, ReconcileError> {
        let pool = self.service.pool();
        let every = (self.config.lease / 3)
            .to_std()
            .unwrap_or(Duration::from_secs(40))
            .max(Duration::from_millis(100));
        let pass = self.pass_shard(shard);
        tokio::pin!(pass);
        loop {
            tokio::select! {
                report = &mut pass => return report,
                () = tokio::time::sleep(every) => {
                    match store::renew_shard(pool, shard, &self.owner, self.config.lease).await {
                        Ok(true) => {}
                        // The pass goes on: what it reads and suspects is versioned, and the
                        // other instance's pass is the same check.
                        Ok(false) => tracing::warn!(
                            shard,
                            "reconcile: this pass lost its shard's lease (it ran out while the process stalled); another instance is checking the shard too"
                        ),
                        Err(e) => tracing::warn!(
                            shard,
                            error = %e,
                            "reconcile: renewing the shard's lease failed; trying again in a third of the lease"
                        ),
                    }
                }
            }
        }
    }

    async fn pass_shard(&self, shard: u32) -> Result<PassReport, ReconcileError> {
        let pool = self.service.pool();
        let filter = BucketFilter {
            shard: Some((shard, self.config.shards)),
            ..BucketFilter::default()
        };
        let mut report = PassReport {
            shard,
            ..PassReport::default()
        };
        let mut budget = self.config.max_repairs_per_pass;
        let mut held = HashMap::<&'static str, i64>::new();
        let mut after: Option<String> = None;
        loop {
            let chunk =
                store::live_buckets(pool, &filter, after.as_deref(), self.config.chunk).await?;
            let Some(last) = chunk.last() else { break };
            after = Some(last.stock_bucket_id.clone());
            let full = chunk.len() as u32 == self.config.chunk;
            let ids: Vec<String> = chunk.iter().map(|b| b.stock_bucket_id.clone()).collect();
            let (inspections, unchanged, full_checks) = self.inspect_changed(chunk).await?;
            report.full += full_checks;
            report.checked += unchanged;
            report.consistent += unchanged;
            report.unchanged += unchanged;
            let open = store::open_differences(pool, &ids).await?;
            for i in inspections {
                report.checked += 1;
                let id = i.bucket.stock_bucket_id.clone();
                let mine: Vec<&store::OpenDifference> =
                    open.iter().filter(|d| d.stock_bucket_id == id).collect();
                match &i.verdict {
                    Verdict::Consistent | Verdict::NotBuilt => {
                        if i.verdict == Verdict::Consistent {
                            report.consistent += 1;
                        } else {
                            report.not_built += 1;
                        }
                        for d in mine {
                            store::resolve(pool, d.id).await?;
                        }
                        if i.bucket.lost_at.is_some()
                            && i.verdict == Verdict::Consistent
                            && stocksvr_store::baselines::clear_lost(pool, &id).await?
                        {
                            self.service.baseline_changed(&id);
                            report.reopened += 1;
                            tracing::warn!(bucket = %id, "rebuilt bucket found consistent: Trys are taken again");
                        }
                    }
                    Verdict::HeldBack(reasons) => {
                        report.held_back += 1;
                        report.unsummed += u64::from(i.views.sums_skipped);
                        if !mine.is_empty() {
                            *held.entry("in_flight").or_default() += 1;
                        }
                        tracing::debug!(bucket = %id, reasons = ?reasons, "held back: work in flight");
                    }
                    Verdict::Lost => {
                        report.lost += 1;
                        if i.bucket.lost_at.is_none() {
                            self.service.note_lost(&id).await?;
                        }
                        if self.config.auto_repair && budget > 0 {
                            budget -= 1;
                            match self.rebuild(&id).await {
                                Ok((view, reopened)) => {
                                    tracing::warn!(bucket = %id, operation_id = %view.operation_id, status = view.status, reopened, "lost bucket rebuilt by the reconciler");
                                    report.reopened += u64::from(reopened);
                                }
                                Err(e) => {
                                    tracing::error!(bucket = %id, error = %e, "rebuild of a lost bucket failed")
                                }
                            }
                        }
                    }
                    Verdict::Differs(kinds) => {
                        let version = i.version();
                        let views = serde_json::to_value(&i.views).unwrap_or_default();
                        for d in &mine {
                            let still = DifferenceKind::from_name(&d.kind)
                                .is_some_and(|k| kinds.contains(&k));
                            if !still {
                                store::resolve(pool, d.id).await?;
                            }
                        }
                        let mut newly_confirmed = Vec::new();
                        for kind in kinds {
                            match mine.iter().find(|d| d.kind == kind.name()) {
                                None => {
                                    store::suspect(pool, &id, kind.name(), version, &views).await?;
                                    report.suspected += 1;
                                    *held.entry("first_sighting").or_default() += 1;
                                }
                                Some(d) if d.redis_version != version => {
                                    store::resuspect(pool, d.id, version, &views).await?;
                                    report.suspected += 1;
                                    *held.entry("version_moved").or_default() += 1;
                                }
                                Some(d) if d.status == store::DifferenceStatus::Suspected as i8 => {
                                    if store::confirm(pool, d.id, &views).await? {
                                        newly_confirmed.push((*kind, d.id));
                                    }
                                }
                                // Confirmed before: still reported; repaired below if due.
                                Some(d) => {
                                    if d.repair_operation_id.is_none() {
                                        newly_confirmed.push((*kind, d.id));
                                    }
                                }
                            }
                        }
                        for (kind, _) in &newly_confirmed {
                            log_difference(&i, *kind);
                        }
                        report.confirmed += newly_confirmed.len() as u64;
                        if self.config.auto_repair && budget > 0 && !newly_confirmed.is_empty() {
                            budget -= 1;
                            let first_seen = mine
                                .iter()
                                .map(|d| d.first_seen_at)
                                .min()
                                .unwrap_or_else(|| Utc::now().naive_utc());
                            let seen_for = (Utc::now().naive_utc() - first_seen)
                                .to_std()
                                .unwrap_or_default();
                            let outcome = self.repair(&i, seen_for).await;
                            if let RepairOutcome::Repaired { operation_id } = &outcome {
                                report.repaired += 1;
                                for (_, diff) in &newly_confirmed {
                                    store::set_repair(pool, *diff, operation_id).await?;
                                }
                            }
                        }
                    }
                }
            }
            if !full {
                break;
            }
        }
        for reason in ["in_flight", "version_moved", "first_sighting"] {
            metrics::gauge!(names::RECONCILE_HELD_BACK, "reason" => reason)
                .set(held.get(reason).copied().unwrap_or(0) as f64);
        }
        metrics::counter!(names::RECONCILE_BUCKETS_CHECKED).increment(report.checked);
        let judged = report.checked - report.not_built;
        let ratio = if judged == 0 {
            1.0
        } else {
            report.consistent as f64 / judged as f64
        };
        metrics::gauge!(names::RECONCILE_CONSISTENT_RATIO).set(ratio);
        Ok(report)
    }

    /// The gauges that summarise all shards: read back from MySQL so every instance exports
    /// the same figures (a dashboard takes their max).
    async fn export_gauges(&self, _report: &PassReport) -> Result<(), ReconcileError> {
        let pool = self.service.pool();
        let (by_kind, oldest) = store::confirmed_summary(pool).await?;
        for kind in DifferenceKind::ALL {
            let n = by_kind
                .iter()
                .find(|(k, _)| k == kind.name())
                .map(|(_, n)| *n)
                .unwrap_or(0);
            metrics::gauge!(names::RECONCILE_DIFFERENCES, "kind" => kind.name()).set(n as f64);
        }
        let age = oldest
            .map(|t| (Utc::now().naive_utc() - t).num_milliseconds() as f64 / 1000.0)
            .unwrap_or(0.0);
        metrics::gauge!(names::RECONCILE_OLDEST_DIFFERENCE_SECONDS).set(age.max(0.0));
        metrics::gauge!(names::BUCKETS_LOST)
            .set(stocksvr_store::baselines::count_lost(pool).await? as f64);
        metrics::gauge!(names::RECONCILE_LAST_PASS_TIMESTAMP_SECONDS)
            .set(Utc::now().timestamp_millis() as f64 / 1000.0);
        Ok(())
    }

    /// Inbox rows past the retention (seed 002 keeps 7 days): one batch; returns how many.
    pub async fn purge_inbox_once(&self, batch: u32) -> Result<u64, ReconcileError> {
        if self.config.inbox_retention <= TimeDelta::zero() {
            return Ok(0);
        }
        let before = Utc::now().naive_utc() - self.config.inbox_retention;
        Ok(store::purge_inbox(self.service.pool(), before, batch).await?)
    }
}

fn effect(view: &WalView) -> Option<String> {
    view.result
        .as_ref()
        .and_then(|r| r.get("effect"))
        .and_then(|e| e.as_str())
        .map(str::to_string)
}

pub fn verdict_name(v: &Verdict) -> &'static str {
    match v {
        Verdict::Consistent => "consistent",
        Verdict::NotBuilt => "not_built",
        Verdict::Lost => "lost",
        Verdict::HeldBack(_) => "held_back",
        Verdict::Differs(_) => "differs",
    }
}

/// One line per difference with all three views.
fn log_difference(i: &Inspection, kind: DifferenceKind) {
    let v = &i.views;
    let redis = v
        .redis
        .map(|r| {
            format!(
                "total={} available={} reserved={} sold={} deficit={} v{}",
                r.total, r.available, r.reserved, r.sold, r.deficit, r.version
            )
        })
        .unwrap_or_else(|| "missing".into());
    let e = v.expected;
    let l = v.ledger;
    tracing::error!(
        bucket = %i.bucket.stock_bucket_id,
        kind = kind.name(),
        redis = %redis,
        reservations = %format!("total={} available={} reserved={} sold={} deficit={}", e.total, e.available, e.reserved, e.sold, e.deficit),
        ledger = %format!("total={} available={} reserved={} sold={} deficit={} rows={}", l.total, l.available, l.reserved, l.sold, l.deficit, l.rows),
        snapshot = %v.snapshot.map(|s| format!("total={} available={} reserved={} sold={} deficit={} v{}", s.total, s.available, s.reserved, s.sold, s.deficit, s.redis_version)).unwrap_or_else(|| "missing".into()),
        "reconcile difference"
    );
}

/// The Redis keys of a live bucket.
/// Held reservations whose guards go to Redis in one pipelined read; the pacing sleeps
/// between such slices, so even a page of 5,000 is spread over its share of a second
/// instead of arriving as one burst.
const GUARD_SLICE: usize = 500;

/// The time `n` guard reads take at `per_sec` (zero when unpaced).
fn guard_pace(n: usize, per_sec: u32) -> Duration {
    if per_sec == 0 {
        return Duration::ZERO;
    }
    Duration::from_secs_f64(n as f64 / f64::from(per_sec))
}

fn bucket_key(b: &LiveBucket) -> BucketKey {
    BucketKey::new(b.merchant_id, b.dish_id, b.stock_date)
}

/// Rows one inbox purge statement deletes.
const INBOX_PURGE_BATCH: u32 = 1000;

/// Scheduled passes until `stop`: a shard whenever one is due, the inbox purge beside them.
///
/// After a pass with no other shard due the loop sleeps `interval / shards` (the spacing of
/// the shards' due times) rather than polling the claim every second or two: an idle
/// `stocksvr all` claimed about twice per pass, five statements each time. The inbox purge
/// runs once per `interval` while its batch comes back short (nothing more is past the
/// retention), and at every round, as before, while batches come back full.
pub async fn run(
    reconciler: Arc<Reconciler>,
    stop: watch::Receiver<bool>,
) -> Result<(), ReconcileError> {
    let idle = (reconciler.config.interval / reconciler.config.shards.max(1))
        .max(Duration::from_millis(200));
    let purge_every = reconciler.config.interval;
    let next_purge = Mutex::new(std::time::Instant::now());
    let pass_stop = stop.clone();
    periodic::run(
        "reconciler",
        Cadence::adaptive(idle.min(Duration::from_secs(1)), idle),
        None,
        stop,
        || {
            let reconciler = reconciler.clone();
            let next_purge = &next_purge;
            let pass_stop = pass_stop.clone();
            async move {
                let now = std::time::Instant::now();
                let due = *next_purge.lock().unwrap_or_else(PoisonError::into_inner) <= now;
                if due {
                    let next = match reconciler.purge_inbox_once(INBOX_PURGE_BATCH).await {
                        Ok(n) if n >= u64::from(INBOX_PURGE_BATCH) => now,
                        Ok(_) => now + purge_every,
                        Err(e) => {
                            tracing::warn!(error = %e, "inbox purge failed; retrying");
                            now
                        }
                    };
                    *next_purge.lock().unwrap_or_else(PoisonError::into_inner) = next;
                }
                Ok(match reconciler.pass_until(Some(pass_stop)).await {
                    Ok(Some(report)) => {
                        tracing::debug!(?report, "reconcile pass over a shard");
                        if report.more_due {
                            Round::Partial
                        } else {
                            Round::Idle
                        }
                    }
                    Ok(None) => Round::Empty,
                    Err(ReconcileError::Stopped) => {
                        tracing::info!(
                            "reconcile pass given up at the stop; its shard is due again"
                        );
                        Round::Failed
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "reconcile pass failed; retrying");
                        Round::Failed
                    }
                })
            }
        },
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guard_reads_are_paced_to_the_configured_rate() {
        assert_eq!(guard_pace(500, 10_000), Duration::from_millis(50));
        assert_eq!(guard_pace(GUARD_SLICE, 1_000), Duration::from_millis(500));
        // A last, short slice waits only its own share.
        assert_eq!(guard_pace(1, 10_000), Duration::from_micros(100));
        assert_eq!(guard_pace(500, 0), Duration::ZERO, "0 means unpaced");
    }
}
