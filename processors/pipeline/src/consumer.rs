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
//!
//! A member that dies without leaving (kill -9, a lost host) is found by the group coordinator
//! after `consumer.session_timeout_ms` (6 s; librdkafka's default is 45 s), and the others take
//! its partitions over with the next heartbeat (`consumer.heartbeat_interval_ms`, 2 s).

mod keyed;
mod rebalance;
mod worker;

pub use keyed::by_key;

use crate::codec::{AvroCodec, Decoded};
use crate::config::{ConsumerSettings, KafkaSettings};
use crate::deadletter::ErrorClass;
pub use crate::failure::{Dependency, Failure};
use crate::kafka;
use crate::telemetry::names;
use futures::future::BoxFuture;
use futures::FutureExt;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Message, OwnedMessage};
use rebalance::LoopContext;
use serde::de::DeserializeOwned;
use std::collections::VecDeque;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;
use stocksvr_core::retry::RetryPolicy;
use tokio::sync::watch;
use worker::{Drive, Worker};

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
        RetryPolicy::new(
            Duration::from_millis(self.consumer.retry_min_backoff_ms.max(1)),
            Duration::from_millis(self.consumer.retry_max_backoff_ms.max(1)),
        )
        .delay(attempt)
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
    let consumer = subscribe(settings, &config, &group, paused.clone())?;
    let producer = kafka::producer(settings, config.name)?;
    zero_dead_letter_series(&config);
    tracing::info!(processor = config.name, group, topics = ?config.topics, "consuming");
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
    consume(&consumer, &worker, &mut stop).await?;
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

/// The group's consumer, subscribed to `config.topics`: offsets are stored by the loop
/// once a record's effect is durable, and committed every second.
fn subscribe(
    settings: &KafkaSettings,
    config: &LoopConfig,
    group: &str,
    paused: Arc<AtomicBool>,
) -> Result<StreamConsumer<LoopContext>, KafkaError> {
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
        // The end of a partition is a fetch that succeeded: after a refused one (a missing
        // ACL, reported once by librdkafka) it is the only sign, without new records, that
        // the refusal is gone (`KafkaContext::fetched`).
        ("enable.partition.eof", "true"),
    ] {
        if client.get(key).is_none() {
            client.set(key, value);
        }
    }
    group_timing(&mut client, &config.consumer);
    let consumer: StreamConsumer<LoopContext> = client
        .set("group.id", group)
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
            paused,
            kafka: kafka::KafkaContext::new(settings, config.name).reading(&config.topics, group),
        })?;
    let topics: Vec<&str> = config.topics.iter().map(String::as_str).collect();
    consumer.subscribe(&topics)?;
    Ok(consumer)
}

/// How fast the group finds a dead member: `consumer.session_timeout_ms` and
/// `consumer.heartbeat_interval_ms` on the classic group protocol (librdkafka's default, with
/// its default eager `range,roundrobin` assignment, which stays as it was so a roll from an
/// earlier release never mixes strategies in one group). The operator's `kafka.properties`
/// win: a `session.timeout.ms` of their own, or `group.protocol=consumer` (KIP-848), under
/// which librdkafka refuses both keys because the broker owns the session (at least 45 s
/// unless the brokers' `group.consumer.min.session.timeout.ms` is lowered).
fn group_timing(client: &mut rdkafka::ClientConfig, consumer: &ConsumerSettings) {
    if client
        .get("group.protocol")
        .is_some_and(|p| p.eq_ignore_ascii_case("consumer"))
    {
        return;
    }
    for (key, value) in [
        ("session.timeout.ms", consumer.session_timeout_ms),
        ("heartbeat.interval.ms", consumer.heartbeat_interval_ms),
    ] {
        if client.get(key).is_none() {
            client.set(key, value.to_string());
        }
    }
}

/// Every dead-letter counter of this processor at 0, so an alert on its increase sees 0,
/// not "no data", until the first dead letter.
fn zero_dead_letter_series(config: &LoopConfig) {
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
}

/// Takes what the consumer has fetched, up to `max_batch` records at once, and drives each
/// batch to its end, until `stop` turns true.
async fn consume(
    consumer: &StreamConsumer<LoopContext>,
    worker: &Worker,
    stop: &mut watch::Receiver<bool>,
) -> Result<(), LoopError> {
    loop {
        let first = tokio::select! {
            _ = stop.wait_for(|s| *s) => return Ok(()),
            m = consumer.recv() => m,
        };
        let first = match first {
            Ok(m) => {
                consumer.context().kafka.fetched();
                worker.received(&m)
            }
            Err(KafkaError::PartitionEOF(_)) => {
                consumer.context().kafka.fetched();
                continue;
            }
            Err(e) => {
                // Transport errors surface here; librdkafka reconnects by itself. A refusal
                // (a missing ACL, a wrong password) or an outage comes back at every fetch
                // or join attempt: it is said once, not at each.
                consumer.context().kafka.report(&e, "");
                continue;
            }
        };
        let mut pending = VecDeque::from([first]);
        while pending.len() < worker.config.max_batch {
            match consumer.recv().now_or_never() {
                Some(Ok(m)) => pending.push_back(worker.received(&m)),
                Some(Err(KafkaError::PartitionEOF(_))) => continue,
                _ => break,
            }
        }
        if worker.drive(consumer, pending, stop).await? == Drive::Stopped {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timing(properties: &[(&str, &str)]) -> rdkafka::ClientConfig {
        let mut client = rdkafka::ClientConfig::new();
        for (key, value) in properties {
            client.set(*key, *value);
        }
        group_timing(&mut client, &ConsumerSettings::default());
        client
    }

    #[test]
    fn the_classic_protocol_gets_the_short_session_and_the_operators_properties_win() {
        let client = timing(&[]);
        assert_eq!(client.get("session.timeout.ms"), Some("6000"));
        assert_eq!(client.get("heartbeat.interval.ms"), Some("2000"));
        // No assignment strategy: the eager default of every earlier release stays.
        assert_eq!(client.get("partition.assignment.strategy"), None);

        let client = timing(&[("session.timeout.ms", "10000")]);
        assert_eq!(client.get("session.timeout.ms"), Some("10000"));
        assert_eq!(client.get("heartbeat.interval.ms"), Some("2000"));
    }

    #[test]
    fn kip_848_gets_neither_key_since_librdkafka_refuses_them_there() {
        let client = timing(&[("group.protocol", "consumer")]);
        assert_eq!(client.get("session.timeout.ms"), None);
        assert_eq!(client.get("heartbeat.interval.ms"), None);
    }
}
