//! What MySQL says about a bucket, beside what Redis holds: the reservation table's sums, the
//! ledger's sums, the projector's snapshot and the work in flight that means MySQL may still
//! lag Redis. The reconciler compares them with Redis; a repair and a rebuild read them too
//! (the ledger's sums before, whether every event is booked, and the reservations whose
//! records they restore). Every read takes a chunk of buckets at once (`IN (...)` with bound
//! parameters), so a pass costs a few statements per chunk, not per bucket.

mod in_flight;
mod restore;
mod sums;

pub use restore::{completed_refunds, highest_known_version, rebuild_rows, rows_by_id, RebuildRow};
pub use sums::{ledger_views, reservation_views, VIEW_PAGE};

use crate::deadline::Deadline;
use crate::one_off::{in_list_of, OneOff};
use sqlx::{MySql, MySqlPool, QueryBuilder, Row};
use std::collections::{HashMap, HashSet};
use stocksvr_core::codes::{ReservationStatus, StoredCode};

/// The statuses whose units Redis holds in `reserved` (held = quantity - refunded).
const HOLDING: [ReservationStatus; 2] = [
    ReservationStatus::Reserved,
    ReservationStatus::CreatedReserved,
];
/// The status whose units Redis holds in `sold`.
const SOLD: ReservationStatus = ReservationStatus::Confirmed;
/// Statuses whose Redis step may have run while MySQL does not know yet.
const IN_FLIGHT: [ReservationStatus; 4] = [
    ReservationStatus::Preparing,
    ReservationStatus::Confirming,
    ReservationStatus::Canceling,
    ReservationStatus::Refunding,
];

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

/// The ledger's view of one bucket: the sums of its deltas (docs/reconciliation.md, "What a
/// bucket must hold").
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
    pub unsummed: HashSet<String>,
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

/// The status of a reservation row as read (a TINYINT); `None` for a code no version wrote.
fn reservation_status(code: i8) -> Option<ReservationStatus> {
    u8::try_from(code)
        .ok()
        .and_then(ReservationStatus::from_code)
}

fn in_list<'a>(q: &mut QueryBuilder<'a, MySql>, buckets: &'a [String]) {
    in_list_of(q, buckets.iter().map(String::as_str));
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
    in_flight::work_in_flight(pool, buckets, &mut views).await?;
    let candidates: Vec<String> = buckets
        .iter()
        .filter(|b| may_skip(b) && !views.busy(b))
        .cloned()
        .collect();
    if !candidates.is_empty() {
        reservations_in_flight(pool, &candidates, &mut views).await?;
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

/// The reservations in flight of `buckets` alone, through the index of the statuses in flight
/// (the sums, which would count them too, are what a bucket busy with them skips).
async fn reservations_in_flight(
    pool: &MySqlPool,
    buckets: &[String],
    views: &mut MysqlViews,
) -> Result<(), sqlx::Error> {
    let mut q = QueryBuilder::<MySql>::new(
        "SELECT stock_bucket_id, COUNT(*) AS n FROM inventory_reservation \
         FORCE INDEX (idx_state_retry) WHERE status IN ",
    );
    in_list_of(&mut q, ReservationStatus::codes(&IN_FLIGHT));
    q.push(" AND stock_bucket_id IN ");
    in_list(&mut q, buckets);
    q.push(" GROUP BY stock_bucket_id");
    for row in q.one_off().fetch_all(pool).deadline().await? {
        let bucket: String = row.try_get("stock_bucket_id")?;
        views.reservations.entry(bucket).or_default().in_flight = row.try_get("n")?;
    }
    Ok(())
}

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
