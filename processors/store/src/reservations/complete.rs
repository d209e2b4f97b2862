//! The CAS that lands a finished Redis step in MySQL, with its outbox rows in the same
//! transaction: one row, or a group in one UPDATE and one INSERT (group commit).

use super::Reservation;
use crate::clock::now;
use crate::deadline::Deadline;
use crate::one_off::{in_list_of, when_id_then, OneOff};
use crate::outbox::{insert_outbox, NewOutbox};
use chrono::NaiveDateTime;
use sqlx::{MySql, MySqlPool};
use stocksvr_core::reservation::{Reached, ReservationStatus, SyncStatus};

/// How a finished Redis step lands in MySQL.
#[derive(Debug, Clone)]
pub struct Completion {
    pub to: ReservationStatus,
    /// Redis version after the step, which the projector must reach (None: no Redis change).
    pub expected_redis_version: Option<u64>,
    pub refunded_add: u32,
    pub reject_reason: Option<String>,
    pub outbox: Vec<NewOutbox>,
}

/// One transaction: CAS `from`@`version` → `completion.to` and the outbox rows.
/// False (and nothing written) when another actor changed the row first.
pub async fn complete_step(
    pool: &MySqlPool,
    id: u64,
    from: ReservationStatus,
    version: u32,
    completion: &Completion,
) -> Result<bool, sqlx::Error> {
    Ok(complete_step_at(pool, id, from, version, completion)
        .await?
        .is_some())
}

/// [`complete_step`], answering the time written as `updated_at` when the CAS landed.
async fn complete_step_at(
    pool: &MySqlPool,
    id: u64,
    from: ReservationStatus,
    version: u32,
    completion: &Completion,
) -> Result<Option<NaiveDateTime>, sqlx::Error> {
    // The CAS and its outbox rows can deadlock with a concurrent group's INSERT of PREPARING
    // rows (gap locks); InnoDB rolls the whole transaction back, so it is simply run again,
    // as the group paths do, instead of failing a Try whose Redis effect already landed.
    crate::retry::on_lock_conflict(3, || complete_step_tx(pool, id, from, version, completion))
        .await
}

/// One attempt of [`complete_step_at`]: the CAS and the outbox rows in one transaction.
async fn complete_step_tx(
    pool: &MySqlPool,
    id: u64,
    from: ReservationStatus,
    version: u32,
    completion: &Completion,
) -> Result<Option<NaiveDateTime>, sqlx::Error> {
    let mut tx = crate::deadline::begin(pool).await?;
    let now = now();
    let done = sqlx::query(
        "UPDATE inventory_reservation SET status = ?, \
         expected_redis_version = COALESCE(?, expected_redis_version), \
         sync_status = IF(? IS NULL, sync_status, ?), \
         refunded_quantity = refunded_quantity + ?, pending_quantity = 0, resume_status = NULL, \
         reject_reason = COALESCE(?, reject_reason), retry_count = 0, last_error = NULL, \
         reached = reached | ?, version = version + 1, updated_at = ? \
         WHERE id = ? AND status = ? AND version = ?",
    )
    .bind(completion.to.code() as i8)
    .bind(completion.expected_redis_version)
    .bind(completion.expected_redis_version)
    .bind(SyncStatus::Pending.code())
    .bind(completion.refunded_add)
    .bind(completion.reject_reason.as_deref())
    .bind(Reached::landing_in(completion.to))
    .bind(now)
    .bind(id)
    .bind(from.code() as i8)
    .bind(version)
    .execute(&mut *tx)
    .deadline()
    .await?;
    if done.rows_affected() != 1 {
        tx.rollback().deadline().await?;
        return Ok(None);
    }
    insert_outbox(&mut tx, &completion.outbox).await?;
    tx.commit().deadline().await?;
    Ok(Some(now))
}

impl Completion {
    /// `row` as the CAS of [`complete_step`] leaves it, `now` being the write's time: what a
    /// read after the commit would return, without the read.
    pub fn applied_to(&self, row: &Reservation, now: NaiveDateTime) -> Reservation {
        let mut next = row.clone();
        next.status = self.to.code() as i8;
        if let Some(v) = self.expected_redis_version {
            next.expected_redis_version = Some(v);
            next.sync_status = SyncStatus::Pending.code() as i8;
        }
        next.refunded_quantity += self.refunded_add;
        next.pending_quantity = 0;
        next.resume_status = None;
        if let Some(reason) = &self.reject_reason {
            next.reject_reason = Some(reason.clone());
        }
        next.retry_count = 0;
        next.last_error = None;
        next.reached |= Reached::landing_in(self.to);
        next.version += 1;
        next.updated_at = now;
        next
    }
}

/// [`complete_step`] for a group of rows in one transaction (group commit): one CAS UPDATE
/// over all of them and one INSERT of all their outbox rows. Each row moves from its own
/// status and version, as the single-row CAS does. When any row lost its CAS the group is
/// rolled back and each row is completed alone, so a row that someone else finished never
/// holds back the others. Returns each row as committed, None where the CAS was lost.
pub async fn complete_steps(
    pool: &MySqlPool,
    items: &[(&Reservation, &Completion)],
) -> Result<Vec<Option<Reservation>>, sqlx::Error> {
    if items.len() > 1 {
        // The group's UPDATE and a concurrent group's INSERT of PREPARING rows can deadlock;
        // InnoDB rolls the whole transaction back, so it is simply run again.
        let completed = crate::retry::on_lock_conflict(3, || complete_group(pool, items)).await?;
        if let Some(rows) = completed {
            return Ok(rows);
        }
    }
    let mut landed = Vec::with_capacity(items.len());
    for (row, c) in items {
        landed.push(complete_one(pool, row, c).await?);
    }
    Ok(landed)
}

/// The group's one transaction; `None` (rolled back) when any row lost its CAS.
async fn complete_group(
    pool: &MySqlPool,
    items: &[(&Reservation, &Completion)],
) -> Result<Option<Vec<Option<Reservation>>>, sqlx::Error> {
    let mut part = PartClock::start();
    let mut tx = crate::deadline::begin(pool).await?;
    part.done("open");
    let now = now();
    let mut query =
        sqlx::QueryBuilder::<MySql>::new("UPDATE inventory_reservation SET status = CASE id");
    when_id_then(
        &mut query,
        items.iter().map(|(row, c)| (row.id, c.to.code() as i8)),
    );
    query.push(" END, expected_redis_version = CASE id");
    for (row, c) in items {
        query.push(" WHEN ").push_bind(row.id);
        query
            .push(" THEN COALESCE(")
            .push_bind(c.expected_redis_version);
        query.push(", expected_redis_version)");
    }
    query.push(" END, sync_status = CASE id");
    for (row, c) in items {
        query.push(" WHEN ").push_bind(row.id).push(" THEN ");
        match c.expected_redis_version {
            Some(_) => query.push_bind(SyncStatus::Pending.code()),
            None => query.push("sync_status"),
        };
    }
    query.push(" END, refunded_quantity = refunded_quantity + CASE id");
    when_id_then(
        &mut query,
        items.iter().map(|(row, c)| (row.id, c.refunded_add)),
    );
    query.push(" END, reject_reason = CASE id");
    for (row, c) in items {
        query.push(" WHEN ").push_bind(row.id);
        query
            .push(" THEN COALESCE(")
            .push_bind(c.reject_reason.as_deref());
        query.push(", reject_reason)");
    }
    query.push(" END, reached = reached | CASE id");
    when_id_then(
        &mut query,
        items
            .iter()
            .map(|(row, c)| (row.id, Reached::landing_in(c.to))),
    );
    query.push(
        " END, pending_quantity = 0, resume_status = NULL, retry_count = 0, \
         last_error = NULL, version = version + 1, updated_at = ",
    );
    query.push_bind(now);
    query.push(" WHERE id IN ");
    in_list_of(&mut query, items.iter().map(|(row, _)| row.id));
    query.push(" AND status = CASE id");
    when_id_then(
        &mut query,
        items.iter().map(|(row, _)| (row.id, row.status)),
    );
    query.push(" END AND version = CASE id");
    when_id_then(
        &mut query,
        items.iter().map(|(row, _)| (row.id, row.version)),
    );
    query.push(" END");
    let done = query.one_off().execute(&mut *tx).deadline().await?;
    part.done("cas");
    if done.rows_affected() == items.len() as u64 {
        let outbox: Vec<&NewOutbox> = items.iter().flat_map(|(_, c)| &c.outbox).collect();
        insert_outbox(&mut tx, &outbox).await?;
        part.done("outbox");
        tx.commit().deadline().await?;
        part.done("commit");
        part.record();
        return Ok(Some(
            items
                .iter()
                .map(|(row, c)| Some(c.applied_to(row, now)))
                .collect(),
        ));
    }
    tx.rollback().deadline().await?;
    Ok(None)
}

/// Times the parts of a commit group's transaction (`stocksvr_try_group_part_seconds`): the
/// group's write time alone does not say whether the connection, a statement or the log
/// flush holds the group back. Recorded only for a transaction that committed, so each part
/// counts once per landed group (an attempt lost to a deadlock or a lost CAS is in the
/// stage's write time only).
struct PartClock {
    since: std::time::Instant,
    parts: Vec<(&'static str, f64)>,
}

impl PartClock {
    fn start() -> Self {
        Self {
            since: std::time::Instant::now(),
            parts: Vec::with_capacity(4),
        }
    }

    /// The part that ends now; the next one starts.
    fn done(&mut self, part: &'static str) {
        let now = std::time::Instant::now();
        self.parts
            .push((part, now.duration_since(self.since).as_secs_f64()));
        self.since = now;
    }

    fn record(self) {
        for (part, seconds) in self.parts {
            metrics::histogram!(stocksvr_telemetry::names::TRY_GROUP_PART_SECONDS, "part" => part)
                .record(seconds);
        }
    }
}

/// [`complete_step`] of `row` from its own status and version, returning the committed row.
pub async fn complete_one(
    pool: &MySqlPool,
    row: &Reservation,
    completion: &Completion,
) -> Result<Option<Reservation>, sqlx::Error> {
    let from = row.status()?;
    Ok(
        complete_step_at(pool, row.id, from, row.version, completion)
            .await?
            .map(|now| completion.applied_to(row, now)),
    )
}
