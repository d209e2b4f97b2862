//! Running one WAL row: lease, Lua step, then completion with its outbox rows or a recorded
//! failure; and the worker that claims due rows.

use super::view::parse_json;
use super::*;
use stocksvr_core::codes::WalEffect;
use stocksvr_core::retry::{self, RetryPolicy};
use stocksvr_pipeline::periodic::{self, Cadence, Round};
use stocksvr_store::outbox::NewOutbox;
use stocksvr_telemetry::names;

/// How often a caller re-reads a row another worker executes while it waits for the result.
const PEER_POLL: Duration = Duration::from_millis(20);

/// An injected crash looks to the caller like a connection that went away mid-request.
fn crash_point(point: &'static str) -> Result<(), OpsError> {
    stocksvr_failpoint::hit(point)
        .map_err(|injected| OpsError::Mysql(sqlx::Error::Io(injected.into_io())))
}

/// What one step of a WAL row ended in.
pub(super) enum Step {
    Done(WalCompletion),
    /// Worth trying again later (Redis down, an unknown outcome, a transient refusal).
    Retry(String),
    /// Another operation of the bucket must finish first (its init, or an older adjust): try
    /// again later without using up the retry budget. A prerequisite that dies stops blocking
    /// (only unfinished rows are waited for).
    Wait(String),
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

impl StockOps {
    /// Executes the row if it is unfinished and free (or ours); otherwise waits a bounded time
    /// for whoever holds it, then reports where it stands.
    pub(super) async fn drive(&self, operation_id: &str, owner: &str) -> Result<WalView, OpsError> {
        let row = self.find_row(operation_id).await?;
        if matches!(
            row.status(),
            Some(WalStatus::Succeeded) | Some(WalStatus::Dead)
        ) {
            return Ok(WalView::from_row(&row));
        }
        if wal::try_lease(&self.pool, row.id, owner, self.config.lease).await? {
            let row = self.find_row(operation_id).await?;
            return self.execute(row, owner).await;
        }
        // Someone else executes it: the result is theirs to write; wait for it.
        let every = RetryPolicy::fixed(PEER_POLL);
        let finished = retry::wait_until(self.config.peer_wait, every, || async {
            match self.find_row(operation_id).await {
                Ok(row)
                    if !matches!(
                        row.status(),
                        Some(WalStatus::Succeeded) | Some(WalStatus::Dead) | Some(WalStatus::Retry)
                    ) =>
                {
                    None
                }
                read => Some(read),
            }
        })
        .await;
        let row = match finished {
            Some(read) => read?,
            // Still executing at the deadline: where it stands now.
            None => self.find_row(operation_id).await?,
        };
        Ok(WalView::from_row(&row))
    }

    pub(super) async fn find_row(&self, operation_id: &str) -> Result<WalRow, OpsError> {
        wal::find_by_op(&self.pool, operation_id)
            .await?
            .ok_or_else(|| OpsError::UnknownOperation(operation_id.to_string()))
    }

    /// Runs the Lua step of a leased row and records the outcome (guarded by the lease).
    async fn execute(&self, row: WalRow, owner: &str) -> Result<WalView, OpsError> {
        let action = row.action().map(WalAction::name).unwrap_or("UNKNOWN");
        // Crash points for tests (inert otherwise): the row is leased and EXECUTING, and the
        // Lua step has not run, or has run without its completion being committed.
        crash_point("wal.before_redis")?;
        let step = self.step(&row, owner).await?;
        match step {
            Step::Done(completion) => {
                crash_point("wal.before_complete")?;
                if wal::complete(&self.pool, &row, owner, &completion).await? {
                    self.baseline_changed(&row.stock_bucket_id);
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
            Step::Wait(reason) => {
                tracing::info!(operation_id = %row.operation_id, bucket = %row.stock_bucket_id, action, reason, "stock operation waits for another one of its bucket");
                wal::postpone(&self.pool, &row, owner, &reason, self.config.retry_delay).await?;
            }
            Step::Dead(reason) => {
                self.record_failure(&row, owner, action, &reason, true)
                    .await?;
            }
        }
        let row = self.find_row(&row.operation_id).await?;
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
        let delay = stocksvr_core::backoff::jittered_delta(
            row.retry_count,
            self.config.retry_delay,
            self.config.max_retry_delay,
        );
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

    /// Calls a script, retrying an UNKNOWN outcome with the same operation id.
    pub(super) async fn call<F, Fut>(&self, operation_id: &str, f: F) -> Result<OpResult, ExecError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<OpResult, ExecError>>,
    {
        retry_unknown(self.config.unknown_retries, operation_id, "wal", f).await
    }

    #[tracing::instrument(skip_all, fields(operation_id = %row.operation_id, bucket = %row.stock_bucket_id, action = row.action))]
    async fn step(&self, row: &WalRow, owner: &str) -> Result<Step, OpsError> {
        let Some(action) = row.action() else {
            return Ok(Step::Dead(format!(
                "unknown WAL action code {}",
                row.action
            )));
        };
        // The current baseline: an adjust may have moved it on since the row was written,
        // and every script here is idempotent per operation id and baseline version.
        let Some(baseline) =
            stocksvr_store::baselines::find_baseline(&self.pool, &row.stock_bucket_id).await?
        else {
            return Ok(Step::Dead(format!(
                "bucket {} has no baseline",
                row.stock_bucket_id
            )));
        };
        let keys = BucketKey::new(baseline.merchant_id, baseline.dish_id, baseline.stock_date);
        let request = parse_json(&row.request_payload);
        match action {
            WalAction::Repair => return self.step_repair(row, &baseline, &keys, &request).await,
            WalAction::Rebuild => return self.step_rebuild(row, owner, &baseline, &keys).await,
            _ => {}
        }
        // Adjusts of a bucket apply in version order: each event's old total is then the
        // total Redis had, and the ledger's deltas add up to what Redis holds.
        if action == WalAction::Adjust {
            if let Some(older) =
                wal::unfinished_before(&self.pool, row, Some(WalAction::Adjust)).await?
            {
                return Ok(Step::Wait(format!("the older adjust {older} goes first")));
            }
        }
        let result = match self
            .call_action(row, action, &keys, &baseline, &request)
            .await
            .and_then(script_outcome)
        {
            Ok(r) => r,
            Err(step) => return Ok(step),
        };
        if result.code == OpCode::BucketMissing && action != WalAction::InitBucket {
            if let Some(step) = self.wait_for_bucket(row, action, &keys).await? {
                return Ok(step);
            }
        }
        Ok(self.conclude(row, action, &baseline, &request, &result))
    }

    /// The script call of an INIT_BUCKET, ADJUST, CLOSE or ARCHIVE row; `Err` when the row
    /// cannot be run at all.
    async fn call_action(
        &self,
        row: &WalRow,
        action: WalAction,
        keys: &BucketKey,
        baseline: &Baseline,
        request: &serde_json::Value,
    ) -> Result<Result<OpResult, ExecError>, Step> {
        let op = row.operation_id.as_str();
        Ok(match action {
            WalAction::InitBucket => {
                self.call(op, || {
                    self.lua
                        .init_bucket(keys, op, baseline.total_stock, baseline.baseline_version)
                })
                .await
            }
            WalAction::Adjust => {
                let (Some(new_total), Some(version)) = (
                    request.get("new_total").and_then(|v| v.as_i64()),
                    request.get("baseline_version").and_then(|v| v.as_u64()),
                ) else {
                    return Err(Step::Dead(
                        "adjust request lacks new_total or baseline_version".into(),
                    ));
                };
                self.call(op, || self.lua.adjust(keys, op, new_total, None, version))
                    .await
            }
            WalAction::Close => {
                self.call(op, || {
                    self.lua.set_state(keys, op, BucketState::Closed, None)
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
                        .set_state(keys, &attempt, BucketState::Archived, ttl)
                })
                .await
            }
            WalAction::Repair | WalAction::Rebuild => {
                return Err(Step::Dead(format!(
                    "{} runs through its own step",
                    action.name()
                )))
            }
        })
    }

    /// A close, archive or adjust that found no bucket in Redis: whether it must wait, and
    /// for what (None: it applies as it is, see [`Self::conclude`]).
    async fn wait_for_bucket(
        &self,
        row: &WalRow,
        action: WalAction,
        keys: &BucketKey,
    ) -> Result<Option<Step>, OpsError> {
        // While its init has not finished, the init builds the bucket from the current
        // baseline; a close, archive or adjust applied now would be lost under it.
        if let Some(init) =
            wal::unfinished_before(&self.pool, row, Some(WalAction::InitBucket)).await?
        {
            return Ok(Some(Step::Wait(format!(
                "the bucket's init {init} goes first"
            ))));
        }
        if action != WalAction::Adjust {
            return Ok(None);
        }
        // An adjust of a bucket built before and missing now: Redis lost it. Applied to the
        // baseline alone ("not built yet"), the new total would reach the rebuilt bucket with
        // no ledger row, or miss it if the rebuild read the baseline first (a 30-minute chaos
        // run found the ledger 14 units off that way). It waits for the rebuild instead,
        // which starts from a baseline and ledger that hold still.
        Ok(match self.missing(&row.stock_bucket_id, keys).await {
            Ok(Missing::NeverBuilt) => None,
            Ok(Missing::BuiltMeanwhile) => Some(Step::Wait(
                "the bucket was built while the adjust ran".into(),
            )),
            Ok(Missing::Lost { init }) => {
                if stocksvr_store::baselines::mark_lost(&self.pool, &row.stock_bucket_id).await? {
                    tracing::error!(bucket = %row.stock_bucket_id, init = %init, operation_id = %row.operation_id, "bucket initialised before is missing from Redis: marked lost; rebuild it (stocksvr bucket rebuild)");
                }
                Some(Step::Wait(
                    "the bucket is lost in Redis; the adjust applies after its rebuild".into(),
                ))
            }
            Err(OpsError::Redis(e)) => Some(Step::Retry(format!("reading the bucket back: {e}"))),
            Err(e) => return Err(e),
        })
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
        let done = |outbox, bucket_status, extra| {
            Step::Done(WalCompletion {
                result_payload: summary(result, extra),
                outbox,
                bucket_status,
            })
        };
        match (action, result.code) {
            (WalAction::InitBucket, OpCode::Succeeded) => {
                // Only a bucket that came into being is booked: an UNCHANGED init found a
                // bucket that exists, already in the ledger.
                let outbox = if result.created {
                    vec![outbox::bucket_initialized(row.id, op, baseline, result)]
                } else {
                    Vec::new()
                };
                let effect = if result.created {
                    WalEffect::Initialized
                } else {
                    WalEffect::Unchanged
                };
                done(outbox, None, json!({ "effect": effect.name() }))
            }
            (WalAction::Adjust, OpCode::Succeeded) => {
                let (event, old_total) = adjusted(row, baseline, request, result);
                done(vec![event], None, json!({ "old_total": old_total }))
            }
            // Not in Redis and no init pending: the baseline carries the new total, and the
            // bucket's init will start from it.
            (WalAction::Adjust, OpCode::BucketMissing) => done(
                Vec::new(),
                None,
                json!({ "effect": "baseline only: the bucket is not in Redis yet and will be initialised from the new total" }),
            ),
            // The bucket already carries this baseline or a newer one (its init read the new
            // total first): nothing is left to apply or to book.
            (WalAction::Adjust, OpCode::Conflict) => done(
                Vec::new(),
                None,
                json!({ "effect": "the bucket already carries this baseline or a newer one" }),
            ),
            (WalAction::Close, OpCode::Succeeded | OpCode::BucketMissing | OpCode::Conflict) => {
                done(Vec::new(), None, json!({}))
            }
            (WalAction::Archive, OpCode::Succeeded | OpCode::BucketMissing) => done(
                Vec::new(),
                Some(BucketState::Archived.code() as i8),
                json!({}),
            ),
            // Stock is still reserved in Redis although MySQL has no unfinished reservation
            // left: a step is still settling; try again later, and alert if it never does.
            (WalAction::Archive, OpCode::Conflict) => Step::Retry(format!(
                "bucket {} still has {} reserved in Redis",
                row.stock_bucket_id, result.after.reserved
            )),
            (action, outcome) => Step::Dead(format!(
                "{} got {} from Redis",
                action.name(),
                outcome.name()
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
        // Best effort: a failed read keeps the last values of the backlog gauges.
        if let Err(e) = crate::gauges::refresh_wal(&self.pool).await {
            tracing::warn!(error = %e, "reading the WAL backlog failed");
        }
        Ok(report)
    }
}

/// The StockBaselineAdjusted event of an adjust that applied, and the total it replaced.
fn adjusted(
    row: &WalRow,
    baseline: &Baseline,
    request: &serde_json::Value,
    result: &OpResult,
) -> (NewOutbox, i64) {
    let op = row.operation_id.as_str();
    let old_total = request
        .get("old_total")
        .and_then(|v| v.as_i64())
        .unwrap_or(0);
    let new_total = request
        .get("new_total")
        .and_then(|v| v.as_i64())
        .unwrap_or(result.after.total);
    let version = request
        .get("baseline_version")
        .and_then(|v| v.as_u64())
        .unwrap_or(baseline.baseline_version);
    // Adjust moves neither reserved nor sold, so what was available before follows from the
    // total before (the previous adjust's or the init's).
    let committed = result.after.reserved + result.after.sold;
    let available_delta = result.after.available - (old_total - committed).max(0);
    if result.deficit > 0 && !result.replayed {
        metrics::counter!(names::BUCKET_DEFICIT).increment(1);
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
    (event, old_total)
}

/// The result payload of a WAL row: the script's outcome and the numbers it left, plus
/// what the action adds (`extra`, an object).
pub(super) fn summary(result: &OpResult, extra: serde_json::Value) -> serde_json::Value {
    let mut v = json!({
        "outcome": result.code.name(),
        "replayed": result.replayed,
        "redis_version": result.version,
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
}

/// A script call's error as the step it ends in.
pub(super) fn script_outcome(result: Result<OpResult, ExecError>) -> Result<OpResult, Step> {
    match result {
        Ok(r) => Ok(r),
        Err(e @ ExecError::Unknown { .. }) => Err(Step::Retry(e.to_string())),
        // A refused argument will be refused again: an operator must look.
        Err(e @ ExecError::InvalidArgument(_)) => Err(Step::Dead(e.to_string())),
        // A script refusal or an odd reply may come from a Redis or script version in the
        // middle of a rollout: retry with backoff up to the bound, then dead.
        Err(e) => Err(Step::Retry(e.to_string())),
    }
}

/// Runs WAL rounds until `stop`, on the stock operations `ops` holds (the reservation
/// service holds the process's).
pub async fn run_worker<O: AsRef<StockOps>>(
    ops: Arc<O>,
    batch: u32,
    idle_poll: Duration,
    stop: watch::Receiver<bool>,
) -> Result<(), OpsError> {
    let cadence = Cadence::adaptive(idle_poll, idle_poll * 10);
    periodic::run("operation WAL worker", cadence, None, stop, || async {
        Ok(match (*ops).as_ref().work_once(batch).await {
            Ok(r) if r.succeeded + r.failed + r.dead >= batch as usize => Round::Full,
            Ok(r) if r.succeeded + r.failed + r.dead > 0 => Round::Partial,
            Ok(_) => Round::Empty,
            Err(e) => {
                tracing::warn!(error = %e, "WAL worker round failed; retrying");
                Round::Failed
            }
        })
    })
    .await
}
