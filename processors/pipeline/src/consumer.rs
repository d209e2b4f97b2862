//! The consumer loop every processor shares: decode, apply, dead-letter, commit; and wait out
//! an outage without losing its place.
//!
//! Delivery: at-least-once. A record's offset is stored only after its effect is durable
//! (the handler returned) or its dead letter was acknowledged; stored offsets are committed
//! every second, synchronously when partitions are revoked, and at shutdown. Records of one
//! partition are handled in order, one batch at a time.
//!
//! Errors come in the three classes of [`crate::failure`]:
//!
//! - **Invalid** (undecodable, unknown schema, failed validation): the record goes to
//!   `<topic>.dlt` with its origin and the reason, and consumption moves on.
//! - **Dependency unavailable** (MySQL, Redis or the registry down or stalled): the loop pauses
//!   every assigned partition, keeps polling so the consumer stays in its group, retries the
//!   record with capped, jittered backoff and no attempt limit, and resumes by itself once it
//!   applies. An outage never turns a live record into a dead letter, and the records behind
//!   it keep their order. SIGTERM during an outage commits what was finished and stops.
//! - **Fatal**: the processor stops and the process exits non-zero without committing past
//!   the record.
//!
//! `max.poll.interval.ms` is set from `consumer.max_poll_interval_ms` (default 120 s): the
//! loop polls between attempts, so only one attempt stands between two polls, and each
//! attempt is bounded by `consumer.attempt_timeout_ms` (30 s; every MySQL statement and Redis
//! call has a shorter deadline of its own). A process stuck past it is dropped from the group
//! and its partitions move to a healthy instance.

use crate::codec::{AvroCodec, DecodeError, Decoded};
use crate::config::{ConsumerSettings, KafkaSettings};
use crate::deadletter::{self, ErrorClass};
pub use crate::failure::{Dependency, Failure};
use crate::kafka;
use crate::telemetry::names;
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use rdkafka::client::ClientContext;
use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance, StreamConsumer,
};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, Message, OwnedMessage, Timestamp};
use rdkafka::TopicPartitionList;
use serde::de::DeserializeOwned;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::watch;

/// How a record ended, for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    Applied,
    /// Already applied earlier (inbox hit, terminal state): nothing changed.
    Duplicate,
    /// Handled by emitting a conflict (e.g. Confirm after Cancel) instead of a change.
    Conflict,
    /// Cannot apply yet (its predecessor has not arrived): parked durably and re-driven when
    /// the state it waits for is reached; the partition moves on.
    Deferred,
}

impl Applied {
    pub const fn label(self) -> &'static str {
        match self {
            Applied::Applied => "applied",
            Applied::Duplicate => "duplicate",
            Applied::Conflict => "conflict",
            Applied::Deferred => "deferred",
        }
    }
}

/// One record: decoded, or with a placeholder `event` when the loop runs [`LoopConfig::raw`].
#[derive(Debug, Clone)]
pub struct Record {
    pub message: OwnedMessage,
    pub event: Decoded,
}

impl Record {
    pub fn topic(&self) -> &str {
        self.message.topic()
    }
    pub fn partition(&self) -> i32 {
        self.message.partition()
    }
    pub fn offset(&self) -> i64 {
        self.message.offset()
    }

    /// The decoded value as the typed event `T`; a value off its contract is invalid.
    pub fn typed<T: DeserializeOwned>(&self) -> Result<T, Failure> {
        let name = self.event.full_name.as_str();
        self.event
            .clone()
            .into_typed(name)
            .map_err(|e| Failure::Invalid(format!("{name}: {e}")))
    }
}

/// A processor's logic: plain functions over decoded records.
pub trait Handler: Send + Sync + 'static {
    /// Applies `batch` (in partition order). `Ok` carries one result per record in order;
    /// it may stop early at a record whose dependency is unavailable (that record's result
    /// is the last one), since the records behind it must wait for it. `Err` fails the whole
    /// batch: the loop handles it again, so what of it is durable must be idempotent (one
    /// transaction rolled back, or the projector's lanes, each one committed or not, behind
    /// an inbox).
    #[allow(clippy::type_complexity)]
    fn handle<'a>(
        &'a self,
        batch: &'a [Record],
    ) -> BoxFuture<'a, Result<Vec<Result<Applied, Failure>>, Failure>>;
}

/// A processor that handles one record at a time: implement this and it is a [`Handler`]
/// that stops at the first record whose dependency is unavailable.
pub trait RecordHandler: Send + Sync + 'static {
    fn handle_one<'a>(&'a self, record: &'a Record) -> BoxFuture<'a, Result<Applied, Failure>>;

    /// Records of different keys handled at once within a batch. Records of one key (one
    /// order: the producer keys by it) are always handled one after another in partition
    /// order, so an order's events never overtake each other; 1 handles the whole batch in
    /// order. More than 1 needs effects that are idempotent per record (an inbox), because
    /// a record after an unavailable one may already be applied when the batch is cut
    /// there, and is then handled again.
    fn concurrency(&self) -> usize {
        1
    }
}

impl<T: RecordHandler> Handler for T {
    fn handle<'a>(
        &'a self,
        batch: &'a [Record],
    ) -> BoxFuture<'a, Result<Vec<Result<Applied, Failure>>, Failure>> {
        async move { Ok(by_key(batch, self.concurrency(), |record| self.handle_one(record)).await) }
            .boxed()
    }
}

/// What [`RecordHandler`] does with a batch, for a [`Handler`] that prepares the batch first
/// (one query for all its records, say) and then handles record by record: records of
/// different keys `width` at a time, records of one (topic, partition, key) one after
/// another in partition order. The results are in batch order up to the first record whose
/// dependency is unavailable (its result is the last one), as [`Handler::handle`] answers.
pub async fn by_key<'a, F, Fut>(
    batch: &'a [Record],
    width: usize,
    handle_one: F,
) -> Vec<Result<Applied, Failure>>
where
    F: Fn(&'a Record) -> Fut,
    Fut: std::future::Future<Output = Result<Applied, Failure>>,
{
    let width = width.max(1);
    if width == 1 || batch.len() == 1 {
        let mut results = Vec::with_capacity(batch.len());
        for record in batch {
            let result = handle_one(record).await;
            let stop = matches!(result, Err(Failure::Unavailable { .. }));
            results.push(result);
            if stop {
                break;
            }
        }
        return results;
    }
    // One chain of batch positions per (topic, partition, key), in partition order.
    let mut chains: Vec<Vec<usize>> = Vec::new();
    let mut chain_of: HashMap<(&str, i32, Option<&[u8]>), usize> = HashMap::new();
    for (i, record) in batch.iter().enumerate() {
        let key = (record.topic(), record.partition(), record.message.key());
        let chain = *chain_of.entry(key).or_insert_with(|| {
            chains.push(Vec::new());
            chains.len() - 1
        });
        chains[chain].push(i);
    }
    let handle_one = &handle_one;
    let outcomes: Vec<Vec<(usize, Result<Applied, Failure>)>> =
        futures::stream::iter(chains.into_iter().map(|chain| async move {
            let mut done = Vec::with_capacity(chain.len());
            for i in chain {
                let result = handle_one(&batch[i]).await;
                let stop = matches!(result, Err(Failure::Unavailable { .. }));
                done.push((i, result));
                if stop {
                    break;
                }
            }
            done
        }))
        .buffer_unordered(width)
        .collect()
        .await;
    let mut slots: Vec<Option<Result<Applied, Failure>>> = batch.iter().map(|_| None).collect();
    for (i, result) in outcomes.into_iter().flatten() {
        slots[i] = Some(result);
    }
    // The results in batch order up to the first record that could not be handled: the
    // loop stores offsets up to there and retries from it.
    let mut results = Vec::with_capacity(batch.len());
    for slot in slots {
        let Some(result) = slot else { break };
        let stop = matches!(result, Err(Failure::Unavailable { .. }));
        results.push(result);
        if stop {
            break;
        }
    }
    results
}

#[derive(Debug, Clone)]
pub struct LoopConfig {
    /// Processor name: metrics label, client id and group suffix (`<group_prefix>.<name>`).
    pub name: &'static str,
    pub topics: Vec<String>,
    /// Records handed to the handler at once (1 for per-record processors).
    pub max_batch: usize,
    /// Hand records over undecoded, with a placeholder `event` (schema id 0, empty name,
    /// `Null`): for processors that store bytes as they are (the dead-letter processor),
    /// whose input is by definition often not decodable.
    pub raw: bool,
    /// Backoff, attempt deadline and poll interval (`[consumer]`).
    pub consumer: ConsumerSettings,
}

impl LoopConfig {
    pub fn new(name: &'static str, topics: Vec<String>) -> Self {
        Self {
            name,
            topics,
            max_batch: 1,
            raw: false,
            consumer: ConsumerSettings::default(),
        }
    }

    /// The `[consumer]` section instead of its defaults.
    pub fn with_consumer(mut self, consumer: &ConsumerSettings) -> Self {
        self.consumer = consumer.clone();
        self
    }

    fn retry_delay(&self, attempt: u32) -> Duration {
        stocksvr_core::backoff::jittered(
            attempt,
            Duration::from_millis(self.consumer.retry_min_backoff_ms.max(1)),
            Duration::from_millis(self.consumer.retry_max_backoff_ms.max(1)),
        )
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LoopError {
    #[error("kafka: {0}")]
    Kafka(#[from] KafkaError),
    #[error("dead letter for {topic}/{partition}@{offset} could not be written: {source}")]
    DeadLetter {
        topic: String,
        partition: i32,
        offset: i64,
        source: KafkaError,
    },
    #[error("fatal failure on {topic}/{partition}@{offset}: {reason}")]
    Fatal {
        topic: String,
        partition: i32,
        offset: i64,
        reason: String,
    },
}

/// Commits finished work before partitions move to another instance, and keeps partitions
/// assigned during an outage paused. (Consumer lag is measured at the broker by the lag
/// exporter, which keeps reporting while this process is dead or stuck.)
struct LoopContext {
    name: &'static str,
    /// True while the loop waits out an outage: newly assigned partitions start paused.
    paused: Arc<AtomicBool>,
}

impl ClientContext for LoopContext {}

impl ConsumerContext for LoopContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(partitions) = rebalance {
            // Records are handled between polls, so every stored offset is finished work.
            match consumer.commit_consumer_state(CommitMode::Sync) {
                Ok(()) | Err(KafkaError::ConsumerCommit(RDKafkaErrorCode::NoOffset)) => {}
                Err(e) => {
                    tracing::warn!(processor = self.name, error = %e, "commit on revoke failed")
                }
            }
            tracing::info!(
                processor = self.name,
                partitions = partitions.count(),
                "partitions revoked"
            );
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(partitions) = rebalance {
            if self.paused.load(Ordering::SeqCst) {
                // The outage goes on: nothing may be fetched behind the waiting record.
                if let Err(e) = consumer.pause(partitions) {
                    tracing::warn!(processor = self.name, error = %e, "pausing new partitions failed");
                }
            } else if let Err(e) = consumer.resume(partitions) {
                // librdkafka keeps a partition paused across an unassign and a new assign.
                tracing::warn!(processor = self.name, error = %e, "resuming new partitions failed");
            }
            tracing::info!(
                processor = self.name,
                partitions = partitions.count(),
                "partitions assigned"
            );
        }
    }
}

/// Runs `handler` over `config.topics` until `stop` turns true, then commits and returns.
pub async fn run(
    settings: &KafkaSettings,
    codec: AvroCodec,
    config: LoopConfig,
    handler: Arc<dyn Handler>,
    mut stop: watch::Receiver<bool>,
) -> Result<(), LoopError> {
    let group = format!("{}.{}", settings.group_prefix, config.name);
    let paused = Arc::new(AtomicBool::new(false));
    let mut client = kafka::client_config(settings, config.name);
    // librdkafka prefetches up to 64 MB and 100,000 records per consumer by default: with
    // several consumers in one process that is hundreds of MB held after a backlog was read
    // (the allocator keeps the pages). A few MB still keeps a batch ready behind the one
    // being applied, which is all a loop that commits after the effect can use. The queue
    // bound is only checked before a fetch, and one fetch answer may carry 50 MB (1 MB per
    // partition): while a fresh group caught up on a backlog that was most of the process's
    // memory, in librdkafka's own (glibc) heap. 1 MB per answer still carries thousands of
    // our events. With a queue this small the fetcher often finds it full, and then waits
    // `fetch.queue.backoff.ms` (1 s by default) before it looks again: a fresh group caught
    // up at half the speed, the machine mostly idle. The operator's `kafka.properties` win.
    //
    // `fetch.wait.max.ms` is how long the broker holds a fetch that finds nothing new: a
    // record that arrives meanwhile is answered at once (fetch.min.bytes 1), so it adds no
    // latency, but each empty answer wakes the client to send the next fetch. At librdkafka's
    // 500 ms the four consumers of an idle `stocksvr all` made eight such round trips a
    // second; at 5 s they make less than one. librdkafka wants it at least 1 s below
    // `socket.timeout.ms` (`kafka.request_timeout_ms`, 10 s), which a held fetch must not
    // outlive.
    let fetch_wait = settings
        .request_timeout_ms
        .saturating_sub(1000)
        .clamp(100, 5000)
        .to_string();
    for (key, value) in [
        ("queued.max.messages.kbytes", "4096"),
        ("queued.min.messages", "2000"),
        ("fetch.max.bytes", "1048576"),
        ("max.partition.fetch.bytes", "262144"),
        ("fetch.queue.backoff.ms", "20"),
        ("fetch.wait.max.ms", fetch_wait.as_str()),
    ] {
        if client.get(key).is_none() {
            client.set(key, value);
        }
    }
    let consumer: StreamConsumer<LoopContext> = client
        .set("group.id", &group)
        .set("enable.auto.commit", "true")
        .set("auto.commit.interval.ms", "1000")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set(
            "max.poll.interval.ms",
            config.consumer.max_poll_interval_ms.to_string(),
        )
        .create_with_context(LoopContext {
            name: config.name,
            paused: paused.clone(),
        })?;
    let topics: Vec<&str> = config.topics.iter().map(String::as_str).collect();
    consumer.subscribe(&topics)?;
    let producer = kafka::producer(settings, config.name)?;
    for topic in &config.topics {
        for class in [ErrorClass::Invalid, ErrorClass::Undecodable] {
            stocksvr_telemetry::zero_counter(
                names::EVENTS_DEAD_LETTERED,
                &[
                    ("processor", config.name.to_string()),
                    ("topic", topic.clone()),
                    ("class", class.as_str().to_string()),
                ],
            );
        }
    }
    tracing::info!(processor = config.name, group, ?topics, "consuming");
    let record_age =
        metrics::histogram!(names::CONSUMER_RECORD_AGE_SECONDS, "processor" => config.name);
    let worker = Worker {
        codec,
        producer,
        group: group.clone(),
        config,
        handler,
        paused,
        record_age,
    };
    loop {
        let first = tokio::select! {
            _ = stop.wait_for(|s| *s) => break,
            m = consumer.recv() => m,
        };
        let first = match first {
            Ok(m) => worker.received(&m),
            Err(e) => {
                // Transport errors surface here; librdkafka reconnects by itself.
                tracing::warn!(processor = worker.config.name, error = %e, "consume error");
                continue;
            }
        };
        let mut pending = VecDeque::from([first]);
        while pending.len() < worker.config.max_batch {
            match consumer.recv().now_or_never() {
                Some(Ok(m)) => pending.push_back(worker.received(&m)),
                _ => break,
            }
        }
        if worker.drive(&consumer, pending, &mut stop).await? == Drive::Stopped {
            break;
        }
    }
    match consumer.commit_consumer_state(CommitMode::Sync) {
        Ok(()) | Err(KafkaError::ConsumerCommit(RDKafkaErrorCode::NoOffset)) => {}
        Err(e) => return Err(e.into()),
    }
    tracing::info!(
        processor = worker.config.name,
        group,
        "committed and stopped"
    );
    Ok(())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Drive {
    /// Every record was settled (applied or dead-lettered) or handed to another instance.
    Done,
    /// Shutdown was asked during an outage; what was settled is stored.
    Stopped,
}

/// How far one attempt got through the pending records.
struct Progress {
    /// Records at the front of the queue that are settled (their offsets may be stored).
    settled: usize,
    /// Why the next record could not be settled, when one could not.
    outage: Option<(Dependency, String)>,
}

struct Worker {
    codec: AvroCodec,
    producer: crate::producer::Producer,
    group: String,
    config: LoopConfig,
    handler: Arc<dyn Handler>,
    paused: Arc<AtomicBool>,
    /// `stocksvr_consumer_record_age_seconds` of this processor, looked up once: it is
    /// recorded for every record.
    record_age: metrics::Histogram,
}

impl Worker {
    /// A record as the loop takes it from the consumer (each once, however often its batch
    /// is attempted). Its age here includes the time it sat in the consumer's queue while the
    /// batch before it settled: the part of its delay before its own batch starts.
    fn received(&self, message: &BorrowedMessage<'_>) -> OwnedMessage {
        if let Some(age) = record_age(message.timestamp(), SystemTime::now()) {
            self.record_age.record(age.as_secs_f64());
        }
        message.detach()
    }

    /// Brings every pending record to a durable end, waiting out outages with the
    /// partitions paused.
    async fn drive(
        &self,
        consumer: &StreamConsumer<LoopContext>,
        mut pending: VecDeque<OwnedMessage>,
        stop: &mut watch::Receiver<bool>,
    ) -> Result<Drive, LoopError> {
        let mut attempt: u32 = 0;
        let mut outage: Option<(Instant, Dependency)> = None;
        loop {
            if outage.is_some() {
                // A rebalance during the outage may have handed partitions to another
                // instance: their records are theirs now (from the committed offset).
                let owned = consumer.assignment().unwrap_or_default();
                pending.retain(|m| owned.find_partition(m.topic(), m.partition()).is_some());
            }
            if pending.is_empty() {
                self.end_outage(consumer, &mut outage);
                return Ok(Drive::Done);
            }
            let batch: Vec<OwnedMessage> = pending
                .iter()
                .take(self.config.max_batch)
                .cloned()
                .collect();
            let progress = self.process(&batch).await?;
            for m in pending.drain(..progress.settled) {
                // A partition revoked while its record was handled belongs to another
                // instance now, which resumes from the committed offset: nothing to store.
                if let Err(e) = consumer.store_offset(m.topic(), m.partition(), m.offset()) {
                    tracing::warn!(processor = self.config.name, topic = m.topic(), partition = m.partition(), offset = m.offset(), error = %e, "offset not stored: the partition moved to another instance");
                }
            }
            let Some((dependency, reason)) = progress.outage else {
                if progress.settled > 0 {
                    attempt = 0;
                }
                continue;
            };
            if outage.is_none() {
                self.begin_outage(consumer, dependency, &reason);
                outage = Some((Instant::now(), dependency));
            }
            metrics::counter!(names::PROCESSING_RETRIES, "processor" => self.config.name)
                .increment(1);
            let delay = self.config.retry_delay(attempt);
            attempt = attempt.saturating_add(1);
            tracing::debug!(processor = self.config.name, %dependency, reason, ?delay, "waiting for the dependency");
            // Wait, but keep polling: the consumer stays in its group, rebalances are
            // served, and anything delivered meanwhile (a partition assigned during the
            // outage, before it was paused) queues behind the waiting records.
            let sleep = tokio::time::sleep(delay);
            tokio::pin!(sleep);
            loop {
                tokio::select! {
                    _ = stop.wait_for(|s| *s) => {
                        tracing::info!(processor = self.config.name, waiting = pending.len(), "shutdown during an outage: committing what was finished");
                        return Ok(Drive::Stopped);
                    }
                    _ = &mut sleep => break,
                    m = consumer.recv() => match m {
                        Ok(m) => pending.push_back(self.received(&m)),
                        Err(e) => tracing::debug!(processor = self.config.name, error = %e, "consume error while paused"),
                    },
                }
            }
        }
    }

    fn begin_outage(
        &self,
        consumer: &StreamConsumer<LoopContext>,
        dependency: Dependency,
        reason: &str,
    ) {
        self.paused.store(true, Ordering::SeqCst);
        let assigned = consumer.assignment().unwrap_or_default();
        if let Err(e) = consumer.pause(&assigned) {
            tracing::warn!(processor = self.config.name, error = %e, "pausing partitions failed");
        }
        metrics::gauge!(names::CONSUMER_PAUSED_PARTITIONS, "processor" => self.config.name)
            .set(assigned.count() as f64);
        metrics::counter!(names::CONSUMER_PAUSES, "processor" => self.config.name, "dependency" => dependency.name())
            .increment(1);
        tracing::warn!(
            processor = self.config.name,
            %dependency,
            reason,
            partitions = assigned.count(),
            "paused: a dependency is unavailable; retrying until it is back (nothing is dead-lettered)"
        );
    }

    fn end_outage(
        &self,
        consumer: &StreamConsumer<LoopContext>,
        outage: &mut Option<(Instant, Dependency)>,
    ) {
        let Some((since, dependency)) = outage.take() else {
            return;
        };
        self.paused.store(false, Ordering::SeqCst);
        let assigned = consumer
            .assignment()
            .unwrap_or_else(|_| TopicPartitionList::new());
        if let Err(e) = consumer.resume(&assigned) {
            tracing::warn!(processor = self.config.name, error = %e, "resuming partitions failed");
        }
        metrics::gauge!(names::CONSUMER_PAUSED_PARTITIONS, "processor" => self.config.name)
            .set(0.0);
        tracing::info!(
            processor = self.config.name,
            %dependency,
            paused_for_s = since.elapsed().as_secs_f64(),
            partitions = assigned.count(),
            "resumed: the dependency is back"
        );
    }

    /// One attempt at the front of the queue: the leading records that cannot be decoded
    /// go to the dead-letter topic, then the decodable run behind them is applied.
    async fn process(&self, batch: &[OwnedMessage]) -> Result<Progress, LoopError> {
        let started = Instant::now();
        let mut settled = 0;
        let mut records = Vec::with_capacity(batch.len());
        for message in batch {
            if self.config.raw {
                records.push(Record {
                    message: message.clone(),
                    event: Decoded {
                        schema_id: 0,
                        full_name: String::new(),
                        value: apache_avro::types::Value::Null,
                    },
                });
                continue;
            }
            match self.codec.decode(message.payload()).await {
                Ok(event) => records.push(Record {
                    message: message.clone(),
                    event,
                }),
                // The records behind wait for this one's schema: a registry outage.
                Err(e) if e.is_retryable() => {
                    if records.is_empty() {
                        return Ok(Progress {
                            settled,
                            outage: Some((Dependency::SchemaRegistry, e.to_string())),
                        });
                    }
                    break;
                }
                Err(e) => {
                    // Only a leading undecodable record is dead-lettered now; one behind
                    // decodable records waits until they are settled, so offsets stay in order.
                    if !records.is_empty() {
                        break;
                    }
                    self.dead_letter(message, ErrorClass::Undecodable, &describe(&e))
                        .await?;
                    settled += 1;
                }
            }
        }
        if records.is_empty() {
            return Ok(Progress {
                settled,
                outage: None,
            });
        }
        for r in &records {
            metrics::counter!(names::EVENTS_CONSUMED, "processor" => self.config.name, "topic" => r.topic().to_string())
                .increment(1);
        }
        let deadline = Duration::from_millis(self.config.consumer.attempt_timeout_ms.max(1));
        let answered = match tokio::time::timeout(deadline, self.handler.handle(&records)).await {
            Ok(answered) => answered,
            Err(_) => Err(Failure::unavailable(
                Dependency::Other,
                format!("the attempt ran past its {deadline:?} deadline"),
            )),
        };
        let progress = match answered {
            Ok(results) => self.settle(&records, results, settled).await?,
            Err(Failure::Unavailable { dependency, reason }) => Progress {
                settled,
                outage: Some((dependency, reason)),
            },
            // A batch refused as a whole: find the poisoned record by trying them one by
            // one, so its neighbours are not dead-lettered with it.
            Err(Failure::Invalid(_)) if records.len() > 1 => {
                let single = std::slice::from_ref(&records[0]);
                match self.handler.handle(single).await {
                    Ok(results) => self.settle(single, results, settled).await?,
                    Err(Failure::Unavailable { dependency, reason }) => Progress {
                        settled,
                        outage: Some((dependency, reason)),
                    },
                    Err(failure) => {
                        self.fail(&records[0], failure).await?;
                        Progress {
                            settled: settled + 1,
                            outage: None,
                        }
                    }
                }
            }
            Err(failure) => {
                self.fail(&records[0], failure).await?;
                Progress {
                    settled: settled + 1,
                    outage: None,
                }
            }
        };
        metrics::histogram!(names::PROCESSING_SECONDS, "processor" => self.config.name)
            .record(started.elapsed().as_secs_f64());
        Ok(progress)
    }

    async fn settle(
        &self,
        records: &[Record],
        results: Vec<Result<Applied, Failure>>,
        mut settled: usize,
    ) -> Result<Progress, LoopError> {
        let complete = results.len() == records.len();
        let stopped_early = matches!(results.last(), Some(Err(Failure::Unavailable { .. })));
        if !complete && !stopped_early {
            return Err(LoopError::Fatal {
                topic: records[0].topic().to_string(),
                partition: records[0].partition(),
                offset: records[0].offset(),
                reason: format!(
                    "handler answered {} results for {} records",
                    results.len(),
                    records.len()
                ),
            });
        }
        for (record, result) in records.iter().zip(results) {
            match result {
                Ok(applied) => {
                    metrics::counter!(names::EVENTS_APPLIED, "processor" => self.config.name, "outcome" => applied.label())
                        .increment(1);
                }
                Err(Failure::Unavailable { dependency, reason }) => {
                    return Ok(Progress {
                        settled,
                        outage: Some((dependency, reason)),
                    })
                }
                Err(failure) => self.fail(record, failure).await?,
            }
            settled += 1;
        }
        Ok(Progress {
            settled,
            outage: None,
        })
    }

    async fn fail(&self, record: &Record, failure: Failure) -> Result<(), LoopError> {
        match failure {
            Failure::Invalid(reason) => {
                self.dead_letter(&record.message, ErrorClass::Invalid, &reason)
                    .await
            }
            Failure::Unavailable { .. } => Ok(()),
            Failure::Fatal(reason) => Err(LoopError::Fatal {
                topic: record.topic().to_string(),
                partition: record.partition(),
                offset: record.offset(),
                reason,
            }),
        }
    }

    async fn dead_letter(
        &self,
        message: &OwnedMessage,
        class: ErrorClass,
        reason: &str,
    ) -> Result<(), LoopError> {
        let (dlt, partition, offset) = deadletter::send(
            &self.producer,
            message,
            &self.group,
            self.config.name,
            class,
            reason,
        )
        .await
        .map_err(|source| LoopError::DeadLetter {
            topic: message.topic().to_string(),
            partition: message.partition(),
            offset: message.offset(),
            source,
        })?;
        tracing::warn!(
            processor = self.config.name,
            topic = message.topic(),
            partition = message.partition(),
            offset = message.offset(),
            class = class.as_str(),
            reason,
            dead_letter = %format!("{dlt}/{partition}@{offset}"),
            "record dead-lettered"
        );
        Ok(())
    }
}

/// The reason a dead letter carries for a record that cannot be decoded.
/// Now minus a record's timestamp; none for a record without one. A producer's clock ahead
/// of ours reads as age zero, not as a negative age.
fn record_age(timestamp: Timestamp, now: SystemTime) -> Option<Duration> {
    let millis = u64::try_from(timestamp.to_millis()?).ok()?;
    let stamped = UNIX_EPOCH + Duration::from_millis(millis);
    Some(now.duration_since(stamped).unwrap_or(Duration::ZERO))
}

fn describe(e: &DecodeError) -> String {
    format!("{} ({})", e, e.kind())
}

#[cfg(test)]
mod record_age_tests {
    use super::*;

    #[test]
    fn a_record_is_as_old_as_its_timestamp_and_never_younger_than_zero() {
        let now = UNIX_EPOCH + Duration::from_millis(1_700_000_000_250);
        assert_eq!(
            record_age(Timestamp::CreateTime(1_700_000_000_000), now),
            Some(Duration::from_millis(250))
        );
        assert_eq!(
            record_age(Timestamp::LogAppendTime(1_700_000_000_200), now),
            Some(Duration::from_millis(50))
        );
        assert_eq!(
            record_age(Timestamp::CreateTime(1_700_000_001_000), now),
            Some(Duration::ZERO),
            "a producer's clock ahead of ours"
        );
        assert_eq!(record_age(Timestamp::NotAvailable, now), None);
        assert_eq!(record_age(Timestamp::CreateTime(-1), now), None);
    }
}

#[cfg(test)]
mod keyed_tests {
    use super::*;
    use crate::codec::Decoded;
    use std::sync::Mutex;
    use tokio::sync::Notify;

    fn record(key: &str, offset: i64) -> Record {
        Record {
            message: OwnedMessage::new(
                None,
                Some(key.as_bytes().to_vec()),
                "orders".into(),
                Timestamp::NotAvailable,
                0,
                offset,
                None,
            ),
            event: Decoded {
                schema_id: 1,
                full_name: "t".into(),
                value: apache_avro::types::Value::Null,
            },
        }
    }

    /// Records `(offset, start|end)`; offset 1 waits until offset 2 (another key) started,
    /// which only happens when keys run at once; offset 4 is unavailable.
    struct Probe {
        width: usize,
        log: Mutex<Vec<(i64, &'static str)>>,
        second_started: Notify,
    }

    impl RecordHandler for Probe {
        fn handle_one<'a>(&'a self, record: &'a Record) -> BoxFuture<'a, Result<Applied, Failure>> {
            async move {
                let offset = record.offset();
                self.log.lock().expect("log").push((offset, "start"));
                if offset == 2 {
                    self.second_started.notify_one();
                }
                if offset == 1 && self.width > 1 {
                    self.second_started.notified().await;
                }
                tokio::task::yield_now().await;
                self.log.lock().expect("log").push((offset, "end"));
                if offset == 4 {
                    return Err(Failure::unavailable(Dependency::Mysql, "down"));
                }
                Ok(Applied::Applied)
            }
            .boxed()
        }

        fn concurrency(&self) -> usize {
            self.width
        }
    }

    #[tokio::test]
    async fn keys_run_at_once_each_keys_records_in_order_and_results_stop_at_an_outage() {
        // Key a: offsets 0, 1, 3; key b: 2, 4 (unavailable), 5 (never tried).
        let batch = vec![
            record("a", 0),
            record("a", 1),
            record("b", 2),
            record("a", 3),
            record("b", 4),
            record("b", 5),
        ];
        let probe = Probe {
            width: 8,
            log: Mutex::new(Vec::new()),
            second_started: Notify::new(),
        };
        let results = tokio::time::timeout(Duration::from_secs(10), probe.handle(&batch))
            .await
            .expect("keys ran at once (offset 1 waits for offset 2)")
            .expect("batch");
        // Offsets 0..=4 have results; 4 is the outage, so nothing after it counts, although
        // offset 3 (key a, not blocked) was applied and will simply be handled again.
        assert_eq!(results.len(), 5);
        assert!(results[..4]
            .iter()
            .all(|r| matches!(r, Ok(Applied::Applied))));
        assert!(matches!(results[4], Err(Failure::Unavailable { .. })));
        let log = probe.log.lock().expect("log").clone();
        let started = |o: i64| log.iter().position(|e| *e == (o, "start"));
        let ended = |o: i64| log.iter().position(|e| *e == (o, "end"));
        for (before, after) in [(0, 1), (1, 3), (2, 4)] {
            assert!(
                ended(before) < started(after),
                "{before} must end before {after} starts: {log:?}"
            );
        }
        assert_eq!(started(5), None, "a key stops at its outage: {log:?}");

        // Width 1 is the plain sequence, stopping at the outage.
        let probe = Probe {
            width: 1,
            log: Mutex::new(Vec::new()),
            second_started: Notify::new(),
        };
        let results = probe.handle(&batch).await.expect("batch");
        assert_eq!(results.len(), 5);
        let order: Vec<i64> = probe
            .log
            .lock()
            .expect("log")
            .iter()
            .filter(|e| e.1 == "start")
            .map(|e| e.0)
            .collect();
        assert_eq!(order, [0, 1, 2, 3, 4]);
    }
}
