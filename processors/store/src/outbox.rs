//! The transactional outbox (seed §4.6): rows written in the same transaction as the state
//! change they announce, published by the relay.

use crate::deadline::Deadline;
use crate::reservations::now;
use sqlx::{MySql, MySqlPool, Transaction};

/// An event to publish, written in the same transaction as the state change it announces.
#[derive(Debug, Clone)]
pub struct NewOutbox {
    pub event_id: String,
    pub aggregate_id: u64,
    pub event_type: String,
    pub topic: String,
    pub partition_key: String,
    pub payload: serde_json::Value,
}

pub async fn insert_outbox(
    tx: &mut Transaction<'_, MySql>,
    rows: &[NewOutbox],
) -> Result<(), sqlx::Error> {
    for row in rows {
        write_outbox(&mut **tx, row, false).await?;
    }
    Ok(())
}

/// One outbox row; with `ignore`, a row whose event_id exists already is skipped (the
/// returned count is then 0).
pub(crate) async fn write_outbox<'e, E: sqlx::MySqlExecutor<'e>>(
    exec: E,
    row: &NewOutbox,
    ignore: bool,
) -> Result<u64, sqlx::Error> {
    let now = now();
    let verb = if ignore { "INSERT IGNORE" } else { "INSERT" };
    let done = sqlx::query(&format!(
        "{verb} INTO inventory_outbox (event_id, aggregate_id, event_type, topic, partition_key, \
         payload, status, next_retry_at, created_at) VALUES (?, ?, ?, ?, ?, ?, 10, ?, ?)"
    ))
    .bind(&row.event_id)
    .bind(row.aggregate_id)
    .bind(&row.event_type)
    .bind(&row.topic)
    .bind(&row.partition_key)
    .bind(&row.payload)
    .bind(now)
    .bind(now)
    .execute(exec)
    .deadline()
    .await?;
    Ok(done.rows_affected())
}

/// Enqueues one event outside a state change (e.g. a conflict report). Idempotent on
/// `event_id`: a redelivered trigger enqueues nothing new.
pub async fn enqueue_once(pool: &MySqlPool, row: &NewOutbox) -> Result<bool, sqlx::Error> {
    Ok(write_outbox(pool, row, true).await? == 1)
}
