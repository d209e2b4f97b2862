//! The relay: the leader's scan (read by primary key → publish → move the high-water mark),
//! the per-row retry path, the adaptive poll loop, the purge and the gauges.

use crate::config::RelayConfig;
use crate::error::{sqlx_is_retryable, RelayError};
use crate::publish::{enqueue_batch, publish_delay, Enqueued, RowFailure};
use crate::store::{self, status, Backlog, ClaimedRow, Failure, ScannedRow};
use backon::{ExponentialBuilder, Retryable};
use sqlx::MySqlPool;
use std::collections::{BTreeMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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

/// InnoDB refreshes `INNODB_TRX` at most every 100 ms: a reading made this long after a gap
/// was seen reflects the server after that moment, so it lists every transaction that could
/// still own the gap.
const TRX_READING_DELAY: Duration = Duration::from_millis(500);

/// What the open transactions say this round.
enum Reading {
    /// Not asked: no gap is old enough to be judged.
    NotNow,
    /// The ids of the transactions open on the server.
    Open(HashSet<u64>),
    /// `INNODB_TRX` refused: gaps close by `gap_timeout`.
    Refused,
}

/// Open gaps re-read per round, lowest first (they hold the mark back).
const GAPS_PER_READ: usize = 64;

/// Ids missing below rows already seen: not committed yet, rolled back, or never written.
#[derive(Debug, Clone)]
struct Gap {
    /// Last missing id of the range (the map key is the first).
    hi: u64,
    seen: Instant,
    /// The transactions open when the gap was first judged (a reading at least
    /// `TRX_READING_DELAY` after it was seen), less those that have ended since. Any
    /// transaction that allocated an id of the gap had started before the gap was seen, so
    /// it is in this set until it ends; once the set is empty, one last read finds whatever
    /// it committed and the rest never existed.
    owners: Option<HashSet<u64>>,
}

/// What the leader keeps in memory. Everything at or below `cursor` is published, in flight,
/// RETRY, or an open gap; the mark passes only what is none of the last two.
struct Leadership {
    epoch: u64,
    /// The mark as last written.
    hwm: u64,
    cursor: u64,
    gaps: BTreeMap<u64, Gap>,
    /// The lowest published id of each round started and not finished, in start order.
    in_flight: VecDeque<u64>,
    /// When the last write that renewed the lease was sent (local clock, only compared with
    /// itself).
    renewed: Instant,
}

impl Leadership {
    /// The highest id below which nothing is left: no open gap, nothing in flight.
    fn settled(&self) -> u64 {
        let mut mark = self.cursor;
        if let Some((lo, _)) = self.gaps.first_key_value() {
            mark = mark.min(lo - 1);
        }
        if let Some(lowest) = self.in_flight.iter().min() {
            mark = mark.min(lowest - 1);
        }
        mark.max(self.hwm)
    }

    /// Removes `id` from the open gaps (it was found), splitting its range.
    fn found(&mut self, id: u64) {
        let Some((&lo, gap)) = self.gaps.range(..=id).next_back() else {
            return;
        };
        if gap.hi < id {
            return;
        }
        let gap = gap.clone();
        self.gaps.remove(&lo);
        if lo < id {
            self.gaps.insert(
                lo,
                Gap {
                    hi: id - 1,
                    ..gap.clone()
                },
            );
        }
        if id < gap.hi {
            self.gaps.insert(id + 1, gap);
        }
    }
}

/// A round on the producer's queue, its acknowledgements not awaited yet.
struct Started {
    /// The leader's epoch for a scan round; `None` for a retry round.
    epoch: Option<u64>,
    rows: Vec<ClaimedRow>,
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

    /// Makes sure this relay leads: `Some((epoch, cursor))` when it does.
    async fn lead(&self) -> Result<Option<(u64, u64)>, RelayError> {
        {
            let mut guard = self.lock();
            if let Some(l) = guard.as_ref() {
                // A lease that may have run out by now is not trusted: the next write
                // would tell, but publishing first could race a new leader for nothing.
                if l.renewed.elapsed() < self.config.claim_lease.mul_f64(0.8) {
                    return Ok(Some((l.epoch, l.cursor)));
                }
                guard.take();
            }
        }
        let cursor = store::cursor(&self.pool).await?;
        if !cursor.free && cursor.owner.as_deref() != Some(self.owner.as_str()) {
            return Ok(None);
        }
        let renewed = Instant::now();
        let Some((epoch, hwm)) = store::acquire(
            &self.pool,
            &self.owner,
            cursor.epoch,
            self.config.claim_lease,
        )
        .await?
        else {
            return Ok(None);
        };
        tracing::info!(owner = %self.owner, epoch, hwm, "outbox relay took the lead");
        *self.lock() = Some(Leadership {
            epoch,
            hwm,
            cursor: hwm,
            gaps: BTreeMap::new(),
            in_flight: VecDeque::new(),
            renewed,
        });
        Ok(Some((epoch, hwm)))
    }

    /// The leader's half-round: reads new rows above the cursor, re-reads open gaps (closing
    /// those no open transaction can fill any more) and enqueues the PENDING rows in id
    /// order. `None` when another relay leads.
    async fn start_round(&self) -> Result<Option<Started>, RelayError> {
        let started = Instant::now();
        let Some((epoch, cursor)) = self.lead().await? else {
            return Ok(None);
        };
        let scanned = store::scan(&self.pool, cursor, self.config.batch_size).await?;
        let seen = Instant::now();
        let read = scanned.len();
        let judge = {
            let mut guard = self.lock();
            let Some(l) = guard.as_mut().filter(|l| l.epoch == epoch) else {
                return Ok(None);
            };
            let mut next = l.cursor;
            for row in &scanned {
                if row.row.id > next + 1 {
                    l.gaps.insert(
                        next + 1,
                        Gap {
                            hi: row.row.id - 1,
                            seen,
                            owners: None,
                        },
                    );
                }
                next = next.max(row.row.id);
            }
            l.cursor = next;
            // Registered with the cursor's move, so a concurrent finish never puts the
            // mark over rows read but not yet published.
            l.in_flight
                .push_back(scanned.first().map_or(u64::MAX, |r| r.row.id));
            // Most gaps are transactions committing out of order: they are re-read every
            // round while open, so such a row goes out with the next round. Judging them
            // against the open transactions waits until one is old enough for INNODB_TRX.
            (!l.gaps.is_empty())
                .then(|| l.gaps.values().any(|g| g.seen + TRX_READING_DELAY <= seen))
        };
        let found = match judge {
            Some(judge) => self.reread_gaps(epoch, judge).await?,
            None => Vec::new(),
        };
        let mut rows: Vec<ClaimedRow> = found
            .into_iter()
            .chain(scanned)
            .filter(|r| r.status == status::PENDING)
            .map(|r| r.row)
            .collect();
        // Publishing in id order keeps one key's events in the order they were written.
        rows.sort_by_key(|row| row.id);
        self.zero_series(&rows);
        // Seed §10.2 window 5 in tests: read, nothing published.
        crash_point("relay.before_publish")?;
        let deliveries = enqueue_batch(
            &self.codec,
            &self.producer,
            &self.namespace,
            &rows,
            self.config.publish_timeout,
        )
        .await;
        Ok(Some(Started {
            epoch: Some(epoch),
            rows,
            read,
            lease_until: None,
            deliveries,
            started,
        }))
    }

    fn warn_no_trx_view(&self, e: &sqlx::Error) {
        if !self.no_trx_view.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                error = %e,
                gap_timeout = ?self.config.gap_timeout,
                "information_schema.INNODB_TRX refused (PROCESS privilege missing): an outbox \
                 id missing below published rows is taken as never written after gap_timeout, \
                 and a row committed later than that is not published"
            );
        }
    }

    /// Judges the open gaps old enough against the open transactions, then re-reads the
    /// lowest ones: rows found there are returned (to publish) and taken out of the gaps,
    /// and a gap no transaction can fill any more is closed after that read.
    async fn reread_gaps(&self, epoch: u64, judge: bool) -> Result<Vec<ScannedRow>, RelayError> {
        let asked = Instant::now();
        let reading = if !judge {
            Reading::NotNow
        } else if self.no_trx_view.load(Ordering::Relaxed) {
            Reading::Refused
        } else {
            match store::open_transactions(&self.pool).await {
                Ok(ids) => Reading::Open(ids.into_iter().collect()),
                Err(e) if store::is_access_denied(&e) => {
                    self.warn_no_trx_view(&e);
                    Reading::Refused
                }
                Err(e) => return Err(e.into()),
            }
        };
        let (ranges, closable) = {
            let mut guard = self.lock();
            let Some(l) = guard.as_mut().filter(|l| l.epoch == epoch) else {
                return Ok(Vec::new());
            };
            let mut closable = HashSet::new();
            for (&lo, gap) in l.gaps.iter_mut().take(GAPS_PER_READ) {
                match &reading {
                    Reading::Open(open) if gap.seen + TRX_READING_DELAY <= asked => {
                        let owners = gap.owners.get_or_insert_with(|| open.clone());
                        owners.retain(|id| open.contains(id));
                        if owners.is_empty() {
                            closable.insert(lo);
                        }
                    }
                    Reading::Open(_) | Reading::NotNow => {}
                    Reading::Refused => {
                        if gap.seen + self.config.gap_timeout <= asked {
                            closable.insert(lo);
                        }
                    }
                }
            }
            let ranges: Vec<(u64, u64)> = l
                .gaps
                .iter()
                .take(GAPS_PER_READ)
                .map(|(&lo, g)| (lo, g.hi))
                .collect();
            (ranges, closable)
        };
        // After the reading: whatever a finished owner committed is visible to this read.
        let found = store::read_ranges(&self.pool, &ranges).await?;
        let mut guard = self.lock();
        let Some(l) = guard.as_mut().filter(|l| l.epoch == epoch) else {
            return Ok(Vec::new());
        };
        for lo in &closable {
            if let Some(gap) = l.gaps.remove(lo) {
                tracing::debug!(from = lo, to = gap.hi, "outbox id gap closed");
            }
        }
        for row in &found {
            l.found(row.row.id);
        }
        // The rows found are this round's now: it holds the mark below them until they
        // are acknowledged (or put into RETRY).
        if let (Some(lowest), Some(back)) = (found.first(), l.in_flight.back_mut()) {
            *back = (*back).min(lowest.row.id);
        }
        Ok(found)
    }

    /// Waits for a round's acknowledgements, puts the failed rows into RETRY and, for a
    /// scan round, moves the mark over everything now settled (renewing the lease).
    async fn finish_round(&self, round: Started) -> Result<RelayReport, RelayError> {
        let Started {
            epoch,
            rows,
            read: _,
            lease_until,
            deliveries,
            started,
        } = round;
        let outcomes = deliveries.acknowledged().await;
        let mut sent = Vec::with_capacity(rows.len());
        let mut delays = Vec::with_capacity(rows.len());
        let mut failed = Vec::new();
        for (row, outcome) in rows.iter().zip(outcomes) {
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
                Err(failure) => failed.push(self.failure(row, failure)),
            }
        }
        // Seed §10.2 window 6 in tests: the broker acknowledged, nothing recorded.
        crash_point("relay.after_publish")?;
        let report = match (epoch, lease_until) {
            (Some(epoch), _) => self.settle(epoch, &sent, &failed).await?,
            (None, Some(lease_until)) => self.mark_claimed(lease_until, &sent, &failed).await?,
            (None, None) => RelayReport::default(),
        };
        // Recorded once the outcome is: a row acknowledged but not recorded (this round
        // failed) is published again, and its delay then runs to that acknowledgement.
        for delay in delays {
            metrics::histogram!(names::OUTBOX_PUBLISH_DELAY_SECONDS).record(delay.as_secs_f64());
        }
        if !rows.is_empty() {
            metrics::histogram!(names::OUTBOX_BATCH_PUBLISH_SECONDS)
                .record(started.elapsed().as_secs_f64());
        }
        Ok(RelayReport {
            claimed: rows.len(),
            ..report
        })
    }

    fn failure(&self, row: &ClaimedRow, failure: RowFailure) -> Failure {
        metrics::counter!(names::OUTBOX_PUBLISH_FAILURES, "topic" => row.topic.clone(), "event_type" => row.event_type.clone(), "reason" => failure.label())
            .increment(1);
        let reason = failure.reason();
        match &failure {
            // A row that cannot be encoded will not heal by itself: a person has to look
            // at the payload or the schema.
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
        Failure {
            id: row.id,
            retry_after: backoff::delay(
                row.retry_count,
                self.config.retry_initial,
                self.config.retry_max,
                backoff::jitter(),
            ),
            reason,
        }
    }

    /// A scan round's outcome: failed rows to RETRY first (the mark may pass them only
    /// once the retry path owns them), then the mark over everything settled, in one
    /// compare-and-set that also renews the lease.
    async fn settle(
        &self,
        epoch: u64,
        sent: &[u64],
        failed: &[Failure],
    ) -> Result<RelayReport, RelayError> {
        let retried = with_retries("putting outbox rows into RETRY", || {
            store::retry_later(&self.pool, failed)
        })
        .await?;
        let (mark, renew) = {
            let mut guard = self.lock();
            let Some(l) = guard.as_mut().filter(|l| l.epoch == epoch) else {
                return Ok(RelayReport::default());
            };
            l.in_flight.pop_front();
            let mark = l.settled();
            // An idle leader renews at a third of the lease, so a missed write or two
            // still leaves it leading.
            let renew = l.renewed.elapsed() >= self.config.claim_lease / 3;
            (mark, renew || mark > l.hwm)
        };
        if renew {
            let sent_at = Instant::now();
            let held = with_retries("moving the outbox mark", || {
                store::advance(
                    &self.pool,
                    &self.owner,
                    epoch,
                    mark,
                    self.config.claim_lease,
                )
            })
            .await?;
            let mut guard = self.lock();
            if held {
                if let Some(l) = guard.as_mut().filter(|l| l.epoch == epoch) {
                    l.hwm = l.hwm.max(mark);
                    l.renewed = sent_at;
                }
            } else {
                tracing::warn!(
                    owner = %self.owner, epoch,
                    "outbox relay lease taken over; this relay stops publishing new rows \
                     (rows it published above the mark will be published again)"
                );
                guard.take();
            }
        }
        Ok(RelayReport {
            claimed: 0,
            sent: sent.len(),
            failed: retried as usize,
        })
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
        self.zero_series(&claim.rows);
        crash_point("relay.before_publish")?;
        let deliveries = enqueue_batch(
            &self.codec,
            &self.producer,
            &self.namespace,
            &claim.rows,
            self.config.publish_timeout,
        )
        .await;
        self.finish_round(Started {
            epoch: None,
            read: claim.rows.len(),
            rows: claim.rows,
            lease_until: Some(claim.lease_until),
            deliveries,
            started,
        })
        .await
    }

    async fn mark_claimed(
        &self,
        lease_until: chrono::NaiveDateTime,
        sent: &[u64],
        failed: &[Failure],
    ) -> Result<RelayReport, RelayError> {
        // The broker has the records now; losing this write would only mean publishing them
        // again after the lease, so it is worth a few quick retries.
        let marked = with_retries("marking outbox rows", || {
            store::mark(&self.pool, lease_until, sent, failed)
        })
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
        Ok(RelayReport {
            claimed: 0,
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

    /// Deletes sent rows older than the retention, in batches of `purge_batch` walking the
    /// primary key up to the mark, until a batch reaches rows still inside the retention.
    /// Returns the number of rows deleted.
    #[tracing::instrument(skip_all, err)]
    pub async fn purge_once(&self) -> Result<u64, RelayError> {
        let mut total = 0;
        let mut after = 0;
        loop {
            let purged = store::purge_batch(
                &self.pool,
                self.config.retention,
                after,
                self.config.purge_batch,
            )
            .await?;
            total += purged.deleted;
            metrics::counter!(names::OUTBOX_PURGED).increment(purged.deleted);
            match purged.next {
                Some(next) => after = next,
                None => break,
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
        // Without the PROCESS privilege gaps close by timeout: say so at start, not at the
        // first gap.
        match store::open_transactions(&self.pool).await {
            Err(e) if store::is_access_denied(&e) => self.warn_no_trx_view(&e),
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
        periodic::run("outbox relay", cadence, Some(&self.wake), stop, || async {
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
            match drained {
                Ok((r, read)) if r.claimed.max(read) >= batch * DRAIN_ROUNDS => Ok(Round::Full),
                Ok((r, read)) if r.claimed.max(read) > 0 => Ok(Round::Partial),
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

    /// Refreshes the backlog gauges every `gauge_every` while there is a backlog or the relay
    /// moves rows; while neither, the gap doubles up to `gauge_idle_every`, and the relay's
    /// first round that moves rows ends it at once.
    async fn gauge_loop(&self, stop: watch::Receiver<bool>) -> Result<(), RelayError> {
        let cadence = Cadence::adaptive(self.config.gauge_every, self.config.gauge_idle_every);
        periodic::run(
            "outbox gauges",
            cadence,
            Some(&self.gauge_wake),
            stop,
            || async {
                let moved = self.moved.swap(0, Ordering::Relaxed);
                // A gauge is best effort: a failed read leaves the last value and is logged.
                let round = match self.refresh_backlog().await {
                    Ok(backlog) => gauge_round(&backlog, moved),
                    Err(e) => {
                        tracing::warn!(error = %e, "reading the outbox backlog failed");
                        Round::Failed
                    }
                };
                self.gauge_idle
                    .store(round == Round::Empty, Ordering::Relaxed);
                Ok(round)
            },
        )
        .await
    }
}

/// The gauge loop's rhythm after a reading: busy while rows wait or the relay moved some since
/// the last reading, idle otherwise.
fn gauge_round(backlog: &Backlog, moved: u64) -> Round {
    if backlog.rows > 0 || moved > 0 {
        Round::Partial
    } else {
        Round::Empty
    }
}

/// Retries a write whose loss would only cost republishing (the broker has the records).
async fn with_retries<T, F, Fut>(what: &'static str, write: F) -> Result<T, sqlx::Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, sqlx::Error>>,
{
    write
        .retry(
            ExponentialBuilder::default()
                .with_min_delay(Duration::from_millis(50))
                .with_max_delay(Duration::from_secs(1))
                .with_max_times(4),
        )
        .when(sqlx_is_retryable)
        .notify(|e, after| tracing::warn!(error = %e, ?after, "{what} failed; retrying"))
        .await
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

    fn leadership(cursor: u64, gaps: &[(u64, u64)], in_flight: &[u64]) -> Leadership {
        let seen = Instant::now();
        Leadership {
            epoch: 1,
            hwm: 0,
            cursor,
            gaps: gaps
                .iter()
                .map(|&(lo, hi)| {
                    (
                        lo,
                        Gap {
                            hi,
                            seen,
                            owners: None,
                        },
                    )
                })
                .collect(),
            in_flight: in_flight.iter().copied().collect(),
            renewed: seen,
        }
    }

    fn ranges(l: &Leadership) -> Vec<(u64, u64)> {
        l.gaps.iter().map(|(&lo, g)| (lo, g.hi)).collect()
    }

    #[test]
    fn the_mark_stops_below_the_lowest_gap_and_the_lowest_row_in_flight() {
        assert_eq!(leadership(100, &[], &[]).settled(), 100);
        assert_eq!(leadership(100, &[(40, 45)], &[]).settled(), 39);
        assert_eq!(leadership(100, &[(40, 45)], &[90, 30]).settled(), 29);
        // An empty round in flight holds nothing back.
        assert_eq!(leadership(100, &[], &[u64::MAX]).settled(), 100);
        // Never below the mark already written.
        let mut l = leadership(100, &[(40, 45)], &[]);
        l.hwm = 50;
        assert_eq!(l.settled(), 50);
    }

    #[test]
    fn a_row_found_in_a_gap_splits_it() {
        let mut l = leadership(100, &[(10, 20), (30, 30)], &[]);
        l.found(15);
        assert_eq!(ranges(&l), [(10, 14), (16, 20), (30, 30)]);
        l.found(10);
        l.found(20);
        assert_eq!(ranges(&l), [(11, 14), (16, 19), (30, 30)]);
        l.found(30);
        assert_eq!(ranges(&l), [(11, 14), (16, 19)]);
        // Outside every gap: nothing changes.
        l.found(25);
        l.found(5);
        assert_eq!(ranges(&l), [(11, 14), (16, 19)]);
    }

    #[test]
    fn the_gauges_refresh_fast_only_while_rows_wait_or_move() {
        let backlog = |rows| Backlog {
            rows,
            oldest_age: Duration::ZERO,
        };
        assert_eq!(gauge_round(&backlog(0), 0), Round::Empty);
        assert_eq!(gauge_round(&backlog(3), 0), Round::Partial);
        assert_eq!(gauge_round(&backlog(0), 500), Round::Partial);
    }

    #[test]
    fn lease_names_are_unique_per_relay() {
        assert_ne!(owner_name(), owner_name());
        assert!(owner_name().len() <= 128);
    }
}
