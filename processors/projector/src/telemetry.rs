//! The projector's own metrics, declared in one place. The shared loop already counts
//! consumed, applied (by outcome) and dead-lettered records; these say what the projection
//! did with them. Counted only after the batch committed, so a retried batch is not
//! counted twice.

use stocksvr_core::events::EventKind;

/// Metric names: stable, so dashboards and alerts do not break.
pub mod names {
    /// Events newly applied (inbox claimed), by `event_type`.
    pub const EVENTS_PROJECTED: &str = "stocksvr_projector_events_projected_total";
    /// Events this consumer group had already applied (inbox hit).
    pub const DUPLICATES: &str = "stocksvr_projector_duplicates_total";
    /// Events whose redis_version was not newer than the snapshot's: ledger booked,
    /// snapshot left at the newer state.
    pub const STALE: &str = "stocksvr_projector_stale_total";
    /// New events whose operation_id was already in the ledger (re-published operation).
    pub const LEDGER_ALREADY_BOOKED: &str = "stocksvr_projector_ledger_already_booked_total";
    /// Records per committed batch.
    pub const BATCH_SIZE: &str = "stocksvr_projector_batch_size";
}

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
            metrics::counter!(names::EVENTS_PROJECTED, "event_type" => kind.name()).increment(1);
        }
        metrics::counter!(names::DUPLICATES).increment(self.duplicates);
        metrics::counter!(names::STALE).increment(self.stale);
        metrics::counter!(names::LEDGER_ALREADY_BOOKED).increment(self.already_booked);
        metrics::histogram!(names::BATCH_SIZE).record(batch_size as f64);
    }
}
