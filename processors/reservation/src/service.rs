//! The operations. See the crate docs for the shape every one of them follows.

use stocksvr_telemetry::names;
use crate::error::ServiceError;
use crate::failpoint::{self, Place};
use crate::operations::{OpsConfig, OpsError, StockOps};
use crate::outbox::{self, Deltas};
use crate::view::{ReservationView, StuckView};
use backon::{ExponentialBuilder, Retryable};
use chrono::{DateTime, TimeDelta, Utc};
use chrono_tz::Tz;
use sqlx::MySqlPool;
use std::sync::Arc;
use std::time::{Duration, Instant};
use stocksvr_core::bucket::{self, BucketKey, BucketState};
use stocksvr_core::events::{OrderType, StockAction};
use stocksvr_core::model::{FencePhase, OpCode};
use stocksvr_core::reservation::{
    self as rules, Completion as Next, Decision, Intent, ReservationStatus,
};
use stocksvr_core::snowflake::SnowflakeGenerator;
use stocksvr_store::lua::{BucketKeys, ExecError, LuaExecutor, OpResult, Outcome};
use stocksvr_store::reservations::{
    self as repo, Completion, InsertOutcome, NewReservation, Reservation, Step,
};

#[derive(Debug, Clone)]
pub struct ServiceConfig {
    /// Time zone of merchants without a `merchant_settings` row.
    pub default_timezone: Tz,
    /// A RESERVED row past `created_at + hold_ttl` is alerted (never cancelled).
    pub hold_ttl: TimeDelta,
    /// How far in the past a scheduled order's processing_time may lie.
    pub scheduled_grace: TimeDelta,
    /// Largest quantity one Try may reserve.
    pub max_quantity: u32,
    /// Immediate retries of a Redis call whose outcome is unknown, before the row is left
    /// to the recovery worker.
    pub unknown_retries: usize,
    /// First delay before the recovery worker retries a failed step; doubles per attempt.
    pub recovery_delay: TimeDelta,
    /// Longest delay between two recovery attempts.
    pub recovery_max_delay: TimeDelta,
    /// Failed attempts after which recovery gives up: the row is marked dead and alerted.
    pub recovery_max_attempts: u32,
    /// Time-to-live of Redis operation records (idempotency window).
    pub op_ttl: Duration,
}

impl Default for ServiceConfig {
    fn default() -> Self {
        Self {
            default_timezone: chrono_tz::UTC,
            hold_ttl: TimeDelta::minutes(30),
            scheduled_grace: TimeDelta::minutes(5),
            max_quantity: 999,
            unknown_retries: 3,
            recovery_delay: TimeDelta::seconds(1),
            recovery_max_delay: TimeDelta::minutes(5),
            recovery_max_attempts: 20,
            op_ttl: Duration::from_secs(30 * 24 * 3600),
        }
    }
}

/// One dish of one order item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TryRequest {
    pub order_id: u64,
    pub order_item_id: u64,
    pub merchant_id: u64,
    pub dish_id: u64,
    pub quantity: u32,
    pub order_type: OrderType,
    pub processing_time: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TryReply {
    pub reservation: ReservationView,
    /// False when this request repeated an earlier Try of the same item and dish.
    pub created: bool,
}

/// What Confirm, Cancel, Refund and MarkCreated ended in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IntentOutcome {
    /// The step ran (or had already run: `already` true) and the row is in its new status.
    Done {
        reservation: Box<ReservationView>,
        already: bool,
    },
    /// Too early (e.g. Confirm while the Try is PREPARING): retry later.
    NotYet { status: ReservationStatus },
    /// Incompatible with the current status: report it, do not retry.
    Conflict {
        status: ReservationStatus,
        reason: &'static str,
    },
}

pub struct ReservationService {
    pool: MySqlPool,
    lua: Arc<LuaExecutor>,
    ids: SnowflakeGenerator,
    config: ServiceConfig,
    /// Woken after every commit that wrote outbox rows, so the relay publishes at once
    /// instead of at its next poll.
    outbox_written: Option<Arc<tokio::sync::Notify>>,
    /// Bucket init, adjust and lifecycle through the operation WAL (also the lazy init).
    ops: StockOps,
}

/// CAS races are bounded: each lost race means another actor moved the row, and a handful
/// of moves exhausts every path through the state machine.
const MAX_CAS_ROUNDS: usize = 8;

fn opcode(outcome: Outcome) -> OpCode {
    match outcome {
        Outcome::Succeeded => OpCode::Succeeded,
        Outcome::Insufficient => OpCode::Insufficient,
        Outcome::Fenced => OpCode::Fenced,
        Outcome::OverRefund => OpCode::OverRefund,
        // Conflict, and bucket states handled before `after_redis` is asked.
        Outcome::Conflict | Outcome::BucketMissing | Outcome::BucketClosed => OpCode::Conflict,
    }
}

fn fence_phase(result: &OpResult) -> FencePhase {
    match result.phase.as_deref() {
        Some("RESERVED") => FencePhase::Reserved,
        Some("CONFIRMED") => FencePhase::Confirmed,
        Some("CANCELED") => FencePhase::Canceled,
        Some("REFUNDED") => FencePhase::Refunded,
        _ => FencePhase::None,
    }
}

fn action_name(status: ReservationStatus) -> &'static str {
    match status {
        ReservationStatus::Preparing => "try",
        ReservationStatus::Confirming => "confirm",
        ReservationStatus::Canceling => "cancel",
        ReservationStatus::Refunding => "refund",
        _ => "none",
    }
}

impl ReservationService {
    pub fn new(
        pool: MySqlPool,
        lua: Arc<LuaExecutor>,
        ids: SnowflakeGenerator,
        config: ServiceConfig,
    ) -> Self {
        let ops = StockOps::new(pool.clone(), lua.clone(), OpsConfig::default());
        Self {
            pool,
            lua,
            ids,
            config,
            outbox_written: None,
            ops,
        }
    }

    /// Wakes `relay` after each commit that wrote outbox rows.
    pub fn with_outbox_waker(mut self, relay: Arc<tokio::sync::Notify>) -> Self {
        self.ops = self.ops.with_outbox_waker(relay.clone());
        self.outbox_written = Some(relay);
        self
    }

    /// Replaces the stock-operation settings (lease, retries, archive TTL).
    pub fn with_ops_config(mut self, config: OpsConfig) -> Self {
        let mut ops = StockOps::new(self.pool.clone(), self.lua.clone(), config);
        if let Some(relay) = &self.outbox_written {
            ops = ops.with_outbox_waker(relay.clone());
        }
        self.ops = ops;
        self
    }

    /// Bucket init, adjust, close and archive (the operation WAL).
    pub fn ops(&self) -> &StockOps {
        &self.ops
    }

    fn outbox_committed(&self) {
        if let Some(waker) = &self.outbox_written {
            waker.notify_one();
        }
    }

    pub fn config(&self) -> &ServiceConfig {
        &self.config
    }

    pub fn pool(&self) -> &MySqlPool {
        &self.pool
    }

    pub fn lua(&self) -> &LuaExecutor {
        &self.lua
    }

    pub async fn get(&self, id: u64) -> Result<Option<ReservationView>, ServiceError> {
        Ok(repo::find(&self.pool, id)
            .await?
            .as_ref()
            .map(ReservationView::from_row))
    }

    pub async fn list_order(&self, order_id: u64) -> Result<Vec<ReservationView>, ServiceError> {
        Ok(repo::list_by_order(&self.pool, order_id)
            .await?
            .iter()
            .map(ReservationView::from_row)
            .collect())
    }

    /// The merchant's zone, or the default when none is configured or it is unreadable.
    pub async fn timezone(&self, merchant_id: u64) -> Result<Tz, ServiceError> {
        Ok(match repo::merchant_timezone(&self.pool, merchant_id).await? {
            Some(name) => bucket::parse_timezone(&name).unwrap_or_else(|e| {
                tracing::warn!(merchant_id, %e, "merchant time zone unreadable; using the default");
                self.config.default_timezone
            }),
            None => self.config.default_timezone,
        })
    }

    /// The bucket a Try of `req` uses: chosen by order type in the merchant's time zone.
    pub async fn bucket_for(
        &self,
        req: &TryRequest,
        now: DateTime<Utc>,
    ) -> Result<BucketKey, ServiceError> {
        let tz = self.timezone(req.merchant_id).await?;
        let date = bucket::bucket_date_for(
            req.order_type,
            now,
            req.processing_time,
            tz,
            self.config.scheduled_grace,
        )
        .map_err(|e| ServiceError::Invalid {
            field: "processing_time",
            message: e.to_string(),
        })?;
        Ok(BucketKey::new(req.merchant_id, req.dish_id, date))
    }

    fn validate(&self, req: &TryRequest) -> Result<(), ServiceError> {
        let invalid = |field, message: String| Err(ServiceError::Invalid { field, message });
        if req.quantity == 0 || req.quantity > self.config.max_quantity {
            return invalid(
                "quantity",
                format!(
                    "must be between 1 and {}, got {}",
                    self.config.max_quantity, req.quantity
                ),
            );
        }
        for (field, value) in [
            ("order_id", req.order_id),
            ("order_item_id", req.order_item_id),
            ("merchant_id", req.merchant_id),
            ("dish_id", req.dish_id),
        ] {
            if value == 0 {
                return invalid(field, "must be a positive id".into());
            }
        }
        if req.order_type == OrderType::Scheduled && req.processing_time.is_none() {
            return invalid("processing_time", "required for a SCHEDULED order".into());
        }
        Ok(())
    }

    /// Try (seed §6): idempotent on (order_item_id, dish_id). A repeat returns the first
    /// outcome (finishing a Try left PREPARING); a CANCELED reservation is never revived.
    #[tracing::instrument(skip_all, fields(order_id = req.order_id, order_item_id = req.order_item_id, dish_id = req.dish_id), err)]
    pub async fn try_reserve(&self, req: &TryRequest) -> Result<TryReply, ServiceError> {
        let started = Instant::now();
        let result = self.try_reserve_inner(req).await;
        let outcome = match &result {
            Ok(reply) => reply.reservation.status.as_str(),
            Err(e) => error_label(e),
        };
        metrics::counter!(names::RESERVATION_OPERATIONS, "operation" => "try", "outcome" => outcome.to_string()).increment(1);
        metrics::histogram!(names::RESERVATION_OPERATION_SECONDS, "operation" => "try")
            .record(started.elapsed().as_secs_f64());
        result
    }

    async fn try_reserve_inner(&self, req: &TryRequest) -> Result<TryReply, ServiceError> {
        self.validate(req)?;
        if let Some(existing) =
            repo::find_by_item(&self.pool, req.order_item_id, req.dish_id).await?
        {
            return self.repeat_try(existing, req).await;
        }
        let now = Utc::now();
        let key = self.bucket_for(req, now).await?;
        let bucket_id = key.stock_bucket_id();
        let baseline = repo::find_baseline(&self.pool, &bucket_id)
            .await?
            .ok_or_else(|| ServiceError::BucketNotFound(bucket_id.clone()))?;
        if baseline.stock_status != 1 {
            return Err(ServiceError::BucketUnavailable {
                bucket: bucket_id,
                reason: "the dish's stock is disabled",
            });
        }
        if u8::try_from(baseline.bucket_status).ok() != Some(BucketState::Open as u8) {
            return Err(ServiceError::BucketUnavailable {
                bucket: bucket_id,
                reason: "the bucket is closed for new reservations",
            });
        }
        let id = self.ids.next_id().map_err(|e| ServiceError::Inconsistent {
            reservation_id: 0,
            reason: format!("snowflake: {e}"),
        })?;
        let expire_from = match (req.order_type, req.processing_time) {
            (OrderType::Scheduled, Some(p)) => p.max(now),
            _ => now,
        };
        let new = NewReservation {
            id,
            order_id: req.order_id,
            order_item_id: req.order_item_id,
            merchant_id: req.merchant_id,
            dish_id: req.dish_id,
            stock_bucket_id: bucket_id,
            stock_date: key.stock_date,
            quantity: req.quantity,
            order_type: if req.order_type == OrderType::Scheduled {
                2
            } else {
                1
            },
            processing_time: req.processing_time.map(|t| t.naive_utc()),
            expire_at: (expire_from + self.config.hold_ttl).naive_utc(),
            try_operation_id: rules::try_operation_id(id),
        };
        failpoint::hit("try.before_insert")?;
        match repo::insert_preparing(&self.pool, &new).await? {
            InsertOutcome::Inserted => {}
            // A concurrent duplicate of this Try inserted first.
            InsertOutcome::Existing(existing) => return self.repeat_try(*existing, req).await,
        }
        let row = self.load(id).await?;
        let row = self.run_step(row).await?;
        Ok(TryReply {
            reservation: ReservationView::from_row(&row),
            created: true,
        })
    }

    async fn repeat_try(
        &self,
        existing: Reservation,
        req: &TryRequest,
    ) -> Result<TryReply, ServiceError> {
        if existing.order_id != req.order_id
            || existing.merchant_id != req.merchant_id
            || existing.quantity != req.quantity
        {
            return Err(ServiceError::Invalid {
                field: "order_item_id",
                message: format!(
                    "item {} dish {} is already reserved as reservation {} with different order, merchant or quantity",
                    req.order_item_id, req.dish_id, existing.id
                ),
            });
        }
        let row = if existing.status()? == ReservationStatus::Preparing {
            self.run_step(existing).await?
        } else {
            existing
        };
        Ok(TryReply {
            reservation: ReservationView::from_row(&row),
            created: false,
        })
    }

    async fn load(&self, id: u64) -> Result<Reservation, ServiceError> {
        repo::find(&self.pool, id)
            .await?
            .ok_or(ServiceError::NotFound(id))
    }

    /// Instant `OrderCreated` and a due scheduled order.
    pub async fn confirm(&self, id: u64) -> Result<IntentOutcome, ServiceError> {
        self.apply(id, Intent::Confirm, None).await
    }

    /// Scheduled `OrderCreated`: RESERVED -> CREATED_RESERVED; no Redis step.
    pub async fn mark_created(&self, id: u64) -> Result<IntentOutcome, ServiceError> {
        self.apply(id, Intent::MarkCreated, None).await
    }

    /// `OrderCreatedFailed` only.
    pub async fn cancel(&self, id: u64) -> Result<IntentOutcome, ServiceError> {
        self.apply(id, Intent::Cancel, None).await
    }

    /// `OrderCanceled` (`refund_id` None: everything still held) or `RefundRequested`
    /// (`refund_id` and a quantity that may be partial but never exceeds what is held).
    pub async fn refund(
        &self,
        id: u64,
        refund_id: Option<&str>,
        quantity: Option<u32>,
    ) -> Result<IntentOutcome, ServiceError> {
        self.apply(
            id,
            if refund_id.is_some() {
                Intent::PartialRefund
            } else {
                Intent::Refund
            },
            Some((refund_id, quantity)),
        )
        .await
    }

    #[tracing::instrument(skip(self, refund), err)]
    async fn apply(
        &self,
        id: u64,
        intent: Intent,
        refund: Option<(Option<&str>, Option<u32>)>,
    ) -> Result<IntentOutcome, ServiceError> {
        let started = Instant::now();
        let result = self.apply_inner(id, intent, refund).await;
        let outcome = match &result {
            Ok(IntentOutcome::Done { already: true, .. }) => "already_done",
            Ok(IntentOutcome::Done { .. }) => "done",
            Ok(IntentOutcome::NotYet { .. }) => "not_yet",
            Ok(IntentOutcome::Conflict { .. }) => "conflict",
            Err(e) => error_label(e),
        };
        let op = format!("{intent:?}").to_lowercase();
        metrics::counter!(names::RESERVATION_OPERATIONS, "operation" => op.clone(), "outcome" => outcome)
            .increment(1);
        metrics::histogram!(names::RESERVATION_OPERATION_SECONDS, "operation" => op)
            .record(started.elapsed().as_secs_f64());
        result
    }

    async fn apply_inner(
        &self,
        id: u64,
        intent: Intent,
        refund: Option<(Option<&str>, Option<u32>)>,
    ) -> Result<IntentOutcome, ServiceError> {
        let refund_id = refund.and_then(|(r, _)| r);
        let requested_op = match intent {
            Intent::Confirm => rules::confirm_operation_id(id),
            Intent::Cancel => rules::cancel_operation_id(id),
            Intent::Refund | Intent::PartialRefund => rules::refund_operation_id(id, refund_id),
            Intent::MarkCreated => String::new(),
        };
        // A full refund (OrderCanceled) has no refund id of its own; refund ids from the
        // order service are never empty, so "" cannot collide with one.
        let refund_key = refund_id.unwrap_or("");
        for _ in 0..MAX_CAS_ROUNDS {
            let row = self.load(id).await?;
            let status = row.status()?;
            // A refund request that already committed returns its first result, whatever
            // happened to the row since (the refund row is written in the completing TX).
            let committed = matches!(intent, Intent::Refund | Intent::PartialRefund)
                && repo::find_refund(&self.pool, id, refund_key)
                    .await?
                    .is_some_and(|r| r.status != repo::REFUND_IN_PROGRESS);
            let decision = rules::decide_for_operation(
                status,
                intent,
                &row.current_operation_id,
                &requested_op,
                committed,
            );
            match decision {
                Decision::AlreadyDone => {
                    return Ok(IntentOutcome::Done {
                        reservation: Box::new(ReservationView::from_row(&row)),
                        already: true,
                    })
                }
                Decision::NotYet { status } => return Ok(IntentOutcome::NotYet { status }),
                Decision::Conflict { status, reason } => {
                    return Ok(IntentOutcome::Conflict { status, reason })
                }
                Decision::InProgress { .. } => {
                    let row = self.run_step(row).await?;
                    return Ok(IntentOutcome::Done {
                        reservation: Box::new(ReservationView::from_row(&row)),
                        already: false,
                    });
                }
                Decision::Start { to } => {
                    let started = match to {
                        ReservationStatus::CreatedReserved => {
                            let completion = Completion {
                                to,
                                expected_redis_version: None,
                                refunded_add: 0,
                                reject_reason: None,
                                outbox: Vec::new(),
                            };
                            if repo::complete_step(&self.pool, id, status, row.version, &completion)
                                .await?
                            {
                                return Ok(IntentOutcome::Done {
                                    reservation: Box::new(ReservationView::from_row(
                                        &self.load(id).await?,
                                    )),
                                    already: false,
                                });
                            }
                            false
                        }
                        ReservationStatus::Refunding => {
                            let held = row.held();
                            let quantity = refund.and_then(|(_, q)| q).unwrap_or(held);
                            if quantity == 0 || quantity > held {
                                return Err(ServiceError::OverRefund {
                                    reservation_id: id,
                                    asked: quantity,
                                    held,
                                });
                            }
                            let step = Step {
                                to,
                                operation_id: &requested_op,
                                pending_quantity: quantity,
                                resume_status: Some(status),
                            };
                            repo::begin_refund(&self.pool, &row, status, refund_key, &step).await?
                        }
                        _ => {
                            let step = Step {
                                to,
                                operation_id: &requested_op,
                                pending_quantity: if to == ReservationStatus::Canceling {
                                    row.quantity
                                } else {
                                    row.held()
                                },
                                resume_status: None,
                            };
                            let mut conn = self.pool.acquire().await?;
                            repo::begin_step(&mut conn, id, status, row.version, &step).await?
                        }
                    };
                    if started {
                        let row = self.run_step(self.load(id).await?).await?;
                        return Ok(IntentOutcome::Done {
                            reservation: Box::new(ReservationView::from_row(&row)),
                            already: false,
                        });
                    }
                    // Lost the CAS: another actor moved the row; decide again on what it is now.
                }
            }
        }
        Err(ServiceError::Inconsistent {
            reservation_id: id,
            reason: format!("still contended after {MAX_CAS_ROUNDS} CAS rounds"),
        })
    }

    /// Tells the order domain that `trigger_event_id` asked for something the reservation's
    /// state refuses (Confirm after Cancel, Cancel after OrderCreated, …): a lifecycle event
    /// of the state it is really in, with `reason_code` naming the conflict. Enqueued once
    /// per (trigger, reservation) however often the trigger is redelivered.
    pub async fn report_conflict(
        &self,
        id: u64,
        trigger_event_id: &str,
        reason_code: &str,
    ) -> Result<bool, ServiceError> {
        let row = self.load(id).await?;
        let op = format!("conflict_{trigger_event_id}_{id}");
        let mut event = match row.status()? {
            ReservationStatus::Canceling | ReservationStatus::Canceled => {
                outbox::canceled(&row, &op, false)
            }
            ReservationStatus::Confirming | ReservationStatus::Confirmed => {
                outbox::confirmed(&row, &op)
            }
            ReservationStatus::Refunding | ReservationStatus::Refunded => {
                outbox::refunded(&row, &op, row.refunded_quantity, None, false)
            }
            ReservationStatus::Rejected => outbox::rejected(&row, &op, reason_code, None),
            ReservationStatus::Preparing
            | ReservationStatus::Reserved
            | ReservationStatus::CreatedReserved => outbox::reserved(&row, &op),
        };
        event.payload["data"]["reason_code"] = serde_json::Value::String(reason_code.to_string());
        metrics::counter!(names::RESERVATION_CONFLICTS, "reason" => reason_code.to_string()).increment(1);
        let enqueued = repo::enqueue_once(&self.pool, &event).await?;
        if enqueued {
            self.outbox_committed();
        }
        Ok(enqueued)
    }

    /// Exponential backoff for the next recovery attempt of a row that failed `retry_count` times.
    fn retry_delay(&self, retry_count: u32) -> TimeDelta {
        let factor = 1i32 << retry_count.min(20);
        (self.config.recovery_delay * factor).min(self.config.recovery_max_delay)
    }

    /// Stuck (intermediate and failing or overdue) and dead reservations, oldest first.
    pub async fn list_stuck(
        &self,
        dead_only: bool,
        limit: u32,
    ) -> Result<Vec<StuckView>, ServiceError> {
        Ok(repo::list_stuck(&self.pool, dead_only, limit)
            .await?
            .iter()
            .map(StuckView::from_row)
            .collect())
    }

    /// An operator's "retry now": clears the dead mark and backoff, then resumes the step
    /// with its stored operation id (a finished row is returned as it is).
    pub async fn retry_now(&self, id: u64) -> Result<StuckView, ServiceError> {
        if !repo::revive(&self.pool, id).await? {
            return Err(ServiceError::NotFound(id));
        }
        let row = self.load(id).await?;
        let row = match self.run_step(row).await {
            Ok(row) => row,
            // The failure is recorded on the row (retry_count, last_error); show it.
            Err(e) if !matches!(e, ServiceError::Mysql(_)) => {
                tracing::warn!(reservation_id = id, error = %e, "operator retry failed");
                self.load(id).await?
            }
            Err(e) => return Err(e),
        };
        Ok(StuckView::from_row(&row))
    }

    /// Runs (or resumes) the Redis step of an intermediate status with its stored operation
    /// id and completes it in MySQL. This is also what the recovery worker calls.
    pub async fn resume(&self, id: u64) -> Result<ReservationView, ServiceError> {
        let row = self.load(id).await?;
        Ok(ReservationView::from_row(&self.run_step(row).await?))
    }

    async fn call_step(
        &self,
        status: ReservationStatus,
        keys: &BucketKeys,
        row: &Reservation,
    ) -> Result<OpResult, ExecError> {
        let op = row.current_operation_id.as_str();
        let backoff = ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(50))
            .with_max_delay(Duration::from_millis(500))
            .with_max_times(self.config.unknown_retries)
            .with_jitter();
        let call = || async {
            match status {
                ReservationStatus::Preparing => {
                    self.lua.try_reserve(keys, row.id, op, row.quantity).await
                }
                ReservationStatus::Confirming => self.lua.confirm(keys, row.id, op).await,
                ReservationStatus::Canceling => {
                    self.lua.cancel(keys, row.id, op, row.quantity).await
                }
                ReservationStatus::Refunding => {
                    self.lua
                        .refund(keys, row.id, op, row.pending_quantity)
                        .await
                }
                other => Err(ExecError::InvalidArgument(format!(
                    "no Redis step runs in {}",
                    other.name()
                ))),
            }
        };
        let call = || async { failpoint::reply_lost(status, op, call().await) };
        // UNKNOWN is retried with the same operation id: the op record turns an already
        // applied step into a replay of its first result, so a retry can never apply twice.
        call.retry(backoff)
            .when(|e: &ExecError| e.is_unknown())
            .notify(|e, after| {
                metrics::counter!(names::REDIS_UNKNOWN_OUTCOMES, "operation" => action_name(status)).increment(1);
                tracing::warn!(reservation_id = row.id, error = %e, ?after, "redis outcome unknown; retrying with the same operation id");
            })
            .await
    }

    async fn run_step(&self, row: Reservation) -> Result<Reservation, ServiceError> {
        let status = row.status()?;
        if !status.is_intermediate() {
            return Ok(row);
        }
        failpoint::at(status, Place::BeforeRedis)?;
        let keys = BucketKeys::new(row.merchant_id, row.dish_id, &row.stock_date.to_string())
            .map_err(|e| ServiceError::Inconsistent {
                reservation_id: row.id,
                reason: e.to_string(),
            })?;
        let mut result = self.call_step(status, &keys, &row).await;
        if status == ReservationStatus::Preparing
            && matches!(&result, Ok(r) if r.outcome == Outcome::BucketMissing)
        {
            match self.init_bucket(&row).await {
                Ok(true) => result = self.call_step(status, &keys, &row).await,
                // The day was closed before its bucket ever reached Redis: refuse the Try
                // as the script refuses one on a CLOSED bucket.
                Ok(false) => {
                    let completion = self.rejection(&row, "BUCKET_CLOSED", None);
                    if repo::complete_step(&self.pool, row.id, status, row.version, &completion)
                        .await?
                    {
                        self.outbox_committed();
                    }
                    return self.load(row.id).await;
                }
                Err(e) => {
                    // Counted like any failed step, so recovery backs off and, past its
                    // bound, marks the row dead and alerts instead of retrying for ever.
                    if !matches!(e, ServiceError::Mysql(_)) {
                        repo::record_failure(
                            &self.pool,
                            row.id,
                            status,
                            &e.to_string(),
                            self.retry_delay(row.retry_count),
                        )
                        .await?;
                    }
                    return Err(e);
                }
            }
        }
        let result = match result {
            Ok(r) => r,
            Err(e) => {
                let unknown = e.is_unknown();
                repo::record_failure(
                    &self.pool,
                    row.id,
                    status,
                    &e.to_string(),
                    self.retry_delay(row.retry_count),
                )
                .await?;
                return Err(if unknown {
                    ServiceError::OutcomeUnknown {
                        reservation_id: row.id,
                        status,
                        reason: e.to_string(),
                    }
                } else {
                    ServiceError::Inconsistent {
                        reservation_id: row.id,
                        reason: e.to_string(),
                    }
                });
            }
        };
        if status == ReservationStatus::Preparing && result.outcome == Outcome::Fenced {
            metrics::counter!(names::FENCE_HITS, "kind" => "hanging_prevented").increment(1);
        }
        if status == ReservationStatus::Canceling && result.empty_rollback {
            metrics::counter!(names::FENCE_HITS, "kind" => "empty_rollback").increment(1);
        }
        let completion = if status == ReservationStatus::Preparing
            && result.outcome == Outcome::BucketClosed
        {
            Some(self.rejection(&row, "BUCKET_CLOSED", None))
        } else {
            match rules::after_redis(status, opcode(result.outcome), fence_phase(&result)) {
                Next::Advance { to } => Some(self.completion(&row, status, to, &result).await?),
                Next::YieldToCancel => None,
                Next::RefundRefused { to } => Some(Completion {
                    to,
                    expected_redis_version: None,
                    refunded_add: 0,
                    reject_reason: None,
                    outbox: Vec::new(),
                }),
                Next::Inconsistent { reason } => {
                    repo::record_failure(
                        &self.pool,
                        row.id,
                        status,
                        reason,
                        self.retry_delay(row.retry_count),
                    )
                    .await?;
                    tracing::error!(reservation_id = row.id, reason, outcome = result.outcome.as_str(), phase = ?result.phase, "reservation inconsistent with its fence");
                    return Err(ServiceError::Inconsistent {
                        reservation_id: row.id,
                        reason: reason.to_string(),
                    });
                }
            }
        };
        if let Some(completion) = completion {
            failpoint::at(status, Place::BeforeCommit)?;
            let landed = if status == ReservationStatus::Refunding {
                repo::complete_refund(&self.pool, &row, &completion).await?
            } else {
                repo::complete_step(&self.pool, row.id, status, row.version, &completion).await?
            };
            if !landed {
                tracing::debug!(
                    reservation_id = row.id,
                    "completion lost its CAS; another actor finished first"
                );
            } else if !completion.outbox.is_empty() {
                self.outbox_committed();
            }
        }
        self.load(row.id).await
    }

    fn rejection(&self, row: &Reservation, reason: &str, available: Option<i64>) -> Completion {
        Completion {
            to: ReservationStatus::Rejected,
            expected_redis_version: None,
            refunded_add: 0,
            reject_reason: Some(reason.to_string()),
            outbox: vec![outbox::rejected(
                row,
                &row.current_operation_id,
                reason,
                available,
            )],
        }
    }

    async fn completion(
        &self,
        row: &Reservation,
        from: ReservationStatus,
        to: ReservationStatus,
        result: &OpResult,
    ) -> Result<Completion, ServiceError> {
        let op = row.current_operation_id.as_str();
        let version = Some(result.after.version);
        let q = |n: u32| i64::from(n);
        let (outbox, refunded_add) = match (from, to) {
            (ReservationStatus::Preparing, ReservationStatus::Rejected) => {
                return Ok(self.rejection(row, "INSUFFICIENT_STOCK", Some(result.after.available)));
            }
            (ReservationStatus::Preparing, _) => {
                let d = Deltas {
                    available: -q(row.quantity),
                    reserved: q(row.quantity),
                    sold: 0,
                };
                (
                    vec![
                        outbox::stock_change(
                            row,
                            StockAction::Try,
                            op,
                            row.quantity,
                            d,
                            result,
                            None,
                        ),
                        outbox::reserved(row, op),
                    ],
                    0,
                )
            }
            (ReservationStatus::Confirming, _) => {
                let held = row.held();
                let d = Deltas {
                    available: 0,
                    reserved: -q(held),
                    sold: q(held),
                };
                (
                    vec![
                        outbox::stock_change(row, StockAction::Confirm, op, held, d, result, None),
                        outbox::confirmed(row, op),
                    ],
                    0,
                )
            }
            (ReservationStatus::Canceling, _) => {
                let released = if result.empty_rollback {
                    0
                } else {
                    q(row.quantity)
                };
                let d = Deltas {
                    available: released,
                    reserved: -released,
                    sold: 0,
                };
                (
                    vec![
                        outbox::stock_change(
                            row,
                            StockAction::Cancel,
                            op,
                            row.quantity,
                            d,
                            result,
                            None,
                        ),
                        outbox::canceled(row, op, result.empty_rollback),
                    ],
                    0,
                )
            }
            (ReservationStatus::Refunding, _) => {
                let qty = row.pending_quantity;
                let from_sold = row.resume_status() == Some(ReservationStatus::Confirmed);
                let d = if from_sold {
                    Deltas {
                        available: q(qty),
                        reserved: 0,
                        sold: -q(qty),
                    }
                } else {
                    Deltas {
                        available: q(qty),
                        reserved: -q(qty),
                        sold: 0,
                    }
                };
                let refund_id = repo::find_refund_by_operation(&self.pool, op)
                    .await?
                    .map(|r| r.refund_key)
                    .filter(|k| !k.is_empty());
                (
                    vec![
                        outbox::stock_change(
                            row,
                            StockAction::Refund,
                            op,
                            qty,
                            d,
                            result,
                            refund_id.as_deref(),
                        ),
                        outbox::refunded(row, op, qty, refund_id.as_deref(), !from_sold),
                    ],
                    qty,
                )
            }
            _ => {
                return Err(ServiceError::Inconsistent {
                    reservation_id: row.id,
                    reason: format!("no completion from {} to {}", from.name(), to.name()),
                })
            }
        };
        Ok(Completion {
            to,
            expected_redis_version: version,
            refunded_add,
            reject_reason: None,
            outbox,
        })
    }

    /// Lazy initialisation when a Try finds no bucket in Redis: the same WAL row and Lua
    /// path as the daily job (never a direct SET from the request), keyed by bucket and
    /// baseline version, so twenty concurrent first Trys initialise once.
    /// False (nothing done) when the day is no longer OPEN.
    async fn init_bucket(&self, row: &Reservation) -> Result<bool, ServiceError> {
        let baseline = repo::find_baseline(&self.pool, &row.stock_bucket_id)
            .await?
            .ok_or_else(|| ServiceError::BucketNotFound(row.stock_bucket_id.clone()))?;
        if u8::try_from(baseline.bucket_status).ok() != Some(BucketState::Open as u8) {
            return Ok(false);
        }
        self.ops
            .ensure_bucket(&baseline)
            .await
            .map(|()| true)
            .map_err(|e| match e {
                OpsError::Mysql(e) => ServiceError::Mysql(e),
                OpsError::BucketLost { .. } => ServiceError::Inconsistent {
                    reservation_id: row.id,
                    reason: e.to_string(),
                },
                other => ServiceError::OutcomeUnknown {
                    reservation_id: row.id,
                    status: ReservationStatus::Preparing,
                    reason: format!("initialising bucket {}: {other}", baseline.stock_bucket_id),
                },
            })
    }
}

fn error_label(e: &ServiceError) -> &'static str {
    match e {
        ServiceError::Invalid { .. } => "invalid",
        ServiceError::NotFound(_) => "not_found",
        ServiceError::BucketNotFound(_) => "bucket_not_found",
        ServiceError::BucketUnavailable { .. } => "bucket_unavailable",
        ServiceError::OverRefund { .. } => "over_refund",
        ServiceError::OutcomeUnknown { .. } => "unknown",
        ServiceError::Mysql(_) => "mysql_error",
        ServiceError::Inconsistent { .. } => "inconsistent",
    }
}
