//! The admin routes answer with the right codes and JSON bodies.

mod common;

use common::*;
use serde_json::{json, Value};
use std::sync::Arc;
use stocksvr_dead_letter::{admin_routes, list, replay_producer, AdminState, Filter};
use stocksvr_pipeline::catalog::Catalog;
use stocksvr_pipeline::codec::AvroCodec;
use stocksvr_pipeline::json;

/// Serves the admin routes on a free port; returns the base URL.
async fn serve(state: AdminState) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("free port");
    let addr = listener.local_addr().expect("bound");
    tokio::spawn(async move { axum::serve(listener, admin_routes(state)).await });
    format!("http://{addr}")
}

async fn call(req: reqwest::RequestBuilder) -> (u16, Value) {
    let resp = req.send().await.expect("server answers");
    let status = resp.status().as_u16();
    let body = resp.json::<Value>().await.expect("JSON body");
    (status, body)
}

/// The InventoryConfirmDue example, encoded for `topic` (its subject is registered there).
async fn confirm_due(codec: &AvroCodec, catalog: &Catalog, topic: &str) -> Vec<u8> {
    let dir =
        std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").into());
    let path = format!("{dir}/../../schemas/examples/InventoryConfirmDue.json");
    let example: Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("example")).expect("JSON");
    let event = catalog
        .events()
        .iter()
        .find(|e| e.file == "InventoryConfirmDue.avsc")
        .expect("in the catalog");
    let value = json::json_to_avro(&example, &event.parsed).expect("example fits its schema");
    codec
        .encode_value_on(topic, &event.full_name, event.raw, value)
        .await
        .expect("encodes")
}

#[tokio::test(flavor = "multi_thread")]
async fn admin_routes_answer_with_the_right_codes() {
    let pool = fresh_database().await;
    let pair = topic_pair().await;
    let (topic, dlt) = (pair.topic.clone(), pair.dlt.clone());
    let settings = settings();
    let catalog = Arc::new(Catalog::embedded().expect("catalog"));
    let codec = AvroCodec::new(&settings.registry, catalog.clone()).expect("codec");
    for offset in 0..2 {
        let record = original(
            &topic,
            1,
            offset,
            Some(b"order-1"),
            Some(b"\x00\x00\x00\x00\x00"),
        );
        send_dead_letter(&record, "schema id 0 is unknown").await;
    }
    // A well-formed event that a processor rejected: `show` decodes it.
    let avro = confirm_due(&codec, &catalog, &topic).await;
    send_dead_letter(
        &original(&topic, 1, 2, Some(b"90000002"), Some(&avro)),
        "too early",
    )
    .await;
    run_processor(&pool, &topic, 3).await;
    let ids: Vec<u64> = list(&pool, &Filter::default())
        .await
        .expect("list")
        .iter()
        .map(|r| r.id)
        .collect();
    let producer = replay_producer(&settings.kafka).expect("producer");
    let base = serve(AdminState::new(pool.clone(), producer, Some(codec))).await;
    let http = reqwest::Client::new();
    let (a, b, c) = (ids[0], ids[1], ids[2]);

    let (code, body) = call(http.get(format!("{base}/admin/dlq"))).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["dead_letters"].as_array().map(Vec::len), Some(3));
    assert_eq!(body["dead_letters"][0]["status"], "parked");
    assert_eq!(body["dead_letters"][0]["dlt_topic"], dlt.as_str());
    assert_eq!(body["next_after_id"], Value::Null);
    let (code, body) = call(http.get(format!("{base}/admin/dlq?limit=1&topic={topic}"))).await;
    assert_eq!(
        (code, body["next_after_id"].as_u64()),
        (200, Some(a)),
        "{body}"
    );
    let (code, body) = call(http.get(format!("{base}/admin/dlq?status=bogus"))).await;
    assert_eq!(
        (code, body["error"].as_str()),
        (400, Some("invalid_request")),
        "{body}"
    );

    let (code, body) = call(http.get(format!("{base}/admin/dlq/{a}"))).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["original_topic"], topic.as_str());
    assert_eq!(body["original_partition"], 1);
    assert_eq!(body["consumer_group"], "stocksvr.order-lifecycle");
    assert_eq!(
        body["key"],
        json!({"len": 7, "hex": "6f726465722d31", "utf8": "order-1"})
    );
    assert_eq!(body["value"]["hex"], "0000000000");
    assert!(body["decode_error"].as_str().is_some(), "{body}");
    let (code, body) = call(http.get(format!("{base}/admin/dlq/{c}"))).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(
        body["decoded"]["full_name"], "io.stocksvr.schedule.InventoryConfirmDue",
        "{body}"
    );
    assert_eq!(
        body["decoded"]["value"]["data"]["order_id"], 90000002,
        "{body}"
    );
    let (code, body) = call(http.get(format!("{base}/admin/dlq/999999"))).await;
    assert_eq!(
        (code, body["error"].as_str()),
        (404, Some("dead_letter_not_found"))
    );
    let (code, _) = call(http.get(format!("{base}/admin/dlq/abc"))).await;
    assert_eq!(code, 400);

    // Replay without a body, then again: refused; with {"force":true}: done.
    let (code, body) = call(http.post(format!("{base}/admin/dlq/{a}/replay"))).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(
        (body["topic"].as_str(), body["partition"].as_i64()),
        (Some(topic.as_str()), Some(1))
    );
    assert_eq!(body["previous"], "parked");
    let (code, body) = call(http.post(format!("{base}/admin/dlq/{a}/replay"))).await;
    assert_eq!(
        (code, body["error"].as_str()),
        (409, Some("already_resolved")),
        "{body}"
    );
    let (code, body) = call(
        http.post(format!("{base}/admin/dlq/{a}/replay"))
            .json(&json!({"force": true})),
    )
    .await;
    assert_eq!(
        (code, body["previous"].as_str()),
        (200, Some("replayed")),
        "{body}"
    );
    let (code, _) = call(
        http.post(format!("{base}/admin/dlq/{a}/replay"))
            .json(&json!({"forse": true})),
    )
    .await;
    assert_eq!(code, 400, "unknown fields are rejected");
    let (code, body) = call(http.post(format!("{base}/admin/dlq/999999/replay"))).await;
    assert_eq!(
        (code, body["error"].as_str()),
        (404, Some("dead_letter_not_found"))
    );

    // Discard: needs a reason; twice is fine; a replayed one is a conflict.
    let (code, _) = call(http.post(format!("{base}/admin/dlq/{b}/discard"))).await;
    assert_eq!(code, 400);
    let discard = |id: u64| {
        http.post(format!("{base}/admin/dlq/{id}/discard"))
            .json(&json!({"reason": "bad test data"}))
    };
    let (code, body) = call(discard(b)).await;
    assert_eq!(
        (code, body["changed"].as_bool()),
        (200, Some(true)),
        "{body}"
    );
    let (code, body) = call(discard(b)).await;
    assert_eq!(
        (code, body["changed"].as_bool()),
        (200, Some(false)),
        "{body}"
    );
    let (code, body) = call(discard(a)).await;
    assert_eq!(
        (code, body["error"].as_str()),
        (409, Some("already_replayed")),
        "{body}"
    );
    let (code, _) = call(discard(999_999)).await;
    assert_eq!(code, 404);

    let (code, body) = call(http.get(format!("{base}/admin/dlq?status=all"))).await;
    assert_eq!(code, 200);
    let statuses: Vec<&str> = body["dead_letters"]
        .as_array()
        .expect("array")
        .iter()
        .filter_map(|r| r["status"].as_str())
        .collect();
    assert_eq!(statuses, ["replayed", "discarded", "parked"]);
}
