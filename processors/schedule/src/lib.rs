//! Scheduled confirms (docs/design.md, scheduled confirms): a SCHEDULED reservation parked
//! in CREATED_RESERVED by its OrderCreated is confirmed at its `processing_time`.
//!
//! Three parts, any number of instances of each:
//!
//! * **Time wheel** ([`wheel`], [`fire`]): Redis sorted sets scored by due time. order-lifecycle
//!   arms an entry when it parks a reservation; every instance's poller claims due entries
//!   and emits `InventoryConfirmDue` on `inventory.schedule.v1` through the outbox.
//! * **Schedule processor** ([`processor`]): consumes `inventory.schedule.v1` and confirms
//!   from CREATED_RESERVED through the reservation service.
//! * **Scan** ([`scan`]): every `scan_interval`, confirms CREATED_RESERVED reservations past
//!   `processing_time + grace` directly (the wheel missed them) and re-arms those due within
//!   the load-ahead horizon (their entry may have been lost).
//!
//! # Why a Redis sorted set and not an in-process hashed wheel
//!
//! An in-process wheel forgets everything on a restart and belongs to one instance: each
//! restart would leave every pending timer to the scan (late by up to interval + grace), and
//! instances would need shard ownership and hand-over to fire each timer once. A sorted set
//! scored by due time survives restarts, is shared by all instances, answers "what is due"
//! with one range query, and its claim is one Lua script, so one poller fires each entry.
//! The cost is a Redis round trip per shard per tick, which is small next to the Lua Try path.
//!
//! The wheel is only for being on time; MySQL is the source of truth. Every path is
//! at-least-once and idempotent: the emission is an outbox row with a deterministic event id
//! (a repeated claim enqueues once), the confirm is the reservation CAS from CREATED_RESERVED
//! (a second trigger, or the scan racing the wheel, finds the work done), and a claimed entry
//! is only removed after its emission committed (a crash in between re-fires it after the
//! claim timeout).

pub mod event;
pub mod fire;
pub mod processor;
pub mod scan;
pub mod settings;
pub mod store;

pub use processor::{loop_config, ScheduleProcessor, NAME};
pub use settings::ScheduleSettings;
pub use stocksvr_store::wheel::{self, TimeWheel};

use chrono::TimeDelta;
use std::sync::Arc;
use std::time::Duration;
use stocksvr_pipeline::codec::AvroCodec;
use stocksvr_pipeline::config::KafkaSettings;
use stocksvr_pipeline::consumer::LoopError;
use stocksvr_reservation::{ReservationService, ServiceError};
use tokio::sync::watch;

/// Producer name in the envelope of InventoryConfirmDue.
pub const PRODUCER: &str = "stocksvr";

#[derive(Debug, thiserror::Error)]
pub enum ScheduleError {
    #[error("schedule configuration: {0}")]
    Config(String),
    #[error("mysql: {0}")]
    Mysql(#[from] sqlx::Error),
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    #[error(transparent)]
    Service(#[from] ServiceError),
    #[error("schedule processor: {0}")]
    Loop(#[from] LoopError),
}

/// [`ScheduleSettings`] checked and typed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleConfig {
    pub tick: Duration,
    /// The longest sleep of the wheel poller while nothing is due (at least `tick`).
    pub idle_tick: Duration,
    pub claim_timeout: Duration,
    /// Entries claimed per shard and script call.
    pub claim_batch: usize,
    pub scan_interval: Duration,
    pub scan_grace: TimeDelta,
    pub load_ahead: TimeDelta,
    /// Rows per scan query (500 by default).
    pub scan_batch: u32,
    /// The consumer loop of the schedule processor (`[consumer]`).
    pub consumer: stocksvr_pipeline::config::ConsumerSettings,
}

impl ScheduleConfig {
    pub fn from_settings(s: &ScheduleSettings) -> Result<Self, ScheduleError> {
        let bad = |m: String| Err(ScheduleError::Config(m));
        wheel::check_namespace(&s.wheel_namespace).map_err(ScheduleError::Config)?;
        if s.shards == 0 {
            return bad("schedule.shards must be at least 1".into());
        }
        if s.tick_ms == 0 || s.claim_timeout_secs == 0 || s.scan_interval_secs == 0 {
            return bad(
                "schedule.tick_ms, claim_timeout_secs and scan_interval_secs must be positive"
                    .into(),
            );
        }
        if s.idle_tick_ms < s.tick_ms {
            return bad(format!(
                "schedule.idle_tick_ms ({}) must be at least tick_ms ({})",
                s.idle_tick_ms, s.tick_ms
            ));
        }
        if s.load_ahead_secs < s.scan_interval_secs {
            return bad(format!(
                "schedule.load_ahead_secs ({}) must be at least scan_interval_secs ({}), or entries due between two scans are never re-armed",
                s.load_ahead_secs, s.scan_interval_secs
            ));
        }
        let secs = |v: u64| {
            i64::try_from(v)
                .ok()
                .and_then(TimeDelta::try_seconds)
                .ok_or_else(|| ScheduleError::Config(format!("{v} seconds is out of range")))
        };
        Ok(Self {
            tick: Duration::from_millis(s.tick_ms),
            idle_tick: Duration::from_millis(s.idle_tick_ms),
            claim_timeout: Duration::from_secs(s.claim_timeout_secs),
            claim_batch: 100,
            scan_interval: Duration::from_secs(s.scan_interval_secs),
            scan_grace: secs(s.scan_grace_secs)?,
            load_ahead: secs(s.load_ahead_secs)?,
            scan_batch: 500,
            consumer: Default::default(),
        })
    }
}

/// Runs the wheel poller, the scan and the schedule processor until `stop` turns true.
pub async fn run(
    config: ScheduleConfig,
    wheel: TimeWheel,
    service: Arc<ReservationService>,
    relay: Option<Arc<tokio::sync::Notify>>,
    kafka: &KafkaSettings,
    codec: AvroCodec,
    stop: watch::Receiver<bool>,
) -> Result<(), ScheduleError> {
    tracing::info!(
        ?wheel,
        tick = ?config.tick,
        idle_tick = ?config.idle_tick,
        scan_interval = ?config.scan_interval,
        "scheduled confirms started"
    );
    let poller = fire::Poller::new(wheel.clone(), service.pool().clone(), relay, &config);
    let scanner = scan::Scanner::new(service.clone(), wheel, &config);
    let handler = Arc::new(ScheduleProcessor::new(service));
    let consume = async {
        stocksvr_pipeline::consumer::run(
            kafka,
            codec,
            loop_config(kafka).with_consumer(&config.consumer),
            handler,
            stop.clone(),
        )
        .await
        .map_err(ScheduleError::from)
    };
    tokio::try_join!(poller.run(stop.clone()), scanner.run(stop.clone()), consume)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn the_defaults_are_valid() {
        let c = ScheduleConfig::from_settings(&ScheduleSettings::default()).expect("valid");
        assert_eq!(c.scan_interval, Duration::from_secs(30));
        assert_eq!(c.scan_grace, TimeDelta::seconds(30));
        assert_eq!(c.load_ahead, TimeDelta::seconds(600));
        assert_eq!((c.tick, c.idle_tick), (200 * MS, 1000 * MS));
    }

    #[test]
    fn settings_that_would_lose_timers_are_refused() {
        let with = |f: fn(&mut ScheduleSettings)| {
            let mut s = ScheduleSettings::default();
            f(&mut s);
            ScheduleConfig::from_settings(&s)
        };
        for bad in [
            with(|s| s.shards = 0),
            with(|s| s.tick_ms = 0),
            with(|s| s.idle_tick_ms = 100),
            with(|s| s.scan_interval_secs = 0),
            with(|s| s.load_ahead_secs = 10),
            with(|s| s.wheel_namespace = "a}b".into()),
            with(|s| s.scan_grace_secs = u64::MAX),
        ] {
            assert!(matches!(bad, Err(ScheduleError::Config(_))), "{bad:?}");
        }
    }
}
