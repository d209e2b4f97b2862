//! Scheduled orders end to end through `stocksvr all` (docs/design.md, scheduled confirms):
//! OrderCreated parks a SCHEDULED reservation in CREATED_RESERVED and arms the Redis time
//! wheel; at the due time the wheel emits InventoryConfirmDue through the outbox and Kafka,
//! and the schedule processor confirms it once, however often the trigger arrives. An
//! OrderCanceled before the due time refunds from the reserved pool and the timer then
//! fires nothing. A timer lost while the process was down is made good by the DB scan after
//! a restart.
//!
//! Every test has its own database, consumer groups and wheel namespace (the Redis and the
//! topics are shared with other tests).

mod common;

use chrono::{DateTime, NaiveDate, SecondsFormat, Utc};
use common::api::{get, metrics_text, post, series_sum, shop, wait_for_api, Shop};
use common::flow::wait_for_status;
use common::server::Server;
use serde_json::{json, Value};
use std::time::Duration;
use stocksvr_core::bucket::BucketKey;
use stocksvr_schedule::TimeWheel;
use stocksvr_store::baselines::Baseline;
use stocksvr_test_support::{eventually, eventually_ok, eventually_some, zone};

struct Scheduled {
    shop: Shop,
    pool: sqlx::MySqlPool,
    wheel: TimeWheel,
    env: Vec<(String, String)>,
}

impl Scheduled {
    /// A shop with `total` units and the configuration of a server for it; `scan` is the
    /// (interval, grace) of the schedule scan in seconds.
    async fn new(total: i64, test: &str, scan: (u64, u64)) -> Self {
        let shop = shop(total).await;
        let pool =
            stocksvr_store::mysql_pool(&shop.db_url, 2, Duration::from_secs(5)).expect("pool");
        let _ = test;
        let namespace = shop.env.wheel.clone();
        let settings = common::settings();
        let conn = stocksvr_store::connect_redis(
            &stocksvr::settings::redis_target(&settings.redis),
            Duration::from_secs(2),
        )
        .await
        .expect("redis");
        let shards = stocksvr_schedule::ScheduleSettings::default().shards;
        let wheel = TimeWheel::new(conn, &namespace, shards).expect("wheel");
        let mut env: Vec<(String, String)> = shop
            .env
            .env()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        env.extend([
            (
                "STOCKSVR__SCHEDULE__SCAN_INTERVAL_SECS".into(),
                scan.0.to_string(),
            ),
            (
                "STOCKSVR__SCHEDULE__SCAN_GRACE_SECS".into(),
                scan.1.to_string(),
            ),
            // A killed instance's group membership ends after this, not librdkafka's 45 s.
            (
                "STOCKSVR__KAFKA__PROPERTIES__SESSION_TIMEOUT_MS".into(),
                "6000".into(),
            ),
            (
                "STOCKSVR__KAFKA__PROPERTIES__HEARTBEAT_INTERVAL_MS".into(),
                "1000".into(),
            ),
        ]);
        Self {
            shop,
            pool,
            wheel,
            env,
        }
    }

    fn env(&self, key: &str) -> &str {
        self.env
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
            .expect("configured")
    }

    fn start(&self) -> Server {
        Server::start_with(&self.env, "all")
    }

    /// A bucket of `dish_id` for `date` (the day of a processing_time; `shop` made today's
    /// of its dish).
    async fn bucket(&self, dish_id: u64, date: NaiveDate, total: i64) {
        stocksvr_store::baselines::ensure_baseline(
            &self.pool,
            &Baseline {
                stock_bucket_id: BucketKey::new(self.shop.merchant_id, dish_id, date)
                    .stock_bucket_id(),
                merchant_id: self.shop.merchant_id,
                dish_id,
                stock_date: date,
                timezone: zone::zone_name().into(),
                total_stock: total,
                baseline_version: 1,
                stock_status: 1,
                bucket_status: 10,
                lost_at: None,
            },
        )
        .await
        .expect("baseline");
    }

    /// Returns once order-lifecycle applies events as they come (its consumer has joined
    /// the group and been assigned the partitions); a due time chosen before that could pass
    /// before our OrderCreated is applied. One instant order of another dish is confirmed
    /// first.
    async fn caught_up(&self, server: &Server, order_id: u64) {
        let dish_id = self.shop.dish_id + 1;
        self.bucket(dish_id, zone::today(), 1).await;
        let body = json!({"order_id": order_id, "order_item_id": order_id * 10,
            "merchant_id": self.shop.merchant_id, "dish_id": dish_id, "quantity": 1, "order_type": "INSTANT"});
        let (status, reply) = post(server, "/v1/reservations", &body.to_string()).await;
        assert_eq!(status, 201, "{reply}");
        let id: u64 = reply["reservation"]["reservation_id"]
            .as_str()
            .expect("id")
            .parse()
            .expect("number");
        self.shop.env.order_event(
            "OrderCreated",
            order_id,
            json!({"order_id": order_id, "merchant_id": self.shop.merchant_id, "order_type": "INSTANT",
                "processing_time": null, "inventory_reservation_ids": [id]}),
        )
        .await;
        wait_for_status(server, id, "CONFIRMED", Duration::from_secs(180)).await;
    }

    /// Try of a SCHEDULED item due at `due`; returns the reservation id.
    async fn try_scheduled(
        &self,
        server: &Server,
        order_id: u64,
        qty: u32,
        due: DateTime<Utc>,
    ) -> u64 {
        let body = json!({"order_id": order_id, "order_item_id": order_id * 10,
            "merchant_id": self.shop.merchant_id, "dish_id": self.shop.dish_id, "quantity": qty,
            "order_type": "SCHEDULED", "processing_time": due.to_rfc3339_opts(SecondsFormat::Millis, true)});
        let (status, reply) = post(server, "/v1/reservations", &body.to_string()).await;
        assert_eq!(status, 201, "{reply}");
        assert_eq!(reply["reservation"]["status"], "RESERVED", "{reply}");
        reply["reservation"]["reservation_id"]
            .as_str()
            .expect("id")
            .parse()
            .expect("number")
    }

    /// Redis (available, reserved, sold) of the bucket of `date`.
    async fn numbers(&self, server: &Server, date: NaiveDate) -> (i64, i64, i64) {
        let (_, stock) = get(
            server,
            &format!(
                "/v1/stock/{}/{}?date={date}",
                self.shop.merchant_id, self.shop.dish_id
            ),
        )
        .await;
        let n = &stock["redis"];
        (
            n["available"].as_i64().expect("available"),
            n["reserved"].as_i64().expect("reserved"),
            n["sold"].as_i64().expect("sold"),
        )
    }

    /// Outbox rows of `event_type` for `reservation_id`; for a lifecycle event a step's row
    /// carries beside its stock change, that row (whose `lifecycle` member holds what the
    /// event adds to the stock change).
    async fn outbox(&self, reservation_id: u64, event_type: &str) -> Vec<Value> {
        let ids: Vec<u64> = sqlx::query_scalar(&format!(
            "SELECT o.id FROM inventory_outbox o WHERE o.aggregate_id = ? \
             AND (o.event_type = ? OR {} = ?) ORDER BY o.id",
            stocksvr_store::outbox::LIFECYCLE_EVENT_TYPE
        ))
        .bind(reservation_id)
        .bind(event_type)
        .bind(stocksvr_core::events::topics::INVENTORY_LIFECYCLE)
        .bind(event_type)
        .fetch_all(&self.pool)
        .await
        .expect("outbox");
        stocksvr_test_support::outbox_rows(&self.pool)
            .await
            .into_iter()
            .filter(|row| ids.contains(&row.id))
            .map(|row| row.json)
            .collect()
    }
}

/// A millisecond instant `secs` from now (MySQL keeps milliseconds).
fn in_secs(secs: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(Utc::now().timestamp_millis() + secs * 1000).expect("time")
}

/// A trigger for `reservation` as the wheel would emit it (under a new event id).
async fn confirm_due(env: &common::TestEnv, reservation: &Value) {
    let order_id = reservation["order_id"].as_u64().expect("order id");
    let data = json!({
        "reservation_id": reservation["reservation_id"].as_str().expect("id").parse::<i64>().expect("number"),
        "order_id": order_id,
        "stock_bucket_id": reservation["stock_bucket_id"],
        "processing_time": reservation["processing_time"],
    });
    env.produce(
        "InventoryConfirmDue",
        "io.stocksvr.schedule",
        &order_id.to_string(),
        data,
    )
    .await;
}

/// Polls `/metrics` until the counter line `prefix` shows at least `want`.
async fn wait_for_metric(server: &Server, prefix: &str, want: f64, within: Duration) {
    let reached = eventually_ok(within, || async {
        let value = series_sum(&metrics_text(server).await, prefix, "");
        if value >= want {
            Ok(())
        } else {
            Err(value)
        }
    })
    .await;
    if let Err(value) = reached {
        panic!(
            "{prefix} stayed at {value} (want {want}); log:\n{}",
            server.log()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wheel_confirms_once_at_the_due_time_and_a_cancel_before_it_refunds_reserved_stock() {
    // The scan runs every second but leaves a due reservation to the wheel for a minute, so
    // whatever confirms here within the test is the wheel's trigger.
    let t = Scheduled::new(10, "it-sched-wheel", (1, 60)).await;
    let server = t.start();
    wait_for_api(&server).await;
    let m = t.shop.merchant_id;
    let base = 5_000_000 + m % 1_000_000 * 10;
    let (o1, o2) = (base + 1, base + 2);
    t.caught_up(&server, base + 9).await;
    // r2 must be refunded before it is due (asserted below): on the dev stack that takes
    // moments (0.2 s measured), so 15 s leave a wide margin; the test then waits for r2's
    // due time (the wheel's clock) to see its timer dropped.
    let due1 = in_secs(10);
    let due2 = in_secs(15);
    for due in [due1, due2] {
        t.bucket(t.shop.dish_id, zone::date_of(due), 10).await;
    }
    let r1 = t.try_scheduled(&server, o1, 3, due1).await;
    let r2 = t.try_scheduled(&server, o2, 2, due2).await;
    for (order, id, due) in [(o1, r1, due1), (o2, r2, due2)] {
        t.shop
            .env
            .order_event(
                "OrderCreated",
                order,
                json!({"order_id": order, "merchant_id": m, "order_type": "SCHEDULED",
                "processing_time": due.to_rfc3339(), "inventory_reservation_ids": [id]}),
            )
            .await;
    }
    let parked1 = wait_for_status(&server, r1, "CREATED_RESERVED", Duration::from_secs(60)).await;
    wait_for_status(&server, r2, "CREATED_RESERVED", Duration::from_secs(60)).await;
    // order-lifecycle put both on the wheel, due at their processing_time.
    for (id, due) in [(r1, due1), (r2, due2)] {
        let score = eventually_some(Duration::from_secs(10), || async {
            t.wheel.score(id).await.expect("score")
        })
        .await;
        // Claimed already (due passed on a slow run) shows a later lease score instead.
        assert!(
            score.is_some_and(|s| s >= due.timestamp_millis()),
            "{id} armed at {due}: {score:?}"
        );
    }

    // OrderCanceled before the due time: a refund from the reserved pool, never a confirm.
    t.shop.env.order_event(
        "OrderCanceled",
        o2,
        json!({"order_id": o2, "merchant_id": m, "inventory_reservation_ids": [r2], "reason": "customer canceled"}),
    )
    .await;
    wait_for_status(&server, r2, "REFUNDED", Duration::from_secs(60)).await;
    assert!(Utc::now() < due2, "the refund happened before r2 was due");
    let refunds = t.outbox(r2, "InventoryRedisRefunded").await;
    assert_eq!(refunds.len(), 1, "{refunds:?}");
    let d = &refunds[0]["data"];
    assert_eq!(
        (
            &d["reserved_delta"],
            &d["sold_delta"],
            &d["available_delta"]
        ),
        (&json!(-2), &json!(0), &json!(2)),
        "refunded from the reserved pool: {d}"
    );
    // The Refund's one row carries its InventoryRefunded, which says before confirm.
    assert_eq!(
        t.outbox(r2, "InventoryRefunded").await[0]["lifecycle"]["before_confirm"],
        true
    );
    let day2 = zone::date_of(due2);
    if day2 == zone::date_of(due1) {
        // r1 may have been confirmed meanwhile: its 3 units are reserved or sold.
        let (available, reserved, sold) = t.numbers(&server, day2).await;
        assert_eq!(
            (available, reserved + sold),
            (10 - 3, 3),
            "r2's units are available again"
        );
    }

    // At its due time the wheel fires r1, and the schedule processor confirms it.
    let confirmed = wait_for_status(&server, r1, "CONFIRMED", Duration::from_secs(60)).await;
    let confirmed_at = DateTime::parse_from_rfc3339(confirmed["updated_at"].as_str().expect("at"))
        .expect("rfc3339");
    assert!(
        confirmed_at >= due1,
        "confirmed at {confirmed_at}, due {due1}"
    );
    let triggers = t.outbox(r1, "InventoryConfirmDue").await;
    assert_eq!(triggers.len(), 1, "one trigger per due time: {triggers:?}");
    assert_eq!(
        triggers[0]["data"]["processing_time"],
        parked1["processing_time"]
    );
    assert_eq!(
        t.wheel.score(r1).await.expect("score"),
        None,
        "fired entries leave the wheel"
    );
    let day1 = zone::date_of(due1);
    assert_eq!(t.numbers(&server, day1).await.2, 3, "r1 sold once");

    // A duplicated trigger (a producer retry, a replay) finds the work done.
    confirm_due(&t.shop.env, &confirmed).await;
    wait_for_metric(
        &server,
        "stocksvr_schedule_triggers_total{outcome=\"already_confirmed\"}",
        1.0,
        Duration::from_secs(60),
    )
    .await;

    // r2's timer falls due after its refund: dropped without a trigger.
    let left = eventually(Duration::from_secs(60), || async {
        t.wheel.score(r2).await.expect("score").is_none()
    })
    .await;
    assert!(left, "r2's entry never left the wheel");
    assert!(t.outbox(r2, "InventoryConfirmDue").await.is_empty());
    let (_, r2_now) = get(&server, &format!("/v1/reservations/{r2}")).await;
    assert_eq!(r2_now["status"], "REFUNDED");

    // Exactly one confirm of r1 in Redis and MySQL; nothing else moved.
    assert_eq!(t.outbox(r1, "InventoryRedisConfirmed").await.len(), 1);
    assert_eq!(t.outbox(r1, "InventoryConfirmed").await.len(), 1);
    assert!(t.outbox(r2, "InventoryRedisConfirmed").await.is_empty());
    if day1 == day2 {
        assert_eq!(t.numbers(&server, day1).await, (10 - 3, 0, 3));
    } else {
        assert_eq!(t.numbers(&server, day1).await, (10 - 3, 0, 3));
        assert_eq!(t.numbers(&server, day2).await, (10, 0, 0));
    }
    let (status, log) = server.terminate();
    assert!(status.success(), "{log}");
    assert!(
        !log.contains("confirmed by the scan"),
        "the wheel, not the scan, confirmed r1"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timer_lost_while_the_process_was_down_is_confirmed_by_the_scan_once() {
    let t = Scheduled::new(10, "it-sched-lost", (1, 1)).await;
    let server = t.start();
    wait_for_api(&server).await;
    let m = t.shop.merchant_id;
    let order = 5_500_000 + m % 1_000_000 * 10;
    t.caught_up(&server, order + 9).await;
    let due = in_secs(8);
    t.bucket(t.shop.dish_id, zone::date_of(due), 10).await;
    let id = t.try_scheduled(&server, order, 2, due).await;
    let (partition, offset) = t
        .shop
        .env
        .order_event(
            "OrderCreated",
            order,
            json!({"order_id": order, "merchant_id": m, "order_type": "SCHEDULED",
            "processing_time": due.to_rfc3339(), "inventory_reservation_ids": [id]}),
        )
        .await;
    wait_for_status(&server, id, "CREATED_RESERVED", Duration::from_secs(60)).await;
    // Committed, so the restarted order-lifecycle does not apply it again (a redelivered
    // OrderCreated re-arms the timer, which is the point of re-arming, but not this test's).
    let group = format!("{}.order-lifecycle", t.env("STOCKSVR__KAFKA__GROUP_PREFIX"));
    common::wait_for_commit(
        &group,
        &t.shop
            .env
            .topic(stocksvr_core::events::topics::ORDER_LIFECYCLE),
        partition,
        offset,
    )
    .await;
    let armed = eventually(Duration::from_secs(10), || async {
        t.wheel.score(id).await.expect("score").is_some()
    })
    .await;
    assert!(armed, "never armed (due {due}); log:\n{}", server.log());

    // The process dies before the due time and its timer is lost with it.
    let log = server.kill9();
    assert!(Utc::now() < due, "killed before the due time; log:\n{log}");
    assert!(t.wheel.remove(id).await.expect("remove"), "timer removed");
    // Stay down until the due time has passed, so the restart's load-ahead (which only
    // re-arms future entries) cannot rebuild it: only the scan can confirm it now. A fixed
    // wait on the wall clock the due time is set on (the restarted server compares
    // processing_time with it).
    let wait = (due - Utc::now()).to_std().unwrap_or_default() + Duration::from_millis(500);
    tokio::time::sleep(wait).await;

    let server = t.start();
    wait_for_api(&server).await;
    let confirmed = wait_for_status(&server, id, "CONFIRMED", Duration::from_secs(60)).await;
    server.wait_for_log("the scan's warning", Duration::from_secs(10), |l| {
        l.contains("the time wheel missed it") && l.contains(&id.to_string())
    });
    assert!(
        t.outbox(id, "InventoryConfirmDue").await.is_empty(),
        "no trigger was emitted: the scan confirmed it directly"
    );
    assert_eq!(t.wheel.score(id).await.expect("score"), None);

    // The lost trigger turns up late (say, a replay): confirmed already, nothing changes.
    confirm_due(&t.shop.env, &confirmed).await;
    wait_for_metric(
        &server,
        "stocksvr_schedule_triggers_total{outcome=\"already_confirmed\"}",
        1.0,
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(t.outbox(id, "InventoryRedisConfirmed").await.len(), 1);
    assert_eq!(t.outbox(id, "InventoryConfirmed").await.len(), 1);
    assert_eq!(
        t.numbers(&server, zone::date_of(due)).await,
        (10 - 2, 0, 2),
        "sold once, nothing left reserved"
    );
    let (status, log) = server.terminate();
    assert!(status.success(), "{log}");
}
