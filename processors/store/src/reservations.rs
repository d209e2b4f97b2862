//! MySQL side of the reservation state machine. Every status change is a CAS on
//! `(status, version)`; a change that finishes a Redis step commits its outbox rows in the
//! same transaction, so an event exists if and only if the state change does.

use crate::deadline::Deadline;
use crate::outbox::{insert_outbox, write_outbox, NewOutbox};
use chrono::{NaiveDate, NaiveDateTime, Utc};
use sqlx::{MySql, MySqlPool};
use stocksvr_core::reservation::{ReservationStatus, SyncStatus};

/// `inventory_reservation` row.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct Reservation {
    pub id: u64,
    pub order_id: u64,
    pub order_item_id: u64,
    pub merchant_id: u64,
    pub dish_id: u64,
    pub stock_bucket_id: String,
    pub stock_date: NaiveDate,
    pub quantity: u32,
    pub refunded_quantity: u32,
    pub pending_quantity: u32,
    pub order_type: i8,
    pub processing_time: Option<NaiveDateTime>,
    pub expire_at: NaiveDateTime,
    pub status: i8,
    pub resume_status: Option<i8>,
    pub reject_reason: Option<String>,
    pub current_operation_id: String,
    pub retry_count: u32,
    pub next_retry_at: NaiveDateTime,
    pub last_error: Option<String>,
    pub sync_status: i8,
    pub expected_redis_version: Option<u64>,
    pub synced_redis_version: u64,
    pub version: u32,
    pub created_at: NaiveDateTime,
    pub updated_at: NaiveDateTime,
    pub stale_alerted_at: Option<NaiveDateTime>,
    /// 1 once recovery gave up on the row.
    pub dead: i8,
}

impl Reservation {
    /// The row's status; an unknown code means the table was written by something else.
    pub fn status(&self) -> Result<ReservationStatus, sqlx::Error> {
        u8::try_from(self.status)
            .ok()
            .and_then(ReservationStatus::from_code)
            .ok_or_else(|| {
                sqlx::Error::Decode(format!("unknown reservation status {}", self.status).into())
            })
    }

    /// Instant or scheduled (`order_type` 1 or 2; anything else reads as instant).
    pub fn order_type(&self) -> stocksvr_core::events::OrderType {
        u8::try_from(self.order_type)
            .ok()
            .and_then(stocksvr_core::events::OrderType::from_code)
            .unwrap_or(stocksvr_core::events::OrderType::Instant)
    }

    /// The status's name, `UNKNOWN` for a code no version of stocksvr writes.
    pub fn status_name(&self) -> &'static str {
        self.status()
            .map(ReservationStatus::name)
            .unwrap_or("UNKNOWN")
    }

    pub fn resume_status(&self) -> Option<ReservationStatus> {
        self.resume_status
            .and_then(|c| u8::try_from(c).ok())
            .and_then(ReservationStatus::from_code)
    }

    /// What the reservation still holds in its bucket.
    pub fn held(&self) -> u32 {
        self.quantity.saturating_sub(self.refunded_quantity)
    }
}

pub(crate) const COLUMNS: &str =
    "id, order_id, order_item_id, merchant_id, dish_id, stock_bucket_id, stock_date, \
    quantity, refunded_quantity, pending_quantity, order_type, processing_time, expire_at, status, \
    resume_status, reject_reason, current_operation_id, retry_count, next_retry_at, last_error, \
    sync_status, expected_redis_version, synced_redis_version, version, created_at, updated_at, \
    stale_alerted_at, dead";

/// A reservation about to be written as PREPARING.
#[derive(Debug, Clone)]
pub struct NewReservation {
    pub id: u64,
    pub order_id: u64,
    pub order_item_id: u64,
    pub merchant_id: u64,
    pub dish_id: u64,
    pub stock_bucket_id: String,
    pub stock_date: NaiveDate,
    pub quantity: u32,
    pub order_type: i8,
    pub processing_time: Option<NaiveDateTime>,
    pub expire_at: NaiveDateTime,
    pub try_operation_id: String,
}

impl NewReservation {
    /// The row this reservation would be in `status` (what a rejection announces).
    pub fn to_row(&self, status: ReservationStatus, reject_reason: Option<&str>) -> Reservation {
        let now = now();
        Reservation {
            id: self.id,
            order_id: self.order_id,
            order_item_id: self.order_item_id,
            merchant_id: self.merchant_id,
            dish_id: self.dish_id,
            stock_bucket_id: self.stock_bucket_id.clone(),
            stock_date: self.stock_date,
            quantity: self.quantity,
            refunded_quantity: 0,
            pending_quantity: 0,
            order_type: self.order_type,
            processing_time: self.processing_time,
            expire_at: self.expire_at,
            status: status.code() as i8,
            resume_status: None,
            reject_reason: reject_reason.map(str::to_string),
            current_operation_id: self.try_operation_id.clone(),
            retry_count: 0,
            next_retry_at: now,
            last_error: None,
            sync_status: SyncStatus::Pending.code() as i8,
            expected_redis_version: None,
            synced_redis_version: 0,
            version: 1,
            created_at: now,
            updated_at: now,
            stale_alerted_at: None,
            dead: 0,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum InsertOutcome {
    /// The order failed before this Try reached MySQL (its OrderCreatedFailed wrote the
    /// order fence): nothing was inserted and nothing may be held for it.
    OrderFailed,
    Inserted,
    /// `(order_item_id, dish_id)` already has a reservation: the Try is a repeat.
    Existing(Box<Reservation>),
}

/// How long a freshly started step belongs to the request running it before the recovery
/// worker may resume it (both would use the same operation id, so this only saves work).
pub const STEP_GRACE: chrono::TimeDelta = chrono::TimeDelta::seconds(10);

pub(crate) fn now() -> NaiveDateTime {
    Utc::now().naive_utc()
}

fn is_duplicate_key(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if db.is_unique_violation())
}

pub async fn insert_preparing(
    pool: &MySqlPool,
    r: &NewReservation,
) -> Result<InsertOutcome, sqlx::Error> {
    let now = now();
    // One statement, so nothing can come between the fence check and the insert: under
    // REPEATABLE READ the NOT EXISTS probe locks the fence key (or the gap where it would
    // be), and an OrderCreatedFailed writing the fence waits for this insert to commit, or
    // this insert waits for the fence and then inserts nothing (see migration 5).
    // The probe's lock and a concurrent fence writer's locks can deadlock; InnoDB then rolls
    // this statement back, so it is simply run again.
    let result = crate::retry::on_lock_conflict(3, || insert_unless_fenced(pool, r, now)).await;
    match result {
        Ok(done) if done.rows_affected() == 1 => Ok(InsertOutcome::Inserted),
        // Nothing inserted: the order's fence exists. A repeat of a Try that got in before
        // the fence still answers with its row.
        Ok(_) => Ok(
            match find_by_item(pool, r.order_item_id, r.dish_id).await? {
                Some(existing) => InsertOutcome::Existing(Box::new(existing)),
                None => InsertOutcome::OrderFailed,
            },
        ),
        Err(e) if is_duplicate_key(&e) => {
            match find_by_item(pool, r.order_item_id, r.dish_id).await? {
                Some(existing) => Ok(InsertOutcome::Existing(Box::new(existing))),
                // The duplicate was on the primary key: a snowflake collision would be a bug.
                None => Err(e),
            }
        }
        Err(e) => Err(e),
    }
}

async fn insert_unless_fenced(
    pool: &MySqlPool,
    r: &NewReservation,
    now: chrono::NaiveDateTime,
) -> Result<sqlx::mysql::MySqlQueryResult, sqlx::Error> {
    sqlx::query(
        "INSERT INTO inventory_reservation (id, order_id, order_item_id, merchant_id, dish_id, \
         stock_bucket_id, stock_date, quantity, order_type, processing_time, expire_at, status, \
         current_operation_id, next_retry_at, created_at, updated_at) \
         SELECT ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ? FROM DUAL \
         WHERE NOT EXISTS (SELECT 1 FROM inventory_order_fence WHERE order_id = ?)",
    )
    .bind(r.id)
    .bind(r.order_id)
    .bind(r.order_item_id)
    .bind(r.merchant_id)
    .bind(r.dish_id)
    .bind(&r.stock_bucket_id)
    .bind(r.stock_date)
    .bind(r.quantity)
    .bind(r.order_type)
    .bind(r.processing_time)
    .bind(r.expire_at)
    .bind(ReservationStatus::Preparing.code() as i8)
    .bind(&r.try_operation_id)
    .bind(now + STEP_GRACE)
    .bind(now)
    .bind(now)
    .bind(r.order_id)
    .execute(pool)
    .deadline()
    .await
}

pub async fn find(pool: &MySqlPool, id: u64) -> Result<Option<Reservation>, sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM inventory_reservation WHERE id = ?"
    ))
    .bind(id)
    .fetch_optional(pool)
    .deadline()
    .await
}

pub async fn find_by_item(
    pool: &MySqlPool,
    order_item_id: u64,
    dish_id: u64,
) -> Result<Option<Reservation>, sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM inventory_reservation WHERE order_item_id = ? AND dish_id = ?"
    ))
    .bind(order_item_id)
    .bind(dish_id)
    .fetch_optional(pool)
    .deadline()
    .await
}

pub async fn list_by_order(
    pool: &MySqlPool,
    order_id: u64,
) -> Result<Vec<Reservation>, sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM inventory_reservation WHERE order_id = ? ORDER BY order_item_id, dish_id"
    ))
    .bind(order_id)
    .fetch_all(pool)
    .deadline()
    .await
}

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
    let now = now();
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
    let mut tx = crate::deadline::begin(pool).await?;
    let now = now();
    let done = sqlx::query(
        "UPDATE inventory_reservation SET status = ?, \
         expected_redis_version = COALESCE(?, expected_redis_version), \
         sync_status = IF(? IS NULL, sync_status, ?), \
         refunded_quantity = refunded_quantity + ?, pending_quantity = 0, resume_status = NULL, \
         reject_reason = COALESCE(?, reject_reason), retry_count = 0, last_error = NULL, \
         version = version + 1, updated_at = ? WHERE id = ? AND status = ? AND version = ?",
    )
    .bind(completion.to.code() as i8)
    .bind(completion.expected_redis_version)
    .bind(completion.expected_redis_version)
    .bind(SyncStatus::Pending.code())
    .bind(completion.refunded_add)
    .bind(completion.reject_reason.as_deref())
    .bind(now)
    .bind(id)
    .bind(from.code() as i8)
    .bind(version)
    .execute(&mut *tx)
    .deadline()
    .await?;
    if done.rows_affected() != 1 {
        tx.rollback().deadline().await?;
        return Ok(false);
    }
    insert_outbox(&mut tx, &completion.outbox).await?;
    tx.commit().deadline().await?;
    Ok(true)
}

/// Notes a failed attempt on an intermediate state without moving it: the recovery worker
/// picks it up at `next_retry_at` and resumes with the stored operation id.
pub async fn record_failure(
    pool: &MySqlPool,
    id: u64,
    status: ReservationStatus,
    error: &str,
    retry_after: chrono::Duration,
) -> Result<(), sqlx::Error> {
    let error: String = error.chars().take(1000).collect();
    sqlx::query(
        "UPDATE inventory_reservation SET retry_count = retry_count + 1, last_error = ?, \
         next_retry_at = ?, updated_at = ? WHERE id = ? AND status = ?",
    )
    .bind(error)
    .bind(now() + retry_after)
    .bind(now())
    .bind(id)
    .bind(status.code() as i8)
    .execute(pool)
    .deadline()
    .await?;
    Ok(())
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
    let reason: String = reason.chars().take(1000).collect();
    sqlx::query(
        "UPDATE inventory_reservation SET last_error = ?, next_retry_at = ?, updated_at = ? \
         WHERE id = ? AND status = ?",
    )
    .bind(reason)
    .bind(now() + retry_after)
    .bind(now())
    .bind(id)
    .bind(status.code() as i8)
    .execute(pool)
    .deadline()
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

/// RESERVED rows past `expire_at` that were not alerted yet.
pub async fn find_stale(pool: &MySqlPool, limit: u32) -> Result<Vec<Reservation>, sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM inventory_reservation WHERE status = ? AND expire_at < ? \
         AND stale_alerted_at IS NULL ORDER BY expire_at LIMIT ?"
    ))
    .bind(ReservationStatus::Reserved.code() as i8)
    .bind(now())
    .bind(limit)
    .fetch_all(pool)
    .deadline()
    .await
}

/// How many RESERVED rows are past `expire_at` now (alerted or not), for the gauge.
pub async fn count_stale(pool: &MySqlPool) -> Result<i64, sqlx::Error> {
    let (n,): (i64,) = sqlx::query_as(
        "SELECT COUNT(*) FROM inventory_reservation WHERE status = ? AND expire_at < ?",
    )
    .bind(ReservationStatus::Reserved.code() as i8)
    .bind(now())
    .fetch_one(pool)
    .deadline()
    .await?;
    Ok(n)
}

/// Marks the alert sent and enqueues its event in one transaction; false when another
/// watcher (or a status change) got there first.
pub async fn mark_stale_alerted(
    pool: &MySqlPool,
    id: u64,
    alert: &NewOutbox,
) -> Result<bool, sqlx::Error> {
    let mark = sqlx::query(
        "UPDATE inventory_reservation SET stale_alerted_at = ? WHERE id = ? AND status = ? AND stale_alerted_at IS NULL",
    )
    .bind(now())
    .bind(id)
    .bind(ReservationStatus::Reserved.code() as i8);
    mark_and_alert(pool, mark, alert).await
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
