//! The projector's own metrics, declared in one place. The shared loop already counts
//! consumed, applied (by outcome) and dead-lettered records; these say what the projection
//! did with them. Counted only after the batch committed, so a retried batch is not
//! counted twice, and the projection delay of an event ends when its booking is durable.

use chrono::{DateTime, Utc};
use std::time::Duration;
use stocksvr_core::events::EventKind;
use stocksvr_telemetry::names;

/// What one batch did, emitted once it is durable.
#[derive(Debug, Default)]
pub struct Tally {
    projected: Vec<(EventKind, Option<DateTime<Utc>>)>,
    duplicates: u64,
    stale: u64,
}

impl Tally {
    /// An event booked for the first time (a duplicate is not: its delay was recorded when
    /// it was booked).
    pub fn projected(&mut self, kind: EventKind, occurred_at: Option<DateTime<Utc>>) {
        self.projected.push((kind, occurred_at));
    }
    /// An event whose operation the ledger already held: a redelivery, nothing applied.
    pub fn duplicate(&mut self) {
        self.duplicates += 1;
    }
    pub fn stale(&mut self) {
        self.stale += 1;
    }

    /// Call right after the batch committed: `committed_at` ends every event's delay.
    pub fn emit(self, batch_size: usize, committed_at: DateTime<Utc>) {
        for (kind, occurred_at) in self.projected {
            metrics::counter!(names::PROJECTOR_EVENTS_PROJECTED, "event" => kind.name())
                .increment(1);
            if let Some(at) = occurred_at {
                metrics::histogram!(names::PROJECTION_DELAY_SECONDS)
                    .record(projection_delay(at, committed_at).as_secs_f64());
            }
        }
        metrics::counter!(names::PROJECTOR_DUPLICATES).increment(self.duplicates);
        metrics::counter!(names::PROJECTOR_STALE).increment(self.stale);
        metrics::histogram!(names::PROJECTOR_BATCH_SIZE).record(batch_size as f64);
    }
}

/// From `occurred_at` (the producer's clock) to the commit (this projector's); zero when the
/// producer's clock ran ahead.
pub fn projection_delay(occurred_at: DateTime<Utc>, committed_at: DateTime<Utc>) -> Duration {
    (committed_at - occurred_at)
        .to_std()
        .unwrap_or(Duration::ZERO)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::occurred_at;

    #[test]
    fn the_delay_runs_from_occurred_at_in_any_offset_to_the_commit() {
        let committed = occurred_at("2026-07-26T10:00:01.500Z").expect("time");
        let at = occurred_at("2026-07-26T18:00:00.000+08:00").expect("offset understood");
        assert_eq!(projection_delay(at, committed), Duration::from_millis(1500));
        assert_eq!(
            projection_delay(committed, at),
            Duration::ZERO,
            "clock ahead"
        );
        assert_eq!(occurred_at("yesterday"), None);
    }

    #[test]
    fn one_sample_per_event_booked_and_none_without_a_time() {
        let capture = stocksvr_telemetry::testing::Capture::default();
        let committed = occurred_at("2026-07-26T10:00:02Z").expect("time");
        let mut tally = Tally::default();
        tally.projected(
            EventKind::InventoryRedisReserved,
            occurred_at("2026-07-26T10:00:00Z"),
        );
        tally.projected(EventKind::InventoryRedisConfirmed, None);
        tally.duplicate();
        metrics::with_local_recorder(&capture, || tally.emit(3, committed));
        assert_eq!(
            capture.histogram(names::PROJECTION_DELAY_SECONDS, &[]),
            vec![2.0]
        );
        assert_eq!(capture.counter(names::PROJECTOR_DUPLICATES, &[]), Some(1));
    }
}
