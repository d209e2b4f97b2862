//! Stale-reservation watcher (seed §4.3 `expire_at`): a RESERVED reservation past its
//! `expire_at` means the order domain never sent OrderCreated or OrderCreatedFailed. The
//! watcher raises a metric, a log line and one event per reservation for the order domain to
//! act on. It never cancels by itself: only OrderCreatedFailed may cancel, and releasing
//! stock of an order that was in fact created would oversell.

use crate::outbox;
use crate::{ReservationService, ServiceError};
use std::time::Duration;
use stocksvr_pipeline::periodic::{self, Cadence, Round};
use stocksvr_store::reservations as repo;
use stocksvr_telemetry::names;
use tokio::sync::watch;

/// `reason_code` of the alert (an InventoryReserved event of the reservation as it stands).
pub const STALE_REASON: &str = "STALE_RESERVATION";

/// Alerts up to `limit` newly stale reservations; returns how many were alerted now.
pub async fn alert_stale_once(
    service: &ReservationService,
    limit: u32,
) -> Result<usize, ServiceError> {
    let pool = service.pool();
    metrics::gauge!(names::RESERVATIONS_STALE).set(repo::count_stale(pool).await? as f64);
    let mut alerted = 0;
    for row in repo::find_stale(pool, limit).await? {
        let mut event = outbox::reserved(&row, &format!("stale_{}", row.id));
        event.payload["data"]["reason_code"] = serde_json::Value::String(STALE_REASON.to_string());
        if repo::mark_stale_alerted(pool, row.id, &event).await? {
            alerted += 1;
            tracing::warn!(
                reservation_id = row.id,
                order_id = row.order_id,
                expire_at = %row.expire_at,
                "reservation still RESERVED past expire_at; the order domain must confirm or fail the order"
            );
        }
    }
    Ok(alerted)
}

/// Scans every `every` until `stop` turns true.
pub async fn run(
    service: std::sync::Arc<ReservationService>,
    every: Duration,
    stop: watch::Receiver<bool>,
) -> Result<(), ServiceError> {
    periodic::run(
        "stale watcher",
        Cadence::fixed(every),
        None,
        stop,
        || async {
            if let Err(e) = alert_stale_once(&service, 500).await {
                tracing::warn!(error = %e, "stale-reservation scan failed; retrying");
            }
            Ok(Round::Partial)
        },
    )
    .await
}
