//! The relay: the leader's scan (read by primary key → publish → move the high-water mark),
//! the per-row retry path, the adaptive poll loop, the purge and the gauges.

mod leadership;
mod outcome;
mod scan;
mod upkeep;

use crate::config::RelayConfig;
use crate::error::RelayError;
use crate::publish::{enqueue_batch, Enqueued};
use crate::records::{records, Record};
use crate::store::{self, ClaimedRow};
use leadership::Leadership;
use sqlx::MySqlPool;
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;
use stocksvr_pipeline::codec::AvroCodec;
use stocksvr_pipeline::failure;
use stocksvr_pipeline::periodic::{self, Cadence, Round};
use stocksvr_pipeline::producer::Producer;
use stocksvr_pipeline::topics::Namespace;
use tokio::sync::{watch, Notify};

/// What one round did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RelayReport {
    /// Rows this round took to publish (read by the leader's scan, or claimed for a retry).
    pub claimed: usize,
    /// Rows the broker acknowledged.
    pub sent: usize,
    /// Rows that went to RETRY.
    pub failed: usize,
}

impl RelayReport {
    fn add(&mut self, other: RelayReport) {
        self.claimed += other.claimed;
        self.sent += other.sent;
        self.failed += other.failed;
    }
}

/// A round on the producer's queue, its acknowledgements not awaited yet.
struct Started {
    /// The leader's epoch for a scan round; `None` for a retry round.
    epoch: Option<u64>,
    rows: Vec<ClaimedRow>,
    /// The rows' Kafka records, one or two a row, in the rows' order.
    records: Vec<Record>,
    /// Rows read, whatever their status (a full scan means a backlog).
    read: usize,
    lease_until: Option<chrono::NaiveDateTime>,
    deliveries: Enqueued,
    started: Instant,
}

/// Publishes `inventory_outbox` rows to Kafka. Cheap to share behind an `Arc`; every method
/// but [`OutboxRelay::run`] takes `&self`.
pub struct OutboxRelay {
    pool: MySqlPool,
    producer: Producer,
    codec: AvroCodec,
    config: RelayConfig,
    namespace: Namespace,
    wake: Arc<Notify>,
    /// Rows the publish loop's rounds have read or claimed so far, and the wake-up of the
    /// gauge loop: an idle gauge loop refreshes seldom, and at once when rows move again.
    moved: AtomicU64,
    gauge_idle: AtomicBool,
    gauge_wake: Notify,
    /// (topic, event type) pairs whose counters exist already (see `zero_series`).
    seen: Mutex<HashSet<(String, String)>>,
    /// This relay's name in the lease: unique per instance, so a restarted process never
    /// mistakes its predecessor's lease for its own.
    owner: String,
    leader: Mutex<Option<Leadership>>,
    /// `INNODB_TRX` was refused: gaps close by `gap_timeout` instead.
    no_trx_view: AtomicBool,
}

impl OutboxRelay {
    /// `producer` should come from [`stocksvr_pipeline::kafka::producer`] (idempotent,
    /// `acks=all`): a send retried inside the producer is then written once per partition.
    pub fn new(
        pool: MySqlPool,
        producer: Producer,
        codec: AvroCodec,
        config: RelayConfig,
    ) -> Result<Self, RelayError> {
        config.validate()?;
        Ok(Self {
            pool,
            producer,
            codec,
            config,
            namespace: Namespace::default(),
            wake: Arc::new(Notify::new()),
            moved: AtomicU64::new(0),
            gauge_idle: AtomicBool::new(false),
            gauge_wake: Notify::new(),
            seen: Mutex::new(HashSet::new()),
            owner: owner_name(),
            leader: Mutex::new(None),
            no_trx_view: AtomicBool::new(false),
        })
    }

    /// Publishes into the topics of `namespace` (`kafka.topic_namespace`); rows keep the
    /// declared names.
    pub fn in_namespace(mut self, namespace: Namespace) -> Self {
        self.namespace = namespace;
        self
    }

    pub fn config(&self) -> &RelayConfig {
        &self.config
    }

    /// The name this relay holds the lease under.
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// True while this relay believes it holds the lease.
    pub fn is_leader(&self) -> bool {
        self.lock().is_some()
    }

    /// A service that committed outbox rows calls `notify_one()` on this so the relay
    /// publishes at once instead of at its next poll. A notification sent while the relay
    /// is busy is kept and ends its next sleep, so none is lost.
    pub fn waker(&self) -> Arc<Notify> {
        self.wake.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Leadership>> {
        self.leader.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// One round: the leader's scan (nothing when another relay leads), then the due retries.
    ///
    /// A row counts as sent only after the broker acknowledged it; every other outcome
    /// (payload off its schema, registry or broker failure, timeout) is RETRY with backoff
    /// and the reason, and never holds up the other rows.
    #[tracing::instrument(skip_all, err)]
    pub async fn relay_once(&self) -> Result<RelayReport, RelayError> {
        let mut report = match self.start_round().await {
            Ok(Some(round)) => self.finish_round(round).await,
            Ok(None) => Ok(RelayReport::default()),
            Err(e) => Err(e),
        }
        .inspect_err(|_| self.step_down())?;
        report.add(self.retry_once().await?);
        Ok(report)
    }

    /// Scan rounds back to back while they come back full, each read and enqueued while the
    /// previous one waits for its acknowledgements: a round then costs the longer of the two
    /// halves instead of their sum. The next round is enqueued only after the previous one
    /// was, so one key's records still reach their partition in id order (the idempotent
    /// producer keeps that order through its own retries). At most `max_rounds`, so a stop
    /// request is seen between drains; the due retries go last.
    pub async fn drain(&self, max_rounds: usize) -> Result<RelayReport, RelayError> {
        Ok(self.drain_counting(max_rounds).await?.0)
    }

    /// [`OutboxRelay::drain`], and how many rows the scan read whatever their status: rows
    /// the scan only steps over (SENT or RETRY above the mark, as after the migration) are
    /// still a backlog to walk through at full speed.
    async fn drain_counting(&self, max_rounds: usize) -> Result<(RelayReport, usize), RelayError> {
        let (mut total, read) = self
            .drain_scan(max_rounds)
            .await
            .inspect_err(|_| self.step_down())?;
        total.add(self.retry_once().await?);
        Ok((total, read))
    }

    async fn drain_scan(&self, max_rounds: usize) -> Result<(RelayReport, usize), RelayError> {
        let batch = self.config.batch_size as usize;
        let Some(mut current) = self.start_round().await? else {
            return Ok((RelayReport::default(), 0));
        };
        let mut total = RelayReport::default();
        let mut read = current.read;
        for _ in 1..max_rounds.max(1) {
            if current.read < batch {
                break;
            }
            let (done, next) = tokio::join!(self.finish_round(current), self.start_round());
            total.add(done?);
            match next? {
                Some(next) => {
                    read += next.read;
                    current = next;
                }
                None => return Ok((total, read)),
            }
        }
        total.add(self.finish_round(current).await?);
        Ok((total, read))
    }

    /// After an error mid-round the in-memory cursor may be ahead of what was published:
    /// forget it. The next round takes the lease again (it is still ours) and scans from
    /// the persisted mark, republishing at worst (duplicates, in order).
    fn step_down(&self) {
        self.lock().take();
    }

    /// The retry path: claims due RETRY rows (and SENDING rows whose claim lease ran out)
    /// under a per-row lease, publishes them and marks each SENT or RETRY again. Cheap when
    /// there is nothing to retry: one index probe.
    pub async fn retry_once(&self) -> Result<RelayReport, RelayError> {
        if !store::retry_due(&self.pool).await? {
            return Ok(RelayReport::default());
        }
        let started = Instant::now();
        let claim =
            store::claim(&self.pool, self.config.batch_size, self.config.claim_lease).await?;
        if claim.rows.is_empty() {
            return Ok(RelayReport::default());
        }
        let records = records(&claim.rows);
        self.zero_series(&records);
        crash_point("relay.before_publish")?;
        let deliveries = enqueue_batch(
            &self.codec,
            &self.producer,
            &self.namespace,
            &records,
            self.config.publish_timeout,
        )
        .await;
        self.finish_round(Started {
            epoch: None,
            read: claim.rows.len(),
            rows: claim.rows,
            records,
            lease_until: Some(claim.lease_until),
            deliveries,
            started,
        })
        .await
    }

    /// Relays until `stop` turns true (or its sender is dropped), then returns after the
    /// batch in flight has been published and marked. Retryable database errors are logged
    /// and waited out; a fatal one stops the relay with the error.
    pub async fn run(self, stop: watch::Receiver<bool>) -> Result<(), RelayError> {
        // Without the PROCESS privilege gaps close by timeout: say so at start, not at the
        // first gap.
        match store::open_transactions(&self.pool).await {
            Err(e) if failure::is_access_denied(&e) => self.warn_no_trx_view(&e),
            // Any other failure is the database's, met again (and handled) by the rounds.
            _ => {}
        }
        tracing::info!(
            batch_size = self.config.batch_size,
            min_poll = ?self.config.min_poll,
            max_poll = ?self.config.max_poll,
            "outbox relay started"
        );
        let result = tokio::try_join!(
            self.publish_loop(stop.clone()),
            self.purge_loop(stop.clone()),
            self.gauge_loop(stop),
        );
        // A clean stop hands the lead over at once instead of after the lease.
        let lead = self.lock().take().map(|l| l.epoch);
        if let Some(epoch) = lead {
            if let Err(e) = store::release(&self.pool, &self.owner, epoch).await {
                tracing::warn!(error = %e, "releasing the outbox relay lease failed; it runs out by itself");
            }
        }
        tracing::info!("outbox relay stopped");
        result.map(|_| ())
    }

    async fn publish_loop(&self, stop: watch::Receiver<bool>) -> Result<(), RelayError> {
        let batch = self.config.batch_size as usize;
        let cadence = Cadence::adaptive(self.config.min_poll, self.config.max_poll)
            .with_linger(self.config.linger);
        // A round that keeps failing (MySQL refusing or down) is said when its error
        // changes, not at every backoff.
        let said = stocksvr_pipeline::causes::OnChange::default();
        let said = &said;
        periodic::run("outbox relay", cadence, Some(&self.wake), stop, || async move {
            let drained = self.drain_counting(DRAIN_ROUNDS).await;
            if let Ok((r, read)) = &drained {
                let moved = r.claimed.max(*read) as u64;
                if moved > 0 {
                    self.moved.fetch_add(moved, Ordering::Relaxed);
                    // The first rows after a quiet spell end the gauge loop's idle sleep
                    // (a busy one keeps its own pace).
                    if self.gauge_idle.swap(false, Ordering::Relaxed) {
                        self.gauge_wake.notify_one();
                    }
                }
            }
            if drained.is_ok() && said.recovered() {
                tracing::info!("outbox relay rounds succeed again");
            }
            match drained {
                Ok((r, read)) if r.claimed.max(read) >= batch * DRAIN_ROUNDS => Ok(Round::Full),
                Ok((r, read)) if r.claimed.max(read) > 0 => Ok(Round::Partial),
                Ok(_) => Ok(Round::Empty),
                Err(e) if e.is_retryable() => {
                    let error = e.to_string();
                    if said.failed(&error) {
                        tracing::warn!(%error, "outbox relay round failed; backing off (said again when the error changes)");
                    }
                    Ok(Round::Failed)
                }
                Err(e) => Err(e),
            }
        })
        .await
    }
}

/// A name for the lease, unique per relay instance: host, process and a per-process counter.
fn owner_name() -> String {
    use std::sync::atomic::AtomicU64;
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "relay".to_string());
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros());
    let mut name = format!(
        "{host}-{}-{started}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    name.truncate(128);
    name
}

/// Full rounds drained in one go before the loop looks at its stop signal again.
const DRAIN_ROUNDS: usize = 16;

/// A crash injected by a test (inert outside test builds, see `stocksvr-failpoint`): the
/// round ends there and writes nothing more, as a killed relay would.
fn crash_point(point: &'static str) -> Result<(), RelayError> {
    stocksvr_failpoint::hit(point).map_err(|e| RelayError::Mysql(sqlx::Error::Io(e.into_io())))
}

/// A processor spawns the relay on the runtime, so its futures must be `Send`; this fails to
/// compile if one stops being so (sqlx's `raw_sql` on a pooled connection did).
#[allow(dead_code)]
fn futures_are_send(relay: OutboxRelay, stop: watch::Receiver<bool>) {
    fn is_send<T: Send>(_: &T) {}
    is_send(&relay.relay_once());
    is_send(&relay.purge_once());
    is_send(&relay.refresh_backlog());
    is_send(&relay.run(stop));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_names_are_unique_per_relay() {
        assert_ne!(owner_name(), owner_name());
        assert!(owner_name().len() <= 128);
    }
}
