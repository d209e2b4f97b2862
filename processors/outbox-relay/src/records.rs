//! The Kafka records an outbox row stands for. Most rows are one event, their payload its
//! whole envelope. A completed reservation step writes one row for two events (docs/design.md,
//! one outbox row per reservation step): its columns are its stock-change event's (keyed by
//! bucket) and its payload a [`StepBody`] (the member [`LIFECYCLE_MEMBER`] says so), from
//! which both envelopes are rebuilt, the lifecycle event's (keyed by order) with the event id
//! it always had ([`stocksvr_core::events::paired`]). Rows written before that (two rows per
//! step) have no such member and still go out as one record each, so an upgrade publishes
//! them unchanged.
//!
//! A row counts as sent only once every one of its records was acknowledged; otherwise the
//! whole row is retried, both records again. Consumers dedupe by event id, and keeping which
//! half went out would cost a column and a write per failure for a path that is rare.

use crate::store::ClaimedRow;
use stocksvr_core::events::paired::{Lifecycle, StepBody, LIFECYCLE_MEMBER};
use stocksvr_core::events::EventKind;

/// One Kafka record to publish, and the row (its index in the batch) it comes from.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    pub row: usize,
    pub event_id: String,
    pub event_type: String,
    /// The declared topic name; the relay's namespace turns it into the deployment's.
    pub topic: String,
    pub partition_key: String,
    /// The JSON envelope, or why the row cannot become a record (retried as an encode
    /// failure, never dropped).
    pub payload: Result<String, String>,
}

/// The records of `rows`, in the rows' order and, within a row, stock change first: the
/// order the step used to write its two rows in, so each key's records keep their order.
pub fn records(rows: &[ClaimedRow]) -> Vec<Record> {
    let mut out = Vec::with_capacity(rows.len() * 2);
    for (i, row) in rows.iter().enumerate() {
        out.extend(of_row(i, row));
    }
    out
}

fn as_is(i: usize, row: &ClaimedRow, payload: Result<String, String>) -> Record {
    Record {
        row: i,
        event_id: row.event_id.clone(),
        event_type: row.event_type.clone(),
        topic: row.topic.clone(),
        partition_key: row.partition_key.clone(),
        payload,
    }
}

fn of_row(i: usize, row: &ClaimedRow) -> Vec<Record> {
    let text = match &row.payload {
        // Only a stock-change row can carry a lifecycle event; the text test spares parsing
        // every other row (no stock-change field is named so).
        Ok(text) if is_stock_change(&row.event_type) && text.contains(LIFECYCLE_MEMBER) => text,
        _ => return vec![as_is(i, row, row.payload.clone())],
    };
    match split(text, &row.event_id) {
        Ok(None) => vec![as_is(i, row, row.payload.clone())],
        Ok(Some(step)) => vec![
            as_is(i, row, Ok(step.stock_change)),
            Record {
                row: i,
                event_id: step.lifecycle.event_id().to_string(),
                event_type: step.lifecycle.kind().name().to_string(),
                topic: step.lifecycle.kind().topic().to_string(),
                partition_key: step.lifecycle.partition_key().to_string(),
                payload: Ok(step.lifecycle_text),
            },
        ],
        Err(e) => vec![as_is(i, row, Err(format!("lifecycle event: {e}")))],
    }
}

fn is_stock_change(event_type: &str) -> bool {
    EventKind::from_name(event_type)
        .is_some_and(|k| k.topic() == EventKind::InventoryRedisReserved.topic())
}

/// A step row's two events, their envelopes as JSON text.
struct Step {
    stock_change: String,
    lifecycle: Lifecycle,
    lifecycle_text: String,
}

/// The events of a step row whose `event_id` column is `event_id`; `None` when the payload
/// is no [`StepBody`].
fn split(text: &str, event_id: &str) -> Result<Option<Step>, String> {
    let value: serde_json::Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
    if value.get(LIFECYCLE_MEMBER).is_none() {
        return Ok(None);
    }
    let body: StepBody = serde_json::from_value(value).map_err(|e| e.to_string())?;
    let (stock_change, lifecycle) = body.events(event_id)?;
    let stock_change_text = serde_json::to_string(&stock_change).map_err(|e| e.to_string())?;
    let lifecycle_text = serde_json::to_string(&lifecycle).map_err(|e| e.to_string())?;
    Ok(Some(Step {
        stock_change: stock_change_text,
        lifecycle,
        lifecycle_text,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::NaiveDateTime;

    fn row(event_type: &str, payload: &str) -> ClaimedRow {
        ClaimedRow {
            id: 7,
            event_id: "op_try_1:InventoryRedisReserved".into(),
            event_type: event_type.into(),
            topic: "inventory.stock-change.v1".into(),
            partition_key: "bucket_1_2_20261207".into(),
            payload: Ok(payload.into()),
            retry_count: 0,
            created_at: NaiveDateTime::default(),
        }
    }

    const DATA: &str = r#"{"order_id":11,"merchant_id":1,"dish_id":2,"stock_bucket_id":"bucket_1_2_20261207","stock_date":"2026-12-07","order_type":"INSTANT","processing_time":null,"reservation_id":5,"order_item_id":12,"operation_id":"op_try_1","action":"TRY","quantity":3,"available_delta":-3,"reserved_delta":3,"sold_delta":0,"redis_version":9,"after":{"total":10,"available":7,"reserved":3,"sold":0},"reason_code":null,"refund_id":null,"empty_rollback":false}"#;

    /// A whole stock-change envelope (a row of the old shape).
    fn envelope() -> String {
        format!(
            r#"{{"event_id":"op_try_1:InventoryRedisReserved","event_type":"InventoryRedisReserved","schema_version":1,"occurred_at":"2026-12-07T10:00:00.000Z","producer":"stocksvr","trace_id":null,"partition_key":"bucket_1_2_20261207","data":{DATA}}}"#
        )
    }

    /// A step row's body with `lifecycle` as its member.
    fn step(lifecycle: &str) -> String {
        format!(
            r#"{{"occurred_at":"2026-12-07T10:00:00.000Z","data":{DATA},"lifecycle":{lifecycle}}}"#
        )
    }

    #[test]
    fn a_row_of_the_old_shape_is_one_record_unchanged() {
        let text = envelope();
        let got = records(&[row("InventoryRedisReserved", &text)]);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].payload.as_deref(), Ok(text.as_str()));
        assert_eq!(got[0].event_id, "op_try_1:InventoryRedisReserved");
        // A lifecycle row of the old shape (written by the previous version) as well.
        let got = records(&[row("InventoryReserved", r#"{"lifecycle":1}"#)]);
        assert_eq!(got.len(), 1, "only stock-change rows are split");
    }

    #[test]
    fn a_step_row_is_its_stock_change_then_its_lifecycle_event() {
        let text = step(r#"{"expire_at":"2026-12-07T10:15:00.000Z"}"#);
        let got = records(&[row("InventoryRedisReserved", &text)]);
        assert_eq!(got.len(), 2);
        let json = |t: &str| serde_json::from_str::<serde_json::Value>(t).unwrap_or_default();
        assert_eq!(
            got[0].payload.as_deref().map(json),
            Ok(json(&envelope())),
            "the stock change goes out as its whole envelope"
        );
        assert_eq!(got[0].topic, "inventory.stock-change.v1");
        let l = &got[1];
        assert_eq!(
            (l.row, l.event_id.as_str(), l.event_type.as_str()),
            (0, "op_try_1:InventoryReserved", "InventoryReserved")
        );
        assert_eq!(
            (l.topic.as_str(), l.partition_key.as_str()),
            ("inventory.lifecycle.v1", "11")
        );
        let v: serde_json::Value =
            serde_json::from_str(l.payload.as_deref().unwrap_or("null")).unwrap_or_default();
        assert_eq!(v["data"]["expire_at"], "2026-12-07T10:15:00.000Z");
        assert_eq!(v["data"]["quantity"], 3);
        assert_eq!(v["occurred_at"], "2026-12-07T10:00:00.000Z");
    }

    #[test]
    fn a_step_row_that_cannot_carry_its_lifecycle_event_is_retried_whole() {
        // A Try without expire_at: the row fails to encode (retried), nothing goes out.
        let text = step("{}");
        let got = records(&[row("InventoryRedisReserved", &text)]);
        assert_eq!(got.len(), 1);
        let e = got[0].payload.clone().unwrap_err();
        assert!(e.contains("expire_at"), "{e}");
    }
}
