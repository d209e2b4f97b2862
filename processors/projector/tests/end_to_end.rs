//! The projector inside the shared consumer loop against the real Kafka, registry and
//! MariaDB: events produced to a topic of this test's own, projected, and the offsets
//! committed after the effects, then the loop stopped through its watch channel.

mod support;

use anyhow::{bail, Context, Result};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use std::sync::Arc;
use std::time::Duration;
use stocksvr_pipeline::consumer;
use stocksvr_projector::{group_name, loop_config, Projector};
use stocksvr_test_support::{eventually, TestNamespace};
use support::*;
use tokio::sync::watch;

const BUCKET: &str = "bucket_10001_90001_20260726";

#[tokio::test]
async fn the_loop_projects_produced_events_and_commits_after_the_effects() -> Result<()> {
    let mut settings = settings()?;
    // Topics and groups of this test alone, so no other run's offsets or records interfere.
    let ns = TestNamespace::with_partitions(Some(1)).await;
    settings.kafka = ns.kafka.clone();
    let topic = ns.topic(stocksvr_core::events::topics::STOCK_CHANGE);

    let pool = fresh_pool(&settings).await?;
    let reservation = 100_123_001;
    insert_reservation(&pool, reservation, BUCKET, Some(395)).await?;
    let group = group_name(&settings.kafka);
    let projector = Projector::new(pool.clone(), group.clone())?;
    let encoder = Encoder::new(codec(&settings)?, topic.clone())?;

    let try_ = example("InventoryRedisReserved");
    let events = [
        ("StockBucketInitialized", example("StockBucketInitialized")),
        ("InventoryRedisReserved", try_.clone()),
        (
            "InventoryRedisConfirmed",
            example("InventoryRedisConfirmed"),
        ),
        // The outbox relay crashed after the broker's ack: the Try is sent again.
        ("InventoryRedisReserved", try_),
        ("InventoryRedisRefunded", example("InventoryRedisRefunded")),
    ];
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &settings.kafka.brokers)
        .set("message.timeout.ms", "10000")
        .create()?;
    for (name, json) in &events {
        let bytes = encoder.bytes(name, json).await?;
        producer
            .send(
                FutureRecord::to(&topic).key(BUCKET).payload(&bytes),
                Duration::from_secs(10),
            )
            .await
            .map_err(|(e, _)| anyhow::anyhow!("produce {name}: {e}"))?;
    }

    let config = loop_config(&settings.kafka);
    assert_eq!(config.topics, std::slice::from_ref(&topic));
    let (stop, stopped) = watch::channel(false);
    let kafka = settings.kafka.clone();
    let codec = codec(&settings)?;
    let running = tokio::spawn(async move {
        consumer::run(&kafka, codec, config, Arc::new(projector), stopped).await
    });

    let projected = eventually(Duration::from_secs(60), || async {
        assert!(!running.is_finished(), "the loop stopped early");
        let booked = count(&pool, "inventory_ledger").await.expect("ledger");
        let snapshot = snapshot(&pool, BUCKET).await.expect("snapshot");
        booked == 4 && snapshot.is_some_and(|s| s.5 == 410)
    })
    .await;
    if !projected {
        let booked = count(&pool, "inventory_ledger").await?;
        bail!("not projected in time: {booked} ledger rows");
    }
    stop.send(true)?;
    tokio::time::timeout(Duration::from_secs(30), running)
        .await
        .context("loop did not stop")??
        .context("loop failed")?;

    // The refund example's after-quantities; the duplicate Try changed nothing.
    assert_eq!(
        snapshot(&pool, BUCKET).await?,
        Some((100, 70, 5, 25, 0, 410))
    );
    assert_eq!(count(&pool, "inventory_ledger").await?, 4);
    assert_eq!(ledger(&pool, "op_try_100123001").await?.len(), 1);
    assert_eq!(sync_of(&pool, reservation).await?, (410, 20));

    // Offsets after effects: the group committed past all five records at shutdown.
    let probe: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &settings.kafka.brokers)
        .set("group.id", &group)
        .create()?;
    let mut partitions = TopicPartitionList::new();
    partitions.add_partition(&topic, 0);
    let committed = probe.committed_offsets(partitions, Duration::from_secs(10))?;
    let offset = committed
        .find_partition(&topic, 0)
        .context("partition 0")?
        .offset();
    assert_eq!(offset, Offset::Offset(5));
    Ok(())
}
