//! The shared consumer loop in raw mode (the dead-letter processor's mode) with a handler of
//! the test's own, against the real Kafka: records that keep arriving faster than batches
//! are applied, and a shutdown in the middle of that stream.

mod common;

use common::*;
use futures::future::BoxFuture;
use futures::FutureExt;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::FutureRecord;
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use stocksvr_pipeline::catalog::Catalog;
use stocksvr_pipeline::codec::AvroCodec;
use stocksvr_pipeline::consumer::{self, Applied, Failure, Handler, LoopConfig, Record};
use tokio::sync::watch;

/// Applies a batch in `per_batch` and remembers the offsets in the order it applied them.
struct Slow {
    applied: Arc<Mutex<Vec<i64>>>,
    per_batch: Duration,
}

impl Handler for Slow {
    fn handle<'a>(
        &'a self,
        batch: &'a [Record],
    ) -> BoxFuture<'a, Result<Vec<Result<Applied, Failure>>, Failure>> {
        async move {
            tokio::time::sleep(self.per_batch).await;
            self.applied
                .lock()
                .expect("not poisoned")
                .extend(batch.iter().map(Record::offset));
            Ok(batch.iter().map(|_| Ok(Applied::Applied)).collect())
        }
        .boxed()
    }
}

#[tokio::test]
async fn a_shutdown_while_records_keep_arriving_stops_between_batches_and_commits_what_was_applied()
{
    let topic = TestTopic::new("loop-stream", 1).await;
    let mut settings = settings();
    settings.kafka.group_prefix = unique("loop-stream-group");
    let config = LoopConfig {
        max_batch: 20,
        raw: true,
        ..LoopConfig::new("loop-stream", vec![topic.name.clone()])
    };
    let codec = AvroCodec::new(
        &settings.registry,
        Arc::new(Catalog::embedded().expect("catalog")),
    )
    .expect("codec");
    // 20 records per 25 ms is 800 a second: the producer below sends faster, so the loop
    // always finds more records waiting behind the batch it applies.
    let applied = Arc::new(Mutex::new(Vec::new()));
    let handler = Arc::new(Slow {
        applied: applied.clone(),
        per_batch: Duration::from_millis(25),
    });

    let producing = Arc::new(AtomicBool::new(true));
    let producer = producer();
    let sender = {
        let (producing, topic) = (producing.clone(), topic.name.clone());
        tokio::spawn(async move {
            let mut sent = 0u64;
            while producing.load(Ordering::SeqCst) {
                let mut acks = Vec::with_capacity(100);
                for _ in 0..100 {
                    let payload = sent.to_string();
                    let record = FutureRecord::to(&topic).key("k").payload(&payload);
                    acks.push(
                        producer
                            .send_result(record)
                            .map_err(|(e, _)| e)
                            .expect("enqueued"),
                    );
                    sent += 1;
                }
                for ack in acks {
                    ack.await.expect("reported").expect("produced");
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            sent
        })
    };

    let (stop, stopped) = watch::channel(false);
    let kafka = settings.kafka.clone();
    let running =
        tokio::spawn(async move { consumer::run(&kafka, codec, config, handler, stopped).await });
    let deadline = Instant::now() + Duration::from_secs(60);
    while applied.lock().expect("not poisoned").len() < 200 {
        assert!(Instant::now() < deadline, "200 records not applied in 60 s");
        assert!(!running.is_finished(), "the loop stopped early");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Records still arrive faster than they are applied: the loop must stop between two
    // batches, not when it runs out of records.
    stop.send(true).expect("loop listening");
    let stop_asked = Instant::now();
    tokio::time::timeout(Duration::from_secs(10), running)
        .await
        .expect("the loop stopped within 10 s while records kept arriving")
        .expect("loop task")
        .expect("the loop stops cleanly");
    let stopped_after = stop_asked.elapsed();
    producing.store(false, Ordering::SeqCst);
    let sent = sender.await.expect("producer task");

    let applied = applied.lock().expect("not poisoned").clone();
    assert!(
        (applied.len() as u64) < sent,
        "everything sent ({sent}) was applied: the stream was not running at the stop"
    );
    // In partition order, none skipped, none twice, though every batch found more waiting.
    let expected: Vec<i64> = (0..applied.len() as i64).collect();
    assert_eq!(
        applied, expected,
        "offsets applied out of order or with gaps"
    );

    // Committed at shutdown: exactly up to the last applied record.
    let probe: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &settings.kafka.brokers)
        .set(
            "group.id",
            format!("{}.loop-stream", settings.kafka.group_prefix),
        )
        .create()
        .expect("probe");
    let mut partitions = TopicPartitionList::new();
    partitions.add_partition(&topic.name, 0);
    let committed = probe
        .committed_offsets(partitions, Duration::from_secs(10))
        .expect("committed offsets");
    let offset = committed
        .find_partition(&topic.name, 0)
        .expect("partition 0")
        .offset();
    assert_eq!(
        offset,
        Offset::Offset(applied.len() as i64),
        "stopped {stopped_after:?} after the stop was asked"
    );
    // The record behind the last applied one is still on the topic for the next start.
    let next = read_at(&topic.name, 0, applied.len() as i64);
    assert_eq!(next.offset(), applied.len() as i64);
}

/// `(run, offset, what)`: what the handler did with a record in which run of the loop.
type Entry = (u32, i64, &'static str);

/// Logs `(run, offset, what)`. Offset 0's first attempt waits until released, then finds its
/// dependency unavailable; every other attempt applies at once.
struct Gate {
    run: Mutex<u32>,
    log: Arc<Mutex<Vec<Entry>>>,
    release: tokio::sync::Notify,
    first_attempt: AtomicBool,
}

impl Gate {
    fn note(&self, offset: i64, what: &'static str) {
        let run = *self.run.lock().expect("not poisoned");
        self.log
            .lock()
            .expect("not poisoned")
            .push((run, offset, what));
    }

    fn saw(&self, run: u32, offset: i64, what: &'static str) -> bool {
        self.log
            .lock()
            .expect("not poisoned")
            .contains(&(run, offset, what))
    }
}

impl Handler for Gate {
    fn handle<'a>(
        &'a self,
        batch: &'a [Record],
    ) -> BoxFuture<'a, Result<Vec<Result<Applied, Failure>>, Failure>> {
        async move {
            let mut results = Vec::new();
            for record in batch {
                let offset = record.offset();
                self.note(offset, "start");
                if offset == 0 && self.first_attempt.swap(false, Ordering::SeqCst) {
                    self.release.notified().await;
                    self.note(offset, "unavailable");
                    results.push(Err(Failure::unavailable(
                        consumer::Dependency::Mysql,
                        "held by the test",
                    )));
                    return Ok(results);
                }
                self.note(offset, "applied");
                results.push(Ok(Applied::Applied));
            }
            Ok(results)
        }
        .boxed()
    }
}

#[tokio::test]
async fn with_a_window_the_next_batch_starts_while_one_is_in_flight_and_offsets_settle_in_order() {
    let topic = TestTopic::new("loop-window", 1).await;
    let mut settings = settings();
    settings.kafka.group_prefix = unique("loop-window-group");
    let config = LoopConfig {
        max_batch: 20,
        window: 2,
        raw: true,
        ..LoopConfig::new("loop-window", vec![topic.name.clone()])
    };
    let codec = AvroCodec::new(
        &settings.registry,
        Arc::new(Catalog::embedded().expect("catalog")),
    )
    .expect("codec");
    let log = Arc::new(Mutex::new(Vec::new()));
    let gate = Arc::new(Gate {
        run: Mutex::new(1),
        log: log.clone(),
        release: tokio::sync::Notify::new(),
        first_attempt: AtomicBool::new(true),
    });
    let producer = producer();
    let send = |key: &'static str| {
        let producer = producer.clone();
        let topic = topic.name.clone();
        async move {
            producer
                .send_result(FutureRecord::to(&topic).key(key).payload(key))
                .map_err(|(e, _)| e)
                .expect("enqueued")
                .await
                .expect("reported")
                .expect("produced");
        }
    };
    let start = |stopped| {
        let (kafka, codec, config, gate) = (
            settings.kafka.clone(),
            codec.clone(),
            config.clone(),
            gate.clone(),
        );
        tokio::spawn(async move { consumer::run(&kafka, codec, config, gate, stopped).await })
    };
    let wait_for = |run: u32, offset: i64, what: &'static str| {
        let gate = gate.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(30);
            while !gate.saw(run, offset, what) {
                assert!(
                    Instant::now() < deadline,
                    "run {run}: offset {offset} never {what}: {:?}",
                    gate.log.lock().expect("not poisoned")
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };

    // Offset 0 (order a) is in flight and held; then come 1 (order b), 2 (order a again)
    // and 3 (order c).
    let (stop, stopped) = watch::channel(false);
    let running = start(stopped);
    send("a").await;
    wait_for(1, 0, "start").await;
    for key in ["b", "a", "c"] {
        send(key).await;
    }
    wait_for(1, 1, "applied").await;
    assert!(
        !gate.saw(1, 2, "start"),
        "order a's second event started before its first ended"
    );

    // Stopped while offset 0 is in flight, which then meets an outage: offset 1 was applied,
    // but its offset must not be committed past the record before it.
    stop.send(true).expect("loop listening");
    gate.release.notify_one();
    tokio::time::timeout(Duration::from_secs(10), running)
        .await
        .expect("the loop stopped within 10 s")
        .expect("loop task")
        .expect("the loop stops cleanly");
    let probe: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &settings.kafka.brokers)
        .set(
            "group.id",
            format!("{}.loop-window", settings.kafka.group_prefix),
        )
        .create()
        .expect("probe");
    let committed = |probe: &BaseConsumer| {
        let mut partitions = TopicPartitionList::new();
        partitions.add_partition(&topic.name, 0);
        probe
            .committed_offsets(partitions, Duration::from_secs(10))
            .expect("committed offsets")
            .find_partition(&topic.name, 0)
            .expect("partition 0")
            .offset()
    };
    let first = committed(&probe);
    assert!(
        matches!(first, Offset::Invalid | Offset::Offset(0)),
        "committed {first:?} with offset 0 unsettled"
    );

    // The next start reads from offset 0 again: everything is applied, offset 1 a second
    // time (its result was dropped behind the outage), order a's events in order.
    *gate.run.lock().expect("not poisoned") = 2;
    let (stop, stopped) = watch::channel(false);
    let running = start(stopped);
    for offset in 0..4 {
        wait_for(2, offset, "applied").await;
    }
    stop.send(true).expect("loop listening");
    tokio::time::timeout(Duration::from_secs(10), running)
        .await
        .expect("the loop stopped within 10 s")
        .expect("loop task")
        .expect("the loop stops cleanly");
    assert_eq!(committed(&probe), Offset::Offset(4));
    let log = log.lock().expect("not poisoned").clone();
    let at = |e: (u32, i64, &str)| log.iter().position(|x| *x == e);
    assert!(
        at((2, 0, "applied")) < at((2, 2, "start")),
        "order a's second event started before its first was applied: {log:?}"
    );
    let applied: Vec<(u32, i64)> = log
        .iter()
        .filter(|e| e.2 == "applied")
        .map(|e| (e.0, e.1))
        .collect();
    assert_eq!(applied, [(1, 1), (2, 0), (2, 1), (2, 2), (2, 3)], "{log:?}");
}
