//! `inventory_refund`: one row per refund request (a full refund from `OrderCanceled`, or a
//! partial one from `RefundRequested` keyed by its refund id), so a repeated request returns
//! its first result and partial refunds never add up past what is held.

use crate::clock::now;
use crate::deadline::Deadline;
use crate::outbox::insert_outbox;
use crate::reservations::{begin_step, Completion, Reservation, Step};
use sqlx::MySqlPool;
use stocksvr_core::reservation::{RefundStatus, ReservationStatus, SyncStatus};

/// `inventory_refund` row: one per refund request.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct RefundRecord {
    pub reservation_id: u64,
    pub refund_key: String,
    pub operation_id: String,
    pub quantity: u32,
    pub status: i8,
    pub redis_version: Option<u64>,
}

impl RefundRecord {
    /// Finished (done or refused): a repeat of the request returns its first result.
    pub fn settled(&self) -> bool {
        u8::try_from(self.status).ok() != Some(RefundStatus::InProgress.code())
    }
}

pub async fn find_refund(
    pool: &MySqlPool,
    reservation_id: u64,
    refund_key: &str,
) -> Result<Option<RefundRecord>, sqlx::Error> {
    sqlx::query_as(
        "SELECT reservation_id, refund_key, operation_id, quantity, status, redis_version \
         FROM inventory_refund WHERE reservation_id = ? AND refund_key = ?",
    )
    .bind(reservation_id)
    .bind(refund_key)
    .fetch_optional(pool)
    .deadline()
    .await
}

/// One transaction: the refund request row and the CAS into REFUNDING. False when either
/// the request was already recorded or the reservation changed first.
pub async fn begin_refund(
    pool: &MySqlPool,
    reservation: &Reservation,
    from: ReservationStatus,
    refund_key: &str,
    step: &Step<'_>,
) -> Result<bool, sqlx::Error> {
    let mut tx = crate::deadline::begin(pool).await?;
    let now = now();
    let inserted = sqlx::query(
        "INSERT IGNORE INTO inventory_refund (reservation_id, refund_key, operation_id, quantity, status, \
         created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(reservation.id)
    .bind(refund_key)
    .bind(step.operation_id)
    .bind(step.pending_quantity)
    .bind(RefundStatus::InProgress.code())
    .bind(now)
    .bind(now)
    .execute(&mut *tx)
    .deadline()
    .await?;
    if inserted.rows_affected() != 1
        || !begin_step(&mut tx, reservation.id, from, reservation.version, step).await?
    {
        tx.rollback().deadline().await?;
        return Ok(false);
    }
    tx.commit().deadline().await?;
    Ok(true)
}

/// Completes a refund: the reservation CAS, the refund row and the outbox in one transaction.
pub async fn complete_refund(
    pool: &MySqlPool,
    reservation: &Reservation,
    completion: &Completion,
) -> Result<bool, sqlx::Error> {
    let mut tx = crate::deadline::begin(pool).await?;
    let now = now();
    let done = sqlx::query(
        "UPDATE inventory_reservation SET status = ?, \
         expected_redis_version = COALESCE(?, expected_redis_version), \
         sync_status = IF(? IS NULL, sync_status, ?), \
         refunded_quantity = refunded_quantity + ?, pending_quantity = 0, resume_status = NULL, \
         retry_count = 0, last_error = NULL, version = version + 1, updated_at = ? \
         WHERE id = ? AND status = ? AND version = ?",
    )
    .bind(completion.to.code() as i8)
    .bind(completion.expected_redis_version)
    // A refused refund moved nothing in Redis and sends no stock-change: the row stays as
    // projected as it was. Pending without an event to clear it held the reconciler's check
    // of the bucket back for good.
    .bind(completion.expected_redis_version)
    .bind(SyncStatus::Pending.code())
    .bind(completion.refunded_add)
    .bind(now)
    .bind(reservation.id)
    .bind(ReservationStatus::Refunding.code() as i8)
    .bind(reservation.version)
    .execute(&mut *tx)
    .deadline()
    .await?;
    if done.rows_affected() != 1 {
        tx.rollback().deadline().await?;
        return Ok(false);
    }
    sqlx::query(
        "UPDATE inventory_refund SET status = ?, redis_version = ?, updated_at = ? WHERE operation_id = ?",
    )
    .bind(if completion.refunded_add > 0 {
        RefundStatus::Done.code()
    } else {
        RefundStatus::Refused.code()
    })
    .bind(completion.expected_redis_version)
    .bind(now)
    .bind(&reservation.current_operation_id)
    .execute(&mut *tx)
    .deadline()
    .await?;
    insert_outbox(&mut tx, &completion.outbox).await?;
    tx.commit().deadline().await?;
    Ok(true)
}

pub async fn find_refund_by_operation(
    pool: &MySqlPool,
    operation_id: &str,
) -> Result<Option<RefundRecord>, sqlx::Error> {
    sqlx::query_as(
        "SELECT reservation_id, refund_key, operation_id, quantity, status, redis_version \
         FROM inventory_refund WHERE operation_id = ?",
    )
    .bind(operation_id)
    .fetch_optional(pool)
    .deadline()
    .await
}
