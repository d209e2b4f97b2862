//! The reconciler's reservation and ledger views read in pages (`bucket_views::reservation_views`,
//! `bucket_views::ledger_views`): whatever the page size, every bucket's sums are those of one
//! statement over all its rows.

use chrono::{TimeDelta, Utc};
use sqlx::MySqlPool;
use std::collections::HashMap;
use stocksvr_store::bucket_views::{ledger_views, reservation_views, LedgerView, ReservationView};

/// One reservation row of `bucket` in `status`, holding `quantity - refunded`.
async fn reservation(
    pool: &MySqlPool,
    id: u64,
    bucket: &str,
    status: i8,
    quantity: u32,
    refunded: u32,
) {
    let now = Utc::now().naive_utc();
    sqlx::query(
        "INSERT INTO inventory_reservation (id, order_id, order_item_id, merchant_id, dish_id, \
         stock_bucket_id, stock_date, quantity, refunded_quantity, order_type, expire_at, status, \
         current_operation_id, next_retry_at, sync_status, expected_redis_version, created_at, \
         updated_at) \
         VALUES (?, ?, ?, 1, 1, ?, '2026-01-01', ?, ?, 1, ?, ?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(id)
    .bind(id)
    .bind(id)
    .bind(bucket)
    .bind(quantity)
    .bind(refunded)
    .bind(now + TimeDelta::minutes(30))
    .bind(status)
    .bind(format!("op_{id}"))
    .bind(now)
    // Every third row waits for its projection.
    .bind(if id.is_multiple_of(3) { 10i8 } else { 20i8 })
    .bind(id)
    .bind(now)
    .bind(now)
    .execute(pool)
    .await
    .expect("reservation row");
}

async fn views(
    pool: &MySqlPool,
    buckets: &[String],
    page: u32,
) -> HashMap<String, ReservationView> {
    let mut out = HashMap::new();
    reservation_views(pool, buckets, page, &mut out)
        .await
        .expect("reservation views");
    out
}

#[tokio::test]
async fn a_view_read_in_pages_has_the_sums_of_one_statement_over_every_row() {
    let db = stocksvr_test_support::TestDb::migrated().await;
    let pool = &db.pool;
    // Sizes around the pages below: a big bucket cut by many pages, one that ends exactly at
    // a page's end, small ones on either side of the big one in index order, one with no rows.
    let sizes = [
        ("b_a", 2),
        ("b_big", 23),
        ("b_c", 5),
        ("b_d", 1),
        ("b_e", 7),
    ];
    let statuses = [20i8, 25, 40, 10, 30, 50, 80, 60, 70];
    let mut id = 1_000u64;
    let mut expected: HashMap<String, ReservationView> = HashMap::new();
    for (bucket, n) in sizes {
        for k in 0..n {
            id += 1;
            let status = statuses[(id as usize + k) % statuses.len()];
            let (quantity, refunded) = (1 + (id % 4) as u32, (id % 2) as u32);
            reservation(pool, id, bucket, status, quantity, refunded).await;
            let v = expected.entry(bucket.to_string()).or_default();
            let held = i64::from(quantity - refunded);
            match status {
                20 | 25 => v.reserved += held,
                40 => v.sold += held,
                10 | 30 | 50 | 80 => v.in_flight += 1,
                _ => {}
            }
            if id.is_multiple_of(3) {
                v.unprojected += 1;
            }
        }
    }
    let buckets: Vec<String> = ["b_e", "b_empty", "b_big", "b_a", "b_d", "b_c"]
        .iter()
        .map(|b| b.to_string())
        .collect();
    // One page holds everything: the single statement of before.
    let whole = views(pool, &buckets, 1_000).await;
    assert_eq!(whole, expected, "one page");
    for page in [1, 2, 3, 5, 7, 8, 22, 23, 24] {
        assert_eq!(
            views(pool, &buckets, page).await,
            expected,
            "pages of {page} rows"
        );
    }
    // A bucket that is not asked for is not read, however the pages fall.
    let some = vec!["b_big".to_string(), "b_d".to_string()];
    let want: HashMap<String, ReservationView> = expected
        .iter()
        .filter(|(b, _)| some.contains(b))
        .map(|(b, v)| (b.clone(), *v))
        .collect();
    for page in [1, 4, 100] {
        assert_eq!(
            views(pool, &some, page).await,
            want,
            "two buckets, pages of {page}"
        );
    }
}

/// One ledger row of `bucket` written at `at` (seconds after a fixed time).
async fn ledger(
    pool: &MySqlPool,
    n: u64,
    bucket: &str,
    at: i64,
    deltas: [i64; 4],
    version: Option<u64>,
) {
    let base = chrono::NaiveDate::from_ymd_opt(2026, 1, 1)
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .expect("a date");
    sqlx::query(
        "INSERT INTO inventory_ledger (operation_id, stock_bucket_id, merchant_id, dish_id, \
         action, quantity, total_delta, available_delta, reserved_delta, sold_delta, \
         redis_version, created_at) VALUES (?, ?, 1, 1, 2, 1, ?, ?, ?, ?, ?, ?)",
    )
    .bind(format!("op_{n}"))
    .bind(bucket)
    .bind(deltas[0])
    .bind(deltas[1])
    .bind(deltas[2])
    .bind(deltas[3])
    .bind(version)
    .bind(base + TimeDelta::seconds(at))
    .execute(pool)
    .await
    .expect("ledger row");
}

async fn ledgers(pool: &MySqlPool, buckets: &[String], page: u32) -> HashMap<String, LedgerView> {
    let mut out = HashMap::new();
    ledger_views(pool, buckets, page, &mut out)
        .await
        .expect("ledger views");
    out
}

#[tokio::test]
async fn a_ledger_view_read_in_pages_has_the_sums_of_one_statement_over_every_row() {
    let db = stocksvr_test_support::TestDb::migrated().await;
    let pool = &db.pool;
    let sizes = [("b_a", 3), ("b_big", 29), ("b_c", 4), ("b_e", 1)];
    let mut expected: HashMap<String, LedgerView> = HashMap::new();
    let mut n = 0u64;
    for (bucket, rows) in sizes {
        for k in 0..rows {
            n += 1;
            // Few distinct times, out of id order: a page often ends between rows of the
            // same time, and the id alone would not say where the next one starts.
            let at = ((k * 7) % 5) as i64;
            let deltas = [
                (n % 3) as i64,
                -((n % 5) as i64),
                (n % 4) as i64,
                (n % 2) as i64,
            ];
            let version = (!n.is_multiple_of(6)).then_some(n * 10);
            ledger(pool, n, bucket, at, deltas, version).await;
            let v = expected.entry(bucket.to_string()).or_default();
            v.total += deltas[0];
            v.available += deltas[1];
            v.reserved += deltas[2];
            v.sold += deltas[3];
            v.rows += 1;
            v.max_version = v.max_version.max(version.unwrap_or(0));
        }
    }
    let buckets: Vec<String> = ["b_e", "b_empty", "b_big", "b_a", "b_c"]
        .iter()
        .map(|b| b.to_string())
        .collect();
    assert_eq!(ledgers(pool, &buckets, 1_000).await, expected, "one page");
    for page in [1, 2, 3, 4, 6, 28, 29, 30] {
        assert_eq!(
            ledgers(pool, &buckets, page).await,
            expected,
            "pages of {page} rows"
        );
    }
}

#[tokio::test]
async fn buckets_asked_for_in_another_case_are_read_once() {
    let db = stocksvr_test_support::TestDb::migrated().await;
    let pool = &db.pool;
    for id in 1..=5u64 {
        reservation(pool, id, "b_one", 20, 2, 0).await;
        reservation(pool, 100 + id, "b_two", 20, 1, 0).await;
    }
    // The collation matches "B_ONE" to the rows of "b_one"; pages of 3 end inside both.
    let asked = vec!["B_ONE".to_string(), "B_TWO".to_string()];
    let got = views(pool, &asked, 3).await;
    assert_eq!(got.get("b_one").map(|v| v.reserved), Some(10), "{got:?}");
    assert_eq!(got.get("b_two").map(|v| v.reserved), Some(5), "{got:?}");
}
