//! event-log processor: consumes every inbound topic (`direction: in` in the catalog),
//! decodes each record against the registry and logs it as JSON; a record that cannot be
//! decoded goes to its topic's dead-letter topic with the reason, and consumption moves on.
//!
//! Delivery: at-least-once. An offset is stored only after the record was logged or its
//! dead letter acknowledged by the broker; stored offsets are committed periodically and
//! synchronously at shutdown. A registry outage is retried in place (bounded exponential
//! backoff), never dead-lettered on the first failure.

use backon::{ExponentialBuilder, Retryable};
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, Message};
use std::collections::BTreeSet;
use std::time::Duration;
use stocksvr_pipeline::catalog::Direction;
use stocksvr_pipeline::codec::{AvroCodec, DecodeError};
use stocksvr_pipeline::config::Settings;
use stocksvr_pipeline::deadletter::{self, ErrorClass};
use stocksvr_pipeline::telemetry::names;
use stocksvr_pipeline::{json, kafka};
use tokio::sync::watch;

pub const NAME: &str = "event-log";

pub async fn run(
    settings: Settings,
    codec: AvroCodec,
    mut stop: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let group = format!("{}.{NAME}", settings.kafka.group_prefix);
    let consumer: StreamConsumer = kafka::client_config(&settings.kafka, NAME)
        .set("group.id", &group)
        .set("enable.auto.commit", "true")
        .set("auto.commit.interval.ms", "1000")
        // Offsets are stored by hand after each record's effect, so the periodic commit
        // never covers a record that was not finished.
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .create()?;
    let topics: BTreeSet<&str> = codec
        .catalog()
        .events()
        .iter()
        .filter(|e| e.direction == Direction::In)
        .map(|e| e.topic.as_str())
        .collect();
    let topics: Vec<&str> = topics.into_iter().collect();
    consumer.subscribe(&topics)?;
    let producer = kafka::producer(&settings.kafka, NAME)?;
    tracing::info!(group, ?topics, "event-log consuming");

    loop {
        let message = tokio::select! {
            _ = stop.wait_for(|s| *s) => break,
            m = consumer.recv() => m,
        };
        let message = match message {
            Ok(m) => m,
            Err(e) => {
                // Broker-side hiccups surface here; librdkafka reconnects by itself.
                tracing::warn!(error = %e, "kafka consume error");
                continue;
            }
        };
        handle(&codec, &producer, &group, &message).await?;
        consumer.store_offset_from_message(&message)?;
    }
    match consumer.commit_consumer_state(CommitMode::Sync) {
        // The periodic commit already covered every stored offset.
        Err(KafkaError::ConsumerCommit(RDKafkaErrorCode::NoOffset)) | Ok(()) => {}
        Err(e) => return Err(e.into()),
    }
    tracing::info!(group, "event-log committed and stopped");
    Ok(())
}

/// Logs or dead-letters one record. Returns an error only when the dead letter itself
/// cannot be written, which stops the processor without committing past the record.
async fn handle(
    codec: &AvroCodec,
    producer: &rdkafka::producer::FutureProducer,
    group: &str,
    message: &BorrowedMessage<'_>,
) -> anyhow::Result<()> {
    let backoff = ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(500))
        .with_max_delay(Duration::from_secs(10))
        .with_max_times(5)
        .with_jitter();
    let decoded = (|| codec.decode(message.payload()))
        .retry(backoff)
        .when(DecodeError::is_retryable)
        .notify(|e, after| tracing::warn!(error = %e, ?after, "retrying decode"))
        .await;
    match decoded {
        Ok(decoded) => {
            metrics::counter!(names::EVENTS_CONSUMED, "processor" => NAME, "topic" => message.topic().to_string(), "outcome" => "decoded").increment(1);
            tracing::info!(
                topic = message.topic(),
                partition = message.partition(),
                offset = message.offset(),
                event = %decoded.full_name,
                schema_id = decoded.schema_id,
                payload = %json::avro_to_json(&decoded.value),
                "event received"
            );
            Ok(())
        }
        Err(e) => {
            let class = if e.is_retryable() {
                ErrorClass::RetriesExhausted
            } else {
                ErrorClass::Invalid
            };
            metrics::counter!(names::EVENTS_CONSUMED, "processor" => NAME, "topic" => message.topic().to_string(), "outcome" => e.kind()).increment(1);
            let (dlt, partition, offset) =
                deadletter::send(producer, message, group, class, &e.to_string()).await?;
            tracing::warn!(
                topic = message.topic(),
                partition = message.partition(),
                offset = message.offset(),
                error = %e,
                dead_letter = %format!("{dlt}/{partition}@{offset}"),
                "record dead-lettered"
            );
            Ok(())
        }
    }
}
