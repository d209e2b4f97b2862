//! What the recovery worker and the operator write: a failed or postponed attempt, the
//! claim of due rows, the dead mark with its alert, and the operator's list and revive.

use super::{Reservation, COLUMNS, STEP_GRACE};
use crate::clock::now;
use crate::deadline::Deadline;
use crate::outbox::{write_outbox, NewOutbox};
use sqlx::{MySql, MySqlPool};
use stocksvr_core::reservation::ReservationStatus;

/// Notes a failed attempt on an intermediate state without moving it: the recovery worker
/// picks it up at `next_retry_at` and resumes with the stored operation id.
pub async fn record_failure(
    pool: &MySqlPool,
    id: u64,
    status: ReservationStatus,
    error: &str,
    retry_after: chrono::Duration,
) -> Result<(), sqlx::Error> {
    put_off(pool, id, status, error, retry_after, true).await
}

/// Puts a step off without counting an attempt: it waits for something outside its own
/// control (its bucket's rebuild), and the dead-after-N-attempts bound must not run out
/// meanwhile.
pub async fn postpone(
    pool: &MySqlPool,
    id: u64,
    status: ReservationStatus,
    reason: &str,
    retry_after: chrono::Duration,
) -> Result<(), sqlx::Error> {
    put_off(pool, id, status, reason, retry_after, false).await
}

/// Moves `next_retry_at` of the row in `status` by `retry_after` with `note` as its last
/// error, counting an attempt when `attempt`.
async fn put_off(
    pool: &MySqlPool,
    id: u64,
    status: ReservationStatus,
    note: &str,
    retry_after: chrono::Duration,
    attempt: bool,
) -> Result<(), sqlx::Error> {
    let note: String = note.chars().take(1000).collect();
    // Moving next_retry_at rewrites the row's (status, next_retry_at) index entry, which can
    // deadlock with a group's INSERT of PREPARING rows; the victim's UPDATE did nothing, so it
    // is run again rather than turning the step's own answer (OutcomeUnknown) into an error.
    crate::retry::on_lock_conflict(3, || {
        sqlx::query(
            "UPDATE inventory_reservation SET retry_count = retry_count + ?, last_error = ?, \
             next_retry_at = ?, updated_at = ? WHERE id = ? AND status = ?",
        )
        .bind(u32::from(attempt))
        .bind(&note)
        .bind(now() + retry_after)
        .bind(now())
        .bind(id)
        .bind(status.code() as i8)
        .execute(pool)
        .deadline()
    })
    .await?;
    Ok(())
}

/// Removes a PREPARING row whose Try never ran in Redis and never will (its reservation id
/// is fenced there): the Try that found its bucket lost leaves no row behind, and a retry
/// of the same item after the rebuild starts afresh. True when the row was removed (CAS on
/// status and version: a row another actor moved on stays).
pub async fn discard_unapplied_try(
    pool: &MySqlPool,
    id: u64,
    version: u32,
) -> Result<bool, sqlx::Error> {
    let done = sqlx::query(
        "DELETE FROM inventory_reservation WHERE id = ? AND status = ? AND version = ?",
    )
    .bind(id)
    .bind(ReservationStatus::Preparing.code() as i8)
    .bind(version)
    .execute(pool)
    .deadline()
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Claims up to `limit` reservations in an intermediate status whose `next_retry_at` passed,
/// for one recovery round: `FOR UPDATE SKIP LOCKED` keeps concurrent workers apart, and the
/// claim pushes `next_retry_at` by `lease` so another worker leaves them alone meanwhile.
pub async fn claim_due(
    pool: &MySqlPool,
    limit: u32,
    lease: chrono::TimeDelta,
) -> Result<Vec<u64>, sqlx::Error> {
    let mut tx = crate::deadline::begin(pool).await?;
    let now = now();
    let ids: Vec<(u64,)> = sqlx::query_as(
        "SELECT id FROM inventory_reservation WHERE status IN (?, ?, ?, ?) AND dead = 0 AND next_retry_at <= ? \
         ORDER BY next_retry_at LIMIT ? FOR UPDATE SKIP LOCKED",
    )
    .bind(ReservationStatus::Preparing.code() as i8)
    .bind(ReservationStatus::Confirming.code() as i8)
    .bind(ReservationStatus::Canceling.code() as i8)
    .bind(ReservationStatus::Refunding.code() as i8)
    .bind(now)
    .bind(limit)
    .fetch_all(&mut *tx)
    .deadline()
    .await?;
    for (id,) in &ids {
        sqlx::query("UPDATE inventory_reservation SET next_retry_at = ? WHERE id = ?")
            .bind(now + lease)
            .bind(id)
            .execute(&mut *tx)
            .deadline()
            .await?;
    }
    tx.commit().deadline().await?;
    Ok(ids.into_iter().map(|(id,)| id).collect())
}

/// Marks a reservation dead (recovery gave up) and enqueues its alert event, in one
/// transaction. The status is left as it is: a dead row is never moved backwards.
pub async fn mark_dead(pool: &MySqlPool, id: u64, alert: &NewOutbox) -> Result<bool, sqlx::Error> {
    let mark = sqlx::query(
        "UPDATE inventory_reservation SET dead = 1, updated_at = ? WHERE id = ? AND dead = 0",
    )
    .bind(now())
    .bind(id);
    mark_and_alert(pool, mark, alert).await
}

/// One transaction: a guarded marking UPDATE and, only if it changed the row, the alert's
/// outbox row. False (nothing written) when the guard found the row already marked.
async fn mark_and_alert(
    pool: &MySqlPool,
    mark: sqlx::query::Query<'_, MySql, sqlx::mysql::MySqlArguments>,
    alert: &NewOutbox,
) -> Result<bool, sqlx::Error> {
    let mut tx = crate::deadline::begin(pool).await?;
    if mark.execute(&mut *tx).deadline().await?.rows_affected() != 1 {
        tx.rollback().deadline().await?;
        return Ok(false);
    }
    write_outbox(&mut *tx, alert, true).await?;
    tx.commit().deadline().await?;
    Ok(true)
}

/// Reservations an operator should look at: dead ones, and intermediate ones that failed at
/// least once or have sat past the step grace (a crash or a Redis outage left them).
pub async fn list_stuck(
    pool: &MySqlPool,
    dead_only: bool,
    limit: u32,
) -> Result<Vec<Reservation>, sqlx::Error> {
    let filter = if dead_only {
        "dead = 1"
    } else {
        "dead = 1 OR (status IN (?, ?, ?, ?) AND (retry_count > 0 OR updated_at < ?))"
    };
    let sql = format!(
        "SELECT {COLUMNS} FROM inventory_reservation WHERE {filter} ORDER BY updated_at LIMIT ?"
    );
    let mut q = sqlx::query_as(&sql);
    if !dead_only {
        q = q
            .bind(ReservationStatus::Preparing.code() as i8)
            .bind(ReservationStatus::Confirming.code() as i8)
            .bind(ReservationStatus::Canceling.code() as i8)
            .bind(ReservationStatus::Refunding.code() as i8)
            .bind(now() - STEP_GRACE);
    }
    q.bind(limit).fetch_all(pool).deadline().await
}

/// An operator's "retry now": clears the dead mark and the backoff so the step runs at once
/// (by the caller) with a fresh retry budget. The status is untouched.
pub async fn revive(pool: &MySqlPool, id: u64) -> Result<bool, sqlx::Error> {
    let done = sqlx::query(
        "UPDATE inventory_reservation SET dead = 0, retry_count = 0, next_retry_at = ?, updated_at = ? \
         WHERE id = ?",
    )
    .bind(now())
    .bind(now())
    .bind(id)
    .execute(pool)
    .deadline()
    .await?;
    Ok(done.rows_affected() == 1)
}
