//! The stale-reservation watch: RESERVED rows past `expire_at`, alerted once each.

use super::{Reservation, COLUMNS};
use crate::clock::now;
use crate::deadline::Deadline;
use crate::one_off::{in_list_of, OneOff};
use crate::outbox::{insert_outbox_ignore, NewOutbox};
use sqlx::{MySql, MySqlPool};
use stocksvr_core::reservation::ReservationStatus;

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
