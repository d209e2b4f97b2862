//! list, show, discard and replay on parked dead letters.

mod common;

use common::*;
use stocksvr_dead_letter::{
    discard, list, replay, replay_producer, show, DlqError, Filter, Status, REPLAY_OF_HEADER,
};

#[tokio::test(flavor = "multi_thread")]
async fn replay_puts_the_exact_record_back_where_it_failed_once_unless_forced() {
    let pool = fresh_database().await;
    let pair = topic_pair().await;
    let (topic, dlt) = (pair.topic.clone(), pair.dlt.clone());
    let key: &[u8] = b"order-42";
    let value: &[u8] = b"\x00\x00\x00\x00\x01\x02\x03\xff original bytes";
    let (_, dlt_partition, dlt_offset) =
        send_dead_letter(&original(&topic, 1, 99, Some(key), Some(value)), "boom").await;
    run_processor(&pool, &topic, 1).await;
    let id = list(&pool, &Filter::default()).await.expect("list")[0].id;
    let producer = replay_producer(&settings().kafka).expect("producer");

    let done = replay(&pool, &producer, id, false).await.expect("replayed");
    assert_eq!((done.topic.as_str(), done.partition), (topic.as_str(), 1));
    assert_eq!(done.previous, Status::Parked);
    let back = read_at(&topic, 1, done.offset);
    assert_eq!(rdkafka::Message::key(&back), Some(key));
    assert_eq!(rdkafka::Message::payload(&back), Some(value));
    assert_eq!(
        header(&back, REPLAY_OF_HEADER),
        Some(format!("{dlt}/{dlt_partition}@{dlt_offset}"))
    );
    let parked = show(&pool, id).await.expect("show").expect("exists");
    assert_eq!(parked.summary.status, Status::Replayed);
    assert!(parked.summary.updated_at >= parked.summary.created_at);

    // A second replay is refused, the record is not produced again.
    let again = replay(&pool, &producer, id, false).await;
    assert!(
        matches!(
            again,
            Err(DlqError::ReplayRefused {
                status: Status::Replayed,
                ..
            })
        ),
        "{again:?}"
    );
    // Forced, it is produced again (downstream dedupes by event id).
    let forced = replay(&pool, &producer, id, true)
        .await
        .expect("forced replay");
    assert_eq!(forced.previous, Status::Replayed);
    assert_eq!(forced.partition, 1);
    assert!(forced.offset > done.offset);
    assert_eq!(
        rdkafka::Message::payload(&read_at(&topic, 1, forced.offset)),
        Some(value)
    );

    // A replayed dead letter cannot be discarded.
    assert!(matches!(
        discard(&pool, id, "too late").await,
        Err(DlqError::DiscardRefused {
            status: Status::Replayed,
            ..
        })
    ));
    assert!(matches!(
        replay(&pool, &producer, id + 1000, false).await,
        Err(DlqError::NotFound(_))
    ));
}

#[tokio::test]
async fn list_filters_and_pages_show_and_discard() {
    let pool = fresh_database().await;
    let pair = topic_pair().await;
    let (topic, _) = (pair.topic.clone(), pair.dlt.clone());
    for offset in 0..3 {
        let record = original(&topic, offset as i32 % 2, offset, Some(b"k"), Some(b"v"));
        send_dead_letter(&record, &format!("failure {offset}")).await;
    }
    run_processor(&pool, &topic, 3).await;

    let parked = list(&pool, &Filter::default()).await.expect("list");
    assert_eq!(parked.len(), 3);
    let ids: Vec<u64> = parked.iter().map(|r| r.id).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "oldest first: {ids:?}");

    let page = |after_id, limit| Filter {
        after_id,
        limit,
        ..Filter::default()
    };
    let first = list(&pool, &page(None, 2)).await.expect("page 1");
    let rest = list(&pool, &page(Some(first[1].id), 2))
        .await
        .expect("page 2");
    assert_eq!((first.len(), rest.len()), (2, 1));
    assert_eq!(rest[0].id, ids[2]);

    let other_topic = Filter {
        original_topic: Some("no-such-topic".into()),
        ..Filter::default()
    };
    assert!(list(&pool, &other_topic).await.expect("list").is_empty());
    let this_topic = Filter {
        original_topic: Some(topic.clone()),
        ..Filter::default()
    };
    assert_eq!(list(&pool, &this_topic).await.expect("list").len(), 3);

    let done = discard(&pool, ids[0], "test data").await.expect("discard");
    assert!(done.changed);
    let repeated = discard(&pool, ids[0], "test data")
        .await
        .expect("discard again");
    assert!(!repeated.changed, "a repeated discard changes nothing");
    assert!(matches!(
        discard(&pool, ids[2] + 1000, "x").await,
        Err(DlqError::NotFound(_))
    ));

    let discarded = show(&pool, ids[0]).await.expect("show").expect("exists");
    assert_eq!(discarded.summary.status, Status::Discarded);
    // Partitions are parked in no fixed order across each other: compare with the listing.
    assert_eq!(discarded.summary.error_message, parked[0].error_message);
    assert!(discarded.summary.error_message.starts_with("failure "));
    assert_eq!(show(&pool, ids[2] + 1000).await.expect("show"), None);

    assert_eq!(
        list(&pool, &Filter::default()).await.expect("list").len(),
        2
    );
    let only_discarded = Filter {
        status: Some(Status::Discarded),
        ..Filter::default()
    };
    let rows = list(&pool, &only_discarded).await.expect("list");
    assert_eq!(rows.iter().map(|r| r.id).collect::<Vec<_>>(), [ids[0]]);

    // A discarded dead letter is replayed only when forced.
    let producer = replay_producer(&settings().kafka).expect("producer");
    assert!(matches!(
        replay(&pool, &producer, ids[0], false).await,
        Err(DlqError::ReplayRefused {
            status: Status::Discarded,
            ..
        })
    ));
    let forced = replay(&pool, &producer, ids[0], true)
        .await
        .expect("forced");
    assert_eq!(
        (forced.previous, forced.partition),
        (Status::Discarded, parked[0].original_partition)
    );
}

/// `stocksvr_dead_letters_parked` counts what waits for an operator: parked rows, not the
/// replayed or discarded ones, whichever process resolved them; the gauge task keeps it
/// current until stopped. A recorder of this test's own (one thread).
#[tokio::test]
async fn the_parked_gauge_counts_dead_letters_until_resolved() {
    use stocksvr_dead_letter::{park_batch, refresh_parked, run_gauge};
    use stocksvr_pipeline::consumer::Applied;
    use stocksvr_telemetry::names;
    let capture = stocksvr_telemetry::testing::Capture::default();
    let _recorder = metrics::set_default_local_recorder(&capture);
    let pool = fresh_database().await;
    assert_eq!(refresh_parked(&pool).await.expect("count"), 0);
    assert_eq!(capture.gauge(names::DEAD_LETTERS_PARKED, &[]), Some(0.0));

    // Three dead letters of three different origin records (one is parked per origin).
    let letters: Vec<_> = (1..=3)
        .map(|offset| {
            let origin = offset.to_string();
            let headers = rdkafka::message::OwnedHeaders::new()
                .insert(rdkafka::message::Header {
                    key: stocksvr_pipeline::deadletter::headers::ORIGINAL_TOPIC,
                    value: Some("gauge-test"),
                })
                .insert(rdkafka::message::Header {
                    key: stocksvr_pipeline::deadletter::headers::ORIGINAL_OFFSET,
                    value: Some(origin.as_str()),
                });
            rdkafka::message::OwnedMessage::new(
                Some(b"x".to_vec()),
                None,
                "gauge-test.dlt".to_string(),
                rdkafka::message::Timestamp::NotAvailable,
                0,
                offset,
                Some(headers),
            )
        })
        .collect();
    let refs: Vec<_> = letters.iter().collect();
    let parked = park_batch(&pool, &refs, "any.").await.expect("parked");
    assert_eq!(parked, [Applied::Applied; 3]);
    assert_eq!(refresh_parked(&pool).await.expect("count"), 3);
    assert_eq!(capture.gauge(names::DEAD_LETTERS_PARKED, &[]), Some(3.0));

    let first = list(&pool, &Filter::default()).await.expect("list")[0].id;
    discard(&pool, first, "test").await.expect("discarded");
    // The periodic task picks the change up by itself and stops on the signal.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let gauge = run_gauge(
        (*pool).clone(),
        std::time::Duration::from_millis(20),
        stop_rx,
    );
    let watch = async {
        let seen =
            stocksvr_test_support::eventually(std::time::Duration::from_secs(10), || async {
                capture.gauge(names::DEAD_LETTERS_PARKED, &[]) == Some(2.0)
            })
            .await;
        stop_tx.send(true).expect("gauge task listening");
        seen
    };
    let (ran, seen) = tokio::join!(gauge, watch);
    ran.expect("the gauge task ends cleanly");
    assert!(
        seen,
        "gauge {:?}",
        capture.gauge(names::DEAD_LETTERS_PARKED, &[])
    );
}
