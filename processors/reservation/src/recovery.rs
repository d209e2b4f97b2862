//! The reservation recovery worker (docs/design.md, failure windows): finds reservations left in an
//! intermediate status (PREPARING, CONFIRMING, CANCELING, REFUNDING) by a crash, a timeout or an
//! UNKNOWN Redis outcome, and resumes each with its stored operation id. The Lua op record turns an
//! already applied step into a replay of its first result, so resuming never applies twice. Failed
//! attempts back off exponentially; past the configured bound the row is marked dead, alerted
//! (InventoryOperationDead, a metric, a log line) and left where it is for an operator: never moved
//! backwards. Several workers may run: claims use FOR UPDATE SKIP LOCKED.

use crate::outbox;
use crate::{ReservationService, ServiceError};
use chrono::TimeDelta;
use std::time::Duration;
use stocksvr_pipeline::periodic::{self, Cadence, Round};
use stocksvr_store::reservations as repo;
use stocksvr_telemetry::names;
use tokio::sync::watch;

#[derive(Debug, Clone)]
pub struct RecoveryConfig {
    /// Rows resumed per round.
    pub batch: u32,
    /// How long a claimed row is left to this worker.
    pub lease: TimeDelta,
    /// Pause between rounds that found nothing due.
    pub idle_poll: Duration,
}

impl Default for RecoveryConfig {
    fn default() -> Self {
        Self {
            batch: 50,
            lease: TimeDelta::seconds(60),
            idle_poll: Duration::from_secs(1),
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    pub resumed: usize,
    pub failed: usize,
    pub dead: usize,
}

/// One round: claim due rows and resume them.
pub async fn recover_once(
    service: &ReservationService,
    config: &RecoveryConfig,
) -> Result<RecoveryReport, ServiceError> {
    let ids = repo::claim_due(service.pool(), config.batch, config.lease).await?;
    let mut report = RecoveryReport::default();
    for id in ids {
        match service.resume(id).await {
            Ok(view) => {
                report.resumed += 1;
                metrics::counter!(names::RECOVERY_ATTEMPTS, "outcome" => "resumed").increment(1);
                tracing::info!(reservation_id = id, status = %view.status, "recovered");
            }
            Err(ServiceError::Mysql(e)) => return Err(ServiceError::Mysql(e)),
            Err(e) => {
                report.failed += 1;
                metrics::counter!(names::RECOVERY_ATTEMPTS, "outcome" => "failed").increment(1);
                tracing::warn!(reservation_id = id, error = %e, "recovery attempt failed");
                if give_up_if_exhausted(service, id).await? {
                    report.dead += 1;
                }
            }
        }
    }
    Ok(report)
}

/// Marks the row dead once its failures reached the bound. True when it was marked now.
async fn give_up_if_exhausted(service: &ReservationService, id: u64) -> Result<bool, ServiceError> {
    let Some(row) = repo::find(service.pool(), id).await? else {
        return Ok(false);
    };
    if row.retry_count < service.config().recovery_max_attempts {
        return Ok(false);
    }
    let status = row.status()?;
    let action = status
        .resume_action()
        .map(|a| format!("{a:?}").to_uppercase())
        .unwrap_or_default();
    let alert = outbox::operation_dead(&row, status.name(), &action);
    let marked = repo::mark_dead(service.pool(), id, &alert).await?;
    if marked {
        metrics::counter!(names::RESERVATIONS_DEAD, "status" => status.name()).increment(1);
        tracing::error!(
            reservation_id = id,
            status = status.name(),
            operation_id = %row.current_operation_id,
            retry_count = row.retry_count,
            last_error = row.last_error.as_deref().unwrap_or(""),
            "recovery gave up: reservation marked dead, operator action needed"
        );
    }
    Ok(marked)
}

/// Runs rounds until `stop` turns true. MySQL errors are waited out; nothing here is fatal.
pub async fn run(
    service: std::sync::Arc<ReservationService>,
    config: RecoveryConfig,
    stop: watch::Receiver<bool>,
) -> Result<(), ServiceError> {
    let cadence = Cadence::adaptive(config.idle_poll, config.idle_poll * 10);
    periodic::run("recovery worker", cadence, None, stop, || async {
        Ok(match recover_once(&service, &config).await {
            Ok(report) if report.resumed + report.failed >= config.batch as usize => Round::Full,
            Ok(report) if report.resumed + report.failed > 0 => Round::Partial,
            Ok(_) => Round::Empty,
            Err(e) => {
                tracing::warn!(error = %e, "recovery round failed; retrying");
                Round::Failed
            }
        })
    })
    .await
}
