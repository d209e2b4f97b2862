//! The stored form of a reservation step's outbox row: its [`StepBody`] as Avro binary in
//! `inventory_outbox.body` instead of JSON text in `payload` (issue 48: the JSON was about
//! 600 of the row's 950 bytes; the Avro body is about 150).
//!
//! The writer schema is the stock-change record the project already publishes
//! (`io.stocksvr.inventory.StockChangeData`, taken from `schemas/InventoryRedisReserved.avsc`
//! at build time) inside a small internal record with the step's time and its lifecycle
//! extras. It is never registered: the body only travels from the service that writes the
//! row to the relay that reads it, and both are this binary. The first byte names the body's
//! format, so a later version that changes the stock-change record can still read the rows an
//! earlier one left behind (keep the old schema under its number, add a new number).

use apache_avro::Schema;
use serde_json::{json, Value as Json};
use std::sync::OnceLock;
use stocksvr_core::events::paired::StepBody;

use crate::json::{avro_to_json, JsonAvroWriter};

/// The format byte of every body written today.
pub const FORMAT_V1: u8 = 1;

const STOCK_CHANGE_EVENT: &str = include_str!("../../../schemas/InventoryRedisReserved.avsc");

/// The writer schema of [`FORMAT_V1`] as JSON: the event's `data` record, unchanged, inside
/// the internal body record.
fn schema_json() -> Result<Json, String> {
    let event: Json = serde_json::from_str(STOCK_CHANGE_EVENT)
        .map_err(|e| format!("InventoryRedisReserved.avsc: {e}"))?;
    let data = event["fields"]
        .as_array()
        .and_then(|fields| fields.iter().find(|f| f["name"] == "data"))
        .map(|f| f["type"].clone())
        .ok_or("InventoryRedisReserved.avsc has no data field")?;
    Ok(json!({
        "type": "record",
        "name": "OutboxStepBody",
        "namespace": "io.stocksvr.internal",
        "doc": "A reservation step's outbox row: never published as such, see step_body.rs",
        "fields": [
            {"name": "occurred_at", "type": "string"},
            {"name": "data", "type": data},
            {"name": "lifecycle", "type": {
                "type": "record",
                "name": "LifecycleExtra",
                "fields": [
                    {"name": "expire_at", "type": ["null", "string"], "default": null},
                    {"name": "before_confirm", "type": ["null", "boolean"], "default": null}
                ]
            }}
        ]
    }))
}

/// The writer of [`FORMAT_V1`], built once.
fn writer() -> Result<&'static JsonAvroWriter, String> {
    static WRITER: OnceLock<Result<JsonAvroWriter, String>> = OnceLock::new();
    WRITER
        .get_or_init(|| {
            let schema = Schema::parse(&schema_json()?).map_err(|e| e.to_string())?;
            Ok(JsonAvroWriter::new(&schema))
        })
        .as_ref()
        .map_err(|e| format!("the outbox step body schema: {e}"))
}

/// `body` as the bytes of `inventory_outbox.body`.
pub fn encode(body: &StepBody) -> Result<Vec<u8>, String> {
    let writer = writer()?;
    let json = serde_json::to_value(body).map_err(|e| e.to_string())?;
    let mut out = vec![FORMAT_V1];
    writer
        .write(&json, &mut out)
        .map_err(|e| format!("the outbox step body: {e}"))?;
    Ok(out)
}

/// The step body stored as `bytes` by [`encode`] (of this version or an earlier one).
pub fn decode(bytes: &[u8]) -> Result<StepBody, String> {
    let json = decode_json(bytes)?;
    serde_json::from_value(json).map_err(|e| format!("the outbox step body: {e}"))
}

/// As [`decode`], as the JSON a step row's `payload` held before the body was Avro.
pub fn decode_json(bytes: &[u8]) -> Result<Json, String> {
    match bytes.split_first() {
        Some((&FORMAT_V1, avro)) => {
            let value = crate::codec::decode_body(0, writer()?.schema(), avro)
                .map_err(|e| format!("the outbox step body: {e}"))?;
            Ok(avro_to_json(&value))
        }
        Some((format, _)) => Err(format!(
            "the outbox step body has format {format}, which this version cannot read \
             (a newer version wrote it)"
        )),
        None => Err("the outbox step body is empty".into()),
    }
}

/// The JSON of an outbox row read as its two columns: `payload` as written, or the body
/// decoded. For tests and tools that look into rows.
pub fn row_json(payload: Option<&str>, body: Option<&[u8]>) -> Result<Json, String> {
    match (body, payload) {
        (Some(bytes), _) => decode_json(bytes),
        (None, Some(text)) => serde_json::from_str(text).map_err(|e| e.to_string()),
        (None, None) => Err("the outbox row has neither a payload nor a body".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stocksvr_core::events::paired::LifecycleExtra;
    use stocksvr_core::events::{OrderType, StockAction, StockAfter, StockChangeData};

    fn body(lifecycle: LifecycleExtra, refund_id: Option<&str>) -> StepBody {
        StepBody {
            occurred_at: "2026-12-07T17:40:01.123+08:00".into(),
            data: StockChangeData {
                order_id: 7_412_345_678_901_234_567,
                merchant_id: 100_234,
                dish_id: 5_001_234,
                stock_bucket_id: "100234:5001234:20261207:1".into(),
                stock_date: "2026-12-07".into(),
                order_type: OrderType::Scheduled,
                processing_time: Some("2026-12-07T19:00:00.000+08:00".into()),
                reservation_id: 7_412_345_678_901_234_999,
                order_item_id: 7_412_345_678_901_234_568,
                operation_id: "op_try_7412345678901234999".into(),
                action: StockAction::Refund,
                quantity: 3,
                available_delta: 3,
                reserved_delta: 0,
                sold_delta: -3,
                redis_version: 123_456,
                after: StockAfter {
                    total: 10_109,
                    available: 9_999,
                    reserved: 10,
                    sold: 100,
                },
                reason_code: Some("PARTIAL".into()),
                refund_id: refund_id.map(str::to_string),
                empty_rollback: true,
            },
            lifecycle,
        }
    }

    #[test]
    fn a_body_reads_back_whole_in_a_quarter_of_its_json() {
        for (extra, refund) in [
            (
                LifecycleExtra {
                    expire_at: Some("2026-12-07T18:10:01.123+08:00".into()),
                    before_confirm: None,
                },
                None,
            ),
            (
                LifecycleExtra {
                    expire_at: None,
                    before_confirm: Some(true),
                },
                Some("r-17"),
            ),
            (LifecycleExtra::default(), None),
        ] {
            let b = body(extra, refund);
            let bytes = encode(&b).expect("encodes");
            assert_eq!(bytes[0], FORMAT_V1);
            assert_eq!(decode(&bytes).expect("decodes"), b);
            let json = serde_json::to_vec(&b).expect("json");
            assert!(
                bytes.len() * 3 < json.len(),
                "{} Avro bytes against {} JSON bytes",
                bytes.len(),
                json.len()
            );
        }
    }

    #[test]
    fn a_body_of_an_unknown_format_or_cut_short_is_refused_with_the_reason() {
        let bytes = encode(&body(LifecycleExtra::default(), None)).expect("encodes");
        let mut newer = bytes.clone();
        newer[0] = 9;
        assert!(decode(&newer).unwrap_err().contains("format 9"));
        assert!(decode(&bytes[..bytes.len() - 4]).is_err());
        assert!(decode(&[]).unwrap_err().contains("empty"));
    }

    #[test]
    fn a_row_reads_as_its_payload_or_its_decoded_body() {
        let b = body(LifecycleExtra::default(), None);
        let bytes = encode(&b).expect("encodes");
        let from_body = row_json(None, Some(&bytes)).expect("body");
        assert_eq!(from_body["data"]["redis_version"], 123_456);
        let from_payload =
            row_json(Some(r#"{"data":{"redis_version":7}}"#), None).expect("payload");
        assert_eq!(from_payload["data"]["redis_version"], 7);
        assert!(row_json(None, None).is_err());
    }

    /// The body's schema is the published stock-change record's: a change to that record
    /// changes what rows written before it mean. When this fails, keep the old schema for
    /// reading under [`FORMAT_V1`] and write the new one under a new format byte.
    #[test]
    fn the_body_schema_is_pinned() {
        let schema = writer().expect("schema").schema();
        let fingerprint = schema
            .fingerprint::<apache_avro::rabin::Rabin>()
            .to_string();
        assert_eq!(
            fingerprint, "301c23b95c4510af",
            "the step body's schema changed"
        );
    }
}
