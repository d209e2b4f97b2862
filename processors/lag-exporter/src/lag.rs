//! The arithmetic of lag, without I/O: where a group resumes, how many records and how many
//! seconds it is behind, and which record timestamps a round still has to fetch.

use std::collections::{BTreeMap, BTreeSet};

/// One partition of one consumer group, as one round saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct PartitionLag {
    pub group: String,
    pub topic: String,
    pub partition: i32,
    /// The committed offset; `None` when the group never committed on this partition.
    pub committed: Option<i64>,
    /// Low watermark: the first offset still stored.
    pub low_watermark: i64,
    /// High watermark: the offset the next record gets.
    pub high_watermark: i64,
    /// Records the group has yet to read (0 when caught up).
    pub lag: i64,
    /// Seconds since the first record the group has yet to read was written; 0 when caught
    /// up; `None` when that record could not be read in this round.
    pub lag_seconds: Option<f64>,
}

/// One consumer group, as the broker lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupSummary {
    pub group: String,
    /// The broker's group state (`Stable`, `Empty`, `PreparingRebalance`, ...).
    pub state: String,
    pub members: usize,
}

/// What one round read.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Scrape {
    pub groups: Vec<GroupSummary>,
    /// Sorted by group, topic and partition.
    pub partitions: Vec<PartitionLag>,
    /// Things that went wrong without stopping the round (a group whose offsets could not
    /// be read, a record that did not arrive in time). A round with any is counted `error`.
    pub problems: Vec<String>,
    /// Groups whose offsets or watermarks could not be read this round: their series keep
    /// their last values instead of being taken for gone.
    pub unread_groups: BTreeSet<String>,
}

impl Scrape {
    pub fn partition(&self, group: &str, topic: &str, partition: i32) -> Option<&PartitionLag> {
        self.partitions
            .iter()
            .find(|p| p.group == group && p.topic == topic && p.partition == partition)
    }

    pub fn group(&self, group: &str) -> Option<&GroupSummary> {
        self.groups.iter().find(|g| g.group == group)
    }
}

/// Where the group resumes reading: its committed offset, or, without one, the low watermark
/// (stocksvr's consumers start from the earliest record, `auto.offset.reset=earliest`). An
/// offset below the low watermark (records deleted by retention) resumes there too.
pub fn position(committed: Option<i64>, low: i64) -> i64 {
    committed.map_or(low, |c| c.max(low))
}

/// Records behind: never negative (a commit can run ahead of a stale watermark read).
pub fn records_behind(position: i64, high: i64) -> i64 {
    (high - position).max(0)
}

/// Seconds between `now_ms` and the timestamp of the first unconsumed record; a clock skew
/// that puts the record in the future counts as 0.
pub fn seconds_behind(now_ms: i64, record_ms: i64) -> f64 {
    (now_ms - record_ms).max(0) as f64 / 1000.0
}

/// A record position: topic, partition, offset.
pub type RecordAt = (String, i32, i64);

/// Timestamps of records already read, by position. A record's timestamp never changes, so
/// while a group's committed offset stays put, its lag in seconds needs no new read; each
/// round keeps only what it used, so the cache holds at most one entry per group and
/// partition.
#[derive(Debug, Default)]
pub struct TimestampCache {
    entries: BTreeMap<RecordAt, i64>,
}

impl TimestampCache {
    /// The positions of `wanted` whose timestamp is not cached.
    pub fn missing(&self, wanted: &BTreeSet<RecordAt>) -> Vec<RecordAt> {
        wanted
            .iter()
            .filter(|at| !self.entries.contains_key(*at))
            .cloned()
            .collect()
    }

    pub fn insert(&mut self, at: RecordAt, timestamp_ms: i64) {
        self.entries.insert(at, timestamp_ms);
    }

    pub fn get(&self, at: &RecordAt) -> Option<i64> {
        self.entries.get(at).copied()
    }

    /// Drops every entry not in `used`.
    pub fn retain(&mut self, used: &BTreeSet<RecordAt>) {
        self.entries.retain(|at, _| used.contains(at));
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_commit_the_group_resumes_at_the_low_watermark() {
        assert_eq!(position(None, 5), 5);
        assert_eq!(position(Some(9), 5), 9);
        // Retention deleted what the group had not read: it resumes at the first record kept.
        assert_eq!(position(Some(2), 5), 5);
    }

    #[test]
    fn lag_is_never_negative() {
        assert_eq!(records_behind(4, 10), 6);
        assert_eq!(records_behind(10, 10), 0);
        assert_eq!(records_behind(11, 10), 0);
        assert_eq!(seconds_behind(10_000, 4_000), 6.0);
        assert_eq!(seconds_behind(10_000, 12_000), 0.0);
    }

    #[test]
    fn the_cache_asks_only_for_new_positions_and_forgets_unused_ones() {
        let at = |o| ("t".to_string(), 0, o);
        let mut cache = TimestampCache::default();
        let round1: BTreeSet<_> = [at(4), at(7)].into();
        assert_eq!(cache.missing(&round1), vec![at(4), at(7)]);
        cache.insert(at(4), 1_000);
        cache.insert(at(7), 2_000);
        assert!(cache.missing(&round1).is_empty());
        // The group at 4 moved on to 9; 7 is unchanged.
        let round2: BTreeSet<_> = [at(7), at(9)].into();
        assert_eq!(cache.missing(&round2), vec![at(9)]);
        cache.retain(&round2);
        assert_eq!(cache.get(&at(4)), None);
        assert_eq!(cache.get(&at(7)), Some(2_000));
        assert_eq!(cache.len(), 1);
    }
}
