//! The transactional outbox (docs/design.md, events, outbox, inbox, projection): rows written
//! in the same transaction as the state change they announce, published by the relay.
//!
//! A completed reservation step writes one row: its stock-change event (`event_type`,
//! `topic`, `partition_key` = bucket, `event_id` are the stock change's), whose body (Avro in
//! `body`, `stocksvr_pipeline::step_body`; JSON in `payload` from earlier versions) also
//! carries the member `lifecycle` from which the relay rebuilds the step's lifecycle event and
//! publishes it too (`stocksvr_core::events::paired`). Every other event is a row of its own,
//! its envelope as JSON in `payload`.

use crate::clock::now;
use crate::deadline::Deadline;
use crate::one_off::OneOff;
use sqlx::{MySql, MySqlPool, Transaction};
use std::borrow::Borrow;
use stocksvr_core::codes::OutboxStatus;

/// The lifecycle event type a row `o` of `inventory_outbox` publishes, as an SQL expression
/// (NULL when none): a lifecycle row's own, or the one a step's stock-change row carries,
/// which is its own type without `Redis` (InventoryRedisReserved carries InventoryReserved;
/// `stocksvr_core::events::paired` pins that rule). Bind the lifecycle topic
/// (`topics::INVENTORY_LIFECYCLE`) to its one placeholder. For tests and tools that count
/// events rather than rows.
pub const LIFECYCLE_EVENT_TYPE: &str = "(CASE WHEN o.topic = ? THEN o.event_type \
     WHEN o.body IS NOT NULL OR JSON_EXISTS(o.payload, '$.lifecycle') \
     THEN REPLACE(o.event_type, 'Redis', '') END)";

/// An event to publish, written in the same transaction as the state change it announces.
#[derive(Debug, Clone)]
pub struct NewOutbox {
    pub event_id: String,
    pub aggregate_id: u64,
    pub event_type: String,
    pub topic: String,
    pub partition_key: String,
    /// The event as JSON: what is written to `payload` unless `body` is set, and what the
    /// process itself reads of the row (tests, the stale and conflict reports built from it).
    pub payload: serde_json::Value,
    /// A step's [`StepBody`](stocksvr_core::events::paired::StepBody) as Avro binary
    /// (`stocksvr_pipeline::step_body`): when set, it is written to `body` and `payload`
    /// stays NULL (a quarter of the bytes; issue 48).
    pub body: Option<Vec<u8>>,
}

impl NewOutbox {
    /// The `payload` column's value: none when the row stores its body as Avro.
    fn payload_column(&self) -> Option<&serde_json::Value> {
        match self.body {
            Some(_) => None,
            None => Some(&self.payload),
        }
    }
}

/// Writes `rows` with one multi-row INSERT: a step's two events, or every event of a group
/// of completed Trys, cost one statement (each is a round trip inside a held transaction).
/// Takes the rows or references to them: a group of completed Trys passes its
/// completions' rows without copying their payloads.
pub async fn insert_outbox<R: Borrow<NewOutbox>>(
    tx: &mut Transaction<'_, MySql>,
    rows: &[R],
) -> Result<(), sqlx::Error> {
    insert_outbox_rows(tx, rows, "INSERT").await
}

/// As [`insert_outbox`]; a row whose event_id exists already is skipped (an alert that
/// went out before, say).
pub async fn insert_outbox_ignore<R: Borrow<NewOutbox>>(
    tx: &mut Transaction<'_, MySql>,
    rows: &[R],
) -> Result<(), sqlx::Error> {
    insert_outbox_rows(tx, rows, "INSERT IGNORE").await
}

async fn insert_outbox_rows<R: Borrow<NewOutbox>>(
    tx: &mut Transaction<'_, MySql>,
    rows: &[R],
    verb: &str,
) -> Result<(), sqlx::Error> {
    // 10 placeholders a row: 1,000 rows stay far below MariaDB's 65,535.
    for chunk in rows.chunks(1000) {
        let now = now();
        let mut query = sqlx::QueryBuilder::<MySql>::new(format!(
            "{verb} INTO inventory_outbox (event_id, aggregate_id, event_type, topic, \
             partition_key, payload, body, status, next_retry_at, created_at) "
        ));
        query.push_values(chunk, |mut b, row| {
            let row = row.borrow();
            b.push_bind(&row.event_id)
                .push_bind(row.aggregate_id)
                .push_bind(&row.event_type)
                .push_bind(&row.topic)
                .push_bind(&row.partition_key)
                .push_bind(row.payload_column())
                .push_bind(row.body.as_deref())
                .push_bind(OutboxStatus::Pending.code())
                .push_bind(now)
                .push_bind(now);
        });
        query.one_off().execute(&mut **tx).deadline().await?;
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
         payload, body, status, next_retry_at, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
    ))
    .bind(&row.event_id)
    .bind(row.aggregate_id)
    .bind(&row.event_type)
    .bind(&row.topic)
    .bind(&row.partition_key)
    .bind(row.payload_column())
    .bind(row.body.as_deref())
    .bind(OutboxStatus::Pending.code())
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
