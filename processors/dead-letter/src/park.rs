//! Parking: one transaction per batch, one `INSERT IGNORE` per dead letter.

use crate::origin::parse_dead_letter;
use crate::store::Status;
use chrono::Utc;
use futures::future::BoxFuture;
use futures::FutureExt;
use rdkafka::message::{Message, OwnedMessage};
use sqlx::MySqlPool;
use stocksvr_pipeline::consumer::{Applied, Failure, Handler, Record};
use stocksvr_pipeline::failure::Dependency;
use stocksvr_store::deadline::Deadline;
use stocksvr_telemetry::names;

/// The dead-letter processor's [`Handler`].
pub struct Parker {
    pool: MySqlPool,
    /// `<kafka.group_prefix>.`: the dead letters this deployment's groups wrote. A `.dlt`
    /// topic may be shared (two deployments, or another service, consuming the same source
    /// topic): each parks only its own, or every deployment would hold the others' records.
    own_groups: String,
}

impl Parker {
    /// Parks the dead letters written by the groups `<group_prefix>.<processor>`.
    pub fn new(pool: MySqlPool, group_prefix: &str) -> Self {
        Self {
            pool,
            own_groups: format!("{group_prefix}."),
        }
    }
}

impl Handler for Parker {
    fn handle<'a>(
        &'a self,
        batch: &'a [Record],
    ) -> BoxFuture<'a, Result<Vec<Result<Applied, Failure>>, Failure>> {
        let messages: Vec<&OwnedMessage> = batch.iter().map(|r| &r.message).collect();
        async move {
            match park_batch(&self.pool, &messages, &self.own_groups).await {
                Ok(applied) => Ok(applied.into_iter().map(Ok).collect()),
                // Every database error is retried: nothing a record carries can make the
                // insert fail (fields are cut to size first), so a failure is the database's,
                // and giving up would lose the dead letter (see the crate header).
                Err(e) => Err(Failure::unavailable(
                    Dependency::Mysql,
                    format!("parking dead letters: {e}"),
                )),
            }
        }
        .boxed()
    }
}

/// Parks `messages` in one transaction: `Applied` for a new row, `Duplicate` for a dead
/// letter parked before (same dead-letter topic, partition and offset, or the same origin
/// record: a replay of the source topic dead-letters it again), and `Duplicate` too, without
/// a row, for one written by a group that does not start with `own_groups`. Nothing of the
/// batch is durable unless all of it is.
pub async fn park_batch<M: Message + Sync>(
    pool: &MySqlPool,
    messages: &[&M],
    own_groups: &str,
) -> Result<Vec<Applied>, sqlx::Error> {
    let now = Utc::now().naive_utc();
    let mut tx = stocksvr_store::deadline::begin(pool).await?;
    let mut outcomes = Vec::new();
    let mut parked = Vec::new();
    for &message in messages {
        let row = parse_dead_letter(message);
        // A dead letter that names no group (a foreign or garbled producer) is parked: it may
        // be ours, and holding someone else's record costs less than losing our own.
        if !row.consumer_group.is_empty() && !row.consumer_group.starts_with(own_groups) {
            metrics::counter!(names::DEAD_LETTERS_FOREIGN, "topic" => row.dlt_topic.clone())
                .increment(1);
            tracing::debug!(
                dlt_topic = row.dlt_topic,
                dlt_offset = row.dlt_offset,
                consumer_group = row.consumer_group,
                "dead letter of another deployment's group; not parked"
            );
            outcomes.push(Applied::Duplicate);
            continue;
        }
        if !row.notes.is_empty() {
            tracing::warn!(
                dlt_topic = row.dlt_topic,
                dlt_partition = row.dlt_partition,
                dlt_offset = row.dlt_offset,
                notes = ?row.notes,
                "dead letter with incomplete headers; parked with fallbacks"
            );
        }
        let inserted = sqlx::query(
            "INSERT IGNORE INTO inventory_dead_letter \
             (dlt_topic, dlt_partition, dlt_offset, original_topic, original_partition, \
              original_offset, original_timestamp_ms, consumer_group, error_class, \
              error_message, record_key, record_value, status, created_at, updated_at) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(&row.dlt_topic)
        .bind(row.dlt_partition)
        .bind(row.dlt_offset)
        .bind(&row.original_topic)
        .bind(row.original_partition)
        .bind(row.original_offset)
        .bind(row.original_timestamp_ms)
        .bind(&row.consumer_group)
        .bind(&row.error_class)
        .bind(&row.error_message)
        .bind(&row.key)
        .bind(&row.value)
        .bind(Status::Parked.code())
        .bind(now)
        .bind(now)
        .execute(&mut *tx)
        .deadline()
        .await?;
        // The unique keys (dead-letter coordinates, origin record) are the only things
        // IGNORE can skip for: every field was cut to its column above.
        if inserted.rows_affected() == 1 {
            outcomes.push(Applied::Applied);
            parked.push(row);
        } else {
            outcomes.push(Applied::Duplicate);
        }
    }
    tx.commit().deadline().await?;
    // Counted once durable, so a rolled-back batch that is parked again counts once.
    for row in parked {
        metrics::counter!(names::DEAD_LETTERS_PARKED_TOTAL, "topic" => row.dlt_topic.clone(), "class" => row.error_class.clone()).increment(1);
        tracing::info!(
            dlt_topic = row.dlt_topic,
            dlt_partition = row.dlt_partition,
            dlt_offset = row.dlt_offset,
            original_topic = row.original_topic,
            original_partition = row.original_partition,
            original_offset = row.original_offset,
            error_class = row.error_class,
            "dead letter parked"
        );
    }
    Ok(outcomes)
}
