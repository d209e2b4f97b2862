//! The consumer loop every processor shares: decode, apply, dead-letter, commit.
//!
//! Delivery: at-least-once. A record's offset is stored only after its effect is durable
//! (the handler returned) or its dead letter was acknowledged; stored offsets are committed
//! every second, synchronously when partitions are revoked, and at shutdown. Records of one
//! partition are handled in order, one batch at a time.
//!
//! Errors are classified in one place ([`Failure`]): invalid input (undecodable, unknown
//! schema, failed validation) goes to `<topic>.dlt` at once and consumption moves on;
//! retryable failures (database or Redis unavailable, timeouts) retry in place with
//! exponential backoff and jitter, then dead-letter; fatal failures stop the processor and
//! the process exits non-zero without committing past the record.

use crate::codec::{AvroCodec, DecodeError, Decoded};
use crate::config::KafkaSettings;
use crate::deadletter::{self, ErrorClass};
use crate::kafka;
use crate::telemetry::names;
use backon::{ExponentialBuilder, Retryable};
use futures::future::BoxFuture;
use futures::FutureExt;
use rdkafka::client::ClientContext;
use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance, StreamConsumer,
};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Message, OwnedMessage};
use rdkafka::producer::FutureProducer;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// What went wrong with a record, decided by the processor's handler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// The record can never be applied (bad ids, failed validation): dead-letter it.
    Invalid(String),
    /// A dependency is unavailable: retry in place, then dead-letter.
    Retryable(String),
    /// The processor cannot go on (e.g. a bug or lost invariant): stop, exit non-zero.
    Fatal(String),
}

/// How a record ended, for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    Applied,
    /// Already applied earlier (inbox hit, terminal state): nothing changed.
    Duplicate,
    /// Handled by emitting a conflict (e.g. Confirm after Cancel) instead of a change.
    Conflict,
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
}

/// A processor's logic: plain functions over decoded records.
pub trait Handler: Send + Sync + 'static {
    /// Applies `batch` (in partition order). `Ok` carries one result per record, where a
    /// record may be individually `Invalid`; `Err` fails the whole batch (nothing of it may
    /// be durable, e.g. one transaction rolled back).
    #[allow(clippy::type_complexity)]
    fn handle<'a>(
        &'a self,
        batch: &'a [Record],
    ) -> BoxFuture<'a, Result<Vec<Result<Applied, Failure>>, Failure>>;
}

#[derive(Debug, Clone)]
pub struct LoopConfig {
    /// Processor name: metrics label, client id and group suffix (`<group_prefix>.<name>`).
    pub name: &'static str,
    pub topics: Vec<String>,
    /// Records handed to the handler at once (1 for per-record processors).
    pub max_batch: usize,
    /// Retries of a retryable failure before the record is dead-lettered.
    pub max_retries: usize,
    pub min_backoff: Duration,
    pub max_backoff: Duration,
    /// Hand records over undecoded, with a placeholder `event` (schema id 0, empty name,
    /// `Null`): for processors that store bytes as they are (the dead-letter processor),
    /// whose input is by definition often not decodable.
    pub raw: bool,
}

impl LoopConfig {
    pub fn new(name: &'static str, topics: Vec<String>) -> Self {
        Self {
            name,
            topics,
            max_batch: 1,
            max_retries: 5,
            min_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(10),
            raw: false,
        }
    }

    fn backoff(&self) -> ExponentialBuilder {
        ExponentialBuilder::default()
            .with_min_delay(self.min_backoff)
            .with_max_delay(self.max_backoff)
            .with_max_times(self.max_retries)
            .with_jitter()
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

/// Commits finished work before partitions move to another instance. (Consumer lag is
/// measured at the broker by the lag exporter, which keeps reporting while this process is
/// dead or stuck.)
struct LoopContext {
    name: &'static str,
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

    fn post_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(partitions) = rebalance {
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
    let consumer: StreamConsumer<LoopContext> = kafka::client_config(settings, config.name)
        .set("group.id", &group)
        .set("enable.auto.commit", "true")
        .set("auto.commit.interval.ms", "1000")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .create_with_context(LoopContext { name: config.name })?;
    let topics: Vec<&str> = config.topics.iter().map(String::as_str).collect();
    consumer.subscribe(&topics)?;
    let producer = kafka::producer(settings, config.name)?;
    tracing::info!(processor = config.name, group, ?topics, "consuming");
    let worker = Worker {
        codec,
        producer,
        group: group.clone(),
        config,
        handler,
    };
    loop {
        let first = tokio::select! {
            _ = stop.wait_for(|s| *s) => break,
            m = consumer.recv() => m,
        };
        let first = match first {
            Ok(m) => m.detach(),
            Err(e) => {
                // Transport errors surface here; librdkafka reconnects by itself.
                tracing::warn!(processor = worker.config.name, error = %e, "consume error");
                continue;
            }
        };
        let mut batch = vec![first];
        while batch.len() < worker.config.max_batch {
            match consumer.recv().now_or_never() {
                Some(Ok(m)) => batch.push(m.detach()),
                _ => break,
            }
        }
        worker.process(batch.clone()).await?;
        for m in &batch {
            consumer.store_offset(m.topic(), m.partition(), m.offset())?;
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

struct Worker {
    codec: AvroCodec,
    producer: FutureProducer,
    group: String,
    config: LoopConfig,
    handler: Arc<dyn Handler>,
}

impl Worker {
    /// Brings every message of `batch` to a durable end: applied, or dead-lettered.
    async fn process(&self, batch: Vec<OwnedMessage>) -> Result<(), LoopError> {
        let started = Instant::now();
        let mut records = Vec::with_capacity(batch.len());
        for message in batch {
            metrics::counter!(names::EVENTS_CONSUMED, "processor" => self.config.name, "topic" => message.topic().to_string())
                .increment(1);
            if self.config.raw {
                records.push(Record {
                    message,
                    event: Decoded {
                        schema_id: 0,
                        full_name: String::new(),
                        value: apache_avro::types::Value::Null,
                    },
                });
                continue;
            }
            match self.decode(&message).await {
                Ok(event) => records.push(Record { message, event }),
                Err(e) => {
                    let class = if e.is_retryable() {
                        ErrorClass::RetriesExhausted
                    } else {
                        ErrorClass::Invalid
                    };
                    self.dead_letter(&message, class, &e.to_string()).await?;
                }
            }
        }
        if !records.is_empty() {
            match self.apply(&records).await {
                Ok(results) => self.settle(&records, results).await?,
                // A batch that kept failing is retried record by record, each with its own
                // budget, so one poisoned record does not take its neighbours to the DLT.
                Err(_) if records.len() > 1 => {
                    for record in &records {
                        let single = std::slice::from_ref(record);
                        match self.apply(single).await {
                            Ok(results) => self.settle(single, results).await?,
                            Err(failure) => self.fail(record, failure).await?,
                        }
                    }
                }
                Err(failure) => self.fail(&records[0], failure).await?,
            }
        }
        metrics::histogram!(names::PROCESSING_SECONDS, "processor" => self.config.name)
            .record(started.elapsed().as_secs_f64());
        Ok(())
    }

    async fn decode(&self, message: &OwnedMessage) -> Result<Decoded, DecodeError> {
        (|| self.codec.decode(message.payload()))
            .retry(self.config.backoff())
            .when(DecodeError::is_retryable)
            .notify(|e, after| {
                metrics::counter!(names::PROCESSING_RETRIES, "processor" => self.config.name).increment(1);
                tracing::warn!(processor = self.config.name, error = %e, ?after, "schema registry unavailable; retrying");
            })
            .await
    }

    /// Runs the handler, retrying retryable failures of the whole batch. For a single record
    /// its own retryable result counts as the batch's, so it is retried in place too.
    async fn apply(&self, records: &[Record]) -> Result<Vec<Result<Applied, Failure>>, Failure> {
        let attempt = || async {
            let results = self.handler.handle(records).await?;
            match results.as_slice() {
                [Err(f @ Failure::Retryable(_))] => Err(f.clone()),
                _ => Ok(results),
            }
        };
        attempt
            .retry(self.config.backoff())
            .when(|f: &Failure| matches!(f, Failure::Retryable(_)))
            .notify(|f, after| {
                metrics::counter!(names::PROCESSING_RETRIES, "processor" => self.config.name)
                    .increment(1);
                tracing::warn!(processor = self.config.name, failure = ?f, ?after, "retrying");
            })
            .await
    }

    async fn settle(
        &self,
        records: &[Record],
        results: Vec<Result<Applied, Failure>>,
    ) -> Result<(), LoopError> {
        if results.len() != records.len() {
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
                    let outcome = match applied {
                        Applied::Applied => "applied",
                        Applied::Duplicate => "duplicate",
                        Applied::Conflict => "conflict",
                    };
                    metrics::counter!(names::EVENTS_APPLIED, "processor" => self.config.name, "outcome" => outcome).increment(1);
                }
                // A record that failed retryably inside a larger batch gets its own retries.
                Err(Failure::Retryable(_)) if records.len() > 1 => {
                    let single = std::slice::from_ref(record);
                    match self.apply(single).await {
                        Ok(mut results) => match results.pop() {
                            Some(Ok(_)) => {
                                metrics::counter!(names::EVENTS_APPLIED, "processor" => self.config.name, "outcome" => "applied")
                                    .increment(1)
                            }
                            Some(Err(failure)) => self.fail(record, failure).await?,
                            None => self.fail(record, Failure::Fatal("handler answered no result".into())).await?,
                        },
                        Err(failure) => self.fail(record, failure).await?,
                    }
                }
                Err(failure) => self.fail(record, failure).await?,
            }
        }
        Ok(())
    }

    async fn fail(&self, record: &Record, failure: Failure) -> Result<(), LoopError> {
        match failure {
            Failure::Invalid(reason) => {
                self.dead_letter(&record.message, ErrorClass::Invalid, &reason)
                    .await
            }
            Failure::Retryable(reason) => {
                self.dead_letter(&record.message, ErrorClass::RetriesExhausted, &reason)
                    .await
            }
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
        let (dlt, partition, offset) =
            deadletter::send(&self.producer, message, &self.group, class, reason)
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
