//! Confirm, MarkCreated, Cancel and Refund (docs/design.md, Confirm, Cancel, Refund): read
//! the row, decide what the intent means in its status, CAS into the intermediate status with
//! the step's operation id, run the step. A lost CAS means another actor moved the row:
//! decide again. One entry point per intent; each takes a [`Target`], the reservation's id or
//! a row its caller has just read.

use super::{error_label, IntentOutcome, ReservationService};
use crate::error::ServiceError;
use crate::outbox;
use std::time::Instant;
use stocksvr_core::reservation::{self as rules, Decision, Intent, ReservationStatus};
use stocksvr_store::reservations::{self as repo, Begin, Completion, Reservation, Step};
use stocksvr_telemetry::names;

/// A refund's id (None for a full refund) and quantity (None: everything still held).
type Refund<'a> = (Option<&'a str>, Option<u32>);

/// The step an intent starts: from the status it was decided on into `to`.
struct Started<'a> {
    from: ReservationStatus,
    to: ReservationStatus,
    operation_id: &'a str,
    /// The refund row's key ("" for a full refund).
    refund_key: &'a str,
    /// A refund's quantity; None refunds everything still held.
    quantity: Option<u32>,
}

/// CAS races are bounded: each lost race means another actor moved the row, and a handful
/// of moves exhausts every path through the state machine.
const MAX_CAS_ROUNDS: usize = 8;

/// The reservation an intent applies to: its id (the service reads the row), or a row the
/// caller has just read (the reservations of a batch's orders, read at once), on which the
/// first decision is taken instead of reading it again. A stale row only costs a lost CAS,
/// after which the row is read and the intent decided again.
#[derive(Debug, Clone, PartialEq)]
pub enum Target {
    Id(u64),
    Read(Box<Reservation>),
}

impl Target {
    pub fn id(&self) -> u64 {
        match self {
            Target::Id(id) => *id,
            Target::Read(row) => row.id,
        }
    }
}

impl From<u64> for Target {
    fn from(id: u64) -> Self {
        Target::Id(id)
    }
}

impl From<Reservation> for Target {
    fn from(row: Reservation) -> Self {
        Target::Read(Box::new(row))
    }
}

impl ReservationService {
    /// Instant `OrderCreated` and a due scheduled order.
    pub async fn confirm(&self, target: impl Into<Target>) -> Result<IntentOutcome, ServiceError> {
        self.apply(target.into(), Intent::Confirm, None).await
    }

    /// Scheduled `OrderCreated`: RESERVED -> CREATED_RESERVED; no Redis step.
    pub async fn mark_created(
        &self,
        target: impl Into<Target>,
    ) -> Result<IntentOutcome, ServiceError> {
        self.apply(target.into(), Intent::MarkCreated, None).await
    }

    /// `OrderCreatedFailed` only.
    pub async fn cancel(&self, target: impl Into<Target>) -> Result<IntentOutcome, ServiceError> {
        self.apply(target.into(), Intent::Cancel, None).await
    }

    /// `OrderCreatedFailed`: the order failed. In one transaction the order fence is written
    /// (a Try of the order that has not reached MySQL yet will be refused, see the Try path)
    /// and every reservation of the order that can still be cancelled (PREPARING, RESERVED)
    /// moves to CANCELING; then each reservation's cancel runs, or reports why it cannot (a
    /// scheduled order already created, say). Returns each reservation's outcome: an error
    /// there (its bucket lost in Redis, say) leaves that reservation CANCELING for the
    /// recovery worker; the fence and the decision are committed either way.
    pub async fn fail_order(
        &self,
        order_id: u64,
        event_id: &str,
        reason: Option<&str>,
    ) -> Result<Vec<(u64, Result<IntentOutcome, ServiceError>)>, ServiceError> {
        // A Try inserting concurrently can deadlock with this transaction; the loser is
        // rolled back whole and runs again.
        let rows = stocksvr_store::retry::on_lock_conflict(3, || {
            self.fence_and_decide(order_id, event_id, reason)
        })
        .await?;
        let mut outcomes = Vec::with_capacity(rows.len());
        for row in rows {
            outcomes.push((row.id, self.cancel(row.id).await));
        }
        Ok(outcomes)
    }

    /// The order fence and the cancel decision of every cancellable reservation of the
    /// order, in one transaction; returns the order's reservations as they were locked.
    async fn fence_and_decide(
        &self,
        order_id: u64,
        event_id: &str,
        reason: Option<&str>,
    ) -> Result<Vec<stocksvr_store::reservations::Reservation>, sqlx::Error> {
        use stocksvr_store::deadline::Deadline;
        use stocksvr_store::order_events;
        let mut tx = stocksvr_store::deadline::begin(&self.pool).await?;
        order_events::fence_order(&mut tx, order_id, event_id, reason).await?;
        let rows = order_events::lock_order(&mut tx, order_id).await?;
        for row in &rows {
            let status = row
                .status()
                .map_err(|e| sqlx::Error::Decode(e.to_string().into()))?;
            if matches!(
                status,
                ReservationStatus::Preparing | ReservationStatus::Reserved
            ) {
                let op = rules::cancel_operation_id(row.id);
                let step = Step {
                    to: ReservationStatus::Canceling,
                    operation_id: &op,
                    pending_quantity: row.quantity,
                    resume_status: None,
                };
                repo::begin_step(&mut tx, row.id, status, row.version, &step).await?;
            }
        }
        tx.commit().deadline().await?;
        Ok(rows)
    }

    /// `OrderCanceled` (`refund_id` None: everything still held) or `RefundRequested`
    /// (`refund_id` and a quantity that may be partial but never exceeds what is held).
    pub async fn refund(
        &self,
        target: impl Into<Target>,
        refund_id: Option<&str>,
        quantity: Option<u32>,
    ) -> Result<IntentOutcome, ServiceError> {
        let intent = if refund_id.is_some() {
            Intent::PartialRefund
        } else {
            Intent::Refund
        };
        self.apply(target.into(), intent, Some((refund_id, quantity)))
            .await
    }

    #[tracing::instrument(skip(self, target, refund), fields(reservation_id = target.id(), ?intent), err)]
    async fn apply(
        &self,
        target: Target,
        intent: Intent,
        refund: Option<Refund<'_>>,
    ) -> Result<IntentOutcome, ServiceError> {
        let started = Instant::now();
        let result = self.apply_inner(target, intent, refund).await;
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
        target: Target,
        intent: Intent,
        refund: Option<Refund<'_>>,
    ) -> Result<IntentOutcome, ServiceError> {
        let id = target.id();
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
        let mut read = match target {
            Target::Read(row) => Some(*row),
            Target::Id(_) => None,
        };
        for _ in 0..MAX_CAS_ROUNDS {
            // The caller's row for the first decision only: after a lost CAS it is stale.
            let row = match read.take() {
                Some(row) => row,
                None => self.load(id).await?,
            };
            let status = row.status()?;
            // A step that already committed returns its first result, whatever happened to
            // the row since: a refund by its refund row, an OrderCreated by the milestone its
            // CAS set (both written in the completing TX), so a replayed event is done, not
            // judged again against a later state.
            let committed = match intent {
                Intent::Refund | Intent::PartialRefund => {
                    stocksvr_store::refunds::find_refund(&self.pool, id, refund_key)
                        .await?
                        .is_some_and(|r| r.settled())
                }
                Intent::Confirm | Intent::MarkCreated | Intent::Cancel => {
                    rules::Reached::from_bits(row.reached).committed(intent)
                }
            };
            let decision = rules::decide_for_operation(
                status,
                intent,
                &row.current_operation_id,
                &requested_op,
                committed,
            );
            let done = |row, already| IntentOutcome::Done {
                reservation: Box::new(row),
                already,
            };
            match decision {
                Decision::AlreadyDone => return Ok(done(row, true)),
                Decision::NotYet { status } => return Ok(IntentOutcome::NotYet { status }),
                Decision::Conflict { status, reason } => {
                    return Ok(IntentOutcome::Conflict { status, reason })
                }
                Decision::InProgress { .. } => return Ok(done(self.run_step(row).await?, false)),
                Decision::Start { to } => {
                    let step = Started {
                        from: status,
                        to,
                        operation_id: &requested_op,
                        refund_key,
                        quantity: refund.and_then(|(_, q)| q),
                    };
                    if let Some(row) = self.start(row, step).await? {
                        return Ok(done(row, false));
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

    /// Moves `row` into `step.to` with one CAS and runs the step that follows (MarkCreated
    /// has none: its CAS is its completion). None when the CAS was lost: another actor moved
    /// the row first.
    async fn start(
        &self,
        row: Reservation,
        step: Started<'_>,
    ) -> Result<Option<Reservation>, ServiceError> {
        let started = match step.to {
            ReservationStatus::CreatedReserved => {
                let completion = Completion {
                    to: step.to,
                    expected_redis_version: None,
                    refunded_add: 0,
                    reject_reason: None,
                    outbox: Vec::new(),
                };
                return self.complete_grouped(row, &completion).await;
            }
            ReservationStatus::Refunding => self.begin_refund(row, &step).await?,
            to => {
                let pending_quantity = if to == ReservationStatus::Canceling {
                    row.quantity
                } else {
                    row.held()
                };
                self.begin_grouped(Begin {
                    row,
                    to,
                    operation_id: step.operation_id.to_string(),
                    pending_quantity,
                    resume_status: None,
                })
                .await?
            }
        };
        match started {
            Some(row) => Ok(Some(self.run_step(row).await?)),
            None => Ok(None),
        }
    }

    /// The CAS into REFUNDING, with the refund row that keeps the request's first answer;
    /// a quantity beyond what the reservation still holds is refused before anything moves.
    async fn begin_refund(
        &self,
        row: Reservation,
        step: &Started<'_>,
    ) -> Result<Option<Reservation>, ServiceError> {
        let held = row.held();
        let quantity = step.quantity.unwrap_or(held);
        if quantity == 0 || quantity > held {
            return Err(ServiceError::OverRefund {
                reservation_id: row.id,
                asked: quantity,
                held,
            });
        }
        let cas = Step {
            to: step.to,
            operation_id: step.operation_id,
            pending_quantity: quantity,
            resume_status: Some(step.from),
        };
        if stocksvr_store::refunds::begin_refund(&self.pool, &row, step.from, step.refund_key, &cas)
            .await?
        {
            Ok(Some(self.load(row.id).await?))
        } else {
            Ok(None)
        }
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
        metrics::counter!(names::RESERVATION_CONFLICTS, "reason" => reason_code.to_string())
            .increment(1);
        let enqueued = stocksvr_store::outbox::enqueue_once(&self.pool, &event).await?;
        if enqueued {
            self.outbox_committed();
        }
        Ok(enqueued)
    }
}
