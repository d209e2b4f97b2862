//! What the leader keeps in memory between rounds: its cursor, the rounds in flight and
//! the gaps (ids missing below rows already seen), and where they let the mark go.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

/// InnoDB refreshes `INNODB_TRX` at most every 100 ms: a reading made this long after a gap
/// was seen reflects the server after that moment, so it lists every transaction that could
/// still own the gap.
pub(super) const TRX_READING_DELAY: Duration = Duration::from_millis(500);

/// What the open transactions say this round.
pub(super) enum Reading {
    /// Not asked: no gap is old enough to be judged.
    NotNow,
    /// The ids of the transactions open on the server.
    Open(HashSet<u64>),
    /// `INNODB_TRX` refused: gaps close by `gap_timeout`.
    Refused,
}

/// Open gaps re-read per round, lowest first (they hold the mark back).
pub(super) const GAPS_PER_READ: usize = 64;

/// Ids missing below rows already seen: not committed yet, rolled back, or never written.
#[derive(Debug, Clone)]
pub(super) struct Gap {
    /// Last missing id of the range (the map key is the first).
    pub(super) hi: u64,
    pub(super) seen: Instant,
    /// The transactions open when the gap was first judged (a reading at least
    /// `TRX_READING_DELAY` after it was seen), less those that have ended since. Any
    /// transaction that allocated an id of the gap had started before the gap was seen, so
    /// it is in this set until it ends; once the set is empty, one last read finds whatever
    /// it committed and the rest never existed.
    pub(super) owners: Option<HashSet<u64>>,
}

/// What the leader keeps in memory. Everything at or below `cursor` is published, in flight,
/// RETRY, or an open gap; the mark passes only what is none of the last two.
pub(super) struct Leadership {
    pub(super) epoch: u64,
    /// The mark as last written.
    pub(super) hwm: u64,
    pub(super) cursor: u64,
    pub(super) gaps: BTreeMap<u64, Gap>,
    /// The lowest published id of each round started and not finished, in start order.
    pub(super) in_flight: VecDeque<u64>,
    /// When the last write that renewed the lease was sent (local clock, only compared with
    /// itself).
    pub(super) renewed: Instant,
}

impl Leadership {
    /// The highest id below which nothing is left: no open gap, nothing in flight.
    pub(super) fn settled(&self) -> u64 {
        let mut mark = self.cursor;
        if let Some((lo, _)) = self.gaps.first_key_value() {
            mark = mark.min(lo - 1);
        }
        if let Some(lowest) = self.in_flight.iter().min() {
            mark = mark.min(lowest - 1);
        }
        mark.max(self.hwm)
    }

    /// Removes `id` from the open gaps (it was found), splitting its range.
    pub(super) fn found(&mut self, id: u64) {
        let Some((&lo, gap)) = self.gaps.range(..=id).next_back() else {
            return;
        };
        if gap.hi < id {
            return;
        }
        let gap = gap.clone();
        self.gaps.remove(&lo);
        if lo < id {
            self.gaps.insert(
                lo,
                Gap {
                    hi: id - 1,
                    ..gap.clone()
                },
            );
        }
        if id < gap.hi {
            self.gaps.insert(id + 1, gap);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leadership(cursor: u64, gaps: &[(u64, u64)], in_flight: &[u64]) -> Leadership {
        let seen = Instant::now();
        Leadership {
            epoch: 1,
            hwm: 0,
            cursor,
            gaps: gaps
                .iter()
                .map(|&(lo, hi)| {
                    (
                        lo,
                        Gap {
                            hi,
                            seen,
                            owners: None,
                        },
                    )
                })
                .collect(),
            in_flight: in_flight.iter().copied().collect(),
            renewed: seen,
        }
    }

    fn ranges(l: &Leadership) -> Vec<(u64, u64)> {
        l.gaps.iter().map(|(&lo, g)| (lo, g.hi)).collect()
    }

    #[test]
    fn the_mark_stops_below_the_lowest_gap_and_the_lowest_row_in_flight() {
        assert_eq!(leadership(100, &[], &[]).settled(), 100);
        assert_eq!(leadership(100, &[(40, 45)], &[]).settled(), 39);
        assert_eq!(leadership(100, &[(40, 45)], &[90, 30]).settled(), 29);
        // An empty round in flight holds nothing back.
        assert_eq!(leadership(100, &[], &[u64::MAX]).settled(), 100);
        // Never below the mark already written.
        let mut l = leadership(100, &[(40, 45)], &[]);
        l.hwm = 50;
        assert_eq!(l.settled(), 50);
    }

    #[test]
    fn a_row_found_in_a_gap_splits_it() {
        let mut l = leadership(100, &[(10, 20), (30, 30)], &[]);
        l.found(15);
        assert_eq!(ranges(&l), [(10, 14), (16, 20), (30, 30)]);
        l.found(10);
        l.found(20);
        assert_eq!(ranges(&l), [(11, 14), (16, 19), (30, 30)]);
        l.found(30);
        assert_eq!(ranges(&l), [(11, 14), (16, 19)]);
        // Outside every gap: nothing changes.
        l.found(25);
        l.found(5);
        assert_eq!(ranges(&l), [(11, 14), (16, 19)]);
    }
}
