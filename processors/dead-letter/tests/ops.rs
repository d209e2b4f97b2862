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
