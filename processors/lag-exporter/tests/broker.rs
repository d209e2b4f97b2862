//! The exporter against the real Kafka of the local stack (`scripts/stack up`), configured
//! like the binary (`STOCKSVR__KAFKA__...`). Every test has its own topic and groups under a
//! prefix of its own, so runs and other tests do not interfere.

use metrics_exporter_prometheus::PrometheusBuilder;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::producer::FutureRecord;
use rdkafka::{Message, Offset, TopicPartitionList};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use stocksvr_lag_exporter::{Exporter, LagExporterConfig, Publisher, Scrape};
use stocksvr_pipeline::config::KafkaSettings;
use stocksvr_pipeline::kafka;
use stocksvr_test_support::{eventually, wait_for, TestTopic};

fn settings() -> KafkaSettings {
    stocksvr_test_support::infra().kafka
}

fn unique(prefix: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}-{}-{}-{}",
        std::process::id(),
        now_ms() % 1_000_000_000,
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as i64
}

fn config(prefix: &str) -> LagExporterConfig {
    LagExporterConfig {
        interval_secs: 1,
        group_prefix: prefix.to_string(),
        fetch_timeout_ms: 5_000,
    }
}

/// Produces one record per timestamp to `partition`, in order.
async fn produce(topic: &str, partition: i32, timestamps: &[i64]) {
    let producer = kafka::producer(&settings(), "lag-test").expect("producer");
    for (i, ts) in timestamps.iter().enumerate() {
        let payload = format!("record {i}");
        producer
            .send(
                FutureRecord::<(), _>::to(topic)
                    .partition(partition)
                    .timestamp(*ts)
                    .payload(&payload),
                Duration::from_secs(10),
            )
            .await
            .map_err(|(e, _)| e)
            .expect("record acknowledged");
    }
}

/// Commits `offsets` (partition, offset) of `topic` for `group` the way an operator tool does:
/// a consumer with the group's id that never subscribes, commits and goes away. The group
/// has no members before or after.
fn commit(group: &str, topic: &str, offsets: &[(i32, i64)]) {
    let consumer: BaseConsumer = kafka::client_config(&settings(), "lag-test")
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    for (partition, offset) in offsets {
        tpl.add_partition_offset(topic, *partition, Offset::Offset(*offset))
            .expect("offset");
    }
    consumer
        .commit(&tpl, CommitMode::Sync)
        .expect("commit accepted for a group without members");
}

/// Asserts a lag in seconds measured between `before` and `after` for a record written at
/// `record_ms`.
fn assert_seconds(got: Option<f64>, record_ms: i64, before: i64, after: i64, what: &str) {
    let got = got.unwrap_or_else(|| panic!("{what}: no lag in seconds"));
    let low = (before - record_ms) as f64 / 1000.0 - 0.01;
    let high = (after - record_ms) as f64 / 1000.0 + 0.01;
    assert!(
        (low..=high).contains(&got),
        "{what}: lag {got} s not within [{low}, {high}]"
    );
}

async fn timed_scrape(exporter: &Exporter) -> (Scrape, i64, i64) {
    let before = now_ms();
    let scrape = exporter.scrape_once().await.expect("scrape");
    let after = now_ms();
    (scrape, before, after)
}

#[tokio::test]
async fn known_offsets_of_groups_without_members_on_three_partitions() {
    let prefix = format!("{}.", unique("lagtest"));
    let test_topic = TestTopic::new("lag-topic", 3).await;
    let topic = test_topic.name.clone();
    // Records written ten minutes ago, one second apart, each partition its own range.
    let base = now_ms() - 600_000;
    let ts = |p: i32, i: i64| base + i64::from(p) * 100_000 + i * 1_000;
    let counts = [10, 5, 7];
    for (p, n) in counts.iter().enumerate() {
        let p = p as i32;
        let stamps: Vec<i64> = (0..*n).map(|i| ts(p, i)).collect();
        produce(&topic, p, &stamps).await;
    }
    let behind = format!("{prefix}behind");
    let caught_up = format!("{prefix}caught-up");
    let outsider = unique("other-prefix");
    // behind: 6 records left on 0, none on 1, never committed on 2.
    commit(&behind, &topic, &[(0, 4), (1, 5)]);
    commit(&caught_up, &topic, &[(0, 10), (1, 5), (2, 7)]);
    commit(&outsider, &topic, &[(0, 1)]);

    let exporter = Exporter::new(&settings(), &config(&prefix)).expect("exporter");
    let (scrape, before, after) = timed_scrape(&exporter).await;
    assert!(scrape.problems.is_empty(), "{:?}", scrape.problems);
    let groups: Vec<&str> = scrape.groups.iter().map(|g| g.group.as_str()).collect();
    assert_eq!(groups, vec![behind.as_str(), caught_up.as_str()]);
    for g in &scrape.groups {
        assert_eq!(g.members, 0, "{g:?}");
    }
    assert_eq!(scrape.partitions.len(), 6, "{:#?}", scrape.partitions);

    let p0 = scrape.partition(&behind, &topic, 0).expect("behind/0");
    assert_eq!(
        (p0.committed, p0.low_watermark, p0.high_watermark, p0.lag),
        (Some(4), 0, 10, 6)
    );
    assert_seconds(p0.lag_seconds, ts(0, 4), before, after, "behind/0");
    let p1 = scrape.partition(&behind, &topic, 1).expect("behind/1");
    assert_eq!((p1.committed, p1.high_watermark, p1.lag), (Some(5), 5, 0));
    assert_eq!(p1.lag_seconds, Some(0.0));
    // Never committed: the group would start at the earliest record.
    let p2 = scrape.partition(&behind, &topic, 2).expect("behind/2");
    assert_eq!((p2.committed, p2.high_watermark, p2.lag), (None, 7, 7));
    assert_seconds(p2.lag_seconds, ts(2, 0), before, after, "behind/2");
    for p in 0..3 {
        let row = scrape.partition(&caught_up, &topic, p).expect("caught-up");
        assert_eq!(row.lag, 0, "{row:?}");
        assert_eq!(row.lag_seconds, Some(0.0), "{row:?}");
        assert_eq!(row.committed, Some(row.high_watermark), "{row:?}");
    }
    assert_eq!(exporter.cached_timestamps(), 2);

    // The group moves on partition 0; partition 2 stays put: its lag in seconds grows with
    // the clock from the cached timestamp.
    commit(&behind, &topic, &[(0, 7)]);
    // A fixed wait on the wall clock the exporter measures lag in seconds on: partition 2's
    // must have grown by then.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let (again, before, after) = timed_scrape(&exporter).await;
    assert!(again.problems.is_empty(), "{:?}", again.problems);
    let p0 = again.partition(&behind, &topic, 0).expect("behind/0");
    assert_eq!((p0.committed, p0.lag), (Some(7), 3));
    assert_seconds(
        p0.lag_seconds,
        ts(0, 7),
        before,
        after,
        "behind/0 after commit",
    );
    let p2_again = again.partition(&behind, &topic, 2).expect("behind/2");
    assert_seconds(
        p2_again.lag_seconds,
        ts(2, 0),
        before,
        after,
        "behind/2 later",
    );
    assert!(p2_again.lag_seconds > p2.lag_seconds);
    assert_eq!(
        exporter.cached_timestamps(),
        2,
        "the entry for offset 4 is dropped"
    );

    // What a scrape of /metrics shows for it.
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, || Publisher::default().publish(&again));
    let text = handle.render();
    for (series, value) in [
        (
            format!("stocksvr_consumer_group_lag{{group=\"{behind}\",topic=\"{topic}\",partition=\"0\"}}"),
            "3",
        ),
        (
            format!("stocksvr_consumer_group_committed_offset{{group=\"{behind}\",topic=\"{topic}\",partition=\"0\"}}"),
            "7",
        ),
        (
            format!("stocksvr_consumer_group_lag{{group=\"{caught_up}\",topic=\"{topic}\",partition=\"2\"}}"),
            "0",
        ),
        (
            format!("stocksvr_topic_high_watermark{{topic=\"{topic}\",partition=\"0\"}}"),
            "10",
        ),
        (
            format!("stocksvr_consumer_group_members{{group=\"{behind}\"}}"),
            "0",
        ),
    ] {
        assert!(
            text.lines().any(|l| l == format!("{series} {value}")),
            "{series} {value} missing from:\n{text}"
        );
    }
    assert!(!text.contains(&outsider), "{text}");
}

#[tokio::test]
async fn a_group_whose_member_left_keeps_being_reported_and_its_lag_grows() {
    let prefix = format!("{}.", unique("lagtest"));
    let test_topic = TestTopic::new("lag-topic", 3).await;
    let topic = test_topic.name.clone();
    let group = format!("{prefix}projector");
    let exporter = Exporter::new(&settings(), &config(&prefix)).expect("exporter");

    // A real member: subscribes, reads three records, commits them.
    let member: BaseConsumer = kafka::client_config(&settings(), "lag-test-member")
        .set("group.id", &group)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .create()
        .expect("consumer");
    member.subscribe(&[&topic]).expect("subscribe");
    let stamps: Vec<i64> = (0..3).map(|_| now_ms()).collect();
    produce(&topic, 0, &stamps).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut read = 0;
    while read < 3 {
        assert!(
            Instant::now() < deadline,
            "the member read {read} of 3 records"
        );
        if let Some(message) = member.poll(Duration::from_millis(200)) {
            let message = message.expect("record");
            assert_eq!(message.partition(), 0);
            read += 1;
        }
    }
    member
        .commit_consumer_state(CommitMode::Sync)
        .expect("commit");
    let scrape = exporter.scrape_once().await.expect("scrape");
    let summary = scrape.group(&group).expect("group listed");
    assert_eq!(summary.members, 1, "{summary:?}");
    let p0 = scrape.partition(&group, &topic, 0).expect("partition 0");
    assert_eq!(
        (p0.committed, p0.lag, p0.lag_seconds),
        (Some(3), 0, Some(0.0))
    );

    // The member goes away (closes and leaves the group); records keep coming.
    drop(member);
    let written = now_ms();
    produce(&topic, 0, &[written, written + 1]).await;
    let first = wait_for(
        "the member to leave the group",
        Duration::from_secs(60),
        || async {
            let (scrape, before, after) = timed_scrape(&exporter).await;
            let members = scrape.group(&group).map(|g| g.members);
            if members != Some(0) {
                return Err(format!("{members:?} members"));
            }
            let p0 = scrape.partition(&group, &topic, 0).expect("partition 0");
            assert_eq!((p0.committed, p0.high_watermark, p0.lag), (Some(3), 5, 2));
            assert_seconds(
                p0.lag_seconds,
                written,
                before,
                after,
                "after the member left",
            );
            Ok(p0.lag_seconds.unwrap_or_default())
        },
    )
    .await;
    // A fixed wait on the wall clock the exporter measures lag in seconds on.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (later, before, after) = timed_scrape(&exporter).await;
    assert_eq!(later.group(&group).map(|g| g.members), Some(0));
    let p0 = later.partition(&group, &topic, 0).expect("partition 0");
    assert_eq!(p0.lag, 2);
    assert_seconds(p0.lag_seconds, written, before, after, "two seconds later");
    assert!(
        p0.lag_seconds.unwrap_or_default() >= first + 1.9,
        "lag in seconds grows while nobody consumes: {first} then {:?}",
        p0.lag_seconds
    );
}

#[tokio::test]
async fn run_exports_every_interval_and_stops_on_the_signal() {
    let prefix = format!("{}.", unique("lagtest"));
    let test_topic = TestTopic::new("lag-topic", 1).await;
    let topic = test_topic.name.clone();
    produce(&topic, 0, &[now_ms() - 5_000, now_ms()]).await;
    let group = format!("{prefix}relay");
    commit(&group, &topic, &[(0, 1)]);

    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    // The only test of this binary with a global recorder (run() records through it).
    metrics::set_global_recorder(recorder).expect("first global recorder of this test binary");
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let settings = settings();
    let task = tokio::spawn(async move {
        stocksvr_lag_exporter::run(&settings, config(&prefix), stop_rx).await
    });

    let lag_line = format!(
        "stocksvr_consumer_group_lag{{group=\"{group}\",topic=\"{topic}\",partition=\"0\"}} 1"
    );
    let rounds = |text: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix("stocksvr_lag_exporter_scrapes_total{outcome=\"ok\"} "))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    };
    let exported = eventually(Duration::from_secs(30), || async {
        let text = handle.render();
        text.lines().any(|l| l == lag_line) && rounds(&text) >= 2.0
    })
    .await;
    let text = handle.render();
    assert!(exported, "no two rounds exported:\n{text}");
    assert!(
        text.contains("stocksvr_lag_exporter_scrapes_total{outcome=\"error\"} 0"),
        "{text}"
    );
    stop_tx.send(true).expect("exporter listens");
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("run returns after the stop signal")
        .expect("task")
        .expect("run ends without error");
}
