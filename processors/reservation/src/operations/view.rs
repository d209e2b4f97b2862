//! Stock operations and buckets as operators see them (admin API and CLI).

use super::*;
use stocksvr_core::codes::StockStatus;

/// A WAL row as operators and the admin API see it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WalView {
    pub id: u64,
    pub operation_id: String,
    pub stock_bucket_id: String,
    pub action: &'static str,
    pub status: &'static str,
    pub retry_count: u32,
    pub next_retry_at: String,
    pub lease_owner: Option<String>,
    pub lease_expire_at: Option<String>,
    pub last_error: Option<String>,
    pub request: serde_json::Value,
    pub result: Option<serde_json::Value>,
    pub created_at: String,
    pub updated_at: String,
}

pub(super) fn ts(t: NaiveDateTime) -> String {
    t.and_utc()
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

pub(super) fn parse_json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or(serde_json::Value::String(text.to_string()))
}

impl WalView {
    pub fn from_row(r: &WalRow) -> Self {
        Self {
            id: r.id,
            operation_id: r.operation_id.clone(),
            stock_bucket_id: r.stock_bucket_id.clone(),
            action: r.action().map(WalAction::name).unwrap_or("UNKNOWN"),
            status: r.status().map(WalStatus::name).unwrap_or("UNKNOWN"),
            retry_count: r.retry_count,
            next_retry_at: ts(r.next_retry_at),
            lease_owner: r.lease_owner.clone(),
            lease_expire_at: r.lease_expire_at.map(ts),
            last_error: r.last_error.clone(),
            request: parse_json(&r.request_payload),
            result: r.result_payload.as_deref().map(parse_json),
            created_at: ts(r.created_at),
            updated_at: ts(r.updated_at),
        }
    }

    pub fn succeeded(&self) -> bool {
        self.status == WalStatus::Succeeded.name()
    }
}

/// One bucket as an operator needs to see it: the baseline, Redis (the truth for what can be
/// sold) next to the snapshot the projector built, and its recent stock operations.
#[derive(Debug, Clone, Serialize)]
pub struct BucketReport {
    pub stock_bucket_id: String,
    pub baseline: Option<BaselineView>,
    pub redis: Option<RedisView>,
    pub snapshot: Option<SnapshotView>,
    pub open_reservations: i64,
    pub operations: Vec<WalView>,
}

#[derive(Debug, Clone, Serialize)]
pub struct BaselineView {
    pub merchant_id: u64,
    pub dish_id: u64,
    pub stock_date: String,
    pub timezone: String,
    pub total_stock: i64,
    pub baseline_version: u64,
    pub stock_enabled: bool,
    pub bucket_status: &'static str,
}

#[derive(Debug, Clone, Serialize)]
pub struct RedisView {
    pub state: &'static str,
    pub total: i64,
    pub available: i64,
    pub reserved: i64,
    pub sold: i64,
    pub deficit: i64,
    pub version: u64,
    pub baseline_version: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct SnapshotView {
    pub total: i64,
    pub available: i64,
    pub reserved: i64,
    pub sold: i64,
    pub deficit: i64,
    pub redis_version: u64,
    pub updated_at: String,
}

impl StockOps {
    /// Baseline, Redis and snapshot of one bucket side by side.
    pub async fn show_bucket(&self, bucket_id: &str) -> Result<BucketReport, OpsError> {
        let key = bucket::parse_bucket_id(bucket_id).map_err(|e| OpsError::Invalid {
            field: "stock_bucket_id",
            message: e.to_string(),
        })?;
        let baseline = stocksvr_store::baselines::find_baseline(&self.pool, bucket_id).await?;
        let keys = key;
        let redis = self
            .lua
            .read_bucket(&keys)
            .await
            .map_err(|e| OpsError::Redis(e.to_string()))?;
        let snapshot = buckets::find_snapshot(&self.pool, bucket_id).await?;
        let open = buckets::count_open_reservations(&self.pool, bucket_id).await?;
        let operations = self.list(&[], Some(bucket_id), 50).await?;
        Ok(BucketReport {
            stock_bucket_id: bucket_id.to_string(),
            baseline: baseline.map(|b| BaselineView {
                merchant_id: b.merchant_id,
                dish_id: b.dish_id,
                stock_date: b.stock_date.to_string(),
                total_stock: b.total_stock,
                baseline_version: b.baseline_version,
                stock_enabled: StockStatus::from_code(b.stock_status) == Some(StockStatus::Enabled),
                bucket_status: b.state().map_or("UNKNOWN", BucketState::name),
                timezone: b.timezone,
            }),
            redis: redis.map(|r| RedisView {
                state: r.state.name(),
                total: r.total,
                available: r.available,
                reserved: r.reserved,
                sold: r.sold,
                deficit: r.deficit,
                version: r.version,
                baseline_version: r.baseline_version,
            }),
            snapshot: snapshot.map(|s| SnapshotView {
                total: s.total_stock,
                available: s.available_stock,
                reserved: s.reserved_stock,
                sold: s.sold_stock,
                deficit: s.deficit_stock,
                redis_version: s.redis_version,
                updated_at: ts(s.updated_at),
            }),
            open_reservations: open,
            operations,
        })
    }
}
