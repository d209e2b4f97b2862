//! Configuration of the lag exporter (the `[lag_exporter]` section once the binary wires it).

use serde::{Deserialize, Serialize};
use std::time::Duration;
use stocksvr_pipeline::config::KafkaSettings;

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct LagExporterConfig {
    /// Seconds between two rounds. Each round costs one group listing, one metadata request,
    /// one committed-offsets request per group and one watermark request per partition the
    /// groups read.
    pub interval_secs: u64,
    /// Only consumer groups whose name starts with this are exported. Empty: the processors'
    /// own groups, `<kafka.group_prefix>.`.
    pub group_prefix: String,
    /// Milliseconds a round waits for the first unconsumed record of the partitions whose
    /// committed offset moved (the timestamp behind the lag in seconds). A partition whose
    /// record does not arrive in time keeps its previous lag in seconds for this round.
    pub fetch_timeout_ms: u64,
}

impl Default for LagExporterConfig {
    fn default() -> Self {
        Self {
            interval_secs: 15,
            group_prefix: String::new(),
            fetch_timeout_ms: 2_000,
        }
    }
}

impl LagExporterConfig {
    pub fn interval(&self) -> Duration {
        // A zero interval would spin: one second is the floor.
        Duration::from_secs(self.interval_secs.max(1))
    }

    pub fn fetch_timeout(&self) -> Duration {
        Duration::from_millis(self.fetch_timeout_ms)
    }

    /// The prefix groups must start with: the configured one, or `<kafka.group_prefix>.`.
    pub fn effective_prefix(&self, kafka: &KafkaSettings) -> String {
        if self.group_prefix.is_empty() {
            format!("{}.", kafka.group_prefix)
        } else {
            self.group_prefix.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_prefix_is_the_processors_group_prefix_with_its_dot() {
        let kafka = KafkaSettings {
            group_prefix: "shop".into(),
            ..KafkaSettings::default()
        };
        let config = LagExporterConfig::default();
        assert_eq!(config.effective_prefix(&kafka), "shop.");
        let custom = LagExporterConfig {
            group_prefix: "other-".into(),
            ..config
        };
        assert_eq!(custom.effective_prefix(&kafka), "other-");
    }

    #[test]
    fn a_zero_interval_does_not_spin() {
        let config = LagExporterConfig {
            interval_secs: 0,
            ..LagExporterConfig::default()
        };
        assert_eq!(config.interval(), Duration::from_secs(1));
    }
}
