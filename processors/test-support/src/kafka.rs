//! Topics of the test's own on the stack's Kafka, deleted when the test ends.
//!
//! A new consumer group reads a topic from the earliest offset, so a test reading the shared
//! topics would read every event any earlier run left there. A [`TestNamespace`] gives the test
//! every topic of `topics.yaml` (and its dead-letter topics) under a namespace of its own,
//! plus a consumer-group prefix of its own.

use crate::{block_on_cleanup, infra, unique};
use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::OwnedMessage;
use rdkafka::{Message, TopicPartitionList};
use std::time::{Duration, Instant};
use stocksvr_pipeline::config::KafkaSettings;
use stocksvr_pipeline::{kafka, topics};

/// Every topic of `topics.yaml` inside a namespace of the test's own.
pub struct TestNamespace {
    /// The namespace, also the consumer-group prefix.
    pub name: String,
    /// The stack's Kafka settings with this namespace and group prefix.
    pub kafka: KafkaSettings,
    topics: Vec<String>,
}

impl TestNamespace {
    /// Creates the topics with the partition counts of `topics.yaml`.
    pub async fn new() -> Self {
        Self::with_partitions(None).await
    }

    /// A namespace whose topics are not created yet (a test that runs `stocksvr topics
    /// apply` itself); whatever topics it gets are deleted with the guard all the same.
    pub fn unapplied() -> Self {
        let name = unique("t");
        let kafka = Self::settings_for(&name);
        let topics = topics::for_deployment(&kafka)
            .expect("topics.yaml loads")
            .into_iter()
            .map(|s| s.name)
            .collect();
        Self {
            name,
            kafka,
            topics,
        }
    }

    fn settings_for(name: &str) -> KafkaSettings {
        let mut kafka = infra().kafka;
        kafka.topic_namespace = name.to_string();
        kafka.group_prefix = name.to_string();
        kafka.topics_file = crate::repo_root().join("topics.yaml").display().to_string();
        kafka
    }

    /// Creates the topics, every one with `partitions` partitions when given (fewer
    /// partitions make a test's consumers settle faster on a small machine).
    pub async fn with_partitions(partitions: Option<i32>) -> Self {
        let name = unique("t");
        let kafka = Self::settings_for(&name);
        let mut specs = topics::for_deployment(&kafka).expect("topics.yaml loads");
        if let Some(p) = partitions {
            for spec in &mut specs {
                spec.partitions = p;
            }
        }
        topics::apply(&kafka, &specs)
            .await
            .expect("the test namespace's topics are created");
        let topics = specs.into_iter().map(|s| s.name).collect();
        Self {
            name,
            kafka,
            topics,
        }
    }

    /// This namespace's name of the declared topic `logical`.
    pub fn topic(&self, logical: &str) -> String {
        self.kafka.topic(logical)
    }

    /// The variables that put a child `stocksvr` into this namespace.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("STOCKSVR__KAFKA__TOPIC_NAMESPACE", self.name.clone()),
            ("STOCKSVR__KAFKA__GROUP_PREFIX", self.name.clone()),
        ]
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        let (kafka, topics, prefix) = (self.kafka.clone(), self.topics.clone(), self.name.clone());
        block_on_cleanup(format!("topic namespace {prefix}"), async move {
            delete_groups(&kafka, &prefix).await;
            delete_topics(&kafka, &topics).await
        });
    }
}

/// One topic of the test's own, deleted when the test ends.
pub struct TestTopic {
    pub name: String,
}

impl TestTopic {
    /// A topic named `<prefix>_<unique>`.
    pub async fn new(prefix: &str, partitions: i32) -> Self {
        Self::named(&unique(prefix), partitions).await
    }

    /// A guard for a topic the test has something else create (the binary, say): nothing
    /// is created here, the topic is deleted with the guard.
    pub fn adopt(name: &str) -> Self {
        Self {
            name: name.to_string(),
        }
    }

    /// A topic named exactly `name` (e.g. the `.dlt` of another test topic).
    pub async fn named(name: &str, partitions: i32) -> Self {
        let name = name.to_string();
        let admin = kafka::admin_client(&infra().kafka).expect("admin client");
        let topic = NewTopic::new(&name, partitions, TopicReplication::Fixed(1));
        let results = admin
            .create_topics(
                [&topic],
                &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
            )
            .await
            .expect("create_topics answers");
        for r in results {
            r.expect("topic created");
        }
        Self { name }
    }
}

impl Drop for TestTopic {
    fn drop(&mut self) {
        let name = self.name.clone();
        block_on_cleanup(format!("topic {name}"), async move {
            delete_topics(&infra().kafka, &[name]).await
        });
    }
}

async fn delete_topics(kafka: &KafkaSettings, topics: &[String]) -> Result<(), String> {
    let admin = kafka::admin_client(kafka).map_err(|e| e.to_string())?;
    let names: Vec<&str> = topics.iter().map(String::as_str).collect();
    let results = admin
        .delete_topics(
            &names,
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
        )
        .await
        .map_err(|e| e.to_string())?;
    for r in results {
        r.map_err(|(topic, code)| format!("{topic}: {code}"))?;
    }
    Ok(())
}

/// Deletes the consumer groups of a test namespace (best effort: a group with members left
/// is refused and expires with the broker's offset retention).
async fn delete_groups(kafka: &KafkaSettings, prefix: &str) {
    let Ok(consumer) = kafka::client_config(kafka, "test-cleanup").create::<BaseConsumer>() else {
        return;
    };
    let groups: Vec<String> = match consumer.fetch_group_list(None, Duration::from_secs(5)) {
        Ok(list) => list
            .groups()
            .iter()
            .map(|g| g.name().to_string())
            .filter(|g| g.starts_with(&format!("{prefix}.")))
            .collect(),
        Err(_) => return,
    };
    if groups.is_empty() {
        return;
    }
    if let Ok(admin) = kafka::admin_client(kafka) {
        let names: Vec<&str> = groups.iter().map(String::as_str).collect();
        let _ = admin
            .delete_groups(
                &names,
                &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
            )
            .await;
    }
}

/// The record at `partition`/`offset` of `topic`, waiting up to `timeout`.
pub fn read_at(topic: &str, partition: i32, offset: i64, timeout: Duration) -> OwnedMessage {
    let consumer: BaseConsumer = kafka::client_config(&infra().kafka, "test-reader")
        .set("group.id", unique("test-reader"))
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, rdkafka::Offset::Offset(offset))
        .expect("valid offset");
    consumer.assign(&tpl).expect("assign");
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        match consumer.poll(Duration::from_millis(500)) {
            Some(Ok(m)) if m.offset() == offset => return m.detach(),
            Some(Ok(_)) | None => continue,
            Some(Err(e)) => panic!("reading {topic}/{partition}@{offset}: {e}"),
        }
    }
    panic!("no record at {topic}/{partition}@{offset} within {timeout:?}");
}

/// Every record of `topic` from the earliest offset, read until no record arrived for
/// `quiet` (or `limit` passed).
pub fn records_of(topic: &str, quiet: Duration, limit: Duration) -> Vec<OwnedMessage> {
    let consumer: BaseConsumer = kafka::client_config(&infra().kafka, "test-finder")
        .set("group.id", unique("test-finder"))
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .create()
        .expect("consumer");
    consumer.subscribe(&[topic]).expect("subscribe");
    let started = Instant::now();
    let mut last = Instant::now();
    let mut out = Vec::new();
    while started.elapsed() < limit && (out.is_empty() || last.elapsed() < quiet) {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(200)) {
            out.push(m.detach());
            last = Instant::now();
        }
    }
    out
}
