//! The scan behind the wheel (docs/design.md, scheduled confirms): the wheel is only for
//! being on time, MySQL is the truth. Every `scan_interval` it
//!
//! 1. re-arms CREATED_RESERVED reservations due within the load-ahead horizon (`ZADD NX`,
//!    so entries in place, claimed or not, are left alone): an entry lost from Redis (a
//!    flush, a failover that lost writes, an arm that failed) is back before it is due;
//! 2. confirms, directly through the reservation service, CREATED_RESERVED reservations
//!    whose processing_time passed more than `grace` ago: the wheel missed them (a lost
//!    entry, a lost or dead-lettered trigger, every instance down at the due time). Each
//!    one is logged as a warning, because it means the wheel did not do its job.
//!
//! Racing the wheel is harmless: both end in the same CAS from CREATED_RESERVED.

use crate::{store, ScheduleConfig, ScheduleError, TimeWheel};
use chrono::{NaiveDateTime, TimeDelta, Utc};
use std::sync::Arc;
use std::time::Duration;
use stocksvr_pipeline::periodic::{self, Cadence, Round};
use stocksvr_reservation::{IntentOutcome, ReservationService, ServiceError};
use stocksvr_telemetry::names;
use tokio::sync::watch;

/// Query pages per round and step, so one round stays bounded whatever the backlog.
const MAX_PAGES: usize = 20;

/// What one round did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScanReport {
    /// Upcoming reservations seen / put back on the wheel.
    pub upcoming: usize,
    pub rearmed: usize,
    /// Overdue reservations found / confirmed by this round.
    pub overdue: usize,
    pub redriven: usize,
}

pub struct Scanner {
    service: Arc<ReservationService>,
    wheel: TimeWheel,
    interval: Duration,
    grace: TimeDelta,
    load_ahead: TimeDelta,
    batch: u32,
}

impl Scanner {
    pub fn new(
        service: Arc<ReservationService>,
        wheel: TimeWheel,
        config: &ScheduleConfig,
    ) -> Self {
        Self {
            service,
            wheel,
            interval: config.scan_interval,
            grace: config.scan_grace,
            load_ahead: config.load_ahead,
            batch: config.scan_batch,
        }
    }

    pub async fn scan_once(&self) -> Result<ScanReport, ScheduleError> {
        let now = Utc::now().naive_utc();
        let mut report = ScanReport::default();
        self.load_ahead(now, &mut report).await?;
        self.redrive(now, &mut report).await?;
        Ok(report)
    }

    async fn load_ahead(
        &self,
        now: NaiveDateTime,
        report: &mut ScanReport,
    ) -> Result<(), ScheduleError> {
        let pool = self.service.pool();
        let mut cursor = None;
        for _ in 0..MAX_PAGES {
            let page =
                store::upcoming(pool, now, now + self.load_ahead, cursor, self.batch).await?;
            let entries: Vec<_> = page.iter().map(|(id, due)| (*id, due.and_utc())).collect();
            let added = match self.wheel.arm_many(&entries).await {
                Ok(added) => added,
                Err(e) => {
                    metrics::counter!(names::SCHEDULE_ARMED, "source" => "load_ahead", "outcome" => "failed")
                        .increment(entries.len() as u64);
                    return Err(e.into());
                }
            };
            report.upcoming += page.len();
            report.rearmed += added;
            metrics::counter!(names::SCHEDULE_ARMED, "source" => "load_ahead", "outcome" => "added")
                .increment(added as u64);
            metrics::counter!(names::SCHEDULE_ARMED, "source" => "load_ahead", "outcome" => "present")
                .increment((page.len() - added) as u64);
            if page.len() < self.batch as usize {
                break;
            }
            cursor = page.last().map(|(id, due)| (*due, *id));
        }
        if report.rearmed > 0 {
            // Lost from Redis, or the scan was quicker than order-lifecycle's own arm.
            tracing::info!(
                rearmed = report.rearmed,
                "time wheel entries missing; re-armed from MySQL"
            );
        }
        Ok(())
    }

    async fn redrive(
        &self,
        now: NaiveDateTime,
        report: &mut ScanReport,
    ) -> Result<(), ScheduleError> {
        let pool = self.service.pool();
        for _ in 0..MAX_PAGES {
            let overdue = store::overdue(pool, now - self.grace, self.batch).await?;
            if report.overdue == 0 {
                metrics::gauge!(names::SCHEDULE_OVERDUE).set(overdue.len() as f64);
            }
            report.overdue += overdue.len();
            let mut moved = 0;
            for (id, due) in &overdue {
                let late_ms = (now - *due).num_milliseconds();
                let outcome = match self.service.confirm(*id).await {
                    Ok(IntentOutcome::Done { already: false, .. }) => {
                        moved += 1;
                        report.redriven += 1;
                        tracing::warn!(
                            reservation_id = id,
                            processing_time = %due,
                            late_ms,
                            "scheduled reservation confirmed by the scan: the time wheel missed it"
                        );
                        "confirmed"
                    }
                    // The wheel's trigger (or another scanner) got there in between.
                    Ok(IntentOutcome::Done { already: true, .. }) => {
                        moved += 1;
                        "already_confirmed"
                    }
                    Ok(IntentOutcome::NotYet { .. }) => "not_yet",
                    Ok(IntentOutcome::Conflict { status, reason }) => {
                        tracing::warn!(
                            reservation_id = id,
                            status = status.name(),
                            reason,
                            "the scan cannot confirm a due reservation"
                        );
                        "conflict"
                    }
                    Err(ServiceError::Mysql(e)) => return Err(ServiceError::Mysql(e).into()),
                    Err(e) => {
                        // Left in CREATED_RESERVED or CONFIRMING: the next round (or the
                        // recovery worker) tries again with the same operation id.
                        tracing::warn!(reservation_id = id, error = %e, "re-driving a due reservation failed");
                        "failed"
                    }
                };
                metrics::counter!(names::SCHEDULE_REDRIVEN, "outcome" => outcome).increment(1);
            }
            // Another page only while this one was full and moved: rows that stay put
            // would come back in the same order and be retried next round anyway.
            if overdue.len() < self.batch as usize || moved == 0 {
                break;
            }
        }
        Ok(())
    }

    /// Rounds every `interval` until `stop` turns true; a failed round is logged and the
    /// next one tries again.
    pub async fn run(self, stop: watch::Receiver<bool>) -> Result<(), ScheduleError> {
        periodic::run(
            "schedule scan",
            Cadence::fixed(self.interval),
            None,
            stop,
            || async {
                match self.scan_once().await {
                    Ok(report) => tracing::debug!(?report, "schedule scan"),
                    Err(e) => {
                        tracing::warn!(error = %e, "schedule scan failed; retrying next round")
                    }
                }
                Ok(Round::Partial)
            },
        )
        .await
    }
}
