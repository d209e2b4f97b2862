//! The order-level records of the order-lifecycle processor: the order fence of a failed
//! order, the events parked until they can apply, and the consumer inbox that recognises an
//! event already handled when a topic is replayed.

use crate::clock::now;
use crate::deadline::Deadline;
use crate::one_off::{in_list_of, OneOff};
use crate::outbox::{insert_outbox, NewOutbox};
use crate::reservations::{NewReservation, Reservation};
use chrono::{NaiveDateTime, TimeDelta};
use sqlx::{MySql, MySqlPool, Transaction};
use std::collections::HashSet;
use stocksvr_core::reservation::ReservationStatus;

/// Writes the order fence of a failed order inside the caller's transaction (the one that
/// takes the cancel decision). True when this call wrote it.
pub async fn fence_order(
    tx: &mut Transaction<'_, MySql>,
    order_id: u64,
    event_id: &str,
    reason: Option<&str>,
) -> Result<bool, sqlx::Error> {
    let done = sqlx::query(
        "INSERT IGNORE INTO inventory_order_fence (order_id, event_id, reason, created_at) \
         VALUES (?, ?, ?, ?)",
    )
    .bind(order_id)
    .bind(cut(event_id, 128))
    .bind(reason.map(|r| cut(r, 255)))
    .bind(now())
    .execute(&mut **tx)
    .deadline()
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Whether the order failed (its fence exists).
pub async fn order_failed(pool: &MySqlPool, order_id: u64) -> Result<bool, sqlx::Error> {
    let row: Option<(u64,)> =
        sqlx::query_as("SELECT order_id FROM inventory_order_fence WHERE order_id = ?")
            .bind(order_id)
            .fetch_optional(pool)
            .deadline()
            .await?;
    Ok(row.is_some())
}

/// The reservations of `order_id`, locked for the rest of the transaction.
pub async fn lock_order(
    tx: &mut Transaction<'_, MySql>,
    order_id: u64,
) -> Result<Vec<Reservation>, sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT {} FROM inventory_reservation WHERE order_id = ? ORDER BY id FOR UPDATE",
        crate::reservations::COLUMNS
    ))
    .bind(order_id)
    .fetch_all(&mut **tx)
    .deadline()
    .await
}

/// A Try of a failed order, recorded as REJECTED (reason ORDER_FAILED) with its
/// InventoryRejected event in one transaction, so the order domain hears of it exactly once
/// however often the Try is repeated. False when the item already had a row (a repeat).
pub async fn insert_rejected(
    pool: &MySqlPool,
    r: &NewReservation,
    reason: &str,
    event: &NewOutbox,
) -> Result<bool, sqlx::Error> {
    let mut tx = crate::deadline::begin(pool).await?;
    let now = now();
    let inserted = sqlx::query(
        "INSERT IGNORE INTO inventory_reservation (id, order_id, order_item_id, merchant_id, \
         dish_id, stock_bucket_id, stock_date, quantity, order_type, processing_time, expire_at, \
         status, reject_reason, current_operation_id, next_retry_at, created_at, updated_at) \
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
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
    .bind(ReservationStatus::Rejected.code() as i8)
    .bind(reason)
    .bind(&r.try_operation_id)
    .bind(now)
    .bind(now)
    .bind(now)
    .execute(&mut *tx)
    .deadline()
    .await?;
    if inserted.rows_affected() != 1 {
        tx.rollback().deadline().await?;
        return Ok(false);
    }
    insert_outbox(&mut tx, std::slice::from_ref(event)).await?;
    tx.commit().deadline().await?;
    Ok(true)
}

pub use stocksvr_core::codes::DeferredStatus;

/// An order event to park.
#[derive(Debug, Clone)]
pub struct NewDeferred<'a> {
    pub consumer_group: &'a str,
    pub order_id: u64,
    pub event_id: &'a str,
    pub event_name: &'a str,
    pub topic: &'a str,
    pub partition: i32,
    pub offset: i64,
    /// The decoded event, as JSON: what the re-drive applies.
    pub event: &'a serde_json::Value,
    pub waiting_for: &'a str,
    pub first_retry: TimeDelta,
}

/// A parked order event.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct Deferred {
    pub id: u64,
    pub order_id: u64,
    pub event_id: String,
    pub event_name: String,
    pub event_json: serde_json::Value,
    pub waiting_for: String,
    pub attempts: u32,
    pub created_at: NaiveDateTime,
}

/// Parks an event; true when parked now (a redelivered record finds its row and adds none).
pub async fn defer(pool: &MySqlPool, d: &NewDeferred<'_>) -> Result<bool, sqlx::Error> {
    let now = now();
    let done = sqlx::query(
        "INSERT IGNORE INTO inventory_deferred_event (consumer_group, order_id, event_id, \
         event_name, topic, kafka_partition, kafka_offset, event_json, waiting_for, status, \
         attempts, next_attempt_at, created_at, updated_at) \
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0, ?, ?, ?)",
    )
    .bind(d.consumer_group)
    .bind(d.order_id)
    .bind(cut(d.event_id, 128))
    .bind(d.event_name)
    .bind(d.topic)
    .bind(d.partition)
    .bind(d.offset)
    .bind(d.event)
    .bind(cut(d.waiting_for, 1024))
    .bind(DeferredStatus::Waiting.code())
    .bind(now + d.first_retry)
    .bind(now)
    .bind(now)
    .execute(pool)
    .deadline()
    .await?;
    Ok(done.rows_affected() == 1)
}

const DEFERRED_COLUMNS: &str =
    "id, order_id, event_id, event_name, event_json, waiting_for, attempts, created_at";

/// The waiting events of one order, oldest first.
pub async fn waiting_of_order(
    pool: &MySqlPool,
    consumer_group: &str,
    order_id: u64,
) -> Result<Vec<Deferred>, sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT {DEFERRED_COLUMNS} FROM inventory_deferred_event \
         WHERE order_id = ? AND status = ? AND consumer_group = ? ORDER BY id"
    ))
    .bind(order_id)
    .bind(DeferredStatus::Waiting.code())
    .bind(consumer_group)
    .fetch_all(pool)
    .deadline()
    .await
}

/// The orders with a waiting event whose next attempt is due, oldest first.
pub async fn due_orders(
    pool: &MySqlPool,
    consumer_group: &str,
    limit: u32,
) -> Result<Vec<u64>, sqlx::Error> {
    let rows: Vec<(u64,)> = sqlx::query_as(
        "SELECT order_id FROM inventory_deferred_event \
         WHERE status = ? AND next_attempt_at <= ? AND consumer_group = ? \
         GROUP BY order_id ORDER BY MIN(id) LIMIT ?",
    )
    .bind(DeferredStatus::Waiting.code())
    .bind(now())
    .bind(consumer_group)
    .bind(limit)
    .fetch_all(pool)
    .deadline()
    .await?;
    Ok(rows.into_iter().map(|(o,)| o).collect())
}

/// Settles a parked event (applied, or reported as a conflict).
pub async fn settle(pool: &MySqlPool, id: u64, status: DeferredStatus) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE inventory_deferred_event SET status = ?, updated_at = ? WHERE id = ?")
        .bind(status.code())
        .bind(now())
        .bind(id)
        .execute(pool)
        .deadline()
        .await?;
    Ok(())
}

/// Leaves a parked event waiting and moves its next attempt `delay` away.
pub async fn retry_later(
    pool: &MySqlPool,
    id: u64,
    delay: TimeDelta,
    waiting_for: &str,
) -> Result<(), sqlx::Error> {
    let now = now();
    sqlx::query(
        "UPDATE inventory_deferred_event SET attempts = attempts + 1, next_attempt_at = ?, \
         waiting_for = ?, updated_at = ? WHERE id = ? AND status = ?",
    )
    .bind(now + delay)
    .bind(cut(waiting_for, 1024))
    .bind(now)
    .bind(id)
    .bind(DeferredStatus::Waiting.code())
    .execute(pool)
    .deadline()
    .await?;
    Ok(())
}

/// How many events wait, and the age of the oldest, for the gauges.
pub async fn waiting_summary(
    pool: &MySqlPool,
    consumer_group: &str,
) -> Result<(i64, Option<NaiveDateTime>), sqlx::Error> {
    sqlx::query_as(
        "SELECT COUNT(*), MIN(created_at) FROM inventory_deferred_event \
         WHERE status = ? AND consumer_group = ?",
    )
    .bind(DeferredStatus::Waiting.code())
    .bind(consumer_group)
    .fetch_one(pool)
    .deadline()
    .await
}

/// The inbox key of an event id: ids longer than the column keep a readable prefix and end
/// in a hash of the whole id, so two long ids never collapse into one.
pub fn inbox_key(event_id: &str) -> String {
    if event_id.len() <= 64 {
        return event_id.to_string();
    }
    let hash = stocksvr_core::ids::fnv1a64(event_id.as_bytes());
    let mut cut = 47;
    while !event_id.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}~{hash:016x}", &event_id[..cut])
}

/// Of `event_ids`, the inbox keys ([`inbox_key`]) `consumer_group` recorded as handled: one
/// query for a whole batch. Versions before the reservation's `reached` milestones wrote a
/// row per handled order event; they are read so a replay of those events stays recognised
/// until the inbox purge ages them out (after the topic's retention).
pub async fn handled_many(
    pool: &MySqlPool,
    event_ids: &[&str],
    consumer_group: &str,
) -> Result<HashSet<String>, sqlx::Error> {
    if event_ids.is_empty() {
        return Ok(HashSet::new());
    }
    let mut query = sqlx::QueryBuilder::<MySql>::new(
        "SELECT event_id FROM inventory_consumer_inbox WHERE consumer_group = ",
    );
    query.push_bind(consumer_group).push(" AND event_id IN ");
    in_list_of(&mut query, event_ids.iter().copied().map(inbox_key));
    let rows: Vec<(String,)> = query.one_off_as().fetch_all(pool).deadline().await?;
    Ok(rows.into_iter().map(|(k,)| k).collect())
}

/// Of `order_ids`, those with a waiting (parked) event: one query for a whole batch instead
/// of one [`waiting_of_order`] per order.
pub async fn orders_waiting(
    pool: &MySqlPool,
    consumer_group: &str,
    order_ids: &[u64],
) -> Result<HashSet<u64>, sqlx::Error> {
    if order_ids.is_empty() {
        return Ok(HashSet::new());
    }
    let mut query = sqlx::QueryBuilder::<MySql>::new(
        "SELECT DISTINCT order_id FROM inventory_deferred_event WHERE status = ",
    );
    query
        .push_bind(DeferredStatus::Waiting.code())
        .push(" AND consumer_group = ")
        .push_bind(consumer_group)
        .push(" AND order_id IN ");
    in_list_of(&mut query, order_ids.iter().copied());
    let rows: Vec<(u64,)> = query.one_off_as().fetch_all(pool).deadline().await?;
    Ok(rows.into_iter().map(|(o,)| o).collect())
}

fn cut(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_event_ids_fit_the_inbox_and_stay_distinct() {
        assert_eq!(inbox_key("evt-1"), "evt-1");
        let a = inbox_key(&"a".repeat(100));
        let b = inbox_key(&format!("{}b", "a".repeat(99)));
        assert!(a.len() <= 64 && b.len() <= 64);
        assert_ne!(a, b);
    }
}
