//! The reservation table's and the ledger's sums of a chunk of buckets, read page by page:
//! they are sums over every row a bucket ever had, and one statement over a hot dish's day
//! would take a core of MariaDB from the Trys and Confirms of that second.

use super::{reservation_status, LedgerView, ReservationView, HOLDING, IN_FLIGHT, SOLD};
use crate::deadline::Deadline;
use crate::one_off::{in_list_of, OneOff};
use chrono::NaiveDateTime;
use sqlx::mysql::MySqlRow;
use sqlx::{MySql, MySqlPool, QueryBuilder, Row};
use std::collections::{HashMap, HashSet};
use std::time::Instant;
use stocksvr_core::codes::SyncStatus;

/// Rows one statement of [`super::mysql_views`] sums at most (about 60 ms of MariaDB on the
/// bench machine). The reservation and ledger views are sums over every row a bucket ever
/// had: one statement over a hot dish's day (175,000 reservations) took 0.35 s idle and 1.3 s
/// under load, a core of MariaDB's taken from the Confirms of those seconds (the bench's
/// orders had whole seconds over 100 ms while it ran).
pub const VIEW_PAGE: u32 = 20_000;

/// After a full page the next waits this many times as long as the page took, so reading a
/// big bucket takes at most a third of one MariaDB thread, spread over the pass.
const PAGE_REST_FACTOR: u32 = 2;

/// How one view is summed page by page: its table read in the order of its bucket index.
struct PagedSums {
    /// Pushes the sums of a page's rows (`... FROM (`), with the page's last row carried
    /// through as `MAX(last_bucket)`, `MAX(last_id)` and, when ordered by time,
    /// `MAX(last_at)`.
    sums: fn(&mut QueryBuilder<'_, MySql>),
    /// `SELECT stock_bucket_id, <columns> FROM <table> WHERE `.
    rows: &'static str,
    /// Ordered by (bucket, created_at, id) through `idx_bucket_created`; otherwise by (bucket,
    /// id) through `idx_stock_bucket`.
    by_time: bool,
    group_by: &'static str,
}

const RESERVATION_SUMS: PagedSums = PagedSums {
    sums: reservation_sums,
    rows: "SELECT stock_bucket_id, id, status, quantity, refunded_quantity, sync_status, \
           expected_redis_version FROM inventory_reservation WHERE ",
    by_time: false,
    group_by: " GROUP BY stock_bucket_id, status",
};

/// A row whose step reached Redis (it has an expected version) and whose event is still
/// PENDING is not booked by the projector yet.
fn reservation_sums(q: &mut QueryBuilder<'_, MySql>) {
    q.push(
        "SELECT stock_bucket_id, status, COUNT(*) AS n, \
         CAST(COALESCE(SUM(quantity - refunded_quantity), 0) AS SIGNED) AS held, \
         CAST(COALESCE(SUM(sync_status = ",
    )
    .push_bind(SyncStatus::Pending.code())
    .push(
        " AND expected_redis_version IS NOT NULL), 0) AS SIGNED) AS unprojected, \
         MAX(last_bucket) AS last_bucket, MAX(last_id) AS last_id FROM (",
    );
}

const LEDGER_SUMS: PagedSums = PagedSums {
    sums: ledger_sums,
    rows: "SELECT stock_bucket_id, id, created_at, total_delta, available_delta, reserved_delta, \
           sold_delta, redis_version FROM inventory_ledger WHERE ",
    by_time: true,
    group_by: " GROUP BY stock_bucket_id",
};

fn ledger_sums(q: &mut QueryBuilder<'_, MySql>) {
    q.push(
        "SELECT stock_bucket_id, CAST(SUM(total_delta) AS SIGNED) AS t, \
         CAST(SUM(available_delta) AS SIGNED) AS a, CAST(SUM(reserved_delta) AS SIGNED) AS r, \
         CAST(SUM(sold_delta) AS SIGNED) AS s, COUNT(*) AS n, \
         CAST(COALESCE(MAX(redis_version), 0) AS UNSIGNED) AS v, \
         MAX(last_bucket) AS last_bucket, MAX(last_id) AS last_id, MAX(last_at) AS last_at FROM (",
    );
}

/// Where a full page ended: its last row's bucket and sort key.
type Cut = (String, Option<NaiveDateTime>, u64);

/// What is left to read: the buckets no page has reached yet, and the bucket a full page
/// ended inside (read alone next, from its last row on).
struct Pending<'b> {
    buckets: Vec<&'b str>,
    cut: Option<Cut>,
}

impl Pending<'_> {
    fn done(&self) -> bool {
        self.cut.is_none() && self.buckets.is_empty()
    }

    /// Moves on past a page that was `full`, read rows of the buckets `seen` and ended at
    /// `last`.
    fn after_page(
        &mut self,
        full: bool,
        seen: &HashSet<String>,
        last: Option<Cut>,
    ) -> Result<(), sqlx::Error> {
        if self.cut.is_some() {
            self.cut = if full { last } else { None };
        } else if full {
            // Every bucket of the page but the last is read to its end (a bucket with no
            // rows never shows, and goes with the first short page); the last goes on alone.
            let before = self.buckets.len();
            self.buckets
                .retain(|b| !seen.iter().any(|s| same_bucket(s, b)));
            if self.buckets.len() == before {
                // The page's rows name their bucket otherwise than asked (the collation
                // matched them): the next page would read them again from the start.
                return Err(sqlx::Error::Protocol(format!(
                    "reconcile views: no bucket of {seen:?} is one asked for"
                )));
            }
            self.cut = last;
        } else {
            // A short page read every bucket still pending to its end.
            self.buckets.clear();
        }
        Ok(())
    }
}

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
    mut take: impl FnMut(&MySqlRow) -> Result<(), sqlx::Error>,
) -> Result<(), sqlx::Error> {
    let page = page.max(1);
    let mut pending = Pending {
        buckets: buckets.iter().map(String::as_str).collect(),
        cut: None,
    };
    while !pending.done() {
        let (rows, took) = {
            let mut q = page_statement(sums, &pending, page);
            let started = Instant::now();
            let rows = q.one_off().fetch_all(pool).deadline().await?;
            (rows, started.elapsed())
        };
        let mut read = 0i64;
        let mut seen = HashSet::new();
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
        pending.after_page(read >= i64::from(page), &seen, last)?;
        if !pending.done() {
            tokio::time::sleep(took * PAGE_REST_FACTOR).await;
        }
    }
    Ok(())
}

/// The statement of one page: the cut bucket alone from its last row on, or else the pending
/// buckets from their first row.
fn page_statement<'q>(
    sums: &PagedSums,
    pending: &'q Pending<'q>,
    page: u32,
) -> QueryBuilder<'q, MySql> {
    let (order, last_at, window) = if sums.by_time {
        (
            "created_at, id",
            ", FIRST_VALUE(created_at) OVER w AS last_at",
            "created_at DESC, id DESC",
        )
    } else {
        ("id", "", "id DESC")
    };
    let mut q = QueryBuilder::<MySql>::new("");
    (sums.sums)(&mut q);
    // The page's last row on every row of it: the window sorts the page only.
    q.push(
        "SELECT p.*, FIRST_VALUE(stock_bucket_id) OVER w AS last_bucket, \
         FIRST_VALUE(id) OVER w AS last_id",
    )
    .push(last_at)
    .push(" FROM (")
    .push(sums.rows);
    match &pending.cut {
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
            in_list_of(&mut q, pending.buckets.iter().copied());
        }
    }
    q.push(" ORDER BY stock_bucket_id, ")
        .push(order)
        .push(" LIMIT ")
        .push_bind(page)
        .push(") p WINDOW w AS (ORDER BY stock_bucket_id DESC, ")
        .push(window)
        .push(")) q")
        .push(sums.group_by);
    q
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
        let status = reservation_status(row.try_get("status")?);
        let n: i64 = row.try_get("n")?;
        let held: i64 = row.try_get("held")?;
        let v = out.entry(row.try_get("stock_bucket_id")?).or_default();
        match status {
            Some(s) if HOLDING.contains(&s) => v.reserved += held,
            Some(s) if s == SOLD => v.sold += held,
            Some(s) if IN_FLIGHT.contains(&s) => v.in_flight += n,
            _ => {}
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

    fn cut(bucket: &str, id: u64) -> Option<Cut> {
        Some((bucket.to_string(), None, id))
    }

    // A full page reads every bucket it reached but its last to the end; the last goes on
    // alone from where the page stopped, until a short page ends it.
    #[test]
    fn a_full_page_leaves_its_last_bucket_to_read_on_from_its_last_row() {
        let (a, b, c) = (
            "bucket_1_1_20260101",
            "bucket_1_2_20260101",
            "bucket_1_3_20260101",
        );
        let mut pending = Pending {
            buckets: vec![a, b, c],
            cut: None,
        };
        let seen: HashSet<String> = [a, b].map(str::to_string).into();
        pending.after_page(true, &seen, cut(b, 40)).expect("page");
        assert_eq!(
            pending.buckets,
            [c],
            "a and b are read to their end or go on alone"
        );
        assert_eq!(pending.cut, cut(b, 40));
        pending
            .after_page(true, &HashSet::from([b.to_string()]), cut(b, 90))
            .expect("page");
        assert_eq!(pending.cut, cut(b, 90), "b still fills pages");
        pending
            .after_page(false, &HashSet::new(), None)
            .expect("page");
        assert_eq!(
            (pending.cut.clone(), pending.buckets.clone()),
            (None, vec![c])
        );
        pending
            .after_page(false, &HashSet::new(), None)
            .expect("page");
        assert!(
            pending.done(),
            "a short page over the rest reads them to their end"
        );
    }

    // Rows naming no bucket asked for would make the next page start over: an error, not a
    // loop.
    #[test]
    fn a_full_page_of_buckets_not_asked_for_is_an_error() {
        let mut pending = Pending {
            buckets: vec!["bucket_1_1_20260101"],
            cut: None,
        };
        let seen = HashSet::from(["bucket_9_9_20260101".to_string()]);
        assert!(pending
            .after_page(true, &seen, cut("bucket_9_9_20260101", 1))
            .is_err());
    }
}
