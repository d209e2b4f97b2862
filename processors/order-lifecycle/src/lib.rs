//! order-lifecycle processor on `order.lifecycle.v1`: OrderCreated confirms instant orders
//! and parks scheduled ones in CREATED_RESERVED; OrderCreatedFailed cancels every
//! reservation of the order (a Try that never reached Redis becomes an empty rollback);
//! OrderCanceled and RefundRequested refund (never cancel). A parked reservation is put on
//! the schedule's time wheel, which confirms it at its processing_time.
//!
//! Delivery: at-least-once through the shared consumer loop; effects are applied once
//! because every step is a CAS on the reservation state machine plus an idempotent Lua
//! operation, so a redelivered event finds its work done. Records of one order (key
//! order_id) stay in partition order, but correctness never depends on it: an event that
//! arrives too early (its Try still PREPARING) is retried in place, a conflicting one
//! (Confirm after Cancel) is reported to the order domain and not retried.

mod plan;

pub use plan::{plan, Known, Op, OrderEvent};

use futures::future::BoxFuture;
use futures::FutureExt;
use std::collections::HashMap;
use std::sync::Arc;
use stocksvr_core::events::{topics, EventKind};
use stocksvr_core::reservation::ReservationStatus;
use stocksvr_pipeline::config::KafkaSettings;
use stocksvr_pipeline::consumer::{Applied, Failure, Handler, LoopConfig, Record};
use stocksvr_reservation::{IntentOutcome, ReservationService, ServiceError};
use stocksvr_store::reservations::Reservation;
use stocksvr_store::wheel::TimeWheel;

pub const NAME: &str = "order-lifecycle";

pub fn loop_config(kafka: &KafkaSettings) -> LoopConfig {
    LoopConfig::new(NAME, vec![kafka.topic(topics::ORDER_LIFECYCLE)])
}

pub struct OrderLifecycle {
    service: Arc<ReservationService>,
    /// Where a parked scheduled reservation gets its timer; None: left to the schedule scan.
    wheel: Option<TimeWheel>,
}

impl OrderLifecycle {
    pub fn new(service: Arc<ReservationService>) -> Self {
        Self {
            service,
            wheel: None,
        }
    }

    /// Arms `wheel` for every scheduled reservation OrderCreated parks in CREATED_RESERVED
    /// (again on a redelivery, in case the first arm was lost; arming is idempotent).
    pub fn with_wheel(mut self, wheel: TimeWheel) -> Self {
        self.wheel = Some(wheel);
        self
    }

    fn decode(record: &Record) -> Result<OrderEvent, Failure> {
        let name = record.event.full_name.as_str();
        let invalid = |e: String| Failure::Invalid(format!("{name}: {e}"));
        let event = match EventKind::from_full_name(name) {
            Some(EventKind::OrderCreated) => OrderEvent::Created(
                record
                    .event
                    .clone()
                    .into_typed(name)
                    .map_err(|e| invalid(e.to_string()))?,
            ),
            Some(EventKind::OrderCreatedFailed) => OrderEvent::CreatedFailed(
                record
                    .event
                    .clone()
                    .into_typed(name)
                    .map_err(|e| invalid(e.to_string()))?,
            ),
            Some(EventKind::OrderCanceled) => OrderEvent::Canceled(
                record
                    .event
                    .clone()
                    .into_typed(name)
                    .map_err(|e| invalid(e.to_string()))?,
            ),
            Some(EventKind::RefundRequested) => OrderEvent::RefundRequested(
                record
                    .event
                    .clone()
                    .into_typed(name)
                    .map_err(|e| invalid(e.to_string()))?,
            ),
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
        check.map_err(|e| invalid(e.to_string()))?;
        Ok(event)
    }

    #[tracing::instrument(skip_all, fields(topic = record.topic(), partition = record.partition(), offset = record.offset(), event = %record.event.full_name, event_id, order_id))]
    async fn one(&self, record: &Record) -> Result<Applied, Failure> {
        let event = Self::decode(record)?;
        let span = tracing::Span::current();
        span.record("event_id", event.event_id());
        span.record("order_id", event.order_id());
        let order_id = u64::try_from(event.order_id())
            .map_err(|_| Failure::Invalid(format!("order id {} is not valid", event.order_id())))?;
        let rows = self.service.list_order(order_id).await.map_err(classify)?;
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
        let ops = plan(&event, &known).map_err(Failure::Invalid)?;
        let mut applied = Applied::Duplicate;
        for (id, op) in ops {
            let outcome = match &op {
                Op::Confirm => self.service.confirm(id).await,
                Op::MarkCreated => self.service.mark_created(id).await,
                Op::Cancel => self.service.cancel(id).await,
                Op::Refund {
                    refund_id,
                    quantity,
                } => {
                    self.service
                        .refund(id, refund_id.as_deref(), *quantity)
                        .await
                }
            }
            .map_err(classify)?;
            if let (Op::MarkCreated, IntentOutcome::Done { reservation, .. }, Some(wheel)) =
                (&op, &outcome, &self.wheel)
            {
                arm_created(wheel, reservation).await;
            }
            match outcome {
                IntentOutcome::Done { already: false, .. } => applied = Applied::Applied,
                IntentOutcome::Done { already: true, .. } => {}
                // The Try (or a refund) has not settled yet: retry in place; the recovery
                // worker settles it, and this event then applies.
                IntentOutcome::NotYet { status } => {
                    return Err(Failure::Retryable(format!(
                        "reservation {id} is {} and cannot take {} yet",
                        status.name(),
                        op.name()
                    )))
                }
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
                        .map_err(classify)?;
                    if applied == Applied::Duplicate {
                        applied = Applied::Conflict;
                    }
                }
            }
        }
        Ok(applied)
    }
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
    metrics::counter!(stocksvr_telemetry::names::SCHEDULE_ARMED, "source" => "order_created", "outcome" => outcome).increment(1);
}

/// Service errors into the loop's three classes.
fn classify(e: ServiceError) -> Failure {
    match e {
        ServiceError::Invalid { .. }
        | ServiceError::OverRefund { .. }
        | ServiceError::NotFound(_) => Failure::Invalid(e.to_string()),
        ServiceError::BucketNotFound(_) | ServiceError::BucketUnavailable { .. } => {
            Failure::Invalid(e.to_string())
        }
        // Redis/MySQL unavailable, or a row that needs the recovery worker: retry, then DLT.
        ServiceError::OutcomeUnknown { .. }
        | ServiceError::Mysql(_)
        | ServiceError::Inconsistent { .. } => Failure::Retryable(e.to_string()),
    }
}

impl Handler for OrderLifecycle {
    fn handle<'a>(
        &'a self,
        batch: &'a [Record],
    ) -> BoxFuture<'a, Result<Vec<Result<Applied, Failure>>, Failure>> {
        async move {
            let mut results = Vec::with_capacity(batch.len());
            for record in batch {
                results.push(self.one(record).await);
            }
            Ok(results)
        }
        .boxed()
    }
}
