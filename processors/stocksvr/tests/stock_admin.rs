//! Operator endpoints and commands for stock buckets against `stocksvr all` with the real
//! stack: init, adjust below what was accepted (deficit through WAL → Lua → outbox → Kafka →
//! projector, with ledger rows), close, archive refused while a reservation is open, WAL
//! listing, the admin token, and bad input answered with 400 naming the field.

mod common;

use common::server::Server;

use common::api::{post, shop, wait_for_api};
use serde_json::{json, Value};
use std::time::Duration;
use stocksvr_core::bucket::BucketKey;
use stocksvr_test_support::{eventually_ok, zone};

const TOKEN: &str = "ops-secret";

async fn admin(server: &Server, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    let client = reqwest::Client::new();
    let url = format!("{}{path}", server.base);
    let mut req = match method {
        "POST" => client.post(url),
        _ => client.get(url),
    }
    .bearer_auth(TOKEN);
    if let Some(b) = body {
        req = req
            .header("content-type", "application/json")
            .body(b.to_string());
    }
    let resp = req.send().await.expect("request");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn operators_init_adjust_close_and_inspect_a_bucket() {
    let shop = shop(5).await;
    let server = shop.server(&[("STOCKSVR__HTTP__ADMIN_TOKEN", TOKEN)]);
    wait_for_api(&server).await;
    let dish = 41;
    let bucket = BucketKey::new(shop.merchant_id, dish, zone::today()).stock_bucket_id();
    let init = json!({"merchant_id": shop.merchant_id, "dish_id": dish, "total": 10});

    // Without the token nothing happens.
    let (status, _) = post(&server, "/admin/buckets", &init.to_string()).await;
    assert_eq!(status, 401);
    let (status, op) = admin(&server, "POST", "/admin/buckets", Some(init.clone())).await;
    assert_eq!(status, 200, "{op}");
    assert_eq!(op["status"], "SUCCEEDED");
    assert_eq!(op["action"], "INIT_BUCKET");
    // Repeating the init is the same operation, not a second one.
    let (status, again) = admin(&server, "POST", "/admin/buckets", Some(init)).await;
    assert_eq!(status, 200);
    assert_eq!(again["operation_id"], op["operation_id"]);

    let try_body = json!({"order_id": 801, "order_item_id": 8801, "merchant_id": shop.merchant_id,
                          "dish_id": dish, "quantity": 4, "order_type": "INSTANT"});
    let (status, reply) = post(&server, "/v1/reservations", &try_body.to_string()).await;
    assert_eq!(status, 201, "{reply}");
    assert_eq!(reply["reservation"]["status"], "RESERVED");

    // Below what was accepted: available 0, deficit 2, the reservation stands.
    let (status, adj) = admin(
        &server,
        "POST",
        &format!("/admin/buckets/{bucket}/adjust"),
        Some(json!({"total": 2})),
    )
    .await;
    assert_eq!(status, 200, "{adj}");
    assert_eq!(adj["result"]["after"]["deficit"], 2);
    assert_eq!(adj["result"]["after"]["available"], 0);

    // The projector books it: snapshot with the deficit next to Redis, and ledger rows.
    let shown = eventually_ok(Duration::from_secs(60), || async {
        let (status, shown) =
            admin(&server, "GET", &format!("/admin/buckets/{bucket}"), None).await;
        assert_eq!(status, 200, "{shown}");
        if shown["snapshot"]["deficit"] == 2 {
            Ok(shown)
        } else {
            Err(shown)
        }
    })
    .await
    .unwrap_or_else(|shown| {
        panic!(
            "snapshot never showed the deficit: {shown}\n{}",
            server.log()
        )
    });
    assert_eq!(shown["redis"]["total"], 2);
    assert_eq!(shown["redis"]["reserved"], 4);
    assert_eq!(shown["redis"]["deficit"], 2);
    assert_eq!(shown["snapshot"]["available"], 0);
    assert_eq!(shown["snapshot"]["reserved"], 4);
    assert_eq!(shown["baseline"]["total_stock"], 2);
    assert_eq!(shown["open_reservations"], 1);
    let pool = stocksvr_store::mysql_pool(&shop.db_url, 2, Duration::from_secs(5)).expect("pool");
    let ledger: Vec<(i8, i64, i64)> = sqlx::query_as(
        "SELECT action, available_delta, total_delta FROM inventory_ledger WHERE stock_bucket_id = ? \
         AND action IN (1, 5) ORDER BY id",
    )
    .bind(&bucket)
    .fetch_all(&pool)
    .await
    .expect("ledger");
    assert_eq!(ledger, vec![(1, 10, 10), (5, -6, -8)], "init then adjust");

    // CLOSED: no new Try; archive refused while the reservation is open.
    let (status, closed) = admin(
        &server,
        "POST",
        &format!("/admin/buckets/{bucket}/close"),
        None,
    )
    .await;
    assert_eq!(status, 200, "{closed}");
    let late = json!({"order_id": 802, "order_item_id": 8802, "merchant_id": shop.merchant_id,
                      "dish_id": dish, "quantity": 1, "order_type": "INSTANT"});
    let (status, refused) = post(&server, "/v1/reservations", &late.to_string()).await;
    assert_eq!(status, 409, "{refused}");
    let (status, refused) = admin(
        &server,
        "POST",
        &format!("/admin/buckets/{bucket}/archive"),
        None,
    )
    .await;
    assert_eq!(status, 409, "{refused}");
    assert_eq!(refused["error"], "bucket_state");
    assert!(refused["message"]
        .as_str()
        .unwrap_or("")
        .contains("unfinished"));

    let (status, ops) = admin(
        &server,
        "GET",
        &format!("/admin/operations?status=SUCCEEDED&bucket={bucket}"),
        None,
    )
    .await;
    assert_eq!(status, 200);
    let actions: Vec<&str> = ops
        .as_array()
        .expect("list")
        .iter()
        .map(|o| o["action"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(actions, ["INIT_BUCKET", "ADJUST", "CLOSE"]);
    let (status, stuck) = admin(&server, "GET", "/admin/reservations/stuck", None).await;
    assert_eq!((status, stuck), (200, json!([])));

    // Bad input: 400 naming the field, nothing written.
    for (path, body, field) in [
        (
            format!("/admin/buckets/{bucket}/adjust"),
            json!({"total": -1}),
            "total",
        ),
        (
            format!("/admin/buckets/{bucket}/adjust"),
            json!({"totl": 1}),
            "totl",
        ),
        (
            "/admin/buckets".to_string(),
            json!({"merchant_id": 0, "dish_id": 1, "total": 1}),
            "merchant_id",
        ),
        (
            "/admin/buckets".to_string(),
            json!({"merchant_id": 1, "dish_id": 1, "total": 1, "timezone": "Mars/Base"}),
            "timezone",
        ),
    ] {
        let (status, err) = admin(&server, "POST", &path, Some(body)).await;
        assert_eq!(status, 400, "{path}: {err}");
        assert!(
            err["field"].as_str().unwrap_or("").contains(field),
            "{path}: {err}"
        );
    }
    // Nothing was written by the refused requests.
    let (status, shown) = admin(&server, "GET", &format!("/admin/buckets/{bucket}"), None).await;
    assert_eq!(status, 200);
    assert_eq!(shown["baseline"]["total_stock"], 2);
    assert_eq!(shown["baseline"]["baseline_version"], 2);
    assert_eq!(shown["operations"].as_array().map(Vec::len), Some(3));
    for query in ["limit=abc", "limit=-1", "surprise=1"] {
        let (status, err) =
            admin(&server, "GET", &format!("/admin/operations?{query}"), None).await;
        assert_eq!(
            (status, err["field"].as_str()),
            (400, Some("query")),
            "{query}: {err}"
        );
    }
    let (status, err) = admin(
        &server,
        "GET",
        "/admin/reservations/stuck?dead_only=yes",
        None,
    )
    .await;
    assert_eq!(
        (status, err["error"].as_str()),
        (400, Some("invalid_request")),
        "{err}"
    );
    let (status, err) = admin(&server, "GET", "/admin/buckets/not-a-bucket", None).await;
    assert_eq!(
        (status, err["field"].as_str()),
        (400, Some("stock_bucket_id"))
    );
    let (status, err) = admin(&server, "GET", "/admin/operations?status=FOO", None).await;
    assert_eq!((status, err["field"].as_str()), (400, Some("status")));
    let (status, err) = admin(&server, "GET", "/admin/operations/op_nope", None).await;
    assert_eq!(
        (status, err["error"].as_str()),
        (404, Some("operation_not_found"))
    );

    // The CLI shows the same bucket.
    let out = common::output_within(
        common::stocksvr()
            .args(["bucket", "show", &bucket])
            .env("STOCKSVR__MYSQL__URL", &shop.db_url),
        Duration::from_secs(60),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let shown: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(shown["redis"]["state"], "CLOSED");
    assert_eq!(shown["baseline"]["bucket_status"], "CLOSED");
    let (ok, stdout, stderr) = common::run(
        common::stocksvr()
            .args(["ops", "list", "--status", "SUCCEEDED", "--bucket", &bucket])
            .env("STOCKSVR__MYSQL__URL", &shop.db_url),
    );
    assert!(ok, "{stderr}");
    let listed: Value = serde_json::from_str(&stdout).expect("json");
    assert_eq!(listed.as_array().map(Vec::len), Some(3));
    server.terminate();
}
