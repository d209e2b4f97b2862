//! The on-demand check (`stocksvr reconcile`, `GET /admin/reconcile`): two passes in memory,
//! `settle` apart; a difference counts only when the second pass sees it again at the same
//! Redis version. Nothing is written unless it repairs.

use crate::classify::{DifferenceKind, Verdict};
use crate::inspect::{log_difference, Inspection};
use crate::queries::{BucketFilter, LiveBucket};
use crate::repair::RepairOutcome;
use crate::{ReconcileError, Reconciler};
use serde::Serialize;
use std::collections::HashMap;
use std::time::Instant;

/// One bucket of an on-demand check.
#[derive(Debug, Clone, Serialize)]
pub struct Checked {
    pub inspection: Inspection,
    /// Differences seen on both passes at the same Redis version.
    pub confirmed: Vec<DifferenceKind>,
    pub repair: Option<RepairOutcome>,
}

impl Reconciler {
    /// The on-demand check: two passes `settle` apart; a difference counts only when the
    /// second pass sees it again at the same Redis version. With `repair`, each confirmed
    /// difference is repaired (recomputed while the version keeps moving).
    pub async fn check(
        &self,
        filter: &BucketFilter,
        repair: bool,
        progress: &(dyn Fn(usize) + Sync),
    ) -> Result<Vec<Checked>, ReconcileError> {
        let first_pass = Instant::now();
        let first = self.inspect_all(filter, progress).await?;
        let suspects: Vec<LiveBucket> = first
            .iter()
            .filter(|i| matches!(i.verdict, Verdict::Differs(_)))
            .map(|i| i.bucket.clone())
            .collect();
        let mut second: HashMap<String, Inspection> = HashMap::new();
        if !suspects.is_empty() {
            tokio::time::sleep(self.config.settle).await;
            for chunk in suspects.chunks(self.config.chunk.max(1) as usize) {
                for i in self.inspect(chunk.to_vec()).await? {
                    second.insert(i.bucket.stock_bucket_id.clone(), i);
                }
            }
        }
        let mut out = Vec::with_capacity(first.len());
        for i in first {
            let again = second.remove(&i.bucket.stock_bucket_id);
            let confirmed = match &again {
                Some(a) if a.version() == i.version() => {
                    let before = i.kinds();
                    a.kinds()
                        .into_iter()
                        .filter(|k| before.contains(k))
                        .collect()
                }
                _ => Vec::new(),
            };
            let inspection = again.unwrap_or(i);
            let repair = if repair && !confirmed.is_empty() {
                Some(self.repair(&inspection, first_pass.elapsed()).await)
            } else {
                None
            };
            for kind in &confirmed {
                log_difference(&inspection, *kind);
            }
            out.push(Checked {
                inspection,
                confirmed,
                repair,
            });
        }
        Ok(out)
    }
}
