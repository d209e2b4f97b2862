//! The Redis Lua executor: every change of a bucket's sellable numbers is one atomic script
//! (`lua/*.lua`) that checks, moves the quantities, bumps the bucket version, advances the
//! reservation fence and records its result under the operation id (docs/design.md, Redis
//! keys, the fence and op records).
//!
//! This module holds the executor and what every call shares (the replication wait, error
//! logging, the retry of unknown outcomes); the scripts' texts are in [`scripts`], the calls
//! by family in [`steps`] (reservations), [`bucket`] (init, adjust, state), [`repair`]
//! (reconciler writes) and [`read`] (plain reads).
//!
//! # Outcomes and errors
//!
//! A call that reached Redis and ran returns `Ok(OpResult)`, whatever the business outcome
//! (`Succeeded`, `Insufficient`, `Fenced`, …). `Err(ExecError::Unknown)` means the script may or
//! may not have run (timeout, dropped connection, I/O failure, a server busy or failing over):
//! **the caller must never treat it as a failure**. It keeps the reservation / WAL row in its
//! intermediate state and retries with the **same operation id** ([`retry_unknown`]); the op
//! record makes the retry return the first result instead of applying the change twice.
//!
//! # Keys
//!
//! One bucket is one hash tag `{merchant_id:dish_id:yyyy-mm-dd}`, so every key a script touches
//! lives in one cluster slot. The layout is [`BucketKey`]'s (`processors/core/src/bucket.rs`);
//! the keys are built there and passed in `KEYS`, never inside Lua.

mod bucket;
mod error;
mod read;
mod repair;
mod reply;
mod scripts;
mod steps;

pub use error::{outcome_unknown, ExecError};
pub use read::{FenceRecord, StockNumbers};
pub use repair::{RepairMode, RestoredFence, RestoredOp, TargetNumbers};
pub use scripts::{
    ADJUST_LUA, CANCEL_LUA, CONFIRM_LUA, INIT_BUCKET_LUA, REFUND_LUA, REPAIR_LUA,
    RESTORE_FENCES_LUA, SET_STATE_LUA, TRY_LUA,
};
pub use steps::{Step, TryItem};

use crate::redis_conn::RedisConn;
use redis::{Script, Value};
use scripts::Scripts;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use stocksvr_core::model::OpResult;
use stocksvr_core::retry::RetryPolicy;
use stocksvr_telemetry::names;

/// Default lifetime of an op record (and of a finished fence): it has to cover the longest
/// order lifecycle + the longest message retry + the reconciliation window + a margin
/// (docs/design.md, op records). Deployments override it through `LuaExecutor::new`.
pub const DEFAULT_OP_TTL: Duration = Duration::from_secs(30 * 24 * 60 * 60);

/// Largest bucket total the scripts accept (Lua numbers are doubles: exact to 2^53).
pub const MAX_TOTAL: i64 = 1 << 50;

/// Runs the inventory scripts over one multiplexed, reconnecting connection. Cheap to clone.
///
/// Scripts are sent with EVALSHA: redis-rs 1.x `ScriptInvocation::invoke_async`
/// (`redis-1.8.1/src/script.rs`) sends `EVALSHA <sha1>` and, on a `NOSCRIPT` error, sends
/// `SCRIPT LOAD` and repeats the EVALSHA once; so the text travels only after a restart, a
/// failover or a `SCRIPT FLUSH`. In cluster mode the EVALSHA goes to the master of the first
/// key's slot (all keys of a call share the bucket's hash tag) and `SCRIPT LOAD` to every node,
/// so the node that answered NOSCRIPT has the script for the retry (`crate::redis_conn`).
/// Timeouts come from the connection's configuration (`crate::connect_redis` sets a response
/// timeout) and surface as `ExecError::Unknown`.
#[derive(Clone)]
pub struct LuaExecutor {
    conn: RedisConn,
    scripts: Arc<Scripts>,
    op_ttl_ms: u64,
    replication: Option<ReplicationWait>,
}

/// Wait for replicas before a script's result counts (`redis.wait_replicas`): a master killed
/// with kill -9 can lose writes it acknowledged but had not yet sent to its replica (Redis
/// replicates asynchronously). With a wait, a step is answered only once `replicas` replicas
/// hold it; a shortfall within `timeout` is an UNKNOWN outcome, retried with the same
/// operation id (a replay on the same master, or a fresh apply on a promoted replica that
/// never saw it). Not a consensus guarantee (redis.io/commands/wait), but it closes the window
/// in which MySQL records a reservation whose stock change only the dead master had.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicationWait {
    pub replicas: u32,
    pub timeout: Duration,
}

impl std::fmt::Debug for LuaExecutor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LuaExecutor")
            .field("op_ttl_ms", &self.op_ttl_ms)
            .finish_non_exhaustive()
    }
}

impl LuaExecutor {
    /// `op_ttl` is how long op records (and fences out of RESERVED) live; see
    /// [`DEFAULT_OP_TTL`]. A RESERVED fence never expires.
    pub fn new(conn: impl Into<RedisConn>, op_ttl: Duration) -> Self {
        let op_ttl_ms = u64::try_from(op_ttl.as_millis()).unwrap_or(u64::MAX).max(1);
        Self {
            conn: conn.into(),
            scripts: Arc::new(Scripts::new()),
            op_ttl_ms,
            replication: None,
        }
    }

    /// Waits for `wait.replicas` replicas after every script call (see [`ReplicationWait`]);
    /// `replicas == 0` turns it off.
    pub fn with_replication_wait(mut self, wait: ReplicationWait) -> Self {
        self.replication = (wait.replicas > 0).then_some(wait);
        self
    }

    /// After a script replied: its writes are on enough replicas, or the outcome is unknown.
    async fn replicated(&self, operation_id: &str, first_key: &str) -> Result<(), ExecError> {
        let Some(wait) = self.replication else {
            return Ok(());
        };
        let timeout_ms = u64::try_from(wait.timeout.as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        let acked = self
            .conn
            .wait_replicas(first_key, wait.replicas, timeout_ms)
            .await
            .map_err(|e| ExecError::from_redis(operation_id, e))?;
        if acked < i64::from(wait.replicas) {
            // Counted in stocksvr_redis_unknown_outcomes_total by the step's retry, under the
            // step's own operation, like any other unknown outcome.
            return Err(ExecError::Unknown {
                operation_id: operation_id.to_string(),
                source: redis::RedisError::from((
                    redis::ErrorKind::Io,
                    "write not acknowledged by enough replicas",
                    format!("{acked} of {} within {timeout_ms} ms", wait.replicas),
                )),
            });
        }
        Ok(())
    }

    /// Invokes `script` and hands back its raw reply; an error reply is sorted (see
    /// [`ExecError::from_redis`]) and logged, an invariant refusal counted as the oversell alarm.
    async fn invoke(
        &self,
        action: &'static str,
        script: &Script,
        operation_id: &str,
        keys: &[String],
        args: &[String],
    ) -> Result<Value, ExecError> {
        let mut invocation = script.prepare_invoke();
        for key in keys {
            invocation.key(key.as_str());
        }
        for arg in args {
            invocation.arg(arg.as_str());
        }
        let mut conn = self.conn.clone();
        invocation
            .invoke_async(&mut conn)
            .await
            .map_err(|e| refused(action, ExecError::from_redis(operation_id, e)))
    }

    async fn run(
        &self,
        action: &'static str,
        script: &Script,
        operation_id: &str,
        keys: &[String],
        args: &[String],
    ) -> Result<OpResult, ExecError> {
        let reply = self
            .invoke(action, script, operation_id, keys, args)
            .await?;
        let result = reply::parse_reply(operation_id, reply)?;
        // Replays too: the first call may have timed out before its write was replicated.
        if let Some(first) = keys.first() {
            self.replicated(operation_id, first).await?;
        }
        traced(action, operation_id, &result);
        Ok(result)
    }
}

/// An error reply of a script, logged (the oversell alarm counted) and handed back.
fn refused(action: &'static str, err: ExecError) -> ExecError {
    if err.is_invariant_violation() {
        metrics::counter!(names::LUA_INVARIANT_REFUSALS, "script" => action).increment(1);
        tracing::error!(action, operation_id = err.operation_id(), error = %err, "oversell alarm: the stored numbers break an invariant; the script refused to move them");
    } else {
        tracing::warn!(action, operation_id = err.operation_id(), error = %err, "inventory script failed");
    }
    err
}

fn traced(action: &'static str, operation_id: &str, result: &OpResult) {
    tracing::debug!(
        action,
        operation_id,
        outcome = result.code.name(),
        version = result.version,
        replayed = result.replayed,
        "inventory script"
    );
}

/// Runs `call` and repeats it while its outcome is unknown, up to `retries` more times with a
/// short jittered backoff, then gives the last error back. Safe only because every script call
/// carries its operation id: a repeat of a call that did run replays the first result instead
/// of applying the change twice (the one place this rule is written).
pub async fn retry_unknown<T, F, Fut>(
    retries: usize,
    operation_id: &str,
    what: &'static str,
    call: F,
) -> Result<T, ExecError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, ExecError>>,
{
    let policy = RetryPolicy::new(Duration::from_millis(50), Duration::from_millis(500))
        .times(u32::try_from(retries).unwrap_or(u32::MAX));
    policy
        .run(call, ExecError::is_unknown, |e, after| {
            metrics::counter!(names::REDIS_UNKNOWN_OUTCOMES, "operation" => what).increment(1);
            tracing::warn!(operation_id, error = %e, ?after, "redis outcome unknown; retrying with the same operation id");
        })
        .await
}

fn check_op(operation_id: &str) -> Result<(), ExecError> {
    if operation_id.is_empty() {
        return Err(ExecError::InvalidArgument(
            "operation_id must not be empty".into(),
        ));
    }
    Ok(())
}

fn check_qty(qty: u32) -> Result<(), ExecError> {
    if qty == 0 {
        return Err(ExecError::InvalidArgument("quantity must be >= 1".into()));
    }
    Ok(())
}

fn check_total(total: i64) -> Result<(), ExecError> {
    if !(0..=MAX_TOTAL).contains(&total) {
        return Err(ExecError::InvalidArgument(format!(
            "total must be within 0..={MAX_TOTAL}, got {total}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_stay_where_doubles_are_exact() {
        assert!(check_total(MAX_TOTAL).is_ok());
        assert!(check_total(MAX_TOTAL + 1).is_err());
        assert!(check_total(-1).is_err());
    }
}
