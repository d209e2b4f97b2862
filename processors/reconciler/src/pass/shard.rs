//! One scheduled pass over a leased shard: its live buckets a chunk at a time, the ones that
//! moved inspected, and each verdict acted on: a consistent bucket's open differences
//! resolved (and a rebuilt one reopened), a lost bucket marked (and rebuilt with
//! `auto_repair`), a difference remembered as a sighting ([`super::sightings`]).

use super::PassReport;
use crate::classify::Verdict;
use crate::inspect::Inspection;
use crate::queries::buckets::LiveChunks;
use crate::queries::differences::{open_differences, resolve, OpenDifference};
use crate::queries::{BucketFilter, LiveBucket};
use crate::{ReconcileError, Reconciler};
use std::collections::HashMap;
use stocksvr_store::baselines::clear_lost;
use stocksvr_telemetry::names;

/// What one pass over a shard carries from chunk to chunk.
pub(super) struct ShardPass {
    pub(super) report: PassReport,
    /// Repairs and rebuilds this pass may still start.
    pub(super) budget: u32,
    /// Buckets with an open difference held back, by why (the held-back gauge).
    pub(super) held: HashMap<&'static str, i64>,
}

impl ShardPass {
    /// Takes one repair or rebuild from the budget, when `auto_repair` allows any.
    pub(super) fn may_repair(&mut self, auto_repair: bool) -> bool {
        if auto_repair && self.budget > 0 {
            self.budget -= 1;
            true
        } else {
            false
        }
    }

    /// The pass's metrics: held back by reason, buckets checked, and the consistent ratio.
    fn export(&self) {
        for reason in ["in_flight", "version_moved", "first_sighting"] {
            metrics::gauge!(names::RECONCILE_HELD_BACK, "reason" => reason)
                .set(self.held.get(reason).copied().unwrap_or(0) as f64);
        }
        let report = &self.report;
        metrics::counter!(names::RECONCILE_BUCKETS_CHECKED).increment(report.checked);
        let judged = report.checked - report.not_built;
        let ratio = if judged == 0 {
            1.0
        } else {
            report.consistent as f64 / judged as f64
        };
        metrics::gauge!(names::RECONCILE_CONSISTENT_RATIO).set(ratio);
    }
}

impl Reconciler {
    pub(super) async fn pass_shard(&self, shard: u32) -> Result<PassReport, ReconcileError> {
        let filter = BucketFilter {
            shard: Some((shard, self.config.shards)),
            ..BucketFilter::default()
        };
        let mut pass = ShardPass {
            report: PassReport {
                shard,
                ..PassReport::default()
            },
            budget: self.config.max_repairs_per_pass,
            held: HashMap::new(),
        };
        let mut chunks = LiveChunks::new(&filter, self.config.chunk);
        while let Some(chunk) = chunks.next(self.service.pool()).await? {
            self.pass_chunk(chunk, &mut pass).await?;
        }
        pass.export();
        Ok(pass.report)
    }

    /// Inspects the buckets of `chunk` that moved and acts on each verdict.
    async fn pass_chunk(
        &self,
        chunk: Vec<LiveBucket>,
        pass: &mut ShardPass,
    ) -> Result<(), ReconcileError> {
        let ids: Vec<String> = chunk.iter().map(|b| b.stock_bucket_id.clone()).collect();
        let (inspections, unchanged, full_checks) = self.inspect_changed(chunk).await?;
        let report = &mut pass.report;
        report.full += full_checks;
        report.checked += unchanged;
        report.consistent += unchanged;
        report.unchanged += unchanged;
        let open = open_differences(self.service.pool(), &ids).await?;
        for i in inspections {
            pass.report.checked += 1;
            let mine: Vec<&OpenDifference> = open
                .iter()
                .filter(|d| d.stock_bucket_id == i.bucket.stock_bucket_id)
                .collect();
            match &i.verdict {
                Verdict::Consistent | Verdict::NotBuilt => self.settled(&i, &mine, pass).await?,
                Verdict::HeldBack(reasons) => {
                    pass.report.held_back += 1;
                    pass.report.unsummed += u64::from(i.views.sums_skipped);
                    if !mine.is_empty() {
                        *pass.held.entry("in_flight").or_default() += 1;
                    }
                    tracing::debug!(bucket = %i.bucket.stock_bucket_id, reasons = ?reasons, "held back: work in flight");
                }
                Verdict::Lost => self.lost(&i, pass).await?,
                Verdict::Differs(kinds) => self.differs(&i, kinds, &mine, pass).await?,
            }
        }
        Ok(())
    }

    /// A bucket consistent (or not built): its open differences are resolved, and a rebuilt
    /// bucket found consistent takes Trys again.
    async fn settled(
        &self,
        i: &Inspection,
        mine: &[&OpenDifference],
        pass: &mut ShardPass,
    ) -> Result<(), ReconcileError> {
        let pool = self.service.pool();
        let id = &i.bucket.stock_bucket_id;
        if i.verdict == Verdict::Consistent {
            pass.report.consistent += 1;
        } else {
            pass.report.not_built += 1;
        }
        for d in mine {
            resolve(pool, d.id).await?;
        }
        if i.bucket.lost_at.is_some()
            && i.verdict == Verdict::Consistent
            && clear_lost(pool, id).await?
        {
            self.service.baseline_changed(id);
            pass.report.reopened += 1;
            tracing::warn!(bucket = %id, "rebuilt bucket found consistent: Trys are taken again");
        }
        Ok(())
    }

    /// A bucket Redis lost: marked lost (Trys refused), and rebuilt when the pass may.
    async fn lost(&self, i: &Inspection, pass: &mut ShardPass) -> Result<(), ReconcileError> {
        let id = &i.bucket.stock_bucket_id;
        pass.report.lost += 1;
        if i.bucket.lost_at.is_none() {
            self.service.note_lost(id).await?;
        }
        if pass.may_repair(self.config.auto_repair) {
            match self.rebuild(id).await {
                Ok((view, reopened)) => {
                    tracing::warn!(bucket = %id, operation_id = %view.operation_id, status = view.status, reopened, "lost bucket rebuilt by the reconciler");
                    pass.report.reopened += u64::from(reopened);
                }
                Err(e) => {
                    tracing::error!(bucket = %id, error = %e, "rebuild of a lost bucket failed")
                }
            }
        }
        Ok(())
    }
}
