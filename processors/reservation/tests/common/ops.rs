//! The stock-operation fixture: a service with its own database and merchant, built with
//! the given WAL settings, and helpers to read Redis, the WAL and the outbox.

use super::{env_or, seed};
use chrono::{NaiveDate, Utc};
use std::sync::Arc;
use std::time::Duration;
use stocksvr_core::bucket::BucketKey;
use stocksvr_core::events::OrderType;
use stocksvr_core::snowflake::SnowflakeGenerator;
use stocksvr_reservation::{
    IntentOutcome, OpsConfig, ReservationService, ServiceConfig, TryRequest,
};
use stocksvr_store::lua::{BucketKeys, LuaExecutor, StockNumbers};
use stocksvr_store::reservations::{self as repo, Baseline};
use stocksvr_store::wal;

pub struct Ops {
    pub service: Arc<ReservationService>,
    pub lua: Arc<LuaExecutor>,
    pub pool: sqlx::MySqlPool,
    pub merchant_id: u64,
    pub dish_id: u64,
    pub today: NaiveDate,
}

impl Ops {
    pub async fn new(ops: OpsConfig) -> Self {
        let base = env_or(
            "STOCKSVR__MYSQL__URL",
            "mysql://stocksvr:stocksvr@127.0.0.1:3307/stocksvr",
        );
        let admin = stocksvr_store::mysql_pool(&base, 1, Duration::from_secs(10)).expect("pool");
        let s = seed();
        let db = format!("stocksvr_ops_{}", s % 1_000_000_000_000);
        sqlx::query(&format!("CREATE DATABASE `{db}`"))
            .execute(&admin)
            .await
            .expect("create db");
        let (prefix, _) = base.rsplit_once('/').expect("db path");
        let pool =
            stocksvr_store::mysql_pool(&format!("{prefix}/{db}"), 32, Duration::from_secs(30))
                .expect("pool");
        stocksvr_store::migrate(&pool).await.expect("migrate");
        let redis_url = env_or("STOCKSVR__REDIS__URL", "redis://127.0.0.1:6380/");
        let conn = stocksvr_store::connect_redis(&redis_url, Duration::from_secs(5))
            .await
            .expect("redis");
        let config = ServiceConfig::default();
        let lua = Arc::new(LuaExecutor::new(conn, config.op_ttl));
        let ids = SnowflakeGenerator::new((s % 1024) as u16).expect("worker id");
        let merchant_id = 2_000_000 + s % 1_000_000_000;
        repo::set_merchant_timezone(&pool, merchant_id, "UTC")
            .await
            .expect("tz");
        Self {
            service: Arc::new(
                ReservationService::new(pool.clone(), lua.clone(), ids, config)
                    .with_ops_config(ops),
            ),
            lua,
            pool,
            merchant_id,
            dish_id: 88,
            today: Utc::now().date_naive(),
        }
    }

    pub fn baseline(&self, date: NaiveDate, total: i64) -> Baseline {
        Baseline {
            stock_bucket_id: self.bucket(date),
            merchant_id: self.merchant_id,
            dish_id: self.dish_id,
            stock_date: date,
            timezone: "UTC".into(),
            total_stock: total,
            baseline_version: 1,
            stock_status: 1,
            bucket_status: 10,
        }
    }

    pub fn bucket(&self, date: NaiveDate) -> String {
        BucketKey::new(self.merchant_id, self.dish_id, date).stock_bucket_id()
    }

    pub async fn redis(&self, date: NaiveDate) -> Option<StockNumbers> {
        let keys =
            BucketKeys::new(self.merchant_id, self.dish_id, &date.to_string()).expect("keys");
        self.lua.read_bucket(&keys).await.expect("read")
    }

    pub fn request(&self, item: u64, quantity: u32) -> TryRequest {
        TryRequest {
            order_id: 7_000 + item,
            order_item_id: item,
            merchant_id: self.merchant_id,
            dish_id: self.dish_id,
            quantity,
            order_type: OrderType::Instant,
            processing_time: None,
        }
    }

    pub async fn reserve(&self, item: u64, quantity: u32) -> u64 {
        let reply = self
            .service
            .try_reserve(&self.request(item, quantity))
            .await
            .expect("try");
        assert_eq!(reply.reservation.status, "RESERVED");
        reply.reservation.reservation_id.parse().expect("id")
    }

    pub async fn status(&self, id: u64) -> String {
        self.service
            .get(id)
            .await
            .expect("get")
            .expect("row")
            .status
    }

    pub async fn outbox_count(&self, event_type: &str) -> i64 {
        let (n,): (i64,) =
            sqlx::query_as("SELECT COUNT(*) FROM inventory_outbox WHERE event_type = ?")
                .bind(event_type)
                .fetch_one(&self.pool)
                .await
                .expect("count");
        n
    }

    pub async fn wal_rows(&self, bucket: &str) -> Vec<wal::WalRow> {
        wal::list(&self.pool, &[], Some(bucket), 100)
            .await
            .expect("wal")
    }
}

pub fn assert_conserved(n: &StockNumbers) {
    assert_eq!(
        n.available + n.reserved + n.sold,
        n.total + n.deficit,
        "available + reserved + sold = total + deficit: {n:?}"
    );
}

pub fn done(outcome: IntentOutcome) -> String {
    match outcome {
        IntentOutcome::Done { reservation, .. } => reservation.status,
        other => panic!("expected the step to run, got {other:?}"),
    }
}

impl Ops {
    /// Lets the lease on `operation_id` run out now, as if its holder died long ago (tests
    /// must not depend on how fast a loaded machine reaches the next line).
    pub async fn expire_lease(&self, operation_id: &str) {
        let past = Utc::now().naive_utc() - chrono::TimeDelta::seconds(1);
        let done = sqlx::query(
            "UPDATE inventory_operation_wal SET lease_expire_at = ?, next_retry_at = ? \
             WHERE operation_id = ? AND lease_owner IS NOT NULL",
        )
        .bind(past)
        .bind(past)
        .bind(operation_id)
        .execute(&self.pool)
        .await
        .expect("expire lease");
        assert_eq!(done.rows_affected(), 1, "{operation_id} holds a lease");
    }

    /// Makes every backing-off row of the bucket due now.
    pub async fn make_wal_due(&self) {
        let past = Utc::now().naive_utc() - chrono::TimeDelta::seconds(1);
        sqlx::query("UPDATE inventory_operation_wal SET next_retry_at = ? WHERE status = 40")
            .bind(past)
            .execute(&self.pool)
            .await
            .expect("due");
    }

    /// One StockBaselineAdjusted or StockBucketInitialized payload per row, oldest first.
    pub async fn events(&self, event_type: &str) -> Vec<serde_json::Value> {
        let rows: Vec<(String,)> = sqlx::query_as(
            "SELECT CAST(payload AS CHAR) FROM inventory_outbox WHERE event_type = ? ORDER BY id",
        )
        .bind(event_type)
        .fetch_all(&self.pool)
        .await
        .expect("events");
        rows.iter()
            .map(|(p,)| serde_json::from_str(p).expect("json"))
            .collect()
    }
}
