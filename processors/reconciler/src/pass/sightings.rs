//! A scheduled pass's differences remembered across passes: a kind seen for the first time
//! (or at another Redis version) is SUSPECTED, seen again at the same version it is CONFIRMED
//! and reported, and with `auto_repair` a newly confirmed difference is repaired. A kind the
//! bucket no longer shows is resolved.

use super::shard::ShardPass;
use crate::classify::DifferenceKind;
use crate::inspect::{log_difference, Inspection};
use crate::queries::differences::{
    confirm, resolve, resuspect, set_repair, suspect, OpenDifference,
};
use crate::repair::RepairOutcome;
use crate::{ReconcileError, Reconciler};
use chrono::Utc;
use stocksvr_core::codes::DifferenceStatus;

impl Reconciler {
    /// A bucket whose views differ with nothing in flight, in `kinds`; `mine` are its open
    /// differences.
    pub(super) async fn differs(
        &self,
        i: &Inspection,
        kinds: &[DifferenceKind],
        mine: &[&OpenDifference],
        pass: &mut ShardPass,
    ) -> Result<(), ReconcileError> {
        let pool = self.service.pool();
        for d in mine {
            let still = DifferenceKind::from_name(&d.kind).is_some_and(|k| kinds.contains(&k));
            if !still {
                resolve(pool, d.id).await?;
            }
        }
        let newly_confirmed = self.sightings(i, kinds, mine, pass).await?;
        for (kind, _) in &newly_confirmed {
            log_difference(i, *kind);
        }
        pass.report.confirmed += newly_confirmed.len() as u64;
        if !newly_confirmed.is_empty() && pass.may_repair(self.config.auto_repair) {
            let first_seen = mine
                .iter()
                .map(|d| d.first_seen_at)
                .min()
                .unwrap_or_else(|| Utc::now().naive_utc());
            let seen_for = (Utc::now().naive_utc() - first_seen)
                .to_std()
                .unwrap_or_default();
            let outcome = self.repair(i, seen_for).await;
            if let RepairOutcome::Repaired { operation_id } = &outcome {
                pass.report.repaired += 1;
                for (_, diff) in &newly_confirmed {
                    set_repair(pool, *diff, operation_id).await?;
                }
            }
        }
        Ok(())
    }

    /// Records this pass's sighting of each of `kinds`; returns the differences confirmed and
    /// not repaired yet (with their row ids): newly confirmed now, or confirmed before and
    /// still waiting for a repair.
    async fn sightings(
        &self,
        i: &Inspection,
        kinds: &[DifferenceKind],
        mine: &[&OpenDifference],
        pass: &mut ShardPass,
    ) -> Result<Vec<(DifferenceKind, u64)>, ReconcileError> {
        let pool = self.service.pool();
        let id = &i.bucket.stock_bucket_id;
        let version = i.version();
        let views = serde_json::to_value(&i.views).unwrap_or_default();
        let mut newly_confirmed = Vec::new();
        for kind in kinds {
            match mine.iter().find(|d| d.kind == kind.name()) {
                None => {
                    suspect(pool, id, kind.name(), version, &views).await?;
                    pass.report.suspected += 1;
                    *pass.held.entry("first_sighting").or_default() += 1;
                }
                Some(d) if d.redis_version != version => {
                    resuspect(pool, d.id, version, &views).await?;
                    pass.report.suspected += 1;
                    *pass.held.entry("version_moved").or_default() += 1;
                }
                Some(d) if d.status() == Some(DifferenceStatus::Suspected) => {
                    if confirm(pool, d.id, &views).await? {
                        newly_confirmed.push((*kind, d.id));
                    }
                }
                // Confirmed before: still reported; repaired below if due.
                Some(d) => {
                    if d.repair_operation_id.is_none() {
                        newly_confirmed.push((*kind, d.id));
                    }
                }
            }
        }
        Ok(newly_confirmed)
    }
}
