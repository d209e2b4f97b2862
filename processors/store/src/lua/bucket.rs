//! A bucket's own operations, each recorded under its operation id: the init, the
//! merchant's adjust and the move along OPEN -> CLOSED -> ARCHIVED.

use super::{check_op, check_total, ExecError, LuaExecutor};
use std::time::Duration;
use stocksvr_core::bucket::{BucketKey, BucketState};
use stocksvr_core::model::OpResult;

impl LuaExecutor {
    /// Creates the bucket (version 1, OPEN; `created`). An existing bucket is left as it is
    /// (`Succeeded`, not `created`) whatever its baseline: only a bucket that came into being
    /// may be booked as an init, and a newer total goes through [`adjust`](Self::adjust).
    pub async fn init_bucket(
        &self,
        bucket: &BucketKey,
        operation_id: &str,
        total: i64,
        baseline_version: u64,
    ) -> Result<OpResult, ExecError> {
        check_op(operation_id)?;
        check_total(total)?;
        self.run(
            "init_bucket",
            &self.scripts.init_bucket,
            operation_id,
            &[bucket.stock_key(), bucket.op_key(operation_id)],
            &[
                operation_id.to_string(),
                total.to_string(),
                baseline_version.to_string(),
                self.op_ttl_ms.to_string(),
            ],
        )
        .await
    }

    /// Sets a new total: `available = max(0, new_total - reserved - sold)`, `deficit =
    /// max(0, reserved + sold - new_total)`. `expected_version` makes it a CAS on the bucket
    /// version; a `baseline_version` older than the stored one is a stale adjust (`Conflict`).
    pub async fn adjust(
        &self,
        bucket: &BucketKey,
        operation_id: &str,
        new_total: i64,
        expected_version: Option<u64>,
        baseline_version: u64,
    ) -> Result<OpResult, ExecError> {
        check_op(operation_id)?;
        check_total(new_total)?;
        self.run(
            "adjust",
            &self.scripts.adjust,
            operation_id,
            &[bucket.stock_key(), bucket.op_key(operation_id)],
            &[
                operation_id.to_string(),
                new_total.to_string(),
                expected_version.map(|v| v.to_string()).unwrap_or_default(),
                baseline_version.to_string(),
                self.op_ttl_ms.to_string(),
            ],
        )
        .await
    }

    /// Moves the bucket forward along OPEN -> CLOSED -> ARCHIVED (backwards is a `Conflict`,
    /// ARCHIVED while stock is still reserved too). On ARCHIVED the stock key gets
    /// `archive_expire` to live (whole seconds, rounded up; `None` keeps it).
    pub async fn set_state(
        &self,
        bucket: &BucketKey,
        operation_id: &str,
        state: BucketState,
        archive_expire: Option<Duration>,
    ) -> Result<OpResult, ExecError> {
        check_op(operation_id)?;
        let expire_secs = archive_expire
            .map(|d| d.as_secs() + u64::from(d.subsec_nanos() > 0))
            .unwrap_or(0);
        self.run(
            "set_state",
            &self.scripts.set_state,
            operation_id,
            &[bucket.stock_key(), bucket.op_key(operation_id)],
            &[
                operation_id.to_string(),
                state.name().to_string(),
                expire_secs.to_string(),
                self.op_ttl_ms.to_string(),
            ],
        )
        .await
    }
}
