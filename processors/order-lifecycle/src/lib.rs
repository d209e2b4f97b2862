//! order-lifecycle processor on `order.lifecycle.v1`: OrderCreated confirms instant orders
//! and parks scheduled ones in CREATED_RESERVED; OrderCreatedFailed fails the order (the
//! order fence, then a cancel of every reservation it holds; a Try that never reached Redis
//! becomes an empty rollback, one that arrives later is refused); OrderCanceled and
//! RefundRequested refund (never cancel). A parked reservation is put on the schedule's time
//! wheel, which confirms it at its processing_time.
//!
//! Delivery: at-least-once through the shared consumer loop; effects are applied once
//! because every step is a CAS on the reservation state machine plus an idempotent Lua
//! operation, and a replay of the topic is recognised by what the first delivery wrote
//! instead of being judged again against a later state: an OrderCreated by the milestone
//! its CAS set in the reservation (`reached`), a refund by its refund row, a failed order by
//! its fence, a parked event by its origin, a conflict report by its event id. No row is
//! written per event for that; inbox rows written by earlier versions are still read.
//!
//! Order: records of one order (key order_id) are handled in partition order, but an event
//! that cannot apply *yet* (a RefundRequested before its OrderCreated, an OrderCreated while
//! its Try is still PREPARING) does not hold the partition: it is parked durably and applied
//! as soon as the state it waits for is reached: right after the order's next event applies,
//! or by the re-driver with backoff. Only an event that can never apply is dead-lettered; a
//! conflicting one (Confirm after Cancel) is reported to the order domain and not retried.

mod batch;
#[cfg(test)]
mod decode_fuzz;
mod plan;

pub use plan::{plan, Known, Op, OrderEvent};

use batch::{usable_batch_rows, BatchState};
use chrono::TimeDelta;
use futures::future::BoxFuture;
use futures::FutureExt;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use stocksvr_core::events::{topics, EventKind};
use stocksvr_core::reservation::ReservationStatus;
use stocksvr_pipeline::config::KafkaSettings;
use stocksvr_pipeline::consumer::{self, Applied, Failure, Handler, LoopConfig, Record};
use stocksvr_pipeline::periodic::{self, Cadence, Round};
use stocksvr_reservation::{IntentOutcome, ReservationService, ServiceError, Target};
use stocksvr_store::order_events::{self, DeferredStatus, NewDeferred};
use stocksvr_store::reservations::Reservation;
use stocksvr_store::wheel::TimeWheel;
use stocksvr_telemetry::names;
use tokio::sync::{watch, Notify};

pub const NAME: &str = "order-lifecycle";

/// Order events handed to the handler at once, and how many orders of them are handled at
/// the same time (an order's own events stay in sequence). One order at a time caps the
/// processor at one order's round trips (about 6 ms: 164 confirms/s on the bench machine).
/// An order holds at most one MySQL connection at a time, and only for its own reads: its
/// writes (the step CAS, the completion) wait in group-commit queues, whose
/// groups hold the connections. So sixteen orders at once stay inside the MySQL pool
/// (`mysql.max_connections`, 16) that the Try API shares in `stocksvr all`, and the more
/// orders wait in a queue the larger (and fewer) the groups. An order event handled again
/// after a cut batch changes nothing (see the module's delivery note).
pub const MAX_BATCH: usize = 64;
pub const CONCURRENT_ORDERS: usize = 16;

pub fn loop_config(kafka: &KafkaSettings) -> LoopConfig {
    LoopConfig {
        max_batch: MAX_BATCH,
        ..LoopConfig::new(NAME, vec![kafka.topic(topics::ORDER_LIFECYCLE)])
    }
}

/// The consumer group, which is also the inbox's and the parked events' `consumer_group`.
pub fn group_name(kafka: &KafkaSettings) -> String {
    format!("{}.{NAME}", kafka.group_prefix)
}

/// First delay before a parked event is tried again by the re-driver; doubles per attempt.
const FIRST_RETRY: TimeDelta = TimeDelta::seconds(1);
/// Longest delay between two re-drives of a parked event.
const MAX_RETRY: TimeDelta = TimeDelta::seconds(300);

pub struct OrderLifecycle {
    service: Arc<ReservationService>,
    group: String,
    /// Where a parked scheduled reservation gets its timer; None: left to the schedule scan.
    wheel: Option<TimeWheel>,
    /// Woken when an event is parked, so the re-driver polls from its shortest sleep again.
    /// What an event waits for is often finished by another actor (a scheduled confirm, the
    /// recovery worker) a moment later, and a re-driver backed off to its longest sleep
    /// would leave the event parked for up to that long after nothing held it any more.
    parked: Notify,
}

/// What applying one event came to.
#[derive(Debug, Clone, PartialEq)]
enum Outcome {
    Settled(Applied),
    /// It cannot apply yet; the reason names what it waits for.
    Wait(String),
}

impl OrderLifecycle {
    pub fn new(service: Arc<ReservationService>, group: impl Into<String>) -> Self {
        Self {
            service,
            group: group.into(),
            wheel: None,
            parked: Notify::new(),
        }
    }

    /// Arms `wheel` for every scheduled reservation OrderCreated parks in CREATED_RESERVED
    /// (again on a redelivery, in case the first arm was lost; arming is idempotent).
    pub fn with_wheel(mut self, wheel: TimeWheel) -> Self {
        self.wheel = Some(wheel);
        self
    }

    /// The processor's decode step: the typed order event of `record`, or why it is invalid
    /// (a dead letter). Pure; public so one test can run every example through it.
    pub fn decode(record: &Record) -> Result<OrderEvent, Failure> {
        let name = record.event.full_name.as_str();
        let event = match EventKind::from_full_name(name) {
            Some(EventKind::OrderCreated) => OrderEvent::Created(record.typed()?),
            Some(EventKind::OrderCreatedFailed) => OrderEvent::CreatedFailed(record.typed()?),
            Some(EventKind::OrderCanceled) => OrderEvent::Canceled(record.typed()?),
            Some(EventKind::RefundRequested) => OrderEvent::RefundRequested(record.typed()?),
            _ => {
                return Err(Failure::Invalid(format!(
                    "{name} is not an order lifecycle event"
                )))
            }
        };
        let check = match &event {
            OrderEvent::Created(e) => e.check(name),
            OrderEvent::CreatedFailed(e) => e.check(name),
            OrderEvent::Canceled(e) => e.check(name),
            OrderEvent::RefundRequested(e) => e.check(name),
        };
        check.map_err(|e| Failure::Invalid(format!("{name}: {e}")))?;
        Ok(event)
    }

    pub(crate) fn order_id(event: &OrderEvent) -> Result<u64, Failure> {
        stocksvr_core::ids::check_id(u64::try_from(event.order_id()).unwrap_or(0))
            .map_err(|e| Failure::Invalid(format!("order_id {}: {e}", event.order_id())))
    }

    #[tracing::instrument(skip_all, fields(topic = record.topic(), partition = record.partition(), offset = record.offset(), event = %record.event.full_name, event_id, order_id))]
    async fn one(&self, record: &Record, batch: &BatchState<'_>) -> Result<Applied, Failure> {
        let event = batch.take_event(record)?;
        let span = tracing::Span::current();
        span.record("event_id", event.event_id());
        span.record("order_id", event.order_id());
        let order_id = Self::order_id(&event)?;
        let pool = self.service.pool();
        if batch.handled(event.event_id()) {
            return Ok(Applied::Duplicate);
        }
        let applied = match self
            .apply(&event, order_id, batch.take_rows(order_id))
            .await?
        {
            Outcome::Settled(applied) => applied,
            Outcome::Wait(waiting_for) => {
                let parked = order_events::defer(
                    pool,
                    &NewDeferred {
                        consumer_group: &self.group,
                        order_id,
                        event_id: event.event_id(),
                        event_name: event.name(),
                        topic: record.topic(),
                        partition: record.partition(),
                        offset: record.offset(),
                        event: &event.to_json(),
                        waiting_for: &waiting_for,
                        first_retry: FIRST_RETRY,
                    },
                )
                .await
                .map_err(|e| Failure::from_sqlx(&e))?;
                batch.note_parked(order_id);
                if parked {
                    self.parked.notify_one();
                    tracing::info!(
                        order_id,
                        event_id = event.event_id(),
                        waiting_for,
                        "order event cannot apply yet: parked until its predecessor"
                    );
                }
                Applied::Deferred
            }
        };
        batch.note_handled(event.event_id());
        if applied != Applied::Deferred && batch.has_parked(order_id) {
            // This event may be what a parked one of the order waits for.
            self.redrive(order_id).await?;
        }
        Ok(applied)
    }

    /// Applies `event` to its order's reservations; `read`: its rows as the batch read them
    /// (None: read them now).
    async fn apply(
        &self,
        event: &OrderEvent,
        order_id: u64,
        read: Option<Vec<Reservation>>,
    ) -> Result<Outcome, Failure> {
        let rows = match usable_batch_rows(read, |r| r.status().ok()) {
            // Any row but a PREPARING one is safe to decide on: a step from it is a CAS that
            // reads the row again if lost.
            Some(rows) => rows,
            // No row yet, or a Try still PREPARING, when the batch was read: read again
            // rather than park the event on what may have moved since.
            None => self
                .service
                .list_order(order_id)
                .await
                .map_err(|e| e.failure())?,
        };
        let mut read: HashMap<u64, Reservation> = HashMap::with_capacity(rows.len());
        let known: HashMap<u64, Known> = rows
            .iter()
            .map(|r| {
                (
                    r.id,
                    Known {
                        merchant_id: r.merchant_id,
                        order_type: r.order_type(),
                    },
                )
            })
            .collect();
        read.extend(rows.into_iter().map(|r| (r.id, r)));
        let ops = plan(event, &known).map_err(Failure::Invalid)?;
        let outcomes: Vec<(u64, Op, Result<IntentOutcome, ServiceError>)> = match event {
            // The order fails as a whole: fence and cancel decisions in one transaction.
            OrderEvent::CreatedFailed(e) => {
                match self
                    .service
                    .fail_order(order_id, &e.event_id, e.data.reason.as_deref())
                    .await
                {
                    Ok(outcomes) => outcomes
                        .into_iter()
                        .map(|(id, o)| (id, Op::Cancel, o))
                        .collect(),
                    Err(e) => return Err(e.failure()),
                }
            }
            // The reservations of one order are independent of each other: their steps run
            // at once, so they also share the step groups. Confirm and MarkCreated decide
            // first on the rows just read (a lost CAS reads them again); a Cancel or a Refund
            // reads its row afresh.
            _ => {
                futures::future::join_all(ops.into_iter().map(|(id, op)| {
                    let target = match (&op, read.remove(&id)) {
                        (Op::Confirm | Op::MarkCreated, Some(row)) => Target::from(row),
                        _ => Target::Id(id),
                    };
                    async move {
                        let result = match &op {
                            Op::Confirm => self.service.confirm(target).await,
                            Op::MarkCreated => self.service.mark_created(target).await,
                            Op::Cancel => self.service.cancel(target).await,
                            Op::Refund {
                                refund_id,
                                quantity,
                            } => {
                                self.service
                                    .refund(target, refund_id.as_deref(), *quantity)
                                    .await
                            }
                        };
                        (id, op, result)
                    }
                }))
                .await
            }
        };
        let mut applied = Applied::Duplicate;
        let mut waiting = Vec::new();
        for (id, op, result) in outcomes {
            let outcome = match result {
                Ok(outcome) => outcome,
                // The stores disagree on this reservation: the recovery worker owns it now
                // (it settles it or marks it dead and alerts); the event waits for it.
                Err(e @ (ServiceError::Inconsistent { .. } | ServiceError::BucketLost { .. })) => {
                    waiting.push(format!("reservation {id}: {e}"));
                    continue;
                }
                Err(e) => return Err(e.failure()),
            };
            if let (Op::MarkCreated, IntentOutcome::Done { reservation, .. }, Some(wheel)) =
                (&op, &outcome, &self.wheel)
            {
                arm_created(wheel, reservation).await;
            }
            match outcome {
                IntentOutcome::Done { already: false, .. } => applied = Applied::Applied,
                IntentOutcome::Done { already: true, .. } => {}
                IntentOutcome::NotYet { status } => waiting.push(format!(
                    "reservation {id} is {} and cannot take {} yet",
                    status.name(),
                    op.name()
                )),
                IntentOutcome::Conflict { status, reason } => {
                    let code = format!("CONFLICT_{}_IN_{}", op.name(), status.name());
                    tracing::warn!(
                        reservation_id = id,
                        event_id = event.event_id(),
                        reason,
                        code,
                        "conflicting order event"
                    );
                    self.service
                        .report_conflict(id, event.event_id(), &code)
                        .await
                        .map_err(|e| e.failure())?;
                    if applied == Applied::Duplicate {
                        applied = Applied::Conflict;
                    }
                }
            }
        }
        Ok(if waiting.is_empty() {
            Outcome::Settled(applied)
        } else {
            Outcome::Wait(waiting.join("; "))
        })
    }

    /// Applies the parked events of `order_id`, oldest first. Each one applies now (it is
    /// settled), is reported as a conflict, or keeps waiting with its next attempt backed off.
    /// Returns how many were settled.
    pub async fn redrive(&self, order_id: u64) -> Result<usize, Failure> {
        let pool = self.service.pool();
        let parked = order_events::waiting_of_order(pool, &self.group, order_id)
            .await
            .map_err(|e| Failure::from_sqlx(&e))?;
        let mut settled = 0;
        for d in parked {
            let event = match OrderEvent::from_json(&d.event_name, d.event_json.clone()) {
                Ok(event) => event,
                Err(reason) => {
                    // Written by this code, so this is a bug; keep it out of every round.
                    tracing::error!(deferred_id = d.id, reason, "parked order event unreadable");
                    order_events::settle(pool, d.id, DeferredStatus::Reported)
                        .await
                        .map_err(|e| Failure::from_sqlx(&e))?;
                    continue;
                }
            };
            let outcome = match self.apply(&event, order_id, None).await {
                Ok(outcome) => outcome,
                // Can never apply (the order's reservations changed under it): report it as
                // settled; it was dead-letter material only once it could not wait any more.
                Err(Failure::Invalid(reason)) => {
                    tracing::warn!(deferred_id = d.id, event_id = %d.event_id, reason, "parked order event can no longer apply");
                    Outcome::Settled(Applied::Conflict)
                }
                Err(other) => return Err(other),
            };
            match outcome {
                Outcome::Settled(applied) => {
                    let status = if applied == Applied::Conflict {
                        DeferredStatus::Reported
                    } else {
                        DeferredStatus::Applied
                    };
                    order_events::settle(pool, d.id, status)
                        .await
                        .map_err(|e| Failure::from_sqlx(&e))?;
                    settled += 1;
                    tracing::info!(order_id, event_id = %d.event_id, waited_s = (chrono::Utc::now().naive_utc() - d.created_at).num_milliseconds() as f64 / 1000.0, "parked order event applied");
                }
                Outcome::Wait(waiting_for) => {
                    let delay =
                        stocksvr_core::backoff::jittered_delta(d.attempts, FIRST_RETRY, MAX_RETRY);
                    order_events::retry_later(pool, d.id, delay, &waiting_for)
                        .await
                        .map_err(|e| Failure::from_sqlx(&e))?;
                }
            }
        }
        Ok(settled)
    }

    /// One round of the re-driver: the orders whose parked events are due, and the gauges.
    pub async fn redrive_due(&self, orders: u32) -> Result<Round, Failure> {
        let pool = self.service.pool();
        let due = order_events::due_orders(pool, &self.group, orders)
            .await
            .map_err(|e| Failure::from_sqlx(&e))?;
        for order_id in &due {
            self.redrive(*order_id).await?;
        }
        let (waiting, oldest) = order_events::waiting_summary(pool, &self.group)
            .await
            .map_err(|e| Failure::from_sqlx(&e))?;
        metrics::gauge!(names::ORDER_EVENTS_DEFERRED).set(waiting as f64);
        let age = oldest
            .map(|t| {
                (chrono::Utc::now().naive_utc() - t)
                    .num_milliseconds()
                    .max(0) as f64
                    / 1000.0
            })
            .unwrap_or(0.0);
        metrics::gauge!(names::ORDER_EVENTS_DEFERRED_OLDEST_SECONDS).set(age);
        Ok(match due.len() {
            n if n >= orders as usize => Round::Full,
            0 => Round::Empty,
            _ => Round::Partial,
        })
    }
}

/// Handled as a [`stocksvr_pipeline::consumer::RecordHandler`] would be (an order's events
/// in partition order, `CONCURRENT_ORDERS` orders at once), after the batch's records are
/// decoded once and one inbox query, one parked-events query and one read of the batch's
/// orders' reservations are made for the whole batch (see `batch`).
impl Handler for OrderLifecycle {
    fn handle<'a>(
        &'a self,
        batch: &'a [Record],
    ) -> BoxFuture<'a, Result<Vec<Result<Applied, Failure>>, Failure>> {
        async move {
            let state = BatchState::read(batch, &self.service, &self.group).await?;
            let state = &state;
            Ok(consumer::by_key(batch, CONCURRENT_ORDERS, |record| self.one(record, state)).await)
        }
        .boxed()
    }
}

/// Re-drives parked order events until `stop`: every half second while some are due, backing
/// off to 30 s while none are (an order's own next event re-drives it at once anyway); an
/// event parked in this process starts it from the half second again.
pub async fn run_redriver(
    handler: Arc<OrderLifecycle>,
    stop: watch::Receiver<bool>,
) -> Result<(), Failure> {
    let cadence = Cadence::adaptive(Duration::from_millis(500), Duration::from_secs(30));
    periodic::run(
        "deferred order events",
        cadence,
        Some(&handler.parked),
        stop,
        || async {
            Ok(match handler.redrive_due(100).await {
                Ok(round) => round,
                Err(Failure::Fatal(reason)) => return Err(Failure::Fatal(reason)),
                Err(e) => {
                    tracing::warn!(failure = ?e, "re-driving parked order events failed; retrying");
                    Round::Failed
                }
            })
        },
    )
    .await
}

/// Puts a reservation that OrderCreated just parked (or found parked, on a redelivery) on
/// the wheel. Failures are logged and counted, never returned: the OrderCreated is applied
/// either way, and the load-ahead re-arms the entry or the scan confirms the reservation.
pub async fn arm_created(wheel: &TimeWheel, reservation: &Reservation) {
    if reservation.status().ok() != Some(ReservationStatus::CreatedReserved) {
        return;
    }
    let reservation_id = reservation.id;
    let Some(due) = reservation.processing_time.map(|t| t.and_utc()) else {
        tracing::warn!(
            reservation_id,
            "scheduled reservation without a processing_time; left to the scan"
        );
        return;
    };
    let outcome = match wheel.arm(reservation_id, due).await {
        Ok(true) => "added",
        Ok(false) => "present",
        Err(e) => {
            tracing::warn!(reservation_id, error = %e, "arming the time wheel failed; the load-ahead or the scan covers it");
            "failed"
        }
    };
    metrics::counter!(names::SCHEDULE_ARMED, "source" => "order_created", "outcome" => outcome)
        .increment(1);
}
