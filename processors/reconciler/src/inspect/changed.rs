//! A scheduled pass's inspection of one chunk: only the buckets that moved since their last
//! clean check, and the fences and op records of held reservations only when a bucket is due
//! a full check (or its numbers differ). What a bucket looked like when found clean is kept
//! per instance ([`CleanMark`]), the time of its last clean full check in MySQL as well.

use super::Inspection;
use crate::classify::Verdict;
use crate::queries::buckets::{mark_full_checked, snapshot_versions};
use crate::queries::LiveBucket;
use crate::{ReconcileError, Reconciler};
use chrono::{NaiveDateTime, TimeDelta};
use std::collections::{HashMap, HashSet};
use std::sync::PoisonError;
use std::time::{Duration, Instant};
use stocksvr_store::lua::StockNumbers;

/// What a scheduled pass compares to decide that nothing touched a bucket since its last
/// clean check: every Lua step that moves a number bumps the Redis hash's version (and its
/// `updated_at_ms`), the projector moves the snapshot's version with every booking, and a
/// close or a baseline change moves the baseline row.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    redis: Option<StockNumbers>,
    snapshot_version: Option<u64>,
    baseline: (u64, i8, i64),
}

#[derive(Debug, Clone)]
pub(crate) struct CleanMark {
    seen: Seen,
    /// When the fences and op records of its held reservations were last read.
    full_at: Instant,
}

/// Buckets remembered as clean per instance (about 200 bytes each); beyond this, the rest
/// are checked at every pass as if never seen, which costs time, not correctness.
const MAX_CLEAN_MARKS: usize = 100_000;

/// A chunk sorted by what its buckets need: skipped as unchanged, compared, or checked in
/// full.
#[derive(Default)]
struct Sorted {
    /// The buckets to inspect, with the stock hashes they are inspected on.
    todo: Vec<LiveBucket>,
    todo_redis: Vec<Option<StockNumbers>>,
    /// What each bucket to inspect looks like now.
    seen: HashMap<String, Seen>,
    /// The buckets checked in full now.
    full: HashSet<String>,
    /// The last full check of a bucket not checked in full now, by whichever instance.
    full_before: HashMap<String, Instant>,
    /// Buckets skipped: unchanged since their last clean check.
    unchanged: u64,
}

impl Reconciler {
    /// A scheduled pass's view of one chunk: the inspections of the buckets that moved since
    /// their last clean check (or are due a full one), and how many did not move.
    ///
    /// A bucket nothing touched is skipped: reading its held reservations' fences and op
    /// records would cost one Redis read per reservation at every pass, however idle the
    /// service (it was most of the idle CPU). A bucket that moved has its numbers compared;
    /// its fences and op records are read at most every `full_check`, or at once when its
    /// numbers differ, so a repair always knows which records to restore. The time of the last
    /// clean full check is kept in MySQL too (`full_checked_at`), so a restarted instance,
    /// or one that takes over a shard, does not read every held reservation again at once.
    /// Returns the inspections, the buckets skipped as unchanged and the full checks made.
    pub(crate) async fn inspect_changed(
        &self,
        chunk: Vec<LiveBucket>,
    ) -> Result<(Vec<Inspection>, u64, u64), ReconcileError> {
        let every = self.config.full_check;
        if every.is_zero() {
            let n = chunk.len() as u64;
            return Ok((self.inspect(chunk).await?, 0, n));
        }
        // Read once: the hashes of the buckets that moved are the ones they are inspected on.
        let redis = self.read_redis(&chunk).await?;
        let ids: Vec<String> = chunk.iter().map(|b| b.stock_bucket_id.clone()).collect();
        let snapshots = snapshot_versions(self.service.pool(), &ids).await?;
        let now = Instant::now();
        let wall_now = stocksvr_store::clock::now();
        let mut sorted = self.sort_chunk(chunk, redis, &snapshots, every, now, wall_now);
        let full = &sorted.full;
        let mut inspections = self
            .inspect_with(
                std::mem::take(&mut sorted.todo),
                std::mem::take(&mut sorted.todo_redis),
                &|id| full.contains(id),
                true,
            )
            .await?;
        self.redo_in_full(&mut inspections, &mut sorted.full)
            .await?;
        let clean_in_full = self.remember(&inspections, &mut sorted, now);
        mark_full_checked(self.service.pool(), &clean_in_full, wall_now).await?;
        Ok((inspections, sorted.unchanged, sorted.full.len() as u64))
    }

    /// Sorts `chunk` (with its stock hashes `redis`) by the marks of its last clean checks.
    fn sort_chunk(
        &self,
        chunk: Vec<LiveBucket>,
        redis: Vec<Option<StockNumbers>>,
        snapshots: &HashMap<String, u64>,
        every: Duration,
        now: Instant,
        wall_now: NaiveDateTime,
    ) -> Sorted {
        let mut sorted = Sorted::default();
        let clean = self.clean.lock().unwrap_or_else(PoisonError::into_inner);
        for (bucket, numbers) in chunk.into_iter().zip(redis) {
            let id = bucket.stock_bucket_id.clone();
            let now_seen = Seen {
                redis: numbers.clone(),
                snapshot_version: snapshots.get(&id).copied(),
                baseline: (
                    bucket.baseline_version,
                    bucket.bucket_status,
                    bucket.total_stock,
                ),
            };
            let mark = clean.get(&id);
            // A clock behind the writer's reads a mark from the future as just made.
            let persisted = bucket
                .full_checked_at
                .and_then(|at| (wall_now - at).max(TimeDelta::zero()).to_std().ok())
                .and_then(|age| now.checked_sub(age));
            match mark.map(|m| m.full_at).max(persisted) {
                Some(full_at) if now.duration_since(full_at) < every => {
                    if mark.is_some_and(|m| m.seen == now_seen) && bucket.lost_at.is_none() {
                        sorted.unchanged += 1;
                        continue;
                    }
                    sorted.full_before.insert(id.clone(), full_at);
                }
                _ => {
                    sorted.full.insert(id.clone());
                }
            }
            sorted.seen.insert(id, now_seen);
            sorted.todo.push(bucket);
            sorted.todo_redis.push(numbers);
        }
        sorted
    }

    /// Inspects again in full the buckets compared without their fences and op records
    /// whose numbers differ or that look lost, so a repair knows which records to restore.
    async fn redo_in_full(
        &self,
        inspections: &mut [Inspection],
        full: &mut HashSet<String>,
    ) -> Result<(), ReconcileError> {
        let again: Vec<LiveBucket> = inspections
            .iter()
            .filter(|i| {
                !full.contains(&i.bucket.stock_bucket_id)
                    && matches!(i.verdict, Verdict::Differs(_) | Verdict::Lost)
            })
            .map(|i| i.bucket.clone())
            .collect();
        if again.is_empty() {
            return Ok(());
        }
        for redone in self.inspect(again).await? {
            full.insert(redone.bucket.stock_bucket_id.clone());
            if let Some(slot) = inspections
                .iter_mut()
                .find(|i| i.bucket.stock_bucket_id == redone.bucket.stock_bucket_id)
            {
                *slot = redone;
            }
        }
        Ok(())
    }

    /// Remembers the buckets found clean (and forgets the others); returns those whose full
    /// check found them clean, to be marked in MySQL.
    fn remember(
        &self,
        inspections: &[Inspection],
        sorted: &mut Sorted,
        now: Instant,
    ) -> Vec<String> {
        let mut clean_in_full = Vec::new();
        // The guard is dropped before the caller's next await (the future is sent between
        // threads).
        let mut clean = self.clean.lock().unwrap_or_else(PoisonError::into_inner);
        for i in inspections {
            let id = &i.bucket.stock_bucket_id;
            let full = sorted.full.contains(id);
            // A full check held back by work in flight read every fence and op record
            // all the same, and found them right: it counts as the bucket's full check
            // (its numbers are compared again at the next pass). Before, it did not,
            // and a bucket always taking Trys was read in full at every pass.
            if full
                && matches!(i.verdict, Verdict::HeldBack(_))
                && i.views.redis.is_some()
                && i.views.records_missing.is_empty()
                && i.bucket.lost_at.is_none()
            {
                clean_in_full.push(id.clone());
            }
            let mark = match (&i.verdict, sorted.seen.remove(id)) {
                (Verdict::Consistent, Some(seen)) if i.bucket.lost_at.is_none() => {
                    let full_at = if full {
                        clean_in_full.push(id.clone());
                        now
                    } else {
                        sorted.full_before.get(id).copied().unwrap_or(now)
                    };
                    Some(CleanMark { seen, full_at })
                }
                _ => None,
            };
            match mark {
                Some(mark) if clean.contains_key(id) || clean.len() < MAX_CLEAN_MARKS => {
                    clean.insert(id.clone(), mark);
                }
                Some(_) => {}
                None => {
                    clean.remove(id);
                }
            }
        }
        clean_in_full
    }
}
