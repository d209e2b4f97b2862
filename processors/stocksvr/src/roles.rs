//! Which parts of stocksvr one process runs. `stocksvr all` runs every role; each
//! single-role command runs one, and instances of a role share its work (consumer groups,
//! relay claims, WAL leases, the time wheel).

/// The roles a process runs (the HTTP listener with `/metrics`, `/healthz`, `/readyz` and
/// the admin endpoints always runs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Roles {
    /// The Try API and the order-lifecycle processor (both need the reservation service).
    pub reservations: bool,
    /// The outbox relay.
    pub relay: bool,
    /// The stock projector.
    pub projector: bool,
    /// The dead-letter processor.
    pub dead_letter: bool,
    /// Scheduled confirms: the time wheel poller, the due scan and the schedule processor
    /// (they need the reservation service too).
    pub schedule: bool,
    /// Consumer lag measured at the broker for every group of this deployment.
    pub lag_exporter: bool,
    /// The reconciler: Redis against MySQL per bucket (shards leased among instances),
    /// repairs and rebuilds when configured to, and the inbox retention.
    pub reconciler: bool,
}

impl Roles {
    pub const ALL: Roles = Roles {
        reservations: true,
        relay: true,
        projector: true,
        dead_letter: true,
        schedule: true,
        lag_exporter: true,
        reconciler: true,
    };
    pub const NONE: Roles = Roles {
        reservations: false,
        relay: false,
        projector: false,
        dead_letter: false,
        schedule: false,
        lag_exporter: false,
        reconciler: false,
    };

    /// Whether the reservation service (Redis connection, worker id) is needed.
    pub fn needs_service(&self) -> bool {
        self.reservations || self.schedule || self.reconciler
    }
}
