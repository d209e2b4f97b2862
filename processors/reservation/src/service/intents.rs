//! Confirm, MarkCreated, Cancel and Refund (seed §8, §9): read the row, decide what the
//! intent means in its status, CAS into the intermediate status with the step's operation
//! id, run the step. A lost CAS means another actor moved the row: decide again.

use super::{error_label, IntentOutcome, ReservationService};
use crate::error::ServiceError;
use crate::outbox;
use std::time::Instant;
use stocksvr_core::reservation::{self as rules, Decision, Intent, ReservationStatus};
use stocksvr_store::reservations::{self as repo, Begin, Completion, Reservation, Step};
use stocksvr_telemetry::names;

/// CAS races are bounded: each lost race means another actor moved the row, and a handful
/// of moves exhausts every path through the state machine.
const MAX_CAS_ROUNDS: usize = 8;

impl ReservationService {
    /// Instant `OrderCreated` and a due scheduled order.
    pub async fn confirm(&self, id: u64) -> Result<IntentOutcome, ServiceError> {
        self.apply(id, Intent::Confirm, None, None).await
    }

    /// [`Self::confirm`] of a row the caller has just read (the order's reservations, say):
    /// the first decision is taken on it instead of reading it again. A stale row only costs
    /// a lost CAS, after which the row is read and the intent decided again.
    pub async fn confirm_read(&self, row: Reservation) -> Result<IntentOutcome, ServiceError> {
        self.apply(row.id, Intent::Confirm, None, Some(row)).await
    }

    /// Scheduled `OrderCreated`: RESERVED -> CREATED_RESERVED; no Redis step.
    pub async fn mark_created(&self, id: u64) -> Result<IntentOutcome, ServiceError> {
        self.apply(id, Intent::MarkCreated, None, None).await
    }

    /// [`Self::mark_created`] of a row the caller has just read (see [`Self::confirm_read`]).
    pub async fn mark_created_read(&self, row: Reservation) -> Result<IntentOutcome, ServiceError> {
        self.apply(row.id, Intent::MarkCreated, None, Some(row))
            .await
    }

    /// `OrderCreatedFailed` only.
    pub async fn cancel(&self, id: u64) -> Result<IntentOutcome, ServiceError> {
        self.apply(id, Intent::Cancel, None, None).await
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
            None,
        )
        .await
    }

    #[tracing::instrument(skip(self, refund, read), fields(reservation_id = id, ?intent), err)]
    async fn apply(
        &self,
        id: u64,
        intent: Intent,
        refund: Option<(Option<&str>, Option<u32>)>,
        read: Option<Reservation>,
    ) -> Result<IntentOutcome, ServiceError> {
        let started = Instant::now();
        let result = self.apply_inner(id, intent, refund, read).await;
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
        mut read: Option<Reservation>,
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
            // The caller's row for the first decision only: after a lost CAS it is stale.
            let row = match read.take() {
                Some(row) if row.id == id => row,
                _ => self.load(id).await?,
            };
            let status = row.status()?;
            // A refund request that already committed returns its first result, whatever
            // happened to the row since (the refund row is written in the completing TX).
            let committed = matches!(intent, Intent::Refund | Intent::PartialRefund)
                && stocksvr_store::refunds::find_refund(&self.pool, id, refund_key)
                    .await?
                    .is_some_and(|r| r.settled());
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
                        reservation: Box::new(row),
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
                        reservation: Box::new(row),
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
                            if let Some(row) = self.complete_grouped(row, &completion).await? {
                                return Ok(IntentOutcome::Done {
                                    reservation: Box::new(row),
                                    already: false,
                                });
                            }
                            // Lost the CAS: another actor moved the row; decide again.
                            continue;
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
                            if stocksvr_store::refunds::begin_refund(
                                &self.pool, &row, status, refund_key, &step,
                            )
                            .await?
                            {
                                Some(self.load(id).await?)
                            } else {
                                None
                            }
                        }
                        _ => {
                            let pending_quantity = if to == ReservationStatus::Canceling {
                                row.quantity
                            } else {
                                row.held()
                            };
                            self.begin_grouped(Begin {
                                row,
                                to,
                                operation_id: requested_op.clone(),
                                pending_quantity,
                                resume_status: None,
                            })
                            .await?
                        }
                    };
                    if let Some(row) = started {
                        let row = self.run_step(row).await?;
                        return Ok(IntentOutcome::Done {
                            reservation: Box::new(row),
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
        metrics::counter!(names::RESERVATION_CONFLICTS, "reason" => reason_code.to_string())
            .increment(1);
        let enqueued = stocksvr_store::outbox::enqueue_once(&self.pool, &event).await?;
        if enqueued {
            self.outbox_committed();
        }
        Ok(enqueued)
    }
}
