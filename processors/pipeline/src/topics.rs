//! `topics.yaml` is the one place topics are declared. This module reads it, compares it
//! with the cluster and applies the difference: it creates what is missing, raises
//! partition counts and updates configs. It never deletes a topic and never shrinks one
//! (Kafka cannot), it reports those as drift instead.

mod cluster;
mod file;
mod plan;

pub use crate::config::Namespace;
pub use cluster::{apply, describe_cluster};
pub use file::{for_deployment, load, load_for, parse, parse_for};
pub use plan::plan;

use std::collections::BTreeMap;
use std::fmt;

#[derive(Debug, thiserror::Error)]
pub enum TopicsError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("invalid topics file {path}: {source}")]
    Parse {
        path: String,
        source: serde_yaml::Error,
    },
    #[error("invalid topics file: {0}")]
    Invalid(String),
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    #[error("kafka refused {operation} on {topic}: {code}")]
    Refused {
        operation: &'static str,
        topic: String,
        code: String,
    },
}

/// One topic as it should be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicSpec {
    pub name: String,
    pub partitions: i32,
    pub replication_factor: i32,
    pub config: BTreeMap<String, String>,
    /// For a dead-letter topic, the topic whose failures it holds.
    pub dead_letter_of: Option<String>,
}

/// One topic as the cluster has it (config limited to what the cluster reports).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ActualTopic {
    pub partitions: i32,
    pub replication_factor: i32,
    pub config: BTreeMap<String, String>,
    /// Configs set on the topic itself (not inherited); kept when altering so an
    /// operator's own overrides survive `apply`.
    pub dynamic_config: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    Create(TopicSpec),
    AddPartitions {
        topic: String,
        from: i32,
        to: i32,
    },
    SetConfig {
        topic: String,
        key: String,
        from: Option<String>,
        to: String,
    },
}

/// A difference `apply` will not fix by itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Drift {
    MorePartitions {
        topic: String,
        declared: i32,
        actual: i32,
    },
    ReplicationFactor {
        topic: String,
        declared: i32,
        actual: i32,
    },
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Change::Create(t) => write!(
                f,
                "create {} (partitions={}, replication_factor={}, {})",
                t.name,
                t.partitions,
                t.replication_factor,
                t.config
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Change::AddPartitions { topic, from, to } => {
                write!(f, "raise partitions of {topic}: {from} -> {to}")
            }
            Change::SetConfig {
                topic,
                key,
                from,
                to,
            } => write!(
                f,
                "set {topic} {key}: {} -> {to}",
                from.as_deref().unwrap_or("(unset)")
            ),
        }
    }
}

impl fmt::Display for Drift {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Drift::MorePartitions {
                topic,
                declared,
                actual,
            } => write!(
                f,
                "{topic} has {actual} partitions but declares {declared}; Kafka cannot shrink a topic, edit topics.yaml"
            ),
            Drift::ReplicationFactor {
                topic,
                declared,
                actual,
            } => write!(
                f,
                "{topic} has replication factor {actual} but declares {declared}; change it with a partition reassignment"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    const FILE: &str = r#"
environment: local
environments:
  local:
    replication_factor: 1
    min_insync_replicas: 1
  cluster:
    replication_factor: 3
    min_insync_replicas: 2
defaults:
  cleanup.policy: delete
  retention.ms: "604800000"
dead_letter:
  suffix: .dlt
  config:
    retention.ms: "2592000000"
topics:
  - name: in.v1
    partitions: 6
    dead_letter: true
  - name: out.v1
    partitions: 3
    config:
      retention.ms: "86400000"
"#;

    fn actual_from(specs: &[TopicSpec]) -> BTreeMap<String, ActualTopic> {
        specs
            .iter()
            .map(|s| {
                (
                    s.name.clone(),
                    ActualTopic {
                        partitions: s.partitions,
                        replication_factor: s.replication_factor,
                        config: s.config.clone(),
                        dynamic_config: s.config.clone(),
                    },
                )
            })
            .collect()
    }

    #[test]
    fn dead_letter_topics_mirror_their_source() {
        let specs = parse(FILE).expect("parses");
        let names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["in.v1", "in.v1.dlt", "out.v1"]);
        let dlt = &specs[1];
        assert_eq!(dlt.partitions, 6);
        assert_eq!(dlt.dead_letter_of.as_deref(), Some("in.v1"));
        assert_eq!(dlt.config["retention.ms"], "2592000000");
        assert_eq!(specs[2].config["retention.ms"], "86400000");
        assert_eq!(specs[2].config["cleanup.policy"], "delete");
    }

    #[test]
    fn the_environment_sets_replication_and_min_insync_replicas() {
        let local = parse(FILE).expect("parses");
        assert!(local
            .iter()
            .all(|s| s.replication_factor == 1 && s.config["min.insync.replicas"] == "1"));
        let cluster = parse_for(FILE, "cluster").expect("parses");
        assert!(cluster
            .iter()
            .all(|s| s.replication_factor == 3 && s.config["min.insync.replicas"] == "2"));
        assert!(parse_for(FILE, "prod")
            .unwrap_err()
            .to_string()
            .contains("not declared"));
        let bad = FILE.replace("min_insync_replicas: 2", "min_insync_replicas: 4");
        assert!(parse_for(&bad, "cluster")
            .unwrap_err()
            .to_string()
            .contains("min_insync_replicas"));
    }

    #[test]
    fn matching_cluster_plans_nothing() {
        let specs = parse(FILE).expect("parses");
        let (changes, drift) = plan(&specs, &actual_from(&specs));
        assert!(changes.is_empty(), "{changes:?}");
        assert!(drift.is_empty());
    }

    #[test]
    fn plan_creates_grows_and_reconfigures_but_never_shrinks() {
        let specs = parse(FILE).expect("parses");
        let mut actual = actual_from(&specs);
        actual.remove("out.v1");
        let dlt = actual.get_mut("in.v1.dlt").expect("present");
        dlt.partitions = 2;
        dlt.config.insert("retention.ms".into(), "1".into());
        actual.get_mut("in.v1").expect("present").partitions = 9;

        let (changes, drift) = plan(&specs, &actual);
        assert!(changes.contains(&Change::AddPartitions {
            topic: "in.v1.dlt".into(),
            from: 2,
            to: 6
        }));
        assert!(changes.contains(&Change::SetConfig {
            topic: "in.v1.dlt".into(),
            key: "retention.ms".into(),
            from: Some("1".into()),
            to: "2592000000".into()
        }));
        assert!(matches!(&changes[..], [.., Change::Create(s)] if s.name == "out.v1"));
        assert_eq!(changes.len(), 3);
        assert_eq!(
            drift,
            vec![Drift::MorePartitions {
                topic: "in.v1".into(),
                declared: 6,
                actual: 9
            }]
        );
    }

    #[test]
    fn invalid_files_are_rejected_with_a_reason() {
        let dup = FILE.replace("out.v1", "in.v1.dlt");
        assert!(parse(&dup)
            .unwrap_err()
            .to_string()
            .contains("declared twice"));
        let zero = FILE.replace("partitions: 3", "partitions: 0");
        assert!(parse(&zero).unwrap_err().to_string().contains("at least 1"));
        assert!(parse("topics: [").is_err());
    }

    #[test]
    fn the_project_topics_file_is_valid() {
        let dir = std::env::var("CARGO_MANIFEST_DIR")
            .unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").into());
        let topics_file = format!("{dir}/../../topics.yaml");
        let path = Path::new(&topics_file);
        let specs = load(path).expect("topics.yaml loads");
        for env in ["local", "cluster"] {
            load_for(path, env).expect("every environment of topics.yaml loads");
        }
        for consumed in [
            "order.lifecycle.v1",
            "inventory.schedule.v1",
            "inventory.stock-change.v1",
        ] {
            let source = specs.iter().find(|s| s.name == consumed).expect("declared");
            let dlt = specs
                .iter()
                .find(|s| s.dead_letter_of.as_deref() == Some(consumed))
                .expect("has a dead-letter topic");
            assert_eq!(dlt.partitions, source.partitions);
            assert_eq!(dlt.name, crate::deadletter::dead_letter_topic(consumed));
        }
        assert!(specs.iter().any(|s| s.name == "inventory.lifecycle.v1"));
    }
}
