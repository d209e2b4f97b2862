//! One batch at a time to a durable end: decode, apply, dead-letter, store offsets; and an
//! outage waited out with every assigned partition paused, polling all the while.

use super::rebalance::LoopContext;
use super::{Applied, Failure, Handler, LoopConfig, LoopError, Record};
use crate::codec::{AvroCodec, DecodeError, Decoded};
use crate::deadletter::{self, ErrorClass};
use crate::failure::{kafka_error_class, Class, Dependency};
use crate::telemetry::names;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::{BorrowedMessage, Message, OwnedMessage, Timestamp};
use rdkafka::TopicPartitionList;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::watch;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Drive {
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

pub(super) struct Worker {
    pub(super) codec: AvroCodec,
    pub(super) producer: crate::producer::Producer,
    pub(super) group: String,
    pub(super) config: LoopConfig,
    pub(super) handler: Arc<dyn Handler>,
    pub(super) paused: Arc<AtomicBool>,
    /// `stocksvr_consumer_record_age_seconds` of this processor, looked up once: it is
    /// recorded for every record.
    pub(super) record_age: metrics::Histogram,
}

impl Worker {
    /// A record as the loop takes it from the consumer (each once, however often its batch
    /// is attempted). Its age here includes the time it sat in the consumer's queue while the
    /// batch before it settled: the part of its delay before its own batch starts.
    pub(super) fn received(&self, message: &BorrowedMessage<'_>) -> OwnedMessage {
        if let Some(age) = record_age(message.timestamp(), SystemTime::now()) {
            self.record_age.record(age.as_secs_f64());
        }
        message.detach()
    }

    /// Brings every pending record to a durable end, waiting out outages with the
    /// partitions paused.
    pub(super) async fn drive(
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
                        Err(rdkafka::error::KafkaError::PartitionEOF(_)) => {}
                        Err(e) => consumer.context().kafka.report(&e, ""),
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
                    let outage = self
                        .dead_letter(message, ErrorClass::Undecodable, &describe(&e))
                        .await?;
                    if outage.is_some() {
                        return Ok(Progress { settled, outage });
                    }
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
                    Err(failure) => self.failed_first(&records[0], failure, settled).await?,
                }
            }
            Err(failure) => self.failed_first(&records[0], failure, settled).await?,
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
                Err(failure) => {
                    if let Some(outage) = self.fail(record, failure).await? {
                        return Ok(Progress {
                            settled,
                            outage: Some(outage),
                        });
                    }
                }
            }
            settled += 1;
        }
        Ok(Progress {
            settled,
            outage: None,
        })
    }

    /// The progress after the batch's first record failed as a whole batch does.
    async fn failed_first(
        &self,
        record: &Record,
        failure: Failure,
        settled: usize,
    ) -> Result<Progress, LoopError> {
        Ok(match self.fail(record, failure).await? {
            Some(outage) => Progress {
                settled,
                outage: Some(outage),
            },
            None => Progress {
                settled: settled + 1,
                outage: None,
            },
        })
    }

    /// Settles a failed record: dead-lettered when invalid, an error when fatal. `Some` when
    /// Kafka could not take the dead letter now: the record waits as for any outage.
    async fn fail(
        &self,
        record: &Record,
        failure: Failure,
    ) -> Result<Option<(Dependency, String)>, LoopError> {
        match failure {
            Failure::Invalid(reason) => {
                self.dead_letter(&record.message, ErrorClass::Invalid, &reason)
                    .await
            }
            Failure::Unavailable { .. } => Ok(None),
            Failure::Fatal(reason) => Err(LoopError::Fatal {
                topic: record.topic().to_string(),
                partition: record.partition(),
                offset: record.offset(),
                reason,
            }),
        }
    }

    /// Writes the dead letter of `message`. `Ok(Some(outage))` when Kafka cannot take it
    /// now (unreachable, or refusing: a missing ACL on the `.dlt` topic): the record waits
    /// and is tried again, nothing is skipped. Only a fatal or invalid answer is an error.
    async fn dead_letter(
        &self,
        message: &OwnedMessage,
        class: ErrorClass,
        reason: &str,
    ) -> Result<Option<(Dependency, String)>, LoopError> {
        let sent = deadletter::send(
            &self.producer,
            message,
            &self.group,
            self.config.name,
            class,
            reason,
        )
        .await;
        let (dlt, partition, offset) = match sent {
            Ok(written) => {
                let topic = &written.0;
                crate::causes::ruled_out(Dependency::Kafka, |c| {
                    c.strip_prefix("topic authorization failed for ") == Some(topic.as_str())
                });
                written
            }
            Err(source) if kafka_error_class(&source) == Class::Unavailable => {
                let topic = deadletter::dead_letter_topic(message.topic());
                let text = source.to_string();
                let kafka = crate::kafka::KafkaContext::default();
                if !kafka.refused(&source, &text, &topic) {
                    tracing::debug!(processor = self.config.name, error = %source, "dead letter not written yet");
                }
                return Ok(Some((
                    Dependency::Kafka,
                    format!("dead letter to {topic} not written: {text}"),
                )));
            }
            Err(source) => {
                return Err(LoopError::DeadLetter {
                    topic: message.topic().to_string(),
                    partition: message.partition(),
                    offset: message.offset(),
                    source,
                })
            }
        };
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
        Ok(None)
    }
}

/// Now minus a record's timestamp; none for a record without one. A producer's clock ahead
/// of ours reads as age zero, not as a negative age.
fn record_age(timestamp: Timestamp, now: SystemTime) -> Option<Duration> {
    let millis = u64::try_from(timestamp.to_millis()?).ok()?;
    let stamped = UNIX_EPOCH + Duration::from_millis(millis);
    Some(now.duration_since(stamped).unwrap_or(Duration::ZERO))
}

/// The reason a dead letter carries for a record that cannot be decoded.
fn describe(e: &DecodeError) -> String {
    format!("{} ({})", e, e.kind())
}

#[cfg(test)]
mod tests {
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
