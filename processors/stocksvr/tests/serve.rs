//! `stocksvr all` as a process: health endpoints, the admin token, the order-lifecycle
//! processor dead-lettering garbage with its origin, and a clean SIGTERM.

mod common;

use rdkafka::message::{Headers, Message};
use rdkafka::producer::FutureRecord;
use std::time::Duration;
use stocksvr_pipeline::deadletter::headers;
use stocksvr_pipeline::kafka;
use stocksvr_test_support::eventually_some;

#[tokio::test]
async fn all_serves_health_and_dead_letters_garbage() {
    let token = "it-admin-token";
    // A migrated database and topics of its own.
    let shop = common::api::shop(1).await;
    let group_prefix = shop.env.ns.name.clone();
    let topic = shop
        .env
        .topic(stocksvr_core::events::topics::ORDER_LIFECYCLE);
    let server = shop.server(&[("STOCKSVR__HTTP__ADMIN_TOKEN", token)]);
    let ready = server.wait_for_readyz(200, Duration::from_secs(60)).await;
    for dep in [
        "kafka",
        "schema_registry",
        "mysql",
        "redis",
        "reservation_service",
    ] {
        assert_eq!(ready["dependencies"][dep]["ok"], true, "{ready}");
    }

    let healthz = reqwest::get(format!("{}/healthz", server.base))
        .await
        .expect("healthz");
    assert_eq!(healthz.status().as_u16(), 200);
    let metrics = common::api::metrics_text(&server).await;
    assert!(metrics.contains("stocksvr_build_info"), "{metrics}");
    assert!(metrics.contains("stocksvr_dependency_ready"), "{metrics}");

    // Admin endpoints require the token; the config they show hides every secret.
    let client = reqwest::Client::new();
    let denied = client
        .get(format!("{}/admin/config", server.base))
        .send()
        .await
        .expect("admin");
    assert_eq!(denied.status().as_u16(), 401);
    let denied_body: serde_json::Value = denied.json().await.expect("json error");
    assert_eq!(denied_body["field"], "authorization");
    let wrong = client
        .get(format!("{}/admin/config", server.base))
        .bearer_auth("nope")
        .send()
        .await
        .expect("admin");
    assert_eq!(wrong.status().as_u16(), 401);
    let shown = client
        .get(format!("{}/admin/config", server.base))
        .bearer_auth(token)
        .send()
        .await
        .expect("admin");
    assert_eq!(shown.status().as_u16(), 200);
    let shown = shown.text().await.expect("body");
    assert!(
        !shown.contains(token) && !shown.contains("stocksvr:stocksvr@"),
        "{shown}"
    );

    // A garbage record lands in the dead-letter topic with its origin.
    let producer = kafka::producer(&shop.env.kafka(), "it-all").expect("producer");
    let garbage_key = common::unique("garbage");
    let garbage = producer
        .send(
            FutureRecord::to(&topic)
                .key(&garbage_key)
                .payload("not avro at all"),
            Duration::from_secs(10),
        )
        .await
        .map_err(|(e, _)| e)
        .expect("garbage produced");
    let dead = common::find_record(&format!("{topic}.dlt"), Duration::from_secs(60), |m| {
        m.key() == Some(garbage_key.as_bytes())
    })
    .expect("garbage dead-lettered");
    assert_eq!(
        dead.payload(),
        Some(&b"not avro at all"[..]),
        "original bytes kept"
    );
    assert_eq!(
        dead.partition(),
        garbage.partition,
        "same partition as the source"
    );
    let header = |name: &str| -> String {
        let h = dead.headers().expect("dead letter has headers");
        h.iter()
            .find(|x| x.key == name)
            .and_then(|x| x.value)
            .map(|v| String::from_utf8_lossy(v).into_owned())
            .unwrap_or_else(|| panic!("header {name} missing"))
    };
    assert_eq!(header(headers::ORIGINAL_TOPIC), topic);
    assert_eq!(
        header(headers::ORIGINAL_PARTITION),
        garbage.partition.to_string()
    );
    assert_eq!(header(headers::ORIGINAL_OFFSET), garbage.offset.to_string());
    assert_eq!(
        header(headers::CONSUMER_GROUP),
        format!("{group_prefix}.order-lifecycle")
    );
    // Not Avro at all: undecodable (a record that decodes but breaks its contract would be
    // "invalid"; neither is ever an outage).
    assert_eq!(header(headers::ERROR_CLASS), "undecodable");
    assert!(
        header(headers::ERROR_MESSAGE).contains("magic byte"),
        "{}",
        header(headers::ERROR_MESSAGE)
    );
    assert!(
        header(headers::ORIGINAL_TIMESTAMP)
            .parse::<i64>()
            .expect("millis")
            > 0
    );

    // The dead-letter processor parks it in MySQL; operators see it through the admin API.
    let pool = stocksvr_store::mysql_pool(&shop.db_url, 1, Duration::from_secs(5)).expect("pool");
    let id: u64 = eventually_some(Duration::from_secs(60), || async {
        let row: Option<(u64,)> = sqlx::query_as(
            "SELECT id FROM inventory_dead_letter WHERE original_topic = ? AND original_partition = ? AND original_offset = ?",
        )
        .bind(&topic)
        .bind(garbage.partition)
        .bind(garbage.offset)
        .fetch_optional(&pool)
        .await
        .expect("query");
        row.map(|(id,)| id)
    })
    .await
    .expect("the dead letter was never parked");
    let parked: serde_json::Value = client
        .get(format!("{}/admin/dlq/{id}", server.base))
        .bearer_auth(token)
        .send()
        .await
        .expect("show")
        .json()
        .await
        .expect("json");
    assert_eq!(parked["error_class"], "undecodable", "{parked}");
    let denied = client
        .get(format!("{}/admin/dlq/{id}", server.base))
        .send()
        .await
        .expect("show");
    assert_eq!(
        denied.status().as_u16(),
        401,
        "the dlq endpoints need the token"
    );
    let discard = client
        .post(format!("{}/admin/dlq/{id}/discard", server.base))
        .bearer_auth(token)
        .json(&serde_json::json!({"reason": "test garbage"}))
        .send()
        .await
        .expect("discard");
    assert_eq!(discard.status().as_u16(), 200);
    let replay = client
        .post(format!("{}/admin/dlq/{id}/replay", server.base))
        .bearer_auth(token)
        .send()
        .await
        .expect("replay");
    assert_eq!(
        replay.status().as_u16(),
        409,
        "a discarded dead letter is not replayed"
    );

    let (status, log) = server.terminate();
    assert!(status.success(), "exit {status:?}; log:\n{log}");
    assert!(log.contains("committed and stopped"), "{log}");
}

#[tokio::test]
async fn an_unmigrated_database_is_refused_at_start_with_the_fix() {
    let db = common::TestDb::empty().await;
    let mut cmd = common::stocksvr();
    cmd.arg("all")
        .env("STOCKSVR__MYSQL__URL", &db.url)
        .env("STOCKSVR__HTTP__LISTEN", "127.0.0.1:0");
    let (ok, _, err) = common::run(&mut cmd);
    assert!(!ok, "must exit non-zero");
    assert!(err.contains("run `stocksvr migrate` first"), "{err}");
}

#[tokio::test]
async fn readyz_names_an_unreachable_dependency() {
    let shop = common::api::shop(1).await;
    let server = shop.server(&[("STOCKSVR__REDIS__URL", "redis://127.0.0.1:1/")]);
    let body = server.wait_for_readyz(503, Duration::from_secs(60)).await;
    assert_eq!(body["ready"], false);
    assert_eq!(body["dependencies"]["redis"]["ok"], false, "{body}");
    assert!(
        body["dependencies"]["redis"]["error"].as_str().is_some(),
        "{body}"
    );
    // Without Redis the Try API cannot be built either, and readiness says so on its own.
    assert_eq!(
        body["dependencies"]["reservation_service"]["ok"], false,
        "{body}"
    );
    assert_eq!(body["dependencies"]["mysql"]["ok"], true, "{body}");
    let (status, log) = server.terminate();
    assert!(status.success(), "{log}");
}

/// SIGTERM behind a load balancer: `/readyz` answers 503 `draining` first, the listener
/// keeps serving Trys (and the processors keep consuming) for `http.drain_grace_ms`, then the
/// process stops accepting, commits what its processors handled and exits 0.
#[tokio::test]
async fn sigterm_fails_readyz_first_serves_through_the_grace_then_commits_and_exits() {
    use common::flow::{reservation_id, try_item_retried};
    use std::time::Instant;
    let shop = common::api::shop(10).await;
    let grace = Duration::from_secs(5);
    let grace_ms = grace.as_millis().to_string();
    let server = shop.server(&[("STOCKSVR__HTTP__DRAIN_GRACE_MS", grace_ms.as_str())]);
    server.wait_for_readyz(200, Duration::from_secs(60)).await;
    common::api::wait_for_api(&server).await;
    let (status, reply) = try_item_retried(&server, &shop, 7001, 70011, 1).await;
    assert_eq!(status, 201, "{reply}");

    server.signal("-TERM");
    let signalled = Instant::now();
    let draining = server.wait_for_readyz(503, Duration::from_secs(2)).await;
    assert_eq!(draining["status"], "draining", "{draining}");

    // Out of rotation, still serving: a Try in the grace reserves as any other, and its
    // answer asks the caller to reconnect (through its balancer) for the next one.
    let body = serde_json::json!({"order_id": 7002, "order_item_id": 70021, "merchant_id": shop.merchant_id,
        "dish_id": shop.dish_id, "quantity": 1, "order_type": "INSTANT"});
    let resp = reqwest::Client::new()
        .post(format!("{}/v1/reservations", server.base))
        .json(&body)
        .send()
        .await
        .expect("a Try during the grace is answered");
    let served_at = signalled.elapsed();
    assert_eq!(
        resp.headers()
            .get("connection")
            .and_then(|v| v.to_str().ok()),
        Some("close")
    );
    assert_eq!(resp.status().as_u16(), 201);
    let reply: serde_json::Value = resp.json().await.expect("json");
    let reservation = reservation_id(&reply);
    assert!(
        served_at < grace,
        "the Try was answered {served_at:?} after SIGTERM"
    );

    // The processors still consume: an order event sent in the grace is applied and its
    // offset committed before the process exits 0, after the grace and not before.
    let topic = shop
        .env
        .topic(stocksvr_core::events::topics::ORDER_LIFECYCLE);
    let (partition, offset) = shop
        .env
        .order_event(
            "OrderCreated",
            7002,
            serde_json::json!({"order_id": 7002, "merchant_id": shop.merchant_id, "order_type": "INSTANT",
                "processing_time": null, "inventory_reservation_ids": [reservation]}),
        )
        .await;
    let (status, log) = server.wait_exit(Duration::from_secs(25));
    let stopped_after = signalled.elapsed();
    assert!(status.success(), "exit {status:?}; log:\n{log}");
    assert!(
        stopped_after >= grace,
        "stopped {stopped_after:?} after SIGTERM, within the grace"
    );
    for said in [
        "draining: /readyz answers 503",
        "grace period over",
        "committed and stopped",
    ] {
        assert!(log.contains(said), "{said:?} not logged:\n{log}");
    }
    common::wait_for_commit(
        &shop.env.group(stocksvr_order_lifecycle::NAME),
        &topic,
        partition,
        offset,
    )
    .await;
}
