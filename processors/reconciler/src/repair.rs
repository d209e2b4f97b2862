//! The repair stage: plans a versioned repair from an inspection and drives it (computing
//! again while Trys keep moving the version), rebuilds a lost bucket and reopens it for Trys
//! once a pass finds it consistent.
//!
//! The REPAIR and REBUILD rows themselves are stock operations of the reservation crate
//! (`StockOps::repair`, `StockOps::rebuild`): the WAL executor and its worker run their
//! scripts, and resume them after a crash, with no reconciler involved. This stage decides
//! what to write and when; the WAL row is how it is written.

use crate::classify::{version_floor, Verdict};
use crate::inspect::Inspection;
use crate::queries::buckets::{live_buckets, live_buckets_by_id};
use crate::queries::BucketFilter;
use crate::{verdict_name, ReconcileError, Reconciler};
use serde::Serialize;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};
use stocksvr_core::codes::WalEffect;
use stocksvr_core::retry::{wait_until, RetryPolicy};
use stocksvr_reservation::operations::{RepairPlan, WalView};
use stocksvr_store::baselines::clear_lost;
use stocksvr_store::lua::TargetNumbers;
use stocksvr_telemetry::names;

/// How often a rebuilt bucket is looked at again until it is consistent.
const REOPEN_POLL: Duration = Duration::from_millis(500);

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

impl Inspection {
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
            min_version: version_floor(&self.views),
        })
    }
}

/// The effect a repair's WAL row recorded (`result_payload.effect`), as stored.
fn effect(view: &WalView) -> Option<String> {
    view.result
        .as_ref()
        .and_then(|r| r.get("effect"))
        .and_then(|e| e.as_str())
        .map(str::to_string)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Reconciler {
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
            let view = match self.service.ops().repair(&plan).await {
                Ok(view) => view,
                Err(e) => {
                    break RepairOutcome::Failed {
                        reason: e.to_string(),
                    }
                }
            };
            let effect = effect(&view);
            match effect.as_deref().and_then(WalEffect::from_name) {
                Some(WalEffect::Repaired) => {
                    break RepairOutcome::Repaired {
                        operation_id: view.operation_id,
                    }
                }
                Some(WalEffect::VersionChanged) if attempts < self.config.repair_attempts => {
                    tracing::info!(bucket = %plan.stock_bucket_id, version = plan.expected_version, "repair lost its version check; computing again");
                }
                Some(WalEffect::VersionChanged) => {
                    break RepairOutcome::VersionChanged { attempts }
                }
                _ => {
                    break RepairOutcome::Failed {
                        reason: format!(
                            "repair {} ended {} ({:?}): {}",
                            view.operation_id,
                            view.status,
                            effect,
                            view.last_error.unwrap_or_default()
                        ),
                    }
                }
            }
            current = match self.inspect(vec![current.bucket.clone()]).await {
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
        if buckets.is_empty() {
            return Ok(Vec::new());
        }
        let (waiting, reopened) = (Mutex::new(buckets.to_vec()), Mutex::new(Vec::new()));
        let (waiting, reopened) = (&waiting, &reopened);
        let ended = wait_until(within, RetryPolicy::fixed(REOPEN_POLL), || async move {
            let now_waiting = std::mem::take(&mut *lock(waiting));
            match self.reopen_round(&now_waiting).await {
                Ok((opened, still)) => {
                    let mut all = lock(reopened);
                    all.extend(opened);
                    progress(all.len());
                    let done = still.is_empty();
                    *lock(waiting) = still;
                    done.then_some(Ok(()))
                }
                Err(e) => Some(Err(e)),
            }
        })
        .await;
        if let Some(Err(e)) = ended {
            return Err(e);
        }
        let reopened = std::mem::take(&mut *lock(reopened));
        Ok(reopened)
    }

    /// One look at `waiting`, a chunk at a time: the buckets reopened (cleared now, or by
    /// someone else before) and those still not consistent.
    async fn reopen_round(
        &self,
        waiting: &[String],
    ) -> Result<(Vec<String>, Vec<String>), ReconcileError> {
        let pool = self.service.pool();
        let mut reopened = Vec::new();
        let mut still = Vec::new();
        for chunk in waiting.chunks(self.config.chunk.max(1) as usize) {
            let live = live_buckets_by_id(pool, chunk).await?;
            for i in self.inspect(live).await? {
                let id = i.bucket.stock_bucket_id.clone();
                if i.bucket.lost_at.is_none() {
                    reopened.push(id);
                } else if i.verdict == Verdict::Consistent {
                    clear_lost(pool, &id).await?;
                    self.service.baseline_changed(&id);
                    reopened.push(id);
                } else {
                    still.push(id);
                }
            }
        }
        Ok((reopened, still))
    }

    /// Clears a rebuilt bucket's lost mark once a pass finds it consistent (the rebuild's
    /// event booked, its reservations' steps settled); false when `within` ran out first.
    pub async fn reopen(&self, bucket: &str, within: Duration) -> Result<bool, ReconcileError> {
        let last = Mutex::new(None);
        let last = &last;
        let ended = wait_until(within, RetryPolicy::fixed(REOPEN_POLL), || async move {
            match self.reopen_one(bucket).await {
                Ok(Ok(reopened)) => Some(Ok(reopened)),
                Ok(Err(verdict)) => {
                    *lock(last) = verdict;
                    None
                }
                Err(e) => Some(Err(e)),
            }
        })
        .await;
        if let Some(ended) = ended {
            return ended;
        }
        let verdict = lock(last).take();
        tracing::warn!(bucket, verdict = ?verdict, "rebuilt bucket not consistent yet; it stays refused (the scheduled reconciler reopens it once it is)");
        Ok(false)
    }

    /// One look at a rebuilt bucket: `Ok(true)` when it is open (cleared now, or before),
    /// `Ok(false)` when it is no longer live, `Err` with its verdict while it is not
    /// consistent yet.
    async fn reopen_one(
        &self,
        bucket: &str,
    ) -> Result<Result<bool, Option<Verdict>>, ReconcileError> {
        let filter = BucketFilter {
            bucket: Some(bucket.to_string()),
            ..BucketFilter::default()
        };
        let live = live_buckets(self.service.pool(), &filter, None, 1).await?;
        let Some(b) = live.into_iter().next() else {
            return Ok(Ok(false));
        };
        if b.lost_at.is_none() {
            return Ok(Ok(true));
        }
        let verdict = self
            .inspect(vec![b])
            .await?
            .into_iter()
            .next()
            .map(|i| i.verdict);
        if verdict != Some(Verdict::Consistent) {
            return Ok(Err(verdict));
        }
        let cleared = clear_lost(self.service.pool(), bucket).await?;
        self.service.baseline_changed(bucket);
        if cleared {
            tracing::warn!(
                bucket,
                "rebuilt bucket found consistent: Trys are taken again"
            );
        }
        Ok(Ok(true))
    }
}
