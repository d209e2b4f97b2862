//! Turning a batch's records (one or two per claimed row, see [`crate::records`]) into Kafka
//! records: pick the schema, convert the JSON envelope, encode in the Confluent wire format,
//! send, and wait for the broker's acknowledgement.

use crate::records::Record;
use chrono::{DateTime, NaiveDateTime, Utc};
use futures::future::join_all;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::FutureRecord;
use std::time::Duration;
use stocksvr_pipeline::catalog::{Catalog, EventSchema};
use stocksvr_pipeline::causes;
use stocksvr_pipeline::codec::AvroCodec;
use stocksvr_pipeline::failure::Dependency;
use stocksvr_pipeline::kafka::KafkaContext;
use stocksvr_pipeline::producer::{DeliveryFuture, Producer};
use stocksvr_pipeline::topics::Namespace;
use tokio::time::Instant;

/// Kafka header carrying the event id, so consumers and operators can deduplicate or trace
/// a record without decoding it.
pub const EVENT_ID_HEADER: &str = "stocksvr.event-id";

/// A record the broker acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Acked {
    /// When this relay saw the acknowledgement (UTC).
    pub at: DateTime<Utc>,
}

/// Delay from a row written at `created_at` (UTC, the service's clock) to its
/// acknowledgement: what `stocksvr_outbox_publish_delay_seconds` records. Zero when the
/// writer's clock was ahead of this relay's.
pub fn publish_delay(created_at: NaiveDateTime, acked: Acked) -> Duration {
    (acked.at.naive_utc() - created_at)
        .to_std()
        .unwrap_or(Duration::ZERO)
}

/// Why one row was not published; the label is the `reason` of the failure metric.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RowFailure {
    /// The row cannot become a record (unknown event, payload off its schema, registry
    /// refused or unreachable). Retried like any failure: the row is never dropped, and a
    /// fixed schema or registry lets it through later.
    Encode(String),
    /// The broker (or the local producer) refused the record.
    Delivery(String),
    /// The cluster refuses this process (a missing Write ACL, a refused password): said
    /// once for the whole relay ([`stocksvr_pipeline::causes`]), not per row.
    Refused(String),
    /// No acknowledgement within the publish timeout.
    Timeout(Duration),
}

impl RowFailure {
    /// Every value of [`RowFailure::label`].
    pub const LABELS: [&'static str; 3] = ["encode", "delivery", "timeout"];

    pub fn label(&self) -> &'static str {
        match self {
            RowFailure::Encode(_) => "encode",
            RowFailure::Delivery(_) | RowFailure::Refused(_) => "delivery",
            RowFailure::Timeout(_) => "timeout",
        }
    }

    /// The text stored in `last_error`.
    pub fn reason(&self) -> String {
        match self {
            RowFailure::Encode(r) => format!("encode: {r}"),
            RowFailure::Delivery(r) | RowFailure::Refused(r) => format!("delivery: {r}"),
            RowFailure::Timeout(t) => format!("delivery: no acknowledgement within {t:?}"),
        }
    }
}

/// The catalog schema of an outbox row. The event type is the record's simple name
/// (`InventoryReserved` for `io.stocksvr.inventory.InventoryReserved`). An entry declared
/// for the row's topic wins; otherwise the one entry with that simple name is used, which
/// lets a deployment (or a test) route an event to a topic other than the catalog's. The
/// subject is always `<row topic>-<full name>`, so the registry sees the real topic.
pub fn resolve<'c>(
    catalog: &'c Catalog,
    topic: &str,
    event_type: &str,
) -> Result<&'c EventSchema, String> {
    let simple = |e: &EventSchema| e.full_name.rsplit('.').next() == Some(event_type);
    let mut named = catalog.events().iter().filter(|e| simple(e));
    if let Some(exact) = catalog
        .events()
        .iter()
        .find(|e| simple(e) && e.topic == topic)
    {
        return Ok(exact);
    }
    match (named.next(), named.next()) {
        (Some(only), None) => Ok(only),
        (None, _) => Err(format!("event type {event_type} is not in the catalog")),
        (Some(_), Some(_)) => Err(format!(
            "event type {event_type} is declared for several topics, none of them {topic}"
        )),
    }
}

/// Encodes one record for `topic` (its topic in the deployment's namespace). Every
/// failure is this record's row's alone.
pub async fn encode(codec: &AvroCodec, row: &Record, topic: &str) -> Result<Vec<u8>, RowFailure> {
    let payload = row
        .payload
        .as_ref()
        .map_err(|e| RowFailure::Encode(e.clone()))?;
    let entry = resolve(codec.catalog(), topic, &row.event_type).map_err(RowFailure::Encode)?;
    codec
        .encode_json_on(topic, entry, payload)
        .await
        .map_err(|e| RowFailure::Encode(e.to_string()))
}

/// A batch handed to the producer: one pending acknowledgement (or a failure already
/// known, such as an encoding error) per record, in the records' order, and the deadline
/// they share.
pub struct Enqueued {
    deliveries: Vec<Result<DeliveryFuture, RowFailure>>,
    /// Each record's topic, in the records' order.
    topics: Vec<String>,
    deadline: Instant,
    timeout: Duration,
}

impl Enqueued {
    /// Each record's outcome, in the records' order: when the broker acknowledged it, or why
    /// not.
    /// A record not acknowledged by the deadline may still be delivered later by the
    /// producer; the row is retried anyway (at-least-once: consumers deduplicate on
    /// event_id).
    pub async fn acknowledged(self) -> Vec<Result<Acked, RowFailure>> {
        let (deadline, timeout) = (self.deadline, self.timeout);
        let rows = self.deliveries.into_iter().zip(self.topics);
        join_all(rows.map(|(delivery, topic)| async move {
            let future = delivery?;
            match tokio::time::timeout_at(deadline, future).await {
                Ok(Ok(Ok(_delivered))) => {
                    // A refused write of this topic (said once, kept for /readyz) is gone.
                    causes::ruled_out(Dependency::Kafka, |c| {
                        c.strip_prefix("topic authorization failed for ") == Some(topic.as_str())
                    });
                    Ok(Acked { at: Utc::now() })
                }
                Ok(Ok(Err((e, _message)))) => {
                    let text = e.to_string();
                    if KafkaContext::default().refused(&e, &text, &topic) {
                        Err(RowFailure::Refused(text))
                    } else {
                        Err(RowFailure::Delivery(text))
                    }
                }
                Ok(Err(_canceled)) => Err(RowFailure::Delivery("producer was shut down".into())),
                Err(_elapsed) => Err(RowFailure::Timeout(timeout)),
            }
        }))
        .await
    }
}

/// Encodes a batch's records and enqueues them on the producer without waiting for the
/// broker. A record's topic is the declared name; `namespace` turns it into the deployment's.
///
/// All records are encoded concurrently (the registry is asked at most once per subject, then
/// cached), then enqueued in id order, so records with the same key reach their partition in
/// the order they were written. `timeout` runs from here over the encoding and the
/// acknowledgements together.
pub async fn enqueue_batch(
    codec: &AvroCodec,
    producer: &Producer,
    namespace: &Namespace,
    rows: &[Record],
    timeout: Duration,
) -> Enqueued {
    let deadline = Instant::now() + timeout;
    let topics: Vec<String> = rows.iter().map(|row| namespace.topic(&row.topic)).collect();
    let encoded = join_all(
        rows.iter()
            .zip(&topics)
            .map(|(row, topic)| tokio::time::timeout_at(deadline, encode(codec, row, topic))),
    )
    .await;
    let mut deliveries = Vec::with_capacity(rows.len());
    for ((row, topic), bytes) in rows.iter().zip(&topics).zip(encoded) {
        let bytes = match bytes {
            Ok(Ok(bytes)) => bytes,
            Ok(Err(failure)) => {
                deliveries.push(Err(failure));
                continue;
            }
            Err(_) => {
                deliveries.push(Err(RowFailure::Encode(format!(
                    "encoding did not finish within {timeout:?}"
                ))));
                continue;
            }
        };
        let headers = OwnedHeaders::new().insert(Header {
            key: EVENT_ID_HEADER,
            value: Some(row.event_id.as_str()),
        });
        let record = FutureRecord::to(topic)
            .key(row.partition_key.as_str())
            .payload(&bytes)
            .headers(headers);
        // send_result enqueues synchronously, which is what keeps the id order per key.
        deliveries.push(
            producer
                .send_result(record)
                .map_err(|(e, _)| RowFailure::Delivery(e.to_string())),
        );
    }
    Enqueued {
        deliveries,
        topics,
        deadline,
        timeout,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_by_simple_name_preferring_the_rows_topic() {
        let catalog = Catalog::embedded().expect("catalog");
        let on_own_topic =
            resolve(&catalog, "inventory.lifecycle.v1", "InventoryReserved").expect("declared");
        assert_eq!(
            on_own_topic.full_name,
            "io.stocksvr.inventory.InventoryReserved"
        );
        let elsewhere = resolve(&catalog, "test-topic-1", "InventoryRedisReserved")
            .expect("unique simple name");
        assert_eq!(
            elsewhere.full_name,
            "io.stocksvr.inventory.InventoryRedisReserved"
        );
        let unknown = resolve(&catalog, "inventory.lifecycle.v1", "NoSuchEvent").unwrap_err();
        assert!(unknown.contains("NoSuchEvent"), "{unknown}");
        // A partial simple name must not match a longer one.
        assert!(resolve(&catalog, "x", "Reserved").is_err());
    }

    #[test]
    fn every_catalog_event_resolves_on_its_own_topic() {
        let catalog = Catalog::embedded().expect("catalog");
        for e in catalog.events() {
            let simple = e.full_name.rsplit('.').next().expect("name");
            let found = resolve(&catalog, &e.topic, simple).expect("resolves");
            assert_eq!(found.full_name, e.full_name);
        }
    }

    #[test]
    fn the_publish_delay_runs_from_the_row_to_the_acknowledgement() {
        let created = DateTime::parse_from_rfc3339("2026-01-01T10:00:00.250Z")
            .expect("time")
            .naive_utc();
        let at = |s: &str| Acked {
            at: DateTime::parse_from_rfc3339(s).expect("time").to_utc(),
        };
        assert_eq!(
            publish_delay(created, at("2026-01-01T10:00:02.000Z")),
            Duration::from_millis(1750)
        );
        // A writer whose clock runs ahead: no negative delay.
        assert_eq!(
            publish_delay(created, at("2026-01-01T10:00:00.000Z")),
            Duration::ZERO
        );
    }

    #[test]
    fn failures_carry_their_class() {
        let f = RowFailure::Timeout(Duration::from_secs(2));
        assert_eq!(f.label(), "timeout");
        for f in [
            RowFailure::Encode(String::new()),
            RowFailure::Delivery(String::new()),
            RowFailure::Refused(String::new()),
            f.clone(),
        ] {
            assert!(RowFailure::LABELS.contains(&f.label()));
        }
        assert!(f.reason().contains("2s"));
        assert_eq!(RowFailure::Encode("x".into()).reason(), "encode: x");
    }
}
