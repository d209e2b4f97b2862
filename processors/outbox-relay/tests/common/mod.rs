//! Fixtures against the real stack: a fresh database and fresh 3-partition topics per test,
//! outbox rows built from `schemas/examples`, and a consumer that reads a topic to its end.

#![allow(dead_code)] // each test binary uses a different subset

use anyhow::{bail, Context, Result};
use chrono::NaiveDateTime;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};
use serde_json::Value as Json;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use stocksvr_outbox_relay::{OutboxRelay, RelayConfig, EVENT_ID_HEADER, UNSENT, UNSENT_CODES};
use stocksvr_pipeline::catalog::Catalog;
use stocksvr_pipeline::codec::AvroCodec;
use stocksvr_pipeline::config::InfraSettings;
use stocksvr_store::outbox::insert_outbox;
use stocksvr_store::outbox::NewOutbox;
use stocksvr_test_support::{TestDb, TestTopic};

pub const PARTITIONS: i32 = 3;

/// Unique per call within and across test processes.
pub fn unique() -> String {
    stocksvr_test_support::unique("relay")
}

pub struct Stack {
    pub settings: InfraSettings,
    pub pool: sqlx::MySqlPool,
    pub topic: String,
    pub codec: AvroCodec,
    _db: TestDb,
    _topic: TestTopic,
}

impl Stack {
    /// A fresh database (migrated) and a fresh topic.
    pub async fn new() -> Result<Self> {
        let settings = stocksvr_test_support::infra();
        let db = TestDb::migrated().await;
        let pool = db.pool.clone();
        let test_topic = TestTopic::new("outbox-relay-test", PARTITIONS).await;
        let topic = test_topic.name.clone();
        let codec = AvroCodec::new(&settings.registry, Arc::new(Catalog::embedded()?))?;
        Ok(Self {
            settings,
            pool,
            topic,
            codec,
            _db: db,
            _topic: test_topic,
        })
    }

    pub fn relay(&self, config: RelayConfig) -> Result<OutboxRelay> {
        let producer = stocksvr_pipeline::kafka::producer(&self.settings.kafka, "outbox-relay")?;
        Ok(OutboxRelay::new(
            self.pool.clone(),
            producer,
            self.codec.clone(),
            config,
        )?)
    }

    /// An outbox row for `example` (a file stem in schemas/examples) on this test's topic,
    /// with its own event id.
    pub fn row(&self, example: &str) -> Result<NewOutbox> {
        let mut payload = example_json(example)?;
        let event_id = format!("evt_{}", unique());
        payload["event_id"] = Json::String(event_id.clone());
        let event_type = payload["event_type"]
            .as_str()
            .context("example has event_type")?
            .to_string();
        let partition_key = payload["partition_key"]
            .as_str()
            .context("example has partition_key")?
            .to_string();
        Ok(NewOutbox {
            event_id,
            aggregate_id: 1,
            event_type,
            topic: self.topic.clone(),
            partition_key,
            payload,
            body: None,
        })
    }

    /// Commits `rows` in one transaction, as a service would.
    pub async fn insert(&self, rows: &[NewOutbox]) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        insert_outbox(&mut tx, rows).await?;
        tx.commit().await?;
        Ok(())
    }

    pub async fn state(&self, event_id: &str) -> Result<RowState> {
        let (status, retry_count, last_error, sent_at, due): (
            i8,
            u32,
            Option<String>,
            Option<NaiveDateTime>,
            bool,
        ) = sqlx::query_as(
            "SELECT status, retry_count, last_error, sent_at, next_retry_at > NOW(3) \
             FROM inventory_outbox WHERE event_id = ?",
        )
        .bind(event_id)
        .fetch_one(&self.pool)
        .await?;
        Ok(RowState {
            status,
            retry_count,
            last_error,
            sent_at,
            retry_in_future: due,
        })
    }

    pub async fn count(&self, status: i8) -> Result<i64> {
        Ok(
            sqlx::query_scalar("SELECT COUNT(*) FROM inventory_outbox WHERE status = ?")
                .bind(status)
                .fetch_one(&self.pool)
                .await?,
        )
    }

    /// True when the row counts as sent: at or below the mark and still PENDING (the
    /// leader's scan published it), or SENT (the retry path did).
    pub async fn is_sent(&self, event_id: &str) -> Result<bool> {
        let sql = format!(
            "SELECT NOT {UNSENT} FROM inventory_outbox o JOIN inventory_outbox_relay c \
             ON c.id = 1 WHERE o.event_id = ?"
        );
        let sent: bool = UNSENT_CODES
            .iter()
            .fold(sqlx::query_scalar(&sql), |q, code| q.bind(code))
            .bind(event_id)
            .fetch_one(&self.pool)
            .await?;
        Ok(sent)
    }

    /// Rows not sent yet.
    pub async fn unsent(&self) -> Result<i64> {
        let sql = format!(
            "SELECT COUNT(*) FROM inventory_outbox o JOIN inventory_outbox_relay c \
             ON c.id = 1 WHERE {UNSENT}"
        );
        Ok(UNSENT_CODES
            .iter()
            .fold(sqlx::query_scalar(&sql), |q, code| q.bind(code))
            .fetch_one(&self.pool)
            .await?)
    }

    /// The persisted high-water mark.
    pub async fn hwm(&self) -> Result<u64> {
        Ok(
            sqlx::query_scalar("SELECT hwm FROM inventory_outbox_relay WHERE id = 1")
                .fetch_one(&self.pool)
                .await?,
        )
    }

    /// The outbox id of a row.
    pub async fn id_of(&self, event_id: &str) -> Result<u64> {
        Ok(
            sqlx::query_scalar("SELECT id FROM inventory_outbox WHERE event_id = ?")
                .bind(event_id)
                .fetch_one(&self.pool)
                .await?,
        )
    }

    /// The leader's lease runs out now, as if its relay had died.
    pub async fn expire_lease(&self) -> Result<()> {
        sqlx::query(
            "UPDATE inventory_outbox_relay SET lease_until = NOW(3) - INTERVAL 1 SECOND \
             WHERE id = 1",
        )
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Runs `sql` with the event id bound as its only parameter.
    pub async fn exec(&self, sql: &str, event_id: &str) -> Result<()> {
        let done = sqlx::query(sql).bind(event_id).execute(&self.pool).await?;
        if done.rows_affected() != 1 {
            bail!("{sql} changed {} rows", done.rows_affected());
        }
        Ok(())
    }

    /// Every record of the topic, read from the beginning to the high watermarks.
    pub async fn read_topic(&self) -> Result<Vec<Record>> {
        read_topic(&self.settings, &self.topic).await
    }
}

#[derive(Debug, Clone)]
pub struct RowState {
    pub status: i8,
    pub retry_count: u32,
    pub last_error: Option<String>,
    pub sent_at: Option<NaiveDateTime>,
    pub retry_in_future: bool,
}

#[derive(Debug, Clone)]
pub struct Record {
    pub partition: i32,
    pub key: Option<String>,
    pub event_ids: Vec<String>,
    pub payload: Option<Vec<u8>>,
}

pub fn example_json(stem: &str) -> Result<Json> {
    Ok(stocksvr_test_support::example(stem))
}

pub async fn read_topic(settings: &InfraSettings, topic: &str) -> Result<Vec<Record>> {
    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", &settings.kafka.brokers)
        .set("group.id", format!("outbox-relay-test-{}", unique()))
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .create()?;
    let mut ends = HashMap::new();
    let mut assignment = TopicPartitionList::new();
    for partition in 0..PARTITIONS {
        let (_, high) = consumer.fetch_watermarks(topic, partition, Duration::from_secs(10))?;
        if high > 0 {
            ends.insert(partition, high);
            assignment.add_partition_offset(topic, partition, Offset::Beginning)?;
        }
    }
    if ends.is_empty() {
        return Ok(Vec::new());
    }
    consumer.assign(&assignment)?;
    let mut records = Vec::new();
    let mut done = HashSet::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while done.len() < ends.len() {
        let message = tokio::time::timeout_at(deadline, consumer.recv())
            .await
            .context("topic not read to its end within 30 s")??;
        let event_ids = message
            .headers()
            .map(|h| {
                h.iter()
                    .filter(|h| h.key == EVENT_ID_HEADER)
                    .filter_map(|h| h.value)
                    .map(|v| String::from_utf8_lossy(v).into_owned())
                    .collect()
            })
            .unwrap_or_default();
        records.push(Record {
            partition: message.partition(),
            key: message
                .key()
                .map(|k| String::from_utf8_lossy(k).into_owned()),
            event_ids,
            payload: message.payload().map(<[u8]>::to_vec),
        });
        if message.offset() + 1 >= ends[&message.partition()] {
            done.insert(message.partition());
        }
    }
    Ok(records)
}

/// Timings for tests: quick polls, a short publish timeout and lease.
pub fn fast_config() -> RelayConfig {
    RelayConfig {
        min_poll: Duration::from_millis(20),
        max_poll: Duration::from_millis(200),
        claim_lease: Duration::from_secs(20),
        publish_timeout: Duration::from_secs(15),
        ..RelayConfig::default()
    }
}
