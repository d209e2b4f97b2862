//! The relay: claim → publish → mark, the adaptive poll loop, the purge and the gauges.

use crate::config::RelayConfig;
use crate::error::{sqlx_is_retryable, RelayError};
use crate::publish::{enqueue_batch, publish_delay, Enqueued, RowFailure};
use crate::store::{self, Backlog, Failure};
use backon::{ExponentialBuilder, Retryable};
use sqlx::MySqlPool;
use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use stocksvr_core::backoff;
use stocksvr_pipeline::codec::AvroCodec;
use stocksvr_pipeline::periodic::{self, Cadence, Round};
use stocksvr_pipeline::producer::Producer;
use stocksvr_pipeline::topics::Namespace;
use stocksvr_telemetry::names;
use tokio::sync::{watch, Notify};

/// What one round did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RelayReport {
    /// Rows claimed (leased) by this round.
    pub claimed: usize,
    /// Rows the broker acknowledged and that are now SENT.
    pub sent: usize,
    /// Rows that went to RETRY.
    pub failed: usize,
}

/// A claimed batch on the producer's queue, its acknowledgements not awaited yet.
struct Started {
    claim: store::Claim,
    deliveries: Enqueued,
    started: Instant,
}

impl RelayReport {
    fn add(&mut self, other: RelayReport) {
        self.claimed += other.claimed;
        self.sent += other.sent;
        self.failed += other.failed;
    }
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
    /// (topic, event type) pairs whose counters exist already (see `zero_series`).
    seen: Mutex<HashSet<(String, String)>>,
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
            seen: Mutex::new(HashSet::new()),
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

    /// A service that committed outbox rows calls `notify_one()` on this so the relay
    /// publishes at once instead of at its next poll. A notification sent while the relay
    /// is busy is kept and ends its next sleep, so none is lost.
    pub fn waker(&self) -> Arc<Notify> {
        self.wake.clone()
    }

    /// One round: claim a batch, publish it, and record each row's outcome.
    ///
    /// A row is SENT only after the broker acknowledged it; every other outcome (payload
    /// off its schema, registry or broker failure, timeout) is RETRY with backoff and the
    /// reason, and never holds up the other rows of the batch.
    #[tracing::instrument(skip_all, err)]
    pub async fn relay_once(&self) -> Result<RelayReport, RelayError> {
        match self.start_round().await? {
            Some(round) => self.finish_round(round).await,
            None => Ok(RelayReport::default()),
        }
    }

    /// Rounds back to back while they come back full, each claimed and enqueued while the
    /// previous one waits for its acknowledgements and is marked: a round then costs the
    /// longer of the two halves instead of their sum. The next round is enqueued only after
    /// the previous one was, so one key's records still reach their partition in id order
    /// (the idempotent producer keeps that order through its own retries). At most
    /// `max_rounds`, so a stop request is seen between drains.
    pub async fn drain(&self, max_rounds: usize) -> Result<RelayReport, RelayError> {
        let batch = self.config.batch_size as usize;
        let Some(mut current) = self.start_round().await? else {
            return Ok(RelayReport::default());
        };
        let mut total = RelayReport::default();
        for _ in 1..max_rounds.max(1) {
            if current.claim.rows.len() < batch {
                break;
            }
            let (done, next) = tokio::join!(self.finish_round(current), self.start_round());
            total.add(done?);
            match next? {
                Some(next) => current = next,
                None => return Ok(total),
            }
        }
        total.add(self.finish_round(current).await?);
        Ok(total)
    }

    /// Claims a batch and enqueues it on the producer; `None` when nothing is due.
    async fn start_round(&self) -> Result<Option<Started>, RelayError> {
        let started = Instant::now();
        let claim =
            store::claim(&self.pool, self.config.batch_size, self.config.claim_lease).await?;
        if claim.rows.is_empty() {
            return Ok(None);
        }
        self.zero_series(&claim.rows);
        // Seed §10.2 window 5 in tests: claimed (SENDING under a lease), nothing published.
        crash_point("relay.before_publish")?;
        let deliveries = enqueue_batch(
            &self.codec,
            &self.producer,
            &self.namespace,
            &claim.rows,
            self.config.publish_timeout,
        )
        .await;
        Ok(Some(Started {
            claim,
            deliveries,
            started,
        }))
    }

    /// Waits for a started round's acknowledgements and writes each row's outcome.
    async fn finish_round(&self, round: Started) -> Result<RelayReport, RelayError> {
        let Started {
            claim,
            deliveries,
            started,
        } = round;
        let outcomes = deliveries.acknowledged().await;
        let mut sent = Vec::with_capacity(claim.rows.len());
        let mut delays = Vec::with_capacity(claim.rows.len());
        let mut failed = Vec::new();
        for (row, outcome) in claim.rows.iter().zip(outcomes) {
            match outcome {
                Ok(acked) => {
                    sent.push(row.id);
                    delays.push(publish_delay(row.created_at, acked));
                    metrics::counter!(names::OUTBOX_PUBLISHED, "topic" => row.topic.clone(), "event_type" => row.event_type.clone())
                        .increment(1);
                    // The topic as written, as the lag exporter sees it on the broker.
                    metrics::counter!(names::EVENTS_PRODUCED, "topic" => self.namespace.topic(&row.topic))
                        .increment(1);
                }
                Err(failure) => {
                    metrics::counter!(names::OUTBOX_PUBLISH_FAILURES, "topic" => row.topic.clone(), "event_type" => row.event_type.clone(), "reason" => failure.label())
                        .increment(1);
                    let reason = failure.reason();
                    match &failure {
                        // A row that cannot be encoded will not heal by itself: a person
                        // has to look at the payload or the schema.
                        RowFailure::Encode(_) => tracing::error!(
                            outbox_id = row.id, event_id = %row.event_id, event_type = %row.event_type,
                            topic = %row.topic, retry_count = row.retry_count, error = %reason,
                            "outbox row cannot be encoded; it stays in RETRY"
                        ),
                        _ => tracing::warn!(
                            outbox_id = row.id, event_id = %row.event_id, topic = %row.topic,
                            retry_count = row.retry_count, error = %reason,
                            "outbox row not acknowledged; it will be retried"
                        ),
                    }
                    failed.push(Failure {
                        id: row.id,
                        retry_after: backoff::delay(
                            row.retry_count,
                            self.config.retry_initial,
                            self.config.retry_max,
                            backoff::jitter(),
                        ),
                        reason,
                    });
                }
            }
        }
        // Seed §10.2 window 6 in tests: the broker acknowledged, the rows are not marked SENT.
        crash_point("relay.after_publish")?;
        // The broker has the records now; losing this write would only mean publishing them
        // again after the lease, so it is worth a few quick retries.
        let lease_until = claim.lease_until;
        let marked = (|| store::mark(&self.pool, lease_until, &sent, &failed))
            .retry(
                ExponentialBuilder::default()
                    .with_min_delay(Duration::from_millis(50))
                    .with_max_delay(Duration::from_secs(1))
                    .with_max_times(4),
            )
            .when(sqlx_is_retryable)
            .notify(|e, after| tracing::warn!(error = %e, ?after, "marking outbox rows failed; retrying"))
            .await?;
        let lost =
            ((sent.len() + failed.len()) as u64).saturating_sub(marked.sent + marked.retried);
        if lost > 0 {
            // Only possible when a batch outlived its lease (it should not: publish_timeout
            // is below claim_lease) and another relay claimed the rows meanwhile.
            tracing::warn!(
                lost,
                "lease lost on outbox rows before their outcome was written; they may be published twice"
            );
        }
        // Recorded once the rows are SENT: a row acknowledged but not marked (this round
        // failed) is published again, and its delay then runs to that acknowledgement.
        for delay in delays {
            metrics::histogram!(names::OUTBOX_PUBLISH_DELAY_SECONDS).record(delay.as_secs_f64());
        }
        metrics::histogram!(names::OUTBOX_BATCH_PUBLISH_SECONDS)
            .record(started.elapsed().as_secs_f64());
        Ok(RelayReport {
            claimed: claim.rows.len(),
            sent: marked.sent as usize,
            failed: marked.retried as usize,
        })
    }

    /// The first time this relay sees a (topic, event type), its published, failure (every
    /// reason) and produced counters are created at 0: an alert on `increase()` of a failure
    /// then sees 0, not "no data", until the first one. The topics are only known from the
    /// rows, so they cannot be created at start-up.
    fn zero_series(&self, rows: &[crate::store::ClaimedRow]) {
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        for row in rows {
            if !seen.insert((row.topic.clone(), row.event_type.clone())) {
                continue;
            }
            let (topic, event_type) = (row.topic.clone(), row.event_type.clone());
            stocksvr_telemetry::zero_counter(
                names::OUTBOX_PUBLISHED,
                &[("topic", topic.clone()), ("event_type", event_type.clone())],
            );
            for reason in RowFailure::LABELS {
                stocksvr_telemetry::zero_counter(
                    names::OUTBOX_PUBLISH_FAILURES,
                    &[
                        ("topic", topic.clone()),
                        ("event_type", event_type.clone()),
                        ("reason", reason.to_string()),
                    ],
                );
            }
            stocksvr_telemetry::zero_counter(
                names::EVENTS_PRODUCED,
                &[("topic", self.namespace.topic(&topic))],
            );
        }
    }

    /// Deletes SENT rows older than the retention, in batches of `purge_batch`, until a
    /// batch comes back short. Returns the number of rows deleted.
    #[tracing::instrument(skip_all, err)]
    pub async fn purge_once(&self) -> Result<u64, RelayError> {
        let mut total = 0;
        loop {
            let (found, deleted) =
                store::purge_batch(&self.pool, self.config.retention, self.config.purge_batch)
                    .await?;
            total += deleted;
            metrics::counter!(names::OUTBOX_PURGED).increment(deleted);
            if found < self.config.purge_batch as usize {
                break;
            }
        }
        if total > 0 {
            tracing::info!(deleted = total, "purged sent outbox rows");
        }
        Ok(total)
    }

    /// Reads the backlog and sets the backlog gauges.
    pub async fn refresh_backlog(&self) -> Result<Backlog, RelayError> {
        let backlog = store::backlog(&self.pool).await?;
        metrics::gauge!(names::OUTBOX_BACKLOG).set(backlog.rows as f64);
        metrics::gauge!(names::OUTBOX_OLDEST_PENDING_SECONDS).set(backlog.oldest_age.as_secs_f64());
        Ok(backlog)
    }

    /// Relays until `stop` turns true (or its sender is dropped), then returns after the
    /// batch in flight has been published and marked. Retryable database errors are logged
    /// and waited out; a fatal one stops the relay with the error.
    pub async fn run(self, stop: watch::Receiver<bool>) -> Result<(), RelayError> {
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
        tracing::info!("outbox relay stopped");
        result.map(|_| ())
    }

    async fn publish_loop(&self, stop: watch::Receiver<bool>) -> Result<(), RelayError> {
        let batch = self.config.batch_size as usize;
        let cadence = Cadence::adaptive(self.config.min_poll, self.config.max_poll);
        periodic::run("outbox relay", cadence, Some(&self.wake), stop, || async {
            match self.drain(DRAIN_ROUNDS).await {
                Ok(r) if r.claimed >= batch * DRAIN_ROUNDS => Ok(Round::Full),
                Ok(r) if r.claimed > 0 => Ok(Round::Partial),
                Ok(_) => Ok(Round::Empty),
                Err(e) if e.is_retryable() => {
                    tracing::warn!(error = %e, "outbox relay round failed; backing off");
                    Ok(Round::Failed)
                }
                Err(e) => Err(e),
            }
        })
        .await
    }

    async fn purge_loop(&self, stop: watch::Receiver<bool>) -> Result<(), RelayError> {
        let cadence = Cadence::fixed(self.config.purge_every);
        periodic::run("outbox purge", cadence, None, stop, || async {
            match self.purge_once().await {
                Ok(_) => Ok(Round::Partial),
                Err(e) if e.is_retryable() => {
                    tracing::warn!(error = %e, "outbox purge failed; trying at the next interval");
                    Ok(Round::Failed)
                }
                Err(e) => Err(e),
            }
        })
        .await
    }

    async fn gauge_loop(&self, stop: watch::Receiver<bool>) -> Result<(), RelayError> {
        let cadence = Cadence::fixed(self.config.gauge_every);
        periodic::run("outbox gauges", cadence, None, stop, || async {
            // A gauge is best effort: a failed read leaves the last value and is logged.
            if let Err(e) = self.refresh_backlog().await {
                tracing::warn!(error = %e, "reading the outbox backlog failed");
            }
            Ok(Round::Partial)
        })
        .await
    }
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
