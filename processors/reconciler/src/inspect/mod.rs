//! Inspection: every view of a chunk of buckets (Redis, then MySQL's sums, snapshot and work
//! in flight, and for a full check the fences and op records of held reservations), each
//! bucket judged by [`crate::classify`].

mod changed;
mod guards;

pub(crate) use changed::CleanMark;

use crate::classify::{classify, BucketViews, DifferenceKind, InFlight, Verdict};
use crate::queries::buckets::LiveChunks;
use crate::queries::{BucketFilter, LiveBucket};
use crate::{ReconcileError, Reconciler};
use serde::Serialize;
use std::collections::{HashMap, HashSet};
use stocksvr_core::bucket::BucketKey;
use stocksvr_store::bucket_views::{mysql_views_of, InFlightCounts, MysqlViews};
use stocksvr_store::lua::{StockNumbers, TargetNumbers};

/// One bucket as inspected: its baseline, its views and the verdict.
#[derive(Debug, Clone, Serialize)]
pub struct Inspection {
    pub bucket: LiveBucket,
    pub views: BucketViews,
    pub verdict: Verdict,
}

impl Inspection {
    pub(crate) fn kinds(&self) -> Vec<DifferenceKind> {
        match &self.verdict {
            Verdict::Differs(kinds) => kinds.clone(),
            _ => Vec::new(),
        }
    }

    pub(crate) fn version(&self) -> u64 {
        self.views.redis.map(|r| r.version).unwrap_or(0)
    }
}

/// The Redis keys of a live bucket.
pub(crate) fn bucket_key(b: &LiveBucket) -> BucketKey {
    BucketKey::new(b.merchant_id, b.dish_id, b.stock_date)
}

impl Reconciler {
    /// Reads every view of `buckets` (one chunk) and judges each.
    pub async fn inspect(
        &self,
        buckets: Vec<LiveBucket>,
    ) -> Result<Vec<Inspection>, ReconcileError> {
        let redis = self.read_redis(&buckets).await?;
        self.inspect_with(buckets, redis, &|_| true, false).await
    }

    /// The stock hashes of `buckets`, in their order (`None`: no key).
    async fn read_redis(
        &self,
        buckets: &[LiveBucket],
    ) -> Result<Vec<Option<StockNumbers>>, ReconcileError> {
        let keys: Vec<BucketKey> = buckets.iter().map(bucket_key).collect();
        self.read_keys(&keys).await
    }

    async fn read_keys(
        &self,
        keys: &[BucketKey],
    ) -> Result<Vec<Option<StockNumbers>>, ReconcileError> {
        self.service
            .lua()
            .read_buckets(keys)
            .await
            .map_err(|e| ReconcileError::Redis(e.to_string()))
    }

    /// [`Self::inspect`] on the stock hashes `redis` already read (one per bucket), reading
    /// the fences and op records of held reservations only for the buckets `full` names
    /// (the numbers of every bucket are compared either way). With `skip_busy`, a bucket
    /// whose work in flight shows first is not summed ([`mysql_views_of`]): its verdict is
    /// "held back" all the same. A bucket without a stock hash is always summed, as its
    /// verdict does not rest on work in flight.
    async fn inspect_with(
        &self,
        buckets: Vec<LiveBucket>,
        mut redis: Vec<Option<StockNumbers>>,
        full: &(dyn Fn(&str) -> bool + Sync),
        skip_busy: bool,
    ) -> Result<Vec<Inspection>, ReconcileError> {
        let ids: Vec<String> = buckets.iter().map(|b| b.stock_bucket_id.clone()).collect();
        let hashed: HashSet<&str> = ids
            .iter()
            .zip(&redis)
            .filter(|(_, numbers)| numbers.is_some())
            .map(|(id, _)| id.as_str())
            .collect();
        // Redis first (the caller read it), then MySQL: a step that completes in between
        // shows in MySQL as done and in Redis as not yet, which the two-pass rule (same
        // version twice) absorbs; the other order could pair a newer Redis with an older
        // MySQL just the same.
        let mysql = mysql_views_of(self.service.pool(), &ids, &|id| {
            skip_busy && hashed.contains(id)
        })
        .await?;
        let just_built = self
            .read_unhashed_again(&buckets, &mut redis, &mysql)
            .await?;
        // A bucket without a stock hash has no fences to compare (its records are not
        // looked at; it is lost or not built): reading them would find every one missing,
        // and read each again.
        let guarded: Vec<String> = ids
            .iter()
            .zip(&redis)
            .filter(|(id, numbers)| numbers.is_some() && full(id))
            .map(|(id, _)| id.clone())
            .collect();
        let missing = self.missing_records(&buckets, &guarded).await?;
        Ok(buckets
            .into_iter()
            .zip(redis)
            .map(|(bucket, redis)| {
                let id = bucket.stock_bucket_id.as_str();
                let views = views_of(
                    id,
                    &bucket,
                    redis,
                    &mysql,
                    &missing,
                    just_built.contains(id),
                );
                let verdict = classify(&views);
                Inspection {
                    bucket,
                    views,
                    verdict,
                }
            })
            .collect())
    }

    /// Redis was read before MySQL, so a bucket built in between looks lost (no key, an init
    /// that succeeded): reads those keys again before anyone calls them lost. Puts what it
    /// finds into `redis` and returns the buckets that turned out just built.
    async fn read_unhashed_again(
        &self,
        buckets: &[LiveBucket],
        redis: &mut [Option<StockNumbers>],
        mysql: &MysqlViews,
    ) -> Result<HashSet<String>, ReconcileError> {
        let suspects: Vec<usize> = (0..buckets.len())
            .filter(|&i| {
                redis[i].is_none()
                    && mysql
                        .built
                        .get(&buckets[i].stock_bucket_id)
                        .copied()
                        .unwrap_or(false)
            })
            .collect();
        let mut just_built = HashSet::new();
        if suspects.is_empty() {
            return Ok(just_built);
        }
        let keys: Vec<BucketKey> = suspects.iter().map(|&i| bucket_key(&buckets[i])).collect();
        let again = self.read_keys(&keys).await?;
        for (&i, now) in suspects.iter().zip(again) {
            if now.is_some() {
                just_built.insert(buckets[i].stock_bucket_id.clone());
                redis[i] = now;
            }
        }
        Ok(just_built)
    }

    /// Every live bucket matching `filter`, inspected chunk by chunk; `progress` hears the
    /// running count.
    pub async fn inspect_all(
        &self,
        filter: &BucketFilter,
        progress: &(dyn Fn(usize) + Sync),
    ) -> Result<Vec<Inspection>, ReconcileError> {
        let mut out = Vec::new();
        let mut chunks = LiveChunks::new(filter, self.config.chunk);
        while let Some(chunk) = chunks.next(self.service.pool()).await? {
            out.extend(self.inspect(chunk).await?);
            progress(out.len());
        }
        Ok(out)
    }
}

/// The views of one bucket: its stock hash `redis`, what MySQL says of it, and the
/// reservations whose records Redis lacks.
fn views_of(
    id: &str,
    bucket: &LiveBucket,
    redis: Option<StockNumbers>,
    mysql: &MysqlViews,
    missing: &HashMap<String, Vec<u64>>,
    just_built: bool,
) -> BucketViews {
    let r = mysql.reservations.get(id).copied().unwrap_or_default();
    BucketViews {
        bucket: id.to_string(),
        redis: redis.as_ref().map(Into::into),
        expected: TargetNumbers::from_accepted(bucket.total_stock, r.reserved, r.sold),
        ledger: mysql.ledger.get(id).copied().unwrap_or_default().into(),
        snapshot: mysql.snapshots.get(id).copied(),
        in_flight: in_flight(mysql.in_flight(id), just_built),
        built: mysql.built.get(id).copied().unwrap_or(false),
        marked_lost: bucket.lost_at.is_some(),
        records_missing: if redis.is_some() {
            missing.get(id).cloned().unwrap_or_default()
        } else {
            Vec::new()
        },
        sums_skipped: mysql.unsummed.contains(id),
    }
}

/// The work in flight that holds a bucket back; one built between the reads of Redis and
/// MySQL counts as a stock operation in flight.
fn in_flight(counts: InFlightCounts, just_built: bool) -> Vec<InFlight> {
    let mut in_flight = Vec::new();
    if just_built {
        in_flight.push(InFlight::StockOperations(1));
    }
    for (n, what) in [
        (
            counts.reservations,
            InFlight::Reservations as fn(i64) -> InFlight,
        ),
        (counts.stock_operations, InFlight::StockOperations),
        (counts.dead_operations, InFlight::DeadOperations),
        (counts.outbox, InFlight::Outbox),
        (counts.projection, InFlight::Projection),
    ] {
        if n > 0 {
            in_flight.push(what(n));
        }
    }
    in_flight
}

/// One line per difference with all three views.
pub(crate) fn log_difference(i: &Inspection, kind: DifferenceKind) {
    let v = &i.views;
    let redis = v
        .redis
        .map(|r| {
            format!(
                "total={} available={} reserved={} sold={} deficit={} v{}",
                r.total, r.available, r.reserved, r.sold, r.deficit, r.version
            )
        })
        .unwrap_or_else(|| "missing".into());
    let e = v.expected;
    let l = v.ledger;
    tracing::error!(
        bucket = %i.bucket.stock_bucket_id,
        kind = kind.name(),
        redis = %redis,
        reservations = %format!("total={} available={} reserved={} sold={} deficit={}", e.total, e.available, e.reserved, e.sold, e.deficit),
        ledger = %format!("total={} available={} reserved={} sold={} deficit={} rows={}", l.total, l.available, l.reserved, l.sold, l.deficit, l.rows),
        snapshot = %v.snapshot.map(|s| format!("total={} available={} reserved={} sold={} deficit={} v{}", s.total, s.available, s.reserved, s.sold, s.deficit, s.redis_version)).unwrap_or_else(|| "missing".into()),
        "reconcile difference"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_in_flight_is_listed_by_kind_and_a_bucket_just_built_counts_as_an_operation() {
        let counts = InFlightCounts {
            reservations: 2,
            stock_operations: 0,
            dead_operations: 1,
            outbox: 0,
            projection: 3,
        };
        assert_eq!(
            in_flight(counts, false),
            [
                InFlight::Reservations(2),
                InFlight::DeadOperations(1),
                InFlight::Projection(3)
            ]
        );
        assert_eq!(
            in_flight(InFlightCounts::default(), true),
            [InFlight::StockOperations(1)],
            "built between the reads of Redis and MySQL: held back, not lost"
        );
        assert!(in_flight(InFlightCounts::default(), false).is_empty());
    }
}
