//! The projector's own metrics, declared in one place. The shared loop already counts
//! consumed, applied (by outcome) and dead-lettered records; these say what the projection
//! did with them. Counted only after the batch committed, so a retried batch is not
//! counted twice.

use stocksvr_core::events::EventKind;
use stocksvr_telemetry::names;

/// What one batch did, emitted once it is durable.
#[derive(Debug, Default)]
pub struct Tally {
    projected: Vec<EventKind>,
    duplicates: u64,
    stale: u64,
    already_booked: u64,
}

impl Tally {
    pub fn projected(&mut self, kind: EventKind) {
        self.projected.push(kind);
    }
    pub fn duplicate(&mut self) {
        self.duplicates += 1;
    }
    pub fn stale(&mut self) {
        self.stale += 1;
    }
    pub fn already_booked(&mut self) {
        self.already_booked += 1;
    }

    pub fn emit(self, batch_size: usize) {
        for kind in self.projected {
            metrics::counter!(names::PROJECTOR_EVENTS_PROJECTED, "event" => kind.name())
                .increment(1);
        }
        metrics::counter!(names::PROJECTOR_DUPLICATES).increment(self.duplicates);
        metrics::counter!(names::PROJECTOR_STALE).increment(self.stale);
        metrics::counter!(names::PROJECTOR_LEDGER_ALREADY_BOOKED).increment(self.already_booked);
        metrics::histogram!(names::PROJECTOR_BATCH_SIZE).record(batch_size as f64);
    }
}
