//! The outbox relay against the real stack (Kafka, the Apicurio registry, MariaDB): each test
//! has its own database and its own 3-partition topic, and its rows are the payloads of
//! `schemas/examples` with fresh event ids.

mod common;

use anyhow::{Context, Result};
use common::{fast_config, Stack};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use stocksvr_outbox_relay::{status, RelayConfig, RelayReport};
use stocksvr_pipeline::catalog::subject_for;
use stocksvr_pipeline::json::avro_to_json;
use stocksvr_pipeline::registry::RegistryClient;
use stocksvr_test_support::eventually;
use tokio::sync::watch;

const NAMESPACE: &str = "io.stocksvr.inventory";

#[tokio::test]
async fn rows_are_published_keyed_and_decode_back_to_their_payload() -> Result<()> {
    let stack = Stack::new().await?;
    let rows = vec![
        stack.row("InventoryReserved")?,
        stack.row("InventoryRedisReserved")?,
        stack.row("InventoryReserved.scheduled")?,
        stack.row("InventoryRedisConfirmed")?,
    ];
    stack.insert(&rows).await?;
    let relay = stack.relay(fast_config())?;

    let report = relay.relay_once().await?;
    assert_eq!(
        report,
        RelayReport {
            claimed: 4,
            sent: 4,
            failed: 0
        }
    );
    for row in &rows {
        assert!(stack.is_sent(&row.event_id).await?, "{}", row.event_id);
        let state = stack.state(&row.event_id).await?;
        // The scan writes nothing per row: the mark alone says they are sent.
        assert_eq!(state.status, status::PENDING, "{}", row.event_id);
        assert_eq!(state.retry_count, 0);
    }
    assert_eq!(
        stack.hwm().await?,
        stack.id_of(&rows[3].event_id).await?,
        "the mark is on the last row"
    );
    assert_eq!(
        relay.relay_once().await?.claimed,
        0,
        "a sent row is read again"
    );

    let records = stack.read_topic().await?;
    assert_eq!(records.len(), rows.len());
    for row in &rows {
        let record = records
            .iter()
            .find(|r| r.event_ids == [row.event_id.clone()])
            .with_context(|| format!("{} not on the topic", row.event_id))?;
        assert_eq!(record.key.as_deref(), Some(row.partition_key.as_str()));
        let decoded = stack.codec.decode(record.payload.as_deref()).await?;
        assert_eq!(decoded.full_name, format!("{NAMESPACE}.{}", row.event_type));
        assert_eq!(avro_to_json(&decoded.value), row.payload);
    }
    // One key, one partition: the Redis Reserved and Confirmed events share their bucket key.
    let mut partitions_of: HashMap<&str, Vec<i32>> = HashMap::new();
    for r in &records {
        partitions_of
            .entry(r.key.as_deref().unwrap_or_default())
            .or_default()
            .push(r.partition);
    }
    let bucket = &partitions_of["bucket_10001_90001_20260726"];
    assert_eq!(bucket.len(), 2);
    assert!(
        partitions_of.values().all(|p| p.iter().all(|x| *x == p[0])),
        "{partitions_of:?}"
    );

    // TopicRecordNameStrategy on the row's topic.
    // Asked subject by subject: the registry lists only a page of its subjects, and the
    // shared local one holds every test namespace's.
    let registry = RegistryClient::new(&stack.settings.registry)?;
    for name in ["InventoryReserved", "InventoryRedisReserved"] {
        let subject = subject_for(&stack.topic, &format!("{NAMESPACE}.{name}"));
        assert!(
            registry.has_subject(&subject).await?,
            "{subject} not registered"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_running_relays_publish_each_event_exactly_once() -> Result<()> {
    let stack = Stack::new().await?;
    let mut rows = Vec::new();
    for i in 0..500 {
        let example = if i % 2 == 0 {
            "InventoryReserved"
        } else {
            "InventoryRedisReserved"
        };
        rows.push(stack.row(example)?);
    }
    for chunk in rows.chunks(100) {
        stack.insert(chunk).await?;
    }
    // Small batches so the two relays interleave many claims.
    let config = RelayConfig {
        batch_size: 25,
        ..fast_config()
    };
    let (stop, stopped) = watch::channel(false);
    let a = tokio::spawn(stack.relay(config.clone())?.run(stopped.clone()));
    let b = tokio::spawn(stack.relay(config)?.run(stopped));

    let all_sent = eventually(Duration::from_secs(90), || async {
        stack.unsent().await.ok() == Some(0)
    })
    .await;
    stop.send(true)?;
    for relay in [a, b] {
        tokio::time::timeout(Duration::from_secs(30), relay)
            .await
            .context("relay did not stop")???;
    }
    assert!(all_sent, "{} of 500 rows not sent", stack.unsent().await?);

    let records = stack.read_topic().await?;
    let mut seen: HashMap<String, usize> = HashMap::new();
    for record in &records {
        assert_eq!(record.event_ids.len(), 1, "one event-id header per record");
        *seen.entry(record.event_ids[0].clone()).or_default() += 1;
    }
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "published more than once: {twice:?}");
    assert_eq!(records.len(), 500);
    for row in &rows {
        assert_eq!(seen.get(&row.event_id), Some(&1), "{}", row.event_id);
    }
    Ok(())
}

#[tokio::test]
async fn a_drain_publishes_round_after_round_and_keeps_each_keys_order() -> Result<()> {
    let stack = Stack::new().await?;
    let mut rows = Vec::new();
    for i in 0..1_050 {
        let example = if i % 3 == 0 {
            "InventoryReserved"
        } else {
            "InventoryRedisReserved"
        };
        rows.push(stack.row(example)?);
    }
    for chunk in rows.chunks(150) {
        stack.insert(chunk).await?;
    }
    let relay = stack.relay(RelayConfig {
        batch_size: 100,
        ..fast_config()
    })?;
    // Ten full rounds overlapped; the eleventh is partial (50 rows) and ends the drain.
    let report = relay.drain(16).await?;
    assert_eq!(
        report,
        RelayReport {
            claimed: 1_050,
            sent: 1_050,
            failed: 0
        }
    );
    assert_eq!(stack.unsent().await?, 0);
    assert_eq!(relay.drain(16).await?.claimed, 0, "nothing left to publish");

    // Rounds overlap, yet one key's records sit in their partition in the order the rows
    // were written (insert order is id order).
    let records = stack.read_topic().await?;
    assert_eq!(records.len(), 1_050);
    let mut written: HashMap<String, Vec<String>> = HashMap::new();
    for row in &rows {
        written
            .entry(row.partition_key.clone())
            .or_default()
            .push(row.event_id.clone());
    }
    let mut published: HashMap<String, Vec<String>> = HashMap::new();
    for record in &records {
        let key = record.key.clone().context("a keyed record")?;
        published
            .entry(key)
            .or_default()
            .extend(record.event_ids.iter().cloned());
    }
    assert!(
        written.len() >= 2,
        "the examples cover two keys: {written:?}"
    );
    assert_eq!(
        published, written,
        "a key's records out of their write order"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_retry_claims_never_overlap() -> Result<()> {
    let stack = Stack::new().await?;
    let rows: Vec<_> = (0..300)
        .map(|_| stack.row("InventoryRedisReserved"))
        .collect::<Result<_>>()?;
    stack.insert(&rows).await?;
    // Every row failed once and is due again: the per-row retry path is the one several
    // relays share (new rows go through the leader alone), so it is what runs concurrently.
    // The mark is over them, as the leader leaves it after putting them into RETRY.
    sqlx::query(
        "UPDATE inventory_outbox SET status = 40, retry_count = 1, \
         next_retry_at = NOW(3) - INTERVAL 1 SECOND",
    )
    .execute(&stack.pool)
    .await?;
    sqlx::query("UPDATE inventory_outbox_relay SET hwm = (SELECT MAX(id) FROM inventory_outbox)")
        .execute(&stack.pool)
        .await?;
    let config = RelayConfig {
        batch_size: 20,
        ..fast_config()
    };
    // Two relays claiming in tight loops, started together: every row is claimed by exactly
    // one of them, so the claims add up to the rows, and both get a share.
    let start = Arc::new(tokio::sync::Barrier::new(2));
    let mut tasks = Vec::new();
    for _ in 0..2 {
        let relay = Arc::new(stack.relay(config.clone())?);
        let start = start.clone();
        let pool = stack.pool.clone();
        tasks.push(tokio::spawn(async move {
            start.wait().await;
            let claimed = std::sync::atomic::AtomicUsize::new(0);
            // Rounds back to back while they claim anything; once one claims nothing, the
            // rest is in the other relay's hands (or due again soon): look again until every
            // row is sent.
            let all_sent = eventually(Duration::from_secs(60), || async {
                loop {
                    let report = relay.retry_once().await.expect("retry round");
                    assert_eq!(report.sent, report.claimed);
                    if report.claimed == 0 {
                        break;
                    }
                    claimed.fetch_add(report.claimed, std::sync::atomic::Ordering::Relaxed);
                }
                let unsent: i64 =
                    sqlx::query_scalar("SELECT COUNT(*) FROM inventory_outbox WHERE status <> 30")
                        .fetch_one(&pool)
                        .await
                        .expect("unsent rows");
                unsent == 0
            })
            .await;
            anyhow::ensure!(all_sent, "rows left unsent after 60 s");
            anyhow::Ok(claimed.into_inner())
        }));
    }
    let mut claims = Vec::new();
    for task in tasks {
        claims.push(tokio::time::timeout(Duration::from_secs(60), task).await???);
    }
    assert_eq!(claims.iter().sum::<usize>(), 300, "claims {claims:?}");
    assert!(
        claims.iter().all(|c| *c > 0),
        "one relay claimed everything, so nothing ran concurrently: {claims:?}"
    );
    assert_eq!(stack.count(status::SENT).await?, 300);
    assert_eq!(stack.read_topic().await?.len(), 300);
    Ok(())
}

#[tokio::test]
async fn a_row_that_does_not_fit_its_schema_is_retried_and_does_not_block_others() -> Result<()> {
    let stack = Stack::new().await?;
    let before = stack.row("InventoryReserved")?;
    let mut bad = stack.row("InventoryReserved")?;
    bad.payload["data"]["quantity"] = serde_json::json!("two");
    let mut unknown = stack.row("InventoryRedisReserved")?;
    unknown.event_type = "NoSuchEvent".into();
    let after = stack.row("InventoryRedisReserved")?;
    stack
        .insert(&[before.clone(), bad.clone(), unknown.clone(), after.clone()])
        .await?;
    let relay = stack.relay(fast_config())?;

    let report = relay.relay_once().await?;
    assert_eq!(
        report,
        RelayReport {
            claimed: 4,
            sent: 2,
            failed: 2
        }
    );
    for ok in [&before, &after] {
        assert!(stack.is_sent(&ok.event_id).await?);
    }
    // The mark passes the failed rows: the retry path owns them now.
    assert_eq!(stack.hwm().await?, stack.id_of(&after.event_id).await?);
    for failed in [&bad, &unknown] {
        assert!(!stack.is_sent(&failed.event_id).await?);
    }
    let state = stack.state(&bad.event_id).await?;
    assert_eq!(state.status, status::RETRY);
    assert_eq!(state.retry_count, 1);
    assert!(state.retry_in_future, "retry is due only after the backoff");
    let error = state.last_error.context("last_error")?;
    assert!(error.contains(".data.quantity"), "{error}");
    let state = stack.state(&unknown.event_id).await?;
    assert_eq!(state.status, status::RETRY);
    assert!(
        state
            .last_error
            .as_deref()
            .unwrap_or("")
            .contains("NoSuchEvent"),
        "{:?}",
        state.last_error
    );
    // Backing off: not claimed again right away.
    assert_eq!(relay.relay_once().await?.claimed, 0);
    let records = stack.read_topic().await?;
    assert_eq!(records.len(), 2);
    Ok(())
}

/// The delay runs from the row's creation to its acknowledgement, one sample per row SENT
/// (none for a row that failed), and every acknowledged record counts as produced to the
/// topic written. A recorder of this test's own (the test runs on one thread) keeps the
/// other tests' rows out of the figures.
#[tokio::test]
async fn publish_delay_and_produced_records_are_measured_per_acknowledged_row() -> Result<()> {
    use stocksvr_telemetry::names;
    let capture = stocksvr_telemetry::testing::Capture::default();
    let _recorder = metrics::set_default_local_recorder(&capture);
    let stack = Stack::new().await?;
    let old = stack.row("InventoryReserved")?;
    let fresh = stack.row("InventoryRedisReserved")?;
    let mut bad = stack.row("InventoryReserved")?;
    bad.payload["data"]["quantity"] = serde_json::json!("two");
    let inserted = std::time::Instant::now();
    stack
        .insert(&[old.clone(), fresh.clone(), bad.clone()])
        .await?;
    // Written 3 s ago, as if the relay had been away.
    stack
        .exec(
            "UPDATE inventory_outbox SET created_at = created_at - INTERVAL 3 SECOND \
             WHERE event_id = ?",
            &old.event_id,
        )
        .await?;
    let relay = stack.relay(fast_config())?;

    let report = relay.relay_once().await?;
    let since_insert = inserted.elapsed().as_secs_f64();
    assert_eq!((report.sent, report.failed), (2, 1));
    let mut delays = capture.histogram(names::OUTBOX_PUBLISH_DELAY_SECONDS, &[]);
    delays.sort_by(f64::total_cmp);
    assert_eq!(delays.len(), 2, "one sample per sent row: {delays:?}");
    // Millisecond columns: allow their rounding on either side.
    assert!(
        delays[0] >= 0.0 && delays[0] <= since_insert + 0.002,
        "fresh row: {delays:?}, {since_insert} s since the insert"
    );
    assert!(
        delays[1] >= 3.0 - 0.002 && delays[1] <= 3.0 + since_insert + 0.002,
        "row written 3 s earlier: {delays:?}, {since_insert} s since the insert"
    );
    assert_eq!(
        capture.counter(names::EVENTS_PRODUCED, &[("topic", stack.topic.as_str())]),
        Some(2)
    );
    assert_eq!(capture.label_sets(names::EVENTS_PRODUCED).len(), 1);

    // Nothing new: no sample, nothing produced.
    assert_eq!(relay.relay_once().await?.claimed, 0);
    assert_eq!(
        capture
            .histogram(names::OUTBOX_PUBLISH_DELAY_SECONDS, &[])
            .len(),
        2
    );
    Ok(())
}

#[tokio::test]
async fn a_sending_row_with_an_expired_lease_is_published_by_the_next_relay() -> Result<()> {
    let stack = Stack::new().await?;
    let orphan = stack.row("InventoryReserved")?;
    let leased = stack.row("InventoryReserved")?;
    stack.insert(&[orphan.clone(), leased.clone()]).await?;
    // A relay claimed both and was killed mid-batch: one lease has run out, one has not.
    stack
        .exec(
            "UPDATE inventory_outbox SET status = 20, next_retry_at = NOW(3) - INTERVAL 1 SECOND \
             WHERE event_id = ?",
            &orphan.event_id,
        )
        .await?;
    stack
        .exec(
            "UPDATE inventory_outbox SET status = 20, next_retry_at = NOW(3) + INTERVAL 1 MINUTE \
             WHERE event_id = ?",
            &leased.event_id,
        )
        .await?;
    let relay = stack.relay(fast_config())?;

    let report = relay.relay_once().await?;
    assert_eq!(report.claimed, 1);
    assert_eq!(report.sent, 1);
    let state = stack.state(&orphan.event_id).await?;
    assert_eq!(state.status, status::SENT);
    assert!(state.sent_at.is_some());
    assert_eq!(
        stack.state(&leased.event_id).await?.status,
        status::SENDING,
        "a row under a live lease belongs to its relay"
    );
    let records = stack.read_topic().await?;
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].event_ids, std::slice::from_ref(&orphan.event_id));
    Ok(())
}

#[tokio::test]
async fn purge_deletes_only_sent_rows_past_the_retention() -> Result<()> {
    let stack = Stack::new().await?;
    let old_retry = stack.row("InventoryReserved")?;
    let old_sending = stack.row("InventoryReserved")?;
    let old_sent: Vec<_> = (0..7)
        .map(|_| stack.row("InventoryReserved"))
        .collect::<Result<_>>()?;
    let recent_sent = stack.row("InventoryReserved")?;
    let old_pending = stack.row("InventoryReserved")?;
    // Lowest ids first: the rows the purge must step over without stopping.
    stack
        .insert(&[old_retry.clone(), old_sending.clone()])
        .await?;
    stack.insert(&old_sent).await?;
    stack.insert(std::slice::from_ref(&recent_sent)).await?;
    // Everything so far is under the mark (published by the scan); old_pending is above.
    sqlx::query("UPDATE inventory_outbox_relay SET hwm = (SELECT MAX(id) FROM inventory_outbox)")
        .execute(&stack.pool)
        .await?;
    stack.insert(std::slice::from_ref(&old_pending)).await?;
    stack
        .exec(
            "UPDATE inventory_outbox SET created_at = NOW(3) - INTERVAL 30 DAY WHERE event_id = ?",
            &old_pending.event_id,
        )
        .await?;
    for (i, row) in old_sent.iter().enumerate() {
        // One of them was sent by the retry path (SENT), the others by the scan (PENDING
        // under the mark): both kinds are purged.
        let status = if i == 3 { 30 } else { 10 };
        sqlx::query(
            "UPDATE inventory_outbox SET status = ?, created_at = NOW(3) - INTERVAL 8 DAY \
             WHERE event_id = ?",
        )
        .bind(status)
        .bind(&row.event_id)
        .execute(&stack.pool)
        .await?;
    }
    stack
        .exec(
            "UPDATE inventory_outbox SET created_at = NOW(3) - INTERVAL 6 DAY WHERE event_id = ?",
            &recent_sent.event_id,
        )
        .await?;
    stack
        .exec(
            "UPDATE inventory_outbox SET status = 40, created_at = NOW(3) - INTERVAL 9 DAY, \
             next_retry_at = NOW(3) + INTERVAL 1 HOUR WHERE event_id = ?",
            &old_retry.event_id,
        )
        .await?;
    stack
        .exec(
            "UPDATE inventory_outbox SET status = 20, created_at = NOW(3) - INTERVAL 9 DAY, \
             next_retry_at = NOW(3) + INTERVAL 1 HOUR WHERE event_id = ?",
            &old_sending.event_id,
        )
        .await?;
    // Batches of 3 over 9 rows: the purge must loop until it reaches a row inside the
    // retention.
    let relay = stack.relay(RelayConfig {
        purge_batch: 3,
        ..fast_config()
    })?;

    assert_eq!(relay.purge_once().await?, 7);
    for row in &old_sent {
        let gone: Option<i8> =
            sqlx::query_scalar("SELECT status FROM inventory_outbox WHERE event_id = ?")
                .bind(&row.event_id)
                .fetch_optional(&stack.pool)
                .await?;
        assert_eq!(gone, None);
    }
    for (row, expected) in [
        (&old_pending, status::PENDING),
        (&recent_sent, status::PENDING),
        (&old_retry, status::RETRY),
        (&old_sending, status::SENDING),
    ] {
        assert_eq!(stack.state(&row.event_id).await?.status, expected);
    }
    assert!(stack.is_sent(&recent_sent.event_id).await?);
    assert!(!stack.is_sent(&old_pending.event_id).await?);
    assert_eq!(relay.purge_once().await?, 0);

    // The backlog gauges' query: three unsent rows (PENDING above the mark, RETRY,
    // SENDING); the age is that of the lowest unsent id (the RETRY row, 9 days).
    let backlog = relay.refresh_backlog().await?;
    assert_eq!(backlog.rows, 3);
    let days = backlog.oldest_age.as_secs_f64() / 86_400.0;
    assert!(
        (8.9..9.1).contains(&days),
        "oldest unsent row is {days} days old"
    );
    Ok(())
}

#[tokio::test]
async fn a_notification_publishes_at_once_despite_a_long_poll() -> Result<()> {
    let stack = Stack::new().await?;
    // Every sleep is 30 s: only the wake-up can explain a prompt publish.
    let relay = stack.relay(RelayConfig {
        min_poll: Duration::from_secs(30),
        max_poll: Duration::from_secs(30),
        ..fast_config()
    })?;
    let waker = relay.waker();
    let owner = relay.owner().to_string();
    let (stop, stopped) = watch::channel(false);
    let running = tokio::spawn(relay.run(stopped));
    // The first (empty) round takes the lead; moments later the relay sleeps its 30 s. (Were
    // it still in that round, the row below would be sent and the check after it fail.)
    let leading = eventually(Duration::from_secs(10), || async {
        let holder: Option<String> =
            sqlx::query_scalar("SELECT owner FROM inventory_outbox_relay WHERE id = 1")
                .fetch_one(&stack.pool)
                .await
                .expect("relay lease row");
        holder.as_deref() == Some(owner.as_str())
    })
    .await;
    assert!(leading, "the relay never took the lead");

    // Something that must not happen: a publish without a notification. Half a second is
    // many of the polls a relay that was not asleep would make (fast_config: 20-200 ms). The
    // lease is taken early in the first round, so a row inserted moments after it may still
    // be read by that round: then a second row, after the round, must stay unsent. A relay
    // that never sleeps sends all three.
    let mut asleep = false;
    for _ in 0..3 {
        let unannounced = stack.row("InventoryReserved")?;
        stack.insert(std::slice::from_ref(&unannounced)).await?;
        tokio::time::sleep(Duration::from_millis(500)).await;
        if !stack.is_sent(&unannounced.event_id).await? {
            asleep = true;
            break;
        }
    }
    assert!(
        asleep,
        "the relay should be asleep; the test proves nothing otherwise"
    );

    let announced = stack.row("InventoryRedisReserved")?;
    stack.insert(std::slice::from_ref(&announced)).await?;
    waker.notify_one();
    let published = eventually(Duration::from_secs(5), || async {
        stack.is_sent(&announced.event_id).await.unwrap_or(false)
    })
    .await;
    assert!(published, "not sent within 5 s of notify_one()");

    // Stopping interrupts the 30 s sleep too.
    stop.send(true)?;
    tokio::time::timeout(Duration::from_secs(5), running)
        .await
        .context("relay did not stop promptly")???;
    Ok(())
}

/// An outbox row whose transaction is still open when later rows commit: its id is a gap
/// below published rows. The mark must stay under it, even once the gap is old enough to
/// be judged against the open transactions, and the row is published once it commits.
#[tokio::test]
async fn the_mark_waits_below_a_row_whose_transaction_is_still_open() -> Result<()> {
    let stack = Stack::new().await?;
    let first = stack.row("InventoryReserved")?;
    stack.insert(std::slice::from_ref(&first)).await?;
    let late = stack.row("InventoryReserved")?;
    let mut open = stack.pool.begin().await?;
    stocksvr_store::outbox::insert_outbox(&mut open, std::slice::from_ref(&late)).await?;
    let later: Vec<_> = (0..3)
        .map(|_| stack.row("InventoryRedisReserved"))
        .collect::<Result<_>>()?;
    stack.insert(&later).await?;
    let relay = stack.relay(fast_config())?;

    let report = relay.relay_once().await?;
    assert_eq!((report.claimed, report.sent), (4, 4));
    let first_id = stack.id_of(&first.event_id).await?;
    assert_eq!(stack.hwm().await?, first_id, "the mark passed an open gap");
    // Past the delay after which a gap is judged against INNODB_TRX: the open transaction
    // is listed, so the gap stays open however many rounds run. A fixed wait on the relay's
    // clock (TRX_READING_DELAY, 500 ms from the gap's first sighting).
    tokio::time::sleep(Duration::from_millis(700)).await;
    for _ in 0..3 {
        assert_eq!(relay.relay_once().await?.claimed, 0);
    }
    assert_eq!(stack.hwm().await?, first_id, "the mark passed an open gap");
    assert_eq!(stack.read_topic().await?.len(), 4);

    open.commit().await?;
    let late_id = stack.id_of(&late.event_id).await?;
    assert!(late_id < stack.id_of(&later[0].event_id).await?);
    let report = relay.relay_once().await?;
    assert_eq!(
        (report.claimed, report.sent),
        (1, 1),
        "the late row is published"
    );
    let top = stack.id_of(&later[2].event_id).await?;
    assert_eq!(stack.hwm().await?, top);
    assert_eq!(stack.unsent().await?, 0);
    let records = stack.read_topic().await?;
    assert_eq!(records.len(), 5);
    assert_eq!(
        records
            .iter()
            .filter(|r| r.event_ids == [late.event_id.clone()])
            .count(),
        1
    );
    Ok(())
}

/// A rolled-back insert leaves a hole in the ids. Once no transaction that could fill it is
/// open, it is closed as never written and the mark moves over it.
#[tokio::test]
async fn a_rolled_back_insert_leaves_a_hole_the_mark_moves_over() -> Result<()> {
    let stack = Stack::new().await?;
    let first = stack.row("InventoryReserved")?;
    stack.insert(std::slice::from_ref(&first)).await?;
    let mut undone = stack.pool.begin().await?;
    stocksvr_store::outbox::insert_outbox(&mut undone, &[stack.row("InventoryReserved")?]).await?;
    undone.rollback().await?;
    let after = stack.row("InventoryRedisReserved")?;
    stack.insert(std::slice::from_ref(&after)).await?;
    let (first_id, after_id) = (
        stack.id_of(&first.event_id).await?,
        stack.id_of(&after.event_id).await?,
    );
    assert!(after_id > first_id + 1, "the rollback left no hole");
    let relay = stack.relay(fast_config())?;

    let report = relay.relay_once().await?;
    assert_eq!((report.claimed, report.sent), (2, 2));
    // Just seen: not judged yet, so the mark waits below the hole.
    assert_eq!(stack.hwm().await?, first_id);
    // Other tests' transactions on the shared server may delay the close; none lasts long.
    let moved = eventually(Duration::from_secs(30), || async {
        relay.relay_once().await.is_ok() && stack.hwm().await.ok() == Some(after_id)
    })
    .await;
    assert!(moved, "the mark stayed at {}", stack.hwm().await?);
    assert_eq!(stack.unsent().await?, 0);
    assert_eq!(
        stack.read_topic().await?.len(),
        2,
        "nothing published twice"
    );
    Ok(())
}

/// Two relays: only the lease holder publishes. When its lease runs out, the other takes
/// over from the mark and nothing is lost; the old leader, stalled meanwhile, publishes
/// duplicates at worst and cannot move the mark any more.
#[tokio::test]
async fn a_second_relay_takes_over_from_the_mark_when_the_lease_runs_out() -> Result<()> {
    let stack = Stack::new().await?;
    let batch =
        |n: usize| -> Result<Vec<_>> { (0..n).map(|_| stack.row("InventoryReserved")).collect() };
    let (one, two, three) = (batch(5)?, batch(4)?, batch(3)?);
    stack.insert(&one).await?;
    let a = stack.relay(fast_config())?;
    let b = stack.relay(fast_config())?;

    assert_eq!(a.relay_once().await?.sent, 5);
    assert!(a.is_leader());
    stack.insert(&two).await?;
    assert_eq!(
        b.relay_once().await?.claimed,
        0,
        "b published while a leads"
    );
    assert!(!b.is_leader());
    assert_eq!(stack.read_topic().await?.len(), 5);
    let mark_one = stack.hwm().await?;
    assert_eq!(mark_one, stack.id_of(&one[4].event_id).await?);

    // a stalls (it still believes it leads); its lease runs out and b takes over from the
    // mark: batch two, not batch one again.
    stack.expire_lease().await?;
    assert_eq!(b.relay_once().await?.sent, 4);
    assert!(b.is_leader());
    let mark_two = stack.id_of(&two[3].event_id).await?;
    assert_eq!(stack.hwm().await?, mark_two);

    // a wakes up with a round: it may publish what it had not (duplicates of two, three),
    // but its write of the mark is fenced off and it stops leading.
    stack.insert(&three).await?;
    a.relay_once().await?;
    assert!(!a.is_leader(), "a kept leading after the takeover");
    assert_eq!(
        stack.hwm().await?,
        mark_two,
        "the stale leader moved the mark"
    );
    assert_eq!(b.relay_once().await?.sent, 3);
    assert_eq!(stack.hwm().await?, stack.id_of(&three[2].event_id).await?);
    assert_eq!(stack.unsent().await?, 0);

    let records = stack.read_topic().await?;
    let mut seen: HashMap<String, usize> = HashMap::new();
    for record in &records {
        *seen.entry(record.event_ids[0].clone()).or_default() += 1;
    }
    for row in one.iter().chain(&two).chain(&three) {
        assert!(seen.contains_key(&row.event_id), "{} lost", row.event_id);
    }
    for row in &one {
        assert_eq!(
            seen[&row.event_id], 1,
            "published before the takeover, once"
        );
    }
    Ok(())
}

/// A reservation step's one row goes out as two records: its stock change on the
/// stock-change topic keyed by bucket, and its lifecycle event on the lifecycle topic keyed
/// by order, under the event id the step's own lifecycle row used to have. Rows of the old
/// two-row shape (as a previous version left them pending) go out as before. Published again
/// (a relay died before the mark moved), a step row sends both records again, same ids.
#[tokio::test]
async fn a_step_row_is_published_as_its_stock_change_and_its_lifecycle_event() -> Result<()> {
    use stocksvr_core::events::topics::{INVENTORY_LIFECYCLE, STOCK_CHANGE};
    let stack = Stack::new().await?;
    let ns = stocksvr_test_support::TestNamespace::with_partitions(Some(common::PARTITIONS)).await;
    let example = |stem: &str, topic: &str| -> Result<stocksvr_store::outbox::NewOutbox> {
        let mut row = stack.row(stem)?;
        row.topic = topic.to_string();
        Ok(row)
    };
    // A step row as the reservation service writes it: the stock change's columns, and a
    // body of what the envelopes cannot take from them, stored as Avro.
    let mut step = example("InventoryRedisReserved", STOCK_CHANGE)?;
    step.event_id = "op_try_100123001:InventoryRedisReserved".into();
    let mut stock_change = step.payload.clone();
    step.payload = serde_json::json!({
        "occurred_at": stock_change["occurred_at"],
        "data": stock_change["data"],
        "lifecycle": {"expire_at": "2026-07-25T12:45:00.456Z"},
    });
    // Stored as this version stores it: the body as Avro, no JSON payload.
    let body: stocksvr_core::events::paired::StepBody =
        serde_json::from_value(step.payload.clone())?;
    step.body = Some(stocksvr_pipeline::step_body::encode(&body).map_err(anyhow::Error::msg)?);
    // The envelope it stands for: every step's event has stocksvr's producer, no trace.
    stock_change["event_id"] = step.event_id.clone().into();
    stock_change["producer"] = "stocksvr".into();
    stock_change["trace_id"] = serde_json::Value::Null;
    let old_lifecycle = example("InventoryConfirmed", INVENTORY_LIFECYCLE)?;
    let old_stock_change = example("InventoryRedisConfirmed", STOCK_CHANGE)?;
    stack
        .insert(&[
            step.clone(),
            old_stock_change.clone(),
            old_lifecycle.clone(),
        ])
        .await?;
    let relay = || -> Result<_> {
        Ok(stack
            .relay(fast_config())?
            .in_namespace(ns.kafka.namespace()))
    };
    let report = relay()?.relay_once().await?;
    assert_eq!(
        (report.claimed, report.sent, report.failed),
        (3, 3, 0),
        "rows, not records"
    );
    let (stock_topic, lifecycle_topic) = (ns.topic(STOCK_CHANGE), ns.topic(INVENTORY_LIFECYCLE));
    let ids = |records: &[common::Record]| -> Vec<(String, Option<String>)> {
        let mut ids: Vec<_> = records
            .iter()
            .map(|r| (r.event_ids.join(","), r.key.clone()))
            .collect();
        ids.sort();
        ids
    };
    let stock = common::read_topic(&stack.settings, &stock_topic).await?;
    let bucket = Some("bucket_10001_90001_20260726".to_string());
    let mut expected_stock = vec![
        (step.event_id.clone(), bucket.clone()),
        (old_stock_change.event_id.clone(), bucket.clone()),
    ];
    expected_stock.sort();
    assert_eq!(ids(&stock), expected_stock);
    let lifecycle = common::read_topic(&stack.settings, &lifecycle_topic).await?;
    let mut expected_lifecycle = vec![
        (
            "op_try_100123001:InventoryReserved".to_string(),
            Some("90000001".to_string()),
        ),
        (
            old_lifecycle.event_id.clone(),
            Some(old_lifecycle.partition_key.clone()),
        ),
    ];
    expected_lifecycle.sort();
    assert_eq!(ids(&lifecycle), expected_lifecycle);

    // The stock change is the envelope the body stands for; the lifecycle event is the one
    // the step describes.
    let find = |records: &[common::Record], id: &str| {
        records
            .iter()
            .find(|r| r.event_ids == [id.to_string()])
            .and_then(|r| r.payload.clone())
    };
    let decoded = stack
        .codec
        .decode(find(&stock, &step.event_id).as_deref())
        .await?;
    assert_eq!(avro_to_json(&decoded.value), stock_change);
    let decoded = stack
        .codec
        .decode(find(&lifecycle, "op_try_100123001:InventoryReserved").as_deref())
        .await?;
    assert_eq!(decoded.full_name, format!("{NAMESPACE}.InventoryReserved"));
    let reserved = avro_to_json(&decoded.value);
    assert_eq!(reserved["partition_key"], "90000001");
    assert_eq!(reserved["occurred_at"], stock_change["occurred_at"]);
    assert_eq!(reserved["producer"], "stocksvr");
    let data = &reserved["data"];
    assert_eq!(data["expire_at"], "2026-07-25T12:45:00.456Z");
    for field in [
        "order_id",
        "order_item_id",
        "reservation_id",
        "merchant_id",
        "dish_id",
        "stock_bucket_id",
        "stock_date",
        "quantity",
        "order_type",
        "processing_time",
    ] {
        assert_eq!(data[field], stock_change["data"][field], "{field}");
    }

    // The mark back below the rows, as if the relay had died before moving it: every record
    // goes again under its id, both halves of the step row included.
    sqlx::query("UPDATE inventory_outbox_relay SET hwm = 0 WHERE id = 1")
        .execute(&stack.pool)
        .await?;
    stack.expire_lease().await?;
    assert_eq!(relay()?.relay_once().await?.sent, 3);
    let stock_again = common::read_topic(&stack.settings, &stock_topic).await?;
    let lifecycle_again = common::read_topic(&stack.settings, &lifecycle_topic).await?;
    let twice = |mut v: Vec<(String, Option<String>)>| {
        v.extend(v.clone());
        v.sort();
        v
    };
    assert_eq!(ids(&stock_again), twice(expected_stock));
    assert_eq!(ids(&lifecycle_again), twice(expected_lifecycle));

    // The retry path (a row put into RETRY because one of its records failed) publishes
    // both records of the row again, and marks the row SENT.
    stack
        .exec(
            "UPDATE inventory_outbox SET status = 40, retry_count = 1, \
             next_retry_at = NOW(3) - INTERVAL 1 SECOND WHERE event_id = ?",
            &step.event_id,
        )
        .await?;
    let retried = relay()?.retry_once().await?;
    assert_eq!((retried.claimed, retried.sent), (1, 1));
    assert_eq!(stack.state(&step.event_id).await?.status, status::SENT);
    let copies = |records: &[common::Record], id: &str| {
        records
            .iter()
            .filter(|r| r.event_ids == [id.to_string()])
            .count()
    };
    let stock_third = common::read_topic(&stack.settings, &stock_topic).await?;
    let lifecycle_third = common::read_topic(&stack.settings, &lifecycle_topic).await?;
    assert_eq!(
        (
            copies(&stock_third, &step.event_id),
            copies(&lifecycle_third, "op_try_100123001:InventoryReserved"),
            copies(&lifecycle_third, &old_lifecycle.event_id),
        ),
        (3, 3, 2),
        "both halves of the retried row again, nothing else"
    );
    Ok(())
}
