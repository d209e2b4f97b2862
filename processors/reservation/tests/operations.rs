//! Stock operations through the operation WAL against real MariaDB and Redis: lazy init
//! under concurrency, lease takeover after a worker died, adjust with a deficit, the bucket
//! lifecycle, cross-day cancel and refund, and the daily job. Each test has its own database
//! and merchant (so its own Redis keys).

mod common;

use chrono::{DateTime, TimeDelta, Utc};
use common::ops::{assert_conserved, done, Ops, DEAD_OWNER};
use std::time::Duration;
use stocksvr_core::bucket::BucketKey;
use stocksvr_core::model::OpCode;
use stocksvr_reservation::operations::{self, init_operation_id};
use stocksvr_reservation::{OpsConfig, OpsError, ServiceError};
use stocksvr_store::lua::Step;
use stocksvr_store::wal::{self, Refusal};
use stocksvr_test_support::{eventually, eventually_ok};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn twenty_concurrent_first_trys_initialise_the_bucket_once() {
    let f = Ops::new(OpsConfig::default()).await;
    // Baseline only, as the daily job would have left it had its Redis step failed.
    stocksvr_store::baselines::ensure_baseline(&f.pool, &f.baseline(f.today, 100))
        .await
        .expect("baseline");
    assert!(f.redis(f.today).await.is_none());
    let mut tasks = Vec::new();
    for item in 1..=20u64 {
        let (service, req) = (f.service.clone(), f.request(item, 2));
        tasks.push(tokio::spawn(async move { service.try_reserve(&req).await }));
    }
    for t in tasks {
        let reply = t.await.expect("task").expect("try");
        assert_eq!(reply.reservation.status_name(), "RESERVED");
    }
    let n = f.redis(f.today).await.expect("bucket initialised");
    assert_eq!((n.total, n.available, n.reserved, n.sold), (100, 60, 40, 0));
    // One init (version 1) then twenty Trys: a second init would have bumped the version.
    assert_eq!(n.version, 21);
    assert_conserved(&n);
    let rows = f.wal_rows(&f.bucket(f.today)).await;
    assert_eq!(rows.len(), 1, "one WAL row for the bucket: {rows:?}");
    assert_eq!(
        rows[0].operation_id,
        init_operation_id(&f.bucket(f.today), 1)
    );
    assert_eq!(rows[0].status(), Some(wal::WalStatus::Succeeded));
    assert_eq!(f.outbox_count("StockBucketInitialized").await, 1);
    assert_eq!(f.outbox_count("InventoryRedisReserved").await, 20);
}

/// A worker that died holding the lease, at both crash windows: after the WAL commit but
/// before Redis, and after Redis but before the completion commit.
#[tokio::test]
async fn a_dead_workers_lease_is_taken_over_after_expiry_and_applied_once() {
    let f = Ops::new(OpsConfig::default()).await;
    for (day, redis_ran) in [(f.today, false), (f.today + TimeDelta::days(1), true)] {
        let b = f.baseline(day, 40);
        let op = f.stuck_init(&b).await;
        assert_eq!(op, init_operation_id(&b.stock_bucket_id, 1));
        if redis_ran {
            let keys = BucketKey::new(f.merchant_id, f.dish_id, day);
            let first = f
                .lua
                .init_bucket(&keys, &op, b.total_stock, 1)
                .await
                .expect("the dead worker's Redis call");
            assert_eq!(first.version, 1);
        }
        // The lease is live: no other worker touches the row.
        let report = f.service.ops().work_once(10).await.expect("round");
        assert_eq!(report.succeeded, 0, "a live lease is respected");
        let row = wal::find_by_op(&f.pool, &op)
            .await
            .expect("find")
            .expect("row");
        assert_eq!(row.lease_owner.as_deref(), Some(DEAD_OWNER));

        // Past the expiry the row is taken over and completed once.
        f.expire_lease(&op).await;
        let report = f.service.ops().work_once(10).await.expect("round");
        assert_eq!(report.succeeded, 1, "taken over: {report:?}");
        let row = wal::find_by_op(&f.pool, &op)
            .await
            .expect("find")
            .expect("row");
        assert_eq!(row.status(), Some(wal::WalStatus::Succeeded));
        let result: serde_json::Value =
            serde_json::from_str(row.result_payload.as_deref().expect("result")).expect("json");
        assert_eq!(result["replayed"], serde_json::json!(redis_ran));
        let n = f.redis(day).await.expect("bucket");
        assert_eq!(
            (n.total, n.available, n.version),
            (40, 40, 1),
            "applied once"
        );
        // Nothing is left for a further round.
        assert_eq!(
            f.service
                .ops()
                .work_once(10)
                .await
                .expect("round")
                .succeeded,
            0
        );
    }
    assert_eq!(f.outbox_count("StockBucketInitialized").await, 2);
}

#[tokio::test]
async fn adjusting_below_reserved_plus_sold_leaves_zero_available_and_a_deficit() {
    let f = Ops::new(OpsConfig::default()).await;
    let bucket = f.bucket(f.today);
    let init = f
        .service
        .ops()
        .init_bucket(&f.baseline(f.today, 100))
        .await
        .expect("init");
    assert!(init.succeeded(), "{init:?}");
    let sold = f.reserve(1, 20).await;
    assert_eq!(
        done(f.service.confirm(sold).await.expect("confirm")),
        "CONFIRMED"
    );
    let held = f.reserve(2, 10).await;

    // Up first: 100 -> 120 adds 20 to available.
    let up = f.service.ops().adjust(&bucket, 120).await.expect("adjust");
    assert!(up.succeeded(), "{up:?}");
    let n = f.redis(f.today).await.expect("bucket");
    assert_eq!(
        (n.total, n.available, n.reserved, n.sold, n.deficit),
        (120, 90, 10, 20, 0)
    );

    // Then below what was accepted: available 0, deficit 10, nothing cancelled.
    let down = f.service.ops().adjust(&bucket, 20).await.expect("adjust");
    assert!(down.succeeded(), "{down:?}");
    let n = f.redis(f.today).await.expect("bucket");
    assert_eq!(
        (n.total, n.available, n.reserved, n.sold, n.deficit),
        (20, 0, 10, 20, 10)
    );
    assert_conserved(&n);
    assert_eq!(
        down.result.as_ref().expect("result")["after"]["deficit"],
        10
    );
    assert_eq!(f.status(sold).await, "CONFIRMED");
    assert_eq!(f.status(held).await, "RESERVED");
    let b = stocksvr_store::baselines::find_baseline(&f.pool, &bucket)
        .await
        .expect("b")
        .expect("baseline");
    assert_eq!((b.total_stock, b.baseline_version), (20, 3));

    // The event the projector books: the deficit, the reason and the available delta.
    let (payload,): (String,) = sqlx::query_as(
        "SELECT CAST(payload AS CHAR) FROM inventory_outbox WHERE event_type = 'StockBaselineAdjusted' \
         ORDER BY id DESC LIMIT 1",
    )
    .fetch_one(&f.pool)
    .await
    .expect("event");
    let e: serde_json::Value = serde_json::from_str(&payload).expect("json");
    assert_eq!(e["data"]["deficit"], 10);
    assert_eq!(e["data"]["reason_code"], "DEFICIT");
    assert_eq!(e["data"]["old_total"], 120);
    assert_eq!(e["data"]["available_delta"], -90);
    assert_eq!(f.outbox_count("StockBaselineAdjusted").await, 2);

    // A new Try finds nothing to sell; the cancel of the held one pays the deficit down first.
    // Asking for the bucket again (baseline now v3) finds it built: a new init operation
    // that changes nothing and books nothing.
    let again = f
        .service
        .ops()
        .init_bucket(&f.baseline(f.today, 100))
        .await
        .expect("init again");
    assert_eq!(again.operation_id, init_operation_id(&bucket, 3));
    assert_eq!(
        again.result.as_ref().expect("result")["effect"],
        "UNCHANGED"
    );
    assert_eq!(f.outbox_count("StockBucketInitialized").await, 1);
    assert_eq!(f.redis(f.today).await.expect("bucket").total, 20);
    let reply = f.service.try_reserve(&f.request(3, 1)).await.expect("try");
    assert_eq!(reply.reservation.status_name(), "REJECTED");
    assert_eq!(
        done(f.service.cancel(held).await.expect("cancel")),
        "CANCELED"
    );
    let n = f.redis(f.today).await.expect("bucket");
    assert_conserved(&n);
    assert_eq!((n.reserved, n.sold), (0, 20));
}

#[tokio::test]
async fn a_closed_bucket_refuses_trys_but_settles_reservations_and_archives_only_when_done() {
    let f = Ops::new(OpsConfig {
        archive_ttl: Duration::from_secs(3600),
        ..OpsConfig::default()
    })
    .await;
    let bucket = f.bucket(f.today);
    f.service
        .ops()
        .init_bucket(&f.baseline(f.today, 50))
        .await
        .expect("init");
    let to_confirm = f.reserve(1, 3).await;
    let to_cancel = f.reserve(2, 4).await;

    // Archive is refused while OPEN, then while reservations are unfinished.
    match f.service.ops().archive(&bucket).await {
        Err(OpsError::Refused(Refusal::NotClosed { .. })) => {}
        other => panic!("archive of an OPEN bucket: {other:?}"),
    }
    let closed = f.service.ops().close(&bucket).await.expect("close");
    assert!(closed.succeeded(), "{closed:?}");
    assert_eq!(
        f.redis(f.today).await.expect("bucket").state.name(),
        "CLOSED"
    );
    match f.service.try_reserve(&f.request(3, 1)).await {
        Err(ServiceError::BucketUnavailable { .. }) => {}
        other => panic!("a Try on a CLOSED bucket: {other:?}"),
    }
    match f.service.ops().archive(&bucket).await {
        Err(OpsError::Refused(Refusal::OpenReservations { open: 2, .. })) => {}
        other => panic!("archive with two open reservations: {other:?}"),
    }

    // Existing reservations still settle.
    assert_eq!(
        done(f.service.confirm(to_confirm).await.expect("c")),
        "CONFIRMED"
    );
    assert_eq!(
        done(f.service.cancel(to_cancel).await.expect("c")),
        "CANCELED"
    );
    let n = f.redis(f.today).await.expect("bucket");
    assert_eq!((n.available, n.reserved, n.sold), (47, 0, 3));

    let archived = f.service.ops().archive(&bucket).await.expect("archive");
    assert!(archived.succeeded(), "{archived:?}");
    let b = stocksvr_store::baselines::find_baseline(&f.pool, &bucket)
        .await
        .expect("b")
        .expect("baseline");
    assert_eq!(b.bucket_status, 30);
    assert_eq!(
        f.redis(f.today).await.expect("bucket").state.name(),
        "ARCHIVED"
    );
    let mut conn = common::redis_conn().await;
    let keys = BucketKey::new(f.merchant_id, f.dish_id, f.today);
    let ttl: i64 = redis::cmd("TTL")
        .arg(keys.stock_key())
        .query_async(&mut conn)
        .await
        .expect("ttl");
    assert!(
        (3500..=3600).contains(&ttl),
        "archived key expires: ttl {ttl}"
    );
    // An adjust of an archived bucket is refused before anything is written.
    match f.service.ops().adjust(&bucket, 10).await {
        Err(OpsError::Refused(Refusal::Archived(_))) => {}
        other => panic!("adjust of an ARCHIVED bucket: {other:?}"),
    }
}

/// The bucket is fixed at Try: a cancel or refund after the next day's bucket exists (the
/// day changed) returns stock to the reservation's own day.
#[tokio::test]
async fn cancel_and_refund_on_a_later_day_return_stock_to_their_own_day() {
    let f = Ops::new(OpsConfig::default()).await;
    let tomorrow = f.today + TimeDelta::days(1);
    f.service
        .ops()
        .init_bucket(&f.baseline(f.today, 30))
        .await
        .expect("init today");
    let to_cancel = f.reserve(1, 5).await;
    let to_refund = f.reserve(2, 7).await;
    assert_eq!(
        done(f.service.confirm(to_refund).await.expect("c")),
        "CONFIRMED"
    );
    // Midnight passed: the daily job created the next day's bucket, and today's closed.
    f.service
        .ops()
        .init_bucket(&f.baseline(tomorrow, 30))
        .await
        .expect("init tomorrow");
    f.service
        .ops()
        .close(&f.bucket(f.today))
        .await
        .expect("close");

    assert_eq!(
        done(f.service.cancel(to_cancel).await.expect("cancel")),
        "CANCELED"
    );
    assert_eq!(
        done(
            f.service
                .refund(to_refund, None, None)
                .await
                .expect("refund")
        ),
        "REFUNDED"
    );
    let own = f.redis(f.today).await.expect("today");
    assert_eq!((own.available, own.reserved, own.sold), (30, 0, 0));
    let next = f.redis(tomorrow).await.expect("tomorrow");
    assert_eq!(
        (next.total, next.available, next.reserved, next.sold),
        (30, 30, 0, 0)
    );
    assert_eq!(next.version, 1, "the next day's bucket was never touched");
}

#[tokio::test]
async fn the_daily_job_prepares_tomorrow_before_midnight_once() {
    let f = Ops::new(OpsConfig::default()).await;
    let yesterday = f.today - TimeDelta::days(1);
    let tomorrow = f.today + TimeDelta::days(1);
    // The merchant's standing total, last set yesterday (as after a missed night).
    stocksvr_store::baselines::ensure_baseline(&f.pool, &f.baseline(yesterday, 25))
        .await
        .expect("baseline");
    // The merchant's midnight (the job looks ahead to it in the baselines' zone).
    let midnight: DateTime<Utc> = stocksvr_test_support::zone::start_of(tomorrow);
    let lead = TimeDelta::hours(3);
    // Twenty hours before midnight: only today is ensured (a catch-up, yesterday's total).
    let early = f
        .service
        .ops()
        .prepare_days(midnight - TimeDelta::hours(20), lead, 7)
        .await
        .expect("prepare");
    assert_eq!(early.prepared, 1, "{early:?}");
    assert!(f.redis(tomorrow).await.is_none(), "tomorrow is not due yet");
    // Two hours before midnight, within the lead: tomorrow is prepared.
    let now = midnight - TimeDelta::hours(2);
    let report = f
        .service
        .ops()
        .prepare_days(now, lead, 7)
        .await
        .expect("prepare");
    assert_eq!(report.prepared, 1, "{report:?}");
    for day in [f.today, tomorrow] {
        let n = f.redis(day).await.expect("bucket prepared in Redis");
        assert_eq!((n.total, n.available, n.version), (25, 25, 1));
        let b = stocksvr_store::baselines::find_baseline(&f.pool, &f.bucket(day))
            .await
            .expect("b")
            .expect("baseline");
        assert_eq!(
            (b.total_stock, b.baseline_version, b.bucket_status),
            (25, 1, 10)
        );
    }
    // Again: nothing new.
    let again = f
        .service
        .ops()
        .prepare_days(now, lead, 7)
        .await
        .expect("prepare");
    assert_eq!(again.prepared, 0);
    assert_eq!(f.outbox_count("StockBucketInitialized").await, 2);
}

#[tokio::test]
async fn an_operation_that_cannot_succeed_goes_dead_with_an_alert_and_can_be_retried() {
    let f = Ops::new(OpsConfig {
        max_attempts: 2,
        retry_delay: TimeDelta::milliseconds(10),
        ..OpsConfig::default()
    })
    .await;
    let bucket = f.bucket(f.today);
    f.service
        .ops()
        .init_bucket(&f.baseline(f.today, 10))
        .await
        .expect("init");
    f.reserve(1, 4).await;
    f.service.ops().close(&bucket).await.expect("close");
    // MySQL says nothing is open (the row was settled by hand), Redis still holds 4:
    // archive must not drop them, so it retries and, past the bound, goes dead and alerts.
    sqlx::query("UPDATE inventory_reservation SET status = 60")
        .execute(&f.pool)
        .await
        .expect("settle by hand");
    let first = f.service.ops().archive(&bucket).await.expect("archive");
    assert_eq!(first.status, "RETRY", "{first:?}");
    let dead = eventually_ok(Duration::from_secs(10), || async {
        f.service.ops().work_once(10).await.expect("round");
        let v = f
            .service
            .ops()
            .find(&operations::archive_operation_id(&bucket))
            .await
            .expect("find");
        if v.status == "DEAD" {
            Ok(v)
        } else {
            Err(v)
        }
    })
    .await
    .unwrap_or_else(|v| panic!("never dead: {v:?}"));
    assert_eq!(dead.retry_count, 2);
    assert!(dead
        .last_error
        .as_deref()
        .unwrap_or("")
        .contains("reserved"));
    assert_eq!(f.outbox_count("InventoryOperationDead").await, 1);
    // Dead rows are not picked up again by the worker.
    assert_eq!(
        f.service.ops().work_once(10).await.expect("round").failed,
        0
    );
    // Once Redis is right again, the operator's retry finishes it.
    let keys = BucketKey::new(f.merchant_id, f.dish_id, f.today);
    let id: u64 = sqlx::query_as::<_, (u64,)>("SELECT id FROM inventory_reservation LIMIT 1")
        .fetch_one(&f.pool)
        .await
        .expect("id")
        .0;
    sqlx::query("UPDATE inventory_reservation SET status = 20")
        .execute(&f.pool)
        .await
        .expect("restore");
    let released = f
        .lua
        .step(
            &keys,
            id,
            &format!("op_cancel_{id}"),
            Step::Cancel {
                quantity: 4,
                never_built: false,
            },
        )
        .await
        .expect("release in Redis");
    assert_eq!(released.code, OpCode::Succeeded, "{released:?}");
    sqlx::query("UPDATE inventory_reservation SET status = 60")
        .execute(&f.pool)
        .await
        .expect("settle");
    let retried = f
        .service
        .ops()
        .retry_now(&operations::archive_operation_id(&bucket))
        .await
        .expect("retry");
    assert!(retried.succeeded(), "{retried:?}");
}

/// The daily init of a bucket is stuck (its worker died holding the lease) when the merchant
/// adjusts: the adjust waits for the init instead of being lost under it, the init builds the
/// bucket from the new total, and the ledger gets one init of that total and no adjust.
#[tokio::test]
async fn an_adjust_waits_for_the_buckets_unfinished_init_and_is_booked_once() {
    let f = Ops::new(OpsConfig::default()).await;
    let b = f.baseline(f.today, 10);
    let init = f.stuck_init(&b).await;
    let adjust = f
        .service
        .ops()
        .adjust(&b.stock_bucket_id, 25)
        .await
        .expect("adjust");
    assert_eq!(adjust.status, "RETRY", "waits for the init: {adjust:?}");
    assert_eq!(adjust.retry_count, 0, "waiting is not a failure");
    assert!(f.redis(f.today).await.is_none());

    f.expire_lease(&init).await;
    let first = f.service.ops().work_once(10).await.expect("round");
    assert_eq!(first.succeeded, 1, "the init: {first:?}");
    f.make_wal_due().await;
    let second = f.service.ops().work_once(10).await.expect("round");
    assert_eq!(second.succeeded, 1, "the adjust: {second:?}");
    let n = f.redis(f.today).await.expect("bucket");
    assert_eq!(
        (n.total, n.available, n.version),
        (25, 25, 1),
        "built once from the new total"
    );
    let inits = f.events("StockBucketInitialized").await;
    assert_eq!(inits.len(), 1);
    assert_eq!(inits[0]["data"]["total"], 25);
    assert!(
        f.events("StockBaselineAdjusted").await.is_empty(),
        "nothing booked twice"
    );
}

/// Adjusts apply in version order: one whose older predecessor is unfinished waits, so each
/// event's old total is what Redis had and the ledger's total deltas add up to Redis.
#[tokio::test]
async fn adjusts_apply_in_version_order_and_their_deltas_add_up() {
    let f = Ops::new(OpsConfig::default()).await;
    let bucket = f.bucket(f.today);
    let init = f
        .service
        .ops()
        .init_bucket(&f.baseline(f.today, 10))
        .await
        .expect("init");
    assert!(init.succeeded(), "{init:?}");
    // Adjust to 8 written, its executor dead before Redis.
    let stuck = f.stuck_adjust(&bucket, 8).await;
    let later = f.service.ops().adjust(&bucket, 12).await.expect("adjust");
    assert_eq!(
        later.status, "RETRY",
        "waits for the older adjust: {later:?}"
    );
    assert_eq!(f.redis(f.today).await.expect("bucket").total, 10);

    f.expire_lease(&stuck).await;
    let first = f.service.ops().work_once(10).await.expect("round");
    assert_eq!(first.succeeded, 1, "{first:?}");
    f.make_wal_due().await;
    let second = f.service.ops().work_once(10).await.expect("round");
    assert_eq!(second.succeeded, 1, "{second:?}");
    let n = f.redis(f.today).await.expect("bucket");
    assert_eq!((n.total, n.available), (12, 12));
    let events = f.events("StockBaselineAdjusted").await;
    let moves: Vec<(i64, i64)> = events
        .iter()
        .map(|e| {
            (
                e["data"]["old_total"].as_i64().unwrap_or(-1),
                e["data"]["after"]["total"].as_i64().unwrap_or(-1),
            )
        })
        .collect();
    assert_eq!(moves, vec![(10, 8), (8, 12)], "each from what Redis had");
    let available: i64 = events
        .iter()
        .map(|e| e["data"]["available_delta"].as_i64().unwrap_or(0))
        .sum();
    assert_eq!(10 + available, n.available, "init + deltas = Redis");
}

/// A bucket built once and then lost by Redis is never rebuilt empty by a Try: that would
/// sell again what was already reserved. The Try fails closed.
#[tokio::test]
async fn a_try_never_recreates_a_bucket_that_redis_lost() {
    let f = Ops::new(OpsConfig::default()).await;
    let bucket = f.bucket(f.today);
    f.service
        .ops()
        .init_bucket(&f.baseline(f.today, 10))
        .await
        .expect("init");
    f.reserve(1, 6).await;
    f.service.ops().adjust(&bucket, 12).await.expect("adjust");
    // Redis loses the bucket (a flush, a failover without persistence).
    let mut conn = common::redis_conn().await;
    let keys = BucketKey::new(f.merchant_id, f.dish_id, f.today);
    let _: i64 = redis::cmd("DEL")
        .arg(keys.stock_key())
        .query_async(&mut conn)
        .await
        .expect("del");
    let rows_before = reservation_rows(&f.pool).await;
    // The first Try finds out (its script said BUCKET_MISSING after the insert); every later
    // one is refused by the lost mark before anything is written.
    for item in [2, 3, 4] {
        match f.service.try_reserve(&f.request(item, 6)).await {
            Err(ServiceError::BucketLost { bucket: lost }) => assert_eq!(lost, bucket),
            other => panic!("a Try on a lost bucket must fail closed: {other:?}"),
        }
    }
    assert_eq!(
        reservation_rows(&f.pool).await,
        rows_before,
        "no reservation row left behind by a refused Try"
    );
    let (lost_at,): (Option<chrono::NaiveDateTime>,) =
        sqlx::query_as("SELECT lost_at FROM dish_stock_baseline WHERE stock_bucket_id = ?")
            .bind(&bucket)
            .fetch_one(&f.pool)
            .await
            .expect("baseline");
    assert!(lost_at.is_some(), "the bucket is marked lost");
    assert!(f.redis(f.today).await.is_none(), "not re-created");
    assert_eq!(f.events("StockBucketInitialized").await.len(), 1);
}

/// A lost mark made by another instance (here: by hand) reaches this instance's Try path
/// within the lost list's age, although the bucket's OPEN row stays cached much longer; so
/// does the clear. The rebuild relies on that bound: it writes the bucket back only after
/// waiting it out.
#[tokio::test]
async fn a_lost_mark_made_elsewhere_refuses_trys_here_within_the_lists_age() {
    let f = Ops::new(OpsConfig::default()).await;
    let bucket = f.bucket(f.today);
    f.service
        .ops()
        .init_bucket(&f.baseline(f.today, 1_000))
        .await
        .expect("init");
    // Caches the row and reads the list.
    f.reserve(1, 1).await;
    let age = stocksvr_reservation::ServiceConfig::default().try_cache_ttl;
    assert!(stocksvr_store::baselines::mark_lost(&f.pool, &bucket)
        .await
        .expect("mark"));
    let marked = std::time::Instant::now();
    // Each look is a Try of a new item; one that succeeds after the cache's age fails the test.
    let item = std::cell::Cell::new(1);
    let refused = eventually(age + Duration::from_secs(10), || async {
        let started = std::time::Instant::now();
        item.set(item.get() + 1);
        match f.service.try_reserve(&f.request(item.get(), 1)).await {
            Ok(_) => {
                assert!(
                    started < marked + age,
                    "a Try started {:?} after the mark was taken",
                    started - marked
                );
                false
            }
            Err(ServiceError::BucketLost { bucket: lost }) => {
                assert_eq!(lost, bucket);
                true
            }
            Err(other) => panic!("{other:?}"),
        }
    })
    .await;
    assert!(refused, "never refused");
    let item = item.get();
    match f.service.try_reserve(&f.request(item + 1, 1)).await {
        Err(ServiceError::BucketLost { .. }) => {}
        other => panic!("once refused, refused: {other:?}"),
    }
    assert!(stocksvr_store::baselines::clear_lost(&f.pool, &bucket)
        .await
        .expect("clear"));
    let cleared = std::time::Instant::now();
    let item = std::cell::Cell::new(item + 1);
    let reserved = eventually(age + Duration::from_secs(10), || async {
        let started = std::time::Instant::now();
        item.set(item.get() + 1);
        match f.service.try_reserve(&f.request(item.get(), 1)).await {
            Ok(reply) => {
                assert!(reply.created);
                true
            }
            Err(ServiceError::BucketLost { .. }) => {
                assert!(
                    started < cleared + age,
                    "refused {:?} after the clear",
                    started - cleared
                );
                false
            }
            Err(other) => panic!("{other:?}"),
        }
    })
    .await;
    assert!(reserved, "never reserved again");
}

async fn reservation_rows(pool: &sqlx::MySqlPool) -> i64 {
    let (n,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM inventory_reservation")
        .fetch_one(pool)
        .await
        .expect("count");
    n
}

/// The first Try finds the bucket's init held by a worker that died: it waits a bounded time,
/// fails retryably, and the failure counts against the reservation (recovery backs off and,
/// past its bound, gives up and alerts). Once the init is taken over, the retry reserves.
#[tokio::test]
async fn a_try_whose_lazy_init_is_held_elsewhere_fails_retryably_and_counts_it() {
    let f = Ops::new(OpsConfig {
        peer_wait: Duration::from_millis(200),
        ..OpsConfig::default()
    })
    .await;
    let init = f.stuck_init(&f.baseline(f.today, 10)).await;
    let err = f
        .service
        .try_reserve(&f.request(1, 2))
        .await
        .expect_err("the init is not finished");
    assert!(matches!(err, ServiceError::OutcomeUnknown { .. }), "{err}");
    let (status, retries, last_error): (i8, u32, Option<String>) =
        sqlx::query_as("SELECT status, retry_count, last_error FROM inventory_reservation")
            .fetch_one(&f.pool)
            .await
            .expect("reservation");
    assert_eq!((status, retries), (10, 1), "PREPARING, one failure counted");
    assert!(last_error.unwrap_or_default().contains(&init));

    f.expire_lease(&init).await;
    assert_eq!(
        f.service
            .ops()
            .work_once(10)
            .await
            .expect("round")
            .succeeded,
        1
    );
    let reply = f
        .service
        .try_reserve(&f.request(1, 2))
        .await
        .expect("retry");
    assert_eq!(reply.reservation.status_name(), "RESERVED");
}
