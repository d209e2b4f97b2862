//! The reconciler's configuration: the `[reconcile]` section as the binary reads it from the
//! file and the environment ([`ReconcileSettings`]), and the typed [`ReconcileConfig`] the
//! passes, the on-demand check and the repairs run with.

use chrono::TimeDelta;
use serde::{Deserialize, Serialize};
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct ReconcileConfig {
    /// Shards the buckets are spread over (by merchant and dish).
    pub shards: u32,
    /// How long an instance holds a shard it checks; renewed every third of it while the
    /// pass runs. 6 s: a killed instance's shard is free 6 s later and taken at another
    /// instance's next claim (`interval / shards`, 3.75 s by default). A pass that outlives
    /// its lease (a stalled process) goes on reading, and every repair it could start is
    /// checked against the bucket's version, so a second pass over the shard is redundant
    /// work, not a double repair. The lease is compared with the instances' clocks: keep
    /// them in sync (NTP) well within it.
    pub lease: TimeDelta,
    /// A shard is checked at most once per interval.
    pub interval: Duration,
    /// A bucket unchanged since its last clean check is checked in full (fences, op
    /// records, MySQL sums) only this often; zero: at every pass.
    pub full_check: Duration,
    /// Buckets read per round trip.
    pub chunk: u32,
    /// Held reservations whose fences and op records are read at once (bounds the memory
    /// a full check of a hot bucket takes).
    pub guard_page: u32,
    /// At most this many held reservations' fences and op records are read per second
    /// (0: no limit). Unpaced, the full check of a hot bucket read 30,000 a second and
    /// took Redis and the machine from the Trys and Confirms of that second; paced, it
    /// takes longer (held reservations / this rate) and the load stays level.
    pub guard_reads_per_sec: u32,
    /// Scheduled passes repair confirmed differences and rebuild lost buckets themselves;
    /// otherwise they detect and alert only.
    pub auto_repair: bool,
    /// Repairs and rebuilds one scheduled pass may start.
    pub max_repairs_per_pass: u32,
    /// The on-demand check's wait between its two passes; a scheduled pass that suspected
    /// a difference (or failed) makes its shard due again this long after it.
    pub settle: Duration,
    /// Attempts of one repair that keeps losing its version check.
    pub repair_attempts: u32,
    /// How long a rebuild waits for a clean pass before it reopens the bucket.
    pub reopen_timeout: Duration,
    /// Inbox rows older than this are purged (0: kept for ever).
    pub inbox_retention: TimeDelta,
}

impl Default for ReconcileConfig {
    fn default() -> Self {
        Self {
            shards: 16,
            lease: TimeDelta::seconds(6),
            interval: Duration::from_secs(60),
            full_check: Duration::from_secs(900),
            chunk: 200,
            guard_page: 5_000,
            guard_reads_per_sec: 10_000,
            auto_repair: false,
            max_repairs_per_pass: 10,
            settle: Duration::from_secs(2),
            repair_attempts: 5,
            reopen_timeout: Duration::from_secs(120),
            inbox_retention: TimeDelta::days(7),
        }
    }
}

/// The reconciler (a role of `stocksvr all`, and `stocksvr reconcile` on demand) and the
/// retention of the consumer inbox.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReconcileSettings {
    /// Shards the buckets are split into (by merchant and dish); instances lease them.
    pub shards: u32,
    /// Seconds between two checks of one shard (so of one bucket).
    pub interval_secs: u64,
    /// Seconds between two full checks of a bucket nothing touched: its every held
    /// reservation's fence and op record in Redis, and its sums in MySQL. In between, a
    /// scheduled pass skips a bucket whose Redis hash, snapshot version and baseline are
    /// as at its last clean check (0: every pass checks every bucket in full).
    pub full_check_secs: u64,
    /// Seconds an instance holds the shard it checks (renewed every third of it); a dead
    /// instance's shard is free this long after its last renewal.
    pub lease_secs: u64,
    /// Buckets read per round trip to MySQL and Redis.
    pub chunk: u32,
    /// Scheduled passes repair confirmed differences and rebuild lost buckets themselves.
    /// Off by default: they detect, log and alert, and an operator runs
    /// `stocksvr reconcile --repair` or `stocksvr bucket rebuild`.
    pub auto_repair: bool,
    /// Repairs and rebuilds one scheduled pass over a shard may start (rate limit).
    pub max_repairs_per_pass: u32,
    /// Milliseconds between the two passes of `stocksvr reconcile`.
    pub settle_ms: u64,
    /// Attempts of one repair that keeps finding the bucket's version moved.
    pub repair_attempts: u32,
    /// Seconds a rebuild waits for a clean pass before leaving the bucket refused (the
    /// scheduled reconciler reopens it later).
    pub reopen_timeout_secs: u64,
    /// Days the consumer inbox remembers a handled event (0 keeps it for ever). A replay
    /// from further back than this is judged against the current state again.
    pub inbox_retention_days: u64,
    /// Held reservations whose fence and op record a full check reads per second (0: no
    /// limit). A full check of a bucket then takes its held reservations / this rate.
    pub guard_reads_per_sec: u32,
}

impl Default for ReconcileSettings {
    fn default() -> Self {
        let d = ReconcileConfig::default();
        Self {
            shards: d.shards,
            interval_secs: d.interval.as_secs(),
            full_check_secs: d.full_check.as_secs(),
            lease_secs: d.lease.num_seconds() as u64,
            chunk: d.chunk,
            auto_repair: d.auto_repair,
            max_repairs_per_pass: d.max_repairs_per_pass,
            settle_ms: d.settle.as_millis() as u64,
            repair_attempts: d.repair_attempts,
            reopen_timeout_secs: d.reopen_timeout.as_secs(),
            inbox_retention_days: d.inbox_retention.num_days() as u64,
            guard_reads_per_sec: d.guard_reads_per_sec,
        }
    }
}

impl ReconcileSettings {
    pub fn reconcile_config(&self) -> ReconcileConfig {
        ReconcileConfig {
            shards: self.shards.max(1),
            lease: TimeDelta::seconds(self.lease_secs.max(1) as i64),
            interval: Duration::from_secs(self.interval_secs.max(1)),
            full_check: Duration::from_secs(self.full_check_secs),
            chunk: self.chunk.clamp(1, 1000),
            guard_page: ReconcileConfig::default().guard_page,
            guard_reads_per_sec: self.guard_reads_per_sec,
            auto_repair: self.auto_repair,
            max_repairs_per_pass: self.max_repairs_per_pass,
            settle: Duration::from_millis(self.settle_ms),
            repair_attempts: self.repair_attempts.max(1),
            reopen_timeout: Duration::from_secs(self.reopen_timeout_secs),
            inbox_retention: TimeDelta::days(self.inbox_retention_days as i64),
        }
    }
}
