//! Shared helpers of the integration tests. They talk to the real stack started by
//! `scripts/stack up` (Kafka, the schema registry, MariaDB, Redis on 127.0.0.1), configured
//! the same way as the binary: defaults overridden by `STOCKSVR__...` variables.
#![allow(dead_code)]

pub mod api;
pub mod server;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::OwnedMessage;
use rdkafka::{Message, TopicPartitionList};
use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use stocksvr_pipeline::config::Settings;
use stocksvr_pipeline::kafka;

pub fn settings() -> Settings {
    Settings::load(None).expect("configuration loads")
}

pub fn repo_root() -> PathBuf {
    PathBuf::from(
        std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").into()),
    )
    .join("../..")
    .canonicalize()
    .expect("repo root")
}

/// A name no other test or run uses: tests get their own topics, groups and databases.
pub fn unique(prefix: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_nanos();
    format!(
        "{prefix}_{}_{}_{}",
        std::process::id(),
        nanos % 1_000_000_000,
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// The stocksvr binary, run from the repo root so `topics.yaml` resolves.
pub fn stocksvr() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_stocksvr"));
    cmd.current_dir(repo_root());
    cmd
}

/// Runs `cmd` to completion but kills it after `limit`, so a hung client (a Python
/// interop script, say) fails its test instead of stalling the whole suite. Both pipes are
/// drained while it runs: a child that fills a pipe buffer would otherwise block for ever.
pub fn output_within(cmd: &mut Command, limit: Duration) -> Output {
    use std::io::Read;
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("command starts");
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_end(&mut buf);
            }
            buf
        })
    };
    let stdout = drain(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let stderr = drain(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            let err = stderr.join().unwrap_or_default();
            panic!(
                "{cmd:?} did not finish within {limit:?}; its stderr:\n{}",
                String::from_utf8_lossy(&err)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    Output {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    }
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

/// Creates an empty database and returns its URL (same server and user as the config).
pub async fn fresh_database() -> String {
    let base = settings().mysql.url.expose().to_string();
    let pool = stocksvr_store::mysql_pool(&base, 1, Duration::from_secs(10)).expect("pool");
    let name = unique("stocksvr_test");
    sqlx::query(&format!("CREATE DATABASE `{name}` CHARACTER SET utf8mb4"))
        .execute(&pool)
        .await
        .expect("create test database (the stack's user has CREATE)");
    let (prefix, _) = base.rsplit_once('/').expect("url has a database path");
    format!("{prefix}/{name}")
}

/// Creates one topic with `partitions` partitions for a test.
pub async fn create_topic(name: &str, partitions: i32) {
    use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};
    let admin = kafka::admin_client(&settings().kafka).expect("admin client");
    let topic = NewTopic::new(name, partitions, TopicReplication::Fixed(1));
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
}

/// Reads the record at `partition`/`offset` of `topic`, waiting up to `timeout`.
pub fn read_at(topic: &str, partition: i32, offset: i64, timeout: Duration) -> OwnedMessage {
    let consumer: BaseConsumer = kafka::client_config(&settings().kafka, "test-reader")
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

/// Every record of every partition of `topic` that arrives within `timeout` and matches.
pub fn find_record(
    topic: &str,
    timeout: Duration,
    matches: impl Fn(&OwnedMessage) -> bool,
) -> Option<OwnedMessage> {
    let consumer: BaseConsumer = kafka::client_config(&settings().kafka, "test-finder")
        .set("group.id", unique("test-finder"))
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .create()
        .expect("consumer");
    consumer.subscribe(&[topic]).expect("subscribe");
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(500)) {
            let m = m.detach();
            if matches(&m) {
                return Some(m);
            }
        }
    }
    None
}
