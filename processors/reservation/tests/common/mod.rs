//! The fixture the reservation tests share: a fresh database per test and a merchant (so
//! Redis bucket keys) of its own, against the real MariaDB and Redis of the local stack.
#![allow(dead_code)] // each test binary uses a different subset

pub mod ops;

use chrono::{NaiveDate, Utc};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use stocksvr_core::bucket::BucketKey;
use stocksvr_core::events::OrderType;
use stocksvr_core::reservation::try_operation_id;
use stocksvr_core::snowflake::SnowflakeGenerator;
use stocksvr_reservation::{ReservationService, ServiceConfig, TryRequest};
use stocksvr_store::baselines::Baseline;
use stocksvr_store::lua::LuaExecutor;
use stocksvr_store::reservations::{self as repo, InsertOutcome, NewReservation};
use stocksvr_test_support::zone;
use stocksvr_test_support::TestDb;

fn env_or(key: &str, default: &str) -> String {
    std::env::var(key).unwrap_or_else(|_| default.to_string())
}

/// A plain connection to the stack's Redis, for what a test writes or reads behind the
/// scripts' back.
pub async fn redis_conn() -> stocksvr_store::RedisConn {
    let url = env_or("STOCKSVR__REDIS__URL", "redis://127.0.0.1:6380/");
    stocksvr_store::connect_redis(
        &stocksvr_store::RedisTarget::from_env(&url).expect("redis settings"),
        Duration::from_secs(5),
    )
    .await
    .expect("redis connection")
}

/// Distinct for every call in every process: tests run in parallel and share Redis, so
/// the merchant (hence the bucket keys) of each fixture must not collide.
pub fn seed() -> u64 {
    use std::hash::{Hash, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_nanos();
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (
        nanos,
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed),
    )
        .hash(&mut h);
    h.finish()
}

/// `STOCKSVR__REDIS__WAIT_REPLICAS` / `..._WAIT_TIMEOUT_MS`, as the service reads them (0: off).
pub fn replication_wait() -> stocksvr_store::lua::ReplicationWait {
    stocksvr_store::lua::ReplicationWait {
        replicas: env_or("STOCKSVR__REDIS__WAIT_REPLICAS", "0")
            .parse()
            .expect("STOCKSVR__REDIS__WAIT_REPLICAS is a number"),
        timeout: Duration::from_millis(
            env_or("STOCKSVR__REDIS__WAIT_TIMEOUT_MS", "500")
                .parse()
                .expect("STOCKSVR__REDIS__WAIT_TIMEOUT_MS is a number"),
        ),
    }
}

/// What every reservation test needs of its own: a fresh migrated database, the Redis
/// executor, a snowflake generator and a merchant (so Redis keys) no other test uses, with
/// its time zone set to UTC.
pub struct Stores {
    /// Dropped with the fixture: the database goes when the test ends.
    pub db: TestDb,
    pub pool: sqlx::MySqlPool,
    pub lua: Arc<LuaExecutor>,
    pub ids: SnowflakeGenerator,
    pub merchant_id: u64,
}

pub async fn stores(config: &ServiceConfig) -> Stores {
    let s = seed();
    let db = TestDb::migrated().await;
    let pool = db.pool.clone();
    let redis_url = env_or("STOCKSVR__REDIS__URL", "redis://127.0.0.1:6380/");
    let conn = stocksvr_store::connect_redis(
        &stocksvr_store::RedisTarget::from_env(&redis_url).expect("redis settings"),
        Duration::from_secs(5),
    )
    .await
    .expect("redis");
    let merchant_id = 1_000_000 + s % 1_000_000_000;
    stocksvr_store::baselines::set_merchant_timezone(&pool, merchant_id, zone::zone_name())
        .await
        .expect("tz");
    Stores {
        db,
        pool,
        lua: Arc::new(
            LuaExecutor::new(conn, config.op_ttl).with_replication_wait(replication_wait()),
        ),
        ids: SnowflakeGenerator::new((s % 1024) as u16).expect("worker id"),
        merchant_id,
    }
}

pub struct Fixture {
    pub _db: TestDb,
    pub service: Arc<ReservationService>,
    pub lua: Arc<LuaExecutor>,
    pub pool: sqlx::MySqlPool,
    pub merchant_id: u64,
    pub dish_id: u64,
    pub today: NaiveDate,
}

impl Fixture {
    pub async fn new(total: i64) -> Self {
        Self::with_config(total, ServiceConfig::default()).await
    }

    pub async fn with_config(total: i64, config: ServiceConfig) -> Self {
        let Stores {
            db,
            pool,
            lua,
            ids,
            merchant_id,
        } = stores(&config).await;
        let dish_id = 77;
        let today = zone::today();
        let fixture = Self {
            _db: db,
            service: Arc::new(ReservationService::new(
                pool.clone(),
                lua.clone(),
                ids,
                config,
            )),
            lua,
            pool,
            merchant_id,
            dish_id,
            today,
        };
        fixture.baseline(today, total).await;
        fixture
    }

    pub async fn baseline(&self, date: NaiveDate, total: i64) {
        open_baseline(&self.pool, self.merchant_id, self.dish_id, date, total).await;
    }

    pub fn keys(&self) -> BucketKey {
        BucketKey::new(self.merchant_id, self.dish_id, self.today)
    }

    /// Builds today's bucket in Redis with `total` units, as its first lazy init would.
    pub async fn init_today(&self, total: i64) {
        let bucket = self.keys().stock_bucket_id();
        self.lua
            .init_bucket(&self.keys(), &format!("init_{bucket}_v1"), total, 1)
            .await
            .expect("init bucket");
    }

    pub fn request(&self, item: u64, quantity: u32) -> TryRequest {
        TryRequest {
            order_id: 5_000 + item / 10,
            order_item_id: item,
            merchant_id: self.merchant_id,
            dish_id: self.dish_id,
            quantity,
            order_type: OrderType::Instant,
            processing_time: None,
        }
    }

    pub async fn numbers(&self) -> (i64, i64, i64, i64) {
        let n = self
            .lua
            .read_bucket(&self.keys())
            .await
            .expect("read")
            .expect("bucket exists");
        (n.total, n.available, n.reserved, n.sold)
    }

    pub async fn reserve(&self, item: u64, quantity: u32) -> u64 {
        let reply = self
            .service
            .try_reserve(&self.request(item, quantity))
            .await
            .expect("try");
        assert_eq!(reply.reservation.status_name(), "RESERVED");
        reply.reservation.id
    }

    pub async fn status(&self, id: u64) -> String {
        self.service
            .get(id)
            .await
            .expect("get")
            .expect("exists")
            .status_name()
            .to_string()
    }

    /// A PREPARING row whose Try has not reached Redis, as a crash right after the insert leaves it.
    pub async fn preparing(&self, id: u64, item: u64, quantity: u32) {
        let key = BucketKey::new(self.merchant_id, self.dish_id, self.today);
        let now = Utc::now().naive_utc();
        let new = NewReservation {
            id,
            order_id: 9_000,
            order_item_id: item,
            merchant_id: self.merchant_id,
            dish_id: self.dish_id,
            stock_bucket_id: key.stock_bucket_id(),
            stock_date: self.today,
            quantity,
            order_type: 1,
            processing_time: None,
            expire_at: now,
            try_operation_id: try_operation_id(id),
        };
        assert_eq!(
            repo::insert_preparing(&self.pool, &new)
                .await
                .expect("insert"),
            InsertOutcome::Inserted
        );
    }
}

/// Makes every intermediate row due for recovery now (as if its grace or backoff passed).
pub async fn make_due(pool: &sqlx::MySqlPool) {
    sqlx::query("UPDATE inventory_reservation SET next_retry_at = NOW(3) - INTERVAL 1 SECOND")
        .execute(pool)
        .await
        .expect("due");
}

/// The baseline row of an open bucket of `total` units (in the test merchants' zone), as the
/// daily job or a bucket init writes it.
pub async fn open_baseline(
    pool: &sqlx::MySqlPool,
    merchant_id: u64,
    dish_id: u64,
    date: NaiveDate,
    total: i64,
) {
    stocksvr_store::baselines::ensure_baseline(
        pool,
        &open_baseline_row(merchant_id, dish_id, date, total),
    )
    .await
    .expect("baseline");
}

/// The row [`open_baseline`] writes.
pub fn open_baseline_row(merchant_id: u64, dish_id: u64, date: NaiveDate, total: i64) -> Baseline {
    Baseline {
        stock_bucket_id: BucketKey::new(merchant_id, dish_id, date).stock_bucket_id(),
        merchant_id,
        dish_id,
        stock_date: date,
        timezone: zone::zone_name().into(),
        total_stock: total,
        baseline_version: 1,
        stock_status: 1,
        bucket_status: 10,
        lost_at: None,
    }
}

/// The value of the first series of `name` whose labels contain `label` in a /metrics text
/// (0 when absent), e.g. `series(text, "stocksvr_try_group_size_count", "stage=\"commit\"")`.
pub fn series(metrics: &str, name: &str, label: &str) -> f64 {
    metrics
        .lines()
        .find(|l| l.starts_with(&format!("{name}{{")) && l.contains(label))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}
