//! The failure semantics of the pipeline (issue 9), against the real servers and `stocksvr
//! all` as a process:
//!
//! - a dependency stopped (SIGSTOP, so it answers nothing at all) for a long outage while
//!   order events stream through: nothing is dead-lettered, the processor keeps its group
//!   membership, and after the resume every event applies once, in per-order order;
//! - an event that cannot apply yet (a RefundRequested before its OrderCreated) waits and
//!   applies after its predecessor;
//! - a replay of every topic from the earliest offset changes nothing: every table and every
//!   Redis key of the test is the same before and after, every column of every row (not
//!   even a processing timestamp is rewritten);
//! - ids beyond the Avro long are refused on every endpoint with a 400 naming the field.

mod common;

use common::api::{get, post, shop, shop_in, wait_for_api};
use common::flow::{count, created, refund_one, tail, try_one, wait_count};
use common::TestEnv;
use serde_json::json;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use stocksvr_core::events::topics::ORDER_LIFECYCLE;
use stocksvr_test_support::{eventually_ok, PrivateStack};

/// The consumer bounds of the test's server, low so that a stall past all of them is short.
/// One attempt at a batch gives up after `ATTEMPT_TIMEOUT_MS` (against a stopped MariaDB it
/// ends at the 5 s statement deadline, against a stopped Redis at its 2 s response timeout);
/// between attempts the loop backs off from `RETRY_MIN_BACKOFF_MS`, doubling up to
/// `RETRY_MAX_BACKOFF_MS`, and polls Kafka; a consumer that did not poll for
/// `MAX_POLL_INTERVAL_MS` is dropped from its group. librdkafka refuses a
/// `max.poll.interval.ms` below `session.timeout.ms`, so the session timeout goes down to the
/// broker's minimum, 6 s, with a heartbeat every second.
const ATTEMPT_TIMEOUT_MS: u64 = 5_000;
const RETRY_MIN_BACKOFF_MS: u64 = 500;
const RETRY_MAX_BACKOFF_MS: u64 = 2_000;
const MAX_POLL_INTERVAL_MS: u64 = 15_000;
const SESSION_TIMEOUT_MS: u64 = 6_000;

/// How long a dependency stays stopped: past every bound above and past the retry limit the
/// loop once had. The longest of them:
/// - group membership: a loop that stopped polling at the outage's first attempt would be
///   dropped `MAX_POLL_INTERVAL_MS` after its last poll, at most one attempt and one backoff
///   after the outage began: 15 + 5 + 2 = 22 s;
/// - the old loop dead-lettered a record after 5 attempts: 5 attempts of up to 5 s and the
///   4 backoffs between them (0.5 + 1 + 2 + 2 s) take 30.5 s;
/// - the session timeout, 6 s, and the backoff cap, 2 s, are far below both.
///
/// The loop meets the outage with the first event produced after the stop, within about a
/// second; 3.5 s more for that: 34 s. `STOCKSVR_TEST_STALL_SECS` sets another length.
fn stall() -> Duration {
    let membership = MAX_POLL_INTERVAL_MS + ATTEMPT_TIMEOUT_MS + RETRY_MAX_BACKOFF_MS;
    let backoffs: u64 = (0..4)
        .map(|n| (RETRY_MIN_BACKOFF_MS << n).min(RETRY_MAX_BACKOFF_MS))
        .sum();
    let old_retry_limit = 5 * ATTEMPT_TIMEOUT_MS + backoffs;
    let bound = membership.max(old_retry_limit) + 3_500;
    std::env::var("STOCKSVR_TEST_STALL_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(Duration::from_millis(bound), Duration::from_secs)
}

/// Orders with one Try of 2 units each, then OrderCreated and a refund of 1 unit per order
/// while `stopped` (a server of the test's own) is stopped; checks that the outage was waited
/// out, never dead-lettered, and that every event applied once and in order.
async fn outage_while_events_stream(stopped: &str) {
    let private = PrivateStack::start(&[stopped]);
    let mut env = TestEnv::new().await;
    let var = match stopped {
        "mariadb" => "STOCKSVR__MYSQL__URL",
        _ => "STOCKSVR__REDIS__URL",
    };
    env.overrides.push((var, private.var(var)));
    let shop = shop_in(env, 1_000).await;
    let setting = |ms: u64| ms.to_string();
    let (attempt, min_backoff, max_backoff, poll, session) = (
        setting(ATTEMPT_TIMEOUT_MS),
        setting(RETRY_MIN_BACKOFF_MS),
        setting(RETRY_MAX_BACKOFF_MS),
        setting(MAX_POLL_INTERVAL_MS),
        setting(SESSION_TIMEOUT_MS),
    );
    let server = shop.server(&[
        ("STOCKSVR__CONSUMER__ATTEMPT_TIMEOUT_MS", attempt.as_str()),
        (
            "STOCKSVR__CONSUMER__RETRY_MIN_BACKOFF_MS",
            min_backoff.as_str(),
        ),
        // Quick retries also make the resume seen soon after the server is back.
        (
            "STOCKSVR__CONSUMER__RETRY_MAX_BACKOFF_MS",
            max_backoff.as_str(),
        ),
        ("STOCKSVR__CONSUMER__MAX_POLL_INTERVAL_MS", poll.as_str()),
        (
            "STOCKSVR__KAFKA__PROPERTIES__SESSION_TIMEOUT_MS",
            session.as_str(),
        ),
        ("STOCKSVR__KAFKA__PROPERTIES__HEARTBEAT_INTERVAL_MS", "1000"),
        ("STOCKSVR__RESERVATION__WORKER_ID", "7"),
    ]);
    wait_for_api(&server).await;
    let pool = shop.env.pool();
    const ORDERS: u64 = 250;
    let base = 50_000_000 + shop.merchant_id % 1_000_000 * 1_000;
    let mut reservations = Vec::new();
    for i in 0..ORDERS {
        reservations.push((base + i, try_one(&server, &shop, base + i, 2).await));
    }
    server.wait_for_log("order-lifecycle assigned", Duration::from_secs(60), |log| {
        log.contains("partitions assigned") && log.contains("order-lifecycle")
    });

    private.signal(stopped, "-STOP");
    let stopped_at = Instant::now();
    for (order, reservation) in &reservations {
        created(&shop, *order, *reservation).await;
        refund_one(&shop, *order, *reservation).await;
    }
    server.wait_for_log("the pause", stall(), |log| {
        log.contains("paused: a dependency is unavailable")
    });
    // A fixed wait: the outage itself, long enough to outlast the bounds of `stall`.
    tokio::time::sleep(stall().saturating_sub(stopped_at.elapsed())).await;
    private.signal(stopped, "-CONT");

    let confirmed_and_refunded = format!(
        "SELECT COUNT(*) FROM inventory_reservation WHERE status = 40 AND refunded_quantity = 1 AND order_id >= {base}"
    );
    wait_count(
        &server,
        &pool,
        &confirmed_and_refunded,
        ORDERS as i64,
        Duration::from_secs(240),
    )
    .await;
    server.wait_for_log("the resume", Duration::from_secs(30), |log| {
        log.contains("resumed: the dependency is back")
    });
    // Each event applied once: one refund per reservation, each step's events once.
    assert_eq!(
        count(&pool, "SELECT COUNT(*) FROM inventory_refund").await,
        ORDERS as i64
    );
    // One row per step, carrying its lifecycle event too.
    for event in ["InventoryRedisConfirmed", "InventoryRedisRefunded"] {
        assert_eq!(
            count(
                &pool,
                &format!(
                    "SELECT COUNT(*) FROM inventory_outbox WHERE event_type = '{event}' \
                     AND (body IS NOT NULL OR JSON_EXISTS(payload, '$.lifecycle'))"
                )
            )
            .await,
            ORDERS as i64,
            "{event} once per reservation"
        );
    }
    // In per-order order: every refund came out of sold, i.e. after its confirm.
    wait_count(
        &server,
        &pool,
        "SELECT COUNT(*) FROM inventory_ledger WHERE action = 6 AND sold_delta = -1",
        ORDERS as i64,
        Duration::from_secs(120),
    )
    .await;
    // Nothing was dead-lettered, on the topic or in the parking table.
    let dlt = format!("{}.dlt", shop.env.topic(ORDER_LIFECYCLE));
    let dead =
        stocksvr_test_support::records_of(&dlt, Duration::from_secs(2), Duration::from_secs(10));
    assert!(
        dead.is_empty(),
        "{} dead letters during an outage",
        dead.len()
    );
    assert_eq!(
        count(&pool, "SELECT COUNT(*) FROM inventory_dead_letter").await,
        0
    );
    // The processor kept its group membership: no second assignment.
    let log = server.log();
    let assigned = log
        .lines()
        .filter(|l| l.contains("partitions assigned") && l.contains("order-lifecycle"))
        .count();
    assert_eq!(
        assigned,
        1,
        "order-lifecycle left its group during the outage:\n{}",
        tail(&log, 80)
    );
    let (_, stock) = get(
        &server,
        &format!("/v1/stock/{}/{}", shop.merchant_id, shop.dish_id),
    )
    .await;
    assert_eq!(
        (
            stock["redis"]["reserved"].as_i64(),
            stock["redis"]["sold"].as_i64()
        ),
        (Some(0), Some(ORDERS as i64)),
        "{stock}"
    );
    let (status, log) = server.terminate();
    assert!(status.success(), "{}", tail(&log, 40));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_stopped_for_a_long_outage_dead_letters_nothing_and_loses_nothing() {
    outage_while_events_stream("mariadb").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_stopped_for_a_long_outage_dead_letters_nothing_and_loses_nothing() {
    outage_while_events_stream("redis").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_before_its_order_created_waits_and_applies_after_it() {
    let shop = shop(10).await;
    let server = shop.server(&[]);
    wait_for_api(&server).await;
    let pool = shop.env.pool();
    let order = 60_000_000 + shop.merchant_id % 1_000_000;
    let reservation = try_one(&server, &shop, order, 2).await;
    // The refund overtakes its OrderCreated (both keyed by the order, so the same partition:
    // the OrderCreated is behind it).
    refund_one(&shop, order, reservation).await;
    wait_count(
        &server,
        &pool,
        "SELECT COUNT(*) FROM inventory_deferred_event WHERE status = 10",
        1,
        Duration::from_secs(60),
    )
    .await;
    created(&shop, order, reservation).await;
    wait_count(
        &server,
        &pool,
        &format!("SELECT COUNT(*) FROM inventory_reservation WHERE id = {reservation} AND status = 40 AND refunded_quantity = 1"),
        1,
        Duration::from_secs(60),
    )
    .await;
    // The re-driver applies a parked event, then marks it applied in a statement of its
    // own: the refund can show before its row does.
    wait_count(
        &server,
        &pool,
        "SELECT COUNT(*) FROM inventory_deferred_event WHERE status = 20",
        1,
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(
        count(&pool, "SELECT COUNT(*) FROM inventory_dead_letter").await,
        0
    );
    let (_, stock) = get(
        &server,
        &format!("/v1/stock/{}/{}", shop.merchant_id, shop.dish_id),
    )
    .await;
    assert_eq!(
        (
            stock["redis"]["available"].as_i64(),
            stock["redis"]["sold"].as_i64()
        ),
        (Some(9), Some(1)),
        "the same as the events in order: {stock}"
    );
    let (status, log) = server.terminate();
    assert!(status.success(), "{}", tail(&log, 40));
}

/// Every row of every table of the service (but the worker-id, reconciler-shard and relay
/// leases, which belong to the running processes; of the relay's row only its high-water
/// mark), every column but the reconciler's own note of a bucket's last full check: a
/// replay writes nothing, not even a timestamp.
async fn dump_tables(pool: &sqlx::MySqlPool) -> BTreeMap<String, Vec<String>> {
    let tables: Vec<(String,)> = sqlx::query_as(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = DATABASE() \
         AND table_name NOT IN ('_sqlx_migrations', 'snowflake_worker_lease', 'inventory_reconcile_shard', \
         'inventory_outbox_relay') \
         ORDER BY table_name",
    )
    .fetch_all(pool)
    .await
    .expect("tables");
    let mut out = BTreeMap::new();
    for (table,) in tables {
        let columns: Vec<(String,)> = sqlx::query_as(
            "SELECT column_name FROM information_schema.columns WHERE table_schema = DATABASE() \
             AND table_name = ? ORDER BY ordinal_position",
        )
        .bind(&table)
        .fetch_all(pool)
        .await
        .expect("columns");
        let kept: Vec<String> = columns
            .into_iter()
            .map(|(c,)| c)
            .filter(|c| !(table == "dish_stock_baseline" && c == "full_checked_at"))
            .map(|c| format!("COALESCE(CAST(`{c}` AS CHAR), 'NULL')"))
            .collect();
        // As bytes: a parked dead letter's original value is binary Avro, not always UTF-8.
        let rows: Vec<(Vec<u8>,)> = sqlx::query_as(&format!(
            "SELECT CONCAT_WS('|', {}) FROM `{table}` ORDER BY 1",
            kept.join(", ")
        ))
        .fetch_all(pool)
        .await
        .expect("rows");
        out.insert(
            table,
            rows.into_iter()
                .map(|(r,)| {
                    String::from_utf8(r).unwrap_or_else(|e| {
                        let hex: String =
                            e.into_bytes().iter().map(|b| format!("{b:02x}")).collect();
                        format!("0x{hex}")
                    })
                })
                .collect(),
        );
    }
    let (hwm,): (u64,) = sqlx::query_as("SELECT hwm FROM inventory_outbox_relay WHERE id = 1")
        .fetch_one(pool)
        .await
        .expect("relay mark");
    out.insert("inventory_outbox_relay.hwm".into(), vec![hwm.to_string()]);
    out
}

/// Every Redis key of the merchant, field by field (but the times a field records).
async fn dump_redis(merchant_id: u64) -> BTreeMap<String, BTreeMap<String, String>> {
    let url = stocksvr_test_support::infra()
        .redis
        .url
        .expose()
        .to_string();
    let mut conn = stocksvr_store::connect_redis(
        &stocksvr_store::RedisTarget::Standalone { url },
        Duration::from_secs(5),
    )
    .await
    .expect("redis");
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("inv:{{{merchant_id}:*"))
        .query_async(&mut conn)
        .await
        .expect("keys");
    let mut out = BTreeMap::new();
    for key in keys {
        let fields: BTreeMap<String, String> = redis::cmd("HGETALL")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .expect("hgetall");
        out.insert(key, fields);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_of_every_topic_from_the_earliest_offset_changes_nothing() {
    let shop = shop(100).await;
    let server = shop.server(&[("STOCKSVR__RESERVATION__WORKER_ID", "11")]);
    wait_for_api(&server).await;
    let pool = shop.env.pool();
    let base = 70_000_000 + shop.merchant_id % 1_000_000 * 100;
    // A mixed workload: confirmed, refunded, cancelled, conflicting, early and invalid events.
    let a = try_one(&server, &shop, base + 1, 2).await;
    created(&shop, base + 1, a).await;
    refund_one(&shop, base + 1, a).await;
    let b = try_one(&server, &shop, base + 2, 1).await;
    shop.env
        .order_event(
            "OrderCreatedFailed",
            base + 2,
            json!({"order_id": base + 2, "merchant_id": shop.merchant_id,
            "inventory_reservation_ids": [b], "reason": "payment failed"}),
        )
        .await;
    // A confirm after the cancel: reported as a conflict.
    created(&shop, base + 2, b).await;
    let c = try_one(&server, &shop, base + 3, 1).await;
    refund_one(&shop, base + 3, c).await;
    created(&shop, base + 3, c).await;
    shop.env
        .order_event(
            "OrderCanceled",
            base + 3,
            json!({"order_id": base + 3, "merchant_id": shop.merchant_id,
            "inventory_reservation_ids": [c], "reason": "customer"}),
        )
        .await;
    // The order failed before its Try: refused.
    shop.env
        .order_event(
            "OrderCreatedFailed",
            base + 4,
            json!({"order_id": base + 4, "merchant_id": shop.merchant_id,
            "inventory_reservation_ids": [], "reason": "timeout"}),
        )
        .await;
    // An id of another order: invalid, dead-lettered.
    created(&shop, base + 5, a).await;
    wait_count(
        &server,
        &pool,
        "SELECT COUNT(*) FROM inventory_dead_letter",
        1,
        Duration::from_secs(60),
    )
    .await;
    let late = json!({"order_id": base + 4, "order_item_id": (base + 4) * 10 + 1, "merchant_id": shop.merchant_id,
                      "dish_id": shop.dish_id, "quantity": 1, "order_type": "INSTANT"});
    let refused = eventually_ok(Duration::from_secs(60), || async {
        let (status, reply) = post(&server, "/v1/reservations", &late.to_string()).await;
        if status == 409 {
            assert_eq!(reply["error"], "order_failed", "{reply}");
            Ok(())
        } else {
            // 201 RESERVED is not acceptable once the fence is written; before it, the Try
            // could still go through and would be cancelled below, so only a 409 ends the
            // wait.
            Err(reply)
        }
    })
    .await;
    if let Err(reply) = refused {
        panic!("the fence never refused the late Try: {reply}");
    }
    // Quiescent: every reservation settled, the outbox sent, the projection caught up.
    let unsent = common::flow::unsent_outbox_sql();
    for (sql, want) in [
        (
            "SELECT COUNT(*) FROM inventory_reservation WHERE status IN (10, 20, 30, 50, 80)",
            0,
        ),
        (unsent.as_str(), 0),
        (
            "SELECT COUNT(*) FROM inventory_deferred_event WHERE status = 10",
            0,
        ),
    ] {
        wait_count(&server, &pool, sql, want, Duration::from_secs(90)).await;
    }
    let sync = "SELECT COUNT(*) FROM inventory_reservation WHERE sync_status = 10 AND expected_redis_version IS NOT NULL";
    wait_count(&server, &pool, sync, 0, Duration::from_secs(90)).await;
    let (status, log) = server.terminate();
    assert!(status.success(), "{}", tail(&log, 40));

    let tables = dump_tables(&pool).await;
    let keys = dump_redis(shop.merchant_id).await;
    // Every group back to the earliest offset of every topic it reads.
    for (group, topic) in [
        ("order-lifecycle", shop.env.topic(ORDER_LIFECYCLE)),
        (
            "projector",
            shop.env.topic(stocksvr_core::events::topics::STOCK_CHANGE),
        ),
        (
            "schedule",
            shop.env
                .topic(stocksvr_core::events::topics::INVENTORY_SCHEDULE),
        ),
        (
            "dead-letter",
            format!("{}.dlt", shop.env.topic(ORDER_LIFECYCLE)),
        ),
    ] {
        let (ok, out, err) = common::run(shop.env.stocksvr().args([
            "offsets",
            "reset",
            "--group",
            &shop.env.group(group),
            "--topic",
            &topic,
            "--to-earliest",
            "--execute",
        ]));
        assert!(ok, "reset {group}: {out}{err}");
    }
    let server = shop.server(&[("STOCKSVR__RESERVATION__WORKER_ID", "11")]);
    wait_for_api(&server).await;
    // The replay is read to the end: every group's committed offset at its topic's end.
    for (group, topic) in [
        ("order-lifecycle", shop.env.topic(ORDER_LIFECYCLE)),
        (
            "projector",
            shop.env.topic(stocksvr_core::events::topics::STOCK_CHANGE),
        ),
    ] {
        common::wait_until_caught_up(&shop.env.group(group), &topic, Duration::from_secs(120))
            .await;
    }
    let (status, log) = server.terminate();
    assert!(status.success(), "{}", tail(&log, 40));
    let replayed_tables = dump_tables(&pool).await;
    for (table, rows) in &tables {
        assert_eq!(
            rows, &replayed_tables[table],
            "table {table} changed on a replay"
        );
    }
    assert_eq!(
        keys,
        dump_redis(shop.merchant_id).await,
        "Redis changed on a replay"
    );
}

#[tokio::test]
async fn ids_beyond_an_avro_long_are_refused_naming_the_field() {
    let shop = shop(5).await;
    let server = shop.server(&[("STOCKSVR__HTTP__ADMIN_TOKEN", "t")]);
    wait_for_api(&server).await;
    let too_big = json!(9_223_372_036_854_775_808u64);
    let valid = json!({"order_id": 1, "order_item_id": 1, "merchant_id": shop.merchant_id,
                       "dish_id": shop.dish_id, "quantity": 1, "order_type": "INSTANT"});
    for field in ["order_id", "order_item_id", "merchant_id", "dish_id"] {
        let mut body = valid.clone();
        body[field] = too_big.clone();
        let (status, reply) = post(&server, "/v1/reservations", &body.to_string()).await;
        assert_eq!(
            (status, reply["field"].as_str()),
            (400, Some(field)),
            "{reply}"
        );
    }
    let order = json!({"merchant_id": shop.merchant_id, "order_type": "INSTANT",
                       "items": [{"order_item_id": 1, "dish_id": shop.dish_id, "quantity": 1}]});
    let (status, reply) = post(
        &server,
        "/v1/orders/9223372036854775808/reservations",
        &order.to_string(),
    )
    .await;
    assert_eq!(
        (status, reply["field"].as_str()),
        (400, Some("order_id")),
        "{reply}"
    );
    let mut item = order.clone();
    item["items"][0]["order_item_id"] = too_big.clone();
    let (status, reply) = post(&server, "/v1/orders/1/reservations", &item.to_string()).await;
    // Every item is checked before any Try runs: the whole request is refused.
    assert_eq!(
        (status, reply["field"].as_str()),
        (400, Some("items[0].order_item_id")),
        "{reply}"
    );
    for path in [
        "/v1/reservations/9223372036854775808".to_string(),
        "/v1/orders/9223372036854775808/reservations".to_string(),
        format!("/v1/stock/9223372036854775808/{}", shop.dish_id),
        format!("/v1/stock/{}/9223372036854775808", shop.merchant_id),
    ] {
        let (status, reply) = get(&server, &path).await;
        assert_eq!(status, 400, "{path}: {reply}");
        assert!(reply["field"].is_string(), "{path}: {reply}");
    }
    let (status, reply) = common::api::admin_post(
        &server,
        "t",
        "/admin/buckets",
        json!({"merchant_id": too_big, "dish_id": 1, "total": 10}),
    )
    .await;
    assert_eq!(
        (status, reply["field"].as_str()),
        (400, Some("merchant_id")),
        "{reply}"
    );
    let (status, reply) = common::api::admin_post(
        &server,
        "t",
        "/admin/buckets",
        json!({"merchant_id": 1, "dish_id": 1, "total": 1u64 << 60}),
    )
    .await;
    assert_eq!(
        (status, reply["field"].as_str()),
        (400, Some("total")),
        "{reply}"
    );
    // The command line too.
    let (ok, _, err) = common::run(shop.env.stocksvr().args([
        "bucket",
        "init",
        "--merchant-id",
        "9223372036854775808",
        "--dish-id",
        "1",
        "--total",
        "1",
    ]));
    assert!(!ok && err.contains("merchant"), "{err}");
    let (status, log) = server.terminate();
    assert!(status.success(), "{}", tail(&log, 40));
}
