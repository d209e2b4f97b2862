//! Versioned repair and rebuild after Redis lost a bucket (docs/design.md, "Reconcile, repair,
//! rebuild"; docs/reconciliation.md, "Repair" and "Rebuild"). Both are WAL operations like init and
//! adjust: the row is written first, the same executor and worker run its script with its operation
//! id, and the completion commits the outbox event that makes the projector book one ledger row and
//! move the snapshot. The reconciler (`stocksvr-reconciler`) plans a repair and drives it; running
//! it is a stock operation, so the WAL worker and recovery finish it after a crash without the
//! reconciler.
//!
//! A repair never writes `available = expected` blindly: the reconciler computed the numbers
//! from MySQL at one Redis version, and `repair.lua` writes them only if the bucket is still at
//! that version (a Try in between makes it a CONFLICT, and the reconciler computes again).
//!
//! A rebuild recreates a bucket that Redis lost: the fences of its reservations first (so a
//! retried step is recognised and an empty rollback keeps fencing its late Try), then the stock
//! hash from the last applied total and the reservation table's reserved and sold, at a
//! version above every version MySQL has seen.

mod restore;

use super::execute::{script_outcome, summary, Step};
use super::*;
use restore::{restoration, restored_phase, Held};
use serde::Deserialize;
use stocksvr_core::codes::WalEffect;
use stocksvr_core::events::StockNumbers as EventNumbers;
use stocksvr_store::bucket_views as views;
use stocksvr_store::lua::{RepairMode, TargetNumbers};

/// Reservations per restore call: one atomic script each, small enough not to block Redis.
const RESTORE_CHUNK: u32 = 200;

/// What a repair writes, computed by the reconciler from MySQL at `expected_version`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RepairPlan {
    pub stock_bucket_id: String,
    /// The Redis version the numbers were computed against.
    pub expected_version: u64,
    /// What the bucket must hold: the baseline's total, the reservation table's reserved and
    /// sold.
    pub target: TargetNumbers,
    /// Redis at `expected_version`.
    pub before: TargetNumbers,
    /// The ledger's sums when the plan was made (nothing of the bucket in flight).
    pub ledger_before: TargetNumbers,
    /// The differences it answers (`oversell`, `ledger_gap`, ...).
    pub kinds: Vec<String>,
    /// Reservations whose fence and op records are re-created where missing.
    #[serde(default)]
    pub restore: Vec<u64>,
    /// The least version the repaired bucket gets; 0 unless Redis' version went backwards
    /// (acknowledged writes lost in a failover): then past the snapshot's, so the projector
    /// books the repair and no later operation reuses a booked version.
    #[serde(default)]
    pub min_version: u64,
}

impl RepairPlan {
    /// One repair per bucket and version; a repair of a bucket that went backwards is named by
    /// the version it moves to, since its `expected_version` may be one an earlier repair
    /// (before the loss) already used.
    pub fn operation_id(&self) -> String {
        if self.min_version > 0 {
            format!(
                "op_repair_{}_r{}",
                op_suffix(&self.stock_bucket_id),
                self.min_version
            )
        } else {
            repair_operation_id(&self.stock_bucket_id, self.expected_version)
        }
    }
}

/// The plan a rebuild computed, stored in its WAL row before Redis is touched.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RebuildPlan {
    pub version: u64,
    pub state: String,
    pub baseline_version: u64,
    pub target: TargetNumbers,
    pub ledger_before: TargetNumbers,
    pub fences_restored: u64,
}

/// One repair per bucket and version: a second reconciler (or a retry) that computed the
/// same difference at the same version converges on the same row.
pub fn repair_operation_id(bucket_id: &str, version: u64) -> String {
    format!("op_repair_{}_v{version}", op_suffix(bucket_id))
}

/// One rebuild per loss: the time the bucket was found lost (seconds) tells losses apart.
pub fn rebuild_operation_id(bucket_id: &str, lost_at: NaiveDateTime) -> String {
    format!(
        "op_rebuild_{}_{}",
        op_suffix(bucket_id),
        lost_at.and_utc().timestamp()
    )
}

fn numbers(n: TargetNumbers) -> EventNumbers {
    EventNumbers {
        total: n.total,
        available: n.available,
        reserved: n.reserved,
        sold: n.sold,
        deficit: n.deficit,
    }
}

fn fits(op: &str) -> Result<(), OpsError> {
    if op.len() > 64 {
        return Err(OpsError::Invalid {
            field: "stock_bucket_id",
            message: format!("operation id {op} is longer than 64 characters"),
        });
    }
    Ok(())
}

impl StockOps {
    /// Writes and runs the REPAIR row of `plan` (idempotent per bucket and version).
    pub async fn repair(&self, plan: &RepairPlan) -> Result<WalView, OpsError> {
        let op = plan.operation_id();
        fits(&op)?;
        let owner = self.token();
        let request = serde_json::to_value(plan).map_err(|e| OpsError::Invalid {
            field: "plan",
            message: e.to_string(),
        })?;
        wal::begin_operation(
            &self.pool,
            self.new_wal(
                &owner,
                op.clone(),
                &plan.stock_bucket_id,
                WalAction::Repair,
                request,
            ),
        )
        .await?;
        self.drive(&op, &owner).await
    }

    /// Rebuilds a bucket Redis lost (marking it lost first if nobody has yet). Refused for a
    /// bucket Redis still has: that one is repaired, never rebuilt over.
    pub async fn rebuild(&self, bucket_id: &str) -> Result<WalView, OpsError> {
        let baseline = stocksvr_store::baselines::find_baseline(&self.pool, bucket_id)
            .await?
            .ok_or_else(|| OpsError::Refused(Refusal::NoBaseline(bucket_id.to_string())))?;
        let keys = BucketKey::new(baseline.merchant_id, baseline.dish_id, baseline.stock_date);
        let lost_at = match baseline.lost_at {
            Some(t) => t,
            None => {
                let present = self
                    .lua
                    .read_bucket(&keys)
                    .await
                    .map_err(|e| OpsError::Redis(e.to_string()))?
                    .is_some();
                if present {
                    return Err(OpsError::Invalid {
                        field: "stock_bucket_id",
                        message: format!(
                            "{bucket_id} is in Redis: nothing to rebuild (stocksvr reconcile --repair corrects its numbers)"
                        ),
                    });
                }
                if wal::succeeded_init(&self.pool, bucket_id).await?.is_none() {
                    return Err(OpsError::Invalid {
                        field: "stock_bucket_id",
                        message: format!(
                            "{bucket_id} was never built: its first Try or the daily job initialises it"
                        ),
                    });
                }
                stocksvr_store::baselines::mark_lost(&self.pool, bucket_id).await?;
                stocksvr_store::baselines::find_baseline(&self.pool, bucket_id)
                    .await?
                    .and_then(|b| b.lost_at)
                    .ok_or_else(|| OpsError::Mysql(sqlx::Error::RowNotFound))?
            }
        };
        let op = rebuild_operation_id(bucket_id, lost_at);
        fits(&op)?;
        wait_out_cached_baselines(bucket_id, lost_at).await;
        let owner = self.token();
        wal::begin_operation(
            &self.pool,
            self.new_wal(
                &owner,
                op.clone(),
                bucket_id,
                WalAction::Rebuild,
                json!({ "lost_at": view::ts(lost_at) }),
            ),
        )
        .await?;
        self.drive(&op, &owner).await
    }

    pub(super) async fn step_repair(
        &self,
        row: &WalRow,
        baseline: &Baseline,
        keys: &BucketKey,
        request: &serde_json::Value,
    ) -> Result<Step, OpsError> {
        let Ok(plan) = serde_json::from_value::<RepairPlan>(request.clone()) else {
            return Ok(Step::Dead("unreadable repair plan".into()));
        };
        let op = row.operation_id.as_str();
        if !plan.restore.is_empty() {
            // Only missing records are written, so this is safe whatever ran since the plan
            // (a record written after it is newer and stays).
            let rows = views::rows_by_id(&self.pool, &row.stock_bucket_id, &plan.restore).await?;
            let ids: Vec<u64> = rows.iter().map(|r| r.id).collect();
            let refunds = views::completed_refunds(&self.pool, &ids).await?;
            let (fences, ops) = restoration(&rows, &refunds);
            if let Err(e) = self
                .lua
                .restore_fences(keys, plan.expected_version, &fences, &ops)
                .await
            {
                return Ok(Step::Retry(e.to_string()));
            }
        }
        let mode = RepairMode::Repair {
            expected_version: plan.expected_version,
            min_version: plan.min_version,
        };
        let result = match script_outcome(
            self.call(op, || self.lua.repair(keys, op, mode, plan.target))
                .await,
        ) {
            Ok(r) => r,
            Err(step) => return Ok(step),
        };
        let effect = match result.code {
            OpCode::Succeeded => WalEffect::Repaired,
            // Something ran since the numbers were computed: nothing written; the reconciler
            // computes again at the new version (a new operation id).
            OpCode::Conflict => WalEffect::VersionChanged,
            OpCode::BucketMissing => WalEffect::BucketMissing,
            other => {
                return Ok(Step::Dead(format!(
                    "repair got {} from Redis",
                    other.name()
                )));
            }
        };
        let outbox = if result.code == OpCode::Succeeded {
            vec![outbox::bucket_repaired(
                &outbox::Corrected {
                    wal_id: row.id,
                    operation_id: op,
                    baseline,
                    ledger_before: numbers(plan.ledger_before),
                    result: &result,
                },
                &plan.kinds,
                numbers(plan.before),
            )]
        } else {
            Vec::new()
        };
        Ok(Step::Done(WalCompletion {
            result_payload: summary(&result, json!({ "effect": effect })),
            outbox,
            bucket_status: None,
        }))
    }

    pub(super) async fn step_rebuild(
        &self,
        row: &WalRow,
        owner: &str,
        baseline: &Baseline,
        keys: &BucketKey,
    ) -> Result<Step, OpsError> {
        let op = row.operation_id.as_str();
        let present = match self.lua.read_bucket(keys).await {
            Ok(b) => b.is_some(),
            Err(e) => return Ok(Step::Retry(e.to_string())),
        };
        let stored = serde_json::from_str::<serde_json::Value>(&row.request_payload)
            .ok()
            .and_then(|r| r.get("plan").cloned())
            .and_then(|p| serde_json::from_value::<RebuildPlan>(p).ok());
        let plan = match (present, stored) {
            // The script ran and the completion did not commit: replay it with the plan it
            // ran with, so the event says exactly what it wrote.
            (true, Some(plan)) => plan,
            (true, None) => {
                return Ok(Step::Dead(format!(
                    "{} exists in Redis and this rebuild never wrote it: reconcile it instead",
                    row.stock_bucket_id
                )))
            }
            (false, _) => {
                // Steps cannot complete while the stock hash is missing, so MySQL holds
                // still; the ledger must have booked every event before its sums count.
                if !views::projection_complete(&self.pool, &row.stock_bucket_id).await? {
                    return Ok(Step::Wait(
                        "events of the bucket are still on their way to the ledger".into(),
                    ));
                }
                let plan = match self.plan_rebuild(baseline).await? {
                    Ok(plan) => plan,
                    Err(reason) => return Ok(Step::Dead(reason)),
                };
                let mut request = json!({ "plan": plan });
                if let Some(lost_at) =
                    serde_json::from_str::<serde_json::Value>(&row.request_payload)
                        .ok()
                        .and_then(|r| r.get("lost_at").cloned())
                {
                    request["lost_at"] = lost_at;
                }
                if !wal::set_request(&self.pool, row.id, owner, &request).await? {
                    return Ok(Step::Retry("lost the lease before writing the plan".into()));
                }
                if let Err(e) = self.restore_fences(baseline, keys, plan.version).await {
                    return Ok(Step::Retry(e));
                }
                plan
            }
        };
        let state = BucketState::from_name(&plan.state).unwrap_or(BucketState::Open);
        let mode = RepairMode::Rebuild {
            version: plan.version,
            state,
            baseline_version: plan.baseline_version,
        };
        let result = match script_outcome(
            self.call(op, || self.lua.repair(keys, op, mode, plan.target))
                .await,
        ) {
            Ok(r) => r,
            Err(step) => return Ok(step),
        };
        if result.code != OpCode::Succeeded {
            return Ok(Step::Dead(format!(
                "rebuild got {} from Redis: the bucket was created by something else meanwhile",
                result.code.name()
            )));
        }
        let event = outbox::bucket_rebuilt(
            &outbox::Corrected {
                wal_id: row.id,
                operation_id: op,
                baseline,
                ledger_before: numbers(plan.ledger_before),
                result: &result,
            },
            plan.baseline_version,
            plan.fences_restored,
        );
        tracing::warn!(bucket = %row.stock_bucket_id, operation_id = op, version = plan.version, total = plan.target.total, reserved = plan.target.reserved, sold = plan.target.sold, fences = plan.fences_restored, "bucket rebuilt in Redis from MySQL");
        Ok(Step::Done(WalCompletion {
            result_payload: summary(
                &result,
                json!({ "effect": WalEffect::Rebuilt, "fences_restored": plan.fences_restored }),
            ),
            outbox: vec![event],
            bucket_status: None,
        }))
    }

    /// The numbers of a lost bucket from MySQL: the total and baseline version its stock
    /// operations last applied, reserved and sold from the reservation table, at a version
    /// above any MySQL has seen. `Err` names why it cannot be rebuilt.
    async fn plan_rebuild(&self, b: &Baseline) -> Result<Result<RebuildPlan, String>, OpsError> {
        let bucket = b.stock_bucket_id.as_str();
        let Some((total, baseline_version)) = wal::last_applied(&self.pool, bucket).await? else {
            return Ok(Err(format!(
                "{bucket} has no applied init: nothing to rebuild from"
            )));
        };
        let (mut reserved, mut sold, mut fences) = (0i64, 0i64, 0u64);
        let mut after = 0u64;
        loop {
            let rows = views::rebuild_rows(&self.pool, bucket, after, RESTORE_CHUNK).await?;
            let Some(last) = rows.last() else { break };
            after = last.id;
            for r in &rows {
                let (phase, held_in) = restored_phase(r);
                let held = i64::from(r.quantity.saturating_sub(r.refunded_quantity));
                match held_in {
                    Held::Reserved => reserved += held,
                    Held::Sold => sold += held,
                    Held::Nothing => {}
                }
                fences += u64::from(phase.is_some());
            }
        }
        let ids = [bucket.to_string()];
        let sums = views::mysql_views(&self.pool, &ids).await?;
        let l = sums.ledger.get(bucket).copied().unwrap_or_default();
        let ledger_before = TargetNumbers {
            total: l.total,
            available: l.available,
            reserved: l.reserved,
            sold: l.sold,
            deficit: (l.available + l.reserved + l.sold - l.total).max(0),
        };
        let state = match b.state() {
            Some(BucketState::Closed) => BucketState::Closed,
            _ => BucketState::Open,
        };
        Ok(Ok(RebuildPlan {
            version: views::highest_known_version(&self.pool, bucket).await? + 1,
            state: state.name().to_string(),
            baseline_version,
            target: TargetNumbers::from_accepted(total, reserved, sold),
            ledger_before,
            fences_restored: fences,
        }))
    }

    /// Re-creates the fences and op records of the bucket's reservations, in chunks.
    async fn restore_fences(
        &self,
        b: &Baseline,
        keys: &BucketKey,
        version: u64,
    ) -> Result<u64, String> {
        let mut after = 0u64;
        let mut written = 0;
        loop {
            let rows = views::rebuild_rows(&self.pool, &b.stock_bucket_id, after, RESTORE_CHUNK)
                .await
                .map_err(|e| e.to_string())?;
            let Some(last) = rows.last() else { break };
            after = last.id;
            let ids: Vec<u64> = rows.iter().map(|r| r.id).collect();
            let refunds = views::completed_refunds(&self.pool, &ids)
                .await
                .map_err(|e| e.to_string())?;
            let (fences, ops) = restoration(&rows, &refunds);
            written += self
                .lua
                .restore_fences(keys, version, &fences, &ops)
                .await
                .map_err(|e| e.to_string())?;
        }
        Ok(written)
    }
}

/// Every instance's Try path judges a bucket's lost mark on a list (or a row) read up to
/// [`crate::cache::MAX_TTL`] ago: one read just before the mark would still let a
/// Try through. Before the rebuild puts the bucket back into Redis (where the script would
/// take that Try), the mark has been visible for longer than any cached copy can live; one
/// second more covers clock differences between instances.
async fn wait_out_cached_baselines(bucket_id: &str, lost_at: chrono::NaiveDateTime) {
    let settle = crate::cache::MAX_TTL + Duration::from_secs(1);
    let since = (chrono::Utc::now().naive_utc() - lost_at)
        .to_std()
        .unwrap_or_default();
    if let Some(left) = settle.checked_sub(since) {
        tracing::info!(bucket = bucket_id, wait_ms = left.as_millis() as u64, "rebuild waits until no instance can hold a copy of the bucket from before its lost mark");
        tokio::time::sleep(left).await;
    }
}
