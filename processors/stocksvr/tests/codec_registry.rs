//! The Avro codec against the real schema registry: every example payload round-trips,
//! and each kind of malformed record gives its typed error instead of a panic.

mod common;

use std::sync::Arc;
use stocksvr_pipeline::catalog::{Catalog, EventSchema};
use stocksvr_pipeline::codec::{AvroCodec, DecodeError};
use stocksvr_pipeline::json::{avro_to_json, json_to_avro};

fn codec() -> AvroCodec {
    let catalog = Arc::new(Catalog::embedded().expect("catalog"));
    AvroCodec::new(&common::settings().registry, catalog).expect("codec")
}

/// Every `schemas/examples/*.json` with the catalog entry of its record.
pub fn examples(catalog: &Catalog) -> Vec<(String, serde_json::Value, EventSchema)> {
    let dir = common::repo_root().join("schemas/examples");
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("examples dir") {
        let path = entry.expect("entry").path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .expect("name")
            .to_string();
        if !name.ends_with(".json") {
            continue;
        }
        let record = name.split('.').next().expect("record prefix");
        let event = catalog
            .events()
            .iter()
            .find(|e| e.file == format!("{record}.avsc"))
            .unwrap_or_else(|| panic!("{name}: no schema {record}.avsc"))
            .clone();
        let json =
            serde_json::from_str(&std::fs::read_to_string(&path).expect("read")).expect("json");
        out.push((name, json, event));
    }
    assert!(out.len() >= 17, "every event has at least one example");
    out
}

#[tokio::test]
async fn every_example_round_trips_through_the_registry() {
    let codec = codec();
    for (name, json, event) in examples(codec.catalog()) {
        let value = json_to_avro(&json, &event.parsed).unwrap_or_else(|e| panic!("{name}: {e}"));
        let bytes = codec
            .encode_value(&event.full_name, value.clone())
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(bytes[0], 0, "{name}: Confluent magic byte");
        let decoded = codec
            .decode(Some(&bytes))
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(decoded.full_name, event.full_name, "{name}");
        assert_eq!(avro_to_json(&decoded.value), avro_to_json(&value), "{name}");
        assert_eq!(
            avro_to_json(&decoded.value),
            json,
            "{name}: example must be complete"
        );
    }
}

#[tokio::test]
async fn malformed_records_give_typed_errors() {
    let codec = codec();
    let catalog = Catalog::embedded().expect("catalog");
    let (_, json, event) = examples(&catalog)
        .into_iter()
        .find(|(n, _, _)| n == "OrderCreated.json")
        .expect("OrderCreated example");
    let good = codec
        .encode_value(
            &event.full_name,
            json_to_avro(&json, &event.parsed).expect("valid"),
        )
        .await
        .expect("encodes");

    let kind = |r: Result<_, DecodeError>| {
        r.map(|_: stocksvr_pipeline::codec::Decoded| ())
            .unwrap_err()
            .kind()
    };
    assert_eq!(kind(codec.decode(None).await), "empty");
    assert_eq!(
        kind(codec.decode(Some(b"{\"order_id\":1}")).await),
        "wrong_magic_byte"
    );
    assert_eq!(
        kind(codec.decode(Some(&good[..3])).await),
        "truncated_header"
    );
    let mut unknown = good.clone();
    unknown[1..5].copy_from_slice(&0x7fff_fff0u32.to_be_bytes());
    let err = codec.decode(Some(&unknown)).await.unwrap_err();
    assert_eq!(err.kind(), "unknown_schema_id", "{err}");
    assert!(
        !err.is_retryable(),
        "an unknown id is a property of the record"
    );
    assert_eq!(
        kind(codec.decode(Some(&good[..good.len() - 4])).await),
        "truncated_body"
    );
    let mut trailing = good.clone();
    trailing.extend_from_slice(&[1, 2, 3, 4]);
    assert_eq!(kind(codec.decode(Some(&trailing)).await), "malformed_body");

    // A valid record of another type where an OrderCreated is expected.
    #[derive(serde::Deserialize, Debug)]
    struct Anything {}
    let err = codec
        .decode_as::<Anything>(Some(&good), "io.stocksvr.order.OrderCanceled")
        .await
        .unwrap_err();
    assert_eq!(err.kind(), "schema_mismatch");

    // Garbage after a valid header never panics, whatever it is.
    let mut x: u32 = 12345;
    for len in 0..64 {
        let mut bytes = good[..5].to_vec();
        bytes.extend((0..len).map(|_| {
            x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
            (x >> 16) as u8
        }));
        let _ = codec.decode(Some(&bytes)).await;
    }
}
