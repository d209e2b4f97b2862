//! The processor parks each dead letter once, with every header and the exact bytes, even
//! when it is delivered again; bad headers never stop a dead letter from being parked.

mod common;

use common::*;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::FutureRecord;
use std::time::Duration;
use stocksvr_dead_letter::{list, show, Filter, Status};
use stocksvr_pipeline::consumer::Applied;
use stocksvr_pipeline::deadletter::headers;

#[tokio::test]
async fn each_dead_letter_is_parked_once_with_its_origin_and_exact_bytes() {
    let pool = fresh_database().await;
    let pair = topic_pair().await;
    let (topic, dlt) = (pair.topic.clone(), pair.dlt.clone());

    // Not Avro at all, bytes that are not UTF-8 either: parked as they are.
    let key: &[u8] = b"order-\x00\xff1";
    let value: &[u8] = b"\x00\x00\x00\x00\x07\xde\xad\xbe\xef not avro";
    let first = original(&topic, 1, 41, Some(key), Some(value));
    let (_, p1, o1) = send_dead_letter(&first, "wrong magic byte\nsecond line").await;
    assert_eq!(p1, 1, "a dead letter keeps its source partition");
    // A tombstone: no key, no value.
    let second = original(&topic, 0, 7, None, None);
    let (_, p2, o2) = send_dead_letter(&second, "record has no value").await;
    // Headers garbled or missing, as a foreign producer might write them.
    let garbled = OwnedHeaders::new()
        .insert(Header {
            key: headers::ORIGINAL_PARTITION,
            value: Some("one"),
        })
        .insert(Header {
            key: headers::ERROR_CLASS,
            value: Some(&[0xffu8, 0xfe][..]),
        });
    let (p3, o3) = producer()
        .send(
            FutureRecord::<[u8], [u8]>::to(&dlt)
                .partition(1)
                .payload(b"junk")
                .headers(garbled),
            Duration::from_secs(10),
        )
        .await
        .map(|d| (d.partition, d.offset))
        .map_err(|(e, _)| e)
        .expect("garbled dead letter produced");

    let first_run = run_processor(&pool, &topic, 3).await;
    assert_eq!(first_run, [Applied::Applied; 3]);

    let all = Filter {
        status: None,
        ..Filter::default()
    };
    let rows = list(&pool, &all).await.expect("list");
    assert_eq!(rows.len(), 3, "{rows:#?}");
    let find = |p: i32, o: i64| {
        rows.iter()
            .find(|r| r.dlt_partition == p && r.dlt_offset == o)
            .unwrap_or_else(|| panic!("{dlt}/{p}@{o} parked"))
            .id
    };

    let parked = show(&pool, find(p1, o1))
        .await
        .expect("show")
        .expect("exists");
    let s = &parked.summary;
    assert_eq!(s.status, Status::Parked);
    assert_eq!(
        (s.dlt_topic.as_str(), s.dlt_partition, s.dlt_offset),
        (dlt.as_str(), 1, o1)
    );
    assert_eq!(
        (
            s.original_topic.as_str(),
            s.original_partition,
            s.original_offset
        ),
        (topic.as_str(), 1, 41)
    );
    assert_eq!(parked.original_timestamp_ms, Some(1_700_000_000_123));
    assert_eq!(parked.consumer_group, "stocksvr.order-lifecycle");
    assert_eq!(s.error_class, "invalid");
    assert_eq!(s.error_message, "wrong magic byte\nsecond line");
    assert_eq!(parked.key.as_deref(), Some(key));
    assert_eq!(parked.value.as_deref(), Some(value));

    let tombstone = show(&pool, find(p2, o2))
        .await
        .expect("show")
        .expect("exists");
    assert_eq!(
        (
            tombstone.summary.original_partition,
            tombstone.summary.original_offset
        ),
        (0, 7)
    );
    assert_eq!((tombstone.key, tombstone.value), (None, None));

    let junk = show(&pool, find(p3, o3))
        .await
        .expect("show")
        .expect("exists");
    assert_eq!(
        junk.summary.original_topic, topic,
        "derived from the dead-letter topic"
    );
    assert_eq!(
        junk.summary.original_partition, 1,
        "the dead letter's own partition"
    );
    assert_eq!(junk.summary.original_offset, -1);
    assert_eq!(junk.summary.error_class, "unknown");
    assert_eq!(junk.original_timestamp_ms, None);
    assert_eq!(junk.value.as_deref(), Some(&b"junk"[..]));

    // Redelivery: a new consumer group reads every dead letter again; nothing new is parked
    // and nothing parked changes.
    let second_run = run_processor(&pool, &topic, 3).await;
    assert_eq!(second_run, [Applied::Duplicate; 3]);
    assert_eq!(list(&pool, &all).await.expect("list"), rows);
}

/// A `.dlt` topic shared with another deployment (or another service reading the same source
/// topic): only the dead letters of this deployment's groups (`stocksvr.`) are parked; the
/// others are read past, counted, and left to their owners.
#[tokio::test]
async fn dead_letters_of_another_deployments_groups_are_not_parked() {
    let pool = fresh_database().await;
    let pair = topic_pair().await;
    let topic = pair.topic.clone();
    let own = original(&topic, 0, 1, Some(b"1"), Some(b"own"));
    send_dead_letter_as(&own, "stocksvr.order-lifecycle", "ours").await;
    // Another deployment, and one whose prefix merely starts with ours. (A dead letter that
    // names no group at all is parked: see the test above.)
    for (offset, group) in [
        (2, "staging.order-lifecycle"),
        (3, "stocksvr-eu.order-lifecycle"),
    ] {
        let foreign = original(&topic, 0, offset, Some(b"2"), Some(b"theirs"));
        send_dead_letter_as(&foreign, group, "theirs").await;
    }
    let mut outcomes = run_processor(&pool, &topic, 3).await;
    outcomes.sort_by_key(|a| format!("{a:?}"));
    assert_eq!(
        outcomes,
        [Applied::Applied, Applied::Duplicate, Applied::Duplicate]
    );
    let rows = list(
        &pool,
        &Filter {
            status: None,
            ..Filter::default()
        },
    )
    .await
    .expect("list");
    assert_eq!(rows.len(), 1, "{rows:#?}");
    assert_eq!(rows[0].error_message, "ours");
}
