//! `topics.yaml` is the one place topics are declared. This module reads it, compares it
//! with the cluster and applies the difference: it creates what is missing, raises
//! partition counts and updates configs. It never deletes a topic and never shrinks one
//! (Kafka cannot), it reports those as drift instead.

use crate::config::KafkaSettings;
use rdkafka::admin::{
    AdminOptions, AlterConfig, ConfigSource, NewPartitions, NewTopic, ResourceSpecifier,
    TopicReplication,
};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

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

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TopicsFile {
    /// The environment used when `kafka.topics_environment` is empty.
    environment: String,
    environments: BTreeMap<String, Environment>,
    #[serde(default)]
    defaults: BTreeMap<String, String>,
    dead_letter: DeadLetterRule,
    topics: Vec<TopicDecl>,
}

/// Replication of every topic in one environment (`local`: one broker; `cluster`: three).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Environment {
    replication_factor: i32,
    /// Written into every topic's `min.insync.replicas` (a topic's own `config` may override
    /// it). With `acks=all` a write is acknowledged once this many replicas have it.
    min_insync_replicas: i32,
}

/// Dead-letter topics are derived, not declared, so each one is guaranteed to exist with
/// its source topic's partition count.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DeadLetterRule {
    suffix: String,
    #[serde(default)]
    config: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TopicDecl {
    name: String,
    partitions: i32,
    #[serde(default)]
    #[allow(dead_code)] // documentation for readers of the file; the key is set by producers
    key: Option<String>,
    #[serde(default)]
    #[allow(dead_code)]
    description: Option<String>,
    /// Set on every topic a stocksvr processor consumes.
    #[serde(default)]
    dead_letter: bool,
    #[serde(default)]
    config: BTreeMap<String, String>,
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

/// The prefix that turns the topic names of the topics file into one deployment's
/// (`kafka.topic_namespace`): several deployments, tests or benchmarks share a cluster
/// without reading each other's records. Empty: the names as declared.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Namespace(String);

impl Namespace {
    pub fn new(namespace: &str) -> Self {
        Self(namespace.to_string())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The deployment's name of the declared topic `logical`.
    pub fn topic(&self, logical: &str) -> String {
        if self.0.is_empty() {
            logical.to_string()
        } else {
            format!("{}.{logical}", self.0)
        }
    }
}

/// The topics of one deployment: the file named by `kafka.topics_file`, every name (and the
/// source topic of every dead-letter topic) inside the deployment's namespace.
pub fn for_deployment(settings: &KafkaSettings) -> Result<Vec<TopicSpec>, TopicsError> {
    let ns = settings.namespace();
    Ok(load_for(
        Path::new(&settings.topics_file),
        &settings.topics_environment,
    )?
    .into_iter()
    .map(|spec| TopicSpec {
        name: ns.topic(&spec.name),
        dead_letter_of: spec.dead_letter_of.map(|t| ns.topic(&t)),
        ..spec
    })
    .collect())
}

/// Reads and expands the file for its default environment: defaults merged into each
/// topic, dead-letter topics added.
pub fn load(path: &Path) -> Result<Vec<TopicSpec>, TopicsError> {
    load_for(path, "")
}

/// As [`load`], for the environment `environment` of the file (empty: the file's default).
pub fn load_for(path: &Path, environment: &str) -> Result<Vec<TopicSpec>, TopicsError> {
    let text = std::fs::read_to_string(path).map_err(|source| TopicsError::Read {
        path: path.display().to_string(),
        source,
    })?;
    parse_for(&text, environment).map_err(|e| match e {
        TopicsError::Parse { source, .. } => TopicsError::Parse {
            path: path.display().to_string(),
            source,
        },
        other => other,
    })
}

/// Parses the file for its default environment.
pub fn parse(text: &str) -> Result<Vec<TopicSpec>, TopicsError> {
    parse_for(text, "")
}

/// Parses the file for `environment` (empty: the file's `environment`).
pub fn parse_for(text: &str, environment: &str) -> Result<Vec<TopicSpec>, TopicsError> {
    let file: TopicsFile = serde_yaml::from_str(text).map_err(|source| TopicsError::Parse {
        path: "<text>".into(),
        source,
    })?;
    let env_name = if environment.is_empty() {
        file.environment.as_str()
    } else {
        environment
    };
    let Some(env) = file.environments.get(env_name) else {
        return Err(TopicsError::Invalid(format!(
            "environment {env_name:?} is not declared (declared: {})",
            file.environments
                .keys()
                .map(String::as_str)
                .collect::<Vec<_>>()
                .join(", ")
        )));
    };
    if env.replication_factor < 1 {
        return Err(TopicsError::Invalid(format!(
            "environment {env_name}: replication_factor must be at least 1"
        )));
    }
    if env.min_insync_replicas < 1 || env.min_insync_replicas > env.replication_factor {
        return Err(TopicsError::Invalid(format!(
            "environment {env_name}: min_insync_replicas must be from 1 to replication_factor"
        )));
    }
    let mut defaults = file.defaults.clone();
    defaults.insert(
        "min.insync.replicas".into(),
        env.min_insync_replicas.to_string(),
    );
    let mut specs = Vec::new();
    for decl in &file.topics {
        if decl.partitions < 1 {
            return Err(TopicsError::Invalid(format!(
                "{}: partitions must be at least 1",
                decl.name
            )));
        }
        let mut config = defaults.clone();
        config.extend(decl.config.clone());
        specs.push(TopicSpec {
            name: decl.name.clone(),
            partitions: decl.partitions,
            replication_factor: env.replication_factor,
            config: config.clone(),
            dead_letter_of: None,
        });
        if decl.dead_letter {
            let mut dlt_config = config;
            dlt_config.extend(file.dead_letter.config.clone());
            specs.push(TopicSpec {
                name: format!("{}{}", decl.name, file.dead_letter.suffix),
                partitions: decl.partitions,
                replication_factor: env.replication_factor,
                config: dlt_config,
                dead_letter_of: Some(decl.name.clone()),
            });
        }
    }
    let mut names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
    names.sort_unstable();
    if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
        return Err(TopicsError::Invalid(format!(
            "topic {} declared twice",
            w[0]
        )));
    }
    Ok(specs)
}

/// What `apply` would do, and what it cannot fix. Pure, so the rules are unit-tested.
pub fn plan(
    desired: &[TopicSpec],
    actual: &BTreeMap<String, ActualTopic>,
) -> (Vec<Change>, Vec<Drift>) {
    let mut changes = Vec::new();
    let mut drift = Vec::new();
    for spec in desired {
        let Some(have) = actual.get(&spec.name) else {
            changes.push(Change::Create(spec.clone()));
            continue;
        };
        if have.partitions < spec.partitions {
            changes.push(Change::AddPartitions {
                topic: spec.name.clone(),
                from: have.partitions,
                to: spec.partitions,
            });
        } else if have.partitions > spec.partitions {
            drift.push(Drift::MorePartitions {
                topic: spec.name.clone(),
                declared: spec.partitions,
                actual: have.partitions,
            });
        }
        if have.replication_factor != spec.replication_factor {
            drift.push(Drift::ReplicationFactor {
                topic: spec.name.clone(),
                declared: spec.replication_factor,
                actual: have.replication_factor,
            });
        }
        for (key, value) in &spec.config {
            let current = have.config.get(key);
            if current != Some(value) {
                changes.push(Change::SetConfig {
                    topic: spec.name.clone(),
                    key: key.clone(),
                    from: current.cloned(),
                    to: value.clone(),
                });
            }
        }
    }
    (changes, drift)
}

/// Reads partition counts, replication factors and configs of the declared topics.
pub async fn describe_cluster(
    settings: &KafkaSettings,
    desired: &[TopicSpec],
) -> Result<BTreeMap<String, ActualTopic>, TopicsError> {
    let metadata = crate::kafka::fetch_metadata(settings).await?;
    let mut actual = BTreeMap::new();
    for topic in metadata.topics() {
        if topic.error().is_some() || !desired.iter().any(|d| d.name == topic.name()) {
            continue;
        }
        let replication_factor = topic
            .partitions()
            .iter()
            .map(|p| p.replicas().len() as i32)
            .max()
            .unwrap_or(0);
        actual.insert(
            topic.name().to_string(),
            ActualTopic {
                partitions: topic.partitions().len() as i32,
                replication_factor,
                ..ActualTopic::default()
            },
        );
    }
    if actual.is_empty() {
        return Ok(actual);
    }
    let admin = crate::kafka::admin_client(settings)?;
    let options = AdminOptions::new().request_timeout(Some(settings.request_timeout()));
    let names: Vec<String> = actual.keys().cloned().collect();
    let specifiers: Vec<ResourceSpecifier> =
        names.iter().map(|n| ResourceSpecifier::Topic(n)).collect();
    let results = admin.describe_configs(specifiers.iter(), &options).await?;
    for (name, result) in names.iter().zip(results) {
        let resource = result.map_err(|code| TopicsError::Refused {
            operation: "describe_configs",
            topic: name.clone(),
            code: code.to_string(),
        })?;
        if let Some(topic) = actual.get_mut(name) {
            for entry in &resource.entries {
                let Some(value) = &entry.value else { continue };
                topic.config.insert(entry.name.clone(), value.clone());
                if matches!(entry.source, ConfigSource::DynamicTopic) {
                    topic
                        .dynamic_config
                        .insert(entry.name.clone(), value.clone());
                }
            }
        }
    }
    Ok(actual)
}

/// A created topic reaches every broker's metadata a moment after CreateTopics returns;
/// waiting for it means the next command (or processor) sees the topic.
async fn wait_until_visible(
    settings: &KafkaSettings,
    created: &[String],
) -> Result<(), TopicsError> {
    let deadline = tokio::time::Instant::now() + settings.request_timeout();
    loop {
        let metadata = crate::kafka::fetch_metadata(settings).await?;
        let visible = created.iter().all(|name| {
            metadata
                .topics()
                .iter()
                .any(|t| t.name() == name && t.error().is_none() && !t.partitions().is_empty())
        });
        if visible {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(TopicsError::Invalid(format!(
                "created topics not visible in metadata after {} ms: {created:?}",
                settings.request_timeout_ms
            )));
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// Carries out the plan. Returns the changes made (empty when the cluster already matches).
pub async fn apply(
    settings: &KafkaSettings,
    desired: &[TopicSpec],
) -> Result<(Vec<Change>, Vec<Drift>), TopicsError> {
    let actual = describe_cluster(settings, desired).await?;
    let (mut changes, drift) = plan(desired, &actual);
    if changes.is_empty() {
        return Ok((changes, drift));
    }
    let admin = crate::kafka::admin_client(settings)?;
    let options = AdminOptions::new()
        .request_timeout(Some(settings.request_timeout()))
        .operation_timeout(Some(settings.request_timeout()));

    let creates: Vec<TopicSpec> = changes
        .iter()
        .filter_map(|c| match c {
            Change::Create(spec) => Some(spec.clone()),
            _ => None,
        })
        .collect();
    if !creates.is_empty() {
        let new_topics: Vec<NewTopic> = creates
            .iter()
            .map(|spec| {
                spec.config.iter().fold(
                    NewTopic::new(
                        &spec.name,
                        spec.partitions,
                        TopicReplication::Fixed(spec.replication_factor),
                    ),
                    |t, (k, v)| t.set(k, v),
                )
            })
            .collect();
        let mut created = Vec::new();
        for result in admin.create_topics(new_topics.iter(), &options).await? {
            match result {
                Ok(topic) => created.push(topic),
                // A concurrent `apply` created it between describe and create: not our change.
                Err((topic, rdkafka::types::RDKafkaErrorCode::TopicAlreadyExists)) => {
                    changes.retain(|c| !matches!(c, Change::Create(s) if s.name == topic));
                }
                Err((topic, code)) => {
                    return Err(TopicsError::Refused {
                        operation: "create_topics",
                        topic,
                        code: code.to_string(),
                    })
                }
            }
        }
        wait_until_visible(settings, &created).await?;
    }

    let grows: Vec<NewPartitions> = changes
        .iter()
        .filter_map(|c| match c {
            Change::AddPartitions { topic, to, .. } => {
                Some(NewPartitions::new(topic, *to as usize))
            }
            _ => None,
        })
        .collect();
    if !grows.is_empty() {
        for result in admin.create_partitions(grows.iter(), &options).await? {
            if let Err((topic, code)) = result {
                return Err(TopicsError::Refused {
                    operation: "create_partitions",
                    topic,
                    code: code.to_string(),
                });
            }
        }
    }

    // AlterConfigs (non-incremental) replaces a topic's whole dynamic config, so each
    // request carries the topic's current overrides plus the declared values.
    let mut altered: BTreeMap<&str, BTreeMap<String, String>> = BTreeMap::new();
    for change in &changes {
        if let Change::SetConfig { topic, key, to, .. } = change {
            let entry = altered.entry(topic.as_str()).or_insert_with(|| {
                actual
                    .get(topic)
                    .map(|a| a.dynamic_config.clone())
                    .unwrap_or_default()
            });
            entry.insert(key.clone(), to.clone());
        }
    }
    if !altered.is_empty() {
        let alters: Vec<AlterConfig> = altered
            .iter()
            .map(|(topic, config)| {
                config.iter().fold(
                    AlterConfig::new(ResourceSpecifier::Topic(topic)),
                    |a, (k, v)| a.set(k, v),
                )
            })
            .collect();
        for (result, topic) in admin
            .alter_configs(alters.iter(), &options)
            .await?
            .into_iter()
            .zip(altered.keys())
        {
            if let Err((_, code)) = result {
                return Err(TopicsError::Refused {
                    operation: "alter_configs",
                    topic: topic.to_string(),
                    code: code.to_string(),
                });
            }
        }
    }
    Ok((changes, drift))
}

#[cfg(test)]
mod tests {
    use super::*;

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
