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
//! intermediate state and retries with the **same operation id**; the op record makes the retry
//! return the first result instead of applying the change twice.
//!
//! # Keys
//!
//! One bucket is one hash tag `{merchant_id:dish_id:yyyy-mm-dd}`, so every key a script touches
//! lives in one cluster slot; the keys are built here and passed in `KEYS`, never inside Lua.
//! The same format is defined in `processors/core/src/bucket.rs`; the two must stay identical.

use redis::aio::ConnectionManager;
use redis::{ErrorKind, RedisError, Script, ServerErrorKind, Value};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

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
            include_str!("../../../lua/_common.lua"),
            include_str!(concat!("../../../lua/", $file))
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

/// The Redis keys of one stock bucket (one merchant, one dish, one business day).
///
/// ```text
/// tag    {<merchant_id>:<dish_id>:<yyyy-mm-dd>}
/// stock  inv:{tag}:stock
/// fence  inv:{tag}:reservation:<reservation_id>
/// op     inv:{tag}:op:<operation_id>
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BucketKeys {
    tag: String,
    stock: String,
}

impl BucketKeys {
    /// `stock_date` is the bucket's business day as `yyyy-mm-dd` (in the merchant's time zone;
    /// choosing it is the caller's job). A malformed date is refused here because it would
    /// silently address another bucket.
    pub fn new(merchant_id: u64, dish_id: u64, stock_date: &str) -> Result<Self, ExecError> {
        if !is_iso_date(stock_date) {
            return Err(ExecError::InvalidArgument(format!(
                "stock_date must be yyyy-mm-dd, got {stock_date:?}"
            )));
        }
        let tag = format!("{{{merchant_id}:{dish_id}:{stock_date}}}");
        let stock = format!("inv:{tag}:stock");
        Ok(Self { tag, stock })
    }

    /// `{merchant_id:dish_id:yyyy-mm-dd}`, braces included.
    pub fn tag(&self) -> &str {
        &self.tag
    }

    /// `inv:{tag}:stock`
    pub fn stock(&self) -> &str {
        &self.stock
    }

    /// `inv:{tag}:reservation:<reservation_id>`
    pub fn fence(&self, reservation_id: u64) -> String {
        format!("inv:{}:reservation:{reservation_id}", self.tag)
    }

    /// `inv:{tag}:op:<operation_id>`
    pub fn op(&self, operation_id: &str) -> String {
        format!("inv:{}:op:{operation_id}", self.tag)
    }
}

fn is_iso_date(s: &str) -> bool {
    let b = s.as_bytes();
    if b.len() != 10 || b[4] != b'-' || b[7] != b'-' {
        return false;
    }
    let digits = |r: std::ops::Range<usize>| b[r].iter().all(u8::is_ascii_digit);
    if !(digits(0..4) && digits(5..7) && digits(8..10)) {
        return false;
    }
    let month = (b[5] - b'0') * 10 + (b[6] - b'0');
    let day = (b[8] - b'0') * 10 + (b[9] - b'0');
    (1..=12).contains(&month) && (1..=31).contains(&day)
}

/// The business outcome of a script that ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// The change was applied (or, for idempotent no-ops, the state already is what was asked).
    Succeeded,
    /// Try: not enough available stock. Recorded; no fence is written.
    Insufficient,
    /// Try after the reservation was cancelled, confirmed or refunded (anti-hanging). Recorded.
    Fenced,
    /// The fence phase, the expected version or the baseline does not allow the change.
    Conflict,
    /// Refund of more than the reservation still holds. Recorded; nothing moved.
    OverRefund,
    /// The bucket's stock hash does not exist. Not recorded: retry after (lazy) init.
    BucketMissing,
    /// Try on a bucket that is not OPEN, or adjust on an ARCHIVED one. Not recorded.
    BucketClosed,
}

impl Outcome {
    /// The code the scripts return.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Succeeded => "SUCCEEDED",
            Outcome::Insufficient => "INSUFFICIENT",
            Outcome::Fenced => "FENCED",
            Outcome::Conflict => "CONFLICT",
            Outcome::OverRefund => "OVER_REFUND",
            Outcome::BucketMissing => "BUCKET_MISSING",
            Outcome::BucketClosed => "BUCKET_CLOSED",
        }
    }

    fn parse(code: &str) -> Option<Self> {
        Some(match code {
            "SUCCEEDED" => Outcome::Succeeded,
            "INSUFFICIENT" => Outcome::Insufficient,
            "FENCED" => Outcome::Fenced,
            "CONFLICT" => Outcome::Conflict,
            "OVER_REFUND" => Outcome::OverRefund,
            "BUCKET_MISSING" => Outcome::BucketMissing,
            "BUCKET_CLOSED" => Outcome::BucketClosed,
            _ => return None,
        })
    }
}

/// The bucket's absolute numbers right after the operation (for a replay: right after the
/// first execution). All zero when the bucket does not exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StockAfter {
    pub version: u64,
    pub total: i64,
    pub available: i64,
    pub reserved: i64,
    pub sold: i64,
}

/// What a script returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpResult {
    pub outcome: Outcome,
    pub after: StockAfter,
    /// The reservation fence phase after the operation (`RESERVED`, `CONFIRMED`, `CANCELED`,
    /// `REFUNDED`); `None` when there is no fence or the operation is not about a reservation.
    pub phase: Option<String>,
    /// Cancel found no fence (its Try never reached Redis): it wrote a CANCELED fence and
    /// added no stock.
    pub empty_rollback: bool,
    /// This operation id had already been applied: the result is the stored first one and this
    /// call changed nothing.
    pub replayed: bool,
    /// Committed quantity above `total` after an adjust below `reserved + sold`; paid down by
    /// later cancels and refunds. `available + reserved + sold == total + deficit` always.
    pub deficit: i64,
}

impl OpResult {
    pub fn succeeded(&self) -> bool {
        self.outcome == Outcome::Succeeded
    }
}

/// Lifecycle of a bucket (seed §12.4): OPEN takes Trys; CLOSED refuses new Trys but lets existing
/// reservations confirm, cancel and refund; ARCHIVED is final and lets the stock key expire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BucketState {
    Open,
    Closed,
    Archived,
}

impl BucketState {
    pub fn as_str(self) -> &'static str {
        match self {
            BucketState::Open => "OPEN",
            BucketState::Closed => "CLOSED",
            BucketState::Archived => "ARCHIVED",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "OPEN" => Some(BucketState::Open),
            "CLOSED" => Some(BucketState::Closed),
            "ARCHIVED" => Some(BucketState::Archived),
            _ => None,
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

/// The reservation fence as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    /// `RESERVED`, `CONFIRMED`, `CANCELED` or `REFUNDED`.
    pub phase: String,
    pub quantity: i64,
    pub refunded: i64,
    pub try_op: Option<String>,
    pub confirm_op: Option<String>,
    pub cancel_op: Option<String>,
    pub last_refund_op: Option<String>,
    /// Bucket version when the fence was last written (0 if the bucket did not exist).
    pub version: u64,
    pub updated_at_ms: i64,
}

#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// The script may or may not have run: timeout, dropped or refused connection, I/O failure,
    /// or a server that was busy, loading, failing over or lost the script cache mid-call.
    /// Never assume failure: retry with the SAME operation id (the op record turns a retry of
    /// an applied operation into a replay of its first result).
    #[error("redis outcome unknown for operation {operation_id:?}: {source}")]
    Unknown {
        operation_id: String,
        source: RedisError,
    },
    /// Redis answered with an error reply: a script refused its arguments, an operation id was
    /// reused for another action or reservation, the stored numbers break an invariant, or the
    /// server refused the command (WRONGTYPE, NOPERM, …). The scripts raise before their first
    /// write, so nothing was applied, but retrying the same call will fail the same way.
    #[error("redis refused operation {operation_id:?}: {source}")]
    Rejected {
        operation_id: String,
        source: RedisError,
    },
    /// The script ran but its reply does not have the expected shape (a script/code version
    /// mismatch). Whether it changed anything is unknown; do not retry blindly.
    #[error("unexpected redis reply for operation {operation_id:?}: {detail}")]
    Protocol {
        operation_id: String,
        detail: String,
    },
    /// Refused before any I/O (empty operation id, zero quantity, malformed date, …).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
}

impl ExecError {
    /// True when the outcome is unknown and the caller must retry with the same operation id.
    pub fn is_unknown(&self) -> bool {
        matches!(self, ExecError::Unknown { .. })
    }

    /// Sorts a Redis error into `Unknown` (may have run / worth retrying) or `Rejected`.
    pub fn from_redis(operation_id: &str, source: RedisError) -> Self {
        let operation_id = operation_id.to_string();
        if outcome_unknown(&source) {
            ExecError::Unknown {
                operation_id,
                source,
            }
        } else {
            ExecError::Rejected {
                operation_id,
                source,
            }
        }
    }
}

/// Whether a Redis error leaves the outcome of a write unknown (or at least retryable with the
/// same operation id). Errors that say "this command was refused on its merits" (ERR from a
/// script, WRONGTYPE, NOPERM, CROSSSLOT) are not: repeating them cannot help.
pub fn outcome_unknown(err: &RedisError) -> bool {
    if err.is_io_error()
        || err.is_timeout()
        || err.is_connection_dropped()
        || err.is_connection_refusal()
    {
        return true;
    }
    if matches!(
        err.kind(),
        // A reply we could not parse may belong to a command that ran.
        ErrorKind::Io
            | ErrorKind::Parse
            | ErrorKind::ClusterConnectionNotFound
            | ErrorKind::Server(
                ServerErrorKind::TryAgain
                    | ServerErrorKind::BusyLoading
                    | ServerErrorKind::ClusterDown
                    | ServerErrorKind::MasterDown
                    | ServerErrorKind::ReadOnly
                    | ServerErrorKind::Moved
                    | ServerErrorKind::Ask
                    // A SCRIPT FLUSH between redis-rs' reload and its second EVALSHA.
                    | ServerErrorKind::NoScript
            )
    ) {
        return true;
    }
    // Codes redis-rs has no kind for: a script running too long elsewhere, out of memory, a
    // failing RDB save refusing writes, missing replicas. All refuse the command before it
    // runs and clear up by themselves.
    matches!(
        err.code(),
        Some("BUSY" | "OOM" | "MISCONF" | "NOREPLICAS" | "LOADING" | "TRYAGAIN")
    )
}

struct Scripts {
    try_reserve: Script,
    confirm: Script,
    cancel: Script,
    refund: Script,
    init_bucket: Script,
    adjust: Script,
    set_state: Script,
}

/// Runs the inventory scripts over one multiplexed, reconnecting connection. Cheap to clone.
///
/// Scripts are sent with EVALSHA: redis-rs 1.x `ScriptInvocation::invoke_async`
/// (`redis-1.8.1/src/script.rs`) sends `EVALSHA <sha1>` and, on a `NOSCRIPT` error, sends
/// `SCRIPT LOAD` and repeats the EVALSHA once; so the text travels only after a restart, a
/// failover or a `SCRIPT FLUSH`. Timeouts come from the `ConnectionManager` configuration
/// (`crate::connect_redis` sets a response timeout) and surface as `ExecError::Unknown`.
#[derive(Clone)]
pub struct LuaExecutor {
    conn: ConnectionManager,
    scripts: Arc<Scripts>,
    op_ttl_ms: u64,
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
    pub fn new(conn: ConnectionManager, op_ttl: Duration) -> Self {
        let op_ttl_ms = u64::try_from(op_ttl.as_millis()).unwrap_or(u64::MAX).max(1);
        Self {
            conn,
            scripts: Arc::new(Scripts {
                try_reserve: Script::new(TRY_LUA),
                confirm: Script::new(CONFIRM_LUA),
                cancel: Script::new(CANCEL_LUA),
                refund: Script::new(REFUND_LUA),
                init_bucket: Script::new(INIT_BUCKET_LUA),
                adjust: Script::new(ADJUST_LUA),
                set_state: Script::new(SET_STATE_LUA),
            }),
            op_ttl_ms,
        }
    }

    /// Try: `available -= qty, reserved += qty` and fence RESERVED, unless the bucket is missing
    /// or not OPEN, the fence is already past RESERVED (`Fenced`), or stock is short
    /// (`Insufficient`).
    pub async fn try_reserve(
        &self,
        keys: &BucketKeys,
        reservation_id: u64,
        operation_id: &str,
        qty: u32,
    ) -> Result<OpResult, ExecError> {
        check_op(operation_id)?;
        check_qty(qty)?;
        self.run(
            "try",
            &self.scripts.try_reserve,
            operation_id,
            &[
                keys.stock().to_string(),
                keys.fence(reservation_id),
                keys.op(operation_id),
            ],
            &[
                reservation_id.to_string(),
                operation_id.to_string(),
                qty.to_string(),
                self.op_ttl_ms.to_string(),
            ],
        )
        .await
    }

    /// Confirm: only from fence RESERVED; moves `quantity - refunded` from reserved to sold.
    /// A second Confirm with another operation id is a `Conflict`, not a success: replays carry
    /// the same id and are answered from the op record.
    pub async fn confirm(
        &self,
        keys: &BucketKeys,
        reservation_id: u64,
        operation_id: &str,
    ) -> Result<OpResult, ExecError> {
        check_op(operation_id)?;
        self.run(
            "confirm",
            &self.scripts.confirm,
            operation_id,
            &[
                keys.stock().to_string(),
                keys.fence(reservation_id),
                keys.op(operation_id),
            ],
            &[
                reservation_id.to_string(),
                operation_id.to_string(),
                self.op_ttl_ms.to_string(),
            ],
        )
        .await
    }

    /// Cancel: from RESERVED gives the held quantity back; with no fence writes a CANCELED fence
    /// of `qty` and adds no stock (`empty_rollback`); CANCELED again is an idempotent success;
    /// CONFIRMED/REFUNDED is a `Conflict`. Works in CLOSED buckets.
    pub async fn cancel(
        &self,
        keys: &BucketKeys,
        reservation_id: u64,
        operation_id: &str,
        qty: u32,
    ) -> Result<OpResult, ExecError> {
        check_op(operation_id)?;
        check_qty(qty)?;
        self.run(
            "cancel",
            &self.scripts.cancel,
            operation_id,
            &[
                keys.stock().to_string(),
                keys.fence(reservation_id),
                keys.op(operation_id),
            ],
            &[
                reservation_id.to_string(),
                operation_id.to_string(),
                qty.to_string(),
                self.op_ttl_ms.to_string(),
            ],
        )
        .await
    }

    /// Refund `qty`: from RESERVED (reserved -> available) or CONFIRMED (sold -> available).
    /// Partial refunds add up; the phase becomes REFUNDED when all of it is refunded. More than
    /// what is left is `OverRefund`.
    pub async fn refund(
        &self,
        keys: &BucketKeys,
        reservation_id: u64,
        operation_id: &str,
        qty: u32,
    ) -> Result<OpResult, ExecError> {
        check_op(operation_id)?;
        check_qty(qty)?;
        self.run(
            "refund",
            &self.scripts.refund,
            operation_id,
            &[
                keys.stock().to_string(),
                keys.fence(reservation_id),
                keys.op(operation_id),
            ],
            &[
                reservation_id.to_string(),
                operation_id.to_string(),
                qty.to_string(),
                self.op_ttl_ms.to_string(),
            ],
        )
        .await
    }

    /// Creates the bucket (version 1, OPEN, phase `INITIALIZED`). An existing bucket is left
    /// as it is (`Succeeded`, phase `UNCHANGED`) whatever its baseline: only a bucket that came
    /// into being may be booked as an init, and a newer total goes through
    /// [`adjust`](Self::adjust).
    pub async fn init_bucket(
        &self,
        keys: &BucketKeys,
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
            &[keys.stock().to_string(), keys.op(operation_id)],
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
        keys: &BucketKeys,
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
            &[keys.stock().to_string(), keys.op(operation_id)],
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
        keys: &BucketKeys,
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
            &[keys.stock().to_string(), keys.op(operation_id)],
            &[
                operation_id.to_string(),
                state.as_str().to_string(),
                expire_secs.to_string(),
                self.op_ttl_ms.to_string(),
            ],
        )
        .await
    }

    /// The stock hash, or `None` when the bucket does not exist. Errors carry an empty
    /// operation id (a read has none).
    pub async fn read_bucket(&self, keys: &BucketKeys) -> Result<Option<StockNumbers>, ExecError> {
        let map = self.hgetall(keys.stock()).await?;
        if map.is_empty() {
            return Ok(None);
        }
        let protocol = |detail: String| ExecError::Protocol {
            operation_id: String::new(),
            detail: format!("{}: {detail}", keys.stock()),
        };
        let state = map.get("state").map(String::as_str).unwrap_or_default();
        Ok(Some(StockNumbers {
            total: field(&map, "total").map_err(protocol)?,
            available: field(&map, "available").map_err(protocol)?,
            reserved: field(&map, "reserved").map_err(protocol)?,
            sold: field(&map, "sold").map_err(protocol)?,
            version: field(&map, "version").map_err(protocol)?,
            state: BucketState::parse(state)
                .ok_or_else(|| protocol(format!("unknown state {state:?}")))?,
            baseline_version: field(&map, "baseline_version").map_err(protocol)?,
            deficit: field(&map, "deficit").map_err(protocol)?,
            updated_at_ms: field(&map, "updated_at").map_err(protocol)?,
        }))
    }

    /// The reservation fence, or `None` (phase NONE).
    pub async fn read_fence(
        &self,
        keys: &BucketKeys,
        reservation_id: u64,
    ) -> Result<Option<Fence>, ExecError> {
        let key = keys.fence(reservation_id);
        let map = self.hgetall(&key).await?;
        if map.is_empty() {
            return Ok(None);
        }
        let protocol = |detail: String| ExecError::Protocol {
            operation_id: String::new(),
            detail: format!("{key}: {detail}"),
        };
        let op = |name: &str| map.get(name).filter(|s| !s.is_empty()).cloned();
        Ok(Some(Fence {
            phase: map.get("phase").cloned().unwrap_or_default(),
            quantity: field(&map, "quantity").map_err(protocol)?,
            refunded: field(&map, "refunded").map_err(protocol)?,
            try_op: op("try_op"),
            confirm_op: op("confirm_op"),
            cancel_op: op("cancel_op"),
            last_refund_op: op("last_refund_op"),
            version: field(&map, "version").map_err(protocol)?,
            updated_at_ms: field(&map, "updated_at").map_err(protocol)?,
        }))
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

    async fn run(
        &self,
        action: &'static str,
        script: &Script,
        operation_id: &str,
        keys: &[String],
        args: &[String],
    ) -> Result<OpResult, ExecError> {
        let mut invocation = script.prepare_invoke();
        for key in keys {
            invocation.key(key.as_str());
        }
        for arg in args {
            invocation.arg(arg.as_str());
        }
        let mut conn = self.conn.clone();
        let reply: Value = match invocation.invoke_async(&mut conn).await {
            Ok(reply) => reply,
            Err(e) => {
                let err = ExecError::from_redis(operation_id, e);
                tracing::warn!(action, operation_id, error = %err, "inventory script failed");
                return Err(err);
            }
        };
        let result = parse_reply(operation_id, reply)?;
        tracing::debug!(
            action,
            operation_id,
            outcome = result.outcome.as_str(),
            version = result.after.version,
            replayed = result.replayed,
            "inventory script"
        );
        Ok(result)
    }
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

/// Totals travel through Lua doubles: keep them where every integer is exact.
/// Largest bucket total the scripts accept (Lua numbers are doubles: exact to 2^53).
pub const MAX_TOTAL: i64 = 1 << 50;

fn check_total(total: i64) -> Result<(), ExecError> {
    if !(0..=MAX_TOTAL).contains(&total) {
        return Err(ExecError::InvalidArgument(format!(
            "total must be within 0..={MAX_TOTAL}, got {total}"
        )));
    }
    Ok(())
}

fn field<T: std::str::FromStr>(map: &HashMap<String, String>, name: &str) -> Result<T, String> {
    let raw = map
        .get(name)
        .ok_or_else(|| format!("field {name} missing"))?;
    raw.parse()
        .map_err(|_| format!("field {name} is not a number: {raw:?}"))
}

/// `{code, version, total, available, reserved, sold, phase, empty_rollback, replayed, deficit}`
fn parse_reply(operation_id: &str, reply: Value) -> Result<OpResult, ExecError> {
    let protocol = |detail: String| ExecError::Protocol {
        operation_id: operation_id.to_string(),
        detail,
    };
    let items = match reply {
        Value::Array(items) if items.len() == 10 => items,
        other => {
            return Err(protocol(format!(
                "expected a 10-element array, got {other:?}"
            )))
        }
    };
    let text = |i: usize| {
        value_text(&items[i])
            .ok_or_else(|| protocol(format!("item {i} is not text: {:?}", items[i])))
    };
    let int = |i: usize| {
        value_int(&items[i])
            .ok_or_else(|| protocol(format!("item {i} is not an integer: {:?}", items[i])))
    };
    let flag = |i: usize| match int(i)? {
        0 => Ok(false),
        1 => Ok(true),
        n => Err(protocol(format!("item {i} is not a 0/1 flag: {n}"))),
    };

    let code = text(0)?;
    let outcome =
        Outcome::parse(&code).ok_or_else(|| protocol(format!("unknown code {code:?}")))?;
    let version = u64::try_from(int(1)?).map_err(|_| protocol("negative version".into()))?;
    let phase = text(6)?;
    Ok(OpResult {
        outcome,
        after: StockAfter {
            version,
            total: int(2)?,
            available: int(3)?,
            reserved: int(4)?,
            sold: int(5)?,
        },
        phase: (!phase.is_empty()).then_some(phase),
        empty_rollback: flag(7)?,
        replayed: flag(8)?,
        deficit: int(9)?,
    })
}

fn value_text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        _ => None,
    }
}

fn value_int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        // Replays read numbers back from the op record hash; the script converts them with
        // tonumber, but accept text too so a reply is never rejected for its encoding.
        other => value_text(other)?.parse().ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_follow_the_documented_format() {
        let keys = BucketKeys::new(10001, 90001, "2026-07-26").unwrap();
        assert_eq!(keys.tag(), "{10001:90001:2026-07-26}");
        assert_eq!(keys.stock(), "inv:{10001:90001:2026-07-26}:stock");
        assert_eq!(
            keys.fence(100123001),
            "inv:{10001:90001:2026-07-26}:reservation:100123001"
        );
        assert_eq!(
            keys.op("op_try_abc"),
            "inv:{10001:90001:2026-07-26}:op:op_try_abc"
        );
    }

    #[test]
    fn malformed_dates_are_refused() {
        for bad in [
            "2026-7-26",
            "2026/07/26",
            "2026-13-01",
            "2026-07-00",
            "20260726",
            "",
        ] {
            assert!(BucketKeys::new(1, 2, bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn replies_parse() {
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let reply = Value::Array(vec![
            bulk("SUCCEEDED"),
            Value::Int(7),
            Value::Int(10),
            Value::Int(5),
            Value::Int(3),
            Value::Int(2),
            bulk("RESERVED"),
            Value::Int(0),
            Value::Int(1),
            Value::Int(0),
        ]);
        let r = parse_reply("op", reply).unwrap();
        assert_eq!(r.outcome, Outcome::Succeeded);
        assert_eq!(r.after.version, 7);
        assert_eq!(r.phase.as_deref(), Some("RESERVED"));
        assert!(r.replayed && !r.empty_rollback);
        assert!(matches!(
            parse_reply("op", Value::Array(vec![bulk("NOPE")])),
            Err(ExecError::Protocol { .. })
        ));
    }

    #[test]
    fn io_errors_are_unknown_and_script_errors_are_not() {
        let io = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert!(ExecError::from_redis("op", io).is_unknown());
        let timeout = RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut));
        assert!(ExecError::from_redis("op", timeout).is_unknown());
        let refused = RedisError::from((ErrorKind::Client, "bad argument"));
        assert!(!ExecError::from_redis("op", refused).is_unknown());
    }
}
