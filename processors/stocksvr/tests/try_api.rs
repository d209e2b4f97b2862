//! The Try API over HTTP against `stocksvr all` with real MariaDB and Redis: created vs
//! repeated Trys, order-level Trys, reads, and every kind of bad input answered with a 4xx
//! naming the field, or a 503 when a store is unreachable (fail closed).

mod common;

use common::api::{get, metrics_text, post, shop, wait_for_api};
use serde_json::{json, Value};
use std::time::Duration;
use stocksvr_core::bucket::BucketKey;
use stocksvr_test_support::{eventually_some, zone};

#[tokio::test]
async fn try_api_reserves_repeats_and_reads() {
    let shop = shop(10).await;
    let server = shop.server(&[]);
    wait_for_api(&server).await;
    let body = json!({"order_id": 501, "order_item_id": 9001, "merchant_id": shop.merchant_id,
                      "dish_id": shop.dish_id, "quantity": 3, "order_type": "INSTANT"})
    .to_string();
    let (status, first) = post(&server, "/v1/reservations", &body).await;
    assert_eq!(status, 201, "{first}");
    assert_eq!(first["reservation"]["status"], "RESERVED");
    assert_eq!(first["created"], true);
    let id = first["reservation"]["reservation_id"]
        .as_str()
        .expect("id as string")
        .to_string();
    let (status, again) = post(&server, "/v1/reservations", &body).await;
    assert_eq!(status, 200, "a repeat answers 200: {again}");
    assert_eq!(again["reservation"]["reservation_id"], id.as_str());
    assert_eq!(again["created"], false);

    let (status, one) = get(&server, &format!("/v1/reservations/{id}")).await;
    assert_eq!(status, 200);
    assert_eq!(one["status"], "RESERVED");
    assert_eq!(
        one["stock_bucket_id"],
        BucketKey::new(shop.merchant_id, shop.dish_id, zone::today()).stock_bucket_id()
    );

    // Whole order: one item fits, one does not; the fitting one is not cancelled by us.
    let order = json!({"merchant_id": shop.merchant_id, "order_type": "INSTANT", "items": [
        {"order_item_id": 9002, "dish_id": shop.dish_id, "quantity": 2},
        {"order_item_id": 9003, "dish_id": shop.dish_id, "quantity": 50}]})
    .to_string();
    let (status, reply) = post(&server, "/v1/orders/501/reservations", &order).await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["all_reserved"], false);
    let statuses: Vec<&str> = reply["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|i| i["status"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(statuses, ["RESERVED", "REJECTED"]);
    let (_, listed) = get(&server, "/v1/orders/501/reservations").await;
    assert_eq!(listed["reservations"].as_array().expect("list").len(), 3);

    let (status, stock) = get(
        &server,
        &format!("/v1/stock/{}/{}", shop.merchant_id, shop.dish_id),
    )
    .await;
    assert_eq!(status, 200, "{stock}");
    assert_eq!(stock["redis"]["available"], 5);
    assert_eq!(stock["redis"]["reserved"], 5);
    assert_eq!(stock["redis_state"], "OPEN");

    let (status, doc) = get(&server, "/openapi.json").await;
    assert_eq!(status, 200);
    for path in [
        "/v1/reservations",
        "/v1/orders/{order_id}/reservations",
        "/v1/stock/{merchant_id}/{dish_id}",
    ] {
        assert!(doc["paths"].get(path).is_some(), "openapi lacks {path}");
    }
    let metrics = metrics_text(&server).await;
    assert!(
        metrics.contains("stocksvr_reservation_operations_total"),
        "{metrics}"
    );
    let (status, log) = server.terminate();
    assert!(status.success(), "{log}");
}

#[tokio::test]
async fn bad_input_gets_a_4xx_naming_the_field() {
    let shop = shop(5).await;
    let server = shop.server(&[]);
    wait_for_api(&server).await;
    let valid = json!({"order_id": 1, "order_item_id": 1, "merchant_id": shop.merchant_id,
                       "dish_id": shop.dish_id, "quantity": 1, "order_type": "INSTANT"});
    let with = |k: &str, v: Value| {
        let mut b = valid.clone();
        b[k] = v;
        b.to_string()
    };
    let without = |k: &str| {
        let mut b = valid.clone();
        b.as_object_mut().expect("object").remove(k);
        b.to_string()
    };
    let cases: Vec<(String, u16, &str)> = vec![
        (with("quantity", json!(0)), 400, "quantity"),
        (with("quantity", json!(-2)), 400, "quantity"),
        (with("quantity", json!(100_000)), 400, "quantity"),
        (with("order_type", json!("LATER")), 400, "order_type"),
        (
            with("order_type", json!("SCHEDULED")),
            400,
            "processing_time",
        ),
        (
            with("processing_time", json!("yesterday")),
            400,
            "processing_time",
        ),
        (without("dish_id"), 400, "dish_id"),
        (with("surprise", json!(1)), 400, "body"),
        ("{not json".to_string(), 400, "body"),
    ];
    for (body, want_status, want_field) in cases {
        let (status, reply) = post(&server, "/v1/reservations", &body).await;
        assert_eq!(status, want_status, "{body} -> {reply}");
        assert_eq!(reply["error"], "invalid_request", "{body} -> {reply}");
        let field = reply["field"].as_str().unwrap_or_default();
        assert!(
            field == want_field || (want_field == "body" && !field.is_empty()),
            "{body}: field {field:?}, wanted {want_field}"
        );
        assert!(reply["message"].as_str().is_some_and(|m| !m.is_empty()));
    }
    // No bucket for this dish today: 404.
    let (status, reply) = post(
        &server,
        "/v1/reservations",
        &with("dish_id", json!(999_999)),
    )
    .await;
    assert_eq!(
        (status, reply["error"].as_str()),
        (404, Some("bucket_not_found")),
        "{reply}"
    );
    // A closed bucket refuses new Trys: 409.
    let pool = stocksvr_store::mysql_pool(&shop.db_url, 1, Duration::from_secs(5)).expect("pool");
    sqlx::query("UPDATE dish_stock_baseline SET bucket_status = 20 WHERE merchant_id = ?")
        .bind(shop.merchant_id)
        .execute(&pool)
        .await
        .expect("close bucket");
    let (status, reply) = post(
        &server,
        "/v1/reservations",
        &with("order_item_id", json!(2)),
    )
    .await;
    assert_eq!(
        (status, reply["error"].as_str()),
        (409, Some("bucket_unavailable")),
        "{reply}"
    );
    let (status, reply) = get(&server, "/v1/reservations/abc").await;
    assert_eq!((status, reply["field"].as_str()), (400, Some("id")));
    let (status, reply) = post(
        &server,
        "/v1/orders/7/reservations",
        r#"{"merchant_id":1,"order_type":"INSTANT","items":[]}"#,
    )
    .await;
    assert_eq!((status, reply["field"].as_str()), (400, Some("items")));
    let (status, log) = server.terminate();
    assert!(status.success(), "{log}");
}

#[tokio::test]
async fn an_unreachable_store_fails_closed_with_503() {
    // Redis down: the service never comes up, every Try is refused.
    let shop = shop(1).await;
    let server = shop.server(&[("STOCKSVR__REDIS__URL", "redis://127.0.0.1:1/")]);
    let body = json!({"order_id": 1, "order_item_id": 1, "merchant_id": 1, "dish_id": 1, "quantity": 1, "order_type": "INSTANT"}).to_string();
    let reply = eventually_some(Duration::from_secs(30), || async {
        // Connection refused until the listener is bound.
        let resp = reqwest::Client::new()
            .post(format!("{}/v1/reservations", server.base))
            .body(body.clone())
            .send()
            .await
            .ok()?;
        let retry_after = resp.headers().get("retry-after").is_some();
        Some((
            resp.status().as_u16(),
            retry_after,
            resp.json::<Value>().await.unwrap_or(Value::Null),
        ))
    })
    .await
    .unwrap_or_else(|| panic!("server never answered; log:\n{}", server.log()));
    assert_eq!((reply.0, reply.1), (503, true), "{:?}", reply.2);
    assert!(
        reply.2["message"]
            .as_str()
            .is_some_and(|m| m.contains("Redis")),
        "{:?}",
        reply.2
    );
    let (status, log) = server.terminate();
    assert!(status.success(), "{log}");

    // MySQL down (worker id configured, so the service starts without it): 503 as well.
    let server = shop.server(&[
        (
            "STOCKSVR__MYSQL__URL",
            "mysql://stocksvr:stocksvr@127.0.0.1:1/stocksvr",
        ),
        ("STOCKSVR__MYSQL__ACQUIRE_TIMEOUT_MS", "1000"),
        ("STOCKSVR__RESERVATION__WORKER_ID", "1023"),
    ]);
    server.wait_for_log("the reservation service", Duration::from_secs(60), |log| {
        log.contains("reservation service ready")
    });
    let (status, reply) = post(&server, "/v1/reservations", &body).await;
    assert_eq!(
        (status, reply["error"].as_str()),
        (503, Some("mysql_unavailable")),
        "{reply}"
    );
    let (status, log) = server.terminate();
    assert!(status.success(), "{log}");
}
