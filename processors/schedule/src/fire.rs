//! The wheel poller: every tick, claims the due entries of every shard and turns each into
//! an InventoryConfirmDue outbox row.
//!
//! Delivery: at-least-once. The entry is removed only after its outbox row committed; a
//! crash (or a MySQL error) in between leaves it claimed, and it falls due again after the
//! claim timeout. The row's event id is deterministic, so a re-fire enqueues nothing new.

use crate::{event, ScheduleConfig, ScheduleError, TimeWheel};
use chrono::Utc;
use sqlx::MySqlPool;
use std::sync::Arc;
use std::time::Duration;
use stocksvr_core::reservation::ReservationStatus;
use stocksvr_pipeline::periodic::{self, Cadence, Round};
use stocksvr_store::reservations as repo;
use stocksvr_telemetry::names;
use tokio::sync::watch;

/// What to do with a claimed entry, given the reservation's status (None: no such row).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fire {
    /// Due and still waiting: emit the trigger, then remove the entry.
    Emit,
    /// Nothing left to trigger: remove the entry without emitting.
    Drop(&'static str),
    /// Not settled: keep the entry claimed; it falls due again after the claim timeout.
    Later,
}

pub fn fire_decision(status: Option<ReservationStatus>) -> Fire {
    use ReservationStatus::*;
    match status {
        None => Fire::Drop("unknown_reservation"),
        Some(CreatedReserved) => Fire::Emit,
        // A partial refund returns to CREATED_RESERVED, and then the confirm is due again.
        Some(Refunding) => Fire::Later,
        // A confirm is already under way (the scan, a duplicate trigger); recovery finishes it.
        Some(Confirming | Confirmed) => Fire::Drop("already_confirming"),
        Some(Canceling | Canceled | Rejected | Refunded) => Fire::Drop("terminal"),
        // Only OrderCreated parks a reservation; the wheel must never confirm before it.
        Some(Preparing | Reserved) => Fire::Drop("not_created"),
    }
}

/// What one tick did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TickReport {
    pub emitted: usize,
    pub already_emitted: usize,
    pub dropped: usize,
    pub later: usize,
    /// How long until the earliest entry that was not due at this tick comes due (see
    /// [`stocksvr_store::wheel::Peek`]).
    pub next_due_in: Option<Duration>,
}

impl TickReport {
    /// Entries this tick claimed, whatever became of them.
    pub fn claimed(&self) -> usize {
        self.emitted + self.already_emitted + self.dropped + self.later
    }

    /// The poll rhythm after this tick: the tick again after work; otherwise the idle
    /// sleeps, never past the next entry's due time.
    fn round(&self) -> Round {
        match (self.claimed(), self.next_due_in) {
            (0, Some(next)) => Round::EmptyUntil(next),
            (0, None) => Round::Empty,
            _ => Round::Partial,
        }
    }
}

pub struct Poller {
    wheel: TimeWheel,
    pool: MySqlPool,
    relay: Option<Arc<tokio::sync::Notify>>,
    tick: Duration,
    idle_tick: Duration,
    claim_timeout: Duration,
    claim_batch: usize,
}

impl Poller {
    pub fn new(
        wheel: TimeWheel,
        pool: MySqlPool,
        relay: Option<Arc<tokio::sync::Notify>>,
        config: &ScheduleConfig,
    ) -> Self {
        Self {
            wheel,
            pool,
            relay,
            tick: config.tick,
            idle_tick: config.idle_tick,
            claim_timeout: config.claim_timeout,
            claim_batch: config.claim_batch,
        }
    }

    /// Claims and fires everything due now, shard after shard. Only the shards whose head is
    /// due are claimed from (one round trip finds them), so a tick with nothing due runs no
    /// script.
    pub async fn tick_once(&self) -> Result<TickReport, ScheduleError> {
        let peek = self.wheel.peek().await?;
        let mut report = TickReport {
            next_due_in: peek.next_due_in,
            ..TickReport::default()
        };
        for key in peek.due {
            loop {
                let claim = self
                    .wheel
                    .claim(&key, self.claim_batch, self.claim_timeout)
                    .await?;
                let full = claim.members.len() >= self.claim_batch;
                for member in &claim.members {
                    self.fire(&key, member, claim.lease, &mut report).await?;
                }
                if !full {
                    break;
                }
            }
        }
        Ok(report)
    }

    async fn fire(
        &self,
        key: &str,
        member: &str,
        lease: i64,
        report: &mut TickReport,
    ) -> Result<(), ScheduleError> {
        let Ok(id) = member.parse::<u64>() else {
            tracing::warn!(
                key,
                member,
                "time wheel entry is not a reservation id; removed"
            );
            self.wheel.discard(key, member).await?;
            report.dropped += 1;
            metrics::counter!(names::SCHEDULE_FIRED, "outcome" => "dropped", "reason" => "not_an_id")
                .increment(1);
            return Ok(());
        };
        let row = repo::find(&self.pool, id).await?;
        let status = row.as_ref().map(|r| r.status()).transpose()?;
        let trigger = row.as_ref().and_then(event::confirm_due);
        let trigger = match (fire_decision(status), trigger) {
            (Fire::Emit, Some(trigger)) => trigger,
            // CREATED_RESERVED without a processing_time: not a scheduled row at all.
            (Fire::Emit, None) => {
                return self
                    .drop(key, member, lease, id, "not_scheduled", report)
                    .await
            }
            (Fire::Drop(reason), _) => {
                return self.drop(key, member, lease, id, reason, report).await
            }
            (Fire::Later, _) => {
                report.later += 1;
                metrics::counter!(names::SCHEDULE_FIRED, "outcome" => "later", "reason" => "")
                    .increment(1);
                return Ok(());
            }
        };
        let enqueued = stocksvr_store::outbox::enqueue_once(&self.pool, &trigger).await?;
        if let (true, Some(relay)) = (enqueued, &self.relay) {
            relay.notify_one();
        }
        self.wheel.release(key, member, lease).await?;
        let outcome = if enqueued {
            report.emitted += 1;
            if let Some(due) = row.as_ref().and_then(|r| r.processing_time) {
                let late = (Utc::now().naive_utc() - due).num_milliseconds().max(0);
                metrics::histogram!(names::SCHEDULE_FIRE_LATENESS_SECONDS)
                    .record(late as f64 / 1000.0);
            }
            tracing::info!(
                reservation_id = id,
                event_id = %trigger.event_id,
                "scheduled reservation due: InventoryConfirmDue emitted"
            );
            "emitted"
        } else {
            report.already_emitted += 1;
            "already_emitted"
        };
        metrics::counter!(names::SCHEDULE_FIRED, "outcome" => outcome, "reason" => "").increment(1);
        Ok(())
    }

    async fn drop(
        &self,
        key: &str,
        member: &str,
        lease: i64,
        id: u64,
        reason: &'static str,
        report: &mut TickReport,
    ) -> Result<(), ScheduleError> {
        self.wheel.release(key, member, lease).await?;
        report.dropped += 1;
        if matches!(reason, "unknown_reservation" | "not_created") {
            // Only a wheel shared across databases (one namespace for two environments) or
            // a hand-made entry gets here; the owner's scan still confirms the reservation.
            tracing::warn!(
                reservation_id = id,
                reason,
                "time wheel entry dropped: no such parked reservation in this database"
            );
        } else {
            tracing::debug!(
                reservation_id = id,
                reason,
                "time wheel entry dropped without a trigger"
            );
        }
        metrics::counter!(names::SCHEDULE_FIRED, "outcome" => "dropped", "reason" => reason)
            .increment(1);
        Ok(())
    }

    /// Ticks until `stop` turns true. Failures are logged and the next tick tries again:
    /// whatever a failed tick claimed falls due again after the claim timeout.
    ///
    /// Every `tick` while entries are being fired; with nothing due, the sleeps grow to
    /// `idle_tick` but end at the earliest entry's due time (standalone Redis; a cluster's
    /// shards each judge by their own clock, so there the sleeps just grow), and an entry
    /// armed in this process ends them at once. An idle wheel so costs one look a second
    /// instead of five (the wheel poller was the largest share of an idle `stocksvr all`);
    /// an entry that comes due during a sleep it did not end fires at most `idle_tick` late.
    pub async fn run(self, stop: watch::Receiver<bool>) -> Result<(), ScheduleError> {
        let cadence = Cadence::adaptive(self.tick, self.idle_tick);
        let armed = self.wheel.armed();
        periodic::run("time wheel poller", cadence, Some(&armed), stop, || async {
            match self.tick_once().await {
                Ok(report) => Ok(report.round()),
                Err(e) => {
                    tracing::warn!(error = %e, "time wheel tick failed; claimed entries fire again after the claim timeout");
                    Ok(Round::Failed)
                }
            }
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ReservationStatus::*;

    #[test]
    fn only_a_parked_reservation_is_triggered() {
        let table = [
            (Preparing, Fire::Drop("not_created")),
            (Reserved, Fire::Drop("not_created")),
            (CreatedReserved, Fire::Emit),
            (Confirming, Fire::Drop("already_confirming")),
            (Confirmed, Fire::Drop("already_confirming")),
            (Canceling, Fire::Drop("terminal")),
            (Canceled, Fire::Drop("terminal")),
            (Rejected, Fire::Drop("terminal")),
            (Refunding, Fire::Later),
            (Refunded, Fire::Drop("terminal")),
        ];
        assert_eq!(table.len(), ReservationStatus::ALL.len(), "every status");
        for (status, expected) in table {
            assert_eq!(fire_decision(Some(status)), expected, "{status:?}");
        }
        assert_eq!(fire_decision(None), Fire::Drop("unknown_reservation"));
    }
}
