//! Helpers of the dead-letter tests. They talk to the real stack started by
//! `scripts/stack up` (Kafka, the schema registry, MariaDB), configured like the binary:
//! defaults overridden by `STOCKSVR__...` variables. Every test has its own database,
//! topics and consumer groups.
#![allow(dead_code)]

use futures::future::BoxFuture;
use futures::FutureExt;
use rdkafka::message::{OwnedMessage, Timestamp};
use sqlx::MySqlPool;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use stocksvr_dead_letter::Parker;
use stocksvr_pipeline::catalog::Catalog;
use stocksvr_pipeline::codec::AvroCodec;
use stocksvr_pipeline::config::InfraSettings;
use stocksvr_pipeline::consumer::{self, Applied, Failure, Handler, Record};
use stocksvr_pipeline::deadletter::{self, ErrorClass};
use stocksvr_pipeline::kafka;
use stocksvr_pipeline::producer::Producer;
use stocksvr_pipeline::topics::TopicSpec;
use tokio::sync::watch;

pub use stocksvr_test_support::{unique, TestDb, TestTopic};

pub fn settings() -> InfraSettings {
    stocksvr_test_support::infra()
}

/// A new database with every migration applied, dropped with the guard.
pub async fn fresh_database() -> TestDb {
    TestDb::migrated().await
}

/// As [`fresh_database`], with the database's URL.
pub async fn fresh_database_with_url() -> (String, TestDb) {
    let db = TestDb::migrated().await;
    (db.url.clone(), db)
}

/// A source topic `<t>` and its dead-letter topic `<t>.dlt`, 2 partitions each, deleted
/// with the guard.
pub struct TopicPair {
    pub topic: String,
    pub dlt: String,
    _guards: (TestTopic, TestTopic),
}

pub async fn topic_pair() -> TopicPair {
    let source = TestTopic::new("dlq-test", 2).await;
    let dlt = TestTopic::named(&deadletter::dead_letter_topic(&source.name), 2).await;
    TopicPair {
        topic: source.name.clone(),
        dlt: dlt.name.clone(),
        _guards: (source, dlt),
    }
}

pub fn producer() -> Producer {
    kafka::producer(&settings().kafka, "dlq-test").expect("producer")
}

/// The record a processor failed on, as the loop holds it.
pub fn original(
    topic: &str,
    partition: i32,
    offset: i64,
    key: Option<&[u8]>,
    value: Option<&[u8]>,
) -> OwnedMessage {
    OwnedMessage::new(
        value.map(<[u8]>::to_vec),
        key.map(<[u8]>::to_vec),
        topic.to_string(),
        Timestamp::CreateTime(1_700_000_000_123),
        partition,
        offset,
        None,
    )
}

/// Dead-letters `message` as the shared loop does; returns the dead letter's coordinates.
pub async fn send_dead_letter(message: &OwnedMessage, error: &str) -> (String, i32, i64) {
    send_dead_letter_as(message, "stocksvr.order-lifecycle", error).await
}

/// [`send_dead_letter`] as written by the consumer group `group` (another deployment's, say).
pub async fn send_dead_letter_as(
    message: &OwnedMessage,
    group: &str,
    error: &str,
) -> (String, i32, i64) {
    deadletter::send(
        &producer(),
        message,
        group,
        "order-lifecycle",
        ErrorClass::Invalid,
        error,
    )
    .await
    .expect("dead letter acknowledged")
}

/// Counts what the parker answered, so a test knows when a run has seen everything.
struct Counting {
    inner: Parker,
    seen: Arc<Mutex<Vec<Applied>>>,
}

impl Handler for Counting {
    fn handle<'a>(
        &'a self,
        batch: &'a [Record],
    ) -> BoxFuture<'a, Result<Vec<Result<Applied, Failure>>, Failure>> {
        async move {
            let results = self.inner.handle(batch).await?;
            let mut seen = self.seen.lock().expect("not poisoned");
            seen.extend(results.iter().filter_map(|r| r.as_ref().ok().copied()));
            Ok(results)
        }
        .boxed()
    }
}

/// Runs the dead-letter processor from a fresh consumer group over `<t>.dlt` until it has
/// handled `expected` records, stops it through the watch channel and returns what the
/// parker answered for each record.
pub async fn run_processor(pool: &MySqlPool, source: &str, expected: usize) -> Vec<Applied> {
    let mut settings = settings();
    settings.kafka.group_prefix = unique("dlq-test-group");
    let spec = |name: String, of: Option<String>| TopicSpec {
        name,
        partitions: 2,
        replication_factor: 1,
        config: Default::default(),
        dead_letter_of: of,
    };
    let config = stocksvr_dead_letter::loop_config(&[
        spec(source.to_string(), None),
        spec(
            deadletter::dead_letter_topic(source),
            Some(source.to_string()),
        ),
    ]);
    assert_eq!(config.topics, [deadletter::dead_letter_topic(source)]);
    let codec = AvroCodec::new(
        &settings.registry,
        Arc::new(Catalog::embedded().expect("catalog")),
    )
    .expect("codec");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let handler = Arc::new(Counting {
        inner: Parker::new(pool.clone(), "stocksvr"),
        seen: seen.clone(),
    });
    let (stop_tx, stop_rx) = watch::channel(false);
    let kafka_settings = settings.kafka.clone();
    let run = tokio::spawn(async move {
        consumer::run(&kafka_settings, codec, config, handler, stop_rx).await
    });
    let handled = stocksvr_test_support::eventually(Duration::from_secs(60), || async {
        assert!(!run.is_finished(), "the processor stopped early");
        seen.lock().expect("not poisoned").len() >= expected
    })
    .await;
    assert!(
        handled,
        "the processor handled {} of {expected} dead letters within 60 s",
        seen.lock().expect("not poisoned").len()
    );
    stop_tx.send(true).expect("processor listening");
    run.await
        .expect("processor task")
        .expect("processor stops cleanly");
    let seen = seen.lock().expect("not poisoned").clone();
    seen
}

/// Reads the record at `partition`/`offset` of `topic`.
pub fn read_at(topic: &str, partition: i32, offset: i64) -> OwnedMessage {
    stocksvr_test_support::read_at(topic, partition, offset, Duration::from_secs(20))
}

/// The value of header `name` of `message`, as text.
pub fn header(message: &OwnedMessage, name: &str) -> Option<String> {
    use rdkafka::message::{Headers, Message};
    message
        .headers()?
        .iter()
        .find(|h| h.key == name)
        .and_then(|h| h.value)
        .map(|v| String::from_utf8_lossy(v).into_owned())
}
