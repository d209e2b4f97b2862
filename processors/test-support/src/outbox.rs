//! The outbox rows of a test's database with each row's event as JSON, whichever column
//! holds it: a reservation step's Avro `body` decoded (`stocksvr_pipeline::step_body`), or
//! the JSON `payload` of every other row. SQL cannot look into an Avro body, so tests that
//! read what a row says read it here.

use sqlx::MySqlPool;

/// One `inventory_outbox` row.
#[derive(Debug, Clone)]
pub struct OutboxRow {
    pub id: u64,
    pub event_id: String,
    pub aggregate_id: u64,
    pub event_type: String,
    pub topic: String,
    /// The body's JSON: for a step row, its `StepBody` (`occurred_at`, `data`, `lifecycle`).
    pub json: serde_json::Value,
    /// Whether the row is a step's and stands for its lifecycle event too.
    pub carries_lifecycle: bool,
}

type Columns = (
    u64,
    String,
    u64,
    String,
    String,
    Option<String>,
    Option<Vec<u8>>,
);

/// Every outbox row of the database, in id (commit) order.
pub async fn outbox_rows(pool: &MySqlPool) -> Vec<OutboxRow> {
    let rows: Vec<Columns> = sqlx::query_as(
        "SELECT id, event_id, aggregate_id, event_type, topic, CAST(payload AS CHAR), body \
         FROM inventory_outbox ORDER BY id",
    )
    .fetch_all(pool)
    .await
    .expect("outbox rows");
    rows.into_iter()
        .map(
            |(id, event_id, aggregate_id, event_type, topic, payload, body)| {
                let json =
                    stocksvr_pipeline::step_body::row_json(payload.as_deref(), body.as_deref())
                        .unwrap_or_else(|e| panic!("outbox row {id} ({event_id}): {e}"));
                let carries_lifecycle = json.get("lifecycle").is_some();
                OutboxRow {
                    id,
                    event_id,
                    aggregate_id,
                    event_type,
                    topic,
                    json,
                    carries_lifecycle,
                }
            },
        )
        .collect()
}
