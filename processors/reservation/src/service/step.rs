//! Running (or resuming) the Redis step of an intermediate status with its stored operation
//! id, and committing its completion: the Try path, the intents and the recovery worker all
//! come through here, so every crash window (docs/design.md, failure windows) has one way
//! out. A step whose bucket Redis does not have is the business of `missing`.

use super::completion::{book_unbooked_try, cancels_an_unbooked_try, completion, rejection};
use super::ReservationService;
use crate::error::ServiceError;
use crate::failpoint::{self, Place};
use stocksvr_core::bucket::BucketKey;
use stocksvr_core::codes::RejectReason;
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

/// A step's script run, its missing bucket accounted for.
pub(super) enum Ran {
    /// What the script answered (again, after a lazy init or a bucket built meanwhile).
    Script(Result<OpResult, ExecError>),
    /// The missing bucket settled the step itself: a Try refused because its day closed
    /// before its bucket was built.
    Settled(Box<Prepared>),
}

impl ReservationService {
    /// The script call of `status`'s step, an UNKNOWN outcome retried with the same
    /// operation id (see [`retry_unknown`]).
    pub(super) async fn call_step(
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
        let result = match self.run_script(status, &keys, &row).await? {
            Ran::Script(Ok(result)) => result,
            Ran::Script(Err(e)) => return Err(self.script_failed(&row, status, e).await?),
            Ran::Settled(prepared) => return Ok(*prepared),
        };
        if status == ReservationStatus::Preparing && result.code == OpCode::Fenced {
            metrics::counter!(names::FENCE_HITS, "kind" => "hanging_prevented").increment(1);
        }
        if status == ReservationStatus::Canceling && result.empty_rollback {
            metrics::counter!(names::FENCE_HITS, "kind" => "empty_rollback").increment(1);
        }
        let Some(mut completion) = self.decide_completion(&row, status, &result).await? else {
            return Ok(Prepared::Reload(row.id));
        };
        if status == ReservationStatus::Canceling && cancels_an_unbooked_try(&row, &result) {
            self.book_unbooked_try(&mut completion, &row, &keys, &result)
                .await?;
        }
        failpoint::at(status, Place::BeforeCommit)?;
        Ok(Prepared::Commit {
            row,
            status,
            completion,
        })
    }

    /// The step's script call; when it finds no bucket in Redis, again once the missing
    /// bucket is accounted for (see `missing`).
    async fn run_script(
        &self,
        status: ReservationStatus,
        keys: &BucketKey,
        row: &Reservation,
    ) -> Result<Ran, ServiceError> {
        let result = self.call_step(status, keys, row, false).await;
        if !matches!(&result, Ok(r) if r.code == OpCode::BucketMissing) {
            return Ok(Ran::Script(result));
        }
        // Boxed: the lazy init behind a missing bucket is a deep chain of futures (the WAL
        // row, its execution), rare on the step path; kept out of line, it neither grows every
        // step's future nor pushes their nesting past the compiler's layout depth limit.
        if status == ReservationStatus::Preparing {
            Box::pin(self.try_without_bucket(row, keys)).await
        } else {
            Box::pin(self.step_without_bucket(status, keys, row))
                .await
                .map(Ran::Script)
        }
    }

    /// Counts a failed attempt of `status`'s step on the row, with `reason`: the recovery
    /// worker retries it after a backoff and, past its bound, marks it dead and alerts.
    pub(super) async fn count_failure(
        &self,
        row: &Reservation,
        status: ReservationStatus,
        reason: &str,
    ) -> Result<(), ServiceError> {
        repo::record_failure(
            &self.pool,
            row.id,
            status,
            reason,
            self.retry_delay(row.retry_count),
        )
        .await?;
        Ok(())
    }

    /// A script call that failed is counted on the row, so recovery backs off and, past its
    /// bound, marks the row dead and alerts; the caller hears an unknown outcome (the script
    /// may have run) or an inconsistency (it refused).
    async fn script_failed(
        &self,
        row: &Reservation,
        status: ReservationStatus,
        e: ExecError,
    ) -> Result<ServiceError, ServiceError> {
        self.count_failure(row, status, &e.to_string()).await?;
        Ok(if e.is_unknown() {
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
        })
    }

    /// What the script's `result` commits from `status`: the next status and its outbox rows,
    /// or None when this actor yields to a Cancel and commits nothing.
    async fn decide_completion(
        &self,
        row: &Reservation,
        status: ReservationStatus,
        result: &OpResult,
    ) -> Result<Option<Completion>, ServiceError> {
        if status == ReservationStatus::Preparing && result.code == OpCode::BucketClosed {
            return Ok(Some(rejection(row, RejectReason::BucketClosed, None)));
        }
        match rules::after_redis(status, result.code, result.fence) {
            Next::Advance { to } => {
                let refund_id = if status == ReservationStatus::Refunding {
                    self.refund_key(row).await?
                } else {
                    None
                };
                completion(row, status, to, result, refund_id.as_deref())
                    .map(Some)
                    .map_err(|reason| ServiceError::Inconsistent {
                        reservation_id: row.id,
                        reason,
                    })
            }
            Next::YieldToCancel => match self.finish_giving_up(row, result).await? {
                Some(gone) => Err(gone),
                None => Ok(None),
            },
            Next::RefundRefused { to } => Ok(Some(Completion {
                to,
                expected_redis_version: None,
                refunded_add: 0,
                reject_reason: None,
                outbox: Vec::new(),
            })),
            Next::Inconsistent { reason } => {
                self.count_failure(row, status, reason).await?;
                tracing::error!(
                    reservation_id = row.id,
                    reason,
                    outcome = result.code.name(),
                    phase = result.fence.name(),
                    "reservation inconsistent with its fence"
                );
                Err(ServiceError::Inconsistent {
                    reservation_id: row.id,
                    reason: reason.to_string(),
                })
            }
        }
    }

    /// The refund id of the partial refund a REFUNDING row carries out (None for a full one).
    async fn refund_key(&self, row: &Reservation) -> Result<Option<String>, ServiceError> {
        Ok(
            stocksvr_store::refunds::find_refund_by_operation(
                &self.pool,
                &row.current_operation_id,
            )
            .await?
            .map(|r| r.refund_key)
            .filter(|k| !k.is_empty()),
        )
    }

    /// Books the Try a Cancel released although its commit never booked it (see
    /// [`cancels_an_unbooked_try`]), from the Try's op record when Redis still has it.
    async fn book_unbooked_try(
        &self,
        completion: &mut Completion,
        row: &Reservation,
        keys: &BucketKey,
        result: &OpResult,
    ) -> Result<(), ServiceError> {
        let try_op = rules::try_operation_id(row.id);
        let recorded =
            self.lua
                .read_op(keys, &try_op)
                .await
                .map_err(|e| ServiceError::OutcomeUnknown {
                    reservation_id: row.id,
                    status: ReservationStatus::Canceling,
                    reason: format!("reading the op record of its Try: {e}"),
                })?;
        if recorded
            .as_ref()
            .is_none_or(|r| r.code != OpCode::Succeeded)
        {
            tracing::warn!(reservation_id = row.id, operation_id = %try_op, recorded = ?recorded.as_ref().map(|r| r.code), "a Cancel released a Try never booked whose op record is gone or not a success: the Try is booked without its Redis version");
        }
        book_unbooked_try(completion, row, recorded.as_ref(), result);
        Ok(())
    }
}
