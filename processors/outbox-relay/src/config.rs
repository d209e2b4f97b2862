//! Tuning of the relay. Every knob has a production default; tests shrink the timings.

use crate::error::RelayError;
use serde::{Deserialize, Serialize};
use std::time::Duration;

const DAY: Duration = Duration::from_secs(24 * 3600);

/// How the relay claims, publishes, retries and purges.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelayConfig {
    /// Rows claimed (and published concurrently) per round. A full batch means a backlog,
    /// so the next round starts at once, overlapping this one's acknowledgements. 1,000: a
    /// round's fixed cost (the scan, the broker's round trip, the mark) is then a small
    /// share, and a round still fits well within `publish_timeout`. Since the relay's
    /// encoding costs about 10 us a row it waits on its rounds rather than its CPU: a backlog
    /// drained at 108,000-112,000 rows/s in rounds of 1,000 against 73,000-79,000 in rounds
    /// of 500 (`scripts/bench --only pipeline`, 2026-12-06).
    pub batch_size: u32,
    /// Sleep after a partial batch, and the first sleep after an empty one.
    pub min_poll: Duration,
    /// After a partial batch, the shortest time before a commit's wake-up starts the next
    /// round: under a steady Try load each commit wakes the relay, and without it every
    /// round published one commit's few rows as a Kafka request of its own. The first rows
    /// after an empty round still go at once. At most `min_poll`.
    pub linger: Duration,
    /// Longest sleep when idle: empty rounds double the sleep up to this (adaptive polling,
    /// docs/design.md: fast under backlog, easy on the database when idle).
    pub max_poll: Duration,
    /// How long a lease lasts: the leader's (renewed by every round that moves the mark,
    /// and at a third of the lease when idle; another relay takes over once it runs out)
    /// and that of a row claimed by the retry path (SENDING, `next_retry_at` holds its
    /// expiry; after it another relay may claim the row again).
    ///
    /// 6 s: after kill -9 of the leader another instance leads within the lease plus its
    /// idle sleep (`max_poll`, 2 s), so new rows go out again within 8 s. A leader that stalls
    /// longer is fenced, not trusted: the lease is taken by epoch compare-and-set, its mark
    /// write carries the epoch and fails, and it stops leading; what it had published above
    /// the mark goes out again (a duplicate the consumers' dedupe absorbs, in order). It
    /// stops trusting its own lease at 80% of it without a renewal.
    pub claim_lease: Duration,
    /// Longest wait for the broker's acknowledgements of one batch. Must stay below
    /// `claim_lease`, or a slow batch could be claimed by a second relay while the first
    /// is still waiting (a duplicate publish). 5 s: acknowledgements take milliseconds; a
    /// batch caught by a broker's failover (its partitions' leadership moves after the
    /// controller's 9 s broker session) times out, goes to RETRY and is published again by
    /// the retry path, at worst twice.
    pub publish_timeout: Duration,
    /// Delay before the first retry of a failed row; doubles per failure.
    pub retry_initial: Duration,
    /// Upper bound of the retry delay.
    pub retry_max: Duration,
    /// SENT rows older than this (by `sent_at`) are deleted.
    pub retention: Duration,
    /// Rows deleted per purge statement, so one purge never holds many locks at once.
    pub purge_batch: u32,
    /// How often the purge runs.
    pub purge_every: Duration,
    /// How often the backlog gauges are refreshed (one cheap query each time) while there is
    /// a backlog or the relay moves rows.
    pub gauge_every: Duration,
    /// Longest gap between two refreshes while the last one found no backlog and the relay
    /// moved nothing since: the refreshes double from `gauge_every` up to this, and the
    /// relay's first round that moves rows refreshes them at once. A backlog no relay of this
    /// process works on (another instance leads and is stuck) shows within this.
    pub gauge_idle_every: Duration,
    /// Only when the database refuses `information_schema.INNODB_TRX` (no PROCESS
    /// privilege): an id missing below visible rows is taken as never written once it has
    /// been missing this long. A transaction that commits an outbox row later than this
    /// after the gap was seen has that row skipped by the scan (it is not published), so
    /// keep this well above the longest transaction. With the privilege, a gap closes as
    /// soon as every transaction that could own it has ended.
    pub gap_timeout: Duration,
}

impl Default for RelayConfig {
    fn default() -> Self {
        Self {
            batch_size: 1_000,
            min_poll: Duration::from_millis(20),
            linger: Duration::from_millis(10),
            max_poll: Duration::from_secs(2),
            claim_lease: Duration::from_secs(6),
            publish_timeout: Duration::from_secs(5),
            retry_initial: Duration::from_secs(1),
            retry_max: Duration::from_secs(5 * 60),
            retention: Duration::from_secs(7 * 24 * 3600),
            purge_batch: 500,
            purge_every: Duration::from_secs(60),
            gauge_every: Duration::from_secs(1),
            // An idle `stocksvr all` read the backlog every second (1 of its ~8 statements a
            // second); the alerts look at minutes (`for: 1m`, `deriv(...[2m])`).
            gauge_idle_every: Duration::from_secs(10),
            gap_timeout: Duration::from_secs(300),
        }
    }
}

impl RelayConfig {
    /// Rejects settings under which the relay could not keep its guarantees.
    pub fn validate(&self) -> Result<(), RelayError> {
        let fail = |reason: &str| Err(RelayError::Config(reason.to_string()));
        if self.batch_size == 0 {
            return fail("batch_size must be at least 1");
        }
        if self.purge_batch == 0 {
            return fail("purge_batch must be at least 1");
        }
        if self.min_poll.is_zero() || self.min_poll > self.max_poll {
            return fail("min_poll must be above zero and at most max_poll");
        }
        if self.linger > self.min_poll {
            return fail("linger must be at most min_poll");
        }
        if self.publish_timeout.is_zero() || self.publish_timeout >= self.claim_lease {
            return fail("publish_timeout must be above zero and below claim_lease");
        }
        // Leases and retries are stored with millisecond precision (DATETIME(3)); beyond a
        // day a crashed relay's rows, or a failed row, would be hidden for too long to be a
        // deliberate choice.
        if self.claim_lease < Duration::from_millis(1) || self.claim_lease > DAY {
            return fail("claim_lease must be between 1 ms and 1 day");
        }
        if self.retry_initial.is_zero()
            || self.retry_initial > self.retry_max
            || self.retry_max > DAY
        {
            return fail(
                "retry_initial must be above zero and at most retry_max, itself at most 1 day",
            );
        }
        if self.purge_every.is_zero() || self.gauge_every.is_zero() {
            return fail("purge_every and gauge_every must be above zero");
        }
        if self.gauge_idle_every < self.gauge_every {
            return fail("gauge_idle_every must be at least gauge_every");
        }
        if self.gap_timeout.is_zero() {
            return fail("gap_timeout must be above zero");
        }
        Ok(())
    }
}

/// The `[relay]` configuration section: [`RelayConfig`] in milliseconds and seconds, as a
/// file or an environment variable writes it.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RelaySettings {
    /// Rows claimed and published per round; a full batch starts the next round at once.
    pub batch_size: u32,
    /// Sleep after a partial batch and the first sleep after an empty one, in milliseconds.
    pub min_poll_ms: u64,
    /// After a partial batch, milliseconds before a commit's wake-up may start the next
    /// round (rounds of several commits' rows under load); 0 starts it at once. At most
    /// min_poll_ms.
    pub linger_ms: u64,
    /// Longest sleep while idle (empty rounds double the sleep up to this), in milliseconds.
    /// A commit in the same process wakes the relay at once, whatever the sleep.
    pub max_poll_ms: u64,
    /// Seconds a lease lasts: the leader's (another relay takes over once it runs out, so
    /// this plus max_poll_ms bounds the takeover after a crash) and that of a row claimed for
    /// a retry. A leader that stalls past it is fenced (its mark write fails) and stops.
    pub claim_lease_secs: u64,
    /// Longest wait for the broker's acknowledgements of one batch, in seconds; below the lease.
    pub publish_timeout_secs: u64,
    /// First delay before a failed row is retried, in milliseconds; doubles per failure.
    pub retry_initial_ms: u64,
    /// Longest retry delay, in seconds.
    pub retry_max_secs: u64,
    /// Hours a SENT row is kept before the purge deletes it.
    pub retention_hours: u64,
    /// Rows deleted per purge statement.
    pub purge_batch: u32,
    /// Seconds between two purges.
    pub purge_every_secs: u64,
    /// Milliseconds between two refreshes of the backlog gauges while there is a backlog or
    /// the relay moves rows.
    pub gauge_every_ms: u64,
    /// Longest gap between two refreshes of the backlog gauges while both are idle, in
    /// milliseconds (the gap doubles from gauge_every_ms up to this).
    pub gauge_idle_every_ms: u64,
    /// Only without the PROCESS privilege: seconds after which a missing outbox id is taken
    /// as never written (a row committed later than that is not published).
    pub gap_timeout_secs: u64,
}

impl Default for RelaySettings {
    fn default() -> Self {
        let c = RelayConfig::default();
        Self {
            batch_size: c.batch_size,
            min_poll_ms: c.min_poll.as_millis() as u64,
            linger_ms: c.linger.as_millis() as u64,
            max_poll_ms: c.max_poll.as_millis() as u64,
            claim_lease_secs: c.claim_lease.as_secs(),
            publish_timeout_secs: c.publish_timeout.as_secs(),
            retry_initial_ms: c.retry_initial.as_millis() as u64,
            retry_max_secs: c.retry_max.as_secs(),
            retention_hours: c.retention.as_secs() / 3600,
            purge_batch: c.purge_batch,
            purge_every_secs: c.purge_every.as_secs(),
            gauge_every_ms: c.gauge_every.as_millis() as u64,
            gauge_idle_every_ms: c.gauge_idle_every.as_millis() as u64,
            gap_timeout_secs: c.gap_timeout.as_secs(),
        }
    }
}

impl RelaySettings {
    /// The typed config, validated.
    pub fn config(&self) -> Result<RelayConfig, RelayError> {
        let c = RelayConfig {
            batch_size: self.batch_size,
            min_poll: Duration::from_millis(self.min_poll_ms),
            linger: Duration::from_millis(self.linger_ms),
            max_poll: Duration::from_millis(self.max_poll_ms),
            claim_lease: Duration::from_secs(self.claim_lease_secs),
            publish_timeout: Duration::from_secs(self.publish_timeout_secs),
            retry_initial: Duration::from_millis(self.retry_initial_ms),
            retry_max: Duration::from_secs(self.retry_max_secs),
            retention: Duration::from_secs(self.retention_hours.saturating_mul(3600)),
            purge_batch: self.purge_batch,
            purge_every: Duration::from_secs(self.purge_every_secs),
            gauge_every: Duration::from_millis(self.gauge_every_ms),
            gauge_idle_every: Duration::from_millis(self.gauge_idle_every_ms),
            gap_timeout: Duration::from_secs(self.gap_timeout_secs),
        };
        c.validate()?;
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_match_the_design() {
        let c = RelayConfig::default();
        c.validate().expect("defaults are valid");
        assert_eq!(c.batch_size, 1_000);
        assert_eq!(c.retention, Duration::from_secs(604_800));
        assert_eq!(c.purge_batch, 500);
        assert!(c.publish_timeout < c.claim_lease);
    }

    #[test]
    fn the_settings_section_round_trips_the_defaults() {
        let c = RelaySettings::default().config().expect("valid");
        assert_eq!(c, RelayConfig::default());
    }

    #[test]
    fn a_publish_timeout_beyond_the_lease_is_rejected() {
        let c = RelayConfig {
            publish_timeout: RelayConfig::default().claim_lease,
            ..RelayConfig::default()
        };
        assert!(matches!(c.validate(), Err(RelayError::Config(_))));
    }

    #[test]
    fn an_idle_gauge_gap_below_the_busy_one_is_rejected() {
        let c = RelayConfig {
            gauge_idle_every: Duration::from_millis(500),
            ..RelayConfig::default()
        };
        assert!(matches!(c.validate(), Err(RelayError::Config(_))));
    }

    #[test]
    fn inverted_poll_bounds_are_rejected() {
        let c = RelayConfig {
            min_poll: Duration::from_secs(3),
            ..RelayConfig::default()
        };
        assert!(c.validate().is_err());
    }

    #[test]
    fn a_linger_beyond_the_partial_batch_sleep_is_rejected() {
        let c = RelayConfig {
            linger: Duration::from_millis(21),
            ..RelayConfig::default()
        };
        assert!(matches!(c.validate(), Err(RelayError::Config(m)) if m.contains("linger")));
    }
}
