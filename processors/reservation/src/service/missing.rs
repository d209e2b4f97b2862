//! A step whose script found no bucket in Redis. A Try's first sight of a day's bucket
//! initialises it lazily (through the operation WAL, like the daily job); a bucket built
//! before and gone now was lost by Redis: it is marked lost, steps wait for its rebuild
//! without counting attempts, and a Try gives its row up behind a fence so that no copy of
//! it can reserve later (docs/design.md, reconcile, repair, rebuild).

use super::completion::rejection;
use super::step::{Prepared, Ran};
use super::ReservationService;
use crate::error::ServiceError;
use crate::operations::OpsError;
use stocksvr_core::bucket::{BucketKey, BucketState};
use stocksvr_core::codes::RejectReason;
use stocksvr_core::model::{FencePhase, OpCode, OpResult};
use stocksvr_core::reservation::{self as rules, ReservationStatus};
use stocksvr_store::lua::{retry_unknown, ExecError, Step};
use stocksvr_store::reservations::{self as repo, Reservation};

impl ReservationService {
    /// A step of an existing reservation whose script found no bucket in Redis. The script
    /// ran before MySQL was read: a bucket initialised in between is no loss, and the step
    /// runs again. Only a Cancel can meet a bucket that was never built (an
    /// OrderCreatedFailed before the Try's lazy init): its empty rollback must then fence the
    /// Try. Otherwise Redis lost the bucket, fences included, and nothing may be judged until
    /// the rebuild restores them.
    pub(super) async fn step_without_bucket(
        &self,
        status: ReservationStatus,
        keys: &BucketKey,
        row: &Reservation,
    ) -> Result<Result<OpResult, ExecError>, ServiceError> {
        let built = stocksvr_store::wal::succeeded_init(&self.pool, &row.stock_bucket_id)
            .await?
            .is_some();
        let present = match self.lua.read_bucket(keys).await {
            Ok(bucket) => bucket.is_some(),
            Err(e) => {
                return Err(ServiceError::OutcomeUnknown {
                    reservation_id: row.id,
                    status,
                    reason: format!("reading the bucket back: {e}"),
                })
            }
        };
        if present {
            Ok(self.call_step(status, keys, row, false).await)
        } else if status == ReservationStatus::Canceling && !built {
            Ok(self.call_step(status, keys, row, true).await)
        } else {
            Err(self.bucket_lost(row, status).await?)
        }
    }

    /// A Try whose script found no bucket in Redis: the bucket is initialised (once, however
    /// many Trys find it missing) and the Try runs again; a day closed before its bucket ever
    /// reached Redis refuses the Try as the script refuses one on a CLOSED bucket.
    pub(super) async fn try_without_bucket(
        &self,
        row: &Reservation,
        keys: &BucketKey,
    ) -> Result<Ran, ServiceError> {
        let status = ReservationStatus::Preparing;
        match self.init_bucket(row).await {
            Ok(true) => Ok(Ran::Script(self.call_step(status, keys, row, false).await)),
            Ok(false) => self
                .refuse_closed_try(row, keys)
                .await
                .map(|prepared| Ran::Settled(Box::new(prepared))),
            Err(ServiceError::BucketLost { .. }) => Err(self.try_in_lost_bucket(row, keys).await?),
            Err(e) => {
                // Counted like any failed step, so recovery backs off and, past its
                // bound, marks the row dead and alerts instead of retrying for ever.
                if !matches!(e, ServiceError::Mysql(_)) {
                    self.count_failure(row, status, &e.to_string()).await?;
                }
                Err(e)
            }
        }
    }

    /// REJECTED with BUCKET_CLOSED, for a Try whose day closed before its bucket was built.
    /// Fenced first, as a Try giving up its row is: another copy of this Try (a repeat on
    /// another instance, the worker) may meet the bucket that a lazy init racing the close
    /// built in Redis, and must not reserve under a REJECTED row that nothing would ever
    /// cancel.
    async fn refuse_closed_try(
        &self,
        row: &Reservation,
        keys: &BucketKey,
    ) -> Result<Prepared, ServiceError> {
        let status = ReservationStatus::Preparing;
        let fence = self.fence_unrun_try(row, keys).await;
        if !matches!(&fence, Ok(r) if r.code == OpCode::Succeeded) {
            let reason = match fence {
                Ok(r) => format!("the Try's fence before refusing it: {r:?}"),
                Err(e) => format!("the Try's fence before refusing it: {e}"),
            };
            // Held by another copy (the worker books it from the Try's op record) or not
            // written: the row stays PREPARING for the worker.
            self.count_failure(row, status, &reason).await?;
            return Err(ServiceError::OutcomeUnknown {
                reservation_id: row.id,
                status,
                reason,
            });
        }
        Ok(Prepared::Commit {
            row: row.clone(),
            status,
            completion: rejection(row, RejectReason::BucketClosed, None),
        })
    }

    /// Lazy initialisation when a Try finds no bucket in Redis: the same WAL row and Lua
    /// path as the daily job (never a direct SET from the request), keyed by bucket and
    /// baseline version, so twenty concurrent first Trys initialise once.
    /// False (nothing done) when the day is no longer OPEN.
    async fn init_bucket(&self, row: &Reservation) -> Result<bool, ServiceError> {
        let baseline = stocksvr_store::baselines::find_baseline(&self.pool, &row.stock_bucket_id)
            .await?
            .ok_or_else(|| ServiceError::BucketNotFound(row.stock_bucket_id.clone()))?;
        if baseline.state() != Some(BucketState::Open) {
            return Ok(false);
        }
        self.ops
            .ensure_bucket(&baseline)
            .await
            .map(|()| true)
            .map_err(|e| match e {
                OpsError::Mysql(e) => ServiceError::Mysql(e),
                OpsError::BucketLost { bucket, .. } => ServiceError::BucketLost { bucket },
                other => ServiceError::OutcomeUnknown {
                    reservation_id: row.id,
                    status: ReservationStatus::Preparing,
                    reason: format!("initialising bucket {}: {other}", baseline.stock_bucket_id),
                },
            })
    }

    /// A step of an existing reservation found its bucket lost: mark it (Trys are refused
    /// from now on, the reconciler and `/readyz` report it) and put the step off without
    /// counting an attempt; the rebuild restores the fence and the step then applies once.
    async fn bucket_lost(
        &self,
        row: &Reservation,
        status: ReservationStatus,
    ) -> Result<ServiceError, ServiceError> {
        self.note_lost(&row.stock_bucket_id).await?;
        repo::postpone(
            &self.pool,
            row.id,
            status,
            "the bucket is lost in Redis: waiting for its rebuild",
            self.retry_delay(3),
        )
        .await?;
        Ok(ServiceError::BucketLost {
            bucket: row.stock_bucket_id.clone(),
        })
    }

    /// The fence-only Cancel of a Try this actor gives up ([`Step::FenceTry`]): a CANCELED
    /// fence when no copy of the Try ran, else a `Conflict` in phase RESERVED and no change.
    async fn fence_unrun_try(
        &self,
        row: &Reservation,
        keys: &BucketKey,
    ) -> Result<OpResult, ExecError> {
        let op = rules::cancel_operation_id(row.id);
        retry_unknown(self.config.unknown_retries, &op, "cancel", || {
            self.lua.step(
                keys,
                row.id,
                &op,
                Step::FenceTry {
                    quantity: row.quantity,
                },
            )
        })
        .await
    }

    /// A Try whose bucket turned out to be lost: its script changed nothing. Fence the
    /// reservation id in Redis (an empty rollback, written even without the stock hash) so
    /// that no copy of this Try still in flight can ever reserve under it, then remove the
    /// PREPARING row: the caller gets 503 `bucket_lost`, and a retry of the same item after
    /// the rebuild starts afresh instead of finding a row stuck in the recovery list.
    async fn try_in_lost_bucket(
        &self,
        row: &Reservation,
        keys: &BucketKey,
    ) -> Result<ServiceError, ServiceError> {
        self.note_lost(&row.stock_bucket_id).await?;
        let fence = self.fence_unrun_try(row, keys).await;
        match fence {
            Ok(r) if r.code == OpCode::Succeeded && r.fence == FencePhase::Canceled => {
                if repo::discard_unapplied_try(&self.pool, row.id, row.version).await? {
                    tracing::warn!(reservation_id = row.id, bucket = %row.stock_bucket_id, "Try refused: its bucket is lost in Redis; nothing held, no row kept");
                }
            }
            // Another copy of this Try ran after a rebuild and holds stock (a repeat on another
            // instance, or the recovery worker): the row is not given up; it stays PREPARING
            // and the worker finishes it from the Try's op record, booking what it holds.
            Ok(r) if r.code == OpCode::Conflict && r.fence == FencePhase::Reserved => {
                tracing::info!(reservation_id = row.id, bucket = %row.stock_bucket_id, "a Try that found its bucket lost finds its reservation held by another copy of the Try: the row is left to the recovery worker");
                repo::postpone(
                    &self.pool,
                    row.id,
                    ReservationStatus::Preparing,
                    "another copy of the Try holds stock after the rebuild",
                    self.retry_delay(0),
                )
                .await?;
            }
            // Redis unreachable or the fence not written: the row stays PREPARING and the
            // recovery worker resumes it after the rebuild (a 503 never promised a refusal).
            other => {
                tracing::warn!(reservation_id = row.id, outcome = ?other.map(|r| r.code), "could not fence a Try of a lost bucket; its row waits for the rebuild");
                repo::postpone(
                    &self.pool,
                    row.id,
                    ReservationStatus::Preparing,
                    "the bucket is lost in Redis: waiting for its rebuild",
                    self.retry_delay(3),
                )
                .await?;
            }
        }
        Ok(ServiceError::BucketLost {
            bucket: row.stock_bucket_id.clone(),
        })
    }

    /// A Try FENCED by a CANCELED fence yields to the Cancel that wrote it, which moved the
    /// row out of PREPARING before its script ran. A row still PREPARING at the version this
    /// step read has no such Cancel: the fence is the fence-only Cancel of a Try that gave the
    /// row up and stopped (a crash, MySQL gone) before removing it (a lost bucket) or before
    /// committing REJECTED (a closed day), which would otherwise be resumed, fenced and left
    /// PREPARING for good. The row goes now: nothing is held under that fence, the answer is
    /// `bucket_lost` (503, retried), and a retry of the item starts afresh.
    pub(super) async fn finish_giving_up(
        &self,
        row: &Reservation,
        result: &OpResult,
    ) -> Result<Option<ServiceError>, ServiceError> {
        if result.fence != FencePhase::Canceled
            || !repo::discard_unapplied_try(&self.pool, row.id, row.version).await?
        {
            return Ok(None);
        }
        tracing::warn!(reservation_id = row.id, bucket = %row.stock_bucket_id, "a PREPARING row fenced by the Try that gave it up (its bucket was lost) is removed: that Try stopped before it could");
        Ok(Some(ServiceError::BucketLost {
            bucket: row.stock_bucket_id.clone(),
        }))
    }

    /// Records that `bucket` is lost (once), so Trys are refused before any row is written.
    pub async fn note_lost(&self, bucket: &str) -> Result<(), ServiceError> {
        self.baselines.forget(&bucket.to_string());
        if stocksvr_store::baselines::mark_lost(&self.pool, bucket).await? {
            tracing::error!(bucket, "bucket lost in Redis: Trys refused, steps wait; rebuild it (stocksvr bucket rebuild) and it reopens after a clean reconcile pass");
        }
        Ok(())
    }
}
