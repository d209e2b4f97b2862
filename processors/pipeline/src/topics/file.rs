//! `topics.yaml` read and expanded: the environment's replication and
//! `min.insync.replicas`, the defaults merged into each topic, a dead-letter topic beside
//! every topic a processor consumes, and the deployment's namespace in front of every name.

use super::{TopicSpec, TopicsError};
use crate::config::KafkaSettings;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::Path;

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
