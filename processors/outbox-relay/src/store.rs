//! The relay's SQL against `inventory_outbox` and `inventory_outbox_relay`. Every comparison
//! with a stored time uses the database clock (`NOW(3)`), as do the rows' `sent_at` and the
//! leases, so relays on hosts with skewed clocks still agree on which lease has expired.
//!
//! Two paths publish. The leader's scan reads new rows by primary key above its cursor and
//! writes nothing per row: once a prefix is acknowledged, one UPDATE moves the high-water
//! mark (`hwm`). The per-row path (`claim`/`mark`) only takes rows that failed (RETRY) and
//! SENDING rows of a relay that died mid-claim; it leases them row by row as before.

use crate::schedule::truncate_error;
use chrono::{NaiveDateTime, SubsecRound, TimeDelta};
use sqlx::mysql::MySqlRow;
use sqlx::{Connection, Executor, MySql, MySqlPool, QueryBuilder, Row};
use std::time::Duration;
use stocksvr_core::retry::RetryPolicy;
use stocksvr_pipeline::failure;
use stocksvr_store::deadline::Deadline;
use stocksvr_store::one_off::OneOff;

/// `inventory_outbox.status` codes, as the relay binds them.
pub mod status {
    use stocksvr_core::codes::OutboxStatus;
    pub const PENDING: i8 = OutboxStatus::Pending.code();
    pub const SENDING: i8 = OutboxStatus::Sending.code();
    pub const SENT: i8 = OutboxStatus::Sent.code();
    pub const RETRY: i8 = OutboxStatus::Retry.code();
}

/// One claimed row. The payload is read per row and parsed when it is encoded, so one odd
/// row cannot fail the claim of the others: it is retried with the error as its reason.
#[derive(Debug, Clone)]
pub struct ClaimedRow {
    pub id: u64,
    pub event_id: String,
    pub event_type: String,
    pub topic: String,
    pub partition_key: String,
    /// The JSON text, read (and checked) only when the row is encoded.
    pub payload: Result<String, String>,
    pub retry_count: u32,
    /// When the service's transaction wrote the row (its clock, UTC): the start of the
    /// publish delay.
    pub created_at: NaiveDateTime,
}

/// A claimed batch and the lease it holds. `lease_until` is also the fencing token: the
/// outcome of a row is written only while `next_retry_at` still equals it, so a relay whose
/// lease expired (and was taken over) cannot overwrite the new holder's state.
#[derive(Debug, Clone)]
pub struct Claim {
    pub rows: Vec<ClaimedRow>,
    pub lease_until: NaiveDateTime,
}

/// A row whose publish failed.
#[derive(Debug, Clone)]
pub struct Failure {
    pub id: u64,
    pub retry_after: Duration,
    pub reason: String,
}

/// What a mark wrote; fewer rows than asked means leases were lost to another relay.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Marked {
    pub sent: u64,
    pub retried: u64,
}

fn to_delta(d: Duration) -> TimeDelta {
    TimeDelta::from_std(d).unwrap_or(TimeDelta::MAX)
}

fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// True when the retry path has work: a due RETRY row or a SENDING row whose lease ran out.
/// Two index probes without locks, so an idle relay does not open the claim's transaction.
pub async fn retry_due(pool: &MySqlPool) -> Result<bool, sqlx::Error> {
    let due: Option<i32> = sqlx::query_scalar(
        "SELECT 1 FROM inventory_outbox FORCE INDEX (idx_publish) \
         WHERE status IN (?, ?) AND next_retry_at <= NOW(3) LIMIT 1",
    )
    .bind(status::SENDING)
    .bind(status::RETRY)
    .fetch_optional(pool)
    .deadline()
    .await?;
    Ok(due.is_some())
}

/// InnoDB may pick two concurrent claims as a deadlock victim (SKIP LOCKED skips locked rows,
/// not the index gaps its range scan also locks). Nothing was claimed then: the claim is
/// simply run again at once, a few times, before the error goes up to the relay's own retry.
pub async fn claim(pool: &MySqlPool, limit: u32, lease: Duration) -> Result<Claim, sqlx::Error> {
    RetryPolicy::fixed(Duration::ZERO)
        .times(3)
        .run(
            || claim_once(pool, limit, lease),
            failure::is_lock_conflict,
            |e, _| tracing::debug!(error = %e, "outbox claim lost a lock conflict; claiming again"),
        )
        .await
}

/// Claims up to `limit` due rows in one short transaction and leases them for `lease`.
///
/// `SKIP LOCKED` makes a second relay pass over rows the first is claiming instead of
/// waiting, and the SENDING status with a future lease keeps them out of every later claim
/// until the lease expires: that is how two relays avoid publishing one row twice.
///
/// The lock footprint depends on the plan, so the plan is pinned. One `status IN (…)
/// ORDER BY id` query would read the whole backlog through `idx_publish`, filesort it and
/// keep every row locked until commit (a second relay then finds nothing). One query per
/// status, ordered like `idx_publish` (status, next_retry_at, id), stops after `limit`
/// rows and locks only those. READ COMMITTED drops InnoDB's gap locks on that range, which
/// would otherwise make the services' outbox inserts wait behind the claim.
///
/// Expired leases go first (a relay died mid-batch: the oldest work), then due retries. New
/// (PENDING) rows are not claimed here: the leader's scan publishes them.
async fn claim_once(pool: &MySqlPool, limit: u32, lease: Duration) -> Result<Claim, sqlx::Error> {
    let mut conn = pool.acquire().deadline().await?;
    let claimed = claim_on(&mut conn, limit, lease).await;
    if claimed.is_err() {
        // A statement cut off by its deadline can leave the connection inside the claim's
        // transaction; back in the pool, the next claim's SET TRANSACTION would then fail
        // (MariaDB 1568) and so would every claim after it on that connection.
        conn.close_on_drop();
    }
    claimed
}

async fn claim_on(
    conn: &mut sqlx::pool::PoolConnection<MySql>,
    limit: u32,
    lease: Duration,
) -> Result<Claim, sqlx::Error> {
    // Applies to the next transaction on this connection only.
    conn.execute("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
        .deadline()
        .await?;
    let mut tx = conn.begin().deadline().await?;
    let mut rows: Vec<MySqlRow> = Vec::new();
    for wanted in [status::SENDING, status::RETRY] {
        let room = limit.saturating_sub(rows.len() as u32);
        if room == 0 {
            break;
        }
        // For both statuses next_retry_at is when the row is due: the next retry, or the end
        // of a lease.
        rows.extend(
            sqlx::query(
                "SELECT id, event_id, event_type, topic, partition_key, payload, body, retry_count, \
                 created_at, NOW(3) AS db_now FROM inventory_outbox FORCE INDEX (idx_publish) \
                 WHERE status = ? AND next_retry_at <= NOW(3) \
                 ORDER BY next_retry_at, id LIMIT ? FOR UPDATE SKIP LOCKED",
            )
            .bind(wanted)
            .bind(room)
            .fetch_all(&mut *tx)
            .deadline()
            .await?,
        );
    }
    let Some(first) = rows.first() else {
        tx.commit().deadline().await?;
        return Ok(Claim {
            rows: Vec::new(),
            lease_until: NaiveDateTime::default(),
        });
    };
    let db_now: NaiveDateTime = first.try_get("db_now")?;
    // Millisecond precision: the column is DATETIME(3) and the token is compared for equality.
    let lease_until = (db_now + to_delta(lease)).trunc_subsecs(3);
    let mut claimed = Vec::with_capacity(rows.len());
    for row in &rows {
        claimed.push(claimed_row(row)?);
    }
    // Publishing in id order keeps one key's events in the order they were written.
    claimed.sort_by_key(|row| row.id);
    let mut update = QueryBuilder::<MySql>::new("UPDATE inventory_outbox SET status = ");
    update
        .push_bind(status::SENDING)
        .push(", next_retry_at = ")
        .push_bind(lease_until)
        .push(" WHERE id IN (");
    let mut ids = update.separated(", ");
    for row in &claimed {
        ids.push_bind(row.id);
    }
    ids.push_unseparated(")");
    update.one_off().execute(&mut *tx).deadline().await?;
    tx.commit().deadline().await?;
    Ok(Claim {
        rows: claimed,
        lease_until,
    })
}

fn claimed_row(row: &MySqlRow) -> Result<ClaimedRow, sqlx::Error> {
    Ok(ClaimedRow {
        id: row.try_get("id")?,
        event_id: row.try_get("event_id")?,
        event_type: row.try_get("event_type")?,
        topic: row.try_get("topic")?,
        partition_key: row.try_get("partition_key")?,
        payload: payload_text(row),
        retry_count: row.try_get("retry_count")?,
        created_at: row.try_get("created_at")?,
    })
}

/// A row's event as the JSON text the encoder reads: a step's Avro `body` decoded (and
/// written out as the JSON payload such a row held before), or the `payload` column as is.
fn payload_text(row: &MySqlRow) -> Result<String, String> {
    let body: Option<Vec<u8>> = row
        .try_get("body")
        .map_err(|e| format!("body is not readable: {e}"))?;
    if let Some(bytes) = body {
        let step = stocksvr_pipeline::step_body::decode(&bytes)?;
        return serde_json::to_string(&step).map_err(|e| e.to_string());
    }
    // The column's type is JSON, which sqlx only decodes into its Json wrappers (a parsed
    // value); its text is what the encoder reads, so take it unchecked.
    row.try_get_unchecked::<Option<String>, _>("payload")
        .map_err(|e| format!("payload is not readable: {e}"))?
        .ok_or_else(|| "the row has neither a payload nor a body".to_string())
}

/// Writes a batch's outcome in one transaction: SENT for the acknowledged rows, RETRY with
/// backoff and reason for the others, each only while this relay's lease still holds.
pub async fn mark(
    pool: &MySqlPool,
    lease_until: NaiveDateTime,
    sent: &[u64],
    failed: &[Failure],
) -> Result<Marked, sqlx::Error> {
    let mut marked = Marked::default();
    if sent.is_empty() && failed.is_empty() {
        return Ok(marked);
    }
    let mut tx = stocksvr_store::deadline::begin(pool).await?;
    if !sent.is_empty() {
        let mut update = QueryBuilder::<MySql>::new("UPDATE inventory_outbox SET status = ");
        update
            .push_bind(status::SENT)
            .push(", sent_at = NOW(3) WHERE status = ")
            .push_bind(status::SENDING)
            .push(" AND next_retry_at = ")
            .push_bind(lease_until)
            .push(" AND id IN (");
        let mut ids = update.separated(", ");
        for id in sent {
            ids.push_bind(*id);
        }
        ids.push_unseparated(")");
        marked.sent = update
            .one_off()
            .execute(&mut *tx)
            .deadline()
            .await?
            .rows_affected();
    }
    for failure in failed {
        marked.retried += sqlx::query(
            "UPDATE inventory_outbox SET status = ?, retry_count = retry_count + 1, \
             next_retry_at = NOW(3) + INTERVAL ? MICROSECOND, last_error = ? \
             WHERE id = ? AND status = ? AND next_retry_at = ?",
        )
        .bind(status::RETRY)
        .bind(micros(failure.retry_after))
        .bind(truncate_error(&failure.reason))
        .bind(failure.id)
        .bind(status::SENDING)
        .bind(lease_until)
        .execute(&mut *tx)
        .deadline()
        .await?
        .rows_affected();
    }
    tx.commit().deadline().await?;
    Ok(marked)
}

/// The relay row: the persisted mark and who holds the lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    pub hwm: u64,
    pub owner: Option<String>,
    pub epoch: u64,
    /// The lease ran out by the database clock (or nobody holds it).
    pub free: bool,
}

/// Reads the relay row (one primary-key lookup, no lock).
pub async fn cursor(pool: &MySqlPool) -> Result<Cursor, sqlx::Error> {
    let (hwm, owner, epoch, free): (u64, Option<String>, u64, bool) = sqlx::query_as(
        "SELECT hwm, owner, epoch, owner IS NULL OR lease_until < NOW(3) \
         FROM inventory_outbox_relay WHERE id = 1",
    )
    .fetch_one(pool)
    .deadline()
    .await?;
    Ok(Cursor {
        hwm,
        owner,
        epoch,
        free,
    })
}

/// Takes the lease if it is free (or already `owner`'s: a relay resuming after an error),
/// as a compare-and-set on the epoch it read, and bumps the epoch so every write of a
/// previous holder is fenced off. Returns the new epoch and the mark to scan from.
pub async fn acquire(
    pool: &MySqlPool,
    owner: &str,
    seen_epoch: u64,
    lease: Duration,
) -> Result<Option<(u64, u64)>, sqlx::Error> {
    let taken = sqlx::query(
        "UPDATE inventory_outbox_relay SET owner = ?, epoch = epoch + 1, \
         lease_until = NOW(3) + INTERVAL ? MICROSECOND, updated_at = NOW(3) \
         WHERE id = 1 AND epoch = ? AND (owner IS NULL OR owner = ? OR lease_until < NOW(3))",
    )
    .bind(owner)
    .bind(micros(lease))
    .bind(seen_epoch)
    .bind(owner)
    .execute(pool)
    .deadline()
    .await?
    .rows_affected();
    if taken != 1 {
        return Ok(None);
    }
    // The epoch is ours alone now: nobody else can change the row while the lease holds.
    let (hwm, epoch): (u64, u64) = sqlx::query_as(
        "SELECT hwm, epoch FROM inventory_outbox_relay WHERE id = 1 AND owner = ? AND epoch = ?",
    )
    .bind(owner)
    .bind(seen_epoch + 1)
    .fetch_one(pool)
    .deadline()
    .await?;
    Ok(Some((epoch, hwm)))
}

/// Moves the mark up to `hwm` (never down) and renews the lease, only while `owner` still
/// holds `epoch`. False when the lease was taken over: the caller is no longer the leader.
/// The driver reports matched rows (CLIENT_FOUND_ROWS), so a renewal that changes nothing
/// visible still counts as held.
pub async fn advance(
    pool: &MySqlPool,
    owner: &str,
    epoch: u64,
    hwm: u64,
    lease: Duration,
) -> Result<bool, sqlx::Error> {
    let held = sqlx::query(
        "UPDATE inventory_outbox_relay SET hwm = GREATEST(hwm, ?), \
         lease_until = NOW(3) + INTERVAL ? MICROSECOND, updated_at = NOW(3) \
         WHERE id = 1 AND owner = ? AND epoch = ?",
    )
    .bind(hwm)
    .bind(micros(lease))
    .bind(owner)
    .bind(epoch)
    .execute(pool)
    .deadline()
    .await?
    .rows_affected();
    Ok(held == 1)
}

/// Gives the lease up (a clean stop), so another relay takes over at once.
pub async fn release(pool: &MySqlPool, owner: &str, epoch: u64) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE inventory_outbox_relay SET owner = NULL, lease_until = NOW(3), \
         updated_at = NOW(3) WHERE id = 1 AND owner = ? AND epoch = ?",
    )
    .bind(owner)
    .bind(epoch)
    .execute(pool)
    .deadline()
    .await?;
    Ok(())
}

/// A row read by the scan, with its status: only PENDING rows are published by the scan
/// (the others belong to the retry path or were sent by it).
#[derive(Debug, Clone)]
pub struct ScannedRow {
    pub row: ClaimedRow,
    pub status: i8,
}

const SCAN_COLUMNS: &str = "SELECT id, event_id, event_type, topic, partition_key, payload, body, \
     retry_count, created_at, status FROM inventory_outbox FORCE INDEX (PRIMARY) ";

fn scanned_row(row: &MySqlRow) -> Result<ScannedRow, sqlx::Error> {
    Ok(ScannedRow {
        row: claimed_row(row)?,
        status: row.try_get("status")?,
    })
}

/// Up to `limit` committed rows above `after`, in id order: a primary-key range read, no
/// lock taken and nothing written.
pub async fn scan(
    pool: &MySqlPool,
    after: u64,
    limit: u32,
) -> Result<Vec<ScannedRow>, sqlx::Error> {
    let rows = sqlx::query(&format!("{SCAN_COLUMNS}WHERE id > ? ORDER BY id LIMIT ?"))
        .bind(after)
        .bind(limit)
        .fetch_all(pool)
        .deadline()
        .await?;
    rows.iter().map(scanned_row).collect()
}

/// The rows that are now visible inside the id ranges `(lo, hi)` (both ends included), in
/// id order: the re-read of open gaps.
pub async fn read_ranges(
    pool: &MySqlPool,
    ranges: &[(u64, u64)],
) -> Result<Vec<ScannedRow>, sqlx::Error> {
    if ranges.is_empty() {
        return Ok(Vec::new());
    }
    let mut query = QueryBuilder::<MySql>::new(SCAN_COLUMNS);
    query.push("WHERE ");
    for (i, (lo, hi)) in ranges.iter().enumerate() {
        if i > 0 {
            query.push(" OR ");
        }
        query
            .push("id BETWEEN ")
            .push_bind(*lo)
            .push(" AND ")
            .push_bind(*hi);
    }
    query.push(" ORDER BY id");
    let rows = query.one_off().fetch_all(pool).deadline().await?;
    rows.iter().map(scanned_row).collect()
}

/// The ids of the InnoDB transactions open on the server that could still make an
/// allocated outbox id visible (`information_schema.INNODB_TRX`, which needs the PROCESS
/// privilege). InnoDB refreshes that table at most every 100 ms, so a reading may miss a
/// transaction younger than that: the caller only uses readings made well after the gap it
/// judges was seen.
///
/// Only transactions that wrote something (`trx_rows_modified`, the undo records: the row
/// of an allocated id has one from its insert until commit or rollback) or are running a
/// statement (an INSERT between allocating its id and writing its row, or waiting for a
/// lock) can still fill a gap. An idle read-only transaction (a consistent dump, a session
/// left in BEGIN) cannot, and would otherwise hold the mark for as long as it stays open.
/// A statement rolled back to its savepoint (INSERT IGNORE of a duplicate) leaves no undo
/// record, and its id never appears, so it rightly no longer counts.
///
/// Only sessions whose default database is this one (or none, or whose session is gone:
/// an XA transaction prepared and detached) count: every service writes the outbox through
/// a connection to its database, and a long transaction of another application on a shared
/// server would otherwise hold the mark. The one case this misses, a session using another
/// default database that writes `<this db>.inventory_outbox` by its qualified name, is not
/// something stocksvr does (docs/runbook.md).
pub async fn open_transactions(pool: &MySqlPool) -> Result<Vec<u64>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT t.trx_id FROM information_schema.INNODB_TRX t \
         LEFT JOIN information_schema.PROCESSLIST p ON p.ID = t.trx_mysql_thread_id \
         WHERE (t.trx_rows_modified > 0 OR t.trx_query IS NOT NULL) \
           AND (p.ID IS NULL OR p.DB IS NULL OR p.DB = DATABASE())",
    )
    .fetch_all(pool)
    .deadline()
    .await
}

/// Puts rows the scan could not publish into RETRY with backoff and the reason, so the
/// mark can pass them and the retry path takes them over. Only rows still PENDING: a row
/// already taken by the retry path keeps its state.
pub async fn retry_later(pool: &MySqlPool, failed: &[Failure]) -> Result<u64, sqlx::Error> {
    if failed.is_empty() {
        return Ok(0);
    }
    let mut tx = stocksvr_store::deadline::begin(pool).await?;
    let mut retried = 0;
    for failure in failed {
        retried += sqlx::query(
            "UPDATE inventory_outbox SET status = ?, retry_count = retry_count + 1, \
             next_retry_at = NOW(3) + INTERVAL ? MICROSECOND, last_error = ? \
             WHERE id = ? AND status = ?",
        )
        .bind(status::RETRY)
        .bind(micros(failure.retry_after))
        .bind(truncate_error(&failure.reason))
        .bind(failure.id)
        .bind(status::PENDING)
        .execute(&mut *tx)
        .deadline()
        .await?
        .rows_affected();
    }
    tx.commit().deadline().await?;
    Ok(retried)
}

/// One purge step: what it deleted and where the next step starts (`None`: stop).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Purged {
    pub deleted: u64,
    pub next: Option<u64>,
}

/// Deletes sent rows (PENDING at or below the mark, or SENT) created more than `retention`
/// ago, walking the primary key upward from `after` over at most `limit` rows.
///
/// Ids follow creation time, so the walk stops at the first sent row still inside the
/// retention: everything above it is as young or younger. Rows kept on the way (RETRY,
/// SENDING) are stepped over, so one stuck row never stops the purge. Reading first and
/// deleting by primary key keeps the DELETE's locks to the rows it removes.
pub async fn purge_batch(
    pool: &MySqlPool,
    retention: Duration,
    after: u64,
    limit: u32,
) -> Result<Purged, sqlx::Error> {
    let rows: Vec<(u64, i8, bool)> = sqlx::query_as(
        "SELECT o.id, o.status, o.created_at < NOW(3) - INTERVAL ? MICROSECOND \
         FROM inventory_outbox o FORCE INDEX (PRIMARY) \
         JOIN inventory_outbox_relay c ON c.id = 1 \
         WHERE o.id > ? AND o.id <= c.hwm ORDER BY o.id LIMIT ?",
    )
    .bind(micros(retention))
    .bind(after)
    .bind(limit)
    .fetch_all(pool)
    .deadline()
    .await?;
    let sent = |s: i8| s == status::PENDING || s == status::SENT;
    let mut ids = Vec::new();
    let mut last = after;
    let mut young = false;
    for (id, status, old) in &rows {
        if sent(*status) && !*old {
            young = true;
            break;
        }
        if sent(*status) {
            ids.push(*id);
        }
        last = *id;
    }
    let next = (!young && rows.len() == limit as usize).then_some(last);
    if ids.is_empty() {
        return Ok(Purged { deleted: 0, next });
    }
    let mut delete = QueryBuilder::<MySql>::new("DELETE FROM inventory_outbox WHERE status IN (");
    delete
        .push_bind(status::PENDING)
        .push(", ")
        .push_bind(status::SENT)
        .push(") AND id IN (");
    let mut list = delete.separated(", ");
    for id in &ids {
        list.push_bind(*id);
    }
    list.push_unseparated(")");
    let deleted = delete
        .one_off()
        .execute(pool)
        .deadline()
        .await?
        .rows_affected();
    Ok(Purged { deleted, next })
}

/// Size and age of the backlog: rows not sent yet (PENDING above the mark, SENDING, RETRY).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Backlog {
    pub rows: u64,
    /// Age of the oldest unsent row; zero when there is none.
    pub oldest_age: Duration,
}

/// The rows not sent yet, as a WHERE clause on `inventory_outbox o` joined with the relay
/// row `c` (tests and tools count the backlog with it); bind [`UNSENT_CODES`] to its
/// placeholders, in order.
pub const UNSENT: &str = "((o.id > c.hwm AND o.status = ?) OR o.status IN (?, ?))";

/// The codes [`UNSENT`] binds: PENDING (above the mark), then SENDING and RETRY.
pub const UNSENT_CODES: [i8; 3] = [status::PENDING, status::SENDING, status::RETRY];

/// Counts unsent rows: PENDING above the mark by primary key (the rows at or below it are
/// mostly PENDING too, so `idx_publish` would read them all) and SENDING/RETRY rows through
/// `idx_publish`; then reads the creation time of the lowest unsent id by primary key. A
/// handful of index lookups, cheap enough to run every second even with a large backlog.
pub async fn backlog(pool: &MySqlPool) -> Result<Backlog, sqlx::Error> {
    let (rows, age_micros): (i64, Option<i64>) = sqlx::query_as(
        "SELECT CAST(b.above + b.retry AS SIGNED), TIMESTAMPDIFF(MICROSECOND, o.created_at, NOW(3)) \
         FROM (SELECT \
                 (SELECT COUNT(*) FROM inventory_outbox FORCE INDEX (PRIMARY) \
                   WHERE id > c.hwm AND status = ?) AS above, \
                 (SELECT COUNT(*) FROM inventory_outbox FORCE INDEX (idx_publish) \
                   WHERE status IN (?, ?)) AS retry, \
                 LEAST(COALESCE((SELECT MIN(id) FROM inventory_outbox FORCE INDEX (PRIMARY) \
                                  WHERE id > c.hwm AND status = ?), 18446744073709551615), \
                       COALESCE((SELECT MIN(id) FROM inventory_outbox FORCE INDEX (idx_publish) \
                                  WHERE status IN (?, ?)), 18446744073709551615)) AS min_id \
               FROM inventory_outbox_relay c WHERE c.id = 1) b \
         LEFT JOIN inventory_outbox o ON o.id = b.min_id",
    )
    .bind(status::PENDING)
    .bind(status::SENDING)
    .bind(status::RETRY)
    .bind(status::PENDING)
    .bind(status::SENDING)
    .bind(status::RETRY)
    .fetch_one(pool)
    .deadline()
    .await?;
    Ok(Backlog {
        rows: u64::try_from(rows).unwrap_or(0),
        oldest_age: Duration::from_micros(u64::try_from(age_micros.unwrap_or(0)).unwrap_or(0)),
    })
}
