//! Apply: the SQL of one projection, run inside the batch's transaction. Every statement
//! is idempotent on its own (INSERT IGNORE on a unique key, a version-guarded upsert,
//! GREATEST), so the inbox is the first line of defence against redelivery, not the only one.
//!
//! Every value is bound; nothing from an event is ever spliced into SQL text.

use crate::decide::{LedgerRow, ReservationSync, SnapshotRow};
use chrono::NaiveDateTime;
use sqlx::MySqlConnection;
use std::collections::HashSet;
use stocksvr_store::deadline::Deadline;

/// Claims `event_id` for `group`. `false`: this group already applied the event.
pub async fn claim(
    conn: &mut MySqlConnection,
    event_id: &str,
    group: &str,
    now: NaiveDateTime,
) -> Result<bool, sqlx::Error> {
    let done = sqlx::query(
        "INSERT IGNORE INTO inventory_consumer_inbox (event_id, consumer_group, consumed_at) \
         VALUES (?, ?, ?)",
    )
    .bind(event_id)
    .bind(group)
    .bind(now)
    .execute(conn)
    .deadline()
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Books the operation. `false`: the operation was already booked, e.g. by an event the
/// reservation service re-published under a new event_id after a replayed Redis call.
pub async fn book(
    conn: &mut MySqlConnection,
    row: &LedgerRow,
    now: NaiveDateTime,
) -> Result<bool, sqlx::Error> {
    let done = sqlx::query(
        "INSERT IGNORE INTO inventory_ledger (ledger_id, operation_id, reservation_id, \
         stock_bucket_id, order_id, order_item_id, merchant_id, dish_id, action, quantity, \
         available_delta, reserved_delta, sold_delta, total_delta, redis_version, created_at) \
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(&row.ledger_id)
    .bind(&row.operation_id)
    .bind(row.reservation_id)
    .bind(&row.stock_bucket_id)
    .bind(row.order_id)
    .bind(row.order_item_id)
    .bind(row.merchant_id)
    .bind(row.dish_id)
    .bind(row.action.code())
    .bind(row.quantity)
    .bind(row.available_delta)
    .bind(row.reserved_delta)
    .bind(row.sold_delta)
    .bind(row.total_delta)
    .bind(row.redis_version)
    .bind(now)
    .execute(conn)
    .deadline()
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Which of `buckets` already have a snapshot row. Only used to tell a created row from a
/// stale event in the metrics: the upsert itself is the guard, not this read.
pub async fn existing_buckets(
    conn: &mut MySqlConnection,
    buckets: &[&str],
) -> Result<HashSet<String>, sqlx::Error> {
    if buckets.is_empty() {
        return Ok(HashSet::new());
    }
    let placeholders = vec!["?"; buckets.len()].join(", ");
    let sql = format!(
        "SELECT stock_bucket_id FROM dish_stock_snapshot WHERE stock_bucket_id IN ({placeholders})"
    );
    let mut query = sqlx::query_scalar::<_, String>(&sql);
    for bucket in buckets {
        query = query.bind(*bucket);
    }
    Ok(query
        .fetch_all(conn)
        .deadline()
        .await?
        .into_iter()
        .collect())
}

/// How the snapshot upsert ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotWrite {
    /// First event of the bucket: row inserted.
    Created,
    /// A newer redis_version: the row now holds this event's after-quantities.
    Advanced,
    /// Not newer than the stored version: nothing changed.
    Stale,
}

/// The upsert moves the row only forward. Every column is guarded by the same comparison
/// and `redis_version` is assigned last because MySQL and MariaDB evaluate the assignments
/// left to right: once it is updated, a later `VALUES(redis_version) > redis_version` would
/// be false and leave the remaining columns behind. `VALUES()` rather than the MySQL 8.0.19
/// row alias because MariaDB only knows the former.
const UPSERT_SNAPSHOT: &str = "INSERT INTO dish_stock_snapshot (stock_bucket_id, merchant_id, \
     dish_id, stock_date, total_stock, available_stock, reserved_stock, sold_stock, \
     deficit_stock, redis_version, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) \
     ON DUPLICATE KEY UPDATE \
     merchant_id = IF(VALUES(redis_version) > redis_version, VALUES(merchant_id), merchant_id), \
     dish_id = IF(VALUES(redis_version) > redis_version, VALUES(dish_id), dish_id), \
     stock_date = IF(VALUES(redis_version) > redis_version, VALUES(stock_date), stock_date), \
     total_stock = IF(VALUES(redis_version) > redis_version, VALUES(total_stock), total_stock), \
     available_stock = IF(VALUES(redis_version) > redis_version, VALUES(available_stock), available_stock), \
     reserved_stock = IF(VALUES(redis_version) > redis_version, VALUES(reserved_stock), reserved_stock), \
     sold_stock = IF(VALUES(redis_version) > redis_version, VALUES(sold_stock), sold_stock), \
     deficit_stock = IF(? AND VALUES(redis_version) > redis_version, VALUES(deficit_stock), deficit_stock), \
     updated_at = IF(VALUES(redis_version) > redis_version, VALUES(updated_at), updated_at), \
     redis_version = IF(VALUES(redis_version) > redis_version, VALUES(redis_version), redis_version)";

/// Writes `row` unless the stored version is the same or newer. `existed` says whether the
/// row was there before (see [`existing_buckets`]).
pub async fn advance_snapshot(
    conn: &mut MySqlConnection,
    row: &SnapshotRow,
    existed: bool,
    now: NaiveDateTime,
) -> Result<SnapshotWrite, sqlx::Error> {
    let done = sqlx::query(UPSERT_SNAPSHOT)
        .bind(&row.stock_bucket_id)
        .bind(row.merchant_id)
        .bind(row.dish_id)
        .bind(row.stock_date)
        .bind(row.after.total)
        .bind(row.after.available)
        .bind(row.after.reserved)
        .bind(row.after.sold)
        // A row created by a reservation step starts without a deficit; an existing one keeps
        // what the last init or adjust stated, as reservation steps do not report it.
        .bind(row.deficit.unwrap_or(0))
        .bind(row.redis_version)
        .bind(now)
        .bind(row.deficit.is_some())
        .execute(conn)
        .deadline()
        .await?;
    // sqlx connects with CLIENT_FOUND_ROWS: 1 for an insert or a row left as it was, 2 for
    // a row that changed. updated_at changes on every advance, so 2 means exactly that.
    Ok(match (done.rows_affected(), existed) {
        (2, _) => SnapshotWrite::Advanced,
        (_, false) => SnapshotWrite::Created,
        _ => SnapshotWrite::Stale,
    })
}

/// Advances the reservation's synced version (never backwards, so a stale event is
/// harmless) and marks it SYNCED once it reaches what the reservation expects. Both
/// expressions use GREATEST(...) rather than the freshly assigned column so the result
/// does not depend on whether the server evaluates assignments left to right.
/// `false`: no such reservation (its row may live in another database, e.g. a replayed
/// topic); the projection itself does not depend on it.
pub async fn sync_reservation(
    conn: &mut MySqlConnection,
    sync: ReservationSync,
) -> Result<bool, sqlx::Error> {
    let done = sqlx::query(
        "UPDATE inventory_reservation \
         SET synced_redis_version = GREATEST(synced_redis_version, ?), \
             sync_status = IF(expected_redis_version IS NOT NULL \
                              AND GREATEST(synced_redis_version, ?) >= expected_redis_version, \
                              ?, sync_status) \
         WHERE id = ?",
    )
    .bind(sync.redis_version)
    .bind(sync.redis_version)
    .bind(stocksvr_core::reservation::SyncStatus::Synced.code())
    .bind(sync.reservation_id)
    .execute(conn)
    .deadline()
    .await?;
    Ok(done.rows_affected() > 0)
}
