//! Plan: what the per-event statements would have done to a whole batch, worked out in
//! memory so [`crate::store`] can write each table with one statement per batch. Pure, so
//! the equivalence with the sequential semantics (one booking, which dedupes, then one
//! version-guarded snapshot write and one sync per event, in batch order) is unit-tested here
//! without a database.

use crate::decide::{ReservationSync, SnapshotRow};
use std::collections::{BTreeMap, HashMap, HashSet};

/// How an event's snapshot write ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotWrite {
    /// First event of the bucket: row inserted.
    Created,
    /// A newer redis_version: the row now holds this event's after-quantities.
    Advanced,
    /// Not newer than the stored version: nothing changed.
    Stale,
}

/// Which events of a batch book their operation (and so apply): `false` for an operation
/// the ledger already holds (`booked`, a redelivery) and for the second sighting of an
/// operation id within the batch, as the sequential `INSERT IGNORE` would have found the
/// first one's row.
pub fn claims<'a>(operation_ids: &[&'a str], booked: &HashSet<String>) -> Vec<bool> {
    let mut seen: HashSet<&'a str> = HashSet::with_capacity(operation_ids.len());
    operation_ids
        .iter()
        .map(|id| !booked.contains(*id) && seen.insert(*id))
        .collect()
}

/// The one row a bucket ends the batch with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FinalRow<'a> {
    /// The bucket's highest applied version: its quantities and version are the row's.
    pub row: &'a SnapshotRow,
    /// The deficit of the latest applied event that stated one. `None`: no applied event
    /// did, so a stored row keeps its deficit and a new one starts at 0, as each upsert
    /// would have left it.
    pub deficit: Option<i64>,
    /// No stored row before the batch: the row is inserted rather than updated.
    pub created: bool,
}

/// The snapshot side of a batch: one outcome per event (for the tally) and the rows to
/// write (only buckets that move, each once).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotPlan<'a> {
    pub outcomes: Vec<SnapshotWrite>,
    /// Sorted by bucket, so concurrent writers lock rows in one order.
    pub writes: Vec<FinalRow<'a>>,
}

impl SnapshotPlan<'_> {
    /// What the writes of [`Self::writes`] report under CLIENT_FOUND_ROWS when nothing
    /// changed the rows since they were read: 1 per row, inserted (a new bucket) or matched
    /// by the version-guarded UPDATE (an existing one, whose version the plan saw below).
    pub fn expected_rows_affected(&self) -> u64 {
        self.writes.len() as u64
    }
}

/// Replays the version-guarded snapshot write over `rows` (batch order) starting from `stored`
/// (bucket → stored redis_version): an event is stale when its version is not above both
/// the stored one and every version applied before it in the batch; the first applied
/// event of a bucket without a row creates it, the others advance it.
pub fn snapshots<'a>(stored: &HashMap<String, u64>, rows: &[&'a SnapshotRow]) -> SnapshotPlan<'a> {
    struct Bucket<'a> {
        current: Option<u64>,
        last: Option<&'a SnapshotRow>,
        deficit: Option<i64>,
        created: bool,
    }
    let mut buckets: BTreeMap<&'a str, Bucket<'a>> = BTreeMap::new();
    let mut outcomes = Vec::with_capacity(rows.len());
    for row in rows {
        let bucket = buckets
            .entry(row.stock_bucket_id.as_str())
            .or_insert_with(|| Bucket {
                current: stored.get(&row.stock_bucket_id).copied(),
                last: None,
                deficit: None,
                created: !stored.contains_key(&row.stock_bucket_id),
            });
        let outcome = match bucket.current {
            None => SnapshotWrite::Created,
            Some(current) if row.redis_version > current => SnapshotWrite::Advanced,
            Some(_) => SnapshotWrite::Stale,
        };
        if outcome != SnapshotWrite::Stale {
            bucket.current = Some(row.redis_version);
            bucket.last = Some(row);
            // A step without a deficit leaves the one an earlier event of the batch set.
            if row.deficit.is_some() {
                bucket.deficit = row.deficit;
            }
        }
        outcomes.push(outcome);
    }
    let writes = buckets
        .into_values()
        .filter_map(|b| {
            Some(FinalRow {
                row: b.last?,
                deficit: b.deficit,
                created: b.created,
            })
        })
        .collect();
    SnapshotPlan { outcomes, writes }
}

/// One sync per reservation at the highest version of the batch: GREATEST over the
/// events one by one ends at the same synced version, and the SYNCED test (synced ≥
/// expected) is monotonic in it, so one update per reservation is equivalent. Sorted by
/// reservation id, so concurrent writers lock rows in one order.
pub fn syncs(syncs: impl IntoIterator<Item = ReservationSync>) -> Vec<ReservationSync> {
    let mut highest: BTreeMap<u64, u64> = BTreeMap::new();
    for s in syncs {
        let v = highest.entry(s.reservation_id).or_insert(s.redis_version);
        *v = (*v).max(s.redis_version);
    }
    highest
        .into_iter()
        .map(|(reservation_id, redis_version)| ReservationSync {
            reservation_id,
            redis_version,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::NaiveDate;
    use stocksvr_core::events::StockAfter;
    use SnapshotWrite::{Advanced, Created, Stale};

    fn row(bucket: &str, version: u64, available: i64, deficit: Option<i64>) -> SnapshotRow {
        SnapshotRow {
            stock_bucket_id: bucket.to_owned(),
            merchant_id: 1,
            dish_id: 2,
            stock_date: NaiveDate::from_ymd_opt(2026, 7, 26).expect("date"),
            after: StockAfter {
                total: 100,
                available,
                reserved: 0,
                sold: 0,
            },
            deficit,
            redis_version: version,
        }
    }

    #[test]
    fn an_operation_is_claimed_once_unless_already_booked() {
        let booked = HashSet::from(["b".to_owned()]);
        assert_eq!(
            claims(&["a", "b", "a", "c", "c"], &booked),
            [true, false, false, true, false]
        );
        assert!(claims(&[], &booked).is_empty());
    }

    #[test]
    fn stale_means_not_above_the_stored_version_nor_any_earlier_applied_one() {
        let stored = HashMap::from([("a".to_owned(), 10)]);
        let rows = [
            row("a", 9, 1, None),  // below stored
            row("a", 10, 2, None), // equal to stored
            row("a", 12, 3, None), // advances
            row("b", 5, 4, None),  // creates
            row("a", 11, 5, None), // below the 12 applied just before
            row("b", 5, 6, None),  // equal to the version created in this batch
            row("b", 7, 7, None),  // advances the created row
            row("a", 12, 8, None), // equal again
        ];
        let refs: Vec<&SnapshotRow> = rows.iter().collect();
        let plan = snapshots(&stored, &refs);
        assert_eq!(
            plan.outcomes,
            [Stale, Stale, Advanced, Created, Stale, Stale, Advanced, Stale]
        );
        assert_eq!(
            plan.writes,
            [
                FinalRow {
                    row: &rows[2],
                    deficit: None,
                    created: false
                },
                FinalRow {
                    row: &rows[6],
                    deficit: None,
                    created: true
                },
            ]
        );
        assert_eq!(plan.expected_rows_affected(), 2);
    }

    #[test]
    fn a_bucket_whose_every_event_is_stale_is_not_written() {
        let stored = HashMap::from([("a".to_owned(), 10)]);
        let rows = [row("a", 3, 1, Some(4)), row("a", 10, 1, None)];
        let refs: Vec<&SnapshotRow> = rows.iter().collect();
        let plan = snapshots(&stored, &refs);
        assert_eq!(plan.outcomes, [Stale, Stale]);
        assert!(plan.writes.is_empty());
        assert_eq!(plan.expected_rows_affected(), 0);
    }

    #[test]
    fn the_deficit_is_the_latest_applied_one_stated() {
        let stored = HashMap::from([("a".to_owned(), 10)]);
        let rows = [
            row("a", 11, 1, Some(9)), // adjust: states 9
            row("a", 12, 2, None),    // a step without one keeps 9
            row("a", 8, 3, Some(0)),  // stale: its 0 never applied
            row("a", 13, 4, None),
        ];
        let refs: Vec<&SnapshotRow> = rows.iter().collect();
        let plan = snapshots(&stored, &refs);
        assert_eq!(plan.outcomes, [Advanced, Advanced, Stale, Advanced]);
        assert_eq!(
            plan.writes,
            [FinalRow {
                row: &rows[3],
                deficit: Some(9),
                created: false
            }]
        );

        // A later stated deficit replaces an earlier one, 0 included.
        let rows = [row("b", 1, 1, Some(9)), row("b", 2, 1, Some(0))];
        let refs: Vec<&SnapshotRow> = rows.iter().collect();
        let plan = snapshots(&HashMap::new(), &refs);
        assert_eq!(plan.writes[0].deficit, Some(0));
        assert!(plan.writes[0].created);
    }

    #[test]
    fn one_sync_per_reservation_at_its_highest_version() {
        let s = |reservation_id, redis_version| ReservationSync {
            reservation_id,
            redis_version,
        };
        assert_eq!(
            syncs([s(7, 392), s(3, 5), s(7, 395), s(7, 390), s(3, 0)]),
            [s(3, 5), s(7, 395)]
        );
    }
}
