//! `stocksvr offsets` against the real Kafka: each test makes its own topic with two
//! partitions of ten records (CreateTime `BASE_MS + i * 1000` at offset `i`) and its own
//! group with offsets committed at 7 (partition 0) and 3 (partition 1).

mod common;

use common::{run, settings, stocksvr, unique};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::producer::FutureRecord;
use rdkafka::{Offset, TopicPartitionList};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use stocksvr_pipeline::kafka;
use stocksvr_pipeline::offsets::{self, OffsetsError, PartitionOffsets, ResetPlan, ResetTarget};

/// 2024-05-01T08:00:00Z.
const BASE_MS: i64 = 1_714_550_400_000;
const RECORDS: i64 = 10;
const COMMITTED: [i64; 2] = [7, 3];

struct Fixture {
    topic: String,
    group: String,
    _topic: common::TestTopic,
}

async fn fixture() -> Fixture {
    let test_topic = common::TestTopic::new("offsets", 2).await;
    let topic = test_topic.name.clone();
    let group = unique("offsets-group");
    let producer = kafka::producer(&settings().kafka, "test-offsets").expect("producer");
    for partition in 0..2 {
        for i in 0..RECORDS {
            let payload = format!("{partition}-{i}");
            let delivery = producer
                .send(
                    FutureRecord::<(), _>::to(&topic)
                        .partition(partition)
                        .timestamp(BASE_MS + i * 1000)
                        .payload(&payload),
                    Duration::from_secs(10),
                )
                .await
                .map_err(|(e, _)| e)
                .expect("record produced");
            assert_eq!((delivery.partition, delivery.offset), (partition, i));
        }
    }
    commit(&group, &topic, &COMMITTED);
    Fixture {
        topic,
        group,
        _topic: test_topic,
    }
}

/// Commits offsets for `group` the way a processor does after its effects.
fn commit(group: &str, topic: &str, offsets: &[i64]) {
    try_commit(group, topic, offsets).expect("commit");
}

fn try_commit(group: &str, topic: &str, offsets: &[i64]) -> KafkaResult<()> {
    let consumer: BaseConsumer = kafka::client_config(&settings().kafka, "test-committer")
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    for (partition, offset) in offsets.iter().enumerate() {
        tpl.add_partition_offset(topic, partition as i32, Offset::Offset(*offset))?;
    }
    consumer.assign(&tpl)?;
    // A stack just started may still be loading the group's coordinator.
    offsets::through_a_coordinator_move(Duration::from_secs(10), || {
        consumer.commit(&tpl, CommitMode::Sync)
    })
}

fn row(topic: &str, partition: i32, committed: i64) -> PartitionOffsets {
    PartitionOffsets {
        topic: topic.to_string(),
        partition,
        committed: Some(committed),
        low: 0,
        high: RECORDS,
        lag: Some(RECORDS - committed),
    }
}

async fn committed(f: &Fixture) -> Vec<Option<i64>> {
    offsets::show(&settings().kafka, &f.group, Some(&f.topic))
        .await
        .expect("show")
        .iter()
        .map(|r| r.committed)
        .collect()
}

/// The new offset of a partition, and the requested one when it was clamped.
type NewOffset = (i64, Option<i64>);

async fn plan(f: &Fixture, target: ResetTarget) -> Vec<(i32, Option<i64>, i64, Option<i64>)> {
    offsets::plan_reset(&settings().kafka, &f.group, &f.topic, target, None)
        .await
        .expect("plan")
        .iter()
        .map(|p| (p.partition, p.current, p.new, p.clamped_from))
        .collect()
}

#[tokio::test]
async fn show_reports_committed_offsets_and_lag() {
    let f = fixture().await;
    let kafka = settings().kafka;
    let expected = vec![row(&f.topic, 0, 7), row(&f.topic, 1, 3)];
    let shown = offsets::show(&kafka, &f.group, Some(&f.topic))
        .await
        .expect("show");
    assert_eq!(shown, expected);
    // Without a topic: every topic the group committed to, which is only this one.
    let all = offsets::show(&kafka, &f.group, None)
        .await
        .expect("show all");
    assert_eq!(all, expected);
    // A group that never committed: every partition, without committed offset or lag.
    let fresh = offsets::show(&kafka, &unique("offsets-none"), Some(&f.topic))
        .await
        .expect("show fresh");
    assert!(fresh
        .iter()
        .all(|r| r.committed.is_none() && r.lag.is_none() && r.high == RECORDS));
    assert_eq!(fresh.len(), 2);
    assert!(offsets::show(&kafka, &unique("offsets-none"), None)
        .await
        .expect("show fresh all")
        .is_empty());
}

#[tokio::test]
async fn every_target_plans_the_expected_offsets() {
    let f = fixture().await;
    use ResetTarget::*;
    let cases: Vec<(ResetTarget, [NewOffset; 2])> = vec![
        (Earliest, [(0, None), (0, None)]),
        (Latest, [(10, None), (10, None)]),
        (ShiftBy(-3), [(4, None), (0, None)]),
        (ShiftBy(-5), [(2, None), (0, Some(-2))]),
        (ShiftBy(5), [(10, Some(12)), (8, None)]),
        (Offset(5), [(5, None), (5, None)]),
        (Offset(50), [(10, Some(50)), (10, Some(50))]),
        // The first record at or after the time; between two records, the later one.
        (Timestamp(BASE_MS + 4_000), [(4, None), (4, None)]),
        (Timestamp(BASE_MS + 4_500), [(5, None), (5, None)]),
        (Timestamp(BASE_MS - 60_000), [(0, None), (0, None)]),
        (Timestamp(0), [(0, None), (0, None)]),
        // Past the last record: the end, which is no clamp.
        (Timestamp(BASE_MS + 3_600_000), [(10, None), (10, None)]),
    ];
    for (target, expected) in cases {
        let expected: Vec<_> = expected
            .iter()
            .enumerate()
            .map(|(p, (new, clamped))| (p as i32, Some(COMMITTED[p]), *new, *clamped))
            .collect();
        assert_eq!(plan(&f, target).await, expected, "{target:?}");
    }
    // A group without commits shifts from the low watermark.
    let fresh = offsets::plan_reset(
        &settings().kafka,
        &unique("offsets-none"),
        &f.topic,
        ShiftBy(2),
        None,
    )
    .await
    .expect("plan");
    assert!(fresh.iter().all(|p| p.current.is_none() && p.new == 2));
    // Only the selected partitions.
    let one = offsets::plan_reset(
        &settings().kafka,
        &f.group,
        &f.topic,
        Earliest,
        Some(vec![1]),
    )
    .await
    .expect("plan");
    assert_eq!(
        one,
        vec![ResetPlan {
            partition: 1,
            current: Some(3),
            new: 0,
            low: 0,
            high: 10,
            clamped_from: None
        }]
    );
    // Planning changes nothing.
    assert_eq!(committed(&f).await, vec![Some(7), Some(3)]);
}

#[tokio::test]
async fn unknown_topics_and_partitions_are_typed_errors() {
    let f = fixture().await;
    let kafka = settings().kafka;
    let missing = unique("offsets-missing");
    let err = offsets::show(&kafka, &f.group, Some(&missing))
        .await
        .expect_err("unknown topic");
    assert!(
        matches!(&err, OffsetsError::UnknownTopic(t) if *t == missing),
        "{err}"
    );
    let err = offsets::plan_reset(&kafka, &f.group, &missing, ResetTarget::Earliest, None)
        .await
        .expect_err("unknown topic");
    assert!(matches!(err, OffsetsError::UnknownTopic(_)), "{err}");
    let err = offsets::plan_reset(
        &kafka,
        &f.group,
        &f.topic,
        ResetTarget::Earliest,
        Some(vec![0, 2]),
    )
    .await
    .expect_err("unknown partition");
    assert!(
        matches!(
            err,
            OffsetsError::UnknownPartition {
                partition: 2,
                count: 2,
                ..
            }
        ),
        "{err}"
    );
}

#[tokio::test]
async fn execute_commits_the_plan_and_refuses_a_stale_one() {
    let f = fixture().await;
    let kafka = settings().kafka;
    let plans = offsets::plan_reset(&kafka, &f.group, &f.topic, ResetTarget::ShiftBy(-3), None)
        .await
        .expect("plan");
    offsets::execute_reset(&kafka, &f.group, &f.topic, &plans)
        .await
        .expect("execute");
    assert_eq!(
        offsets::show(&kafka, &f.group, Some(&f.topic))
            .await
            .expect("show"),
        vec![row(&f.topic, 0, 4), row(&f.topic, 1, 0)]
    );
    // The same plan again: the committed offsets are no longer the ones it was made from.
    let err = offsets::execute_reset(&kafka, &f.group, &f.topic, &plans)
        .await
        .expect_err("stale plan");
    assert!(
        matches!(
            err,
            OffsetsError::StalePlan {
                partition: 0,
                planned: Some(7),
                found: Some(4),
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(committed(&f).await, vec![Some(4), Some(0)]);
}

/// A member of the group, subscribed and polling on its own thread until dropped.
struct Member {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Member {
    fn join(group: &str, topic: &str, client_id: &str) -> Self {
        let consumer: BaseConsumer = kafka::client_config(&settings().kafka, "unused")
            .set("client.id", client_id)
            .set("group.id", group)
            // It must not move the offsets under test itself.
            .set("enable.auto.commit", "false")
            .create()
            .expect("consumer");
        consumer.subscribe(&[topic]).expect("subscribe");
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                let _ = consumer.poll(Duration::from_millis(100));
            }
        });
        Self {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn wait_for_members(group: &str, count: usize) {
    stocksvr_test_support::wait_for(
        &format!("{count} member(s) in group {group}"),
        Duration::from_secs(30),
        || async {
            let members = offsets::active_members(&settings().kafka, group)
                .await
                .expect("describe group");
            if members.len() == count {
                Ok(())
            } else {
                Err(format!("{members:?}"))
            }
        },
    )
    .await;
}

#[tokio::test]
async fn execute_refuses_while_the_group_has_members() {
    let f = fixture().await;
    let kafka = settings().kafka;
    let client_id = unique("offsets-member");
    let member = Member::join(&f.group, &f.topic, &client_id);
    wait_for_members(&f.group, 1).await;

    let plans = offsets::plan_reset(&kafka, &f.group, &f.topic, ResetTarget::Earliest, None)
        .await
        .expect("planning works while the group runs");
    let err = offsets::execute_reset(&kafka, &f.group, &f.topic, &plans)
        .await
        .expect_err("refused");
    match &err {
        OffsetsError::GroupActive { group, members } => {
            assert_eq!(group, &f.group);
            assert_eq!(members.len(), 1, "{members:?}");
            assert_eq!(members[0].client_id, client_id);
        }
        other => panic!("expected GroupActive, got {other}"),
    }
    assert_eq!(committed(&f).await, vec![Some(7), Some(3)]);

    // A dry run warns; the CLI with --execute refuses and exits 1.
    let (ok, out, err) = run(stocksvr().args([
        "offsets",
        "reset",
        "--group",
        &f.group,
        "--topic",
        &f.topic,
        "--to-earliest",
    ]));
    assert!(ok, "{err}");
    assert!(
        out.contains(&format!(
            "has active members ({client_id}); --execute will refuse"
        )),
        "{out}"
    );
    let (ok, out, stderr) = run(stocksvr().args([
        "offsets",
        "reset",
        "--group",
        &f.group,
        "--topic",
        &f.topic,
        "--to-earliest",
        "--execute",
    ]));
    assert!(!ok, "{out}");
    assert!(stderr.contains("refusing to reset"), "{stderr}");
    assert!(stderr.contains("Nothing changed"), "{stderr}");
    assert!(stderr.contains(&client_id), "{stderr}");
    assert_eq!(committed(&f).await, vec![Some(7), Some(3)]);

    // Once the member leaves, the same plan goes through.
    drop(member);
    wait_for_members(&f.group, 0).await;
    offsets::execute_reset(&kafka, &f.group, &f.topic, &plans)
        .await
        .expect("executes once the group is empty");
    assert_eq!(committed(&f).await, vec![Some(0), Some(0)]);
}

#[tokio::test]
async fn cli_dry_run_changes_nothing_and_execute_applies() {
    let f = fixture().await;
    let reset = |extra: &[&str]| {
        let mut cmd = stocksvr();
        cmd.args(["offsets", "reset", "--group", &f.group, "--topic", &f.topic])
            .args(extra);
        run(&mut cmd)
    };

    let (ok, out, err) = reset(&["--shift-by", "-3"]);
    assert!(ok, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    let width = f.topic.len().max("TOPIC".len());
    assert_eq!(
        lines[..3],
        [
            format!("{:<width$}  PARTITION  CURRENT  NEW  LAG", "TOPIC"),
            format!("{:<width$}  0          7        4    6", f.topic),
            format!("{:<width$}  1          3        0    10", f.topic),
        ]
    );
    assert!(
        out.contains(&format!(
            "offsets reset: group {}, topic {}: 2 partitions, 2 would change",
            f.group, f.topic
        )),
        "{out}"
    );
    assert_eq!(
        lines.last(),
        Some(&"dry run: nothing changed; add --execute to apply")
    );
    assert_eq!(committed(&f).await, vec![Some(7), Some(3)]);

    // Clamping is reported.
    let (ok, out, err) = reset(&["--shift-by=-5"]);
    assert!(ok, "{err}");
    assert!(
        out.contains(&format!(
            "note: {}/1: offset -2 is outside [0, 10]; using 0",
            f.topic
        )),
        "{out}"
    );

    let (ok, out, err) = reset(&[
        "--to-datetime",
        "2024-05-01T10:00:05+02:00",
        "--partitions",
        "1",
        "--execute",
    ]);
    assert!(ok, "{err}");
    assert!(out.contains("1 partitions committed, 1 changed"), "{out}");
    assert!(!out.contains("dry run"), "{out}");
    assert_eq!(committed(&f).await, vec![Some(7), Some(5)]);

    let (ok, out, err) = run(stocksvr().args(["offsets", "show", "--group", &f.group]));
    assert!(ok, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines,
        [
            format!("{:<width$}  PARTITION  COMMITTED  LOW  HIGH  LAG", "TOPIC"),
            format!("{:<width$}  0          7          0    10    3", f.topic),
            format!("{:<width$}  1          5          0    10    5", f.topic),
            format!(
                "offsets show: group {}, 2 partitions of 1 topic(s), total lag 8",
                f.group
            ),
        ]
    );

    // Exactly one target.
    let (ok, _, err) = reset(&["--to-earliest", "--to-latest"]);
    assert!(!ok);
    assert!(err.contains("cannot be used with"), "{err}");
    let (ok, _, err) = reset(&[]);
    assert!(!ok);
    assert!(err.contains("required"), "{err}");
    assert_eq!(committed(&f).await, vec![Some(7), Some(5)]);
}

/// What `execute_reset` relies on should a member join between its check and its commit:
/// the broker takes a commit from outside the group only while the group is empty.
#[tokio::test]
async fn the_broker_rejects_a_commit_from_outside_a_running_group() {
    let f = fixture().await;
    let _member = Member::join(&f.group, &f.topic, &unique("offsets-member"));
    wait_for_members(&f.group, 1).await;
    let outside = try_commit(&f.group, &f.topic, &[1, 1]);
    assert!(
        matches!(
            outside,
            Err(KafkaError::ConsumerCommit(
                RDKafkaErrorCode::UnknownMemberId
            ))
        ),
        "{outside:?}"
    );
    assert_eq!(committed(&f).await, vec![Some(7), Some(3)]);
}
