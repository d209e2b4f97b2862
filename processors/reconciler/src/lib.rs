//! The reconciler (docs/design.md, "Reconcile, repair, rebuild"; docs/reconciliation.md): compares
//! every live bucket's Redis numbers with what MySQL says two ways (the reservation table with the
//! baseline's total, and the ledger's sums) and with the projector's snapshot; reports a difference
//! only when it persists across two passes at an unchanged Redis version with nothing of the bucket
//! in flight; repairs it with a versioned WAL operation when asked to; and brings lost buckets back
//! through the rebuild.
//!
//! Scheduled passes (a role in `stocksvr all`) split the buckets over shards by merchant and
//! dish; an instance checks a shard only while it holds the shard's lease, so several
//! instances share the work and no bucket is checked twice at once. Their memory of what was
//! seen is `inventory_reconcile_difference`. The on-demand check (`stocksvr reconcile`) makes
//! its two passes in memory, a few seconds apart, and writes nothing unless it repairs.
//!
//! By stage: [`config`] (the `[reconcile]` section); `inspect` (every view of a chunk of
//! buckets, judged by [`classify`]); `repair` (a versioned repair, a rebuild and the
//! reopening of a rebuilt bucket: it plans and drives them, the reservation crate's stock
//! operations run them as WAL rows); `check` (the on-demand check) and `pass` (scheduled
//! passes over leased shards). [`queries`] holds the MySQL statements only the reconciler
//! runs; the views of a bucket a repair reads too are `stocksvr_store::bucket_views`.

pub mod classify;
pub mod config;
pub mod queries;

mod check;
mod inspect;
mod pass;
mod repair;

pub use check::Checked;
pub use classify::verdict_name;
pub use config::{ReconcileConfig, ReconcileSettings};
pub use inspect::Inspection;
pub use pass::{run, PassReport};
pub use queries::{BucketFilter, LiveBucket};
pub use repair::RepairOutcome;

use inspect::CleanMark;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use stocksvr_reservation::{OpsError, ReservationService, ServiceError};

#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("mysql: {0}")]
    Mysql(#[from] sqlx::Error),
    #[error("redis: {0}")]
    Redis(String),
    #[error(transparent)]
    Ops(#[from] OpsError),
    #[error(transparent)]
    Service(#[from] ServiceError),
    /// The process is stopping: a scheduled pass gave its shard back unfinished.
    #[error("stopped with the process before the pass ended")]
    Stopped,
}

pub struct Reconciler {
    service: Arc<ReservationService>,
    config: ReconcileConfig,
    owner: String,
    /// The shard rows were written once by this instance (they are never deleted).
    shards_ensured: AtomicBool,
    /// Buckets this instance last found consistent, and what they looked like then.
    clean: Mutex<HashMap<String, CleanMark>>,
    /// Held reservations a full check found not right and read again (see
    /// [`Self::suspects_read_again`]).
    read_again: AtomicU64,
}

impl Reconciler {
    pub fn new(service: Arc<ReservationService>, config: ReconcileConfig) -> Self {
        let owner = format!(
            "{}:{}",
            std::fs::read_to_string("/etc/hostname")
                .map(|h| h.trim().to_string())
                .unwrap_or_else(|_| "host".into()),
            std::process::id()
        );
        Self {
            service,
            config,
            owner,
            shards_ensured: AtomicBool::new(false),
            clean: Mutex::new(HashMap::new()),
            read_again: AtomicU64::new(0),
        }
    }

    /// How many held reservations this instance's full checks found not right at the first
    /// read and read again (row, then fence and op record) before calling them missing.
    pub fn suspects_read_again(&self) -> u64 {
        self.read_again.load(Ordering::Relaxed)
    }

    pub fn config(&self) -> &ReconcileConfig {
        &self.config
    }
}
