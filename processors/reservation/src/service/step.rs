//! Running (or resuming) the Redis step of an intermediate status with its stored operation
//! id, and committing its completion: the Try path, the intents and the recovery worker all
//! come through here, so every crash window of seed §10.2 has one way out.

use super::completion::{book_unbooked_try, cancels_an_unbooked_try, completion, rejection};
use super::ReservationService;
use crate::error::ServiceError;
use crate::failpoint::{self, Place};
use crate::operations::OpsError;
use stocksvr_core::bucket::{BucketKey, BucketState};
use stocksvr_core::model::{OpCode, OpResult};
use stocksvr_core::reservation::{self as rules, Completion as Next, ReservationStatus};
use stocksvr_store::lua::{retry_unknown, ExecError, Step, TryItem};
use stocksvr_store::reservations::{self as repo, Completion, Reservation};
use stocksvr_telemetry::names;

/// What a step decided, before its commit.
pub(super) enum Prepared {
    /// Nothing to commit: the row as it is.
    Done(Reservation),
    /// Nothing committed by this actor (it yields to a Cancel): the row is read again.
    Reload(u64),
    /// The Redis step ran; `completion` moves the row out of `status`.
    Commit {
        row: Reservation,
        status: ReservationStatus,
        completion: Completion,
    },
}

impl ReservationService {
    /// The script call of `status`'s step, an UNKNOWN outcome retried with the same
    /// operation id (see [`retry_unknown`]).
    async fn call_step(
        &self,
        status: ReservationStatus,
        bucket: &BucketKey,
        row: &Reservation,
        never_built: bool,
    ) -> Result<OpResult, ExecError> {
        let op = row.current_operation_id.as_str();
        let step = match status {
            ReservationStatus::Preparing => Step::Try {
                quantity: row.quantity,
            },
            ReservationStatus::Confirming => Step::Confirm,
            ReservationStatus::Canceling => Step::Cancel {
                quantity: row.quantity,
                never_built,
            },
            ReservationStatus::Refunding => Step::Refund {
                quantity: row.pending_quantity,
            },
            other => {
                return Err(ExecError::InvalidArgument(format!(
                    "no Redis step runs in {}",
                    other.name()
                )))
            }
        };
        retry_unknown(self.config.unknown_retries, op, step.name(), || async {
            let lua_groups = self.groups.as_ref().and_then(|g| g.trys.as_ref());
            let reply = match (step, lua_groups) {
                // A Try goes in one script call with the concurrent Trys of its bucket.
                (Step::Try { quantity }, Some(trys)) => {
                    let item = TryItem {
                        reservation_id: row.id,
                        operation_id: op.to_string(),
                        quantity,
                    };
                    trys.submit((*bucket, item))
                        .await
                        .unwrap_or_else(|| Err(super::group::lua_worker_gone(op)))
                }
                _ => self.lua.step(bucket, row.id, op, step).await,
            };
            failpoint::reply_lost(status, op, reply)
        })
        .await
    }

    pub(super) async fn run_step(&self, row: Reservation) -> Result<Reservation, ServiceError> {
        let prepared = self.prepare_step(row).await?;
        self.finish_step(prepared).await
    }

    /// Commits what [`Self::prepare_step`] decided (in a group with concurrent completions
    /// when group commit is on) and answers the row as it is now.
    pub(super) async fn finish_step(
        &self,
        prepared: Prepared,
    ) -> Result<Reservation, ServiceError> {
        match prepared {
            Prepared::Done(row) => Ok(row),
            Prepared::Reload(id) => self.load(id).await,
            Prepared::Commit {
                row,
                status,
                completion,
            } => {
                let landed = if status == ReservationStatus::Refunding {
                    if stocksvr_store::refunds::complete_refund(&self.pool, &row, &completion)
                        .await?
                    {
                        Some(self.load(row.id).await?)
                    } else {
                        None
                    }
                } else {
                    self.complete_grouped(row.clone(), &completion).await?
                };
                self.landed(row.id, landed, &completion).await
            }
        }
    }

    /// The row after a completion's commit: as committed, or re-read when the CAS was lost
    /// to another actor (who finished first).
    pub(super) async fn landed(
        &self,
        id: u64,
        landed: Option<Reservation>,
        completion: &Completion,
    ) -> Result<Reservation, ServiceError> {
        match landed {
            Some(row) => {
                if !completion.outbox.is_empty() {
                    self.outbox_committed();
                }
                Ok(row)
            }
            None => {
                tracing::debug!(
                    reservation_id = id,
                    "completion lost its CAS; another actor finished first"
                );
                self.load(id).await
            }
        }
    }

    /// Runs (or resumes) the Redis step of the row's intermediate status and decides what
    /// completes it, up to the commit: the Try path commits Trys in groups, everything else
    /// through [`Self::finish_step`].
    #[tracing::instrument(skip_all, fields(reservation_id = row.id, order_id = row.order_id, bucket = %row.stock_bucket_id, operation_id = %row.current_operation_id, status = row.status_name()))]
    pub(super) async fn prepare_step(&self, row: Reservation) -> Result<Prepared, ServiceError> {
        let status = row.status()?;
        if !status.is_intermediate() {
            return Ok(Prepared::Done(row));
        }
        failpoint::at(status, Place::BeforeRedis)?;
        let keys = BucketKey::new(row.merchant_id, row.dish_id, row.stock_date);
        let mut result = self.call_step(status, &keys, &row, false).await;
        let missing = matches!(&result, Ok(r) if r.code == OpCode::BucketMissing);
        if missing && status != ReservationStatus::Preparing {
            // The bucket of a reservation that already took steps is gone from Redis. Only a
            // Cancel can meet a bucket that was never built (an OrderCreatedFailed before
            // the Try's lazy init): then its empty rollback must fence the Try. Otherwise
            // Redis lost the bucket, fences included, and nothing may be judged until the
            // rebuild restores them.
            let built = stocksvr_store::wal::succeeded_init(&self.pool, &row.stock_bucket_id)
                .await?
                .is_some();
            // The script ran before MySQL was read: a bucket initialised in between is no
            // loss. Only a key still missing now, of a bucket built before, is one.
            let present = match self.lua.read_bucket(&keys).await {
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
                result = self.call_step(status, &keys, &row, false).await;
            } else if status == ReservationStatus::Canceling && !built {
                result = self.call_step(status, &keys, &row, true).await;
            } else {
                return Err(self.bucket_lost(&row, status).await?);
            }
        }
        if missing && status == ReservationStatus::Preparing {
            match self.init_bucket(&row).await {
                Ok(true) => result = self.call_step(status, &keys, &row, false).await,
                // The day was closed before its bucket ever reached Redis: refuse the Try
                // as the script refuses one on a CLOSED bucket.
                Ok(false) => {
                    // Fenced first, as a Try giving up its row is: another copy of this Try (a
                    // repeat on another instance, the worker) may meet the bucket that a lazy
                    // init racing the close built in Redis, and must not reserve under a
                    // REJECTED row that nothing would ever cancel.
                    let fence = self.fence_unrun_try(&row, &keys).await;
                    if !matches!(&fence, Ok(r) if r.code == OpCode::Succeeded) {
                        let reason = match fence {
                            Ok(r) => format!("the Try's fence before refusing it: {r:?}"),
                            Err(e) => format!("the Try's fence before refusing it: {e}"),
                        };
                        // Held by another copy (the worker books it from the Try's op record)
                        // or not written: the row stays PREPARING for the worker.
                        repo::record_failure(
                            &self.pool,
                            row.id,
                            status,
                            &reason,
                            self.retry_delay(row.retry_count),
                        )
                        .await?;
                        return Err(ServiceError::OutcomeUnknown {
                            reservation_id: row.id,
                            status,
                            reason,
                        });
                    }
                    let completion = rejection(&row, "BUCKET_CLOSED", None);
                    return Ok(Prepared::Commit {
                        row,
                        status,
                        completion,
                    });
                }
                Err(ServiceError::BucketLost { .. }) => {
                    return Err(self.try_in_lost_bucket(&row, &keys).await?);
                }
                Err(e) => {
                    // Counted like any failed step, so recovery backs off and, past its
                    // bound, marks the row dead and alerts instead of retrying for ever.
                    if !matches!(e, ServiceError::Mysql(_)) {
                        repo::record_failure(
                            &self.pool,
                            row.id,
                            status,
                            &e.to_string(),
                            self.retry_delay(row.retry_count),
                        )
                        .await?;
                    }
                    return Err(e);
                }
            }
        }
        let result = match result {
            Ok(r) => r,
            Err(e) => {
                let unknown = e.is_unknown();
                repo::record_failure(
                    &self.pool,
                    row.id,
                    status,
                    &e.to_string(),
                    self.retry_delay(row.retry_count),
                )
                .await?;
                return Err(if unknown {
                    ServiceError::OutcomeUnknown {
                        reservation_id: row.id,
                        status,
                        reason: e.to_string(),
                    }
                } else {
                    ServiceError::Inconsistent {
                        reservation_id: row.id,
                        reason: e.to_string(),
                    }
                });
            }
        };
        if status == ReservationStatus::Preparing && result.code == OpCode::Fenced {
            metrics::counter!(names::FENCE_HITS, "kind" => "hanging_prevented").increment(1);
        }
        if status == ReservationStatus::Canceling && result.empty_rollback {
            metrics::counter!(names::FENCE_HITS, "kind" => "empty_rollback").increment(1);
        }
        let completion =
            if status == ReservationStatus::Preparing && result.code == OpCode::BucketClosed {
                Some(rejection(&row, "BUCKET_CLOSED", None))
            } else {
                match rules::after_redis(status, result.code, result.fence) {
                    Next::Advance { to } => {
                        let refund_id = if status == ReservationStatus::Refunding {
                            stocksvr_store::refunds::find_refund_by_operation(
                                &self.pool,
                                &row.current_operation_id,
                            )
                            .await?
                            .map(|r| r.refund_key)
                            .filter(|k| !k.is_empty())
                        } else {
                            None
                        };
                        Some(
                            completion(&row, status, to, &result, refund_id.as_deref()).map_err(
                                |reason| ServiceError::Inconsistent {
                                    reservation_id: row.id,
                                    reason,
                                },
                            )?,
                        )
                    }
                    Next::YieldToCancel => {
                        if let Some(gone) = self.finish_giving_up(&row, &result).await? {
                            return Err(gone);
                        }
                        None
                    }
                    Next::RefundRefused { to } => Some(Completion {
                        to,
                        expected_redis_version: None,
                        refunded_add: 0,
                        reject_reason: None,
                        outbox: Vec::new(),
                    }),
                    Next::Inconsistent { reason } => {
                        repo::record_failure(
                            &self.pool,
                            row.id,
                            status,
                            reason,
                            self.retry_delay(row.retry_count),
                        )
                        .await?;
                        tracing::error!(
                            reservation_id = row.id,
                            reason,
                            outcome = result.code.name(),
                            phase = result.fence.name(),
                            "reservation inconsistent with its fence"
                        );
                        return Err(ServiceError::Inconsistent {
                            reservation_id: row.id,
                            reason: reason.to_string(),
                        });
                    }
                }
            };
        let mut completion = completion;
        if let Some(c) = completion.as_mut() {
            if status == ReservationStatus::Canceling && cancels_an_unbooked_try(&row, &result) {
                let try_op = rules::try_operation_id(row.id);
                let recorded = self.lua.read_op(&keys, &try_op).await.map_err(|e| {
                    ServiceError::OutcomeUnknown {
                        reservation_id: row.id,
                        status,
                        reason: format!("reading the op record of its Try: {e}"),
                    }
                })?;
                if !recorded
                    .as_ref()
                    .is_some_and(|r| r.code == OpCode::Succeeded)
                {
                    tracing::warn!(reservation_id = row.id, operation_id = %try_op, recorded = ?recorded.as_ref().map(|r| r.code), "a Cancel released a Try never booked whose op record is gone or not a success: the Try is booked without its Redis version");
                }
                book_unbooked_try(c, &row, recorded.as_ref(), &result);
            }
        }
        match completion {
            Some(completion) => {
                failpoint::at(status, Place::BeforeCommit)?;
                Ok(Prepared::Commit {
                    row,
                    status,
                    completion,
                })
            }
            None => Ok(Prepared::Reload(row.id)),
        }
    }

    /// Lazy initialisation when a Try finds no bucket in Redis: the same WAL row and Lua
    /// path as the daily job (never a direct SET from the request), keyed by bucket and
    /// baseline version, so twenty concurrent first Trys initialise once.
    /// False (nothing done) when the day is no longer OPEN.
    async fn init_bucket(&self, row: &Reservation) -> Result<bool, ServiceError> {
        let baseline = stocksvr_store::baselines::find_baseline(&self.pool, &row.stock_bucket_id)
            .await?
            .ok_or_else(|| ServiceError::BucketNotFound(row.stock_bucket_id.clone()))?;
        if u8::try_from(baseline.bucket_status).ok() != Some(BucketState::Open.code()) {
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
            Ok(r)
                if r.code == OpCode::Succeeded
                    && r.fence == stocksvr_core::model::FencePhase::Canceled =>
            {
                if repo::discard_unapplied_try(&self.pool, row.id, row.version).await? {
                    tracing::warn!(reservation_id = row.id, bucket = %row.stock_bucket_id, "Try refused: its bucket is lost in Redis; nothing held, no row kept");
                }
            }
            // Another copy of this Try ran after a rebuild and holds stock (a repeat on another
            // instance, or the recovery worker): the row is not given up; it stays PREPARING
            // and the worker finishes it from the Try's op record, booking what it holds.
            Ok(r)
                if r.code == OpCode::Conflict
                    && r.fence == stocksvr_core::model::FencePhase::Reserved =>
            {
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
    async fn finish_giving_up(
        &self,
        row: &Reservation,
        result: &OpResult,
    ) -> Result<Option<ServiceError>, ServiceError> {
        if result.fence != stocksvr_core::model::FencePhase::Canceled
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
