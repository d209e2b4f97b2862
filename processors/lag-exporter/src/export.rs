//! Turns rounds into the catalog's metrics (prometheus/metrics-catalog.json).

use crate::lag::Scrape;
use std::collections::BTreeSet;
use stocksvr_telemetry::names;

/// Creates the round counters at 0, so `increase()` sees a round that never succeeded.
pub fn register() {
    for outcome in ["ok", "error"] {
        metrics::counter!(names::LAG_EXPORTER_SCRAPES, "outcome" => outcome).increment(0);
    }
}

/// Counts one round.
pub fn record_round(ok: bool) {
    let outcome = if ok { "ok" } else { "error" };
    metrics::counter!(names::LAG_EXPORTER_SCRAPES, "outcome" => outcome).increment(1);
}

type PartitionKey = (String, String, i32);

/// Sets the gauges of each round and settles series that disappeared.
///
/// The `metrics` facade cannot remove a series. A group whose offsets expired or were
/// deleted, or a topic it no longer reads, would otherwise keep its last lag for ever (and a
/// stall alert with it), so such series are set to 0 once: a group that no longer exists has
/// nothing left to consume. Groups the round could not read keep their values.
#[derive(Debug, Default)]
pub struct Publisher {
    partitions: BTreeSet<PartitionKey>,
    groups: BTreeSet<String>,
}

impl Publisher {
    pub fn publish(&mut self, scrape: &Scrape) {
        let mut partitions = BTreeSet::new();
        let mut watermarks = BTreeSet::new();
        for p in &scrape.partitions {
            let labels = [
                ("group", p.group.clone()),
                ("topic", p.topic.clone()),
                ("partition", p.partition.to_string()),
            ];
            metrics::gauge!(names::CONSUMER_GROUP_LAG, &labels).set(p.lag as f64);
            if let Some(seconds) = p.lag_seconds {
                metrics::gauge!(names::CONSUMER_GROUP_LAG_SECONDS, &labels).set(seconds);
            }
            if let Some(offset) = p.committed {
                metrics::gauge!(names::CONSUMER_GROUP_COMMITTED_OFFSET, &labels).set(offset as f64);
            }
            if watermarks.insert((p.topic.clone(), p.partition)) {
                metrics::gauge!(names::TOPIC_HIGH_WATERMARK, "topic" => p.topic.clone(), "partition" => p.partition.to_string())
                    .set(p.high_watermark as f64);
            }
            partitions.insert((p.group.clone(), p.topic.clone(), p.partition));
        }
        let gone: Vec<PartitionKey> = self.partitions.difference(&partitions).cloned().collect();
        for gone in gone {
            if scrape.unread_groups.contains(&gone.0) {
                partitions.insert(gone);
                continue;
            }
            let labels = [
                ("group", gone.0.clone()),
                ("topic", gone.1.clone()),
                ("partition", gone.2.to_string()),
            ];
            metrics::gauge!(names::CONSUMER_GROUP_LAG, &labels).set(0.0);
            metrics::gauge!(names::CONSUMER_GROUP_LAG_SECONDS, &labels).set(0.0);
        }
        self.partitions = partitions;

        let groups: BTreeSet<String> = scrape.groups.iter().map(|g| g.group.clone()).collect();
        for g in &scrape.groups {
            metrics::gauge!(names::CONSUMER_GROUP_MEMBERS, "group" => g.group.clone())
                .set(g.members as f64);
        }
        for gone in self.groups.difference(&groups) {
            metrics::gauge!(names::CONSUMER_GROUP_MEMBERS, "group" => gone.clone()).set(0.0);
        }
        self.groups = groups;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lag::{GroupSummary, PartitionLag};
    use metrics_exporter_prometheus::PrometheusBuilder;

    fn row(group: &str, partition: i32, lag: i64, seconds: Option<f64>) -> PartitionLag {
        PartitionLag {
            group: group.into(),
            topic: "t".into(),
            partition,
            committed: Some(10),
            low_watermark: 0,
            high_watermark: 10 + lag,
            lag,
            lag_seconds: seconds,
        }
    }

    fn group(name: &str, members: usize) -> GroupSummary {
        GroupSummary {
            group: name.into(),
            state: "Empty".into(),
            members,
        }
    }

    fn value(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
    }

    #[test]
    fn series_of_a_vanished_group_go_to_zero_and_unread_groups_keep_theirs() {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            let mut publisher = Publisher::default();
            publisher.publish(&Scrape {
                groups: vec![group("a", 1), group("b", 0)],
                partitions: vec![row("a", 0, 5, Some(30.0)), row("b", 0, 2, Some(9.0))],
                ..Scrape::default()
            });
            // a is gone from the cluster; b could not be read this round; b's partition 1
            // lost its timestamp read.
            publisher.publish(&Scrape {
                groups: vec![group("b", 0)],
                partitions: vec![row("b", 1, 3, None)],
                unread_groups: ["b".to_string()].into(),
                ..Scrape::default()
            });
        });
        let text = handle.render();
        let lag = |g: &str, p: i32| {
            value(
                &text,
                &format!(
                    "stocksvr_consumer_group_lag{{group=\"{g}\",topic=\"t\",partition=\"{p}\"}}"
                ),
            )
        };
        let secs = |g: &str, p: i32| {
            value(
                &text,
                &format!("stocksvr_consumer_group_lag_seconds{{group=\"{g}\",topic=\"t\",partition=\"{p}\"}}"),
            )
        };
        assert_eq!(lag("a", 0), Some(0.0), "{text}");
        assert_eq!(secs("a", 0), Some(0.0), "{text}");
        assert_eq!(lag("b", 0), Some(2.0), "{text}");
        assert_eq!(secs("b", 0), Some(9.0), "{text}");
        assert_eq!(lag("b", 1), Some(3.0), "{text}");
        assert_eq!(secs("b", 1), None, "no timestamp, no value yet: {text}");
        assert_eq!(
            value(&text, "stocksvr_consumer_group_members{group=\"a\"}"),
            Some(0.0)
        );
        assert_eq!(
            value(
                &text,
                "stocksvr_topic_high_watermark{topic=\"t\",partition=\"1\"}"
            ),
            Some(13.0)
        );
    }
}
