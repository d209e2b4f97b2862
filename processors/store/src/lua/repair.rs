//! What the reconciler writes into Redis: a bucket's corrected numbers (a versioned repair,
//! or the rebuild of a lost bucket) and the fences and op records a lost bucket had.

use super::{check_op, check_total, ExecError, LuaExecutor};
use stocksvr_core::bucket::{BucketKey, BucketState};
use stocksvr_core::codes::WalAction;
use stocksvr_core::model::{FencePhase, OpResult};

/// The five numbers a repair or a rebuild writes; they satisfy
/// `available + reserved + sold == total + deficit` with `available` or `deficit` zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct TargetNumbers {
    pub total: i64,
    pub available: i64,
    pub reserved: i64,
    pub sold: i64,
    pub deficit: i64,
}

impl TargetNumbers {
    /// The numbers a bucket of `total` holds with `reserved` and `sold` accepted: what is not
    /// accepted is available, and what was accepted beyond the total is the deficit.
    pub fn from_accepted(total: i64, reserved: i64, sold: i64) -> Self {
        let committed = reserved + sold;
        Self {
            total,
            available: (total - committed).max(0),
            reserved,
            sold,
            deficit: (committed - total).max(0),
        }
    }
}

/// How [`LuaExecutor::repair`] writes its numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RepairMode {
    /// Only while the bucket is still at `expected_version` (a `Conflict` otherwise: the
    /// caller recomputes); the version is bumped, to at least `min_version` (0: just +1).
    /// A floor moves a bucket whose version went backwards (acknowledged writes lost in a
    /// failover) past the versions MySQL already booked.
    Repair {
        expected_version: u64,
        min_version: u64,
    },
    /// Only when the stock hash is missing: creates it at `version` in `state`.
    Rebuild {
        version: u64,
        state: BucketState,
        baseline_version: u64,
    },
}

/// A fence to re-create after Redis lost a bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestoredFence {
    pub reservation_id: u64,
    pub phase: FencePhase,
    pub quantity: u32,
    pub refunded: u32,
    pub try_op: Option<String>,
    pub confirm_op: Option<String>,
    pub cancel_op: Option<String>,
    pub last_refund_op: Option<String>,
}

/// The op record of a step MySQL says a reservation took, re-created after a loss.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestoredOp {
    pub reservation_id: u64,
    pub operation_id: String,
    /// `TRY`, `CONFIRM`, `CANCEL` or `REFUND` (what the script records as its action).
    pub action: &'static str,
    /// The fence phase the step left.
    pub phase: FencePhase,
    pub quantity: u32,
}

impl LuaExecutor {
    /// Writes a bucket's corrected numbers (versioned: see [`RepairMode`]) and records the
    /// result under `operation_id` (action REPAIR or REBUILD).
    pub async fn repair(
        &self,
        bucket: &BucketKey,
        operation_id: &str,
        mode: RepairMode,
        numbers: TargetNumbers,
    ) -> Result<OpResult, ExecError> {
        check_op(operation_id)?;
        for value in [
            numbers.total,
            numbers.available,
            numbers.reserved,
            numbers.sold,
            numbers.deficit,
        ] {
            check_total(value)?;
        }
        let (name, version, state, baseline, floor) = match mode {
            RepairMode::Repair {
                expected_version,
                min_version,
            } => (
                WalAction::Repair.name(),
                expected_version,
                "",
                0,
                min_version,
            ),
            RepairMode::Rebuild {
                version,
                state,
                baseline_version,
            } => (
                WalAction::Rebuild.name(),
                version,
                state.name(),
                baseline_version,
                0,
            ),
        };
        self.run(
            "repair",
            &self.scripts.repair,
            operation_id,
            &[bucket.stock_key(), bucket.op_key(operation_id)],
            &[
                operation_id.to_string(),
                name.to_string(),
                version.to_string(),
                numbers.total.to_string(),
                numbers.available.to_string(),
                numbers.reserved.to_string(),
                numbers.sold.to_string(),
                numbers.deficit.to_string(),
                state.to_string(),
                baseline.to_string(),
                self.op_ttl_ms.to_string(),
                floor.to_string(),
            ],
        )
        .await
    }

    /// Re-creates `fences` and `ops` of a lost bucket where they do not exist (one atomic
    /// call; the caller chunks large buckets). Returns how many fences were written.
    pub async fn restore_fences(
        &self,
        bucket: &BucketKey,
        version: u64,
        fences: &[RestoredFence],
        ops: &[RestoredOp],
    ) -> Result<u64, ExecError> {
        let mut keys = Vec::with_capacity(fences.len() + ops.len());
        let mut args = vec![
            self.op_ttl_ms.to_string(),
            version.to_string(),
            fences.len().to_string(),
        ];
        for f in fences {
            if f.phase == FencePhase::None || f.quantity == 0 {
                return Err(ExecError::InvalidArgument(format!(
                    "fence of reservation {} needs a phase and a quantity",
                    f.reservation_id
                )));
            }
            keys.push(bucket.fence_key(f.reservation_id));
            args.extend([
                f.reservation_id.to_string(),
                f.phase.name().to_string(),
                f.quantity.to_string(),
                f.refunded.to_string(),
                f.try_op.clone().unwrap_or_default(),
                f.confirm_op.clone().unwrap_or_default(),
                f.cancel_op.clone().unwrap_or_default(),
                f.last_refund_op.clone().unwrap_or_default(),
            ]);
        }
        for op in ops {
            check_op(&op.operation_id)?;
            keys.push(bucket.op_key(&op.operation_id));
            args.extend([
                op.reservation_id.to_string(),
                op.action.to_string(),
                op.phase.name().to_string(),
                op.quantity.to_string(),
            ]);
        }
        let mut invocation = self.scripts.restore_fences.prepare_invoke();
        for key in &keys {
            invocation.key(key.as_str());
        }
        for arg in &args {
            invocation.arg(arg.as_str());
        }
        let mut conn = self.conn.clone();
        let written = invocation
            .invoke_async::<u64>(&mut conn)
            .await
            .map_err(|e| ExecError::from_redis("restore_fences", e))?;
        if let Some(first) = keys.first() {
            self.replicated("restore_fences", first).await?;
        }
        Ok(written)
    }
}
