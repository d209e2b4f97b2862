//! The Redis Lua executor: every change of a bucket's sellable numbers is one atomic script
//! (`lua/*.lua`) that checks, moves the quantities, bumps the bucket version, advances the
//! reservation fence and records its result under the operation id (seed §5).
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

mod error;
mod reply;

pub use error::{outcome_unknown, ExecError};

use crate::redis_conn::RedisConn;
use backon::{ExponentialBuilder, Retryable};
use redis::{Script, Value};
use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use stocksvr_core::bucket::{BucketKey, BucketState};
use stocksvr_core::model::{Fence, FencePhase, OpResult};
use stocksvr_telemetry::names;

/// Default lifetime of an op record (and of a finished fence): it has to cover the longest
/// order lifecycle + the longest message retry + the reconciliation window + a margin (seed
/// §5.3). Deployments override it through `LuaExecutor::new`.
pub const DEFAULT_OP_TTL: Duration = Duration::from_secs(30 * 24 * 60 * 60);

// Each script is `_common.lua` (shared helpers: result layout, op record, fence, invariant
// checks) followed by the script's own file; EVAL has no `require`, so the prelude is
// concatenated at compile time and the hash Redis caches is that of the whole text.
macro_rules! lua_script {
    ($file:literal) => {
        concat!(
            include_str!("../../../../lua/_common.lua"),
            include_str!(concat!("../../../../lua/", $file))
        )
    };
}

pub const TRY_LUA: &str = lua_script!("try.lua");
pub const CONFIRM_LUA: &str = lua_script!("confirm.lua");
pub const CANCEL_LUA: &str = lua_script!("cancel.lua");
pub const REFUND_LUA: &str = lua_script!("refund.lua");
pub const INIT_BUCKET_LUA: &str = lua_script!("init_bucket.lua");
pub const ADJUST_LUA: &str = lua_script!("adjust.lua");
pub const SET_STATE_LUA: &str = lua_script!("set_state.lua");
pub const REPAIR_LUA: &str = lua_script!("repair.lua");
pub const RESTORE_FENCES_LUA: &str = lua_script!("restore_fences.lua");

/// Largest bucket total the scripts accept (Lua numbers are doubles: exact to 2^53).
pub const MAX_TOTAL: i64 = 1 << 50;

/// One step of a reservation, each its own script over the same three keys (stock hash,
/// fence, op record) and arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// `available -= qty, reserved += qty`, fence RESERVED; refused when the bucket is
    /// missing or not OPEN (`BucketMissing`, `BucketClosed`), the fence is already past
    /// RESERVED (`Fenced`, anti-hanging), or stock is short (`Insufficient`).
    Try { quantity: u32 },
    /// Only from fence RESERVED: what is still held moves from reserved to sold. A second
    /// Confirm with another operation id is a `Conflict` (replays carry the same id).
    Confirm,
    /// From RESERVED the held quantity goes back; with no fence a CANCELED fence of `quantity`
    /// is written and no stock added (empty rollback); CONFIRMED/REFUNDED is a `Conflict`.
    /// Without the stock hash it is `BucketMissing` (the bucket was lost, fences with it)
    /// unless `never_built` says MySQL knows the bucket was never created: then the empty
    /// rollback is written so the Try waiting for the lazy init is fenced.
    Cancel { quantity: u32, never_built: bool },
    /// The empty rollback alone, by the Cancel's script and operation id: fences a Try that
    /// never ran (written even without the stock hash, as `never_built` does), but a RESERVED
    /// fence (another copy of the Try did run) is left as it is and nothing is recorded: the
    /// reply is a `Conflict` with the phase RESERVED, and the reservation's own steps decide.
    /// For a Try that gives up its row: its bucket lost, or its day closed before the bucket
    /// was built.
    FenceTry { quantity: u32 },
    /// From RESERVED (reserved -> available) or CONFIRMED (sold -> available); partial refunds
    /// add up; more than what is left is `OverRefund`.
    Refund { quantity: u32 },
}

impl Step {
    /// The `action` the op record stores, and the metric label.
    pub const fn name(self) -> &'static str {
        match self {
            Step::Try { .. } => "try",
            Step::Confirm => "confirm",
            Step::Cancel { .. } | Step::FenceTry { .. } => "cancel",
            Step::Refund { .. } => "refund",
        }
    }

    fn quantity(self) -> Option<u32> {
        match self {
            Step::Try { quantity }
            | Step::Cancel { quantity, .. }
            | Step::FenceTry { quantity }
            | Step::Refund { quantity } => Some(quantity),
            Step::Confirm => None,
        }
    }
}

/// The stock hash as stored (a plain read, not part of any script).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StockNumbers {
    pub total: i64,
    pub available: i64,
    pub reserved: i64,
    pub sold: i64,
    pub version: u64,
    pub state: BucketState,
    pub baseline_version: u64,
    pub deficit: i64,
    pub updated_at_ms: i64,
}

/// The reservation fence as stored: the [`Fence`] plus the operations that moved it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FenceRecord {
    pub fence: Fence,
    pub try_op: Option<String>,
    pub confirm_op: Option<String>,
    pub cancel_op: Option<String>,
    pub last_refund_op: Option<String>,
    /// Bucket version when the fence was last written (0 if the bucket did not exist).
    pub version: u64,
    pub updated_at_ms: i64,
}

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

struct Scripts {
    try_reserve: Script,
    confirm: Script,
    cancel: Script,
    refund: Script,
    init_bucket: Script,
    adjust: Script,
    set_state: Script,
    repair: Script,
    restore_fences: Script,
}

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
            scripts: Arc::new(Scripts {
                try_reserve: Script::new(TRY_LUA),
                confirm: Script::new(CONFIRM_LUA),
                cancel: Script::new(CANCEL_LUA),
                refund: Script::new(REFUND_LUA),
                init_bucket: Script::new(INIT_BUCKET_LUA),
                adjust: Script::new(ADJUST_LUA),
                set_state: Script::new(SET_STATE_LUA),
                repair: Script::new(REPAIR_LUA),
                restore_fences: Script::new(RESTORE_FENCES_LUA),
            }),
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

    /// One reservation step of `reservation_id` in `bucket` under `operation_id`.
    pub async fn step(
        &self,
        bucket: &BucketKey,
        reservation_id: u64,
        operation_id: &str,
        step: Step,
    ) -> Result<OpResult, ExecError> {
        check_op(operation_id)?;
        let script = match step {
            Step::Try { .. } => &self.scripts.try_reserve,
            Step::Confirm => &self.scripts.confirm,
            Step::Cancel { .. } | Step::FenceTry { .. } => &self.scripts.cancel,
            Step::Refund { .. } => &self.scripts.refund,
        };
        let mut args = vec![reservation_id.to_string(), operation_id.to_string()];
        if let Some(quantity) = step.quantity() {
            check_qty(quantity)?;
            args.push(quantity.to_string());
        }
        args.push(self.op_ttl_ms.to_string());
        match step {
            Step::Cancel { never_built, .. } => {
                args.push(if never_built { "1" } else { "" }.to_string());
            }
            Step::FenceTry { .. } => {
                args.push("1".to_string());
                args.push("1".to_string());
            }
            _ => {}
        }
        self.run(
            step.name(),
            script,
            operation_id,
            &[
                bucket.stock_key(),
                bucket.fence_key(reservation_id),
                bucket.op_key(operation_id),
            ],
            &args,
        )
        .await
    }

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
            } => ("REPAIR", expected_version, "", 0, min_version),
            RepairMode::Rebuild {
                version,
                state,
                baseline_version,
            } => ("REBUILD", version, state.name(), baseline_version, 0),
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

    /// The stock hashes of `buckets` in one pipelined round trip (the reconciler's read).
    pub async fn read_buckets(
        &self,
        buckets: &[BucketKey],
    ) -> Result<Vec<Option<StockNumbers>>, ExecError> {
        if buckets.is_empty() {
            return Ok(Vec::new());
        }
        // Buckets are different hash tags: in cluster mode one pipeline per slot.
        let cmds = buckets
            .iter()
            .map(|bucket| {
                let key = bucket.stock_key();
                let mut cmd = redis::cmd("HGETALL");
                cmd.arg(&key);
                (key, cmd)
            })
            .collect();
        let replies = self
            .conn
            .pipeline_by_slot(cmds)
            .await
            .map_err(|e| ExecError::from_redis("", e))?;
        let maps = replies
            .into_iter()
            .map(redis::from_redis_value::<HashMap<String, String>>)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| ExecError::from_redis("", e.into()))?;
        buckets
            .iter()
            .zip(maps)
            .map(|(bucket, map)| stock_numbers(&bucket.stock_key(), &map))
            .collect()
    }

    /// For each `(bucket, reservation id, operation id)`: the reservation's fence (phase,
    /// quantity, refunded) if it exists, and whether the op record exists. One pipelined
    /// round trip (the reconciler checks the records of the reservations that hold units).
    pub async fn read_guards(
        &self,
        guards: &[(BucketKey, u64, String)],
    ) -> Result<Vec<(Option<Fence>, bool)>, ExecError> {
        if guards.is_empty() {
            return Ok(Vec::new());
        }
        // The fence and the op record of a guard share its bucket's tag; guards of different
        // buckets are split per slot in cluster mode.
        let mut cmds = Vec::with_capacity(guards.len() * 2);
        for (bucket, reservation_id, op) in guards {
            let fence_key = bucket.fence_key(*reservation_id);
            let mut hmget = redis::cmd("HMGET");
            hmget
                .arg(&fence_key)
                .arg("phase")
                .arg("quantity")
                .arg("refunded");
            cmds.push((fence_key, hmget));
            let op_key = bucket.op_key(op);
            let mut exists = redis::cmd("EXISTS");
            exists.arg(&op_key);
            cmds.push((op_key, exists));
        }
        let replies = self
            .conn
            .pipeline_by_slot(cmds)
            .await
            .map_err(|e| ExecError::from_redis("", e))?;
        let mut out = Vec::with_capacity(guards.len());
        for pair in replies.chunks(2) {
            let fence = match pair.first() {
                Some(Value::Array(fields)) => {
                    let text = |i: usize| match fields.get(i) {
                        Some(Value::BulkString(b)) => String::from_utf8(b.clone()).ok(),
                        _ => None,
                    };
                    match (text(0), text(1), text(2)) {
                        (Some(phase), Some(q), refunded) => {
                            FencePhase::from_name(&phase).map(|phase| Fence {
                                phase,
                                quantity: q.parse().unwrap_or(0),
                                refunded: refunded.and_then(|r| r.parse().ok()).unwrap_or(0),
                            })
                        }
                        _ => None,
                    }
                }
                _ => None,
            };
            let exists = matches!(pair.get(1), Some(Value::Int(1)));
            out.push((fence, exists));
        }
        Ok(out)
    }

    /// The stock hash, or `None` when the bucket does not exist. Errors carry an empty
    /// operation id (a read has none).
    pub async fn read_bucket(&self, bucket: &BucketKey) -> Result<Option<StockNumbers>, ExecError> {
        let key = bucket.stock_key();
        let map = self.hgetall(&key).await?;
        stock_numbers(&key, &map)
    }

    /// The reservation fence, or `None` (phase NONE).
    pub async fn read_fence(
        &self,
        bucket: &BucketKey,
        reservation_id: u64,
    ) -> Result<Option<FenceRecord>, ExecError> {
        let key = bucket.fence_key(reservation_id);
        let map = self.hgetall(&key).await?;
        if map.is_empty() {
            return Ok(None);
        }
        let protocol = |detail: String| ExecError::Protocol {
            operation_id: String::new(),
            detail: format!("{key}: {detail}"),
        };
        let op = |name: &str| map.get(name).filter(|s| !s.is_empty()).cloned();
        let phase = map.get("phase").map(String::as_str).unwrap_or_default();
        Ok(Some(FenceRecord {
            fence: Fence {
                phase: FencePhase::from_name(phase)
                    .ok_or_else(|| protocol(format!("unknown phase {phase:?}")))?,
                quantity: reply::field(&map, "quantity").map_err(protocol)?,
                refunded: reply::field(&map, "refunded").map_err(protocol)?,
            },
            try_op: op("try_op"),
            confirm_op: op("confirm_op"),
            cancel_op: op("cancel_op"),
            last_refund_op: op("last_refund_op"),
            version: reply::field(&map, "version").map_err(protocol)?,
            updated_at_ms: reply::field(&map, "updated_at").map_err(protocol)?,
        }))
    }

    /// The recorded result of `operation_id` on `bucket` (its op record), or `None` when there
    /// is none (never run, or expired after the op TTL).
    pub async fn read_op(
        &self,
        bucket: &BucketKey,
        operation_id: &str,
    ) -> Result<Option<OpResult>, ExecError> {
        let key = bucket.op_key(operation_id);
        let map = self.hgetall(&key).await?;
        reply::parse_record(&map).map_err(|detail| ExecError::Protocol {
            operation_id: operation_id.to_string(),
            detail: format!("{key}: {detail}"),
        })
    }

    async fn hgetall(&self, key: &str) -> Result<HashMap<String, String>, ExecError> {
        // The manager multiplexes one connection; a clone is a handle, not a new socket.
        let mut conn = self.conn.clone();
        redis::cmd("HGETALL")
            .arg(key)
            .query_async(&mut conn)
            .await
            .map_err(|e| ExecError::from_redis("", e))
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

    /// The Trys of several reservations in one bucket in one call of `try.lua`: each item
    /// runs as its own call would have, in order, with its own operation id and fence, and
    /// gets its own result (group commit, issue 12). A call that failed as a whole tells
    /// every item the same error, so an unknown outcome is retried item by item with the
    /// same operation ids like any other. One item is [`step`](Self::step).
    pub async fn try_group(
        &self,
        bucket: &BucketKey,
        items: &[TryItem],
    ) -> Vec<Result<OpResult, ExecError>> {
        if let [one] = items {
            let step = Step::Try {
                quantity: one.quantity,
            };
            return vec![
                self.step(bucket, one.reservation_id, &one.operation_id, step)
                    .await,
            ];
        }
        let each_fails = |e: ExecError| {
            items
                .iter()
                .map(|i| Err(e.for_operation(&i.operation_id)))
                .collect()
        };
        if items.is_empty() {
            return Vec::new();
        }
        if let Err(e) = items.iter().try_for_each(|i| {
            check_op(&i.operation_id)?;
            check_qty(i.quantity)
        }) {
            return each_fails(e);
        }
        let ttl = self.op_ttl_ms.to_string();
        let mut keys = Vec::with_capacity(1 + 2 * items.len());
        let mut args = Vec::with_capacity(4 * items.len());
        keys.push(bucket.stock_key());
        for item in items {
            keys.push(bucket.fence_key(item.reservation_id));
            keys.push(bucket.op_key(&item.operation_id));
            args.extend([
                item.reservation_id.to_string(),
                item.operation_id.clone(),
                item.quantity.to_string(),
                ttl.clone(),
            ]);
        }
        // Errors of the call as a whole name the first item's operation.
        let first_op = items[0].operation_id.as_str();
        let action = "try";
        let replies = match self
            .invoke(action, &self.scripts.try_reserve, first_op, &keys, &args)
            .await
        {
            Ok(Value::Array(replies)) if replies.len() == items.len() => replies,
            Ok(other) => {
                return each_fails(ExecError::Protocol {
                    operation_id: first_op.to_string(),
                    detail: format!("expected {} replies, got {other:?}", items.len()),
                })
            }
            Err(e) => return each_fails(e),
        };
        // One wait covers every write of the call, replays included.
        if let Err(e) = self.replicated(first_op, &keys[0]).await {
            return each_fails(e);
        }
        items
            .iter()
            .zip(replies)
            .map(|(item, reply)| {
                let op = item.operation_id.as_str();
                let result = match reply::item_error(reply) {
                    Ok(reply) => reply::parse_reply(op, reply)?,
                    Err(e) => return Err(refused(action, ExecError::from_redis(op, e))),
                };
                traced(action, op, &result);
                Ok(result)
            })
            .collect()
    }
}

/// One Try of a [`LuaExecutor::try_group`] call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TryItem {
    pub reservation_id: u64,
    pub operation_id: String,
    pub quantity: u32,
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

/// A stock hash read back with HGETALL; `None` for an empty map (no such key). A hash without
/// `total` is a bucket something other than the scripts wrote (a stray HINCRBY on a lost
/// bucket, say): reported as it is, numbers missing read as 0, so the reconciler sees it.
fn stock_numbers(
    key: &str,
    map: &HashMap<String, String>,
) -> Result<Option<StockNumbers>, ExecError> {
    if map.is_empty() {
        return Ok(None);
    }
    let protocol = |detail: String| ExecError::Protocol {
        operation_id: String::new(),
        detail: format!("{key}: {detail}"),
    };
    let state = map.get("state").map(String::as_str).unwrap_or_default();
    let number = |name: &str| -> Result<i64, ExecError> {
        match map.get(name) {
            None => Ok(0),
            Some(_) => reply::field(map, name).map_err(protocol),
        }
    };
    Ok(Some(StockNumbers {
        total: number("total")?,
        available: number("available")?,
        reserved: number("reserved")?,
        sold: number("sold")?,
        version: u64::try_from(number("version")?)
            .map_err(|_| protocol("negative version".into()))?,
        state: BucketState::from_name(state)
            .ok_or_else(|| protocol(format!("unknown state {state:?}")))?,
        baseline_version: u64::try_from(number("baseline_version")?)
            .map_err(|_| protocol("negative baseline version".into()))?,
        deficit: number("deficit")?,
        updated_at_ms: number("updated_at")?,
    }))
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
    let backoff = ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(50))
        .with_max_delay(Duration::from_millis(500))
        .with_max_times(retries)
        .with_jitter();
    call.retry(backoff)
        .when(ExecError::is_unknown)
        .notify(|e, after| {
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
    fn steps_name_their_script_and_carry_a_quantity_where_it_has_one() {
        assert_eq!(Step::Try { quantity: 2 }.quantity(), Some(2));
        assert_eq!(Step::Confirm.quantity(), None);
        assert_eq!(Step::Refund { quantity: 1 }.name(), "refund");
    }

    #[test]
    fn totals_stay_where_doubles_are_exact() {
        assert!(check_total(MAX_TOTAL).is_ok());
        assert!(check_total(MAX_TOTAL + 1).is_err());
        assert!(check_total(-1).is_err());
    }
}
