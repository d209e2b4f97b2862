//! The projector's handler against the real MariaDB and schema registry, one fresh
//! database and one registry topic per test. Records are built the way the loop builds
//! them (encode, decode through the registry) and handed to `Handler::handle` directly.

mod support;

use anyhow::Result;
use serde_json::{json, Value as Json};
use sqlx::MySqlPool;
use stocksvr_pipeline::consumer::{Applied, Failure, Handler, Record};
use stocksvr_projector::{Projector, LANES};
use support::*;

const BUCKET: &str = "bucket_10001_90001_20260726";
const GROUP: &str = "test.projector";

struct Harness {
    _db: TestDb,
    pool: MySqlPool,
    projector: Projector,
    encoder: Encoder,
}

impl Harness {
    async fn new() -> Result<Self> {
        let settings = settings()?;
        let db = fresh_pool(&settings).await?;
        let pool = db.pool.clone();
        // Lanes for batches of any size, so the tests' small batches over two buckets take
        // the path of a backlog's full ones: a transaction per lane.
        let projector = Projector::new(pool.clone(), GROUP)?.with_lanes(LANES, 1);
        let encoder = Encoder::new(codec(&settings)?, unique("projector-test"))?;
        Ok(Self {
            _db: db,
            pool,
            projector,
            encoder,
        })
    }

    async fn record(&self, name: &str, json: &Json) -> Result<Record> {
        self.encoder.record(name, json).await
    }

    async fn handle(&self, batch: &[Record]) -> Result<Vec<Result<Applied, Failure>>, Failure> {
        self.projector.handle(batch).await
    }

    /// Handles `batch` and insists the batch as a whole succeeded.
    async fn apply(&self, batch: &[Record]) -> Vec<Result<Applied, Failure>> {
        let results = self.handle(batch).await.expect("batch applies");
        assert_eq!(results.len(), batch.len(), "one result per record");
        results
    }

    async fn snapshot(&self) -> Result<Option<Snapshot>> {
        snapshot(&self.pool, BUCKET).await
    }
}

fn name_of(file: &str) -> &str {
    file.split('.').next().unwrap_or(file)
}

#[tokio::test]
async fn every_stock_change_example_projects_and_the_snapshot_is_the_last_after() -> Result<()> {
    let h = Harness::new().await?;
    // In Redis version order, as the bucket's partition delivers them.
    let files = [
        "StockBucketInitialized",
        "InventoryRedisReserved",
        "InventoryRedisConfirmed",
        "InventoryRedisCanceled",
        "InventoryRedisCanceled.empty-rollback",
        "InventoryRedisRefunded",
        "InventoryRedisRefunded.before-confirm",
        "StockBaselineAdjusted",
        "StockBaselineAdjusted.deficit",
    ];
    let mut batch = Vec::new();
    for file in files {
        batch.push(h.record(name_of(file), &example(file)).await?);
    }
    let results = h.apply(&batch).await;
    assert!(
        results.iter().all(|r| r == &Ok(Applied::Applied)),
        "{results:?}"
    );

    // The deficit example's after-quantities and its deficit.
    assert_eq!(h.snapshot().await?, Some((20, 0, 4, 25, 9, 421)));
    assert_eq!(count(&h.pool, "inventory_ledger").await?, 9);
    assert_eq!(
        count(&h.pool, "inventory_consumer_inbox").await?,
        0,
        "the ledger's operation id is the dedupe key; no inbox row"
    );
    assert_eq!(
        ledger(&h.pool, "op_init_bucket_10001_90001_20260726").await?,
        vec![(1, 100, 100, 0, 0, 100, Some(1))]
    );
    assert_eq!(
        ledger(&h.pool, "op_try_100123001").await?,
        vec![(2, 2, -2, 2, 0, 0, Some(392))]
    );
    assert_eq!(
        ledger(&h.pool, "op_confirm_100123001").await?,
        vec![(3, 2, 0, -2, 2, 0, Some(395))]
    );
    assert_eq!(
        ledger(&h.pool, "op_cancel_100123030").await?,
        vec![(4, 1, 0, 0, 0, 0, Some(401))],
        "an empty rollback is booked with zero deltas"
    );
    assert_eq!(
        ledger(&h.pool, "op_refund_100123001_rfd_90000001_1").await?,
        vec![(6, 1, 1, 0, -1, 0, Some(410))]
    );
    assert_eq!(
        ledger(&h.pool, "op_adjust_bucket_10001_90001_20260726_2").await?,
        vec![(5, 120, 20, 0, 0, 20, Some(420))]
    );
    assert_eq!(
        ledger(&h.pool, "op_adjust_bucket_10001_90001_20260726_3").await?,
        vec![(5, 20, -91, 0, 0, -100, Some(421))]
    );
    Ok(())
}

#[tokio::test]
async fn duplicates_in_one_batch_and_across_batches_change_nothing() -> Result<()> {
    let h = Harness::new().await?;
    let try_ = change(
        "InventoryRedisReserved",
        "evt_dup_try",
        "op_try_dup",
        392,
        [100, 72, 8, 20],
    );
    let first = h.record("InventoryRedisReserved", &try_).await?;
    let again = h.record("InventoryRedisReserved", &try_).await?;
    let results = h.apply(&[first, again]).await;
    assert_eq!(results, vec![Ok(Applied::Applied), Ok(Applied::Duplicate)]);

    let state = || async {
        let updated_at: chrono::NaiveDateTime = sqlx::query_scalar(
            "SELECT updated_at FROM dish_stock_snapshot WHERE stock_bucket_id = ?",
        )
        .bind(BUCKET)
        .fetch_one(&h.pool)
        .await?;
        let state = (
            h.snapshot().await?,
            updated_at,
            count(&h.pool, "inventory_ledger").await?,
        );
        anyhow::Ok(state)
    };
    let after_first = state().await?;
    assert_eq!(after_first.0, Some((100, 72, 8, 20, 0, 392)));
    assert_eq!(after_first.2, 1);

    // Redelivered later, alone: not a single column moves (updated_at included). A fixed wait
    // on the clock updated_at is stamped from (the projector's, in milliseconds): past it, a
    // rewrite would show.
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    let redelivered = h.record("InventoryRedisReserved", &try_).await?;
    assert_eq!(h.apply(&[redelivered]).await, vec![Ok(Applied::Duplicate)]);
    assert_eq!(state().await?, after_first);

    // And next to a new event.
    let redelivered = h.record("InventoryRedisReserved", &try_).await?;
    let confirm = change(
        "InventoryRedisConfirmed",
        "evt_dup_confirm",
        "op_confirm_dup",
        395,
        [100, 72, 6, 22],
    );
    let confirm = h.record("InventoryRedisConfirmed", &confirm).await?;
    let results = h.apply(&[redelivered, confirm.clone()]).await;
    assert_eq!(results, vec![Ok(Applied::Duplicate), Ok(Applied::Applied)]);
    assert_eq!(h.apply(&[confirm]).await, vec![Ok(Applied::Duplicate)]);

    assert_eq!(ledger(&h.pool, "op_try_dup").await?.len(), 1);
    assert_eq!(count(&h.pool, "inventory_ledger").await?, 2);
    assert_eq!(h.snapshot().await?, Some((100, 72, 6, 22, 0, 395)));
    Ok(())
}

#[tokio::test]
async fn another_consumer_group_books_nothing_twice_either() -> Result<()> {
    let h = Harness::new().await?;
    let try_ = change(
        "InventoryRedisReserved",
        "evt_group",
        "op_try_group",
        392,
        [100, 72, 8, 20],
    );
    let record = h.record("InventoryRedisReserved", &try_).await?;
    assert_eq!(
        h.apply(std::slice::from_ref(&record)).await,
        vec![Ok(Applied::Applied)]
    );
    // The ledger is one per database, whichever group replays the topic into it.
    let rebuild = Projector::new(h.pool.clone(), "rebuild.projector")?;
    assert_eq!(
        rebuild.handle(&[record]).await,
        Ok(vec![Ok(Applied::Duplicate)])
    );
    assert_eq!(
        ledger(&h.pool, "op_try_group").await?.len(),
        1,
        "still booked once"
    );
    Ok(())
}

#[tokio::test]
async fn a_stale_event_keeps_the_newer_snapshot_and_books_its_ledger_once() -> Result<()> {
    let h = Harness::new().await?;
    let newer = change(
        "InventoryRedisConfirmed",
        "evt_newer",
        "op_confirm_newer",
        395,
        [100, 70, 6, 24],
    );
    let older = change(
        "InventoryRedisReserved",
        "evt_older",
        "op_try_older",
        392,
        [100, 72, 8, 20],
    );
    // Across batches.
    let r = h.record("InventoryRedisConfirmed", &newer).await?;
    assert_eq!(h.apply(&[r]).await, vec![Ok(Applied::Applied)]);
    let r = h.record("InventoryRedisReserved", &older).await?;
    assert_eq!(h.apply(&[r]).await, vec![Ok(Applied::Applied)]);
    assert_eq!(h.snapshot().await?, Some((100, 70, 6, 24, 0, 395)));
    assert_eq!(
        ledger(&h.pool, "op_try_older").await?,
        vec![(2, 2, -2, 2, 0, 0, Some(392))]
    );

    // The same operation announced under another event id: booked already, a duplicate.
    let republished = change(
        "InventoryRedisReserved",
        "evt_older_again",
        "op_try_older",
        392,
        [100, 72, 8, 20],
    );
    let r = h.record("InventoryRedisReserved", &republished).await?;
    assert_eq!(h.apply(&[r]).await, vec![Ok(Applied::Duplicate)]);
    assert_eq!(ledger(&h.pool, "op_try_older").await?.len(), 1);
    assert_eq!(h.snapshot().await?, Some((100, 70, 6, 24, 0, 395)));

    // Within one batch: newer first, then older, then an equal version.
    let newest = change(
        "InventoryRedisCanceled",
        "evt_newest",
        "op_cancel_newest",
        401,
        [100, 71, 5, 24],
    );
    let stale = change(
        "InventoryRedisRefunded",
        "evt_stale_in_batch",
        "op_refund_stale",
        399,
        [100, 60, 6, 34],
    );
    let equal = change(
        "InventoryRedisCanceled.empty-rollback",
        "evt_equal",
        "op_cancel_equal",
        401,
        [100, 50, 50, 0],
    );
    let batch = vec![
        h.record("InventoryRedisCanceled", &newest).await?,
        h.record("InventoryRedisRefunded", &stale).await?,
        h.record("InventoryRedisCanceled", &equal).await?,
    ];
    let results = h.apply(&batch).await;
    assert!(
        results.iter().all(|r| r == &Ok(Applied::Applied)),
        "{results:?}"
    );
    assert_eq!(
        h.snapshot().await?,
        Some((100, 71, 5, 24, 0, 401)),
        "an equal version is not newer either"
    );
    assert_eq!(count(&h.pool, "inventory_ledger").await?, 5);
    Ok(())
}

#[tokio::test]
async fn the_ledger_has_one_row_per_operation_id_across_event_ids() -> Result<()> {
    let h = Harness::new().await?;
    let a = change(
        "InventoryRedisReserved",
        "evt_op_a",
        "op_try_shared",
        392,
        [100, 72, 8, 20],
    );
    let b = change(
        "InventoryRedisReserved",
        "evt_op_b",
        "op_try_shared",
        392,
        [100, 72, 8, 20],
    );
    let batch = vec![
        h.record("InventoryRedisReserved", &a).await?,
        h.record("InventoryRedisReserved", &b).await?,
    ];
    // Two event ids of one operation: the operation is booked, and applied, once.
    assert_eq!(
        h.apply(&batch).await,
        vec![Ok(Applied::Applied), Ok(Applied::Duplicate)]
    );
    let c = change(
        "InventoryRedisReserved",
        "evt_op_c",
        "op_try_shared",
        392,
        [100, 72, 8, 20],
    );
    let r = h.record("InventoryRedisReserved", &c).await?;
    assert_eq!(h.apply(&[r]).await, vec![Ok(Applied::Duplicate)]);
    assert_eq!(
        ledger(&h.pool, "op_try_shared").await?,
        vec![(2, 2, -2, 2, 0, 0, Some(392))]
    );
    assert_eq!(count(&h.pool, "inventory_ledger").await?, 1);
    Ok(())
}

#[tokio::test]
async fn sync_status_becomes_synced_exactly_when_synced_reaches_expected() -> Result<()> {
    let h = Harness::new().await?;
    // The example events belong to reservation 100123001.
    let id = 100_123_001;
    insert_reservation(&h.pool, id, BUCKET, Some(395)).await?;
    let unexpected = 100_123_002;
    insert_reservation(&h.pool, unexpected, BUCKET, None).await?;

    let try_ = change(
        "InventoryRedisReserved",
        "evt_sync_try",
        "op_try_sync",
        392,
        [100, 72, 8, 20],
    );
    let r = h.record("InventoryRedisReserved", &try_).await?;
    h.apply(&[r]).await;
    assert_eq!(sync_of(&h.pool, id).await?, (392, 10), "below expected");

    let confirm = change(
        "InventoryRedisConfirmed",
        "evt_sync_confirm",
        "op_confirm_sync",
        395,
        [100, 72, 6, 22],
    );
    let r = h.record("InventoryRedisConfirmed", &confirm).await?;
    h.apply(&[r]).await;
    assert_eq!(sync_of(&h.pool, id).await?, (395, 20), "reached expected");

    // A stale event never moves synced back.
    let stale = change(
        "InventoryRedisReserved",
        "evt_sync_stale",
        "op_try_sync_stale",
        390,
        [100, 74, 6, 20],
    );
    let r = h.record("InventoryRedisReserved", &stale).await?;
    h.apply(&[r]).await;
    assert_eq!(sync_of(&h.pool, id).await?, (395, 20));

    // The next step expects 410; an event beyond it syncs at once.
    set_expected(&h.pool, id, 410).await?;
    let refund = change(
        "InventoryRedisRefunded",
        "evt_sync_refund",
        "op_refund_sync",
        412,
        [100, 71, 6, 23],
    );
    let r = h.record("InventoryRedisRefunded", &refund).await?;
    h.apply(&[r]).await;
    assert_eq!(sync_of(&h.pool, id).await?, (412, 20));

    // Without an expected version the synced version moves, the status does not.
    let mut other = change(
        "InventoryRedisReserved",
        "evt_sync_other",
        "op_try_other",
        413,
        [100, 69, 8, 23],
    );
    other["data"]["reservation_id"] = json!(unexpected);
    let r = h.record("InventoryRedisReserved", &other).await?;
    h.apply(&[r]).await;
    assert_eq!(sync_of(&h.pool, unexpected).await?, (413, 10));

    // An event for a reservation this database does not have still projects.
    let mut orphan = change(
        "InventoryRedisReserved",
        "evt_sync_orphan",
        "op_try_orphan",
        414,
        [100, 67, 10, 23],
    );
    orphan["data"]["reservation_id"] = json!(999_999);
    let r = h.record("InventoryRedisReserved", &orphan).await?;
    assert_eq!(h.apply(&[r]).await, vec![Ok(Applied::Applied)]);
    assert_eq!(h.snapshot().await?, Some((100, 67, 10, 23, 0, 414)));
    Ok(())
}

#[tokio::test]
async fn an_invalid_record_is_reported_while_the_rest_of_the_batch_applies() -> Result<()> {
    let h = Harness::new().await?;
    let try_ = change(
        "InventoryRedisReserved",
        "evt_ok_try",
        "op_try_ok",
        392,
        [100, 72, 8, 20],
    );
    // Written as InventoryRedisReserved, but its data says CONFIRM.
    let mut mismatch = change(
        "InventoryRedisReserved",
        "evt_bad_kind",
        "op_bad_kind",
        393,
        [100, 72, 6, 22],
    );
    mismatch["data"]["action"] = json!("CONFIRM");
    let mut wrong_key = change(
        "InventoryRedisConfirmed",
        "evt_bad_key",
        "op_bad_key",
        394,
        [100, 72, 6, 22],
    );
    wrong_key["partition_key"] = json!("another_bucket");
    let mut bad_date = change(
        "InventoryRedisConfirmed",
        "evt_bad_date",
        "op_bad_date",
        396,
        [100, 72, 6, 22],
    );
    bad_date["data"]["stock_date"] = json!("2026-02-30");
    let confirm = change(
        "InventoryRedisConfirmed",
        "evt_ok_confirm",
        "op_confirm_ok",
        395,
        [100, 72, 6, 22],
    );
    let lifecycle = example("InventoryReserved");
    let batch = vec![
        h.record("InventoryRedisReserved", &try_).await?,
        h.record("InventoryRedisReserved", &mismatch).await?,
        h.record("InventoryRedisConfirmed", &wrong_key).await?,
        h.record("InventoryRedisConfirmed", &confirm).await?,
        h.record("InventoryRedisConfirmed", &bad_date).await?,
        h.record("InventoryReserved", &lifecycle).await?,
    ];
    let results = h.apply(&batch).await;
    let outcome: Vec<&str> = results
        .iter()
        .map(|r| match r {
            Ok(Applied::Applied) => "applied",
            Err(Failure::Invalid(_)) => "invalid",
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    assert_eq!(
        outcome,
        ["applied", "invalid", "invalid", "applied", "invalid", "invalid"]
    );
    let reason = |i: usize| match &results[i] {
        Err(Failure::Invalid(reason)) => reason.clone(),
        _ => String::new(),
    };
    assert!(
        reason(1).contains("InventoryRedisConfirmed"),
        "{}",
        reason(1)
    );
    assert!(reason(2).contains("partition_key"), "{}", reason(2));
    assert!(reason(4).contains("stock_date"), "{}", reason(4));
    assert!(reason(5).contains("not a stock-change"), "{}", reason(5));

    assert_eq!(h.snapshot().await?, Some((100, 72, 6, 22, 0, 395)));
    assert_eq!(
        count(&h.pool, "inventory_ledger").await?,
        2,
        "an invalid event books nothing"
    );
    Ok(())
}

#[tokio::test]
async fn the_deficit_comes_from_init_and_adjust_and_is_kept_by_reservation_steps() -> Result<()> {
    let h = Harness::new().await?;
    let batch = vec![
        h.record("StockBucketInitialized", &example("StockBucketInitialized"))
            .await?,
        h.record(
            "StockBaselineAdjusted",
            &example("StockBaselineAdjusted.deficit"),
        )
        .await?,
    ];
    h.apply(&batch).await;
    assert_eq!(h.snapshot().await?, Some((20, 0, 4, 25, 9, 421)));

    let confirm = change(
        "InventoryRedisConfirmed",
        "evt_after_deficit",
        "op_confirm_after_deficit",
        422,
        [20, 0, 2, 27],
    );
    let r = h.record("InventoryRedisConfirmed", &confirm).await?;
    h.apply(&[r]).await;
    assert_eq!(h.snapshot().await?, Some((20, 0, 2, 27, 9, 422)));

    // A stale adjust does not touch the deficit either.
    let mut stale = example("StockBaselineAdjusted");
    stale["event_id"] = json!("evt_stale_adjust");
    stale["data"]["operation_id"] = json!("op_stale_adjust");
    stale["data"]["redis_version"] = json!(400);
    let r = h.record("StockBaselineAdjusted", &stale).await?;
    h.apply(&[r]).await;
    assert_eq!(h.snapshot().await?, Some((20, 0, 2, 27, 9, 422)));

    // A newer init (re-initialised bucket) resets it.
    let mut init = example("StockBucketInitialized");
    init["event_id"] = json!("evt_reinit");
    init["data"]["operation_id"] = json!("op_reinit");
    init["data"]["redis_version"] = json!(430);
    let r = h.record("StockBucketInitialized", &init).await?;
    h.apply(&[r]).await;
    assert_eq!(h.snapshot().await?, Some((100, 100, 0, 0, 0, 430)));
    Ok(())
}

#[tokio::test]
async fn an_unreachable_database_fails_the_batch_as_retryable() -> Result<()> {
    let settings = settings()?;
    let encoder = Encoder::new(codec(&settings)?, unique("projector-test"))?;
    let record = encoder
        .record("InventoryRedisReserved", &example("InventoryRedisReserved"))
        .await?;
    // Nothing listens on port 1.
    let pool = stocksvr_store::mysql_pool(
        "mysql://stocksvr:stocksvr@127.0.0.1:1/stocksvr",
        1,
        std::time::Duration::from_millis(500),
    )?;
    let projector = Projector::new(pool, GROUP)?;
    match projector.handle(&[record]).await {
        Err(Failure::Unavailable { dependency, .. }) => {
            assert_eq!(dependency, stocksvr_pipeline::failure::Dependency::Mysql)
        }
        other => panic!("expected Retryable, got {other:?}"),
    }
    Ok(())
}

#[tokio::test]
async fn an_unmigrated_database_is_fatal() -> Result<()> {
    let settings = settings()?;
    let pool = fresh_database(&settings).await?;
    let encoder = Encoder::new(codec(&settings)?, unique("projector-test"))?;
    let record = encoder
        .record("InventoryRedisReserved", &example("InventoryRedisReserved"))
        .await?;
    let projector = Projector::new(pool.pool.clone(), GROUP)?;
    match projector.handle(&[record]).await {
        // The classifier's reason is the server's: it names the missing table.
        Err(Failure::Fatal(reason)) => assert!(
            reason.contains("inventory_ledger") && reason.contains("doesn't exist"),
            "{reason}"
        ),
        other => panic!("expected Fatal, got {other:?}"),
    }
    Ok(())
}

#[tokio::test]
async fn an_empty_group_is_refused() -> Result<()> {
    let settings = settings()?;
    let pool = stocksvr_store::mysql_pool(
        settings.mysql.url.expose(),
        1,
        std::time::Duration::from_secs(1),
    )?;
    assert!(Projector::new(pool.clone(), "").is_err());
    assert_eq!(Projector::new(pool, "g".repeat(65))?.group().len(), 65);
    Ok(())
}

/// `stocksvr_projection_delay_seconds`: one sample per event booked, from its occurred_at to
/// the commit of its batch; a redelivery books nothing and adds no sample. A recorder of this
/// test's own (one thread) keeps the other tests' batches out.
#[tokio::test]
async fn the_projection_delay_runs_from_occurred_at_to_the_commit_once_per_event() -> Result<()> {
    use stocksvr_telemetry::names;
    let capture = stocksvr_telemetry::testing::Capture::default();
    let _recorder = metrics::set_default_local_recorder(&capture);
    let h = Harness::new().await?;
    let mut late = change(
        "InventoryRedisReserved",
        "evt_delay_late",
        "op_delay_late",
        10,
        [100, 99, 1, 0],
    );
    // Written 4 s ago in another offset: the delay is about 4 s whatever the zone.
    let four_ago = chrono::Utc::now() - chrono::TimeDelta::seconds(4);
    late["occurred_at"] = json!(four_ago
        .with_timezone(&chrono::FixedOffset::east_opt(8 * 3600).expect("offset"))
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, false));
    let mut now = change(
        "InventoryRedisConfirmed",
        "evt_delay_now",
        "op_delay_now",
        11,
        [100, 99, 0, 1],
    );
    now["occurred_at"] = json!(chrono::Utc::now().to_rfc3339());
    let started = std::time::Instant::now();
    let batch = [
        h.record("InventoryRedisReserved", &late).await?,
        h.record("InventoryRedisConfirmed", &now).await?,
    ];
    assert_eq!(
        h.apply(&batch).await,
        vec![Ok(Applied::Applied), Ok(Applied::Applied)]
    );
    let took = started.elapsed().as_secs_f64();
    let mut delays = capture.histogram(names::PROJECTION_DELAY_SECONDS, &[]);
    delays.sort_by(f64::total_cmp);
    assert_eq!(delays.len(), 2, "{delays:?}");
    assert!(delays[0] <= took + 0.01, "{delays:?}, batch took {took} s");
    assert!(
        delays[1] >= 4.0 - 0.01 && delays[1] <= 4.0 + took + 0.01,
        "{delays:?}, batch took {took} s"
    );

    let redelivered = h.record("InventoryRedisReserved", &late).await?;
    assert_eq!(h.apply(&[redelivered]).await, vec![Ok(Applied::Duplicate)]);
    assert_eq!(
        capture
            .histogram(names::PROJECTION_DELAY_SECONDS, &[])
            .len(),
        2,
        "a duplicate is not booked again"
    );
    Ok(())
}

const OTHER_BUCKET: &str = "bucket_10001_90002_20260726";

/// A stock change on `bucket` (its dish follows the bucket id) for `reservation`.
fn step(
    file: &str,
    event_id: &str,
    operation_id: &str,
    version: i64,
    after: [i64; 4],
    bucket: &str,
    reservation: u64,
) -> Json {
    let mut json = change(file, event_id, operation_id, version, after);
    json["partition_key"] = json!(bucket);
    json["data"]["stock_bucket_id"] = json!(bucket);
    json["data"]["dish_id"] = json!(if bucket == OTHER_BUCKET {
        90_002
    } else {
        90_001
    });
    json["data"]["reservation_id"] = json!(reservation);
    json
}

/// Everything a projection writes, without the times it was written at: snapshot rows,
/// ledger rows, reservation sync columns.
async fn projected_state(pool: &MySqlPool) -> Result<Vec<Vec<String>>> {
    let mut state = Vec::new();
    for sql in [
        "SELECT CAST(JSON_ARRAY(stock_bucket_id, merchant_id, dish_id, stock_date, total_stock, \
         available_stock, reserved_stock, sold_stock, deficit_stock, redis_version) AS CHAR) \
         FROM dish_stock_snapshot ORDER BY stock_bucket_id",
        "SELECT CAST(JSON_ARRAY(operation_id, reservation_id, stock_bucket_id, \
         order_id, order_item_id, merchant_id, dish_id, action, quantity, available_delta, \
         reserved_delta, sold_delta, total_delta, redis_version) AS CHAR) \
         FROM inventory_ledger ORDER BY operation_id",
        "SELECT CAST(JSON_ARRAY(id, synced_redis_version, sync_status) AS CHAR) \
         FROM inventory_reservation ORDER BY id",
    ] {
        state.push(sqlx::query_scalar(sql).fetch_all(pool).await?);
    }
    Ok(state)
}

/// The projector's own counters as `capture` saw them.
fn tally_of(capture: &stocksvr_telemetry::testing::Capture) -> Vec<String> {
    use stocksvr_telemetry::names;
    let mut tally = vec![
        format!(
            "duplicates {:?}",
            capture.counter(names::PROJECTOR_DUPLICATES, &[])
        ),
        format!("stale {:?}", capture.counter(names::PROJECTOR_STALE, &[])),
    ];
    for labels in capture.label_sets(names::PROJECTOR_EVENTS_PROJECTED) {
        let labels: Vec<(&str, &str)> = labels
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        tally.push(format!(
            "projected {labels:?} {:?}",
            capture.counter(names::PROJECTOR_EVENTS_PROJECTED, &labels)
        ));
    }
    tally.sort();
    tally
}

/// The set-based batch against the per-event semantics: the same batch handled at once on
/// one database and one record per batch on another ends in the same rows, the same
/// per-record results and the same counters.
#[tokio::test]
async fn a_batch_ends_exactly_where_its_events_one_by_one_end() -> Result<()> {
    let (id, other_id) = (100_123_001, 100_123_002);
    let before = [
        ("StockBucketInitialized", example("StockBucketInitialized")),
        (
            "InventoryRedisReserved",
            step(
                "InventoryRedisReserved",
                "evt_pre",
                "op_pre",
                392,
                [100, 72, 8, 20],
                BUCKET,
                id,
            ),
        ),
    ];
    let mut bad_date = step(
        "InventoryRedisConfirmed",
        "evt_eq_bad",
        "op_eq_bad",
        430,
        [20, 0, 4, 25],
        BUCKET,
        id,
    );
    bad_date["data"]["stock_date"] = json!("2026-02-30");
    let try_after_deficit = step(
        "InventoryRedisReserved",
        "evt_eq_try",
        "op_eq_try",
        422,
        [20, 0, 6, 23],
        BUCKET,
        id,
    );
    let batch = [
        // Booked already.
        (
            "InventoryRedisReserved",
            step(
                "InventoryRedisReserved",
                "evt_pre",
                "op_pre",
                392,
                [100, 72, 8, 20],
                BUCKET,
                id,
            ),
        ),
        // Sets the deficit to 9 at 421; the Try after it at 422.
        (
            "StockBaselineAdjusted",
            example("StockBaselineAdjusted.deficit"),
        ),
        ("InventoryRedisReserved", try_after_deficit.clone()),
        // Stale: older than the adjust before it in the batch.
        (
            "InventoryRedisReserved",
            step(
                "InventoryRedisReserved",
                "evt_eq_old",
                "op_eq_old",
                400,
                [20, 1, 5, 23],
                BUCKET,
                other_id,
            ),
        ),
        // A bucket without a row yet.
        (
            "InventoryRedisReserved",
            step(
                "InventoryRedisReserved",
                "evt_eq_b1",
                "op_eq_b1",
                5,
                [50, 48, 2, 0],
                OTHER_BUCKET,
                other_id,
            ),
        ),
        // Twice in one batch.
        ("InventoryRedisReserved", try_after_deficit),
        (
            "InventoryRedisConfirmed",
            step(
                "InventoryRedisConfirmed",
                "evt_eq_b2",
                "op_eq_b2",
                7,
                [50, 48, 0, 2],
                OTHER_BUCKET,
                other_id,
            ),
        ),
        // Stale against the version created in this batch.
        (
            "InventoryRedisReserved",
            step(
                "InventoryRedisReserved",
                "evt_eq_b3",
                "op_eq_b3",
                6,
                [50, 47, 3, 0],
                OTHER_BUCKET,
                id,
            ),
        ),
        // The Try's operation announced under another event id: booked already.
        (
            "InventoryRedisReserved",
            step(
                "InventoryRedisReserved",
                "evt_eq_try_again",
                "op_eq_try",
                422,
                [20, 0, 6, 23],
                BUCKET,
                id,
            ),
        ),
        // No bucket version: no snapshot, a sync at 0.
        (
            "InventoryRedisCanceled",
            step(
                "InventoryRedisCanceled.empty-rollback",
                "evt_eq_empty",
                "op_eq_empty",
                0,
                [0, 0, 0, 0],
                BUCKET,
                other_id,
            ),
        ),
        ("InventoryRedisConfirmed", bad_date),
    ];

    let mut outcomes = Vec::new();
    for at_once in [true, false] {
        let h = Harness::new().await?;
        insert_reservation(&h.pool, id, BUCKET, Some(422)).await?;
        insert_reservation(&h.pool, other_id, BUCKET, None).await?;
        for (name, json) in &before {
            let r = h.record(name, json).await?;
            assert_eq!(h.apply(&[r]).await, vec![Ok(Applied::Applied)]);
        }
        let mut records = Vec::new();
        for (name, json) in &batch {
            records.push(h.record(name, json).await?);
        }
        let capture = stocksvr_telemetry::testing::Capture::default();
        let results = {
            let _recorder = metrics::set_default_local_recorder(&capture);
            if at_once {
                h.apply(&records).await
            } else {
                let mut results = Vec::new();
                for r in records {
                    results.extend(h.apply(&[r]).await);
                }
                results
            }
        };
        let results: Vec<String> = results
            .iter()
            .map(|r| match r {
                Err(Failure::Invalid(_)) => "invalid".to_owned(),
                other => format!("{other:?}"),
            })
            .collect();
        outcomes.push((results, projected_state(&h.pool).await?, tally_of(&capture)));
    }
    let one_by_one = outcomes.pop().expect("two runs");
    let at_once = outcomes.pop().expect("two runs");
    assert_eq!(at_once.0, one_by_one.0, "per-record results");
    assert_eq!(at_once.1, one_by_one.1, "rows");
    assert_eq!(at_once.2, one_by_one.2, "counters");

    // And what that is.
    let (applied, duplicate) = ("Ok(Applied)", "Ok(Duplicate)");
    assert_eq!(
        at_once.0,
        [
            duplicate, applied, applied, applied, applied, duplicate, applied, applied, duplicate,
            applied, "invalid"
        ]
    );
    let [snapshots, ledger, reservations] = &at_once.1[..] else {
        panic!("three tables");
    };
    assert_eq!(
        snapshots,
        &[
            r#"["bucket_10001_90001_20260726", 10001, 90001, "2026-07-26", 20, 0, 6, 23, 9, 422]"#,
            r#"["bucket_10001_90002_20260726", 10001, 90002, "2026-07-26", 50, 48, 0, 2, 0, 7]"#,
        ]
    );
    assert_eq!(ledger.len(), 2 + 7, "{ledger:?}");
    assert_eq!(
        reservations,
        &[format!("[{id}, 422, 20]"), format!("[{other_id}, 400, 10]")]
    );
    assert!(
        at_once.2.contains(&"stale Some(2)".to_owned()),
        "{:?}",
        at_once.2
    );
    assert!(at_once.2.contains(&"duplicates Some(3)".to_owned()));
    Ok(())
}

/// Two operation ids the ledger's collation takes for one: the booking finds one row fewer
/// than planned (as it would had another consumer booked one meanwhile), and the batch is
/// redone event by event, the second being a duplicate.
#[tokio::test]
async fn a_claim_that_does_not_go_as_planned_falls_back_to_event_by_event() -> Result<()> {
    let h = Harness::new().await?;
    let upper = change(
        "InventoryRedisReserved",
        "evt_case_upper",
        "OP_CASE",
        392,
        [100, 72, 8, 20],
    );
    let lower = change(
        "InventoryRedisConfirmed",
        "evt_case_lower",
        "op_case",
        395,
        [100, 72, 6, 22],
    );
    let batch = [
        h.record("InventoryRedisReserved", &upper).await?,
        h.record("InventoryRedisConfirmed", &lower).await?,
    ];
    assert_eq!(
        h.apply(&batch).await,
        vec![Ok(Applied::Applied), Ok(Applied::Duplicate)]
    );
    assert_eq!(count(&h.pool, "inventory_ledger").await?, 1);
    assert_eq!(h.snapshot().await?, Some((100, 72, 8, 20, 0, 392)));
    Ok(())
}

/// A batch costs the same statements whatever its size, where one by one costs statements
/// per event: the projector's statements are set-based (per lane), which is why it batches.
/// Counted on a connection of its own (session counters), a fresh one per run so each
/// prepares its statements anew; the same ten buckets each time, split into the same lanes,
/// each with its snapshot row already (a bucket's first event inserts it, the others update
/// it: another statement).
#[tokio::test]
async fn a_batch_costs_the_same_statements_whatever_its_size() -> Result<()> {
    let h = Harness::new().await?;
    statements(&h, "first events", 10, true).await?;
    let small = statements(&h, "small batch", 10, true).await?;
    let large = statements(&h, "large batch", 100, true).await?;
    let single = statements(&h, "one by one", 100, false).await?;
    for (label, counters) in [
        ("batch of 10", &small),
        ("batch of 100", &large),
        ("100 one by one", &single),
    ] {
        let all: Vec<String> = counters.iter().map(|(k, v)| format!("{k} {v}")).collect();
        println!("{label}: {}", all.join(", "));
    }
    assert_eq!(
        large, small,
        "a batch of 100 events made other statements than one of 10"
    );
    assert!(
        single["Questions"] >= 100,
        "one by one, 100 events took {} statements",
        single["Questions"]
    );
    Ok(())
}

/// Applies `events` InventoryRedisReserved events over ten buckets, at once or one by one,
/// and returns the statements that took (the session's counters before and after).
async fn statements(
    h: &Harness,
    label: &str,
    events: u64,
    at_once: bool,
) -> Result<std::collections::BTreeMap<String, i64>> {
    let pool = stocksvr_store::mysql_pool(&h._db.url, 1, std::time::Duration::from_secs(10))?;
    // Lanes for batches of any size: both batch sizes split the same way.
    let projector = Projector::new(pool.clone(), format!("measure.{label}"))?.with_lanes(LANES, 1);
    // Each run's versions above the previous runs', so every event applies.
    let first_version = match label {
        "first events" => 1,
        "small batch" => 100,
        "large batch" => 1_000,
        _ => 10_000,
    };
    let mut records = Vec::new();
    for i in 0..events {
        let bucket_dish = 90_001 + i % 10;
        let bucket = format!("bucket_10001_{bucket_dish}_20260726");
        let mut json = change(
            "InventoryRedisReserved",
            &format!("evt_measure_{label}_{i}"),
            &format!("op_measure_{label}_{i}"),
            first_version + i as i64,
            [100, 98, 2, 0],
        );
        json["partition_key"] = json!(bucket);
        json["data"]["stock_bucket_id"] = json!(bucket);
        json["data"]["dish_id"] = json!(bucket_dish);
        json["data"]["reservation_id"] = json!(200_000 + first_version as u64 + i);
        records.push(h.record("InventoryRedisReserved", &json).await?);
    }
    let counters = || async {
        let rows: Vec<(String, String)> = sqlx::query_as(
            "SHOW SESSION STATUS WHERE Variable_name IN ('Questions', 'Com_begin', \
             'Com_commit', 'Com_select', 'Com_insert', 'Com_update', 'Com_update_multi', \
             'Com_stmt_prepare', 'Com_stmt_execute')",
        )
        .fetch_all(&pool)
        .await?;
        let mut counters = std::collections::BTreeMap::new();
        for (name, value) in rows {
            counters.insert(name, value.parse::<i64>()?);
        }
        anyhow::Ok(counters)
    };
    let start = counters().await?;
    let mut results = Vec::new();
    if at_once {
        results.extend(projector.handle(&records).await.expect("applies"));
    } else {
        for r in records {
            results.extend(projector.handle(&[r]).await.expect("applies"));
        }
    }
    let end = counters().await?;
    assert!(
        results.iter().all(|r| matches!(r, Ok(Applied::Applied))),
        "{label}: {results:?}"
    );
    pool.close().await;
    Ok(end
        .into_iter()
        .map(|(name, n)| {
            let before = start.get(&name).copied().unwrap_or(0);
            (name, n - before)
        })
        .collect())
}

/// A batch over buckets of both lanes commits lane by lane: a lane the database refuses
/// fails the batch while the other lane is already durable, and the retried batch finds
/// that lane's events as duplicates, applies the rest, and books nothing twice.
#[tokio::test]
async fn a_refused_lane_fails_the_batch_and_its_retry_applies_nothing_twice() -> Result<()> {
    use stocksvr_projector::lane_of;
    assert_ne!(
        lane_of(BUCKET, LANES),
        lane_of(OTHER_BUCKET, LANES),
        "the test needs the two buckets in different lanes"
    );
    let h = Harness::new().await?;
    let (id, other_id) = (100_124_001, 100_124_002);
    let events = [
        (
            "InventoryRedisReserved",
            step(
                "InventoryRedisReserved",
                "evt_lane_a",
                "op_lane_a",
                392,
                [100, 72, 8, 20],
                BUCKET,
                id,
            ),
        ),
        (
            "InventoryRedisReserved",
            step(
                "InventoryRedisReserved",
                "evt_lane_b",
                "op_lane_b",
                7,
                [50, 48, 2, 0],
                OTHER_BUCKET,
                other_id,
            ),
        ),
        (
            "InventoryRedisConfirmed",
            step(
                "InventoryRedisConfirmed",
                "evt_lane_c",
                "op_lane_c",
                393,
                [100, 72, 6, 22],
                BUCKET,
                id,
            ),
        ),
    ];
    let mut batch = Vec::new();
    for (name, json) in &events {
        batch.push(h.record(name, json).await?);
    }
    // The server refuses the other bucket's snapshot row, as it would a full disk.
    sqlx::query(
        "CREATE TRIGGER refuse_other_bucket BEFORE INSERT ON dish_stock_snapshot FOR EACH ROW \
         IF NEW.stock_bucket_id = 'bucket_10001_90002_20260726' THEN \
         SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'refused by the test'; END IF",
    )
    .execute(&h.pool)
    .await?;
    let failed = h.handle(&batch).await;
    assert!(
        failed.is_err(),
        "a refused lane fails the batch: {failed:?}"
    );
    let booked: Vec<String> =
        sqlx::query_scalar("SELECT operation_id FROM inventory_ledger ORDER BY operation_id")
            .fetch_all(&h.pool)
            .await?;
    assert_eq!(
        booked,
        ["op_lane_a", "op_lane_c"],
        "the other lane committed on its own"
    );
    assert_eq!(snapshot(&h.pool, OTHER_BUCKET).await?, None);

    sqlx::query("DROP TRIGGER refuse_other_bucket")
        .execute(&h.pool)
        .await?;
    assert_eq!(
        h.apply(&batch).await,
        vec![
            Ok(Applied::Duplicate),
            Ok(Applied::Applied),
            Ok(Applied::Duplicate)
        ]
    );
    assert_eq!(count(&h.pool, "inventory_ledger").await?, 3);
    assert_eq!(h.snapshot().await?, Some((100, 72, 6, 22, 0, 393)));
    assert_eq!(
        snapshot(&h.pool, OTHER_BUCKET).await?,
        Some((50, 48, 2, 0, 0, 7))
    );
    Ok(())
}

/// Rows the server wrote (inserted, updated) on `pool`'s one connection so far: its session
/// counters, which count a row an `INSERT IGNORE` skipped or an upsert found as a write too.
async fn row_writes(pool: &MySqlPool) -> Result<(i64, i64)> {
    let rows: Vec<(String, String)> = sqlx::query_as(
        "SHOW SESSION STATUS WHERE Variable_name IN ('Handler_write', 'Handler_update')",
    )
    .fetch_all(pool)
    .await?;
    let mut writes = (0, 0);
    for (name, value) in rows {
        match name.as_str() {
            "Handler_write" => writes.0 = value.parse()?,
            "Handler_update" => writes.1 = value.parse()?,
            _ => {}
        }
    }
    Ok(writes)
}

/// A projector on a pool of one connection of its own, whose session counters
/// [`row_writes`] then reads: what the batches handed to it wrote, and nothing else.
fn counted(h: &Harness, group: &str) -> Result<(Projector, MySqlPool)> {
    let pool = stocksvr_store::mysql_pool(&h._db.url, 1, std::time::Duration::from_secs(10))?;
    Ok((
        Projector::new(pool.clone(), group)?.with_lanes(LANES, 1),
        pool,
    ))
}

/// Replay is a no-op: a batch redelivered after newer events of its buckets finds every
/// operation booked, books nothing twice, moves no snapshot back (nor its updated_at) and
/// writes no row at all; redelivered beside a new event, only the new one applies.
#[tokio::test]
async fn a_redelivered_batch_books_nothing_twice_and_moves_no_snapshot_back() -> Result<()> {
    let h = Harness::new().await?;
    let (id, other_id) = (100_125_001, 100_125_002);
    insert_reservation(&h.pool, id, BUCKET, Some(401)).await?;
    insert_reservation(&h.pool, other_id, OTHER_BUCKET, Some(7)).await?;
    let first = [
        (
            "InventoryRedisReserved",
            "re_a",
            392,
            [100, 72, 8, 20],
            BUCKET,
            id,
        ),
        (
            "InventoryRedisReserved",
            "re_b",
            5,
            [50, 48, 2, 0],
            OTHER_BUCKET,
            other_id,
        ),
        (
            "InventoryRedisConfirmed",
            "re_c",
            395,
            [100, 72, 6, 22],
            BUCKET,
            id,
        ),
        (
            "InventoryRedisConfirmed",
            "re_d",
            7,
            [50, 48, 0, 2],
            OTHER_BUCKET,
            other_id,
        ),
    ];
    let mut batch = Vec::new();
    for (name, key, version, after, bucket, reservation) in first {
        let json = step(
            name,
            &format!("evt_{key}"),
            &format!("op_{key}"),
            version,
            after,
            bucket,
            reservation,
        );
        batch.push(h.record(name, &json).await?);
    }
    assert_eq!(h.apply(&batch).await, vec![Ok(Applied::Applied); 4]);
    let newer = step(
        "InventoryRedisCanceled",
        "evt_re_e",
        "op_re_e",
        401,
        [100, 74, 4, 22],
        BUCKET,
        id,
    );
    let newer = h.record("InventoryRedisCanceled", &newer).await?;
    assert_eq!(h.apply(&[newer]).await, vec![Ok(Applied::Applied)]);

    let state = || async {
        let updated: Vec<chrono::NaiveDateTime> = sqlx::query_scalar(
            "SELECT updated_at FROM dish_stock_snapshot ORDER BY stock_bucket_id",
        )
        .fetch_all(&h.pool)
        .await?;
        anyhow::Ok((projected_state(&h.pool).await?, updated))
    };
    let before = state().await?;
    assert_eq!(h.snapshot().await?, Some((100, 74, 4, 22, 0, 401)));
    // Past the millisecond updated_at is stamped in, a rewrite would show.
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;

    let (projector, pool) = counted(&h, GROUP)?;
    let start = row_writes(&pool).await?;
    let results = projector.handle(&batch).await.expect("applies");
    let end = row_writes(&pool).await?;
    assert_eq!(results, vec![Ok(Applied::Duplicate); 4]);
    assert_eq!(
        (end.0 - start.0, end.1 - start.1),
        (0, 0),
        "rows written (inserted, updated) by a redelivered batch"
    );
    pool.close().await;
    assert_eq!(state().await?, before);

    let new = step(
        "InventoryRedisRefunded",
        "evt_re_f",
        "op_re_f",
        402,
        [100, 75, 4, 21],
        BUCKET,
        id,
    );
    batch.push(h.record("InventoryRedisRefunded", &new).await?);
    let mut expected = vec![Ok(Applied::Duplicate); 4];
    expected.push(Ok(Applied::Applied));
    assert_eq!(h.apply(&batch).await, expected);
    assert_eq!(count(&h.pool, "inventory_ledger").await?, 6);
    assert_eq!(h.snapshot().await?, Some((100, 75, 4, 21, 0, 402)));
    assert_eq!(
        snapshot(&h.pool, OTHER_BUCKET).await?,
        Some((50, 48, 0, 2, 0, 7))
    );
    assert_eq!(sync_of(&h.pool, id).await?.0, 402);
    Ok(())
}

/// Rows written per projected event, from the server's row counters: a ledger row per
/// event, one snapshot row per bucket and batch (an UPDATE once the bucket has a row, an
/// INSERT only for its first event), one reservation sync per reservation. Hot: one bucket
/// for the whole batch; cold: every event a bucket of its own that has a row already; new:
/// buckets without a row yet.
#[tokio::test]
async fn rows_written_per_projected_event() -> Result<()> {
    let h = Harness::new().await?;
    let (projector, pool) = counted(&h, GROUP)?;
    const EVENTS: u64 = 100;
    let mut figures = Vec::new();
    for (case, buckets, first_version) in
        [("new", EVENTS, 1), ("cold", EVENTS, 100), ("hot", 1, 1_000)]
    {
        let mut records = Vec::new();
        for i in 0..EVENTS {
            let dish = 91_001 + i % buckets;
            let bucket = format!("bucket_10001_{dish}_20260726");
            let reservation = 300_000 + first_version as u64 * 1_000 + i;
            insert_reservation(&h.pool, reservation, &bucket, Some(1)).await?;
            let mut json = change(
                "InventoryRedisReserved",
                &format!("evt_rows_{case}_{i}"),
                &format!("op_rows_{case}_{i}"),
                first_version + i as i64,
                [100, 98, 2, 0],
            );
            json["partition_key"] = json!(bucket);
            json["data"]["stock_bucket_id"] = json!(bucket);
            json["data"]["dish_id"] = json!(dish);
            json["data"]["reservation_id"] = json!(reservation);
            records.push(h.record("InventoryRedisReserved", &json).await?);
        }
        let start = row_writes(&pool).await?;
        let results = projector.handle(&records).await.expect("applies");
        let end = row_writes(&pool).await?;
        assert!(
            results.iter().all(|r| r == &Ok(Applied::Applied)),
            "{case}: {results:?}"
        );
        let (written, updated) = (end.0 - start.0, end.1 - start.1);
        println!(
            "{case}: {EVENTS} events over {buckets} buckets: {written} rows inserted, \
             {updated} updated; {:.2} row writes per event",
            (written + updated) as f64 / EVENTS as f64
        );
        figures.push((case, written, updated));
    }
    pool.close().await;
    let n = EVENTS as i64;
    assert_eq!(
        figures,
        [
            // Ledger and snapshot inserted; the reservations synced.
            ("new", n + n, n),
            // Ledger inserted; snapshots and reservations updated.
            ("cold", n, n + n),
            // Ledger inserted; the one snapshot and the reservations updated.
            ("hot", n, 1 + n),
        ]
    );
    Ok(())
}

/// A batch waits for no row it does not write, also on tables of a few rows, where the server
/// would rather scan than look a row up (and an UPDATE locks every row it scans): another
/// transaction holding a third bucket's snapshot row and its reservation's row does not hold
/// up a batch over two other buckets and reservations.
#[tokio::test]
async fn a_batch_waits_for_no_row_it_does_not_write() -> Result<()> {
    let h = Harness::new().await?;
    let third = "bucket_10001_90003_20260726";
    let buckets = [(BUCKET, 90_001), (OTHER_BUCKET, 90_002), (third, 90_003)];
    let step_on = |key: &str, version: i64, bucket: &str, dish: u64, reservation: u64| {
        let mut json = change(
            "InventoryRedisReserved",
            &format!("evt_{key}"),
            &format!("op_{key}"),
            version,
            [100, 99, 1, 0],
        );
        json["partition_key"] = json!(bucket);
        json["data"]["stock_bucket_id"] = json!(bucket);
        json["data"]["dish_id"] = json!(dish);
        json["data"]["reservation_id"] = json!(reservation);
        json
    };
    // Each bucket's row first, a batch each.
    for (i, (bucket, dish)) in buckets.iter().enumerate() {
        let reservation = 100_126_001 + i as u64;
        insert_reservation(&h.pool, reservation, bucket, Some(2)).await?;
        let json = step_on(&format!("wait_{i}_1"), 1, bucket, *dish, reservation);
        let r = h.record("InventoryRedisReserved", &json).await?;
        assert_eq!(h.apply(&[r]).await, vec![Ok(Applied::Applied)]);
    }

    let mut holder = h.pool.begin().await?;
    sqlx::query(
        "SELECT redis_version FROM dish_stock_snapshot WHERE stock_bucket_id = ? FOR UPDATE",
    )
    .bind(third)
    .fetch_one(&mut *holder)
    .await?;
    sqlx::query("SELECT version FROM inventory_reservation WHERE id = ? FOR UPDATE")
        .bind(100_126_003u64)
        .fetch_one(&mut *holder)
        .await?;
    let mut batch = Vec::new();
    for (i, (bucket, dish)) in buckets.iter().take(2).enumerate() {
        let json = step_on(
            &format!("wait_{i}_2"),
            2,
            bucket,
            *dish,
            100_126_001 + i as u64,
        );
        batch.push(h.record("InventoryRedisReserved", &json).await?);
    }
    // One lane: both buckets in one statement per table, the shape that would scan.
    let projector = Projector::new(h.pool.clone(), GROUP)?.with_lanes(1, 1);
    let results =
        tokio::time::timeout(std::time::Duration::from_secs(10), projector.handle(&batch))
            .await
            .map_err(|_| anyhow::anyhow!("the batch waited for a row it does not write"))?;
    assert_eq!(results, Ok(vec![Ok(Applied::Applied); 2]));
    holder.rollback().await?;
    assert_eq!(sync_of(&h.pool, 100_126_002).await?, (2, 20));
    assert_eq!(
        snapshot(&h.pool, OTHER_BUCKET).await?,
        Some((100, 99, 1, 0, 0, 2))
    );
    Ok(())
}
