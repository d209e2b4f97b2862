//! The reservations whose fences and op records a full check reads in Redis: those holding
//! units, a page at a time, and the suspects again by id.

use super::in_list;
use chrono::NaiveDateTime;
use sqlx::{MySql, MySqlPool, QueryBuilder};
use stocksvr_core::codes::{ReservationStatus, StoredCode};
use stocksvr_store::deadline::Deadline;
use stocksvr_store::one_off::{in_list_of, OneOff};

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

/// The statuses whose reservations keep a fence that decides a later step: RESERVED,
/// CREATED_RESERVED and CONFIRMED.
const GUARDED: [ReservationStatus; 3] = [
    ReservationStatus::Reserved,
    ReservationStatus::CreatedReserved,
    ReservationStatus::Confirmed,
];

/// The reservations a full check reads the fence and op record of: those holding units
/// (RESERVED, CREATED_RESERVED, CONFIRMED, not wholly refunded).
fn guarded_select<'q>() -> QueryBuilder<'q, MySql> {
    let mut q = QueryBuilder::<MySql>::new(
        "SELECT stock_bucket_id, id, status, quantity, refunded_quantity, created_at \
         FROM inventory_reservation WHERE status IN ",
    );
    in_list_of(&mut q, ReservationStatus::codes(&GUARDED));
    q.push(" AND quantity > refunded_quantity");
    q
}

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
    let mut q = guarded_select();
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
    let mut q = guarded_select();
    q.push(" AND stock_bucket_id = ")
        .push_bind(bucket)
        .push(" AND id IN ");
    in_list_of(&mut q, ids.iter().copied());
    q.push(" ORDER BY id");
    q.one_off_as().fetch_all(pool).deadline().await
}
