//! Dead letters carry their origin: the original key and bytes, plus headers naming the
//! source topic, partition, offset, timestamp, consumer group, error class and message,
//! so an operator can see why and a replay can put the record back where it came from.

use crate::producer::Producer;
use rdkafka::message::{Header, Message, OwnedHeaders};
use rdkafka::producer::FutureRecord;
use std::time::Duration;
use stocksvr_telemetry::names;

/// A consumed topic's dead letters go to `<topic>` + this suffix (see topics.yaml).
pub const DEAD_LETTER_SUFFIX: &str = ".dlt";

pub mod headers {
    pub const ORIGINAL_TOPIC: &str = "stocksvr.dlt.original-topic";
    pub const ORIGINAL_PARTITION: &str = "stocksvr.dlt.original-partition";
    pub const ORIGINAL_OFFSET: &str = "stocksvr.dlt.original-offset";
    pub const ORIGINAL_TIMESTAMP: &str = "stocksvr.dlt.original-timestamp";
    pub const CONSUMER_GROUP: &str = "stocksvr.dlt.consumer-group";
    pub const ERROR_CLASS: &str = "stocksvr.dlt.error-class";
    pub const ERROR_MESSAGE: &str = "stocksvr.dlt.error-message";
}

/// Why a record was dead-lettered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// Decoded, but it can never apply: failed validation, ids of another order.
    Invalid,
    /// Not Confluent Avro, or written with a schema the registry does not know.
    Undecodable,
}

impl ErrorClass {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorClass::Invalid => "invalid",
            ErrorClass::Undecodable => "undecodable",
        }
    }
}

pub fn dead_letter_topic(topic: &str) -> String {
    format!("{topic}{DEAD_LETTER_SUFFIX}")
}

/// Produces the dead letter and waits for the broker's acknowledgement, so the caller may
/// commit past the original record only once its copy is durable.
pub async fn send<M: Message>(
    producer: &Producer,
    message: &M,
    group: &str,
    processor: &'static str,
    class: ErrorClass,
    error: &str,
) -> Result<(String, i32, i64), rdkafka::error::KafkaError> {
    let topic = dead_letter_topic(message.topic());
    let partition = message.partition().to_string();
    let offset = message.offset().to_string();
    let timestamp = message.timestamp().to_millis().unwrap_or(-1).to_string();
    // Kafka headers are bytes; keep the message bounded so one huge error cannot make the
    // dead letter itself too large to produce.
    let error: String = error.chars().take(2_000).collect();
    let hdrs = OwnedHeaders::new()
        .insert(Header {
            key: headers::ORIGINAL_TOPIC,
            value: Some(message.topic()),
        })
        .insert(Header {
            key: headers::ORIGINAL_PARTITION,
            value: Some(&partition),
        })
        .insert(Header {
            key: headers::ORIGINAL_OFFSET,
            value: Some(&offset),
        })
        .insert(Header {
            key: headers::ORIGINAL_TIMESTAMP,
            value: Some(&timestamp),
        })
        .insert(Header {
            key: headers::CONSUMER_GROUP,
            value: Some(group),
        })
        .insert(Header {
            key: headers::ERROR_CLASS,
            value: Some(class.as_str()),
        })
        .insert(Header {
            key: headers::ERROR_MESSAGE,
            value: Some(&error),
        });
    let mut record: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(&topic)
        .partition(message.partition())
        .headers(hdrs);
    if let Some(key) = message.key() {
        record = record.key(key);
    }
    if let Some(payload) = message.payload() {
        record = record.payload(payload);
    }
    let delivery = producer
        .send(record, Duration::from_secs(30))
        .await
        .map_err(|(e, _)| e)?;
    metrics::counter!(names::EVENTS_DEAD_LETTERED,
        "processor" => processor, "topic" => message.topic().to_string(), "class" => class.as_str())
    .increment(1);
    Ok((topic, delivery.partition, delivery.offset))
}
