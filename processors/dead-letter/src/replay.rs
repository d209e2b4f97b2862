//! Replay: the parked key and bytes go back to the original topic and partition.

use crate::origin::NOT_STORED_MARKER;
use crate::store::{full_select, DlqError, FullRow, Parked, Status};
use chrono::Utc;
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::FutureRecord;
use serde::Serialize;
use sqlx::MySqlPool;
use std::time::Duration;
use stocksvr_pipeline::config::KafkaSettings;
use stocksvr_pipeline::kafka;
use stocksvr_pipeline::producer::Producer;
use stocksvr_store::deadline::Deadline;
use stocksvr_telemetry::names;

/// Header on a replayed record naming the dead letter it came from,
/// `<dlt topic>/<dlt partition>@<dlt offset>`, so a record seen twice can be traced.
pub const REPLAY_OF_HEADER: &str = "stocksvr.replay.of";

/// How long a replay waits for the broker before it reports failure.
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(30);

/// How a replay ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReplayOutcome {
    pub id: u64,
    /// Where the record was written: the original topic and partition, a new offset.
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    /// The status before this replay (`replayed` or `discarded` only when forced).
    pub previous: Status,
}

/// A producer for replays: idempotent with `acks=all` like every stocksvr producer, but
/// bounded to [`DELIVERY_TIMEOUT`] so an operator's command does not hang for librdkafka's
/// five-minute default, and never auto-creating a topic that no longer exists.
pub fn replay_producer(settings: &KafkaSettings) -> Result<Producer, KafkaError> {
    let mut config = kafka::client_config(settings, "dead-letter-replay");
    config
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("allow.auto.create.topics", "false")
        .set(
            "message.timeout.ms",
            DELIVERY_TIMEOUT.as_millis().to_string(),
        );
    Producer::with_context(
        &config,
        kafka::KafkaContext::new(settings, "dead-letter-replay"),
    )
}

/// Produces the parked record of `id` to its original topic and partition, with its
/// original key and bytes, and marks it replayed once the broker acknowledged it.
///
/// A dead letter already replayed (or discarded) is refused unless `force`. The row is
/// locked (`SELECT ... FOR UPDATE`) from the check to the mark, so two concurrent replays
/// of one id produce once: the second waits, then finds it replayed. The lock is held
/// while the broker answers (at most [`DELIVERY_TIMEOUT`]); only this row is locked.
pub async fn replay(
    pool: &MySqlPool,
    producer: &Producer,
    id: u64,
    force: bool,
) -> Result<ReplayOutcome, DlqError> {
    let mut tx = stocksvr_store::deadline::begin(pool).await?;
    let row: Option<FullRow> = sqlx::query_as(&format!("{} FOR UPDATE", full_select()))
        .bind(id)
        .fetch_optional(&mut *tx)
        .deadline()
        .await?;
    let parked = Parked::try_from(row.ok_or(DlqError::NotFound(id))?)?;
    let previous = parked.summary.status;
    if previous != Status::Parked && !force {
        return Err(DlqError::ReplayRefused {
            id,
            status: previous,
        });
    }
    check_replayable(&parked)?;

    let s = &parked.summary;
    let replay_of = format!("{}/{}@{}", s.dlt_topic, s.dlt_partition, s.dlt_offset);
    let mut record: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(&s.original_topic)
        .partition(s.original_partition)
        .headers(OwnedHeaders::new().insert(Header {
            key: REPLAY_OF_HEADER,
            value: Some(&replay_of),
        }));
    // The original key and bytes exactly; no timestamp, so the broker stamps it now: a
    // replay is a new record in the log, and an old timestamp could fall out of retention.
    if let Some(key) = &parked.key {
        record = record.key(key.as_slice());
    }
    if let Some(value) = &parked.value {
        record = record.payload(value.as_slice());
    }
    let delivery = producer
        .send(record, DELIVERY_TIMEOUT)
        .await
        .map_err(|(e, _)| DlqError::Kafka(e))?;
    // Dropping `tx` on the error path above rolled back and released the lock: the row is
    // unchanged, and the record was not acknowledged.

    let marked = sqlx::query(
        "UPDATE inventory_dead_letter SET status = ?, updated_at = ? WHERE id = ? AND status = ?",
    )
    .bind(Status::Replayed.code())
    .bind(Utc::now().naive_utc())
    .bind(id)
    .bind(previous.code())
    .execute(&mut *tx)
    .deadline()
    .await;
    let not_marked = |source: sqlx::Error| DlqError::NotMarked {
        id,
        topic: s.original_topic.clone(),
        partition: delivery.partition,
        offset: delivery.offset,
        source,
    };
    match marked {
        Ok(done) if done.rows_affected() == 1 => {}
        // Cannot happen while the row lock is held; reported rather than assumed.
        Ok(_) => return Err(not_marked(sqlx::Error::RowNotFound)),
        Err(e) => return Err(not_marked(e)),
    }
    tx.commit().deadline().await.map_err(not_marked)?;

    metrics::counter!(names::DEAD_LETTERS_REPLAYED, "topic" => s.original_topic.clone())
        .increment(1);
    tracing::info!(
        id,
        topic = s.original_topic,
        partition = delivery.partition,
        offset = delivery.offset,
        %previous,
        forced = previous != Status::Parked,
        replay_of,
        "dead letter replayed"
    );
    Ok(ReplayOutcome {
        id,
        topic: s.original_topic.clone(),
        partition: delivery.partition,
        offset: delivery.offset,
        previous,
    })
}

/// A replay must put back exactly what failed, where it failed; anything less is refused.
fn check_replayable(parked: &Parked) -> Result<(), DlqError> {
    let s = &parked.summary;
    let refuse = |reason: String| Err(DlqError::NotReplayable { id: s.id, reason });
    if s.error_message.starts_with(NOT_STORED_MARKER) {
        return refuse(format!(
            "its bytes did not fit the table; the complete record is on {}/{}@{}",
            s.dlt_topic, s.dlt_partition, s.dlt_offset
        ));
    }
    if s.original_topic.is_empty() {
        return refuse("its original topic is unknown".into());
    }
    if s.original_topic == s.dlt_topic {
        return refuse("its original topic is its dead-letter topic".into());
    }
    Ok(())
}
