//! The Kafka producer of a stocksvr process: librdkafka's producer, with a polling thread of
//! our own and futures for the broker's acknowledgements.
//!
//! rust-rdkafka's `FutureProducer` polls every 100 ms through a deadline whose remaining time
//! is truncated to whole milliseconds, so the last millisecond of every poll is spent calling
//! `poll(0)` in a loop: about 0.4–1% of a core per producer with no traffic at all (measured
//! with `perf` on an idle `stocksvr all`: a third of its idle CPU). This producer's thread
//! polls with [`POLL_TIMEOUT`]. A poll returns at the first event, so acknowledgements are
//! handed over as soon as they arrive; the long timeout only delays the thread's exit.

use crate::kafka::context::{self, KafkaContext};
use rdkafka::client::{Client, ClientContext};
use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::message::{Message, OwnedMessage, Timestamp, ToBytes};
use rdkafka::producer::future_producer::{Delivery, OwnedDeliveryResult};
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, FutureRecord, Producer as _};
use rdkafka::producer::{NoCustomPartitioner, ProducerContext};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// Longest wait of one poll of the polling thread (see the module comment).
const POLL_TIMEOUT: Duration = Duration::from_secs(2);
/// Pause before enqueuing again when librdkafka's queue is full.
const QUEUE_FULL_PAUSE: Duration = Duration::from_millis(100);
/// What a dropped producer waits for records still in flight.
const FLUSH_ON_DROP: Duration = Duration::from_millis(500);

/// Hands each delivery report to the future of its record; logs and errors go through the
/// process's [`KafkaContext`] (a refusal said once).
pub struct Deliveries(KafkaContext);

impl ClientContext for Deliveries {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        context::log_line(level, fac, message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        context::report_error(&self.0, &error, reason);
    }
}

impl ProducerContext for Deliveries {
    type DeliveryOpaque = Box<oneshot::Sender<OwnedDeliveryResult>>;

    fn delivery(&self, result: &DeliveryResult<'_>, tx: Self::DeliveryOpaque) {
        let owned = match result {
            Ok(message) => Ok(Delivery {
                partition: message.partition(),
                offset: message.offset(),
                timestamp: message.timestamp(),
            }),
            Err((error, message)) => Err((error.clone(), message.detach())),
        };
        // The sender's future may have been dropped (its caller gave up): nothing to tell.
        let _ = tx.send(owned);
    }
}

/// The broker's answer for one enqueued record. Resolves to an error when the producer was
/// dropped before the report arrived.
pub struct DeliveryFuture {
    rx: oneshot::Receiver<OwnedDeliveryResult>,
}

impl Future for DeliveryFuture {
    type Output = Result<OwnedDeliveryResult, oneshot::error::RecvError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.rx).poll(cx)
    }
}

struct Inner {
    base: Arc<BaseProducer<Deliveries, NoCustomPartitioner>>,
    stop: Arc<AtomicBool>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Err(e) = self.base.flush(FLUSH_ON_DROP) {
            tracing::warn!(error = %e, "Kafka producer dropped with records still in flight");
        }
    }
}

/// A thread-safe producer; clones share one librdkafka producer and one polling thread.
#[derive(Clone)]
pub struct Producer {
    inner: Arc<Inner>,
}

impl Producer {
    /// Makes the librdkafka producer and starts its polling thread.
    pub fn new(config: &ClientConfig) -> KafkaResult<Producer> {
        Self::with_context(config, KafkaContext::default())
    }

    /// As [`Producer::new`], naming refusals with `context` (its SASL user, its role).
    pub fn with_context(config: &ClientConfig, context: KafkaContext) -> KafkaResult<Producer> {
        let base: BaseProducer<Deliveries, NoCustomPartitioner> =
            config.create_with_context(Deliveries(context))?;
        let base = Arc::new(base);
        let stop = Arc::new(AtomicBool::new(false));
        let (thread_base, thread_stop) = (Arc::clone(&base), Arc::clone(&stop));
        std::thread::Builder::new()
            .name("kafka-producer-poll".into())
            .spawn(move || {
                while !thread_stop.load(Ordering::Relaxed) {
                    thread_base.poll(POLL_TIMEOUT);
                }
            })
            .map_err(|e| KafkaError::ClientCreation(format!("producer polling thread: {e}")))?;
        Ok(Producer {
            inner: Arc::new(Inner { base, stop }),
        })
    }

    /// Enqueues the record and returns the future of its acknowledgement, or the record back
    /// when librdkafka refuses it at once (queue full, unknown topic). Enqueuing is
    /// synchronous: records enqueued one after the other keep that order per partition.
    #[allow(clippy::result_large_err)]
    pub fn send_result<'a, K, P>(
        &self,
        record: FutureRecord<'a, K, P>,
    ) -> Result<DeliveryFuture, (KafkaError, FutureRecord<'a, K, P>)>
    where
        K: ToBytes + ?Sized,
        P: ToBytes + ?Sized,
    {
        let (tx, rx) = oneshot::channel();
        let base = BaseRecord {
            topic: record.topic,
            partition: record.partition,
            payload: record.payload,
            key: record.key,
            timestamp: record.timestamp,
            headers: record.headers,
            delivery_opaque: Box::new(tx),
        };
        self.inner
            .base
            .send(base)
            .map(|()| DeliveryFuture { rx })
            .map_err(|(e, base)| {
                (
                    e,
                    FutureRecord {
                        topic: base.topic,
                        partition: base.partition,
                        payload: base.payload,
                        key: base.key,
                        timestamp: base.timestamp,
                        headers: base.headers,
                    },
                )
            })
    }

    /// Enqueues the record, retrying for up to `queue_timeout` while librdkafka's queue is
    /// full, and waits for the broker's acknowledgement.
    pub async fn send<K, P>(
        &self,
        mut record: FutureRecord<'_, K, P>,
        queue_timeout: Duration,
    ) -> OwnedDeliveryResult
    where
        K: ToBytes + ?Sized,
        P: ToBytes + ?Sized,
    {
        let start = Instant::now();
        loop {
            match self.send_result(record) {
                Ok(delivery) => {
                    // `self` holds the producer, so the report cannot be lost to a drop.
                    return match delivery.await {
                        Ok(result) => result,
                        Err(_dropped) => Err((
                            KafkaError::Canceled,
                            OwnedMessage::new(
                                None,
                                None,
                                String::new(),
                                Timestamp::NotAvailable,
                                -1,
                                -1,
                                None,
                            ),
                        )),
                    };
                }
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back))
                    if start.elapsed() < queue_timeout =>
                {
                    record = back;
                    tokio::time::sleep(QUEUE_FULL_PAUSE).await;
                }
                Err((e, back)) => {
                    let message = OwnedMessage::new(
                        back.payload.map(|p| p.to_bytes().to_vec()),
                        back.key.map(|k| k.to_bytes().to_vec()),
                        back.topic.to_owned(),
                        back.timestamp
                            .map_or(Timestamp::NotAvailable, Timestamp::CreateTime),
                        back.partition.unwrap_or(-1),
                        0,
                        back.headers,
                    );
                    return Err((e, message));
                }
            }
        }
    }

    /// The librdkafka client (its handle identifies the producer).
    pub fn client(&self) -> &Client<Deliveries> {
        self.inner.base.client()
    }

    /// Waits until every enqueued record was acknowledged or failed, or `timeout` passed.
    pub fn flush(&self, timeout: Duration) -> KafkaResult<()> {
        self.inner.base.flush(timeout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// No broker listens on port 1: the record times out in librdkafka, and the report
    /// reaches the record's future through the polling thread, with the record. Without a
    /// polling thread the future never resolves, so the wait is bounded (librdkafka scans
    /// for timed-out records about once a second).
    #[tokio::test]
    async fn a_delivery_report_reaches_its_future_with_the_record() {
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", "127.0.0.1:1")
            .set("message.timeout.ms", "200");
        let producer = Producer::new(&config).expect("producer");
        let record: FutureRecord<'_, str, str> = FutureRecord::to("nowhere").key("k").payload("v");
        let (error, message) = tokio::time::timeout(
            Duration::from_secs(30),
            producer.send(record, Duration::ZERO),
        )
        .await
        .expect("the delivery report arrives")
        .expect_err("no broker, so no acknowledgement");
        assert_eq!(
            error,
            KafkaError::MessageProduction(RDKafkaErrorCode::MessageTimedOut)
        );
        assert_eq!(message.payload(), Some(&b"v"[..]), "the record comes back");
    }
}
