//! The verdict on one bucket from its views, decided without I/O (docs/reconciliation.md,
//! "What a bucket must hold"): what MySQL expects (the baseline's total, the reservation table's
//! reserved and sold), what the ledger sums to, what Redis holds and what the snapshot says,
//! and whether anything in flight means MySQL may simply lag Redis.

use serde::Serialize;
use stocksvr_store::bucket_views::{LedgerView, SnapshotView};
use stocksvr_store::lua::{StockNumbers, TargetNumbers};

/// A way Redis, the ledger or the snapshot can disagree with the reservation table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DifferenceKind {
    /// Redis has more available than MySQL allows: it would sell stock it does not have.
    Oversell,
    /// Redis has less available than MySQL allows: sellable stock is stuck.
    Undersell,
    /// Available agrees, but the total, reserved, sold or deficit do not.
    ReservedSoldMismatch,
    /// Redis is right and the projector's snapshot is not.
    SnapshotBehind,
    /// The ledger's sums differ from the reservation table: a booking is missing or extra.
    LedgerGap,
    /// A reservation that holds units has lost its fence (or its Try's op record) in Redis:
    /// a later Cancel would take it for an empty rollback and release nothing.
    RecordsMissing,
    /// Redis' version is behind the one the snapshot booked: Redis lost acknowledged writes
    /// (a master failed over before its replica had them). Its repair moves the version past
    /// the snapshot's.
    VersionRegressed,
}

impl DifferenceKind {
    pub const ALL: [DifferenceKind; 7] = [
        DifferenceKind::Oversell,
        DifferenceKind::Undersell,
        DifferenceKind::ReservedSoldMismatch,
        DifferenceKind::SnapshotBehind,
        DifferenceKind::LedgerGap,
        DifferenceKind::RecordsMissing,
        DifferenceKind::VersionRegressed,
    ];

    pub const fn name(self) -> &'static str {
        match self {
            DifferenceKind::Oversell => "oversell",
            DifferenceKind::Undersell => "undersell",
            DifferenceKind::ReservedSoldMismatch => "reserved_sold_mismatch",
            DifferenceKind::SnapshotBehind => "snapshot_behind",
            DifferenceKind::LedgerGap => "ledger_gap",
            DifferenceKind::RecordsMissing => "records_missing",
            DifferenceKind::VersionRegressed => "version_regressed",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.name() == name)
    }
}

/// Work that means MySQL may lag Redis for a bucket: no difference is judged meanwhile.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum InFlight {
    /// Reservations in PREPARING, CONFIRMING, CANCELING or REFUNDING.
    Reservations(i64),
    /// Stock operations not finished (INIT, EXECUTING, RETRY).
    StockOperations(i64),
    /// Stock operations marked dead: an operator settles them first.
    DeadOperations(i64),
    /// Stock-change events not yet published.
    Outbox(i64),
    /// Published events the projector has not booked yet.
    Projection(i64),
}

impl std::fmt::Display for InFlight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            InFlight::Reservations(n) => write!(f, "{n} reservation step(s) in flight"),
            InFlight::StockOperations(n) => write!(f, "{n} stock operation(s) unfinished"),
            InFlight::DeadOperations(n) => write!(f, "{n} dead stock operation(s)"),
            InFlight::Outbox(n) => write!(f, "{n} event(s) not yet published"),
            InFlight::Projection(n) => write!(f, "{n} event(s) not yet booked"),
        }
    }
}

/// The ledger's sums as numbers (the deficit follows from them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct LedgerNumbers {
    pub total: i64,
    pub available: i64,
    pub reserved: i64,
    pub sold: i64,
    pub deficit: i64,
    pub rows: i64,
}

impl From<LedgerView> for LedgerNumbers {
    fn from(l: LedgerView) -> Self {
        Self {
            total: l.total,
            available: l.available,
            reserved: l.reserved,
            sold: l.sold,
            deficit: (l.available + l.reserved + l.sold - l.total).max(0),
            rows: l.rows,
        }
    }
}

/// Redis as the reconciler compares it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct RedisNumbers {
    pub total: i64,
    pub available: i64,
    pub reserved: i64,
    pub sold: i64,
    pub deficit: i64,
    pub version: u64,
}

impl From<&StockNumbers> for RedisNumbers {
    fn from(s: &StockNumbers) -> Self {
        Self {
            total: s.total,
            available: s.available,
            reserved: s.reserved,
            sold: s.sold,
            deficit: s.deficit,
            version: s.version,
        }
    }
}

/// Everything known about one bucket for one comparison.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BucketViews {
    pub bucket: String,
    /// `None`: the stock hash does not exist.
    pub redis: Option<RedisNumbers>,
    /// The reservation table's view with the baseline's total.
    pub expected: TargetNumbers,
    pub ledger: LedgerNumbers,
    pub snapshot: Option<SnapshotView>,
    pub in_flight: Vec<InFlight>,
    /// An init of the bucket succeeded once.
    pub built: bool,
    /// Marked lost (Trys refused until rebuilt and found clean).
    pub marked_lost: bool,
    /// Reservations holding units whose fence (or Try op record) Redis no longer has, or
    /// has with other numbers.
    pub records_missing: Vec<u64>,
    /// Work in flight showed before the reservation and ledger sums, which a scheduled pass
    /// then does not read (the verdict is "held back" either way): `expected` and `ledger`
    /// are not the bucket's numbers.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub sums_skipped: bool,
}

/// What the reconciler concludes about a bucket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "verdict", content = "detail")]
pub enum Verdict {
    /// The three views and the snapshot agree.
    Consistent,
    /// Never built (its first Try or the daily job will): nothing to compare.
    NotBuilt,
    /// Built, and the stock hash is gone: a rebuild is needed.
    Lost,
    /// MySQL may lag Redis; judged on a later pass.
    HeldBack(Vec<InFlight>),
    /// The views disagree with nothing in flight.
    Differs(Vec<DifferenceKind>),
}

fn same(
    a: &TargetNumbers,
    total: i64,
    available: i64,
    reserved: i64,
    sold: i64,
    deficit: i64,
) -> bool {
    (a.total, a.available, a.reserved, a.sold, a.deficit)
        == (total, available, reserved, sold, deficit)
}

/// Whether Redis' version went backwards: the snapshot booked a newer one. Versions only grow
/// in Redis (every script bumps it, a rebuild starts past what MySQL booked), so this happens
/// only when Redis lost writes it had acknowledged.
fn regressed(v: &BucketViews) -> bool {
    matches!((v.redis, v.snapshot), (Some(r), Some(s)) if s.redis_version > r.version)
}

/// The least version a repair of `v` must leave: one past the snapshot's when Redis went
/// backwards, else 0 (the usual +1).
pub fn version_floor(v: &BucketViews) -> u64 {
    match v.snapshot {
        Some(s) if regressed(v) => s.redis_version + 1,
        _ => 0,
    }
}

/// The verdict's name as the CLI, the repair outcome and the logs show it.
pub fn verdict_name(v: &Verdict) -> &'static str {
    match v {
        Verdict::Consistent => "consistent",
        Verdict::NotBuilt => "not_built",
        Verdict::Lost => "lost",
        Verdict::HeldBack(_) => "held_back",
        Verdict::Differs(_) => "differs",
    }
}

/// The verdict on `v`.
pub fn classify(v: &BucketViews) -> Verdict {
    let Some(redis) = v.redis else {
        return if v.built || v.marked_lost {
            Verdict::Lost
        } else {
            Verdict::NotBuilt
        };
    };
    if !v.in_flight.is_empty() {
        return Verdict::HeldBack(v.in_flight.clone());
    }
    let e = &v.expected;
    let mut kinds = Vec::new();
    let redis_right = same(
        e,
        redis.total,
        redis.available,
        redis.reserved,
        redis.sold,
        redis.deficit,
    );
    if redis.available > e.available {
        kinds.push(DifferenceKind::Oversell);
    } else if redis.available < e.available {
        kinds.push(DifferenceKind::Undersell);
    } else if !redis_right {
        kinds.push(DifferenceKind::ReservedSoldMismatch);
    }
    let l = &v.ledger;
    if !same(e, l.total, l.available, l.reserved, l.sold, l.deficit) {
        kinds.push(DifferenceKind::LedgerGap);
    }
    // Only a snapshot that differs from a correct Redis is behind: when Redis is wrong, its
    // repair moves the snapshot too.
    let snapshot_right = v.snapshot.is_some_and(|s| {
        (s.total, s.available, s.reserved, s.sold, s.deficit)
            == (
                redis.total,
                redis.available,
                redis.reserved,
                redis.sold,
                redis.deficit,
            )
    });
    if redis_right && !snapshot_right {
        kinds.push(DifferenceKind::SnapshotBehind);
    }
    if !v.records_missing.is_empty() {
        kinds.push(DifferenceKind::RecordsMissing);
    }
    if regressed(v) {
        kinds.push(DifferenceKind::VersionRegressed);
    }
    if kinds.is_empty() {
        Verdict::Consistent
    } else {
        Verdict::Differs(kinds)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn views() -> BucketViews {
        let expected = TargetNumbers::from_accepted(10, 3, 2);
        BucketViews {
            bucket: "bucket_1_2_20261201".into(),
            redis: Some(RedisNumbers {
                total: 10,
                available: 5,
                reserved: 3,
                sold: 2,
                deficit: 0,
                version: 9,
            }),
            expected,
            ledger: LedgerNumbers {
                total: 10,
                available: 5,
                reserved: 3,
                sold: 2,
                deficit: 0,
                rows: 6,
            },
            snapshot: Some(SnapshotView {
                total: 10,
                available: 5,
                reserved: 3,
                sold: 2,
                deficit: 0,
                redis_version: 9,
            }),
            in_flight: Vec::new(),
            built: true,
            marked_lost: false,
            records_missing: Vec::new(),
            sums_skipped: false,
        }
    }

    #[test]
    fn agreeing_views_are_consistent() {
        assert_eq!(classify(&views()), Verdict::Consistent);
        // A close bumps the version without an event: numbers decide, not versions.
        let mut v = views();
        if let Some(r) = v.redis.as_mut() {
            r.version = 10;
        }
        assert_eq!(classify(&v), Verdict::Consistent);
    }

    #[test]
    fn redis_off_in_either_direction_is_named() {
        let mut v = views();
        if let Some(r) = v.redis.as_mut() {
            r.available = 7; // a stray HINCRBY
        }
        assert_eq!(
            classify(&v),
            Verdict::Differs(vec![DifferenceKind::Oversell])
        );
        if let Some(r) = v.redis.as_mut() {
            r.available = 4;
        }
        assert_eq!(
            classify(&v),
            Verdict::Differs(vec![DifferenceKind::Undersell])
        );
        if let Some(r) = v.redis.as_mut() {
            r.available = 5;
            r.reserved = 2;
            r.sold = 3;
        }
        assert_eq!(
            classify(&v),
            Verdict::Differs(vec![DifferenceKind::ReservedSoldMismatch])
        );
    }

    #[test]
    fn a_missing_ledger_row_and_a_stale_snapshot_are_named() {
        let mut v = views();
        v.ledger.available += 2; // a Try's row (available -2, reserved +2) deleted
        v.ledger.reserved -= 2;
        assert_eq!(
            classify(&v),
            Verdict::Differs(vec![DifferenceKind::LedgerGap])
        );
        let mut v = views();
        if let Some(s) = v.snapshot.as_mut() {
            s.available = 6;
        }
        assert_eq!(
            classify(&v),
            Verdict::Differs(vec![DifferenceKind::SnapshotBehind])
        );
        v.snapshot = None;
        assert_eq!(
            classify(&v),
            Verdict::Differs(vec![DifferenceKind::SnapshotBehind])
        );
    }

    #[test]
    fn a_version_behind_the_snapshot_is_a_loss_and_its_repair_moves_past_it() {
        // A failover lost a Try Redis had acknowledged at version 9: the promoted replica is
        // at 8 with the unit still available; MySQL (reservation, ledger, snapshot) has it.
        let mut v = views();
        if let Some(r) = v.redis.as_mut() {
            r.version = 8;
            r.available = 6;
            r.reserved = 2;
        }
        v.records_missing = vec![7];
        assert_eq!(
            classify(&v),
            Verdict::Differs(vec![
                DifferenceKind::Oversell,
                DifferenceKind::RecordsMissing,
                DifferenceKind::VersionRegressed
            ])
        );
        assert_eq!(version_floor(&v), 10);
        // Numbers alone can agree while the version is behind (a lost Try then a Cancel's
        // empty rollback, say): still reported, so the repair moves the version on.
        let mut v = views();
        if let Some(r) = v.redis.as_mut() {
            r.version = 5;
        }
        assert_eq!(
            classify(&v),
            Verdict::Differs(vec![DifferenceKind::VersionRegressed])
        );
        assert_eq!(version_floor(&views()), 0, "not behind: no floor");
    }

    #[test]
    fn a_reservation_without_its_fence_is_named() {
        let mut v = views();
        v.records_missing = vec![7];
        assert_eq!(
            classify(&v),
            Verdict::Differs(vec![DifferenceKind::RecordsMissing])
        );
    }

    #[test]
    fn in_flight_work_holds_a_bucket_back_whatever_it_shows() {
        let mut v = views();
        if let Some(r) = v.redis.as_mut() {
            r.available = 3;
        }
        v.in_flight = vec![InFlight::Reservations(1)];
        assert_eq!(
            classify(&v),
            Verdict::HeldBack(vec![InFlight::Reservations(1)])
        );
    }

    #[test]
    fn a_deficit_is_part_of_the_numbers() {
        // Total lowered to 4 below 5 accepted: available 0, deficit 1.
        let mut v = views();
        v.expected = TargetNumbers::from_accepted(4, 3, 2);
        v.redis = Some(RedisNumbers {
            total: 4,
            available: 0,
            reserved: 3,
            sold: 2,
            deficit: 1,
            version: 10,
        });
        v.ledger = LedgerNumbers {
            total: 4,
            available: 0,
            reserved: 3,
            sold: 2,
            deficit: 1,
            rows: 7,
        };
        v.snapshot = Some(SnapshotView {
            total: 4,
            available: 0,
            reserved: 3,
            sold: 2,
            deficit: 1,
            redis_version: 10,
        });
        assert_eq!(classify(&v), Verdict::Consistent);
        if let Some(r) = v.redis.as_mut() {
            r.deficit = 0;
        }
        assert_eq!(
            classify(&v),
            Verdict::Differs(vec![DifferenceKind::ReservedSoldMismatch])
        );
    }

    #[test]
    fn a_missing_key_is_lost_only_when_the_bucket_was_built() {
        let mut v = views();
        v.redis = None;
        assert_eq!(classify(&v), Verdict::Lost);
        v.built = false;
        assert_eq!(classify(&v), Verdict::NotBuilt);
        v.marked_lost = true;
        assert_eq!(classify(&v), Verdict::Lost);
    }
}
