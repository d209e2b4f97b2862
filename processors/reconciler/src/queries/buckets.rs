//! The live buckets a pass or a command looks at, as the baseline says, read a chunk at a
//! time in id order; the shard of a dish; and the marks a scheduled pass leaves on them (the
//! last clean full check) or reads (the snapshot's version).

use super::in_list;
use chrono::{NaiveDate, NaiveDateTime};
use sqlx::{MySql, MySqlPool, QueryBuilder};
use std::collections::HashMap;
use stocksvr_core::codes::BucketState;
use stocksvr_store::deadline::Deadline;
use stocksvr_store::one_off::OneOff;

/// The shard of a dish: stable across buckets of every day, so one instance checks a dish's
/// days together; computed the same way in SQL ([`live_buckets`] with a shard filter).
pub fn shard_of(merchant_id: u64, dish_id: u64, shards: u32) -> u32 {
    let s = u64::from(shards.max(1));
    (((merchant_id % s) * 31 + dish_id % s) % s) as u32
}

/// A live (not ARCHIVED) bucket as the baseline says.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow, serde::Serialize)]
pub struct LiveBucket {
    pub stock_bucket_id: String,
    pub merchant_id: u64,
    pub dish_id: u64,
    pub stock_date: NaiveDate,
    pub total_stock: i64,
    pub baseline_version: u64,
    pub bucket_status: i8,
    pub lost_at: Option<NaiveDateTime>,
    /// The last clean full check (fences and op records read), by any instance.
    pub full_checked_at: Option<NaiveDateTime>,
}

/// Which buckets a pass or a command looks at.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BucketFilter {
    pub bucket: Option<String>,
    pub merchant_id: Option<u64>,
    pub stock_date: Option<NaiveDate>,
    /// `(shard, shards)`: only the buckets of that shard.
    pub shard: Option<(u32, u32)>,
}

/// The columns of a [`LiveBucket`], from the baseline rows not ARCHIVED.
const LIVE_SELECT: &str = "SELECT stock_bucket_id, merchant_id, dish_id, stock_date, total_stock, \
     baseline_version, bucket_status, lost_at, full_checked_at FROM dish_stock_baseline \
     WHERE bucket_status <> ";

/// Live buckets matching `filter` with ids after `after`, in id order, at most `limit`.
pub async fn live_buckets(
    pool: &MySqlPool,
    filter: &BucketFilter,
    after: Option<&str>,
    limit: u32,
) -> Result<Vec<LiveBucket>, sqlx::Error> {
    let mut q = QueryBuilder::<MySql>::new(LIVE_SELECT);
    q.push_bind(BucketState::Archived.code());
    if let Some(bucket) = &filter.bucket {
        q.push(" AND stock_bucket_id = ").push_bind(bucket.clone());
    }
    if let Some(merchant) = filter.merchant_id {
        q.push(" AND merchant_id = ").push_bind(merchant);
    }
    if let Some(date) = filter.stock_date {
        q.push(" AND stock_date = ").push_bind(date);
    }
    if let Some((shard, shards)) = filter.shard {
        let s = shards.max(1);
        q.push(" AND MOD(MOD(merchant_id, ")
            .push_bind(s)
            .push(") * 31 + MOD(dish_id, ")
            .push_bind(s)
            .push("), ")
            .push_bind(s)
            .push(") = ")
            .push_bind(shard);
    }
    if let Some(after) = after {
        q.push(" AND stock_bucket_id > ")
            .push_bind(after.to_string());
    }
    q.push(" ORDER BY stock_bucket_id LIMIT ").push_bind(limit);
    q.one_off_as().fetch_all(pool).deadline().await
}

/// The live buckets matching a filter, walked a chunk at a time in id order.
pub struct LiveChunks<'f> {
    filter: &'f BucketFilter,
    size: u32,
    after: Option<String>,
    /// The last chunk came back short: there is nothing after it.
    done: bool,
}

impl<'f> LiveChunks<'f> {
    /// Chunks of `size` buckets matching `filter`.
    pub fn new(filter: &'f BucketFilter, size: u32) -> Self {
        Self {
            filter,
            size,
            after: None,
            done: false,
        }
    }

    /// The next chunk; `None` past the last.
    pub async fn next(&mut self, pool: &MySqlPool) -> Result<Option<Vec<LiveBucket>>, sqlx::Error> {
        if self.done {
            return Ok(None);
        }
        let chunk = live_buckets(pool, self.filter, self.after.as_deref(), self.size).await?;
        let Some(last) = chunk.last() else {
            return Ok(None);
        };
        self.after = Some(last.stock_bucket_id.clone());
        self.done = chunk.len() as u32 != self.size;
        Ok(Some(chunk))
    }
}

/// The live buckets among `ids` (one chunk), in id order.
pub async fn live_buckets_by_id(
    pool: &MySqlPool,
    ids: &[String],
) -> Result<Vec<LiveBucket>, sqlx::Error> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let mut q = QueryBuilder::<MySql>::new(LIVE_SELECT);
    q.push_bind(BucketState::Archived.code())
        .push(" AND stock_bucket_id IN ");
    in_list(&mut q, ids);
    q.push(" ORDER BY stock_bucket_id");
    q.one_off_as().fetch_all(pool).deadline().await
}

/// Records that `ids` were found consistent in a full check at `at`, so another instance (or
/// this one after a restart) does not check them in full again before their time.
pub async fn mark_full_checked(
    pool: &MySqlPool,
    ids: &[String],
    at: NaiveDateTime,
) -> Result<(), sqlx::Error> {
    if ids.is_empty() {
        return Ok(());
    }
    let mut q = QueryBuilder::<MySql>::new("UPDATE dish_stock_baseline SET full_checked_at = ");
    q.push_bind(at).push(" WHERE stock_bucket_id IN ");
    in_list(&mut q, ids);
    q.one_off().execute(pool).deadline().await?;
    Ok(())
}

/// The snapshot's Redis version of each of `buckets` that has a snapshot row: one indexed
/// read, how a scheduled pass sees whether the projector booked anything since.
pub async fn snapshot_versions(
    pool: &MySqlPool,
    buckets: &[String],
) -> Result<HashMap<String, u64>, sqlx::Error> {
    if buckets.is_empty() {
        return Ok(HashMap::new());
    }
    let mut q = QueryBuilder::<MySql>::new(
        "SELECT stock_bucket_id, redis_version FROM dish_stock_snapshot WHERE stock_bucket_id IN ",
    );
    in_list(&mut q, buckets);
    let rows: Vec<(String, u64)> = q.one_off_as().fetch_all(pool).deadline().await?;
    Ok(rows.into_iter().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dish_keeps_its_shard_and_shards_cover_every_dish() {
        assert_eq!(shard_of(7, 9, 16), shard_of(7, 9, 16));
        assert!(shard_of(u64::MAX, u64::MAX, 16) < 16);
        assert_eq!(shard_of(5, 5, 1), 0);
        assert_eq!(shard_of(5, 5, 0), 0, "zero shards means one");
        let mut seen = std::collections::HashSet::new();
        for m in 0..64 {
            for d in 0..64 {
                seen.insert(shard_of(m, d, 16));
            }
        }
        assert_eq!(seen.len(), 16);
    }
}
