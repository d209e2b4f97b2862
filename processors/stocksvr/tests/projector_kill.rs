//! The projector process killed with SIGKILL in the middle of a stream of stock-change
//! events, then restarted: every event is booked exactly once (its batch transaction either
//! committed with its ledger rows, which recognise the redelivered events, or not at all) and
//! the snapshot ends at the newest version.

mod common;

use common::api::shop;
use common::server::Server;
use rdkafka::producer::FutureRecord;
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use stocksvr_pipeline::catalog::Catalog;
use stocksvr_pipeline::codec::AvroCodec;
use stocksvr_pipeline::json::json_to_avro;
use stocksvr_test_support::eventually;

// Four batches and more: the kill lands after a batch commit, not after the whole stream.
const EVENTS: i64 = 2_000;

fn projector(env: &common::TestEnv) -> Server {
    let mut vars: Vec<(String, String)> = env
        .env()
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    vars.push((
        "STOCKSVR__KAFKA__PROPERTIES__SESSION_TIMEOUT_MS".into(),
        "6000".into(),
    ));
    Server::start_with(&vars, "projector")
}

async fn booked(pool: &sqlx::MySqlPool, bucket: &str) -> i64 {
    let (n,): (i64,) =
        sqlx::query_as("SELECT COUNT(*) FROM inventory_ledger WHERE stock_bucket_id = ?")
            .bind(bucket)
            .fetch_one(pool)
            .await
            .expect("ledger");
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn projector_killed_mid_stream_books_every_event_once() {
    let shop = shop(1).await;
    let pool = shop.env.db.pool.clone();
    let bucket = format!("bucket_{}_{}_20261129", shop.merchant_id, shop.dish_id);

    let settings = common::settings();
    let kafka = shop.env.kafka();
    let catalog = Arc::new(Catalog::for_deployment(&kafka).expect("catalog"));
    let entry = catalog
        .by_name("io.stocksvr.inventory.InventoryRedisReserved")
        .expect("declared")
        .clone();
    let codec = AvroCodec::new(&settings.registry, catalog).expect("codec");
    let producer =
        stocksvr_pipeline::kafka::producer(&kafka, "it-projector-kill").expect("producer");
    // All events are on the topic before the projector starts, so it meets a backlog and
    // the kill lands between batch commits. Enqueued one after the other (which keeps their
    // order on the partition) and acknowledged together: one acknowledgement at a time cost
    // the producer's linger per event.
    let mut acks = Vec::new();
    for version in 1..=EVENTS {
        let event = json!({"event_id": format!("{bucket}-evt-{version}"), "event_type": "InventoryRedisReserved",
            "schema_version": 1, "occurred_at": "2026-11-29T12:00:00.000+00:00", "producer": "stocksvr",
            "trace_id": null, "partition_key": bucket, "data": {
                "order_id": 1, "merchant_id": shop.merchant_id, "dish_id": shop.dish_id, "stock_bucket_id": bucket,
                "stock_date": "2026-11-29", "order_type": "INSTANT", "processing_time": null,
                "reservation_id": version, "order_item_id": version, "operation_id": format!("{bucket}-op-{version}"),
                "action": "TRY", "quantity": 1, "available_delta": -1, "reserved_delta": 1, "sold_delta": 0,
                "redis_version": version, "after": {"total": EVENTS, "available": EVENTS - version, "reserved": version, "sold": 0},
                "reason_code": null, "refund_id": null, "empty_rollback": false}});
        let bytes = codec
            .encode_value(
                &entry.full_name,
                json_to_avro(&event, &entry.parsed).expect("valid"),
            )
            .await
            .expect("encode");
        acks.push(
            producer
                .send_result(FutureRecord::to(&entry.topic).key(&bucket).payload(&bytes))
                .map_err(|(e, _)| e)
                .expect("enqueued"),
        );
    }
    let mut last = (0, 0);
    for ack in acks {
        let delivery = ack.await.expect("reported").expect("produced");
        last = (delivery.partition, delivery.offset);
    }

    // Kill it once it has booked some but not all of them.
    let first = projector(&shop.env);
    let booking = eventually(Duration::from_secs(90), || async {
        booked(&pool, &bucket).await > 0
    })
    .await;
    assert!(booking, "the projector booked nothing");
    first.kill9();
    let at_kill = booked(&pool, &bucket).await;
    eprintln!("killed with {at_kill} of {EVENTS} events booked");
    assert!(
        at_kill < EVENTS,
        "the kill must land mid-stream to prove anything"
    );

    let second = projector(&shop.env);
    // Once the group committed past the last event, every redelivered record was handled.
    common::wait_for_commit(&shop.env.group("projector"), &entry.topic, last.0, last.1).await;
    drop(second);

    let total = booked(&pool, &bucket).await;
    assert_eq!(
        total, EVENTS,
        "every event booked exactly once (killed at {at_kill})"
    );
    let (available, reserved, version): (i64, i64, u64) = sqlx::query_as(
        "SELECT available_stock, reserved_stock, redis_version FROM dish_stock_snapshot WHERE stock_bucket_id = ?",
    )
    .bind(&bucket)
    .fetch_one(&pool)
    .await
    .expect("snapshot");
    assert_eq!((available, reserved, version), (0, EVENTS, EVENTS as u64));
    // One ledger row per operation: the events the restart redelivered found theirs.
    let (operations,): (i64,) = sqlx::query_as(
        "SELECT COUNT(DISTINCT operation_id) FROM inventory_ledger WHERE operation_id LIKE ?",
    )
    .bind(format!("{bucket}-op-%"))
    .fetch_one(&pool)
    .await
    .expect("ledger");
    assert_eq!(operations, EVENTS);
    let (inbox,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM inventory_consumer_inbox")
        .fetch_one(&pool)
        .await
        .expect("inbox");
    assert_eq!(inbox, 0, "the projector writes no inbox row");
}
