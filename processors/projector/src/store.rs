//! Apply: the SQL of a batch, run inside its transaction: one multi-row statement per
//! table and batch as [`crate::plan`] laid them out, and the statements of one projection
//! for the per-event path a raced batch falls back to.
//!
//! The ledger's unique `operation_id` is the dedupe key: an operation announces exactly one
//! stock-change event (its event id is `<operation_id>:<kind>`), so an operation already
//! booked means a redelivered event, whose other writes committed with its ledger row. Every
//! other statement is idempotent on its own as well (a version-guarded snapshot write,
//! GREATEST), so nothing a replay reaches moves backwards.
//!
//! Every value is bound; nothing from an event is ever spliced into SQL text.

use crate::decide::{LedgerRow, ReservationSync, SnapshotRow};
use crate::plan::{FinalRow, SnapshotWrite};
use chrono::NaiveDateTime;
use sqlx::{MySql, MySqlConnection, QueryBuilder};
use std::collections::{HashMap, HashSet};
use stocksvr_store::deadline::Deadline;
use stocksvr_store::one_off::OneOff;

/// Books the operation. `false`: it was already booked, so the event is a redelivery and
/// nothing else of it may apply.
pub async fn book(
    conn: &mut MySqlConnection,
    row: &LedgerRow,
    now: NaiveDateTime,
) -> Result<bool, sqlx::Error> {
    let done = sqlx::query(
        "INSERT IGNORE INTO inventory_ledger (operation_id, reservation_id, stock_bucket_id, \
         order_id, order_item_id, merchant_id, dish_id, action, quantity, available_delta, \
         reserved_delta, sold_delta, total_delta, redis_version, created_at) \
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    )
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

/// Which of `buckets` already have a snapshot row, for the per-event path: an existing row
/// gets the plain version-guarded UPDATE, a missing one the upsert (which still copes with
/// a row another consumer inserted since this read).
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

/// The upsert, only for buckets that had no row when read: it inserts (one row write),
/// and should another consumer have inserted the row meanwhile it moves it only forward. Every column is guarded by the same comparison
/// and `redis_version` is assigned last because MySQL and MariaDB evaluate the assignments
/// left to right: once it is updated, a later `VALUES(redis_version) > redis_version` would
/// be false and leave the remaining columns behind. `VALUES()` rather than the MySQL 8.0.19
/// row alias because MariaDB only knows the former; in a multi-row insert it names the
/// value of the row that collided. The one bound flag says whether the rows state a
/// deficit (split at [`SNAPSHOT_DEFICIT_FLAG`]).
const UPSERT_SNAPSHOT_HEAD: &str = "INSERT INTO dish_stock_snapshot (stock_bucket_id, \
     merchant_id, dish_id, stock_date, total_stock, available_stock, reserved_stock, \
     sold_stock, deficit_stock, redis_version, updated_at) ";
const SNAPSHOT_DEFICIT_FLAG: &str = " ON DUPLICATE KEY UPDATE \
     merchant_id = IF(VALUES(redis_version) > redis_version, VALUES(merchant_id), merchant_id), \
     dish_id = IF(VALUES(redis_version) > redis_version, VALUES(dish_id), dish_id), \
     stock_date = IF(VALUES(redis_version) > redis_version, VALUES(stock_date), stock_date), \
     total_stock = IF(VALUES(redis_version) > redis_version, VALUES(total_stock), total_stock), \
     available_stock = IF(VALUES(redis_version) > redis_version, VALUES(available_stock), available_stock), \
     reserved_stock = IF(VALUES(redis_version) > redis_version, VALUES(reserved_stock), reserved_stock), \
     sold_stock = IF(VALUES(redis_version) > redis_version, VALUES(sold_stock), sold_stock), \
     deficit_stock = IF(";
const UPSERT_SNAPSHOT_TAIL: &str = " AND VALUES(redis_version) > redis_version, \
     VALUES(deficit_stock), deficit_stock), \
     updated_at = IF(VALUES(redis_version) > redis_version, VALUES(updated_at), updated_at), \
     redis_version = IF(VALUES(redis_version) > redis_version, VALUES(redis_version), redis_version)";

/// The version-guarded upsert of `rows` (row, deficit), all with the same `states_deficit`.
/// Only for buckets without a row: on an existing row `INSERT ... ON DUPLICATE KEY UPDATE`
/// costs a failed insert (a duplicate-key error inside the server, an undo record) before
/// its update, where [`update_snapshots`] is the update alone.
fn upsert_snapshots<'a>(
    rows: impl IntoIterator<Item = (&'a SnapshotRow, Option<i64>)>,
    states_deficit: bool,
    now: NaiveDateTime,
) -> QueryBuilder<'a, MySql> {
    let mut q = QueryBuilder::new(UPSERT_SNAPSHOT_HEAD);
    q.push_values(rows, |mut b, (row, deficit)| {
        b.push_bind(row.stock_bucket_id.as_str())
            .push_bind(row.merchant_id)
            .push_bind(row.dish_id)
            .push_bind(row.stock_date)
            .push_bind(row.after.total)
            .push_bind(row.after.available)
            .push_bind(row.after.reserved)
            .push_bind(row.after.sold)
            // A row created by a reservation step starts without a deficit; an existing one
            // keeps what the last init or adjust stated, as reservation steps do not report it.
            .push_bind(deficit.unwrap_or(0))
            .push_bind(row.redis_version)
            .push_bind(now);
    });
    q.push(SNAPSHOT_DEFICIT_FLAG);
    q.push_bind(states_deficit);
    q.push(UPSERT_SNAPSHOT_TAIL);
    q
}

/// Writes `row` unless the stored version is the same or newer. `existed` says whether the
/// row was there before (see [`existing_buckets`]): then the plain guarded UPDATE, else the
/// upsert.
pub async fn advance_snapshot(
    conn: &mut MySqlConnection,
    row: &SnapshotRow,
    existed: bool,
    now: NaiveDateTime,
) -> Result<SnapshotWrite, sqlx::Error> {
    if existed {
        let found = update_snapshots(&[(row, row.deficit)], now)
            .one_off()
            .execute(conn)
            .deadline()
            .await?
            .rows_affected();
        return Ok(if found == 1 {
            SnapshotWrite::Advanced
        } else {
            SnapshotWrite::Stale
        });
    }
    let done = upsert_snapshots([(row, row.deficit)], row.deficit.is_some(), now)
        .one_off()
        .execute(conn)
        .deadline()
        .await?;
    // sqlx connects with CLIENT_FOUND_ROWS: 1 for an insert or a row left as it was, 2 for
    // a row that changed. updated_at changes on every advance, so 2 means exactly that; 1
    // is an insert or a row another consumer inserted meanwhile at a version as new.
    Ok(match done.rows_affected() {
        2 => SnapshotWrite::Advanced,
        _ => SnapshotWrite::Created,
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

/// Rows per multi-row statement. The widest row (a ledger row) binds 15 values, so a
/// statement stays far below MariaDB's 65,535 placeholders whatever the batch size.
const ROWS_PER_STATEMENT: usize = 1_000;

/// Which of `operation_ids` the ledger already holds. A plain read, not `FOR UPDATE`:
/// operation ids of one bucket interleave with other buckets' in the unique key, so
/// locking the gaps where absent ids would go makes two lanes or instances inserting into
/// the same gap deadlock. The booking's row count is the guard against a consumer that
/// books one of them meanwhile (see [`book_all`]).
pub async fn booked(
    conn: &mut MySqlConnection,
    operation_ids: &[&str],
) -> Result<HashSet<String>, sqlx::Error> {
    let mut found = HashSet::new();
    for chunk in operation_ids.chunks(ROWS_PER_STATEMENT) {
        let mut q = QueryBuilder::<MySql>::new(
            "SELECT operation_id FROM inventory_ledger WHERE operation_id IN (",
        );
        let mut ids = q.separated(", ");
        for id in chunk {
            ids.push_bind(*id);
        }
        ids.push_unseparated(")");
        found.extend(
            q.one_off_scalar::<String>()
                .fetch_all(&mut *conn)
                .deadline()
                .await?,
        );
    }
    Ok(found)
}

/// Books `rows` (distinct operation ids, none booked when read). Returns how many were
/// booked: fewer than `rows.len()` means another consumer booked some in between (a
/// rebalance), or the column's collation equates two ids this process told apart.
pub async fn book_all(
    conn: &mut MySqlConnection,
    rows: &[&LedgerRow],
    now: NaiveDateTime,
) -> Result<u64, sqlx::Error> {
    let mut booked = 0;
    for chunk in rows.chunks(ROWS_PER_STATEMENT) {
        let mut q = QueryBuilder::<MySql>::new(
            "INSERT IGNORE INTO inventory_ledger (operation_id, reservation_id, stock_bucket_id, \
             order_id, order_item_id, merchant_id, dish_id, action, quantity, available_delta, \
             reserved_delta, sold_delta, total_delta, redis_version, created_at) ",
        );
        q.push_values(chunk, |mut b, row| {
            b.push_bind(row.operation_id.as_str())
                .push_bind(row.reservation_id)
                .push_bind(row.stock_bucket_id.as_str())
                .push_bind(row.order_id)
                .push_bind(row.order_item_id)
                .push_bind(row.merchant_id)
                .push_bind(row.dish_id)
                .push_bind(row.action.code())
                .push_bind(row.quantity)
                .push_bind(row.available_delta)
                .push_bind(row.reserved_delta)
                .push_bind(row.sold_delta)
                .push_bind(row.total_delta)
                .push_bind(row.redis_version)
                .push_bind(now);
        });
        booked += q
            .one_off()
            .execute(&mut *conn)
            .deadline()
            .await?
            .rows_affected();
    }
    Ok(booked)
}

/// The stored redis_version of each of `buckets` that has a row, locked until the batch
/// commits: the plan decides created, advanced or stale from it, so it must not move
/// underneath.
pub async fn snapshot_versions(
    conn: &mut MySqlConnection,
    buckets: &[&str],
) -> Result<HashMap<String, u64>, sqlx::Error> {
    let mut found = HashMap::new();
    for chunk in buckets.chunks(ROWS_PER_STATEMENT) {
        let mut q = QueryBuilder::<MySql>::new(
            "SELECT stock_bucket_id, redis_version FROM dish_stock_snapshot \
             WHERE stock_bucket_id IN (",
        );
        let mut ids = q.separated(", ");
        for bucket in chunk {
            ids.push_bind(*bucket);
        }
        ids.push_unseparated(") FOR UPDATE");
        found.extend(
            q.one_off_as::<(String, u64)>()
                .fetch_all(&mut *conn)
                .deadline()
                .await?,
        );
    }
    Ok(found)
}

/// The plain version-guarded UPDATE of existing rows, one statement for all of `rows`
/// (row, deficit): a derived table of the new values joined to the snapshot by bucket. The
/// new values are read first (`STRAIGHT_JOIN`) and each row is found by its key (`FORCE
/// INDEX`): on a table of a few rows the server would otherwise scan it, and an UPDATE
/// locks every row it scans, so a lane would wait for (or deadlock with) the other lane's
/// buckets. A row is written only when the new version is above the stored one, and a
/// `NULL` deficit keeps the stored one (reservation steps do not report it). Under
/// CLIENT_FOUND_ROWS the count is the rows that matched, i.e. were advanced.
fn update_snapshots<'a>(
    rows: &[(&'a SnapshotRow, Option<i64>)],
    now: NaiveDateTime,
) -> QueryBuilder<'a, MySql> {
    let mut q = QueryBuilder::<MySql>::new("UPDATE (");
    for (i, (row, deficit)) in rows.iter().enumerate() {
        q.push(if i == 0 {
            "SELECT "
        } else {
            " UNION ALL SELECT "
        });
        q.push_bind(row.stock_bucket_id.as_str())
            .push(" AS b, ")
            .push_bind(row.merchant_id)
            .push(" AS m, ")
            .push_bind(row.dish_id)
            .push(" AS d, ")
            .push_bind(row.stock_date)
            .push(" AS sd, ")
            .push_bind(row.after.total)
            .push(" AS t, ")
            .push_bind(row.after.available)
            .push(" AS a, ")
            .push_bind(row.after.reserved)
            .push(" AS r, ")
            .push_bind(row.after.sold)
            .push(" AS s, ")
            .push_bind(*deficit)
            .push(" AS df, ")
            .push_bind(row.redis_version)
            .push(" AS v");
    }
    q.push(
        ") n STRAIGHT_JOIN dish_stock_snapshot p FORCE INDEX (PRIMARY) \
         ON p.stock_bucket_id = n.b \
         SET p.merchant_id = n.m, p.dish_id = n.d, p.stock_date = n.sd, p.total_stock = n.t, \
             p.available_stock = n.a, p.reserved_stock = n.r, p.sold_stock = n.s, \
             p.deficit_stock = COALESCE(n.df, p.deficit_stock), p.updated_at = ",
    );
    q.push_bind(now);
    q.push(", p.redis_version = n.v WHERE n.v > p.redis_version");
    q
}

/// Writes each bucket's final row: a bucket that had a row with the plain guarded UPDATE
/// ([`update_snapshots`]), one without with the upsert (rows that state a deficit and rows
/// that do not in a statement each, the flag being per statement). Returns the rows
/// affected as CLIENT_FOUND_ROWS counts them, to compare with
/// [`crate::plan::SnapshotPlan::expected_rows_affected`].
pub async fn write_snapshots(
    conn: &mut MySqlConnection,
    writes: &[FinalRow<'_>],
    now: NaiveDateTime,
) -> Result<u64, sqlx::Error> {
    let mut affected = 0;
    let updates: Vec<(&SnapshotRow, Option<i64>)> = writes
        .iter()
        .filter(|w| !w.created)
        .map(|w| (w.row, w.deficit))
        .collect();
    for chunk in updates.chunks(ROWS_PER_STATEMENT) {
        affected += update_snapshots(chunk, now)
            .one_off()
            .execute(&mut *conn)
            .deadline()
            .await?
            .rows_affected();
    }
    for states_deficit in [true, false] {
        let rows: Vec<(&SnapshotRow, Option<i64>)> = writes
            .iter()
            .filter(|w| w.created && w.deficit.is_some() == states_deficit)
            .map(|w| (w.row, w.deficit))
            .collect();
        for chunk in rows.chunks(ROWS_PER_STATEMENT) {
            affected += upsert_snapshots(chunk.iter().copied(), states_deficit, now)
                .one_off()
                .execute(&mut *conn)
                .deadline()
                .await?
                .rows_affected();
        }
    }
    Ok(affected)
}

/// [`sync_reservation`] for many reservations at once; `syncs` holds each reservation
/// once (a multi-table UPDATE changes a row once, whichever joined row it meets first).
/// Joined as [`update_snapshots`] is, new values first and each row by its key: scanned, a
/// small table's rows of the other lane's reservations would be locked too. Returns how
/// many reservations exist here.
pub async fn sync_all(
    conn: &mut MySqlConnection,
    syncs: &[ReservationSync],
) -> Result<u64, sqlx::Error> {
    let mut found = 0;
    for chunk in syncs.chunks(ROWS_PER_STATEMENT) {
        let mut q = QueryBuilder::<MySql>::new("UPDATE (");
        for (i, sync) in chunk.iter().enumerate() {
            q.push(if i == 0 {
                "SELECT "
            } else {
                " UNION ALL SELECT "
            });
            q.push_bind(sync.reservation_id)
                .push(" AS id, ")
                .push_bind(sync.redis_version)
                .push(" AS v");
        }
        q.push(
            ") s STRAIGHT_JOIN inventory_reservation r FORCE INDEX (PRIMARY) ON r.id = s.id \
             SET r.synced_redis_version = GREATEST(r.synced_redis_version, s.v), \
                 r.sync_status = IF(r.expected_redis_version IS NOT NULL \
                                    AND GREATEST(r.synced_redis_version, s.v) >= r.expected_redis_version, ",
        );
        q.push_bind(stocksvr_core::reservation::SyncStatus::Synced.code());
        q.push(", r.sync_status)");
        found += q
            .one_off()
            .execute(&mut *conn)
            .deadline()
            .await?
            .rows_affected();
    }
    Ok(found)
}
