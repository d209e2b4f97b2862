//! MySQL side of the reservation state machine. Every status change is a CAS on
//! `(status, version)`; a change that finishes a Redis step commits its outbox rows in the
//! same transaction, so an event exists if and only if the state change does.

use crate::deadline::Deadline;
use crate::one_off::{in_list_of, OneOff};
use crate::outbox::{insert_outbox, insert_outbox_ignore, write_outbox, NewOutbox};
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
        let mut row = self.to_row_at(status, reject_reason, now());
        row.next_retry_at = row.created_at;
        row
    }

    /// The row [`insert_preparing_many`] wrote at `now` (what a read would return).
    pub fn inserted_row(&self, now: NaiveDateTime) -> Reservation {
        self.to_row_at(ReservationStatus::Preparing, None, now)
    }

    fn to_row_at(
        &self,
        status: ReservationStatus,
        reject_reason: Option<&str>,
        now: NaiveDateTime,
    ) -> Reservation {
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
            next_retry_at: now + STEP_GRACE,
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

/// Now, to the millisecond the DATETIME(3) columns keep: a row built in memory after a
/// write (the Try's reply) then equals the row read back.
pub fn now() -> NaiveDateTime {
    use chrono::SubsecRound;
    Utc::now().naive_utc().trunc_subsecs(3)
}

fn is_duplicate_key(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if db.is_unique_violation())
}

pub async fn insert_preparing(
    pool: &MySqlPool,
    r: &NewReservation,
) -> Result<InsertOutcome, sqlx::Error> {
    insert_preparing_at(pool, r, now()).await
}

async fn insert_preparing_at(
    pool: &MySqlPool,
    r: &NewReservation,
    now: NaiveDateTime,
) -> Result<InsertOutcome, sqlx::Error> {
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

/// [`list_by_order`] for several orders in one statement, in order id order (an empty
/// slice reads nothing).
pub async fn list_by_orders(
    pool: &MySqlPool,
    order_ids: &[u64],
) -> Result<Vec<Reservation>, sqlx::Error> {
    if order_ids.is_empty() {
        return Ok(Vec::new());
    }
    let mut query = sqlx::QueryBuilder::<MySql>::new(format!(
        "SELECT {COLUMNS} FROM inventory_reservation WHERE order_id IN "
    ));
    in_list_of(&mut query, order_ids.iter().copied());
    query.push(" ORDER BY order_id, order_item_id, dish_id");
    query
        .one_off_as::<Reservation>()
        .fetch_all(pool)
        .deadline()
        .await
}

/// [`insert_preparing`] for a group of Trys in one statement (group commit): each row is
/// inserted unless its order is fenced, exactly as the single-row statement decides, and a
/// row whose item already has a reservation is skipped instead of failing the group. The
/// outcomes are in the order of `rows`.
/// Also answers the time written as `created_at` (see [`NewReservation::inserted_row`]).
pub async fn insert_preparing_many(
    pool: &MySqlPool,
    rows: &[NewReservation],
) -> Result<(NaiveDateTime, Vec<InsertOutcome>), sqlx::Error> {
    let now = now();
    if rows.len() <= 1 {
        let mut outcomes = Vec::with_capacity(rows.len());
        for r in rows {
            outcomes.push(insert_preparing_at(pool, r, now).await?);
        }
        return Ok((now, outcomes));
    }
    // IGNORE only skips duplicate keys here: every other value is typed and checked by
    // the service before it gets this far. Without it one repeat would fail the group.
    let inserted = crate::retry::on_lock_conflict(3, || async {
        let mut query = sqlx::QueryBuilder::<MySql>::new(
            "INSERT IGNORE INTO inventory_reservation (id, order_id, order_item_id, merchant_id, \
             dish_id, stock_bucket_id, stock_date, quantity, order_type, processing_time, \
             expire_at, status, current_operation_id, next_retry_at, created_at, updated_at) \
             SELECT v.* FROM (",
        );
        // The first SELECT names the derived table's columns (MariaDB has no column list
        // after the alias).
        const NAMES: [&str; 16] = [
            "id",
            "order_id",
            "order_item_id",
            "merchant_id",
            "dish_id",
            "stock_bucket_id",
            "stock_date",
            "quantity",
            "order_type",
            "processing_time",
            "expire_at",
            "status",
            "current_operation_id",
            "next_retry_at",
            "created_at",
            "updated_at",
        ];
        for (i, r) in rows.iter().enumerate() {
            query.push(if i == 0 {
                "SELECT "
            } else {
                " UNION ALL SELECT "
            });
            let name = |n: usize| {
                if i == 0 {
                    format!(" AS {}", NAMES[n])
                } else {
                    String::new()
                }
            };
            query.push_bind(r.id).push(name(0)).push(", ");
            query.push_bind(r.order_id).push(name(1)).push(", ");
            query.push_bind(r.order_item_id).push(name(2)).push(", ");
            query.push_bind(r.merchant_id).push(name(3)).push(", ");
            query.push_bind(r.dish_id).push(name(4)).push(", ");
            query.push_bind(&r.stock_bucket_id).push(name(5)).push(", ");
            query.push_bind(r.stock_date).push(name(6)).push(", ");
            query.push_bind(r.quantity).push(name(7)).push(", ");
            query.push_bind(r.order_type).push(name(8)).push(", ");
            query.push_bind(r.processing_time).push(name(9)).push(", ");
            query.push_bind(r.expire_at).push(name(10)).push(", ");
            query
                .push_bind(ReservationStatus::Preparing.code() as i8)
                .push(name(11))
                .push(", ");
            query
                .push_bind(&r.try_operation_id)
                .push(name(12))
                .push(", ");
            query.push_bind(now + STEP_GRACE).push(name(13)).push(", ");
            query.push_bind(now).push(name(14)).push(", ");
            query.push_bind(now).push(name(15));
        }
        // The same fence probe as the single-row statement, per row, in this one statement.
        query.push(
            ") AS v WHERE NOT EXISTS \
             (SELECT 1 FROM inventory_order_fence f WHERE f.order_id = v.order_id)",
        );
        query.one_off().execute(pool).deadline().await
    })
    .await?
    .rows_affected();
    if inserted == rows.len() as u64 {
        return Ok((now, vec![InsertOutcome::Inserted; rows.len()]));
    }
    // Some were skipped (a repeat of an item, or a fenced order). Which ones, and the rows
    // the repeats answer with, is one read of the group's items: one read per skipped row
    // held the insert stage, and every fresh Try queued behind it, for as many round trips
    // as a burst of client retries had repeats.
    let mut query = sqlx::QueryBuilder::<MySql>::new(format!(
        "SELECT {COLUMNS} FROM inventory_reservation WHERE order_item_id IN "
    ));
    in_list_of(&mut query, rows.iter().map(|r| r.order_item_id));
    let found = query
        .one_off_as::<Reservation>()
        .fetch_all(pool)
        .deadline()
        .await?;
    Ok((now, group_outcomes(rows, found)))
}

/// Each row's outcome, from the rows its group's items have after the group's INSERT: its
/// own row (the same id) was inserted; another row of its item and dish makes it a repeat;
/// none means the order's fence kept it out (the single-row path decides the same).
fn group_outcomes(rows: &[NewReservation], found: Vec<Reservation>) -> Vec<InsertOutcome> {
    let by_item: std::collections::HashMap<(u64, u64), Reservation> = found
        .into_iter()
        .map(|f| ((f.order_item_id, f.dish_id), f))
        .collect();
    rows.iter()
        .map(|r| match by_item.get(&(r.order_item_id, r.dish_id)) {
            Some(f) if f.id == r.id => InsertOutcome::Inserted,
            Some(f) => InsertOutcome::Existing(Box::new(f.clone())),
            None => InsertOutcome::OrderFailed,
        })
        .collect()
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
    for b in items {
        query.push(" WHEN ").push_bind(b.row.id);
        query.push(" THEN ").push_bind(b.to.code() as i8);
    }
    query.push(" END, current_operation_id = CASE id");
    for b in items {
        query.push(" WHEN ").push_bind(b.row.id);
        query.push(" THEN ").push_bind(b.operation_id.clone());
    }
    query.push(" END, pending_quantity = CASE id");
    for b in items {
        query.push(" WHEN ").push_bind(b.row.id);
        query.push(" THEN ").push_bind(b.pending_quantity);
    }
    query.push(" END, resume_status = CASE id");
    for b in items {
        query.push(" WHEN ").push_bind(b.row.id);
        query
            .push(" THEN ")
            .push_bind(b.resume_status.map(|s| s.code() as i8));
    }
    query.push(" END, retry_count = 0, next_retry_at = ");
    query.push_bind(now + STEP_GRACE);
    query.push(", last_error = NULL, version = version + 1, updated_at = ");
    query.push_bind(now);
    query.push(" WHERE id IN ");
    in_list_of(&mut query, items.iter().map(|b| b.row.id));
    query.push(" AND status = CASE id");
    for b in items {
        query.push(" WHEN ").push_bind(b.row.id);
        query.push(" THEN ").push_bind(b.row.status);
    }
    query.push(" END AND version = CASE id");
    for b in items {
        query.push(" WHEN ").push_bind(b.row.id);
        query.push(" THEN ").push_bind(b.row.version);
    }
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
    for (row, c) in items {
        query.push(" WHEN ").push_bind(row.id);
        query.push(" THEN ").push_bind(c.to.code() as i8);
    }
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
    for (row, c) in items {
        query.push(" WHEN ").push_bind(row.id);
        query.push(" THEN ").push_bind(c.refunded_add);
    }
    query.push(" END, reject_reason = CASE id");
    for (row, c) in items {
        query.push(" WHEN ").push_bind(row.id);
        query
            .push(" THEN COALESCE(")
            .push_bind(c.reject_reason.as_deref());
        query.push(", reject_reason)");
    }
    query.push(
        " END, pending_quantity = 0, resume_status = NULL, retry_count = 0, \
         last_error = NULL, version = version + 1, updated_at = ",
    );
    query.push_bind(now);
    query.push(" WHERE id IN ");
    in_list_of(&mut query, items.iter().map(|(row, _)| row.id));
    query.push(" AND status = CASE id");
    for (row, _) in items {
        query.push(" WHEN ").push_bind(row.id);
        query.push(" THEN ").push_bind(row.status);
    }
    query.push(" END AND version = CASE id");
    for (row, _) in items {
        query.push(" WHEN ").push_bind(row.id);
        query.push(" THEN ").push_bind(row.version);
    }
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

/// Ids of RESERVED rows past `expire_at` that were not alerted yet, the longest expired first.
pub async fn find_stale(pool: &MySqlPool, limit: u32) -> Result<Vec<u64>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT id FROM inventory_reservation WHERE status = ? AND expire_at < ? \
         AND stale_alerted_at IS NULL ORDER BY expire_at LIMIT ?",
    )
    .bind(ReservationStatus::Reserved.code() as i8)
    .bind(now())
    .bind(limit)
    .fetch_all(pool)
    .deadline()
    .await
}

/// Alerts the stale reservations among `ids` (read by [`find_stale`]) in one transaction:
/// locks those rows, keeps the ones still RESERVED, past `expire_at` and not alerted (a
/// Confirm or another watcher may have come since the read), marks them and enqueues one
/// event each, built by `event` from the row as locked. Returns the rows alerted, in id order.
/// The lock is by primary key only, so no index range of the Try path is held; rows are
/// locked in id order, as the group CAS locks its rows, so the two cannot deadlock.
pub async fn alert_stale<F>(
    pool: &MySqlPool,
    ids: &[u64],
    event: F,
) -> Result<Vec<Reservation>, sqlx::Error>
where
    F: Fn(&Reservation) -> NewOutbox,
{
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let mut tx = crate::deadline::begin(pool).await?;
    let mut read = sqlx::QueryBuilder::<MySql>::new(format!(
        "SELECT {COLUMNS} FROM inventory_reservation WHERE id IN "
    ));
    in_list_of(&mut read, ids.iter().copied());
    read.push(" ORDER BY id FOR UPDATE");
    let locked: Vec<Reservation> = read.one_off_as().fetch_all(&mut *tx).deadline().await?;
    let now = now();
    let stale: Vec<Reservation> = locked
        .into_iter()
        .filter(|r| {
            r.status == ReservationStatus::Reserved.code() as i8
                && r.stale_alerted_at.is_none()
                && r.expire_at < now
        })
        .collect();
    if stale.is_empty() {
        tx.rollback().deadline().await?;
        return Ok(stale);
    }
    let mut mark =
        sqlx::QueryBuilder::<MySql>::new("UPDATE inventory_reservation SET stale_alerted_at = ");
    mark.push_bind(now).push(" WHERE id IN ");
    in_list_of(&mut mark, stale.iter().map(|r| r.id));
    mark.one_off().execute(&mut *tx).deadline().await?;
    let events: Vec<NewOutbox> = stale.iter().map(&event).collect();
    insert_outbox_ignore(&mut tx, &events).await?;
    tx.commit().deadline().await?;
    Ok(stale)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn new(id: u64, item: u64, dish: u64) -> NewReservation {
        NewReservation {
            id,
            order_id: 9,
            order_item_id: item,
            merchant_id: 1,
            dish_id: dish,
            stock_bucket_id: "1:7:2026-12-06".into(),
            stock_date: NaiveDate::from_ymd_opt(2026, 12, 6).expect("date"),
            quantity: 1,
            order_type: 0,
            processing_time: None,
            expire_at: now(),
            try_operation_id: format!("try-{id}"),
        }
    }

    #[test]
    fn a_group_read_tells_inserted_repeated_and_fenced_rows_apart() {
        let inserted = new(1, 100, 7);
        let repeat = new(2, 200, 7);
        let fenced = new(3, 300, 7);
        // The same item with another dish is a reservation of its own, not this row's.
        let other_dish = new(4, 300, 8);
        let first_try = new(50, 200, 7).inserted_row(now());
        let found = vec![
            inserted.inserted_row(now()),
            first_try.clone(),
            other_dish.inserted_row(now()),
        ];
        let rows = [inserted, repeat, fenced, other_dish];
        assert_eq!(
            group_outcomes(&rows, found),
            vec![
                InsertOutcome::Inserted,
                InsertOutcome::Existing(Box::new(first_try)),
                InsertOutcome::OrderFailed,
                InsertOutcome::Inserted,
            ]
        );
    }
}
