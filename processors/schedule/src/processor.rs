//! schedule processor on `inventory.schedule.v1`: an InventoryConfirmDue confirms its
//! reservation from CREATED_RESERVED.
//!
//! Delivery: at-least-once through the shared consumer loop; the confirm is applied once
//! because it is the reservation CAS from CREATED_RESERVED plus the idempotent confirm Lua,
//! so a redelivered or duplicated trigger (or one racing the scan) finds the work done. A
//! trigger that no longer matches the reservation (another processing_time, a refund got
//! there first) is stale and ignored; one naming an unknown reservation, another order, or
//! a reservation its order never created is dead-lettered with the reason.

use chrono::{DateTime, TimeDelta, Utc};
use futures::future::BoxFuture;
use futures::FutureExt;
use std::sync::Arc;
use stocksvr_core::events::{topics, Envelope, EventKind, InventoryConfirmDueData};
use stocksvr_core::reservation::ReservationStatus;
use stocksvr_pipeline::config::KafkaSettings;
use stocksvr_pipeline::consumer::{Applied, Failure, LoopConfig, Record, RecordHandler};
use stocksvr_reservation::{IntentOutcome, ReservationService, ServiceError};
use stocksvr_store::reservations::{self as repo, Reservation};
use stocksvr_telemetry::names;

pub const NAME: &str = "schedule";

/// A trigger this far ahead of its processing_time is early (a clock far off, or a
/// hand-made event): ignored, the wheel and the scan fire it when it is due.
pub const EARLY_TOLERANCE: TimeDelta = TimeDelta::seconds(5);

pub fn loop_config(kafka: &KafkaSettings) -> LoopConfig {
    LoopConfig::new(NAME, vec![kafka.topic(topics::INVENTORY_SCHEDULE)])
}

/// What a trigger asks for, given the reservation as MySQL has it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    Confirm,
    AlreadyConfirmed,
    /// Ignored: the reservation moved on or the trigger does not match it.
    Stale(&'static str),
}

/// Checks the trigger against its reservation. `Err` is a reason to dead-letter it.
pub fn decide(
    data: &InventoryConfirmDueData,
    row: &Reservation,
    now: DateTime<Utc>,
) -> Result<Trigger, String> {
    if row.order_id as i64 != data.order_id || row.stock_bucket_id != data.stock_bucket_id {
        return Err(format!(
            "reservation {} belongs to order {} bucket {}, not order {} bucket {}",
            row.id, row.order_id, row.stock_bucket_id, data.order_id, data.stock_bucket_id
        ));
    }
    let Some(due) = row.processing_time.filter(|_| row.order_type == 2) else {
        return Err(format!(
            "reservation {} is not a scheduled order and has no due time",
            row.id
        ));
    };
    let asked = DateTime::parse_from_rfc3339(&data.processing_time)
        .map_err(|e| format!("processing_time {:?}: {e}", data.processing_time))?;
    if asked.timestamp_millis() != due.and_utc().timestamp_millis() {
        return Ok(Trigger::Stale("processing_time_changed"));
    }
    let status = row.status().map_err(|e| e.to_string())?;
    use ReservationStatus::*;
    Ok(match status {
        Confirmed => Trigger::AlreadyConfirmed,
        Canceling | Canceled | Rejected | Refunded => Trigger::Stale("terminal"),
        Preparing | Reserved => {
            return Err(format!(
                "reservation {} is {}: its order was never created, so nothing is due",
                row.id,
                status.name()
            ))
        }
        // CONFIRMING finishes the confirm under way; REFUNDING (a partial refund) answers
        // "not yet" in the service, so the trigger is retried until it settles.
        CreatedReserved | Confirming | Refunding => {
            if due.and_utc() > now + EARLY_TOLERANCE {
                Trigger::Stale("early")
            } else {
                Trigger::Confirm
            }
        }
    })
}

pub struct ScheduleProcessor {
    service: Arc<ReservationService>,
}

impl ScheduleProcessor {
    pub fn new(service: Arc<ReservationService>) -> Self {
        Self { service }
    }

    /// The processor's decode step: the due confirm of `record`, or why it is invalid.
    /// Pure; public so one test can run every example through it.
    pub fn decode(record: &Record) -> Result<InventoryConfirmDueData, Failure> {
        let name = record.event.full_name.as_str();
        let invalid = |e: String| Failure::Invalid(format!("{name}: {e}"));
        if EventKind::from_full_name(name) != Some(EventKind::InventoryConfirmDue) {
            return Err(Failure::Invalid(format!(
                "{name} is not an InventoryConfirmDue event"
            )));
        }
        let event: Envelope<InventoryConfirmDueData> = record
            .event
            .clone()
            .into_typed(name)
            .map_err(|e| invalid(e.to_string()))?;
        event.check(name).map_err(|e| invalid(e.to_string()))?;
        Ok(event.data)
    }

    async fn one(&self, record: &Record) -> Result<Applied, Failure> {
        let data = Self::decode(record)?;
        let id = u64::try_from(data.reservation_id).map_err(|_| {
            Failure::Invalid(format!(
                "reservation id {} is not valid",
                data.reservation_id
            ))
        })?;
        let row = repo::find(self.service.pool(), id)
            .await
            .map_err(|e| Failure::from_sqlx(&e))?
            .ok_or_else(|| Failure::Invalid(format!("reservation {id} does not exist")))?;
        let outcome = match decide(&data, &row, Utc::now()).map_err(Failure::Invalid)? {
            Trigger::AlreadyConfirmed => "already_confirmed",
            Trigger::Stale(reason) => {
                tracing::info!(
                    reservation_id = id,
                    reason,
                    "stale InventoryConfirmDue ignored"
                );
                "stale"
            }
            Trigger::Confirm => match self.service.confirm(id).await {
                Err(e @ (ServiceError::Inconsistent { .. } | ServiceError::BucketLost { .. })) => {
                    // The row is in the recovery worker's hands; the due scan confirms it
                    // once it settles, so this trigger need not hold its partition.
                    tracing::warn!(reservation_id = id, error = %e, "due confirm left to the recovery worker and the scan");
                    "left_to_scan"
                }
                Err(e) => return Err(e.failure()),
                Ok(outcome) => match outcome {
                    IntentOutcome::Done { already: false, .. } => "confirmed",
                    IntentOutcome::Done { already: true, .. } => "already_confirmed",
                    // Settles by itself (the recovery worker finishes the step it waits for),
                    // and the due scan confirms what a dropped trigger left behind.
                    IntentOutcome::NotYet { status } => {
                        tracing::info!(
                            reservation_id = id,
                            status = status.name(),
                            "due confirm early; left to the scan"
                        );
                        "left_to_scan"
                    }
                    // Only a refund can overtake the confirm of a created order; the order
                    // domain asked for it, so there is nothing to report.
                    IntentOutcome::Conflict { status, .. } => {
                        tracing::info!(
                            reservation_id = id,
                            status = status.name(),
                            "due confirm lost to a refund"
                        );
                        "lost_to_refund"
                    }
                },
            },
        };
        metrics::counter!(names::SCHEDULE_TRIGGERS, "outcome" => outcome).increment(1);
        Ok(if outcome == "confirmed" {
            tracing::info!(reservation_id = id, "scheduled reservation confirmed");
            Applied::Applied
        } else {
            Applied::Duplicate
        })
    }
}

impl RecordHandler for ScheduleProcessor {
    fn handle_one<'a>(&'a self, record: &'a Record) -> BoxFuture<'a, Result<Applied, Failure>> {
        self.one(record).boxed()
    }
}

#[cfg(test)]
mod decode_fuzz;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::tests::row;
    use ReservationStatus::*;

    fn trigger() -> InventoryConfirmDueData {
        InventoryConfirmDueData {
            reservation_id: 7_000_001,
            order_id: 42,
            stock_bucket_id: "bucket_5_6_20261129".into(),
            processing_time: "2026-11-29T12:00:00.250Z".into(),
        }
    }

    fn due() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-11-29T12:00:00.250Z")
            .expect("time")
            .with_timezone(&Utc)
    }

    fn with_status(status: ReservationStatus) -> Reservation {
        let mut r = row();
        r.status = status.code() as i8;
        r
    }

    #[test]
    fn a_due_trigger_confirms_a_parked_reservation() {
        let r = row();
        assert_eq!(decide(&trigger(), &r, due()), Ok(Trigger::Confirm));
        // The same instant in another offset is the same due time.
        let mut t = trigger();
        t.processing_time = "2026-11-29T20:00:00.250+08:00".into();
        assert_eq!(decide(&t, &r, due()), Ok(Trigger::Confirm));
        assert_eq!(
            decide(&trigger(), &with_status(Confirming), due()),
            Ok(Trigger::Confirm)
        );
    }

    #[test]
    fn duplicates_and_overtaken_triggers_change_nothing() {
        assert_eq!(
            decide(&trigger(), &with_status(Confirmed), due()),
            Ok(Trigger::AlreadyConfirmed)
        );
        for status in [Refunded, Canceled, Rejected, Canceling] {
            assert_eq!(
                decide(&trigger(), &with_status(status), due()),
                Ok(Trigger::Stale("terminal")),
                "{status:?}"
            );
        }
        let mut t = trigger();
        t.processing_time = "2026-11-29T12:00:00.251Z".into();
        assert_eq!(
            decide(&t, &row(), due()),
            Ok(Trigger::Stale("processing_time_changed"))
        );
        assert_eq!(
            decide(&trigger(), &row(), due() - TimeDelta::seconds(6)),
            Ok(Trigger::Stale("early"))
        );
        assert_eq!(
            decide(&trigger(), &row(), due() - TimeDelta::seconds(4)),
            Ok(Trigger::Confirm),
            "clocks a little apart still confirm"
        );
    }

    #[test]
    fn triggers_that_do_not_fit_their_reservation_are_invalid() {
        for status in [Preparing, Reserved] {
            let err = decide(&trigger(), &with_status(status), due()).expect_err("invalid");
            assert!(err.contains("never created"), "{err}");
        }
        let mut t = trigger();
        t.order_id = 43;
        assert!(decide(&t, &row(), due()).is_err());
        let mut t = trigger();
        t.stock_bucket_id = "bucket_5_6_20261130".into();
        assert!(decide(&t, &row(), due()).is_err());
        let mut t = trigger();
        t.processing_time = "noon".into();
        assert!(decide(&t, &row(), due())
            .expect_err("invalid")
            .contains("processing_time"));
        let mut instant = row();
        instant.order_type = 1;
        instant.processing_time = None;
        assert!(decide(&trigger(), &instant, due()).is_err());
    }
}
