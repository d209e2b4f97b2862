//! The CAS that moves a reservation into an intermediate step (CONFIRMING, CANCELING,
//! REFUNDING) with the operation id a resume needs, one row or a group in one statement.

use super::{Reservation, STEP_GRACE};
use crate::clock::now;
use crate::deadline::Deadline;
use crate::one_off::{in_list_of, when_id_then, OneOff};
use chrono::NaiveDateTime;
use sqlx::{MySql, MySqlPool};
use stocksvr_core::reservation::ReservationStatus;

/// The intermediate step a CAS moves into, with what a resume needs.
#[derive(Debug, Clone)]
pub struct Step<'a> {
    pub to: ReservationStatus,
    pub operation_id: &'a str,
    pub pending_quantity: u32,
    /// For a partial refund: where the reservation returns afterwards.
    pub resume_status: Option<ReservationStatus>,
}

/// CAS `from`@`version` → `step.to`. False when another actor changed the row first.
pub async fn begin_step(
    conn: &mut sqlx::MySqlConnection,
    id: u64,
    from: ReservationStatus,
    version: u32,
    step: &Step<'_>,
) -> Result<bool, sqlx::Error> {
    begin_step_at(conn, id, from, version, step, now()).await
}

/// [`begin_step`] writing `now` as `updated_at`, so the caller can build the row it left
/// ([`Step::applied_to`]) instead of reading it back.
async fn begin_step_at(
    conn: &mut sqlx::MySqlConnection,
    id: u64,
    from: ReservationStatus,
    version: u32,
    step: &Step<'_>,
    now: NaiveDateTime,
) -> Result<bool, sqlx::Error> {
    let done = sqlx::query(
        "UPDATE inventory_reservation SET status = ?, current_operation_id = ?, pending_quantity = ?, \
         resume_status = ?, retry_count = 0, next_retry_at = ?, last_error = NULL, version = version + 1, \
         updated_at = ? WHERE id = ? AND status = ? AND version = ?",
    )
    .bind(step.to.code() as i8)
    .bind(step.operation_id)
    .bind(step.pending_quantity)
    .bind(step.resume_status.map(|s| s.code() as i8))
    .bind(now + STEP_GRACE)
    .bind(now)
    .bind(id)
    .bind(from.code() as i8)
    .bind(version)
    .execute(conn)
    .deadline()
    .await?;
    Ok(done.rows_affected() == 1)
}

impl Step<'_> {
    /// `row` as the CAS of [`begin_step`] leaves it, `now` being the write's time: what a
    /// read after the write would return, without the read.
    pub fn applied_to(&self, row: &Reservation, now: NaiveDateTime) -> Reservation {
        let mut next = row.clone();
        next.status = self.to.code() as i8;
        next.current_operation_id = self.operation_id.to_string();
        next.pending_quantity = self.pending_quantity;
        next.resume_status = self.resume_status.map(|s| s.code() as i8);
        next.retry_count = 0;
        next.next_retry_at = now + STEP_GRACE;
        next.last_error = None;
        next.version += 1;
        next.updated_at = now;
        next
    }
}

/// An owned [`Step`] of one row, for a group of begins handed between tasks.
#[derive(Debug, Clone)]
pub struct Begin {
    /// The row as the caller read it: the CAS is on its status and version.
    pub row: Reservation,
    pub to: ReservationStatus,
    pub operation_id: String,
    pub pending_quantity: u32,
    pub resume_status: Option<ReservationStatus>,
}

impl Begin {
    pub fn step(&self) -> Step<'_> {
        Step {
            to: self.to,
            operation_id: &self.operation_id,
            pending_quantity: self.pending_quantity,
            resume_status: self.resume_status,
        }
    }
}

/// [`begin_step`] for a group of rows (group commit): one multi-row CAS in one transaction,
/// each row from its own status and version. When any row lost its CAS the group is rolled
/// back and each row is begun alone, so a row someone else moved never holds back the
/// others. Returns each row as the CAS left it, None where the CAS was lost. A crash at any
/// point leaves each row either untouched or in its intermediate status with its operation
/// id, as the single-row CAS does: the recovery worker resumes those.
pub async fn begin_steps(
    pool: &MySqlPool,
    items: &[Begin],
) -> Result<Vec<Option<Reservation>>, sqlx::Error> {
    if items.len() > 1 {
        // Like complete_steps: a deadlock with a concurrent group rolls the whole
        // transaction back, so it is simply run again.
        let begun = crate::retry::on_lock_conflict(3, || begin_group(pool, items)).await?;
        if let Some(rows) = begun {
            return Ok(rows);
        }
    }
    let mut begun = Vec::with_capacity(items.len());
    for b in items {
        let now = now();
        let from = b.row.status()?;
        let step = b.step();
        // An autocommitted CAS that lost a deadlock (to a concurrent group's INSERT of
        // PREPARING rows) did nothing, so it is run again rather than answered to the caller.
        let landed = crate::retry::on_lock_conflict(3, || async {
            let mut conn = pool.acquire().deadline().await?;
            begin_step_at(&mut conn, b.row.id, from, b.row.version, &step, now).await
        })
        .await?;
        begun.push(landed.then(|| step.applied_to(&b.row, now)));
    }
    Ok(begun)
}

/// The group's one transaction; `None` (rolled back) when any row lost its CAS.
async fn begin_group(
    pool: &MySqlPool,
    items: &[Begin],
) -> Result<Option<Vec<Option<Reservation>>>, sqlx::Error> {
    let mut tx = crate::deadline::begin(pool).await?;
    let now = now();
    let mut query =
        sqlx::QueryBuilder::<MySql>::new("UPDATE inventory_reservation SET status = CASE id");
    when_id_then(
        &mut query,
        items.iter().map(|b| (b.row.id, b.to.code() as i8)),
    );
    query.push(" END, current_operation_id = CASE id");
    when_id_then(
        &mut query,
        items.iter().map(|b| (b.row.id, b.operation_id.as_str())),
    );
    query.push(" END, pending_quantity = CASE id");
    when_id_then(
        &mut query,
        items.iter().map(|b| (b.row.id, b.pending_quantity)),
    );
    query.push(" END, resume_status = CASE id");
    when_id_then(
        &mut query,
        items
            .iter()
            .map(|b| (b.row.id, b.resume_status.map(|s| s.code() as i8))),
    );
    query.push(" END, retry_count = 0, next_retry_at = ");
    query.push_bind(now + STEP_GRACE);
    query.push(", last_error = NULL, version = version + 1, updated_at = ");
    query.push_bind(now);
    query.push(" WHERE id IN ");
    in_list_of(&mut query, items.iter().map(|b| b.row.id));
    query.push(" AND status = CASE id");
    when_id_then(&mut query, items.iter().map(|b| (b.row.id, b.row.status)));
    query.push(" END AND version = CASE id");
    when_id_then(&mut query, items.iter().map(|b| (b.row.id, b.row.version)));
    query.push(" END");
    let done = query.one_off().execute(&mut *tx).deadline().await?;
    if done.rows_affected() == items.len() as u64 {
        tx.commit().deadline().await?;
        return Ok(Some(
            items
                .iter()
                .map(|b| Some(b.step().applied_to(&b.row, now)))
                .collect(),
        ));
    }
    tx.rollback().deadline().await?;
    Ok(None)
}
