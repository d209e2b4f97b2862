//! The differences scheduled passes have seen (`inventory_reconcile_difference`): a first
//! sighting is SUSPECTED at a Redis version, seen again at the same version it is CONFIRMED,
//! and once the bucket agrees again it is RESOLVED. Their memory across passes and instances.

use super::in_list;
use chrono::NaiveDateTime;
use sqlx::mysql::MySqlArguments;
use sqlx::query::Query;
use sqlx::{MySql, MySqlPool, QueryBuilder};
use stocksvr_core::codes::{DifferenceStatus, StoredCode};
use stocksvr_store::clock::now;
use stocksvr_store::deadline::Deadline;
use stocksvr_store::one_off::{in_list_of, OneOff};

/// A difference still open: suspected, or confirmed and not resolved yet.
const OPEN: [DifferenceStatus; 2] = [DifferenceStatus::Suspected, DifferenceStatus::Confirmed];

/// An open (suspected or confirmed) difference.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct OpenDifference {
    pub id: u64,
    pub stock_bucket_id: String,
    pub kind: String,
    pub redis_version: u64,
    pub status: i8,
    pub repair_operation_id: Option<String>,
    pub first_seen_at: NaiveDateTime,
    pub confirmed_at: Option<NaiveDateTime>,
}

impl OpenDifference {
    /// Its status; `None` for a code no version of stocksvr wrote.
    pub fn status(&self) -> Option<DifferenceStatus> {
        DifferenceStatus::from_code(self.status)
    }
}

/// The open differences of `buckets`.
pub async fn open_differences(
    pool: &MySqlPool,
    buckets: &[String],
) -> Result<Vec<OpenDifference>, sqlx::Error> {
    if buckets.is_empty() {
        return Ok(Vec::new());
    }
    let mut q = QueryBuilder::<MySql>::new(
        "SELECT id, stock_bucket_id, kind, redis_version, status, repair_operation_id, \
         first_seen_at, confirmed_at FROM inventory_reconcile_difference WHERE status IN ",
    );
    in_list_of(&mut q, DifferenceStatus::codes(&OPEN));
    q.push(" AND stock_bucket_id IN ");
    in_list(&mut q, buckets);
    q.push(" ORDER BY id");
    q.one_off_as().fetch_all(pool).deadline().await
}

/// A first sighting: SUSPECTED at `version`.
pub async fn suspect(
    pool: &MySqlPool,
    bucket: &str,
    kind: &str,
    version: u64,
    views: &serde_json::Value,
) -> Result<(), sqlx::Error> {
    let now = now();
    sqlx::query(
        "INSERT INTO inventory_reconcile_difference (stock_bucket_id, kind, redis_version, status, \
         views, first_seen_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(bucket)
    .bind(kind)
    .bind(version)
    .bind(DifferenceStatus::Suspected.code())
    .bind(views)
    .bind(now)
    .bind(now)
    .execute(pool)
    .deadline()
    .await?;
    Ok(())
}

/// Seen again at another version: the sighting starts over there.
pub async fn resuspect(
    pool: &MySqlPool,
    id: u64,
    version: u64,
    views: &serde_json::Value,
) -> Result<(), sqlx::Error> {
    let now = now();
    let update = sqlx::query(
        "UPDATE inventory_reconcile_difference SET status = ?, redis_version = ?, views = ?, \
         first_seen_at = ?, confirmed_at = NULL, updated_at = ? WHERE id = ? AND status IN (?, ?)",
    )
    .bind(DifferenceStatus::Suspected.code())
    .bind(version)
    .bind(views)
    .bind(now)
    .bind(now)
    .bind(id);
    update_open(pool, update).await
}

/// Seen twice at the same version with nothing in flight: CONFIRMED. True when this call
/// confirmed it (not an earlier pass).
pub async fn confirm(
    pool: &MySqlPool,
    id: u64,
    views: &serde_json::Value,
) -> Result<bool, sqlx::Error> {
    let now = now();
    let done = sqlx::query(
        "UPDATE inventory_reconcile_difference SET status = ?, views = ?, confirmed_at = ?, \
         updated_at = ? WHERE id = ? AND status = ?",
    )
    .bind(DifferenceStatus::Confirmed.code())
    .bind(views)
    .bind(now)
    .bind(now)
    .bind(id)
    .bind(DifferenceStatus::Suspected.code())
    .execute(pool)
    .deadline()
    .await?;
    Ok(done.rows_affected() == 1)
}

/// The bucket agrees again (repaired, or it was transient): the difference is resolved.
pub async fn resolve(pool: &MySqlPool, id: u64) -> Result<(), sqlx::Error> {
    let now = now();
    let update = sqlx::query(
        "UPDATE inventory_reconcile_difference SET status = ?, resolved_at = ?, updated_at = ? \
         WHERE id = ? AND status IN (?, ?)",
    )
    .bind(DifferenceStatus::Resolved.code())
    .bind(now)
    .bind(now)
    .bind(id);
    update_open(pool, update).await
}

/// Runs `update`, whose statement ends `AND status IN (?, ?)` with everything before bound,
/// on a difference still open: a resolved one is history and stays as it is.
async fn update_open(
    pool: &MySqlPool,
    update: Query<'_, MySql, MySqlArguments>,
) -> Result<(), sqlx::Error> {
    update
        .bind(OPEN[0].code())
        .bind(OPEN[1].code())
        .execute(pool)
        .deadline()
        .await?;
    Ok(())
}

/// Records the repair operation that answers a confirmed difference.
pub async fn set_repair(pool: &MySqlPool, id: u64, operation_id: &str) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE inventory_reconcile_difference SET repair_operation_id = ?, updated_at = ? WHERE id = ?",
    )
    .bind(operation_id)
    .bind(now())
    .bind(id)
    .execute(pool)
    .deadline()
    .await?;
    Ok(())
}

/// Confirmed differences by kind, and the confirmation time of the oldest one: the gauges.
pub async fn confirmed_summary(
    pool: &MySqlPool,
) -> Result<(Vec<(String, i64)>, Option<NaiveDateTime>), sqlx::Error> {
    let by_kind: Vec<(String, i64)> = sqlx::query_as(
        "SELECT kind, COUNT(*) FROM inventory_reconcile_difference WHERE status = ? GROUP BY kind",
    )
    .bind(DifferenceStatus::Confirmed.code())
    .fetch_all(pool)
    .deadline()
    .await?;
    let (oldest,): (Option<NaiveDateTime>,) = sqlx::query_as(
        "SELECT MIN(confirmed_at) FROM inventory_reconcile_difference WHERE status = ?",
    )
    .bind(DifferenceStatus::Confirmed.code())
    .fetch_one(pool)
    .deadline()
    .await?;
    Ok((by_kind, oldest))
}
