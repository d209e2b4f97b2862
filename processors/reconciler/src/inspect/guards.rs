//! A full check's read of the fences and op records of a bucket's held reservations: page by
//! page, paced to `guard_reads_per_sec`, and every suspect read again (row first) before it
//! is called missing.

use super::bucket_key;
use crate::queries::guards::{guarded_rows, guarded_rows_by_id, GuardedRow};
use crate::queries::LiveBucket;
use crate::{ReconcileError, Reconciler};
use chrono::{TimeDelta, Utc};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use stocksvr_core::bucket::BucketKey;
use stocksvr_core::codes::{FencePhase, ReservationStatus};
use stocksvr_core::reservation::try_operation_id;
use stocksvr_telemetry::names;

/// Held reservations whose guards go to Redis in one pipelined read; the pacing sleeps
/// between such slices, so even a page of 5,000 is spread over its share of a second
/// instead of arriving as one burst.
const GUARD_SLICE: usize = 500;

/// The time `n` guard reads take at `per_sec` (zero when unpaced).
fn guard_pace(n: usize, per_sec: u32) -> Duration {
    if per_sec == 0 {
        return Duration::ZERO;
    }
    Duration::from_secs_f64(n as f64 / f64::from(per_sec))
}

impl Reconciler {
    /// By bucket, the reservations holding units whose fence is missing or says otherwise,
    /// or whose Try op record is gone while it should still live (op records expire after
    /// the op TTL; a RESERVED fence never does).
    pub(super) async fn missing_records(
        &self,
        buckets: &[LiveBucket],
        ids: &[String],
    ) -> Result<HashMap<String, Vec<u64>>, ReconcileError> {
        let pool = self.service.pool();
        let mut missing: HashMap<String, Vec<u64>> = HashMap::new();
        // Usually one read covers the chunk. A chunk holding more (a hot dish holds a
        // reservation per order of the day) is read page by page, bucket by bucket, so
        // memory stays at one page of rows and Redis replies however big the bucket.
        let limit = self.config.guard_page.max(1);
        let rows = guarded_rows(pool, ids, None, limit + 1).await?;
        if rows.len() <= limit as usize {
            self.check_guards(buckets, &rows, &mut missing).await?;
        } else {
            drop(rows);
            for id in ids {
                let mut after = 0;
                loop {
                    let page = guarded_rows(pool, ids, Some((id, after)), limit).await?;
                    self.check_guards(buckets, &page, &mut missing).await?;
                    match page.last() {
                        Some(last) if page.len() == limit as usize => after = last.id,
                        _ => break,
                    }
                }
            }
        }
        self.read_suspects_again(buckets, missing).await
    }

    /// Of the reservations `missing` names, those whose fence or op record is still not
    /// right when read again, row first, as the first read did. A Confirm, Cancel or Refund
    /// moves Redis first and MySQL a moment later, and a paced full check reads a page of
    /// rows at once and their fences over the next half second (5,000 at 10,000 a second):
    /// a row read before such a step met a fence read after it, a suspected difference
    /// that also made the next pass read the whole bucket again.
    async fn read_suspects_again(
        &self,
        buckets: &[LiveBucket],
        missing: HashMap<String, Vec<u64>>,
    ) -> Result<HashMap<String, Vec<u64>>, ReconcileError> {
        let mut still = HashMap::new();
        let page = self.config.guard_page.max(1) as usize;
        let suspects: usize = missing.values().map(Vec::len).sum();
        self.read_again
            .fetch_add(suspects as u64, Ordering::Relaxed);
        for (bucket, ids) in missing {
            for ids in ids.chunks(page) {
                let rows = guarded_rows_by_id(self.service.pool(), &bucket, ids).await?;
                self.check_guards(buckets, &rows, &mut still).await?;
            }
        }
        Ok(still)
    }

    /// Adds to `missing` the reservations of `rows` whose fence or op record is not right.
    async fn check_guards(
        &self,
        buckets: &[LiveBucket],
        rows: &[GuardedRow],
        missing: &mut HashMap<String, Vec<u64>>,
    ) -> Result<(), ReconcileError> {
        if rows.is_empty() {
            return Ok(());
        }
        let keys: HashMap<&str, BucketKey> = buckets
            .iter()
            .map(|b| (b.stock_bucket_id.as_str(), bucket_key(b)))
            .collect();
        let guards: Vec<(BucketKey, u64, String)> = rows
            .iter()
            .filter_map(|r| {
                keys.get(r.stock_bucket_id.as_str())
                    .map(|k| (*k, r.id, try_operation_id(r.id)))
            })
            .collect();
        let mut found = Vec::with_capacity(guards.len());
        for slice in guards.chunks(GUARD_SLICE) {
            let started = Instant::now();
            found.extend(
                self.service
                    .lua()
                    .read_guards(slice)
                    .await
                    .map_err(|e| ReconcileError::Redis(e.to_string()))?,
            );
            metrics::counter!(names::RECONCILE_GUARDS_READ).increment(slice.len() as u64);
            let rest = guard_pace(slice.len(), self.config.guard_reads_per_sec)
                .saturating_sub(started.elapsed());
            if !rest.is_zero() {
                tokio::time::sleep(rest).await;
            }
        }
        let op_ttl = TimeDelta::from_std(self.service.config().op_ttl).unwrap_or(TimeDelta::MAX);
        let op_window_start = Utc::now().naive_utc() - op_ttl;
        for (r, (fence, op_exists)) in rows.iter().zip(found) {
            let status = u8::try_from(r.status)
                .ok()
                .and_then(ReservationStatus::from_code);
            let phase = if status == Some(ReservationStatus::Confirmed) {
                FencePhase::Confirmed
            } else {
                FencePhase::Reserved
            };
            let fence_right = fence.is_some_and(|f| {
                f.phase == phase && f.quantity == r.quantity && f.refunded == r.refunded_quantity
            });
            let op_due = r.created_at > op_window_start;
            if !fence_right || (op_due && !op_exists) {
                missing
                    .entry(r.stock_bucket_id.clone())
                    .or_default()
                    .push(r.id);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guard_reads_are_paced_to_the_configured_rate() {
        assert_eq!(guard_pace(500, 10_000), Duration::from_millis(50));
        assert_eq!(guard_pace(GUARD_SLICE, 1_000), Duration::from_millis(500));
        // A last, short slice waits only its own share.
        assert_eq!(guard_pace(1, 10_000), Duration::from_micros(100));
        assert_eq!(guard_pace(500, 0), Duration::ZERO, "0 means unpaced");
    }
}
