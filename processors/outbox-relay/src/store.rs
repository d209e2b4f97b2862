//! The relay's SQL against `inventory_outbox`. Every comparison with a stored time uses the
//! database clock (`NOW(3)`), as do the rows' `sent_at` and leases, so relays on hosts with
//! skewed clocks still agree on which lease has expired.

use crate::schedule::truncate_error;
use chrono::{NaiveDateTime, SubsecRound, TimeDelta};
use sqlx::mysql::MySqlRow;
use sqlx::{Connection, Executor, MySql, MySqlPool, QueryBuilder, Row};
use std::time::Duration;
use stocksvr_store::deadline::Deadline;
use stocksvr_store::one_off::OneOff;

/// `inventory_outbox.status` codes (see the migration).
pub mod status {
    /// Written by the local transaction; waiting for its first publish.
    pub const PENDING: i8 = 10;
    /// Claimed by a relay until `next_retry_at` (the lease expiry).
    pub const SENDING: i8 = 20;
    /// Acknowledged by the broker.
    pub const SENT: i8 = 30;
    /// A publish failed; tried again from `next_retry_at`.
    pub const RETRY: i8 = 40;
}

/// One claimed row. The payload is parsed per row so one odd row cannot fail the claim of
/// the others: it is retried with the parse error as its reason.
#[derive(Debug, Clone)]
pub struct ClaimedRow {
    pub id: u64,
    pub event_id: String,
    pub event_type: String,
    pub topic: String,
    pub partition_key: String,
    pub payload: Result<serde_json::Value, String>,
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

/// InnoDB may pick two concurrent claims as a deadlock victim (SKIP LOCKED skips locked rows,
/// not the index gaps its range scan also locks). Nothing was claimed then: the claim is
/// simply run again, a few times, before the error goes up to the relay's own retry.
pub async fn claim(pool: &MySqlPool, limit: u32, lease: Duration) -> Result<Claim, sqlx::Error> {
    let mut attempt = 0;
    loop {
        match claim_once(pool, limit, lease).await {
            Err(sqlx::Error::Database(e))
                if attempt < 3 && matches!(e.code().as_deref(), Some("40001")) =>
            {
                attempt += 1;
                tracing::debug!(
                    attempt,
                    "outbox claim chosen as a deadlock victim; claiming again"
                );
            }
            other => return other,
        }
    }
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
/// Expired leases go first (a relay died mid-batch: the oldest work), then due retries,
/// then new rows; retries back off, so they cannot crowd new rows out for long.
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
    for wanted in [status::SENDING, status::RETRY, status::PENDING] {
        let room = limit.saturating_sub(rows.len() as u32);
        if room == 0 {
            break;
        }
        // For all three statuses next_retry_at is when the row is due: the first attempt,
        // the next retry, or the end of a lease.
        rows.extend(
            sqlx::query(
                "SELECT id, event_id, event_type, topic, partition_key, payload, retry_count, \
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
        claimed.push(ClaimedRow {
            id: row.try_get("id")?,
            event_id: row.try_get("event_id")?,
            event_type: row.try_get("event_type")?,
            topic: row.try_get("topic")?,
            partition_key: row.try_get("partition_key")?,
            payload: row
                .try_get::<serde_json::Value, _>("payload")
                .map_err(|e| format!("payload is not readable JSON: {e}")),
            retry_count: row.try_get("retry_count")?,
            created_at: row.try_get("created_at")?,
        });
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

/// Deletes up to `limit` SENT rows whose `sent_at` is older than `retention`, oldest
/// first, and returns how many it found to delete (the loop's stop signal) and deleted.
///
/// Two statements on purpose: a `DELETE … ORDER BY … LIMIT` is planned through
/// `idx_publish` with a filesort of every SENT row (and locks what it reads), while this
/// SELECT walks `idx_purge` (status, sent_at) in order and stops after `limit` entries; the
/// DELETE then touches only those rows by primary key. A row purged meanwhile by another
/// relay is simply not deleted twice.
pub async fn purge_batch(
    pool: &MySqlPool,
    retention: Duration,
    limit: u32,
) -> Result<(usize, u64), sqlx::Error> {
    let ids: Vec<u64> = sqlx::query_scalar(
        "SELECT id FROM inventory_outbox FORCE INDEX (idx_purge) \
         WHERE status = ? AND sent_at < NOW(3) - INTERVAL ? MICROSECOND \
         ORDER BY sent_at, id LIMIT ?",
    )
    .bind(status::SENT)
    .bind(micros(retention))
    .bind(limit)
    .fetch_all(pool)
    .deadline()
    .await?;
    if ids.is_empty() {
        return Ok((0, 0));
    }
    let mut delete = QueryBuilder::<MySql>::new("DELETE FROM inventory_outbox WHERE status = ");
    delete.push_bind(status::SENT).push(" AND id IN (");
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
    Ok((ids.len(), deleted))
}

/// Size and age of the backlog (rows not SENT).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Backlog {
    pub rows: u64,
    /// Age of the oldest unsent row; zero when there is none.
    pub oldest_age: Duration,
}

/// Counts unsent rows from the `(status, next_retry_at)` index alone and reads the creation
/// time of the lowest unsent id by primary key: two index lookups, cheap enough to run
/// every second even with a large backlog.
pub async fn backlog(pool: &MySqlPool) -> Result<Backlog, sqlx::Error> {
    let (rows, age_micros): (i64, Option<i64>) = sqlx::query_as(
        "SELECT b.n, TIMESTAMPDIFF(MICROSECOND, o.created_at, NOW(3)) \
         FROM (SELECT COUNT(*) AS n, MIN(id) AS min_id FROM inventory_outbox \
               WHERE status IN (?, ?, ?)) b \
         LEFT JOIN inventory_outbox o ON o.id = b.min_id",
    )
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
