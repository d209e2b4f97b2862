//! The `[schedule]` configuration section.

use serde::{Deserialize, Serialize};

/// Scheduled confirms: the Redis time wheel and the DB scan behind it.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ScheduleSettings {
    /// Namespace of the wheel's Redis keys (`inv:{schedule:<namespace>:<shard>}:due`).
    /// Instances with the same namespace share one wheel; give each environment that shares
    /// a Redis its own. 1-64 characters of `[A-Za-z0-9._-]`.
    pub wheel_namespace: String,
    /// Sorted sets the wheel is spread over (reservation id modulo shards). Entries left in a
    /// shard that a smaller count drops are re-armed by the load-ahead or confirmed by the scan.
    pub shards: u16,
    /// How often each instance claims due entries from the wheel while entries are being
    /// fired, in milliseconds.
    pub tick_ms: u64,
    /// The longest sleep of an instance's poller while nothing is due, in milliseconds (at
    /// least `tick_ms`). The sleep ends at the earliest entry's due time (standalone Redis;
    /// a cluster's shards have clocks of their own, so there it does not), or at once when
    /// the instance itself arms one; an entry fires at most this late otherwise.
    pub idle_tick_ms: u64,
    /// How long a claimed entry stays hidden from other pollers before it falls due again
    /// (its claimant died before emitting), in seconds.
    pub claim_timeout_secs: u64,
    /// Period of the DB scan that confirms CREATED_RESERVED reservations the wheel missed
    /// and re-arms those due soon, in seconds.
    pub scan_interval_secs: u64,
    /// The scan leaves a due reservation to the wheel for this many seconds past its
    /// processing_time before confirming it itself.
    pub scan_grace_secs: u64,
    /// The scan re-arms CREATED_RESERVED reservations due within this many seconds (an entry
    /// lost from Redis is rebuilt before it is due). At least `scan_interval_secs`.
    pub load_ahead_secs: u64,
}

impl Default for ScheduleSettings {
    fn default() -> Self {
        Self {
            wheel_namespace: "stocksvr".into(),
            shards: 8,
            tick_ms: 200,
            idle_tick_ms: 1000,
            claim_timeout_secs: 30,
            scan_interval_secs: 30,
            scan_grace_secs: 30,
            load_ahead_secs: 600,
        }
    }
}
