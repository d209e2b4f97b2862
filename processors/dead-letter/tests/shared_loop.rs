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
            // Not a wait: the time a batch's work takes.
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
                // Not a wait: the producer's pace, 100 records per ~20 ms.
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            sent
        })
    };

    let (stop, stopped) = watch::channel(false);
    let kafka = settings.kafka.clone();
    let running =
        tokio::spawn(async move { consumer::run(&kafka, codec, config, handler, stopped).await });
    let applied_200 = stocksvr_test_support::eventually(Duration::from_secs(60), || async {
        assert!(!running.is_finished(), "the loop stopped early");
        applied.lock().expect("not poisoned").len() >= 200
    })
    .await;
    assert!(applied_200, "200 records not applied in 60 s");

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
