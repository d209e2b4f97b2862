//! The reservation crate's configuration sections (`[reservation]`, `[recovery]`,
//! `[stock_ops]`): what the binary reads from the file and the environment, turned into the
//! service's typed configs by [`ReservationSettings::service_config`] and friends.

use crate::operations::{DailyConfig, OpsConfig};
use crate::recovery::RecoveryConfig;
use crate::service::ServiceConfig;
use chrono::TimeDelta;
use serde::{Deserialize, Serialize};
use std::time::Duration;

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReservationSettings {
    /// Snowflake worker id (0-1023) of this instance. Unset: leased from MySQL
    /// (`snowflake_worker_lease`), which guarantees two running instances never share one.
    pub worker_id: Option<u16>,
    /// IANA time zone of merchants without a `merchant_settings` row.
    pub default_timezone: String,
    /// A RESERVED reservation is alerted after this many seconds (never cancelled).
    pub hold_ttl_secs: u64,
    /// How many seconds in the past a scheduled order's processing_time may lie.
    pub scheduled_grace_secs: u64,
    /// Largest quantity of one Try.
    pub max_quantity: u32,
    /// Days Redis keeps each operation's first result (the idempotency window).
    pub op_ttl_days: u64,
    /// How old (ms, 0 to 2000) the Try path's list of lost buckets may be; OPEN bucket rows
    /// and time zones are kept 30 s (`cache::STATIC_TTL`); 0 reads the bucket's
    /// row and the merchant's time zone for every Try.
    pub try_cache_ms: u64,
    /// Largest group written together by group commit: concurrent Trys inserted with one
    /// INSERT, steps begun with one CAS (Confirm, Cancel) and steps completed in one
    /// transaction (all but refunds); 1 writes each row alone.
    pub try_group_max: usize,
    /// Groups each group-commit worker has in flight at the same time; each MySQL one holds
    /// one connection. One by default: the next group then takes everything that queued
    /// during the write in front of it, so a commit and its log flush are shared by the most
    /// rows (the bench's hot Try at 64 connections: 3,310/s with 1, 3,038 with 2, 2,764
    /// with 4, in one sitting on two cores).
    pub try_groups_in_flight: usize,
    /// The Trys of a group go to Redis in one `try.lua` call per bucket instead of one call
    /// each. Off by default: on loopback it saved no CPU (Redis' cost is the script's work,
    /// not the call) and cold dishes were 5-7% slower; see the README.
    pub try_lua_group: bool,
}

impl Default for ReservationSettings {
    fn default() -> Self {
        Self {
            worker_id: None,
            default_timezone: "UTC".into(),
            hold_ttl_secs: 1800,
            scheduled_grace_secs: 300,
            max_quantity: 999,
            op_ttl_days: 30,
            try_cache_ms: 2000,
            try_group_max: 64,
            try_groups_in_flight: 1,
            try_lua_group: false,
        }
    }
}

/// Stock operations without a reservation (bucket init, adjust, close, archive) and the
/// daily bucket job.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct StockOpsSettings {
    /// Seconds a worker owns a WAL row it executes; after that another worker takes it over
    /// (a dead instance's row within this plus the worker's idle round, 3 s at most). Not
    /// renewed: one execution (a Lua step, its completion) must fit, and the rows of one
    /// claim (up to 50) run one after another under it. One that outlives it is harmless: the
    /// Lua step replays its first result for the same operation id and the completion is
    /// written only while the lease is still the writer's.
    pub wal_lease_secs: u64,
    /// Failed attempts after which a WAL row is marked dead and alerted.
    pub wal_max_attempts: u32,
    /// Hours an archived bucket's Redis key lives on. A refund after that cannot return stock
    /// to its day and is left to an operator: keep it at least the refund window.
    pub archive_ttl_hours: u64,
    /// Seconds between two rounds of the daily bucket job.
    pub daily_interval_secs: u64,
    /// Minutes before the merchant's local midnight the next day's buckets are prepared.
    pub daily_lead_minutes: u64,
    /// A dish without a baseline in this many days is not carried forward.
    pub daily_lookback_days: u32,
}

impl Default for StockOpsSettings {
    fn default() -> Self {
        Self {
            wal_lease_secs: 6,
            wal_max_attempts: 20,
            archive_ttl_hours: 720,
            daily_interval_secs: 300,
            daily_lead_minutes: 120,
            daily_lookback_days: 7,
        }
    }
}

/// The reservation recovery worker and the stale-reservation watcher.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RecoverySettings {
    /// Intermediate reservations resumed per round.
    pub batch: u32,
    /// Seconds a claimed row belongs to the worker that claimed it; a dead instance's rows are
    /// resumed by another this long after the claim (plus its idle round). Not renewed: the
    /// rows of one claim (`batch`) are resumed one after another under it. Resuming twice is
    /// harmless (the same operation id; every status change is a compare-and-set on the
    /// row's version), so a lease that runs out only costs repeated work.
    pub lease_secs: u64,
    /// Pause after a round that found nothing due, in milliseconds; it doubles while rounds
    /// stay empty, up to ten times this (3 s by default, so a row falls due and is resumed
    /// within 3 s).
    pub idle_poll_ms: u64,
    /// First delay before a failed step is retried, in milliseconds; doubles per attempt.
    pub retry_delay_ms: u64,
    /// Longest delay between two recovery attempts, in seconds.
    pub max_retry_delay_secs: u64,
    /// Failed attempts after which a reservation is marked dead and alerted (never moved).
    pub max_attempts: u32,
    /// Seconds between two rounds of the stale-reservation watcher.
    pub stale_interval_secs: u64,
}

impl Default for RecoverySettings {
    fn default() -> Self {
        Self {
            batch: 50,
            lease_secs: 6,
            idle_poll_ms: 300,
            retry_delay_ms: 1_000,
            max_retry_delay_secs: 300,
            max_attempts: 20,
            stale_interval_secs: 30,
        }
    }
}

impl RecoverySettings {
    pub fn recovery_config(&self) -> RecoveryConfig {
        RecoveryConfig {
            batch: self.batch.max(1),
            lease: TimeDelta::seconds(self.lease_secs.max(1) as i64),
            idle_poll: Duration::from_millis(self.idle_poll_ms.max(1)),
        }
    }

    pub fn stale_interval(&self) -> Duration {
        Duration::from_secs(self.stale_interval_secs.max(1))
    }
}

impl ReservationSettings {
    /// The service configuration: this section plus the recovery bounds.
    pub fn service_config(&self, recovery: &RecoverySettings) -> Result<ServiceConfig, String> {
        let tz: chrono_tz::Tz = self.default_timezone.parse().map_err(|e| {
            format!(
                "reservation.default_timezone {:?}: {e}",
                self.default_timezone
            )
        })?;
        Ok(ServiceConfig {
            default_timezone: tz,
            hold_ttl: TimeDelta::seconds(self.hold_ttl_secs as i64),
            scheduled_grace: TimeDelta::seconds(self.scheduled_grace_secs as i64),
            max_quantity: self.max_quantity,
            op_ttl: Duration::from_secs(self.op_ttl_days * 24 * 3600),
            recovery_delay: TimeDelta::milliseconds(recovery.retry_delay_ms.max(1) as i64),
            recovery_max_delay: TimeDelta::seconds(recovery.max_retry_delay_secs.max(1) as i64),
            recovery_max_attempts: recovery.max_attempts.max(1),
            try_cache_ttl: Duration::from_millis(self.try_cache_ms).min(crate::cache::MAX_TTL),
            try_group_max: self.try_group_max.clamp(1, 1000),
            try_groups_in_flight: self.try_groups_in_flight.max(1),
            try_lua_group: self.try_lua_group,
            ..ServiceConfig::default()
        })
    }
}

impl StockOpsSettings {
    /// WAL lease and retries, archive TTL.
    pub fn ops_config(&self) -> OpsConfig {
        OpsConfig {
            lease: TimeDelta::seconds(self.wal_lease_secs.max(1) as i64),
            max_attempts: self.wal_max_attempts.max(1),
            archive_ttl: Duration::from_secs(self.archive_ttl_hours * 3600),
            ..OpsConfig::default()
        }
    }

    pub fn daily_config(&self) -> DailyConfig {
        DailyConfig {
            interval: Duration::from_secs(self.daily_interval_secs.max(1)),
            lead: TimeDelta::minutes(self.daily_lead_minutes as i64),
            lookback_days: i64::from(self.daily_lookback_days),
        }
    }
}
