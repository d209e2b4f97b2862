//! The cluster side of `stocksvr topics`: reads what the cluster has and applies the plan
//! (creates topics, raises partition counts, alters configs).

use super::{plan, ActualTopic, Change, Drift, TopicSpec, TopicsError};
use crate::config::KafkaSettings;
use crate::kafka;
use rdkafka::admin::{
    AdminClient, AdminOptions, AlterConfig, ConfigSource, NewPartitions, NewTopic,
    ResourceSpecifier, TopicReplication,
};
use std::collections::BTreeMap;
use std::time::Duration;
use stocksvr_core::retry::{wait_until, RetryPolicy};

/// Reads partition counts, replication factors and configs of the declared topics.
pub async fn describe_cluster(
    settings: &KafkaSettings,
    desired: &[TopicSpec],
) -> Result<BTreeMap<String, ActualTopic>, TopicsError> {
    let metadata = kafka::fetch_metadata(settings).await?;
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
    let admin = kafka::admin_client(settings)?;
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
    let visible = wait_until(
        settings.request_timeout(),
        RetryPolicy::fixed(Duration::from_millis(100)),
        || async {
            let metadata = match kafka::fetch_metadata(settings).await {
                Ok(metadata) => metadata,
                Err(e) => return Some(Err(TopicsError::from(e))),
            };
            created
                .iter()
                .all(|name| {
                    metadata.topics().iter().any(|t| {
                        t.name() == name && t.error().is_none() && !t.partitions().is_empty()
                    })
                })
                .then_some(Ok(()))
        },
    )
    .await;
    visible.unwrap_or_else(|| {
        Err(TopicsError::Invalid(format!(
            "created topics not visible in metadata after {} ms: {created:?}",
            settings.request_timeout_ms
        )))
    })
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
    let admin = kafka::admin_client(settings)?;
    let options = AdminOptions::new()
        .request_timeout(Some(settings.request_timeout()))
        .operation_timeout(Some(settings.request_timeout()));
    create_topics(settings, &admin, &options, &mut changes).await?;
    add_partitions(&admin, &options, &changes).await?;
    alter_configs(&admin, &options, &changes, &actual).await?;
    Ok((changes, drift))
}

type Admin = AdminClient<crate::kafka::KafkaContext>;

/// Creates the missing topics and waits until the cluster's metadata shows them. A topic a
/// concurrent `apply` created meanwhile is dropped from `changes`: not this run's change.
async fn create_topics(
    settings: &KafkaSettings,
    admin: &Admin,
    options: &AdminOptions,
    changes: &mut Vec<Change>,
) -> Result<(), TopicsError> {
    let new_topics: Vec<NewTopic> = changes
        .iter()
        .filter_map(|c| match c {
            Change::Create(spec) => Some(spec),
            _ => None,
        })
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
    if new_topics.is_empty() {
        return Ok(());
    }
    let mut created = Vec::new();
    let mut raced = Vec::new();
    for result in admin.create_topics(new_topics.iter(), options).await? {
        match result {
            Ok(topic) => created.push(topic),
            // A concurrent `apply` created it between describe and create: not our change.
            Err((topic, rdkafka::types::RDKafkaErrorCode::TopicAlreadyExists)) => raced.push(topic),
            Err((topic, code)) => {
                return Err(TopicsError::Refused {
                    operation: "create_topics",
                    topic,
                    code: code.to_string(),
                })
            }
        }
    }
    changes.retain(|c| !matches!(c, Change::Create(s) if raced.contains(&s.name)));
    wait_until_visible(settings, &created).await
}

/// Raises the partition counts the plan asks to raise.
async fn add_partitions(
    admin: &Admin,
    options: &AdminOptions,
    changes: &[Change],
) -> Result<(), TopicsError> {
    let grows: Vec<NewPartitions> = changes
        .iter()
        .filter_map(|c| match c {
            Change::AddPartitions { topic, to, .. } => {
                Some(NewPartitions::new(topic, *to as usize))
            }
            _ => None,
        })
        .collect();
    if grows.is_empty() {
        return Ok(());
    }
    for result in admin.create_partitions(grows.iter(), options).await? {
        if let Err((topic, code)) = result {
            return Err(TopicsError::Refused {
                operation: "create_partitions",
                topic,
                code: code.to_string(),
            });
        }
    }
    Ok(())
}

/// Sets the declared configs. AlterConfigs (non-incremental) replaces a topic's whole
/// dynamic config, so each request carries the topic's current overrides plus the declared
/// values.
async fn alter_configs(
    admin: &Admin,
    options: &AdminOptions,
    changes: &[Change],
    actual: &BTreeMap<String, ActualTopic>,
) -> Result<(), TopicsError> {
    let mut altered: BTreeMap<&str, BTreeMap<String, String>> = BTreeMap::new();
    for change in changes {
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
    if altered.is_empty() {
        return Ok(());
    }
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
        .alter_configs(alters.iter(), options)
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
    Ok(())
}
