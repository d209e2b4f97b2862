//! The Try's insert of PREPARING rows: one statement per Try, or one per group of Trys
//! (group commit), each row unless its order is fenced; a repeat of an item answers with the
//! row already there.

use super::read::find_by_item;
use super::{InsertOutcome, NewReservation, Reservation, COLUMNS, STEP_GRACE};
use crate::clock::now;
use crate::deadline::Deadline;
use crate::one_off::{in_list_of, OneOff};
use chrono::NaiveDateTime;
use sqlx::{MySql, MySqlPool};
use stocksvr_core::reservation::ReservationStatus;

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
    let inserted = crate::retry::on_lock_conflict(3, || async {
        let mut query = group_insert(rows, now);
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

/// The columns a new row is written with, in the order [`group_insert`] binds them.
const INSERTED: [&str; 16] = [
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

/// The group's one `INSERT IGNORE … SELECT … UNION ALL SELECT …` with the fence probe per
/// row. IGNORE only skips duplicate keys here: every other value is typed and checked by the
/// service before it gets this far. Without it one repeat would fail the group.
fn group_insert(rows: &[NewReservation], now: NaiveDateTime) -> sqlx::QueryBuilder<'_, MySql> {
    let mut query = sqlx::QueryBuilder::<MySql>::new(format!(
        "INSERT IGNORE INTO inventory_reservation ({}) SELECT v.* FROM (",
        INSERTED.join(", ")
    ));
    for (i, r) in rows.iter().enumerate() {
        query.push(if i == 0 {
            "SELECT "
        } else {
            " UNION ALL SELECT "
        });
        // The first SELECT names the derived table's columns (MariaDB has no column list
        // after the alias).
        let name = |n: usize| {
            if i == 0 {
                format!(" AS {}", INSERTED[n])
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
    query
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

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::NaiveDate;

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
