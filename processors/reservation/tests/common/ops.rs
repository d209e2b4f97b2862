//! The stock-operation fixture: a service with its own database and merchant, built with
//! the given WAL settings, and helpers to read Redis, the WAL and the outbox.

use super::{stores, Stores};
use chrono::{NaiveDate, Utc};
use std::sync::Arc;
use stocksvr_core::bucket::BucketKey;
use stocksvr_core::events::OrderType;
use stocksvr_reservation::{
    IntentOutcome, OpsConfig, ReservationService, ServiceConfig, TryRequest,
};
use stocksvr_store::baselines::Baseline;
use stocksvr_store::lua::{LuaExecutor, StockNumbers};
use stocksvr_store::wal;

pub struct Ops {
    pub _db: stocksvr_test_support::TestDb,
    pub service: Arc<ReservationService>,
    pub lua: Arc<LuaExecutor>,
    pub pool: sqlx::MySqlPool,
    pub merchant_id: u64,
    pub dish_id: u64,
    pub today: NaiveDate,
}

impl Ops {
    pub async fn new(ops: OpsConfig) -> Self {
        let config = ServiceConfig::default();
        let Stores {
            db,
            pool,
            lua,
            ids,
            merchant_id,
        } = stores(&config).await;
        Self {
            _db: db,
            service: Arc::new(
                ReservationService::new(pool.clone(), lua.clone(), ids, config)
                    .with_ops_config(ops),
            ),
            lua,
            pool,
            merchant_id,
            dish_id: 88,
            today: stocksvr_test_support::zone::today(),
        }
    }

    pub fn baseline(&self, date: NaiveDate, total: i64) -> Baseline {
        super::open_baseline_row(self.merchant_id, self.dish_id, date, total)
    }

    pub fn bucket(&self, date: NaiveDate) -> String {
        BucketKey::new(self.merchant_id, self.dish_id, date).stock_bucket_id()
    }

    pub async fn redis(&self, date: NaiveDate) -> Option<StockNumbers> {
        let keys = BucketKey::new(self.merchant_id, self.dish_id, date);
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
        assert_eq!(reply.reservation.status_name(), "RESERVED");
        reply.reservation.id
    }

    pub async fn status(&self, id: u64) -> String {
        self.service
            .get(id)
            .await
            .expect("get")
            .expect("row")
            .status_name()
            .to_string()
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
        IntentOutcome::Done { reservation, .. } => reservation.status_name().to_string(),
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

/// Who holds the lease of an operation whose executor "died" right after writing it.
pub const DEAD_OWNER: &str = "killed-worker";

impl Ops {
    /// The INIT row of `b`, written (with the baseline) by an executor that died before
    /// running it: leased to [`DEAD_OWNER`] for ten minutes. Returns its operation id.
    pub async fn stuck_init(&self, b: &Baseline) -> String {
        let op = stocksvr_reservation::operations::init_operation_id(&b.stock_bucket_id, 1);
        let (_, fresh) = wal::begin_init(&self.pool, b, |s| wal::NewWal {
            operation_id: op.clone(),
            stock_bucket_id: s.stock_bucket_id.clone(),
            action: wal::WalAction::InitBucket,
            request_payload: serde_json::json!({ "total": s.total_stock }),
            lease_owner: DEAD_OWNER.into(),
            lease: chrono::TimeDelta::minutes(10),
        })
        .await
        .expect("begin init");
        assert!(fresh, "{op} is new");
        op
    }

    /// An ADJUST row to `new_total` (with the baseline bump), written by an executor that
    /// died before running it. Returns its operation id.
    pub async fn stuck_adjust(&self, bucket: &str, new_total: i64) -> String {
        let (_, row) = wal::begin_adjust(&self.pool, bucket, new_total, |before| wal::NewWal {
            operation_id: stocksvr_reservation::operations::adjust_operation_id(
                bucket,
                before.baseline_version + 1,
            ),
            stock_bucket_id: bucket.to_string(),
            action: wal::WalAction::Adjust,
            request_payload: serde_json::json!({
                "old_total": before.total_stock,
                "new_total": new_total,
                "baseline_version": before.baseline_version + 1,
            }),
            lease_owner: DEAD_OWNER.into(),
            lease: chrono::TimeDelta::minutes(10),
        })
        .await
        .expect("begin adjust");
        row.operation_id
    }
}
