//! Scheduled passes (a role in `stocksvr all`): [`run`] leases a shard whenever one is due,
//! checks its buckets ([`shard`]) while renewing the lease, and exports the gauges that
//! summarise all shards; the inbox purge runs beside the passes.

mod shard;
mod sightings;

use crate::classify::DifferenceKind;
use crate::queries::differences::confirmed_summary;
use crate::queries::inbox::purge_inbox;
use crate::queries::shards::{claim_shard, ensure_shards, finish_shard, renew_shard};
use crate::{ReconcileError, Reconciler};
use chrono::{TimeDelta, Utc};
use serde::Serialize;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use stocksvr_pipeline::periodic::{self, Cadence, Round};
use stocksvr_telemetry::names;
use tokio::sync::watch;

/// What a scheduled pass over one shard did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PassReport {
    pub shard: u32,
    pub checked: u64,
    /// Checked buckets skipped as unchanged since their last clean check (also consistent).
    pub unchanged: u64,
    /// Checked buckets whose held reservations' fences and op records were read (a full
    /// check: due, never done by any instance, or numbers that differ).
    pub full: u64,
    pub consistent: u64,
    pub not_built: u64,
    pub held_back: u64,
    /// Held back by work in flight seen before their sums, which were not read.
    pub unsummed: u64,
    pub suspected: u64,
    pub confirmed: u64,
    pub lost: u64,
    pub repaired: u64,
    pub reopened: u64,
    /// Another shard was due when this one was leased.
    pub more_due: bool,
}

impl Reconciler {
    /// One scheduled pass: leases a shard due for checking and compares its buckets,
    /// remembering sightings in MySQL. `None` when no shard is due.
    pub async fn pass_once(&self) -> Result<Option<PassReport>, ReconcileError> {
        self.pass_until(None).await
    }

    /// [`Self::pass_once`], given up when `stop` turns true: the shard is handed back due
    /// again after `settle`, as after a failed pass ([`ReconcileError::Stopped`]). A paced
    /// pass over a hot dish's day takes tens of seconds: on SIGTERM the bench's `stocksvr all`
    /// waited for it to the end of its 15 s drain, warned "drain did not finish" and exited
    /// with its shard leased to the dead process for the lease's 120 s. Giving up at
    /// an await point is safe: a pass reads, and each write it makes (a sighting, a repair's
    /// WAL operation) is one that a crash at the same point leaves for the next pass or the
    /// recovery worker to finish.
    pub async fn pass_until(
        &self,
        stop: Option<watch::Receiver<bool>>,
    ) -> Result<Option<PassReport>, ReconcileError> {
        let pool = self.service.pool();
        let interval = TimeDelta::from_std(self.config.interval).unwrap_or(TimeDelta::seconds(60));
        // The shard rows are written once per process, not before every claim: the claims
        // of an idle `stocksvr all` come every few seconds.
        if !self.shards_ensured.load(Ordering::Relaxed) {
            ensure_shards(pool, self.config.shards).await?;
            self.shards_ensured.store(true, Ordering::Relaxed);
        }
        let Some(claim) = claim_shard(
            pool,
            &self.owner,
            self.config.shards,
            self.config.lease,
            interval,
        )
        .await?
        else {
            return Ok(None);
        };
        let shard = claim.shard;
        let result = match stop {
            None => self.pass_leased(shard).await,
            Some(mut stop) => {
                let stopped = async move {
                    // A dropped sender is no stop: the pass runs to its end.
                    if stop.wait_for(|stop| *stop).await.is_err() {
                        std::future::pending::<()>().await;
                    }
                };
                tokio::select! {
                    report = self.pass_leased(shard) => report,
                    () = stopped => Err(ReconcileError::Stopped),
                }
            }
        };
        // A suspicion is looked at again after `settle`, as the on-demand check's second
        // pass is, not a whole interval later: one born of lag (the projector behind) is
        // cleared once the lag is gone, and a real one is confirmed and reported in seconds.
        // A pass that failed checked nothing it could vouch for: the same.
        let recheck = match &result {
            Ok(report) if report.suspected == 0 => None,
            _ => Some(TimeDelta::from_std(self.config.settle).unwrap_or(TimeDelta::seconds(2))),
        };
        finish_shard(pool, shard, &self.owner, recheck).await?;
        let mut report = result?;
        report.more_due = claim.more;
        self.export_gauges(&report).await?;
        Ok(Some(report))
    }

    /// [`Self::pass_shard`] while its lease is renewed every third of the lease: a pass that
    /// outlasts the lease (a paced full check of a bucket with many held reservations) keeps
    /// its shard, so no other instance checks the same buckets at the same time.
    async fn pass_leased(&self, shard: u32) -> Result<PassReport, ReconcileError> {
        let pool = self.service.pool();
        let every = (self.config.lease / 3)
            .to_std()
            .unwrap_or(Duration::from_secs(40))
            .max(Duration::from_millis(100));
        let pass = self.pass_shard(shard);
        tokio::pin!(pass);
        loop {
            tokio::select! {
                report = &mut pass => return report,
                () = tokio::time::sleep(every) => {
                    match renew_shard(pool, shard, &self.owner, self.config.lease).await {
                        Ok(true) => {}
                        // The pass goes on: what it reads and suspects is versioned, and the
                        // other instance's pass is the same check.
                        Ok(false) => tracing::warn!(
                            shard,
                            "reconcile: this pass lost its shard's lease (it ran out while the process stalled); another instance is checking the shard too"
                        ),
                        Err(e) => tracing::warn!(
                            shard,
                            error = %e,
                            "reconcile: renewing the shard's lease failed; trying again in a third of the lease"
                        ),
                    }
                }
            }
        }
    }

    /// The gauges that summarise all shards: read back from MySQL so every instance exports
    /// the same figures (a dashboard takes their max).
    async fn export_gauges(&self, _report: &PassReport) -> Result<(), ReconcileError> {
        let pool = self.service.pool();
        let (by_kind, oldest) = confirmed_summary(pool).await?;
        for kind in DifferenceKind::ALL {
            let n = by_kind
                .iter()
                .find(|(k, _)| k == kind.name())
                .map(|(_, n)| *n)
                .unwrap_or(0);
            metrics::gauge!(names::RECONCILE_DIFFERENCES, "kind" => kind.name()).set(n as f64);
        }
        let age = oldest
            .map(|t| (Utc::now().naive_utc() - t).num_milliseconds() as f64 / 1000.0)
            .unwrap_or(0.0);
        metrics::gauge!(names::RECONCILE_OLDEST_DIFFERENCE_SECONDS).set(age.max(0.0));
        metrics::gauge!(names::BUCKETS_LOST)
            .set(stocksvr_store::baselines::count_lost(pool).await? as f64);
        metrics::gauge!(names::RECONCILE_LAST_PASS_TIMESTAMP_SECONDS)
            .set(Utc::now().timestamp_millis() as f64 / 1000.0);
        Ok(())
    }

    /// Inbox rows past the retention (7 days by default; docs/design.md, "Events, outbox,
    /// inbox, projection"): one batch; returns how many.
    pub async fn purge_inbox_once(&self, batch: u32) -> Result<u64, ReconcileError> {
        if self.config.inbox_retention <= TimeDelta::zero() {
            return Ok(0);
        }
        let before = Utc::now().naive_utc() - self.config.inbox_retention;
        Ok(purge_inbox(self.service.pool(), before, batch).await?)
    }
}

/// Rows one inbox purge statement deletes.
const INBOX_PURGE_BATCH: u32 = 1000;

/// Scheduled passes until `stop`: a shard whenever one is due, the inbox purge beside them.
///
/// After a pass with no other shard due the loop sleeps `interval / shards` (the spacing of
/// the shards' due times) rather than polling the claim every second or two: an idle
/// `stocksvr all` claimed about twice per pass, five statements each time. The inbox purge
/// runs once per `interval` while its batch comes back short (nothing more is past the
/// retention), and at every round, as before, while batches come back full.
pub async fn run(
    reconciler: Arc<Reconciler>,
    stop: watch::Receiver<bool>,
) -> Result<(), ReconcileError> {
    let idle = (reconciler.config.interval / reconciler.config.shards.max(1))
        .max(Duration::from_millis(200));
    let purge_every = reconciler.config.interval;
    let next_purge = Mutex::new(std::time::Instant::now());
    let pass_stop = stop.clone();
    periodic::run(
        "reconciler",
        Cadence::adaptive(idle.min(Duration::from_secs(1)), idle),
        None,
        stop,
        || {
            let reconciler = reconciler.clone();
            let next_purge = &next_purge;
            let pass_stop = pass_stop.clone();
            async move {
                let now = std::time::Instant::now();
                let due = *next_purge.lock().unwrap_or_else(PoisonError::into_inner) <= now;
                if due {
                    let next = match reconciler.purge_inbox_once(INBOX_PURGE_BATCH).await {
                        Ok(n) if n >= u64::from(INBOX_PURGE_BATCH) => now,
                        Ok(_) => now + purge_every,
                        Err(e) => {
                            tracing::warn!(error = %e, "inbox purge failed; retrying");
                            now
                        }
                    };
                    *next_purge.lock().unwrap_or_else(PoisonError::into_inner) = next;
                }
                Ok(match reconciler.pass_until(Some(pass_stop)).await {
                    Ok(Some(report)) => {
                        tracing::debug!(?report, "reconcile pass over a shard");
                        if report.more_due {
                            Round::Partial
                        } else {
                            Round::Idle
                        }
                    }
                    Ok(None) => Round::Empty,
                    Err(ReconcileError::Stopped) => {
                        tracing::info!(
                            "reconcile pass given up at the stop; its shard is due again"
                        );
                        Round::Failed
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "reconcile pass failed; retrying");
                        Round::Failed
                    }
                })
            }
        },
    )
    .await
}
