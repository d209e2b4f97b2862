//! Stale-reservation watcher (docs/design.md, stale reservations): a RESERVED reservation past its
//! `expire_at` means the order domain never sent OrderCreated or OrderCreatedFailed. The
//! watcher raises a metric, a log line per round and one event per reservation for the order
//! domain to act on. It never cancels by itself: only OrderCreatedFailed may cancel, and
//! releasing stock of an order that was in fact created would oversell.

use crate::outbox;
use crate::{ReservationService, ServiceError};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use stocksvr_pipeline::periodic::{self, Cadence, Round};
use stocksvr_store::reservations as repo;
use stocksvr_telemetry::names;
use tokio::sync::watch;

/// `reason_code` of the alert (an InventoryReserved event of the reservation as it stands).
pub const STALE_REASON: &str = "STALE_RESERVATION";

/// Order ids a round's log line names; the events name every one.
const ORDERS_NAMED: usize = 5;

/// How the watcher scans. An outage of the order domain leaves every reservation of its
/// span stale at once (half an hour at 500 orders/s is 900,000): one batch per `interval`
/// would take its events 15 hours to go out, so while a batch comes back full the next
/// one follows after `pace` instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StaleScan {
    /// Between two scans when the last one found fewer than `batch` (`stale_interval_secs`).
    pub interval: Duration,
    /// Reservations alerted per round, in one transaction with their events.
    pub batch: u32,
    /// Between two rounds while there is a backlog: about `batch` alerts a `pace`, so a
    /// large outage does not flood the order domain's topic while it recovers.
    pub pace: Duration,
}

impl StaleScan {
    pub fn every(interval: Duration) -> Self {
        Self {
            interval,
            batch: 500,
            pace: Duration::from_secs(1),
        }
    }
}

/// What one round of the watcher did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StaleRound {
    /// Stale reservations not alerted before, read by this round (at most the batch).
    pub found: usize,
    /// Of those, alerted by this round (another watcher, or a status change, took the rest).
    pub alerted: usize,
    /// RESERVED past `expire_at`, alerted or not, when the round counted them.
    pub stale: Option<i64>,
    /// The first orders alerted, for the round's log line.
    pub orders: Vec<u64>,
    /// The earliest `expire_at` alerted.
    pub oldest: Option<chrono::NaiveDateTime>,
}

/// The alert of one stale reservation: an InventoryReserved of the row as it stands, with
/// `reason_code` [`STALE_REASON`] and an event id of its own, so it is sent once.
pub fn stale_event(row: &repo::Reservation) -> stocksvr_store::outbox::NewOutbox {
    let mut event = outbox::reserved(row, &format!("stale_{}", row.id));
    event.payload["data"]["reason_code"] = serde_json::Value::String(STALE_REASON.to_string());
    event
}

/// Alerts up to `limit` newly stale reservations. `count` also refreshes the gauge of all
/// stale reservations: a range scan of the status index, so a drain of a large backlog
/// counts once an interval, not every round.
pub async fn alert_stale_once(
    service: &ReservationService,
    limit: u32,
    count: bool,
) -> Result<StaleRound, ServiceError> {
    let pool = service.pool();
    let mut round = StaleRound::default();
    if count {
        let stale = repo::count_stale(pool).await?;
        metrics::gauge!(names::RESERVATIONS_STALE).set(stale as f64);
        round.stale = Some(stale);
    }
    let ids = repo::find_stale(pool, limit).await?;
    round.found = ids.len();
    let alerted = repo::alert_stale(pool, &ids, stale_event).await?;
    round.alerted = alerted.len();
    round.oldest = alerted.iter().map(|r| r.expire_at).min();
    round.orders = alerted
        .iter()
        .take(ORDERS_NAMED)
        .map(|r| r.order_id)
        .collect();
    for row in &alerted {
        tracing::debug!(
            reservation_id = row.id,
            order_id = row.order_id,
            expire_at = %row.expire_at,
            "stale reservation alerted"
        );
    }
    if round.alerted > 0 {
        // One line a round, not one per reservation: an outage alerts thousands a minute,
        // and each one is in the outbox event (and at debug level) already.
        tracing::warn!(
            alerted = round.alerted,
            stale = round.stale.map(|s| s.to_string()).unwrap_or_else(|| "not counted".into()),
            oldest_expire_at = ?round.oldest,
            orders = ?round.orders,
            "reservations still RESERVED past expire_at; the order domain must confirm or fail these orders"
        );
    }
    Ok(round)
}

/// Scans every `every` until `stop` turns true.
pub async fn run(
    service: std::sync::Arc<ReservationService>,
    every: Duration,
    stop: watch::Receiver<bool>,
) -> Result<(), ServiceError> {
    run_with(service, StaleScan::every(every), stop).await
}

/// As [`run`], with the batch and the pace of a backlog's rounds given.
pub async fn run_with(
    service: std::sync::Arc<ReservationService>,
    scan: StaleScan,
    stop: watch::Receiver<bool>,
) -> Result<(), ServiceError> {
    let counted_at: Mutex<Option<Instant>> = Mutex::new(None);
    let pace = scan.pace.min(scan.interval);
    periodic::run(
        "stale watcher",
        // A full batch is answered as a partial round (sleep `min`, the pace) and an empty
        // one as idle (sleep `max` once, the interval): never back to back, never slower
        // than the interval.
        Cadence::adaptive(pace, scan.interval),
        None,
        stop,
        || async {
            let count = {
                let last = counted_at.lock().map_or(None, |g| *g);
                last.is_none_or(|at| at.elapsed() >= scan.interval)
            };
            match alert_stale_once(&service, scan.batch, count).await {
                Ok(round) => {
                    if count {
                        if let Ok(mut g) = counted_at.lock() {
                            *g = Some(Instant::now());
                        }
                    }
                    Ok(if round.found as u64 >= u64::from(scan.batch) {
                        Round::Partial
                    } else {
                        Round::Idle
                    })
                }
                Err(e) => {
                    tracing::warn!(error = %e, "stale-reservation scan failed; retrying");
                    Ok(Round::Failed)
                }
            }
        },
    )
    .await
}
