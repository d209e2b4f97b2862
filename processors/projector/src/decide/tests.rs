//! The decision rules over the example payloads of `schemas/examples`, as Avro values shaped
//! by the embedded schemas, so a contract change shows up here before it reaches a database.

use super::*;
use serde_json::{json, Value as Json};
use stocksvr_pipeline::catalog::Catalog;
use stocksvr_pipeline::json::json_to_avro;

/// The crate's directory, read when the test runs: a test binary reused from a shared target
/// dir may have been compiled in a checkout at another path, so `env!` could point elsewhere.
fn manifest_dir() -> String {
    std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").to_string())
}

fn example(file: &str) -> Json {
    let path = format!("{}/../../schemas/examples/{file}.json", manifest_dir());
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// What the codec hands the handler for `json` written with the schema of `name`.
fn decoded(name: &str, json: &Json) -> Decoded {
    let full_name = format!("io.stocksvr.inventory.{name}");
    let catalog = Catalog::embedded().expect("catalog");
    let schema = &catalog.by_name(&full_name).expect("in catalog").parsed;
    Decoded {
        schema_id: 1,
        full_name,
        value: json_to_avro(json, schema).expect("example fits its schema"),
    }
}

fn decide_example(file: &str) -> Projection {
    let name = file.split('.').next().expect("name");
    decide(&decoded(name, &example(file))).unwrap_or_else(|e| panic!("{file}: {e}"))
}

#[test]
fn every_stock_change_example_decides() {
    let files = [
        "InventoryRedisReserved",
        "InventoryRedisConfirmed",
        "InventoryRedisCanceled",
        "InventoryRedisCanceled.empty-rollback",
        "InventoryRedisRefunded",
        "InventoryRedisRefunded.before-confirm",
        "StockBucketInitialized",
        "StockBaselineAdjusted",
        "StockBaselineAdjusted.deficit",
        "StockBucketRepaired",
        "StockBucketRebuilt",
    ];
    for file in files {
        let p = decide_example(file);
        let json = example(file);
        assert_eq!(p.event_id, json["event_id"], "{file}");
        assert_eq!(
            p.ledger.operation_id, json["data"]["operation_id"],
            "{file}"
        );
        let snapshot = p.snapshot.expect("examples carry a version");
        assert_eq!(
            snapshot.redis_version,
            json["data"]["redis_version"].as_u64().expect("version"),
            "{file}"
        );
        assert_eq!(
            snapshot.after.total,
            json["data"]["after"]["total"].as_i64().expect("total"),
            "{file}"
        );
    }
}

#[test]
fn reservation_steps_book_their_deltas_and_sync_the_reservation() {
    let p = decide_example("InventoryRedisReserved");
    assert_eq!(p.kind, EventKind::InventoryRedisReserved);
    assert_eq!(p.ledger.action, LedgerAction::Try);
    assert_eq!(p.ledger.action.code(), 2);
    assert_eq!(
        (
            p.ledger.quantity,
            p.ledger.available_delta,
            p.ledger.reserved_delta,
            p.ledger.sold_delta,
            p.ledger.total_delta
        ),
        (2, -2, 2, 0, 0)
    );
    assert_eq!(p.ledger.reservation_id, Some(100_123_001));
    assert_eq!(p.ledger.order_id, Some(90_000_001));
    assert_eq!(p.ledger.order_item_id, Some(50_000_001));
    assert_eq!(
        p.sync,
        Some(ReservationSync {
            reservation_id: 100_123_001,
            redis_version: 392
        })
    );
    let snapshot = p.snapshot.expect("snapshot");
    assert_eq!(
        snapshot.deficit,
        Some(0),
        "the deficit follows from after: available + reserved + sold - total"
    );
    assert_eq!(
        snapshot.stock_date,
        NaiveDate::from_ymd_opt(2026, 7, 26).expect("date")
    );

    let codes: Vec<i8> = [
        "InventoryRedisConfirmed",
        "InventoryRedisCanceled",
        "InventoryRedisRefunded",
    ]
    .iter()
    .map(|f| decide_example(f).ledger.action.code())
    .collect();
    assert_eq!(codes, [3, 4, 6]);
}

#[test]
fn an_empty_rollback_books_zero_deltas() {
    let p = decide_example("InventoryRedisCanceled.empty-rollback");
    assert_eq!(p.ledger.action, LedgerAction::Cancel);
    assert_eq!(
        (
            p.ledger.available_delta,
            p.ledger.reserved_delta,
            p.ledger.sold_delta
        ),
        (0, 0, 0)
    );
    assert_eq!(p.ledger.quantity, 1);
}

#[test]
fn an_event_without_a_bucket_version_projects_no_snapshot() {
    // cancel.lua answers an empty rollback on a missing bucket with version 0 and zeros:
    // a snapshot row from it would show a bucket Redis does not have.
    let mut json = example("InventoryRedisCanceled.empty-rollback");
    json["data"]["redis_version"] = json!(0);
    json["data"]["after"] = json!({"total": 0, "available": 0, "reserved": 0, "sold": 0});
    let p = decide(&decoded("InventoryRedisCanceled", &json)).expect("valid");
    assert_eq!(p.snapshot, None);
    assert_eq!(p.ledger.redis_version, None);
    assert_eq!(
        p.sync.map(|s| s.redis_version),
        Some(0),
        "the reservation is still told"
    );
}

#[test]
fn init_and_adjust_book_total_deltas_and_state_the_deficit() {
    let init = decide_example("StockBucketInitialized");
    assert_eq!(init.ledger.action.code(), 1);
    assert_eq!(
        (
            init.ledger.quantity,
            init.ledger.total_delta,
            init.ledger.available_delta
        ),
        (100, 100, 100)
    );
    assert_eq!(init.ledger.reservation_id, None);
    assert_eq!(init.sync, None);
    assert_eq!(init.snapshot.expect("snapshot").deficit, Some(0));

    let up = decide_example("StockBaselineAdjusted");
    assert_eq!(up.ledger.action.code(), 5);
    assert_eq!(
        (
            up.ledger.quantity,
            up.ledger.total_delta,
            up.ledger.available_delta
        ),
        (120, 20, 20)
    );
    assert_eq!(up.snapshot.expect("snapshot").deficit, Some(0));

    let down = decide_example("StockBaselineAdjusted.deficit");
    assert_eq!(
        (down.ledger.total_delta, down.ledger.available_delta),
        (20 - 120, -91)
    );
    assert_eq!(down.snapshot.expect("snapshot").deficit, Some(9));
    assert_eq!(down.sync, None);
}

fn invalid(name: &str, json: &Json) -> String {
    decide(&decoded(name, json))
        .expect_err("must be invalid")
        .to_string()
}

#[test]
fn an_envelope_contradicting_its_data_is_invalid() {
    let mut json = example("InventoryRedisReserved");
    json["data"]["action"] = json!("CONFIRM");
    let reason = invalid("InventoryRedisReserved", &json);
    assert!(reason.contains("InventoryRedisConfirmed"), "{reason}");

    let mut json = example("InventoryRedisReserved");
    json["partition_key"] = json!("another_bucket");
    assert!(invalid("InventoryRedisReserved", &json).contains("partition_key"));

    let mut json = example("StockBaselineAdjusted");
    json["event_type"] = json!("StockBucketInitialized");
    assert!(invalid("StockBaselineAdjusted", &json).contains("event_type"));
}

#[test]
fn values_mysql_would_refuse_are_invalid() {
    let long = "x".repeat(MAX_ID_LEN + 1);
    let cases: Vec<(&str, &str, Json)> = vec![
        ("event_id", "/event_id", json!(long)),
        ("operation_id", "/data/operation_id", json!(long)),
        ("operation_id", "/data/operation_id", json!("")),
        ("stock_bucket_id", "/data/stock_bucket_id", json!(long)),
        ("merchant_id", "/data/merchant_id", json!(-1)),
        ("redis_version", "/data/redis_version", json!(-5)),
        ("quantity", "/data/quantity", json!(-2)),
        ("stock_date", "/data/stock_date", json!("26/07/2026")),
        ("after", "/data/after/available", json!(-1)),
    ];
    for (field, pointer, value) in cases {
        let mut json = example("InventoryRedisConfirmed");
        *json.pointer_mut(pointer).expect(pointer) = value.clone();
        if pointer == "/data/stock_bucket_id" {
            // Keep the envelope consistent so the length rule is what fails.
            json["partition_key"] = value;
        }
        let reason = invalid("InventoryRedisConfirmed", &json);
        assert!(reason.contains(field), "{pointer}: {reason}");
    }

    let mut json = example("StockBaselineAdjusted.deficit");
    json["data"]["deficit"] = json!(-1);
    assert!(invalid("StockBaselineAdjusted", &json).contains("deficit"));

    // Found by the decoder fuzz: `after.total - old_total` overflowed (a panic in the
    // projector on every redelivery) for an old_total near i64::MIN.
    for old_total in [-1, i64::MIN] {
        let mut json = example("StockBaselineAdjusted");
        json["data"]["old_total"] = json!(old_total);
        let reason = invalid("StockBaselineAdjusted", &json);
        assert!(reason.contains("old_total"), "{old_total}: {reason}");
    }
}

#[test]
fn other_events_are_not_stock_changes() {
    let catalog = Catalog::embedded().expect("catalog");
    let full_name = "io.stocksvr.inventory.InventoryReserved";
    let schema = &catalog.by_name(full_name).expect("declared").parsed;
    let event = Decoded {
        schema_id: 1,
        full_name: full_name.into(),
        value: json_to_avro(&example("InventoryReserved"), schema).expect("fits"),
    };
    assert!(matches!(
        decide(&event),
        Err(InvalidEvent::NotAStockChange(_))
    ));
    let unknown = Decoded {
        full_name: "com.example.Other".into(),
        ..event
    };
    assert!(matches!(
        decide(&unknown),
        Err(InvalidEvent::NotAStockChange(_))
    ));
}

#[test]
fn repairs_and_rebuilds_book_their_deltas_and_set_the_snapshot() {
    for (file, action, code) in [
        ("StockBucketRepaired", LedgerAction::Repair, 7),
        ("StockBucketRebuilt", LedgerAction::Rebuild, 8),
    ] {
        let p = decide_example(file);
        assert_eq!((p.ledger.action, p.ledger.action.code()), (action, code));
        assert_eq!(p.sync, None, "{file}: no reservation");
        let json = example(file);
        let d = &json["data"];
        assert_eq!(
            (
                p.ledger.total_delta,
                p.ledger.available_delta,
                p.ledger.reserved_delta,
                p.ledger.sold_delta
            ),
            (
                d["total_delta"].as_i64().unwrap_or(-1),
                d["available_delta"].as_i64().unwrap_or(-1),
                d["reserved_delta"].as_i64().unwrap_or(-1),
                d["sold_delta"].as_i64().unwrap_or(-1)
            ),
            "{file}"
        );
        let snapshot = p.snapshot.expect("a repair always has a version");
        assert_eq!(snapshot.deficit, Some(0), "{file}");
    }
}

#[test]
fn a_release_that_pays_a_deficit_leaves_the_rest_in_the_snapshot() {
    let mut json = example("InventoryRedisCanceled");
    // 3 of the released units paid a deficit: total 100 with 101 accounted for.
    json["data"]["after"] =
        serde_json::json!({"total": 100, "available": 0, "reserved": 60, "sold": 41});
    let p = decide(&decoded("InventoryRedisCanceled", &json)).expect("decides");
    assert_eq!(p.snapshot.expect("snapshot").deficit, Some(1));
}
