//! An order flow through the real service: Trys over HTTP, order events from the order
//! service's topic, and waits on what MySQL shows (with the server log when they run out).

use super::api::{post, Shop};
use super::server::Server;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use stocksvr_core::retry::{wait_until, RetryPolicy};
use stocksvr_test_support::eventually_ok;

/// The pace of a Try repeated after a 503: 50 ms, doubling to 1 s, jittered.
const RETRY_503: RetryPolicy = RetryPolicy::new(Duration::from_millis(50), Duration::from_secs(1));

/// A Try of one unit kind of `order_id` (item `order_id * 10 + 1`) that must reserve.
pub async fn try_one(server: &Server, shop: &Shop, order_id: u64, quantity: u32) -> u64 {
    let (status, reply) =
        try_item_retried(server, shop, order_id, order_id * 10 + 1, quantity).await;
    assert_eq!(status, 201, "{reply}");
    assert_eq!(reply["reservation"]["status"], "RESERVED", "{reply}");
    reservation_id(&reply)
}

/// A Try of `order_item_id` of `order_id`, whatever it answers.
pub async fn try_item(
    server: &Server,
    shop: &Shop,
    order_id: u64,
    order_item_id: u64,
    quantity: u32,
) -> (u16, Value) {
    let body = json!({"order_id": order_id, "order_item_id": order_item_id, "merchant_id": shop.merchant_id,
                      "dish_id": shop.dish_id, "quantity": quantity, "order_type": "INSTANT"});
    post(server, "/v1/reservations", &body.to_string()).await
}

/// A Try as a client makes it: a 503 (a dependency too slow or away, the outcome decided
/// or not) is retried with the same ids, which the contract makes safe, for up to a minute;
/// the first other answer is returned. On a loaded machine a burst of Trys meets the MySQL
/// statement deadline now and then, and that is not what these tests are about.
pub async fn try_item_retried(
    server: &Server,
    shop: &Shop,
    order_id: u64,
    order_item_id: u64,
    quantity: u32,
) -> (u16, Value) {
    // Atomic only so the wait stays `Send` (tests spawn these Trys).
    let retried = AtomicBool::new(false);
    let last = std::sync::Mutex::new(None);
    // Backed off with jitter, as a client should: a burst of hundreds of Trys shed with 503
    // (too many in flight) and each repeated every 50 ms kept a loaded machine busy with
    // refusals, and none got through within a minute.
    let answer = wait_until(Duration::from_secs(60), RETRY_503, || async {
        let (status, reply) = try_item(server, shop, order_id, order_item_id, quantity).await;
        if status == 200 && retried.load(Ordering::Relaxed) && reply["created"] == false {
            // The attempt that answered 503 did reserve (its outcome was decided after the
            // deadline): the repeat finds that reservation, which is the 201 the client did
            // not hear.
            return Some((201, reply));
        }
        if status == 503 {
            retried.store(true, Ordering::Relaxed);
            *last.lock().expect("last answer") = Some((status, reply));
            return None;
        }
        Some((status, reply))
    })
    .await;
    // Still 503 after a minute: the caller sees that answer.
    answer
        .or_else(|| last.lock().expect("last answer").take())
        .expect("a Try answered")
}

/// The reservation id of a Try reply (ids travel as strings).
pub fn reservation_id(reply: &Value) -> u64 {
    reply["reservation"]["reservation_id"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no reservation id in {reply}"))
}

pub async fn created(shop: &Shop, order_id: u64, reservation: u64) {
    shop.env
        .order_event(
            "OrderCreated",
            order_id,
            json!({"order_id": order_id, "merchant_id": shop.merchant_id, "order_type": "INSTANT",
                   "processing_time": null, "inventory_reservation_ids": [reservation]}),
        )
        .await;
}

/// A partial refund of one unit, refund id `r-<order>` (a repeat is the same refund).
pub async fn refund_one(shop: &Shop, order_id: u64, reservation: u64) {
    shop.env
        .order_event(
            "RefundRequested",
            order_id,
            json!({"order_id": order_id, "merchant_id": shop.merchant_id,
                   "refund_id": format!("r-{order_id}"), "reason": "one item missing",
                   "items": [{"inventory_reservation_id": reservation, "quantity": 1}]}),
        )
        .await;
}

pub async fn failed(shop: &Shop, order_id: u64, reservations: &[u64]) {
    shop.env
        .order_event(
            "OrderCreatedFailed",
            order_id,
            json!({"order_id": order_id, "merchant_id": shop.merchant_id,
                   "inventory_reservation_ids": reservations, "reason": "payment failed"}),
        )
        .await;
}

pub async fn canceled(shop: &Shop, order_id: u64, reservations: &[u64]) {
    shop.env
        .order_event(
            "OrderCanceled",
            order_id,
            json!({"order_id": order_id, "merchant_id": shop.merchant_id,
                   "inventory_reservation_ids": reservations, "reason": "customer"}),
        )
        .await;
}

pub async fn count(pool: &sqlx::MySqlPool, sql: &str) -> i64 {
    let (n,): (i64,) = sqlx::query_as(sql).fetch_one(pool).await.expect(sql);
    n
}

/// Waits until `sql` counts `want`, failing with the server log after `within`.
pub async fn wait_count(
    server: &Server,
    pool: &sqlx::MySqlPool,
    sql: &str,
    want: i64,
    within: Duration,
) {
    let counted = eventually_ok(within, || async {
        let n = count(pool, sql).await;
        if n == want {
            Ok(())
        } else {
            Err(n)
        }
    })
    .await;
    if let Err(n) = counted {
        panic!(
            "{sql}: {n}, want {want} within {within:?}; log tail:\n{}",
            tail(&server.log(), 60)
        );
    }
}

/// Nothing in flight: every order event produced so far read by the order-lifecycle
/// group (an event still in Kafka leaves no trace in MySQL), every reservation settled,
/// every event sent and booked.
pub async fn quiescent(server: &Server, shop: &Shop, within: Duration) {
    super::wait_until_caught_up(
        &shop.env.group("order-lifecycle"),
        &shop
            .env
            .topic(stocksvr_core::events::topics::ORDER_LIFECYCLE),
        within,
    )
    .await;
    let pool = &shop.env.pool();
    let unsent = unsent_outbox_sql();
    for sql in [
        "SELECT COUNT(*) FROM inventory_reservation WHERE status IN (10, 30, 50, 80)",
        unsent.as_str(),
        "SELECT COUNT(*) FROM inventory_deferred_event WHERE status = 10",
        "SELECT COUNT(*) FROM inventory_reservation WHERE sync_status = 10 AND expected_redis_version IS NOT NULL",
        "SELECT COUNT(*) FROM inventory_operation_wal WHERE status IN (10, 20, 40)",
    ] {
        wait_count(server, pool, sql, 0, within).await;
    }
}

/// Counts the outbox rows the relay has not published yet (the relay's own definition). The
/// counting helpers here run SQL without binds, so the relay's codes fill its placeholders.
pub fn unsent_outbox_sql() -> String {
    let mut unsent = String::new();
    let mut codes = stocksvr_outbox_relay::UNSENT_CODES.iter();
    for (i, part) in stocksvr_outbox_relay::UNSENT.split('?').enumerate() {
        if i > 0 {
            let code = codes
                .next()
                .expect("a code for every placeholder of UNSENT");
            unsent.push_str(&code.to_string());
        }
        unsent.push_str(part);
    }
    format!(
        "SELECT COUNT(*) FROM inventory_outbox o JOIN inventory_outbox_relay c ON c.id = 1 \
         WHERE {unsent}"
    )
}

/// The outbox rows not published yet.
pub async fn unsent_outbox(pool: &sqlx::MySqlPool) -> i64 {
    sqlx::query_scalar(&unsent_outbox_sql())
        .fetch_one(pool)
        .await
        .expect("outbox")
}

pub fn tail(log: &str, lines: usize) -> String {
    let all: Vec<&str> = log.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Polls the reservation until it reaches `status`, at most `within`; panics with its last
/// state and the server log.
pub async fn wait_for_status(server: &Server, id: u64, status: &str, within: Duration) -> Value {
    let path = format!("/v1/reservations/{id}");
    let reached = eventually_ok(within, || async {
        let (code, body) = super::api::get(server, &path).await;
        if code == 200 && body["status"] == status {
            Ok(body)
        } else {
            Err(body)
        }
    })
    .await;
    reached.unwrap_or_else(|last| {
        panic!(
            "reservation {id} never reached {status} within {within:?}: last {last}; log:\n{}",
            server.log()
        )
    })
}

/// A PREPARING row of `order_id`'s item `order_item_id` whose Try has not reached Redis:
/// what a crash right after the insert leaves behind.
pub async fn insert_preparing(
    pool: &sqlx::MySqlPool,
    shop: &Shop,
    order_id: u64,
    order_item_id: u64,
    reservation_id: u64,
    quantity: u32,
) {
    let today = stocksvr_test_support::zone::today();
    let key = stocksvr_core::bucket::BucketKey::new(shop.merchant_id, shop.dish_id, today);
    let new = stocksvr_store::reservations::NewReservation {
        id: reservation_id,
        order_id,
        order_item_id,
        merchant_id: shop.merchant_id,
        dish_id: shop.dish_id,
        stock_bucket_id: key.stock_bucket_id(),
        stock_date: today,
        quantity,
        order_type: 1,
        processing_time: None,
        expire_at: chrono::Utc::now().naive_utc(),
        try_operation_id: stocksvr_core::reservation::try_operation_id(reservation_id),
    };
    let inserted = stocksvr_store::reservations::insert_preparing(pool, &new)
        .await
        .expect("insert");
    assert_eq!(
        inserted,
        stocksvr_store::reservations::InsertOutcome::Inserted
    );
}
