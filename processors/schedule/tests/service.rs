//! The wheel poller and the scan with the real reservation service (MariaDB and Redis of the
//! local stack), without Kafka: a due entry becomes one InventoryConfirmDue outbox row, an
//! entry whose claimant died fires again after the claim timeout and enqueues nothing new,
//! the scan confirms an overdue reservation once and re-arms an upcoming one whose entry was
//! lost. Each test has its own database, merchant and wheel namespace.

use chrono::{DateTime, NaiveDate, Utc};
use std::sync::Arc;
use std::time::Duration;
use stocksvr_core::bucket::BucketKey;
use stocksvr_core::events::OrderType;
use stocksvr_core::snowflake::SnowflakeGenerator;
use stocksvr_reservation::{IntentOutcome, ReservationService, ServiceConfig, TryRequest};
use stocksvr_schedule::fire::Poller;
use stocksvr_schedule::scan::Scanner;
use stocksvr_schedule::ScheduleSettings;
use stocksvr_schedule::{ScheduleConfig, TimeWheel};
use stocksvr_store::baselines::Baseline;
use stocksvr_store::lua::LuaExecutor;
use stocksvr_test_support::{eventually, zone, TestDb};

/// Distinct for every call: the two tests of this file start together and share Redis, and
/// a seed of the clock and the pid alone once gave both the same merchant (one test's
/// reservation showed in the other's bucket). `unique_id` adds a per-process counter.
fn seed() -> u64 {
    stocksvr_test_support::unique_id(0)
}

struct Fixture {
    service: Arc<ReservationService>,
    lua: Arc<LuaExecutor>,
    _db: TestDb,
    pool: sqlx::MySqlPool,
    wheel: TimeWheel,
    config: ScheduleConfig,
    merchant_id: u64,
    dish_id: u64,
}

impl Fixture {
    async fn new(claim_timeout_secs: u64, scan_grace_secs: u64) -> Self {
        let settings = stocksvr_test_support::infra();
        let s = seed();
        let db = TestDb::migrated().await;
        let pool = db.pool.clone();
        let conn = stocksvr_store::connect_redis(
            &stocksvr_store::RedisTarget::from_env(settings.redis.url.expose())
                .expect("redis settings"),
            Duration::from_secs(5),
        )
        .await
        .expect("redis");
        let config = ServiceConfig::default();
        let lua = Arc::new(LuaExecutor::new(conn.clone(), config.op_ttl));
        let ids = SnowflakeGenerator::new((s % 1024) as u16).expect("worker id");
        let service = Arc::new(ReservationService::new(
            pool.clone(),
            lua.clone(),
            ids,
            config,
        ));
        let wheel =
            TimeWheel::new(conn, &format!("it-svc-{}", s % 1_000_000_000_000), 4).expect("wheel");
        let config = ScheduleConfig::from_settings(&ScheduleSettings {
            claim_timeout_secs,
            scan_grace_secs,
            scan_interval_secs: 1,
            ..ScheduleSettings::default()
        })
        .expect("config");
        let merchant_id = 3_000_000 + s % 1_000_000_000;
        stocksvr_store::baselines::set_merchant_timezone(&pool, merchant_id, zone::zone_name())
            .await
            .expect("tz");
        Self {
            _db: db,
            service,
            lua,
            pool,
            wheel,
            config,
            merchant_id,
            dish_id: 41,
        }
    }

    async fn baseline(&self, date: NaiveDate, total: i64) {
        stocksvr_store::baselines::ensure_baseline(
            &self.pool,
            &Baseline {
                stock_bucket_id: BucketKey::new(self.merchant_id, self.dish_id, date)
                    .stock_bucket_id(),
                merchant_id: self.merchant_id,
                dish_id: self.dish_id,
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

    /// A SCHEDULED reservation due at `due`, created by its order (CREATED_RESERVED).
    async fn parked(&self, item: u64, quantity: u32, due: DateTime<Utc>) -> u64 {
        self.baseline(zone::date_of(due), 10).await;
        let reply = self
            .service
            .try_reserve(&TryRequest {
                order_id: 9_000 + item,
                order_item_id: item,
                merchant_id: self.merchant_id,
                dish_id: self.dish_id,
                quantity,
                order_type: OrderType::Scheduled,
                processing_time: Some(due),
            })
            .await
            .expect("try");
        assert_eq!(reply.reservation.status_name(), "RESERVED");
        let id: u64 = reply.reservation.id;
        let parked = self.service.mark_created(id).await.expect("created");
        assert!(matches!(parked, IntentOutcome::Done { .. }), "{parked:?}");
        id
    }

    async fn outbox(&self, id: u64, event_type: &str) -> i64 {
        let (n,): (i64,) = sqlx::query_as(
            "SELECT COUNT(*) FROM inventory_outbox WHERE aggregate_id = ? AND event_type = ?",
        )
        .bind(id)
        .bind(event_type)
        .fetch_one(&self.pool)
        .await
        .expect("count");
        n
    }

    async fn status(&self, id: u64) -> String {
        self.service
            .get(id)
            .await
            .expect("get")
            .expect("exists")
            .status_name()
            .to_string()
    }
}

fn in_ms(ms: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(Utc::now().timestamp_millis() + ms).expect("time")
}

#[tokio::test]
async fn a_due_entry_is_emitted_once_even_when_its_claimant_dies() {
    let f = Fixture::new(1, 3600).await;
    let poller = Poller::new(f.wheel.clone(), f.pool.clone(), None, &f.config);
    let due = in_ms(1500);
    let id = f.parked(1, 2, due).await;
    assert!(f.wheel.arm(id, due).await.expect("arm"), "armed");
    assert_eq!(
        f.wheel.score(id).await.expect("score"),
        Some(due.timestamp_millis())
    );

    let early = poller.tick_once().await.expect("tick");
    assert_eq!(early.emitted, 0, "not due yet");
    let fired = eventually(Duration::from_secs(15), || async {
        poller.tick_once().await.expect("tick").emitted == 1
    })
    .await;
    assert!(fired, "never fired");
    assert!(Utc::now() >= due, "fired at or after the due time");
    assert_eq!(f.outbox(id, "InventoryConfirmDue").await, 1);
    assert_eq!(f.wheel.score(id).await.expect("score"), None, "released");

    // The entry comes back (a redelivered OrderCreated re-arms it) and a poller claims it
    // and dies before emitting: hidden for the claim timeout, then fired again, and the
    // deterministic event id keeps the outbox at one row.
    assert!(f.wheel.arm(id, due).await.expect("arm"));
    let dead = f
        .wheel
        .claim(&f.wheel.key_for(id), 10, Duration::from_secs(1))
        .await
        .expect("claim");
    assert_eq!(dead.members, vec![id.to_string()]);
    let hidden = poller.tick_once().await.expect("tick");
    assert_eq!(hidden.claimed(), 0, "hidden while claimed: {hidden:?}");
    // The poller's next look is when the lease runs out, not before and not much after
    // (a standalone Redis: a cluster's shards each have their own clock, so no next due time).
    let cluster =
        stocksvr_store::RedisTarget::from_env(stocksvr_test_support::infra().redis.url.expose())
            .expect("redis settings")
            .is_cluster();
    if cluster {
        assert_eq!(hidden.next_due_in, None, "{hidden:?}");
    } else {
        let lease_end = hidden
            .next_due_in
            .expect("the claimed entry's lease is on the wheel");
        assert!(lease_end <= Duration::from_secs(1), "{hidden:?}");
    }
    let fired_again = eventually(Duration::from_secs(15), || async {
        let report = poller.tick_once().await.expect("tick");
        if report.already_emitted == 1 {
            assert_eq!(report.emitted, 0);
            return true;
        }
        false
    })
    .await;
    assert!(fired_again, "never fired again");
    assert_eq!(f.outbox(id, "InventoryConfirmDue").await, 1);
    assert_eq!(f.wheel.score(id).await.expect("score"), None);
    assert_eq!(
        f.status(id).await,
        "CREATED_RESERVED",
        "the poller never confirms"
    );

    // Once confirmed, a leftover entry is dropped without a trigger.
    f.service.confirm(id).await.expect("confirm");
    assert!(f.wheel.arm(id, due).await.expect("arm"));
    let report = poller.tick_once().await.expect("tick");
    assert_eq!((report.dropped, report.emitted), (1, 0));
    assert_eq!(f.outbox(id, "InventoryConfirmDue").await, 1);
}

#[tokio::test]
async fn the_scan_confirms_what_the_wheel_missed_once_and_rearms_lost_entries() {
    let f = Fixture::new(30, 0).await;
    let scanner = Scanner::new(f.service.clone(), f.wheel.clone(), &f.config);
    // Due a moment ago (within the Try's grace), never armed: the wheel cannot fire it.
    let due = in_ms(-1000);
    let overdue = f.parked(1, 3, due).await;
    // Due in five minutes, its entry lost.
    let later = in_ms(300_000);
    let upcoming = f.parked(2, 1, later).await;
    // Due beyond the load-ahead horizon: left for a later round.
    let far = in_ms(3_600_000);
    let distant = f.parked(3, 1, far).await;

    let report = scanner.scan_once().await.expect("scan");
    assert_eq!((report.overdue, report.redriven), (1, 1), "{report:?}");
    assert_eq!((report.upcoming, report.rearmed), (1, 1), "{report:?}");
    assert_eq!(f.status(overdue).await, "CONFIRMED");
    assert_eq!(f.status(upcoming).await, "CREATED_RESERVED");
    assert_eq!(
        f.wheel.score(upcoming).await.expect("score"),
        Some(later.timestamp_millis())
    );
    assert_eq!(f.wheel.score(distant).await.expect("score"), None);

    let again = scanner.scan_once().await.expect("scan");
    assert_eq!(
        (again.overdue, again.redriven, again.rearmed),
        (0, 0, 0),
        "nothing twice: {again:?}"
    );
    assert_eq!(f.outbox(overdue, "InventoryRedisConfirmed").await, 1);
    assert_eq!(
        f.outbox(overdue, "InventoryConfirmDue").await,
        0,
        "the scan confirms directly"
    );
    let keys = BucketKey::new(f.merchant_id, f.dish_id, zone::date_of(due));
    let numbers = f
        .lua
        .read_bucket(&keys)
        .await
        .expect("read")
        .expect("bucket");
    if zone::date_of(due) == zone::date_of(later) && zone::date_of(later) == zone::date_of(far) {
        assert_eq!(
            (numbers.available, numbers.reserved, numbers.sold),
            (10 - 5, 2, 3)
        );
    } else {
        assert_eq!(numbers.sold, 3);
    }
    for id in [upcoming, distant] {
        f.wheel.remove(id).await.expect("clean up");
    }
}
