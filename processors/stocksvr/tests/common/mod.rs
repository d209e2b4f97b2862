//! Shared helpers of the binary's integration tests. They talk to the real stack started by
//! `scripts/stack up` (Kafka, the schema registry, MariaDB, Redis on 127.0.0.1). Each test
//! gets a [`TestEnv`]: a migrated database, a topic namespace and consumer groups of its own,
//! all released when the test ends (see `stocksvr-test-support`).
#![allow(dead_code)]

pub mod api;
pub mod flow;
pub mod server;

use rdkafka::message::OwnedMessage;
use std::process::{Command, Output};
use std::time::Duration;
use stocksvr_pipeline::config::InfraSettings;
#[allow(unused_imports)]
pub use stocksvr_test_support::{repo_root, unique, TestDb, TestNamespace, TestTopic};

pub fn settings() -> InfraSettings {
    stocksvr_test_support::infra()
}

/// The stocksvr binary, run from the repo root so `topics.yaml` resolves.
pub fn stocksvr() -> Command {
    let mut cmd = Command::new(stocksvr_bin());
    cmd.current_dir(repo_root());
    cmd
}

/// Where the binary is: Cargo tells the integration tests; an example (`examples/`, which
/// shares these helpers and gets no such variable) finds it beside its own directory
/// (`target/<profile>/examples/..`), built by the same `cargo build --bin stocksvr --example`.
fn stocksvr_bin() -> std::path::PathBuf {
    if let Some(bin) = option_env!("CARGO_BIN_EXE_stocksvr") {
        return bin.into();
    }
    let example = std::env::current_exe().expect("the example's own path");
    let profile_dir = example
        .parent()
        .and_then(std::path::Path::parent)
        .expect("target/<profile>/examples/<example>");
    profile_dir.join("stocksvr")
}

/// See [`stocksvr_test_support::output_within`].
pub fn output_within(cmd: &mut Command, limit: Duration) -> Output {
    stocksvr_test_support::output_within(cmd, limit)
}

/// Runs the binary (bounded, see [`output_within`]) and returns (exit success, stdout, stderr).
pub fn run(cmd: &mut Command) -> (bool, String, String) {
    let Output {
        status,
        stdout,
        stderr,
    } = output_within(cmd, Duration::from_secs(300));
    (
        status.success(),
        String::from_utf8_lossy(&stdout).into_owned(),
        String::from_utf8_lossy(&stderr).into_owned(),
    )
}

/// What one test owns: a migrated database, every topic of `topics.yaml` in a namespace of
/// its own (2 partitions each), consumer groups and a time-wheel namespace of its own.
pub struct TestEnv {
    pub db: TestDb,
    pub ns: TestNamespace,
    /// Redis time-wheel namespace (`schedule.wheel_namespace`).
    pub wheel: String,
    /// Servers of the test's own (a private MariaDB or Redis it may stop) instead of the
    /// shared stack's: `(STOCKSVR__ variable, value)`.
    pub overrides: Vec<(&'static str, String)>,
    /// One codec and producer for every event the test produces: the codec caches the
    /// schema ids, so a burst of events registers each schema once.
    producing: tokio::sync::OnceCell<Producing>,
}

struct Producing {
    catalog: std::sync::Arc<stocksvr_pipeline::catalog::Catalog>,
    codec: stocksvr_pipeline::codec::AvroCodec,
    producer: stocksvr_pipeline::producer::Producer,
}

impl TestEnv {
    pub async fn new() -> Self {
        Self::with_partitions(2).await
    }

    pub async fn with_partitions(partitions: i32) -> Self {
        let (db, ns) = tokio::join!(
            TestDb::migrated(),
            TestNamespace::with_partitions(Some(partitions))
        );
        let wheel = ns.name.replace('_', "-");
        Self {
            db,
            ns,
            wheel,
            overrides: Vec::new(),
            producing: tokio::sync::OnceCell::new(),
        }
    }

    /// The MySQL URL the service of this test uses.
    pub fn mysql_url(&self) -> String {
        self.overrides
            .iter()
            .find(|(k, _)| *k == "STOCKSVR__MYSQL__URL")
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| self.db.url.clone())
    }

    /// A pool on [`TestEnv::mysql_url`].
    pub fn pool(&self) -> sqlx::MySqlPool {
        stocksvr_store::mysql_pool(&self.mysql_url(), 4, Duration::from_secs(10)).expect("pool")
    }

    /// This test's name of the declared topic `logical`.
    pub fn topic(&self, logical: &str) -> String {
        self.ns.topic(logical)
    }

    /// Consumer group of `processor` in this test.
    pub fn group(&self, processor: &str) -> String {
        format!("{}.{processor}", self.ns.name)
    }

    /// The variables that point a child `stocksvr` at this test's database, topics, groups
    /// and wheel.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        let mut env = self.ns.env();
        env.push(self.db.env());
        env.push(("STOCKSVR__SCHEDULE__WHEEL_NAMESPACE", self.wheel.clone()));
        // No next-day buckets: with the default lead (120 min) a server started in the last
        // two hours of the merchants' day prepares tomorrow's bucket of every dish, a second
        // bucket the tests that count a pass's buckets did not make (three reconcile tests
        // failed so in a CI run when test merchants were in UTC; the noon zone below keeps
        // them far from midnight too). The daily job's own tests call `prepare_days` with
        // their own lead and clock.
        env.push(("STOCKSVR__STOCK_OPS__DAILY_LEAD_MINUTES", "0".to_string()));
        // A merchant without a zone of its own is in the tests' noon zone too, so no test's
        // business day changes while it runs (see `stocksvr_test_support::zone`).
        env.push((
            "STOCKSVR__RESERVATION__DEFAULT_TIMEZONE",
            stocksvr_test_support::zone::zone_name().to_string(),
        ));
        env.extend(self.overrides.iter().cloned());
        env
    }

    /// The binary with [`TestEnv::env`] applied.
    pub fn stocksvr(&self) -> Command {
        let mut cmd = stocksvr();
        cmd.envs(self.env());
        cmd
    }

    /// `stocksvr all` on a free port in this environment, plus `extra` variables.
    pub fn server(&self, extra: &[(&str, &str)]) -> server::Server {
        let mut env: Vec<(String, String)> = self
            .env()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        server::Server::start_with(&env, "all")
    }

    /// A Kafka settings value for producers and consumers of this test's topics.
    pub fn kafka(&self) -> stocksvr_pipeline::config::KafkaSettings {
        self.ns.kafka.clone()
    }
}

/// Reads the record at `partition`/`offset` of `topic`, waiting up to `timeout`.
pub fn read_at(topic: &str, partition: i32, offset: i64, timeout: Duration) -> OwnedMessage {
    stocksvr_test_support::read_at(topic, partition, offset, timeout)
}

/// The first record of `topic` that arrives within `timeout` and matches.
pub fn find_record(
    topic: &str,
    timeout: Duration,
    matches: impl Fn(&OwnedMessage) -> bool,
) -> Option<OwnedMessage> {
    stocksvr_test_support::eventually_some_blocking(timeout, || {
        stocksvr_test_support::records_of(topic, Duration::from_millis(500), Duration::from_secs(5))
            .into_iter()
            .find(|m| matches(m))
    })
}

impl TestEnv {
    /// Produces `data` as a `kind` event of record namespace `record_ns` (e.g.
    /// `io.stocksvr.order`) on its catalog topic in this test's namespace, with the codec a
    /// Java or Python service would use; returns where it landed (partition, offset).
    pub async fn produce(
        &self,
        kind: &str,
        record_ns: &str,
        key: &str,
        data: serde_json::Value,
    ) -> (i32, i64) {
        use chrono::{SecondsFormat, Utc};
        use rdkafka::producer::FutureRecord;
        use std::sync::Arc;
        use stocksvr_pipeline::catalog::Catalog;
        use stocksvr_pipeline::codec::AvroCodec;
        let Producing {
            catalog,
            codec,
            producer,
        } = self
            .producing
            .get_or_init(|| async {
                let kafka = self.kafka();
                let catalog = Arc::new(Catalog::for_deployment(&kafka).expect("catalog"));
                Producing {
                    codec: AvroCodec::new(&settings().registry, catalog.clone()).expect("codec"),
                    catalog,
                    producer: stocksvr_pipeline::kafka::producer(&kafka, "it-producer")
                        .expect("producer"),
                }
            })
            .await;
        let entry = catalog
            .by_name(&format!("{record_ns}.{kind}"))
            .expect("declared")
            .clone();
        let event = serde_json::json!({"event_id": unique(kind), "event_type": kind, "schema_version": 1,
            "occurred_at": Utc::now().to_rfc3339_opts(SecondsFormat::Millis, true), "producer": "it-tests",
            "trace_id": null, "partition_key": key, "data": data});
        let bytes = codec
            .encode_value(
                &entry.full_name,
                stocksvr_pipeline::json::json_to_avro(&event, &entry.parsed).expect("valid event"),
            )
            .await
            .expect("encode");
        let delivery = producer
            .send(
                FutureRecord::to(&entry.topic).key(key).payload(&bytes),
                Duration::from_secs(10),
            )
            .await
            .map_err(|(e, _)| e)
            .expect("produced");
        (delivery.partition, delivery.offset)
    }

    /// An order event (`io.stocksvr.order.<kind>`) keyed by its order id.
    pub async fn order_event(
        &self,
        kind: &str,
        order_id: u64,
        data: serde_json::Value,
    ) -> (i32, i64) {
        self.produce(kind, "io.stocksvr.order", &order_id.to_string(), data)
            .await
    }
}

/// Polls until `group` committed past `offset` of `topic`/`partition`: a restart of the
/// group's processor will not see that record again.
pub async fn wait_for_commit(group: &str, topic: &str, partition: i32, offset: i64) {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let consumer: BaseConsumer =
        stocksvr_pipeline::kafka::client_config(&settings().kafka, "it-committed")
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            .create()
            .expect("consumer");
    let mut tpl = rdkafka::TopicPartitionList::new();
    tpl.add_partition(topic, partition);
    stocksvr_test_support::wait_for(
        &format!("{group} to commit past {topic}/{partition}@{offset}"),
        Duration::from_secs(90),
        || async {
            let committed = consumer
                .committed_offsets(tpl.clone(), Duration::from_secs(5))
                .ok()
                .and_then(|c| {
                    c.find_partition(topic, partition)
                        .and_then(|p| p.offset().to_raw())
                });
            match committed {
                Some(c) if c > offset => Ok(()),
                other => Err(format!("committed {other:?}")),
            }
        },
    )
    .await;
}

/// Polls until `group` has committed the high watermark of every partition of `topic`:
/// everything stored was read and handled.
pub async fn wait_until_caught_up(group: &str, topic: &str, within: Duration) {
    stocksvr_test_support::wait_for(
        &format!("{group} to catch up with {topic}"),
        within,
        || async {
            let partitions =
                stocksvr_pipeline::offsets::show(&settings().kafka, group, Some(topic))
                    .await
                    .expect("offsets");
            let behind: Vec<_> = partitions
                .iter()
                .filter(|p| p.committed != Some(p.high) && p.high > p.low)
                .map(|p| {
                    format!(
                        "{}: committed {:?} high {}",
                        p.partition, p.committed, p.high
                    )
                })
                .collect();
            if behind.is_empty() {
                Ok(())
            } else {
                Err(format!("behind {behind:?}"))
            }
        },
    )
    .await;
}
