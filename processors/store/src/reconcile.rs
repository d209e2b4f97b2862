//! What the reconciler reads and writes in MySQL (seed §13): the live buckets of a shard, the
//! two MySQL views of each bucket (reservations and ledger) with its snapshot and the work in
//! flight, the shard leases, and the differences it has seen. Every read takes a chunk of
//! buckets at once (`IN (...)` with bound parameters), so a pass costs a few statements per
//! chunk, not per bucket.

use crate::clock::now;
use crate::deadline::Deadline;
use crate::one_off::{in_list_of, OneOff};
use chrono::{NaiveDate, NaiveDateTime, TimeDelta};
use sqlx::{MySql, MySqlPool, QueryBuilder, Row};
use std::collections::HashMap;

/// The statuses whose units Redis holds in `reserved` (held = quantity - refunded).
pub const HOLDING: [i8; 2] = [20, 25];
/// The status whose units Redis holds in `sold`.
pub const SOLD: i8 = 40;
/// Statuses whose Redis step may have run while MySQL does not know yet.
pub const IN_FLIGHT: [i8; 4] = [10, 30, 50, 80];

/// The shard of a dish: stable across buckets of every day, so one instance checks a dish's
/// days together; computed the same way in SQL ([`buckets_of_shard`]).
pub fn shard_of(merchant_id: u64, dish_id: u64, shards: u32) -> u32 {
    let s = u64::from(shards.max(1));
    (((merchant_id % s) * 31 + dish_id % s) % s) as u32
}

/// A live (not ARCHIVED) bucket as the baseline says.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow, serde::Serialize)]
pub struct LiveBucket {
    pub stock_bucket_id: String,
    pub merchant_id: u64,
    pub dish_id: u64,
    pub stock_date: NaiveDate,
    pub total_stock: i64,
    pub baseline_version: u64,
    pub bucket_status: i8,
    pub lost_at: Option<NaiveDateTime>,
    /// The last clean full check (fences and op records read), by any instance.
    pub full_checked_at: Option<NaiveDateTime>,
}

/// Which buckets a pass or a command looks at.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BucketFilter {
    pub bucket: Option<String>,
    pub merchant_id: Option<u64>,
    pub stock_date: Option<NaiveDate>,
    /// `(shard, shards)`: only the buckets of that shard.
    pub shard: Option<(u32, u32)>,
}

/// Live buckets matching `filter` with ids after `after`, in id order, at most `limit`.
pub async fn live_buckets(
    pool: &MySqlPool,
    filter: &BucketFilter,
    after: Option<&str>,
    limit: u32,
) -> Result<Vec<LiveBucket>, sqlx::Error> {
    let mut q = QueryBuilder::<MySql>::new(
        "SELECT stock_bucket_id, merchant_id, dish_id, stock_date, total_stock, baseline_version, \
         bucket_status, lost_at, full_checked_at FROM dish_stock_baseline WHERE bucket_status <> 30",
    );
    if let Some(bucket) = &filter.bucket {
        q.push(" AND stock_bucket_id = ").push_bind(bucket.clone());
    }
    if let Some(merchant) = filter.merchant_id {
        q.push(" AND merchant_id = ").push_bind(merchant);
    }
    if let Some(date) = filter.stock_date {
        q.push(" AND stock_date = ").push_bind(date);
    }
    if let Some((shard, shards)) = filter.shard {
        let s = shards.max(1);
        q.push(" AND MOD(MOD(merchant_id, ")
            .push_bind(s)
            .push(") * 31 + MOD(dish_id, ")
            .push_bind(s)
            .push("), ")
            .push_bind(s)
            .push(") = ")
            .push_bind(shard);
    }
    if let Some(after) = after {
        q.push(" AND stock_bucket_id > ")
            .push_bind(after.to_string());
    }
    q.push(" ORDER BY stock_bucket_id LIMIT ").push_bind(limit);
    q.one_off_as().fetch_all(pool).deadline().await
}

/// The live buckets among `ids` (one chunk), in id order.
pub async fn live_buckets_by_id(
    pool: &MySqlPool,
    ids: &[String],
) -> Result<Vec<LiveBucket>, sqlx::Error> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let mut q = QueryBuilder::<MySql>::new(
        "SELECT stock_bucket_id, merchant_id, dish_id, stock_date, total_stock, baseline_version, \
         bucket_status, lost_at, full_checked_at FROM dish_stock_baseline \
         WHERE bucket_status <> 30 AND stock_bucket_id IN ",
    );
    in_list(&mut q, ids);
    q.push(" ORDER BY stock_bucket_id");
    q.one_off_as().fetch_all(pool).deadline().await
}

/// Records that `ids` were found consistent in a full check at `at`, so another instance (or
/// this one after a restart) does not check them in full again before their time.
pub async fn mark_full_checked(
    pool: &MySqlPool,
    ids: &[String],
    at: NaiveDateTime,
) -> Result<(), sqlx::Error> {
    if ids.is_empty() {
        return Ok(());
    }
    let mut q = QueryBuilder::<MySql>::new("UPDATE dish_stock_baseline SET full_checked_at = ");
    q.push_bind(at).push(" WHERE stock_bucket_id IN ");
    in_list(&mut q, ids);
    q.one_off().execute(pool).deadline().await?;
    Ok(())
}

/// The reservation table's view of one bucket.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReservationView {
    /// Σ held of RESERVED and CREATED_RESERVED rows.
    pub reserved: i64,
    /// Σ held of CONFIRMED rows.
    pub sold: i64,
    /// Rows in PREPARING, CONFIRMING, CANCELING or REFUNDING.
    pub in_flight: i64,
    /// Rows whose stock-change event the projector has not booked yet.
    pub unprojected: i64,
}

/// The ledger's view of one bucket: the sums of its deltas (seed §12.1).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LedgerView {
    pub total: i64,
    pub available: i64,
    pub reserved: i64,
    pub sold: i64,
    pub rows: i64,
    pub max_version: u64,
}

/// `dish_stock_snapshot` of one bucket.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct SnapshotView {
    pub total: i64,
    pub available: i64,
    pub reserved: i64,
    pub sold: i64,
    pub deficit: i64,
    pub redis_version: u64,
}

/// Everything MySQL says about a chunk of buckets, by bucket id.
#[derive(Debug, Clone, Default)]
pub struct MysqlViews {
    pub reservations: HashMap<String, ReservationView>,
    pub ledger: HashMap<String, LedgerView>,
    pub snapshots: HashMap<String, SnapshotView>,
    /// Unfinished (INIT, EXECUTING, RETRY) stock operations.
    pub wal_unfinished: HashMap<String, i64>,
    /// DEAD stock operations: an operator must settle them before the numbers can agree.
    pub wal_dead: HashMap<String, i64>,
    /// Stock-change outbox rows not sent yet.
    pub outbox_unsent: HashMap<String, i64>,
    /// Stock operations that changed Redis and whose event the ledger has not booked yet.
    pub wal_unbooked: HashMap<String, i64>,
    /// Buckets with a succeeded INIT (built at least once).
    pub built: HashMap<String, bool>,
    /// Buckets whose reservation and ledger sums were not read: work in flight showed first
    /// (see [`mysql_views_of`]).
    pub unsummed: std::collections::HashSet<String>,
}

/// A bucket's work in flight by kind: what holds its numbers back from being judged.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InFlightCounts {
    /// Reservations in PREPARING, CONFIRMING, CANCELING or REFUNDING.
    pub reservations: i64,
    /// Unfinished stock operations.
    pub stock_operations: i64,
    /// Dead stock operations.
    pub dead_operations: i64,
    /// Stock-change events not sent yet.
    pub outbox: i64,
    /// Events sent and not booked yet (reservation steps and stock operations).
    pub projection: i64,
}

impl InFlightCounts {
    pub fn any(&self) -> bool {
        self.reservations
            + self.stock_operations
            + self.dead_operations
            + self.outbox
            + self.projection
            > 0
    }
}

impl MysqlViews {
    /// The work in flight of `bucket` in the views read so far: the one count both the skip
    /// of the sums and the reconciler's verdict go by, so the two cannot disagree.
    pub fn in_flight(&self, bucket: &str) -> InFlightCounts {
        let count = |m: &HashMap<String, i64>| m.get(bucket).copied().unwrap_or(0);
        let r = self.reservations.get(bucket).copied().unwrap_or_default();
        InFlightCounts {
            reservations: r.in_flight,
            stock_operations: count(&self.wal_unfinished),
            dead_operations: count(&self.wal_dead),
            outbox: count(&self.outbox_unsent),
            projection: r.unprojected + count(&self.wal_unbooked),
        }
    }

    fn busy(&self, bucket: &str) -> bool {
        self.in_flight(bucket).any()
    }
}

fn in_list<'a>(q: &mut QueryBuilder<'a, MySql>, buckets: &'a [String]) {
    in_list_of(q, buckets.iter().map(String::as_str));
}

/// The snapshot's Redis version of each of `buckets` that has a snapshot row: one indexed
/// read, how a scheduled pass sees whether the projector booked anything since.
pub async fn snapshot_versions(
    pool: &MySqlPool,
    buckets: &[String],
) -> Result<HashMap<String, u64>, sqlx::Error> {
    if buckets.is_empty() {
        return Ok(HashMap::new());
    }
    let mut q = QueryBuilder::<MySql>::new(
        "SELECT stock_bucket_id, redis_version FROM dish_stock_snapshot WHERE stock_bucket_id IN ",
    );
    in_list(&mut q, buckets);
    let rows: Vec<(String, u64)> = q.one_off_as().fetch_all(pool).deadline().await?;
    Ok(rows.into_iter().collect())
}

/// Rows one statement of [`mysql_views`] sums at most (about 60 ms of MariaDB on the bench
/// machine). The reservation and ledger views are sums over every row a bucket ever had: one
/// statement over a hot dish's day (175,000 reservations) took 0.35 s idle and 1.3 s under
/// load, a core of MariaDB's taken from the Confirms of those seconds (the bench's orders had
/// whole seconds over 100 ms while it ran).
pub const VIEW_PAGE: u32 = 20_000;

/// After a full page the next waits this many times as long as the page took, so reading a
/// big bucket takes at most a third of one MariaDB thread, spread over the pass.
const PAGE_REST_FACTOR: u32 = 2;

/// How one view is summed page by page: its table read in the order of its bucket index.
struct PagedSums {
    /// The sums of a page's rows (`... FROM (`), with the page's last row carried through as
    /// `MAX(last_bucket)`, `MAX(last_id)` and, when ordered by time, `MAX(last_at)`.
    sums: &'static str,
    /// `SELECT stock_bucket_id, <columns> FROM <table> WHERE `.
    rows: &'static str,
    /// Ordered by (bucket, created_at, id) through `idx_bucket_created`; otherwise by (bucket,
    /// id) through `idx_stock_bucket`.
    by_time: bool,
    group_by: &'static str,
}

const RESERVATION_SUMS: PagedSums = PagedSums {
    sums: "SELECT stock_bucket_id, status, COUNT(*) AS n, \
           CAST(COALESCE(SUM(quantity - refunded_quantity), 0) AS SIGNED) AS held, \
           CAST(COALESCE(SUM(sync_status = 10 AND expected_redis_version IS NOT NULL), 0) AS SIGNED) AS unprojected, \
           MAX(last_bucket) AS last_bucket, MAX(last_id) AS last_id FROM (",
    rows: "SELECT stock_bucket_id, id, status, quantity, refunded_quantity, sync_status, \
           expected_redis_version FROM inventory_reservation WHERE ",
    by_time: false,
    group_by: " GROUP BY stock_bucket_id, status",
};

const LEDGER_SUMS: PagedSums = PagedSums {
    sums:
        "SELECT stock_bucket_id, CAST(SUM(total_delta) AS SIGNED) AS t, \
           CAST(SUM(available_delta) AS SIGNED) AS a, CAST(SUM(reserved_delta) AS SIGNED) AS r, \
           CAST(SUM(sold_delta) AS SIGNED) AS s, COUNT(*) AS n, \
           CAST(COALESCE(MAX(redis_version), 0) AS UNSIGNED) AS v, \
           MAX(last_bucket) AS last_bucket, MAX(last_id) AS last_id, MAX(last_at) AS last_at FROM (",
    rows: "SELECT stock_bucket_id, id, created_at, total_delta, available_delta, reserved_delta, \
           sold_delta, redis_version FROM inventory_ledger WHERE ",
    by_time: true,
    group_by: " GROUP BY stock_bucket_id",
};

/// Where a full page ended: its last row's bucket and sort key.
type Cut = (String, Option<NaiveDateTime>, u64);

/// Hands every row of `sums` over `buckets` to `take`, `page` rows per statement at most.
///
/// The rows are read in index order a page at a time: a page over the buckets not read yet,
/// and when it ends inside a bucket, that bucket alone from its last row on (one `IN` list
/// with an `OR` for the cut bucket made MariaDB merge and sort the whole index range
/// instead). Each page is its own consistent read, as the views' statements always were;
/// the two-pass rule (same Redis version, nothing in flight) is what makes the reconciler's
/// comparison sound, not one snapshot of MySQL.
async fn read_paged(
    pool: &MySqlPool,
    buckets: &[String],
    page: u32,
    sums: &PagedSums,
    mut take: impl FnMut(&sqlx::mysql::MySqlRow) -> Result<(), sqlx::Error>,
) -> Result<(), sqlx::Error> {
    let page = page.max(1);
    let mut pending: Vec<&str> = buckets.iter().map(String::as_str).collect();
    let mut cut: Option<Cut> = None;
    let (order, last_at) = if sums.by_time {
        (
            "created_at, id",
            ", FIRST_VALUE(created_at) OVER w AS last_at",
        )
    } else {
        ("id", "")
    };
    while cut.is_some() || !pending.is_empty() {
        let mut q = QueryBuilder::<MySql>::new(sums.sums);
        // The page's last row on every row of it: the window sorts the page only.
        q.push(
            "SELECT p.*, FIRST_VALUE(stock_bucket_id) OVER w AS last_bucket, \
             FIRST_VALUE(id) OVER w AS last_id",
        )
        .push(last_at)
        .push(" FROM (")
        .push(sums.rows);
        match &cut {
            Some((bucket, at, id)) => {
                q.push("stock_bucket_id = ").push_bind(bucket.as_str());
                match at {
                    Some(at) => q
                        .push(" AND (created_at > ")
                        .push_bind(*at)
                        .push(" OR (created_at = ")
                        .push_bind(*at)
                        .push(" AND id > ")
                        .push_bind(*id)
                        .push("))"),
                    None => q.push(" AND id > ").push_bind(*id),
                };
            }
            None => {
                q.push("stock_bucket_id IN ");
                in_list_of(&mut q, pending.iter().copied());
            }
        }
        q.push(" ORDER BY stock_bucket_id, ")
            .push(order)
            .push(" LIMIT ")
            .push_bind(page)
            .push(") p WINDOW w AS (ORDER BY stock_bucket_id DESC, ")
            .push(if sums.by_time {
                "created_at DESC, id DESC"
            } else {
                "id DESC"
            })
            .push(")) q")
            .push(sums.group_by);
        let started = std::time::Instant::now();
        let rows = q.one_off().fetch_all(pool).deadline().await?;
        let took = started.elapsed();
        let mut read = 0i64;
        let mut seen = std::collections::HashSet::new();
        let mut last: Option<Cut> = None;
        for row in &rows {
            read += row.try_get::<i64, _>("n")?;
            seen.insert(row.try_get::<String, _>("stock_bucket_id")?);
            if last.is_none() {
                let at = if sums.by_time {
                    Some(row.try_get("last_at")?)
                } else {
                    None
                };
                last = Some((row.try_get("last_bucket")?, at, row.try_get("last_id")?));
            }
            take(row)?;
        }
        let full = read >= i64::from(page);
        if cut.is_some() {
            cut = if full { last } else { None };
        } else if full {
            // Every bucket of the page but the last is read to its end (a bucket with no
            // rows never shows, and goes with the first short page); the last goes on alone.
            let before = pending.len();
            pending.retain(|b| !seen.iter().any(|s| same_bucket(s, b)));
            if pending.len() == before {
                // The page's rows name their bucket otherwise than asked (the collation
                // matched them): the next page would read them again from the start.
                return Err(sqlx::Error::Protocol(format!(
                    "reconcile views: no bucket of {seen:?} is one asked for"
                )));
            }
            cut = last;
        } else {
            // A short page read every bucket still pending to its end.
            pending.clear();
        }
        if cut.is_some() || !pending.is_empty() {
            tokio::time::sleep(took * PAGE_REST_FACTOR).await;
        }
    }
    Ok(())
}

/// Whether a bucket id read back names the one asked for: the ids are ASCII, and the
/// column's collation (utf8mb4_unicode_ci) ignores case and trailing spaces.
fn same_bucket(read: &str, asked: &str) -> bool {
    read.trim_end_matches(' ')
        .eq_ignore_ascii_case(asked.trim_end_matches(' '))
}

/// Adds the reservation view of `buckets` to `out`, `page` rows per statement at most.
pub async fn reservation_views(
    pool: &MySqlPool,
    buckets: &[String],
    page: u32,
    out: &mut HashMap<String, ReservationView>,
) -> Result<(), sqlx::Error> {
    read_paged(pool, buckets, page, &RESERVATION_SUMS, |row| {
        let status: i8 = row.try_get("status")?;
        let n: i64 = row.try_get("n")?;
        let held: i64 = row.try_get("held")?;
        let v = out.entry(row.try_get("stock_bucket_id")?).or_default();
        if HOLDING.contains(&status) {
            v.reserved += held;
        } else if status == SOLD {
            v.sold += held;
        } else if IN_FLIGHT.contains(&status) {
            v.in_flight += n;
        }
        v.unprojected += row.try_get::<i64, _>("unprojected")?;
        Ok(())
    })
    .await
}

/// Adds the ledger view of `buckets` to `out`, `page` rows per statement at most.
pub async fn ledger_views(
    pool: &MySqlPool,
    buckets: &[String],
    page: u32,
    out: &mut HashMap<String, LedgerView>,
) -> Result<(), sqlx::Error> {
    read_paged(pool, buckets, page, &LEDGER_SUMS, |row| {
        let v = out.entry(row.try_get("stock_bucket_id")?).or_default();
        v.total += row.try_get::<i64, _>("t")?;
        v.available += row.try_get::<i64, _>("a")?;
        v.reserved += row.try_get::<i64, _>("r")?;
        v.sold += row.try_get::<i64, _>("s")?;
        v.rows += row.try_get::<i64, _>("n")?;
        v.max_version = v.max_version.max(row.try_get("v")?);
        Ok(())
    })
    .await
}

/// Reads every MySQL view of `buckets` (a chunk: a few hundred ids) in seven statements, more
/// when the chunk holds more than [`VIEW_PAGE`] reservation or ledger rows.
pub async fn mysql_views(pool: &MySqlPool, buckets: &[String]) -> Result<MysqlViews, sqlx::Error> {
    mysql_views_of(pool, buckets, &|_| false).await
}

/// [`mysql_views`], except that a bucket `may_skip` names whose work in flight shows before
/// the sums is not summed: it is in [`MysqlViews::unsummed`], and its reservation and ledger
/// views are empty but for the reservations in flight. Its verdict is "held back" whatever
/// the sums say, and under load a hot dish nearly always has a Try in flight: its sums read
/// every row of its day (about 7 µs of MariaDB CPU a row, 1.46 s for the two passes of a
/// bucket with 51,615 reservations) only to be set aside.
///
/// The work in flight is read before the sums, as it is for every bucket: each step only
/// moves forward (PREPARING, sent, booked), so a step seen done here is done in the sums read
/// after; read the other way round, a step could start after the sums and be done before
/// the check of its event, and a bucket whose sums missed it would pass for settled.
pub async fn mysql_views_of(
    pool: &MySqlPool,
    buckets: &[String],
    may_skip: &(dyn Fn(&str) -> bool + Sync),
) -> Result<MysqlViews, sqlx::Error> {
    let mut views = MysqlViews::default();
    if buckets.is_empty() {
        return Ok(views);
    }
    work_in_flight(pool, buckets, &mut views).await?;
    let candidates: Vec<String> = buckets
        .iter()
        .filter(|b| may_skip(b) && !views.busy(b))
        .cloned()
        .collect();
    if !candidates.is_empty() {
        let mut q = QueryBuilder::<MySql>::new(
            "SELECT stock_bucket_id, COUNT(*) AS n FROM inventory_reservation \
             FORCE INDEX (idx_state_retry) WHERE status IN ",
        );
        in_list_of(&mut q, IN_FLIGHT);
        q.push(" AND stock_bucket_id IN ");
        in_list(&mut q, &candidates);
        q.push(" GROUP BY stock_bucket_id");
        for row in q.one_off().fetch_all(pool).deadline().await? {
            let bucket: String = row.try_get("stock_bucket_id")?;
            views.reservations.entry(bucket).or_default().in_flight = row.try_get("n")?;
        }
    }
    let (unsummed, summed): (Vec<String>, Vec<String>) = buckets
        .iter()
        .cloned()
        .partition(|b| may_skip(b) && views.busy(b));
    if !summed.is_empty() {
        reservation_views(pool, &summed, VIEW_PAGE, &mut views.reservations).await?;
        ledger_views(pool, &summed, VIEW_PAGE, &mut views.ledger).await?;
    }
    views.unsummed = unsummed.into_iter().collect();
    Ok(views)
}

/// The snapshots, stock operations and unsent or unbooked events of `buckets`: everything
/// [`mysql_views`] reads but the sums.
async fn work_in_flight(
    pool: &MySqlPool,
    buckets: &[String],
    views: &mut MysqlViews,
) -> Result<(), sqlx::Error> {
    let mut q = QueryBuilder::<MySql>::new(
        "SELECT stock_bucket_id, total_stock, available_stock, reserved_stock, sold_stock, \
         deficit_stock, redis_version FROM dish_stock_snapshot WHERE stock_bucket_id IN ",
    );
    in_list(&mut q, buckets);
    for row in q.one_off().fetch_all(pool).deadline().await? {
        views.snapshots.insert(
            row.try_get("stock_bucket_id")?,
            SnapshotView {
                total: row.try_get("total_stock")?,
                available: row.try_get("available_stock")?,
                reserved: row.try_get("reserved_stock")?,
                sold: row.try_get("sold_stock")?,
                deficit: row.try_get("deficit_stock")?,
                redis_version: row.try_get("redis_version")?,
            },
        );
    }

    // INIT 10, EXECUTING 20, RETRY 40 are unfinished; DEAD 50 needs an operator. A repair
    // or rebuild row is the reconciler's own work and counts like any other.
    let mut q = QueryBuilder::<MySql>::new(
        "SELECT stock_bucket_id, status, COUNT(*) AS n, \
         CAST(COALESCE(SUM(action = 1 AND status = 30), 0) AS SIGNED) AS built \
         FROM inventory_operation_wal WHERE stock_bucket_id IN ",
    );
    in_list(&mut q, buckets);
    q.push(" GROUP BY stock_bucket_id, status");
    for row in q.one_off().fetch_all(pool).deadline().await? {
        let bucket: String = row.try_get("stock_bucket_id")?;
        let status: i8 = row.try_get("status")?;
        let n: i64 = row.try_get("n")?;
        let built: i64 = row.try_get("built")?;
        match status {
            10 | 20 | 40 => *views.wal_unfinished.entry(bucket.clone()).or_default() += n,
            50 => *views.wal_dead.entry(bucket.clone()).or_default() += n,
            _ => {}
        }
        if built > 0 {
            views.built.insert(bucket, true);
        }
    }

    // Unsent rows are few (the relay keeps the backlog near zero): PENDING rows above the
    // relay's high-water mark (a primary-key range; the rows below it stay PENDING once
    // published) and the SENDING/RETRY range of idx_publish, filtered by key.
    let mut q = QueryBuilder::<MySql>::new(
        "SELECT partition_key, COUNT(*) AS n FROM ( \
           SELECT o.partition_key FROM inventory_outbox_relay c \
             JOIN inventory_outbox o FORCE INDEX (PRIMARY) ON o.id > c.hwm \
             WHERE c.id = 1 AND o.status = 10 \
           UNION ALL \
           SELECT partition_key FROM inventory_outbox FORCE INDEX (idx_publish) \
             WHERE status IN (20, 40)) u \
         WHERE partition_key IN ",
    );
    in_list(&mut q, buckets);
    q.push(" GROUP BY partition_key");
    for row in q.one_off().fetch_all(pool).deadline().await? {
        views
            .outbox_unsent
            .insert(row.try_get("partition_key")?, row.try_get("n")?);
    }

    let mut q = QueryBuilder::<MySql>::new(UNBOOKED_SELECT);
    in_list(&mut q, buckets);
    q.push(UNBOOKED_TAIL);
    for row in q.one_off().fetch_all(pool).deadline().await? {
        views
            .wal_unbooked
            .insert(row.try_get("stock_bucket_id")?, row.try_get("n")?);
    }
    Ok(())
}

/// Stock operations whose script changed the bucket (an INIT that created it, an ADJUST,
/// REPAIR or REBUILD that succeeded) and that have no ledger row yet: their event is on its
/// way to the projector, so the ledger's sums lag Redis.
const UNBOOKED_SELECT: &str =
    "SELECT w.stock_bucket_id, COUNT(*) AS n FROM inventory_operation_wal w \
     WHERE w.status = 30 AND w.action IN (1, 2, 3, 6) \
     AND JSON_VALUE(w.result_payload, '$.outcome') = 'SUCCEEDED' \
     AND (w.action <> 1 OR JSON_VALUE(w.result_payload, '$.effect') = 'INITIALIZED') \
     AND NOT EXISTS (SELECT 1 FROM inventory_ledger l WHERE l.operation_id = w.operation_id) \
     AND w.stock_bucket_id IN ";
const UNBOOKED_TAIL: &str = " GROUP BY w.stock_bucket_id";

/// Whether every event of `bucket` has been sent and booked: no unsent outbox row, no
/// reservation step waiting for its projection, no stock operation without its ledger row.
/// A rebuild computes from the ledger only once this holds.
pub async fn projection_complete(pool: &MySqlPool, bucket: &str) -> Result<bool, sqlx::Error> {
    let ids = [bucket.to_string()];
    let v = mysql_views(pool, &ids).await?;
    let pending = v.outbox_unsent.get(bucket).copied().unwrap_or(0)
        + v.wal_unbooked.get(bucket).copied().unwrap_or(0)
        + v.reservations
            .get(bucket)
            .map(|r| r.unprojected)
            .unwrap_or(0);
    Ok(pending == 0)
}

/// A reservation as the rebuild needs it: what Redis held for it and the steps it took.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct RebuildRow {
    pub id: u64,
    pub status: i8,
    pub quantity: u32,
    pub refunded_quantity: u32,
    pub current_operation_id: String,
    pub expected_redis_version: Option<u64>,
    /// The status a REFUNDING row returns to (CONFIRMED or CREATED_RESERVED).
    pub resume_status: Option<i8>,
}

/// Every reservation of `bucket` that left a trace in Redis (not REJECTED, not PREPARING),
/// in id order, after `after`, at most `limit`.
pub async fn rebuild_rows(
    pool: &MySqlPool,
    bucket: &str,
    after: u64,
    limit: u32,
) -> Result<Vec<RebuildRow>, sqlx::Error> {
    sqlx::query_as(
        "SELECT id, status, quantity, refunded_quantity, current_operation_id, \
         expected_redis_version, resume_status FROM inventory_reservation \
         WHERE stock_bucket_id = ? AND status NOT IN (10, 70) AND id > ? ORDER BY id LIMIT ?",
    )
    .bind(bucket)
    .bind(after)
    .bind(limit)
    .fetch_all(pool)
    .deadline()
    .await
}

/// A reservation whose records a bucket must keep in Redis: it holds units (RESERVED,
/// CREATED_RESERVED, or CONFIRMED with units not refunded), so its fence decides what a later
/// Confirm, Cancel or Refund does.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct GuardedRow {
    pub stock_bucket_id: String,
    pub id: u64,
    pub status: i8,
    pub quantity: u32,
    pub refunded_quantity: u32,
    pub created_at: NaiveDateTime,
}

/// The reservations a full check reads the fence and op record of: those holding units
/// (RESERVED, CREATED_RESERVED, CONFIRMED, not wholly refunded).
const GUARDED_SELECT: &str = "SELECT stock_bucket_id, id, status, quantity, refunded_quantity, \
     created_at FROM inventory_reservation WHERE status IN (20, 25, 40) \
     AND quantity > refunded_quantity";

/// The guarded reservations of `buckets`, ordered by bucket and id: at most `limit` of them,
/// and with `after` (a bucket and an id) only that bucket's after that id.
pub async fn guarded_rows(
    pool: &MySqlPool,
    buckets: &[String],
    after: Option<(&str, u64)>,
    limit: u32,
) -> Result<Vec<GuardedRow>, sqlx::Error> {
    if buckets.is_empty() {
        return Ok(Vec::new());
    }
    let mut q = QueryBuilder::<MySql>::new(GUARDED_SELECT);
    match after {
        // One bucket through idx_stock_bucket (bucket, id): a range read, not a sort.
        Some((bucket, id)) => {
            q.push(" AND stock_bucket_id = ")
                .push_bind(bucket)
                .push(" AND id > ")
                .push_bind(id);
        }
        None => {
            q.push(" AND stock_bucket_id IN ");
            in_list(&mut q, buckets);
        }
    }
    q.push(" ORDER BY stock_bucket_id, id LIMIT ")
        .push_bind(limit);
    q.one_off_as().fetch_all(pool).deadline().await
}

/// Those of `ids` (reservations of `bucket`) that are still guarded, as they are now, by
/// id: a full check reads its suspects again (a Confirm, Cancel or Refund moves Redis
/// first and MySQL a moment later, so a row read before it met a fence read after it).
pub async fn guarded_rows_by_id(
    pool: &MySqlPool,
    bucket: &str,
    ids: &[u64],
) -> Result<Vec<GuardedRow>, sqlx::Error> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let mut q = QueryBuilder::<MySql>::new(GUARDED_SELECT);
    q.push(" AND stock_bucket_id = ")
        .push_bind(bucket)
        .push(" AND id IN ");
    in_list_of(&mut q, ids.iter().copied());
    q.push(" ORDER BY id");
    q.one_off_as().fetch_all(pool).deadline().await
}

/// `rebuild_rows` of the given reservations of `bucket` (a repair restores their records).
pub async fn rows_by_id(
    pool: &MySqlPool,
    bucket: &str,
    ids: &[u64],
) -> Result<Vec<RebuildRow>, sqlx::Error> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let mut q = QueryBuilder::<MySql>::new(
        "SELECT id, status, quantity, refunded_quantity, current_operation_id, \
         expected_redis_version, resume_status FROM inventory_reservation WHERE stock_bucket_id = ",
    );
    q.push_bind(bucket);
    q.push(" AND id IN ");
    in_list_of(&mut q, ids.iter().copied());
    q.push(" ORDER BY id");
    q.one_off_as().fetch_all(pool).deadline().await
}

/// The completed refunds of `reservation_ids` (operation id, reservation, quantity), to
/// re-create their op records.
pub async fn completed_refunds(
    pool: &MySqlPool,
    reservation_ids: &[u64],
) -> Result<Vec<(u64, String, u32)>, sqlx::Error> {
    if reservation_ids.is_empty() {
        return Ok(Vec::new());
    }
    let mut q = QueryBuilder::<MySql>::new(
        "SELECT reservation_id, operation_id, quantity FROM inventory_refund WHERE status = ",
    );
    q.push_bind(stocksvr_core::reservation::RefundStatus::Done.code());
    q.push(" AND reservation_id IN ");
    in_list_of(&mut q, reservation_ids.iter().copied());
    q.push(" ORDER BY reservation_id, updated_at");
    q.one_off_as().fetch_all(pool).deadline().await
}

/// The highest bucket version MySQL knows of: the start of a rebuilt bucket must lie above
/// it, so every event after the rebuild is newer than anything the projector booked.
pub async fn highest_known_version(pool: &MySqlPool, bucket: &str) -> Result<u64, sqlx::Error> {
    let (v,): (u64,) = sqlx::query_as(
        "SELECT CAST(GREATEST( \
           COALESCE((SELECT MAX(redis_version) FROM inventory_ledger WHERE stock_bucket_id = ?), 0), \
           COALESCE((SELECT redis_version FROM dish_stock_snapshot WHERE stock_bucket_id = ?), 0), \
           COALESCE((SELECT MAX(expected_redis_version) FROM inventory_reservation WHERE stock_bucket_id = ?), 0), \
           COALESCE((SELECT MAX(CAST(JSON_VALUE(result_payload, '$.redis_version') AS UNSIGNED)) \
                     FROM inventory_operation_wal WHERE stock_bucket_id = ?), 0)) AS UNSIGNED)",
    )
    .bind(bucket)
    .bind(bucket)
    .bind(bucket)
    .bind(bucket)
    .fetch_one(pool)
    .deadline()
    .await?;
    Ok(v)
}

/// Makes sure shard rows 0..shards exist (idempotent).
pub async fn ensure_shards(pool: &MySqlPool, shards: u32) -> Result<(), sqlx::Error> {
    let mut q = QueryBuilder::<MySql>::new(
        "INSERT IGNORE INTO inventory_reconcile_shard (shard, lease_expire_at) ",
    );
    let epoch = NaiveDateTime::default();
    q.push_values(0..shards, |mut b, shard| {
        b.push_bind(shard).push_bind(epoch);
    });
    q.one_off().execute(pool).deadline().await?;
    Ok(())
}

/// Leases the shard checked longest ago that nobody holds, for `lease`. `None` when every
/// shard is held, or was checked less than `min_interval` ago and has no recheck due
/// ([`finish_shard`]).
///
/// The shard rows must exist ([`ensure_shards`]). Also says whether another shard was due
/// at the same time (`more`): a caller then comes back soon instead of after its idle sleep.
pub async fn claim_shard(
    pool: &MySqlPool,
    owner: &str,
    shards: u32,
    lease: TimeDelta,
    min_interval: TimeDelta,
) -> Result<Option<ShardClaim>, sqlx::Error> {
    let now = now();
    let mut tx = crate::deadline::begin(pool).await?;
    let due: Vec<(u32,)> = sqlx::query_as(
        "SELECT shard FROM inventory_reconcile_shard WHERE shard < ? AND lease_expire_at < ? \
         AND (last_pass_at IS NULL OR last_pass_at < ? OR recheck_at <= ?) \
         ORDER BY last_pass_at IS NOT NULL, last_pass_at, shard LIMIT 2 FOR UPDATE SKIP LOCKED",
    )
    .bind(shards)
    .bind(now)
    .bind(now - min_interval)
    .bind(now)
    .fetch_all(&mut *tx)
    .deadline()
    .await?;
    let Some(&(shard,)) = due.first() else {
        tx.commit().deadline().await?;
        return Ok(None);
    };
    sqlx::query(
        "UPDATE inventory_reconcile_shard SET lease_owner = ?, lease_expire_at = ? WHERE shard = ?",
    )
    .bind(owner)
    .bind(now + lease)
    .bind(shard)
    .execute(&mut *tx)
    .deadline()
    .await?;
    tx.commit().deadline().await?;
    Ok(Some(ShardClaim {
        shard,
        more: due.len() > 1,
    }))
}

/// A leased shard, and whether another one was due too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardClaim {
    pub shard: u32,
    pub more: bool,
}

/// Extends `owner`'s lease of `shard` to `lease` from now. False when the shard is no longer
/// `owner`'s: its lease ran out (a stalled process) and another instance claimed it.
pub async fn renew_shard(
    pool: &MySqlPool,
    shard: u32,
    owner: &str,
    lease: TimeDelta,
) -> Result<bool, sqlx::Error> {
    let renewed = sqlx::query(
        "UPDATE inventory_reconcile_shard SET lease_expire_at = ? WHERE shard = ? AND lease_owner = ?",
    )
    .bind(now() + lease)
    .bind(shard)
    .bind(owner)
    .execute(pool)
    .deadline()
    .await?;
    if renewed.rows_affected() == 1 {
        return Ok(true);
    }
    // MariaDB counts changed rows: a renewal within the column's precision of the last one
    // changes nothing and still holds the lease.
    let holder: Option<Option<String>> =
        sqlx::query_scalar("SELECT lease_owner FROM inventory_reconcile_shard WHERE shard = ?")
            .bind(shard)
            .fetch_optional(pool)
            .deadline()
            .await?;
    Ok(holder.flatten().as_deref() == Some(owner))
}

/// Ends `owner`'s lease of `shard` and records the pass. With `recheck`, the shard is due
/// again that long after the pass whatever its interval: the pass left a suspicion for a
/// second look, or did not finish.
pub async fn finish_shard(
    pool: &MySqlPool,
    shard: u32,
    owner: &str,
    recheck: Option<TimeDelta>,
) -> Result<(), sqlx::Error> {
    let now = now();
    sqlx::query(
        "UPDATE inventory_reconcile_shard SET lease_owner = NULL, lease_expire_at = ?, \
         last_pass_at = ?, recheck_at = ? WHERE shard = ? AND lease_owner = ?",
    )
    .bind(now)
    .bind(now)
    .bind(recheck.map(|d| now + d))
    .bind(shard)
    .bind(owner)
    .execute(pool)
    .deadline()
    .await?;
    Ok(())
}

pub use stocksvr_core::codes::DifferenceStatus;

/// An open (suspected or confirmed) difference.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct OpenDifference {
    pub id: u64,
    pub stock_bucket_id: String,
    pub kind: String,
    pub redis_version: u64,
    pub status: i8,
    pub repair_operation_id: Option<String>,
    pub first_seen_at: NaiveDateTime,
    pub confirmed_at: Option<NaiveDateTime>,
}

/// The open differences of `buckets`.
pub async fn open_differences(
    pool: &MySqlPool,
    buckets: &[String],
) -> Result<Vec<OpenDifference>, sqlx::Error> {
    if buckets.is_empty() {
        return Ok(Vec::new());
    }
    let mut q = QueryBuilder::<MySql>::new(
        "SELECT id, stock_bucket_id, kind, redis_version, status, repair_operation_id, \
         first_seen_at, confirmed_at FROM inventory_reconcile_difference WHERE status IN (10, 20) \
         AND stock_bucket_id IN ",
    );
    in_list(&mut q, buckets);
    q.push(" ORDER BY id");
    q.one_off_as().fetch_all(pool).deadline().await
}

/// A first sighting: SUSPECTED at `version`.
pub async fn suspect(
    pool: &MySqlPool,
    bucket: &str,
    kind: &str,
    version: u64,
    views: &serde_json::Value,
) -> Result<(), sqlx::Error> {
    let now = now();
    sqlx::query(
        "INSERT INTO inventory_reconcile_difference (stock_bucket_id, kind, redis_version, status, \
         views, first_seen_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(bucket)
    .bind(kind)
    .bind(version)
    .bind(DifferenceStatus::Suspected as i8)
    .bind(views)
    .bind(now)
    .bind(now)
    .execute(pool)
    .deadline()
    .await?;
    Ok(())
}

/// Seen again at another version: the sighting starts over there.
pub async fn resuspect(
    pool: &MySqlPool,
    id: u64,
    version: u64,
    views: &serde_json::Value,
) -> Result<(), sqlx::Error> {
    let now = now();
    sqlx::query(
        "UPDATE inventory_reconcile_difference SET status = ?, redis_version = ?, views = ?, \
         first_seen_at = ?, confirmed_at = NULL, updated_at = ? WHERE id = ? AND status IN (10, 20)",
    )
    .bind(DifferenceStatus::Suspected as i8)
    .bind(version)
    .bind(views)
    .bind(now)
    .bind(now)
    .bind(id)
    .execute(pool)
    .deadline()
    .await?;
    Ok(())
}

/// Seen twice at the same version with nothing in flight: CONFIRMED. True when this call
/// confirmed it (not an earlier pass).
pub async fn confirm(
    pool: &MySqlPool,
    id: u64,
    views: &serde_json::Value,
) -> Result<bool, sqlx::Error> {
    let now = now();
    let done = sqlx::query(
        "UPDATE inventory_reconcile_difference SET status = ?, views = ?, confirmed_at = ?, \
         updated_at = ? WHERE id = ? AND status = ?",
    )
    .bind(DifferenceStatus::Confirmed as i8)
    .bind(views)
    .bind(now)
    .bind(now)
    .bind(id)
    .bind(DifferenceStatus::Suspected as i8)
    .execute(pool)
    .deadline()
    .await?;
    Ok(done.rows_affected() == 1)
}

/// The bucket agrees again (repaired, or it was transient): the difference is resolved.
pub async fn resolve(pool: &MySqlPool, id: u64) -> Result<(), sqlx::Error> {
    let now = now();
    sqlx::query(
        "UPDATE inventory_reconcile_difference SET status = ?, resolved_at = ?, updated_at = ? \
         WHERE id = ? AND status IN (10, 20)",
    )
    .bind(DifferenceStatus::Resolved as i8)
    .bind(now)
    .bind(now)
    .bind(id)
    .execute(pool)
    .deadline()
    .await?;
    Ok(())
}

/// Records the repair operation that answers a confirmed difference.
pub async fn set_repair(pool: &MySqlPool, id: u64, operation_id: &str) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE inventory_reconcile_difference SET repair_operation_id = ?, updated_at = ? WHERE id = ?",
    )
    .bind(operation_id)
    .bind(now())
    .bind(id)
    .execute(pool)
    .deadline()
    .await?;
    Ok(())
}

/// Confirmed differences by kind, and the confirmation time of the oldest one: the gauges.
pub async fn confirmed_summary(
    pool: &MySqlPool,
) -> Result<(Vec<(String, i64)>, Option<NaiveDateTime>), sqlx::Error> {
    let by_kind: Vec<(String, i64)> = sqlx::query_as(
        "SELECT kind, COUNT(*) FROM inventory_reconcile_difference WHERE status = 20 GROUP BY kind",
    )
    .fetch_all(pool)
    .deadline()
    .await?;
    let (oldest,): (Option<NaiveDateTime>,) = sqlx::query_as(
        "SELECT MIN(confirmed_at) FROM inventory_reconcile_difference WHERE status = 20",
    )
    .fetch_one(pool)
    .deadline()
    .await?;
    Ok((by_kind, oldest))
}

/// Deletes inbox rows consumed before `before`, at most `limit`; returns how many.
pub async fn purge_inbox(
    pool: &MySqlPool,
    before: NaiveDateTime,
    limit: u32,
) -> Result<u64, sqlx::Error> {
    let done = sqlx::query("DELETE FROM inventory_consumer_inbox WHERE consumed_at < ? LIMIT ?")
        .bind(before)
        .bind(limit)
        .execute(pool)
        .deadline()
        .await?;
    Ok(done.rows_affected())
}

#[cfg(test)]
mod tests {
    use super::*;

    // A bucket read back as MariaDB's collation matched it is the one asked for; otherwise a
    // page over several buckets would leave it pending and read it again from the start.
    #[test]
    fn a_bucket_read_back_in_another_case_or_with_trailing_spaces_is_the_one_asked_for() {
        assert!(same_bucket("bucket_1_2_20260101", "bucket_1_2_20260101"));
        assert!(same_bucket("Bucket_1_2_20260101", "bucket_1_2_20260101"));
        assert!(same_bucket("bucket_1_2_20260101 ", "bucket_1_2_20260101"));
        assert!(!same_bucket("bucket_1_2_20260101", "bucket_1_2_20260102"));
        assert!(!same_bucket("bucket_1_2_2026010", "bucket_1_2_20260101"));
    }

    #[test]
    fn a_dish_keeps_its_shard_and_shards_cover_every_dish() {
        assert_eq!(shard_of(7, 9, 16), shard_of(7, 9, 16));
        assert!(shard_of(u64::MAX, u64::MAX, 16) < 16);
        assert_eq!(shard_of(5, 5, 1), 0);
        assert_eq!(shard_of(5, 5, 0), 0, "zero shards means one");
        let mut seen = std::collections::HashSet::new();
        for m in 0..64 {
            for d in 0..64 {
                seen.insert(shard_of(m, d, 16));
            }
        }
        assert_eq!(seen.len(), 16);
    }
}
