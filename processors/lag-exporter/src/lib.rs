//! Consumer lag measured at the broker.
//!
//! A processor that reports its own lag stops reporting exactly when it matters: when it is
//! dead, stuck or rebalancing. This exporter asks the broker instead. Every round it lists the
//! consumer groups whose name starts with the configured prefix (`<kafka.group_prefix>.` by
//! default: every stocksvr processor's group), reads each group's committed offsets and the
//! watermarks of the partitions it reads, and exports per group, topic and partition:
//!
//! - `stocksvr_consumer_group_committed_offset`, `stocksvr_topic_high_watermark`;
//! - `stocksvr_consumer_group_lag`: high watermark minus where the group resumes (its
//!   committed offset; the low watermark on a partition it never committed on, since stocksvr
//!   consumers start from the earliest record);
//! - `stocksvr_consumer_group_lag_seconds`: now minus the timestamp of the first record the
//!   group has not consumed, 0 when caught up. That record is read once by an assign()-ed
//!   reader outside any group and its timestamp cached while the committed offset stays put,
//!   so a stuck group costs no reads and its lag in seconds still grows every round;
//! - `stocksvr_consumer_group_members` and `stocksvr_lag_exporter_scrapes_total{outcome}`.
//!
//! No client of the exporter ever joins a group (see [`broker`]), so it keeps reporting while
//! a group has no members and never causes a rebalance.
//!
//! **Several instances.** Every `stocksvr all` may run an exporter. They read the same broker
//! state, so they export identical values under different `instance` labels; dashboards and
//! alerts take `max by (group, topic, partition)` before aggregating further, which shows one
//! value however many instances run (and keeps showing it while any one of them runs). No
//! lease is needed, at the price of one set of broker reads per instance and round.

pub mod broker;
pub mod config;
pub mod export;
pub mod lag;

pub use config::LagExporterConfig;
pub use export::Publisher;
pub use lag::{GroupSummary, PartitionLag, Scrape};

use rdkafka::error::KafkaError;
use std::sync::{Arc, Mutex, PoisonError};
use stocksvr_pipeline::config::KafkaSettings;
use tokio::sync::watch;

#[derive(Debug, thiserror::Error)]
pub enum LagError {
    #[error("kafka: {0}")]
    Kafka(#[from] KafkaError),
    #[error("a lag exporter round panicked")]
    Panicked,
}

/// A lag exporter: the broker clients and the timestamp cache, kept between rounds.
#[derive(Clone)]
pub struct Exporter {
    reader: Arc<Mutex<broker::Reader>>,
}

impl Exporter {
    pub fn new(settings: &KafkaSettings, config: &LagExporterConfig) -> Result<Self, LagError> {
        Ok(Self {
            reader: Arc::new(Mutex::new(broker::Reader::new(settings, config)?)),
        })
    }

    /// One round of broker reads, off the async runtime. Exports nothing; see [`Publisher`].
    pub async fn scrape_once(&self) -> Result<Scrape, LagError> {
        let reader = Arc::clone(&self.reader);
        tokio::task::spawn_blocking(move || {
            // A round that panicked left nothing half-written that matters: the next round
            // reads everything again.
            let mut reader = reader.lock().unwrap_or_else(PoisonError::into_inner);
            reader.scrape()
        })
        .await
        .map_err(|_| LagError::Panicked)?
        .map_err(LagError::from)
    }

    /// Record timestamps currently cached.
    pub fn cached_timestamps(&self) -> usize {
        self.reader
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .cached_timestamps()
    }
}

/// One round with fresh clients: what [`run`] would export now.
pub async fn scrape_once(
    settings: &KafkaSettings,
    config: &LagExporterConfig,
) -> Result<Scrape, LagError> {
    Exporter::new(settings, config)?.scrape_once().await
}

/// Exports a round every `config.interval_secs` until `stop` turns true (or its sender is
/// dropped). A failed round is logged and counted (`outcome="error"`); the gauges keep their
/// last values and the next round tries again. Fails only when the Kafka clients cannot be
/// created (bad configuration).
pub async fn run(
    settings: &KafkaSettings,
    config: LagExporterConfig,
    mut stop: watch::Receiver<bool>,
) -> Result<(), LagError> {
    let exporter = Exporter::new(settings, &config)?;
    let prefix = config.effective_prefix(settings);
    tracing::info!(
        prefix = %prefix,
        interval_secs = config.interval().as_secs(),
        "lag exporter started"
    );
    export::register();
    let mut publisher = Publisher::default();
    // What the last round could not read: a round's problems are logged when they change,
    // not at every round while the same refusal (a missing ACL) or outage lasts.
    let mut last_problems = String::new();
    let mut failing: Option<String> = None;
    let mut ticks = tokio::time::interval(config.interval());
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        if *stop.borrow() {
            break;
        }
        tokio::select! {
            _ = ticks.tick() => {}
            changed = stop.changed() => {
                if changed.is_err() {
                    break;
                }
                continue;
            }
        }
        let round = tokio::select! {
            round = exporter.scrape_once() => round,
            // A round blocked on an unreachable broker must not hold up shutdown; its
            // blocking task ends on its own timeouts.
            changed = stop.changed() => {
                if changed.is_err() {
                    break;
                }
                continue;
            }
        };
        match round {
            Ok(scrape) => {
                if failing.take().is_some() {
                    tracing::info!("lag exporter rounds succeed again");
                }
                publisher.publish(&scrape);
                // A group left unread is an error; a record timestamp that did not arrive in
                // time only leaves one lag in seconds at its last value (logged below).
                export::record_round(scrape.unread_groups.is_empty());
                let problems = scrape.problems.join("; ");
                if problems != last_problems {
                    if problems.is_empty() {
                        tracing::info!("lag exporter rounds complete again");
                    } else {
                        tracing::warn!(%problems, "lag exporter round incomplete (said again when it changes)");
                    }
                    last_problems = problems;
                }
            }
            Err(e) => {
                export::record_round(false);
                // Said when it changes, not at every round while the same outage lasts.
                let error = e.to_string();
                if failing.as_deref() != Some(error.as_str()) {
                    tracing::warn!(%error, "lag exporter round failed; the next rounds retry (said again when the error changes)");
                    failing = Some(error);
                }
            }
        }
    }
    tracing::info!("lag exporter stopped");
    Ok(())
}
