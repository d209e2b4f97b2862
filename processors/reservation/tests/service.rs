//! The reservation service against real MariaDB and Redis (the local stack): the invariants
//! (docs/design.md, why this cannot oversell or undersell) under concurrency, duplication,
//! races and the crash window between Redis and MySQL. Each test uses its own database and its own merchant (so its own Redis keys).

mod common;

use chrono::Utc;
use common::{make_due, seed, Fixture};
use std::collections::HashSet;
use stocksvr_core::events::OrderType;
use stocksvr_core::model::OpCode;
use stocksvr_core::reservation::{try_operation_id, ReservationStatus};
use stocksvr_reservation::{IntentOutcome, ServiceConfig, ServiceError};
use stocksvr_store::lua::Step;
use stocksvr_store::reservations as repo;
use stocksvr_test_support::zone;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_thousand_concurrent_trys_never_oversell() {
    // Two thousand Trys at once queue far beyond the pool; this test is about the invariant
    // (no oversell, conservation), so the statement deadline, which counts the wait for a
    // connection, must not turn the queue into errors (latency is the benchmark's business).
    stocksvr_store::deadline::set_statement_deadline(std::time::Duration::from_secs(120));
    let f = Fixture::new(500).await;
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    let mut tasks = Vec::new();
    for item in 1..=2000u64 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let quantity = (x % 3) as u32 + 1;
        let (service, req) = (f.service.clone(), f.request(item, quantity));
        tasks.push(tokio::spawn(async move {
            (quantity, service.try_reserve(&req).await)
        }));
    }
    let mut reserved_sum = 0i64;
    let mut reserved_count = 0;
    for task in tasks {
        let (quantity, reply) = task.await.expect("task");
        let reply = reply.expect("every Try gets a definite answer");
        match reply.reservation.status_name() {
            "RESERVED" => {
                reserved_sum += i64::from(quantity);
                reserved_count += 1;
            }
            "REJECTED" => assert_eq!(
                reply.reservation.reject_reason.as_deref(),
                Some("INSUFFICIENT_STOCK")
            ),
            other => panic!("unexpected status {other}"),
        }
    }
    let (total, available, reserved, sold) = f.numbers().await;
    assert!(reserved_sum <= 500, "oversold: {reserved_sum}");
    assert_eq!(
        reserved, reserved_sum,
        "Redis reserved equals the acknowledged Trys"
    );
    assert_eq!(available + reserved + sold, total);
    assert!(
        (0..3).contains(&available),
        "stock left behind while Trys were rejected: {available}"
    );
    let (rows, qty): (i64, Option<i64>) = sqlx::query_as(
        "SELECT COUNT(*), CAST(SUM(quantity) AS SIGNED) FROM inventory_reservation WHERE status = ?",
    )
    .bind(ReservationStatus::Reserved.code() as i8)
    .fetch_one(&f.pool)
    .await
    .expect("count");
    assert_eq!(rows, reserved_count);
    assert_eq!(qty, Some(reserved_sum));
    let outbox: (i64,) = sqlx::query_as(
        "SELECT COUNT(*) FROM inventory_outbox WHERE event_type = 'InventoryRedisReserved'",
    )
    .fetch_one(&f.pool)
    .await
    .expect("outbox");
    assert_eq!(
        outbox.0, reserved_count,
        "one stock-change event per reservation"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_same_try_a_thousand_times_at_once_reserves_once() {
    // A client that did not hear back retries: the repeats wait for the first Try's turn on
    // the item and then read what it settled, instead of racing it.
    let f = Fixture::new(100).await;
    let mut tasks = Vec::new();
    for _ in 0..1_000 {
        let (service, req) = (f.service.clone(), f.request(42, 2));
        tasks.push(tokio::spawn(async move { service.try_reserve(&req).await }));
    }
    let mut ids = HashSet::new();
    let mut created = 0;
    for task in tasks {
        let reply = task.await.expect("task").expect("try");
        assert_eq!(reply.reservation.status_name(), "RESERVED");
        ids.insert(reply.reservation.id);
        created += usize::from(reply.created);
    }
    assert_eq!(ids.len(), 1, "one reservation");
    assert_eq!(created, 1, "one request created it, the others repeated it");
    assert_eq!(f.numbers().await, (100, 98, 2, 0), "one Redis effect");
}

#[tokio::test]
async fn cancel_before_try_is_an_empty_rollback_and_the_late_try_is_fenced() {
    let f = Fixture::new(10).await;
    f.reserve(1, 1).await; // initialise the bucket
    let id = 700_000 + seed() % 1000;
    f.preparing(id, 2, 3).await;
    let before = f.numbers().await;
    match f.service.cancel(id).await.expect("cancel") {
        IntentOutcome::Done {
            reservation,
            already,
        } => {
            assert_eq!(reservation.status_name(), "CANCELED");
            assert!(!already);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(f.numbers().await, before, "an empty rollback adds no stock");
    let fence = f
        .lua
        .read_fence(&f.keys(), id)
        .await
        .expect("fence")
        .expect("fence written");
    assert_eq!(fence.fence.phase.name(), "CANCELED");
    // The Try that was in flight arrives now: fenced, nothing moves (anti-hanging).
    let late = f
        .lua
        .step(
            &f.keys(),
            id,
            &try_operation_id(id),
            Step::Try { quantity: 3 },
        )
        .await
        .expect("late try");
    assert_eq!(late.code, OpCode::Fenced);
    assert_eq!(f.numbers().await, before);
    // A repeat of the Try request never revives a CANCELED reservation.
    let mut req = f.request(2, 3);
    req.order_id = 9_000;
    let again = f.service.try_reserve(&req).await.expect("repeat");
    assert!(!again.created);
    assert_eq!(again.reservation.status_name(), "CANCELED");
    assert_eq!(f.numbers().await, before);
    // One row for the Cancel: its stock change says empty rollback, and it carries the
    // InventoryCanceled the relay derives from it (reason EMPTY_ROLLBACK).
    let canceled: Vec<_> = stocksvr_test_support::outbox_rows(&f.pool)
        .await
        .into_iter()
        .filter(|row| row.event_type == "InventoryRedisCanceled" && row.carries_lifecycle)
        .collect();
    assert_eq!(canceled.len(), 1, "{canceled:?}");
    assert_eq!(
        canceled[0].json["data"]["empty_rollback"], true,
        "{:?}",
        canceled[0]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn confirm_and_cancel_race_and_exactly_one_wins() {
    let f = Fixture::new(1000).await;
    let mut ids = Vec::new();
    for item in 1..=100u64 {
        ids.push(f.reserve(item, 2).await);
    }
    let mut tasks = Vec::new();
    for &id in &ids {
        let (a, b) = (f.service.clone(), f.service.clone());
        let confirm = tokio::spawn(async move { a.confirm(id).await });
        let cancel = tokio::spawn(async move { b.cancel(id).await });
        tasks.push((id, confirm, cancel));
    }
    let mut confirmed = 0i64;
    for (id, confirm, cancel) in tasks {
        let c = confirm.await.expect("task").expect("confirm answers");
        let x = cancel.await.expect("task").expect("cancel answers");
        let won = |o: &IntentOutcome| matches!(o, IntentOutcome::Done { already: false, .. });
        let lost = |o: &IntentOutcome| matches!(o, IntentOutcome::Conflict { .. });
        assert!(
            won(&c) ^ won(&x),
            "exactly one winner for {id}: {c:?} / {x:?}"
        );
        assert!(
            lost(&c) || lost(&x),
            "the loser is told it conflicts: {c:?} / {x:?}"
        );
        let status = f.status(id).await;
        if won(&c) {
            assert_eq!(status, "CONFIRMED");
            confirmed += 2;
        } else {
            assert_eq!(status, "CANCELED");
        }
    }
    let (total, available, reserved, sold) = f.numbers().await;
    assert_eq!((reserved, sold), (0, confirmed));
    assert_eq!(available + reserved + sold, total);
}

/// A refund Redis refuses (the fence says fewer units are held than MySQL does, as after a
/// repair) returns the row to CONFIRMED, moves nothing, and leaves the row as projected as it
/// was: it sends no stock-change, so nothing would ever mark it projected again, and a row
/// waiting for its projection holds the reconciler's check of its bucket back.
#[tokio::test]
async fn a_refund_redis_refuses_leaves_the_row_as_projected_as_it_was() {
    let f = Fixture::new(10).await;
    let id = f.reserve(1, 3).await;
    assert!(matches!(
        f.service.confirm(id).await.expect("confirm"),
        IntentOutcome::Done { .. }
    ));
    // The projector booked the Confirm.
    sqlx::query(
        "UPDATE inventory_reservation SET synced_redis_version = expected_redis_version, \
         sync_status = ? WHERE id = ?",
    )
    .bind(stocksvr_core::reservation::SyncStatus::Synced.code())
    .bind(id)
    .execute(&f.pool)
    .await
    .expect("projected");
    // Redis already returned every unit (MySQL does not know it).
    let mut conn = common::redis_conn().await;
    let _: i64 = redis::cmd("HSET")
        .arg(f.keys().fence_key(id))
        .arg("refunded")
        .arg(3)
        .query_async(&mut conn)
        .await
        .expect("hset");
    let before = f.numbers().await;

    let refused = f
        .service
        .refund(id, Some("r1"), Some(1))
        .await
        .expect("answered");
    assert!(
        matches!(&refused, IntentOutcome::Done { reservation, .. } if reservation.status_name() == "CONFIRMED" && reservation.refunded_quantity == 0),
        "{refused:?}"
    );
    assert_eq!(f.numbers().await, before, "nothing moved");
    let row = repo::find(&f.pool, id).await.expect("find").expect("row");
    assert_eq!(
        row.sync_status,
        stocksvr_core::reservation::SyncStatus::Synced.code() as i8,
        "no event will come to mark it projected"
    );
    let (stock_changes,): (i64,) = sqlx::query_as(
        "SELECT COUNT(*) FROM inventory_outbox WHERE aggregate_id = ? AND topic = ?",
    )
    .bind(id)
    .bind(stocksvr_core::events::topics::STOCK_CHANGE)
    .fetch_one(&f.pool)
    .await
    .expect("count");
    assert_eq!(stock_changes, 2, "the Try's and the Confirm's only");
}

#[tokio::test]
async fn refunds_from_confirmed_and_created_reserved_are_idempotent_and_bounded() {
    let f = Fixture::new(50).await;
    let confirmed = f.reserve(1, 3).await;
    assert!(matches!(
        f.service.confirm(confirmed).await.expect("confirm"),
        IntentOutcome::Done { .. }
    ));
    assert_eq!(f.numbers().await, (50, 47, 0, 3));

    let partial = f
        .service
        .refund(confirmed, Some("r1"), Some(1))
        .await
        .expect("refund r1");
    assert!(
        matches!(&partial, IntentOutcome::Done { reservation, already: false } if reservation.status_name() == "CONFIRMED" && reservation.refunded_quantity == 1),
        "{partial:?}"
    );
    assert_eq!(f.numbers().await, (50, 48, 0, 2), "sold -> available");
    let repeat = f
        .service
        .refund(confirmed, Some("r1"), Some(1))
        .await
        .expect("repeat r1");
    assert!(
        matches!(repeat, IntentOutcome::Done { already: true, .. }),
        "{repeat:?}"
    );
    assert_eq!(
        f.numbers().await,
        (50, 48, 0, 2),
        "a repeated refund returns the first result"
    );
    let over = f.service.refund(confirmed, Some("r2"), Some(3)).await;
    assert!(
        matches!(
            over,
            Err(ServiceError::OverRefund {
                asked: 3,
                held: 2,
                ..
            })
        ),
        "{over:?}"
    );
    let rest = f
        .service
        .refund(confirmed, Some("r2"), Some(2))
        .await
        .expect("refund r2");
    assert!(
        matches!(&rest, IntentOutcome::Done { reservation, .. } if reservation.status_name() == "REFUNDED"),
        "{rest:?}"
    );
    assert_eq!(f.numbers().await, (50, 50, 0, 0));

    // Scheduled order: OrderCreated parks it in CREATED_RESERVED; OrderCanceled refunds from reserved.
    let mut req = f.request(2, 4);
    req.order_type = OrderType::Scheduled;
    req.processing_time = Some(Utc::now() + chrono::TimeDelta::minutes(1));
    if req.processing_time.map(zone::date_of) != Some(f.today) {
        return; // a minute before the merchant's midnight the bucket would be tomorrow's
    }
    let scheduled: u64 = f
        .service
        .try_reserve(&req)
        .await
        .expect("try")
        .reservation
        .id;
    assert!(
        matches!(f.service.mark_created(scheduled).await.expect("created"), IntentOutcome::Done { ref reservation, .. } if reservation.status_name() == "CREATED_RESERVED")
    );
    assert!(
        matches!(
            f.service.cancel(scheduled).await.expect("cancel"),
            IntentOutcome::Conflict { .. }
        ),
        "no Cancel after OrderCreated"
    );
    assert_eq!(f.numbers().await, (50, 46, 4, 0));
    let full = f
        .service
        .refund(scheduled, None, None)
        .await
        .expect("full refund");
    assert!(
        matches!(&full, IntentOutcome::Done { reservation, .. } if reservation.status_name() == "REFUNDED"),
        "{full:?}"
    );
    assert_eq!(f.numbers().await, (50, 50, 0, 0), "reserved -> available");
    let again = f
        .service
        .refund(scheduled, None, None)
        .await
        .expect("again");
    assert!(matches!(again, IntentOutcome::Done { already: true, .. }));
    assert_eq!(f.numbers().await, (50, 50, 0, 0));
}

#[tokio::test]
async fn lua_succeeded_mysql_not_updated_resumes_without_reserving_twice() {
    let f = Fixture::new(20).await;
    f.reserve(1, 1).await; // initialise the bucket
    let id = 800_000 + seed() % 1000;
    f.preparing(id, 2, 5).await;
    // The crash window: the Try ran in Redis, the process died before the MySQL TX.
    let first = f
        .lua
        .step(
            &f.keys(),
            id,
            &try_operation_id(id),
            Step::Try { quantity: 5 },
        )
        .await
        .expect("lua try");
    assert_eq!(first.code, OpCode::Succeeded);
    assert_eq!(f.numbers().await, (20, 14, 6, 0));
    assert_eq!(f.status(id).await, "PREPARING");
    // Recovery resumes with the stored operation id: the Lua replays its first result.
    let resumed = f.service.resume(id).await.expect("resume");
    assert_eq!(resumed.status_name(), "RESERVED");
    assert_eq!(f.numbers().await, (20, 14, 6, 0), "reserved once");
    // And the repeat of the original Try request answers with the same reservation.
    let mut req = f.request(2, 5);
    req.order_id = 9_000;
    let again = f.service.try_reserve(&req).await.expect("repeat");
    assert_eq!(again.reservation.id, id);
    assert_eq!(f.numbers().await, (20, 14, 6, 0));
}

#[tokio::test]
async fn recovery_resumes_each_interrupted_step_once() {
    use stocksvr_reservation::recovery::{recover_once, RecoveryConfig};
    let f = Fixture::new(20).await;
    f.reserve(1, 1).await; // initialise the bucket
    let s = seed() % 1000;
    // A: the process died right after inserting PREPARING (Lua never ran).
    let a = 600_000 + s;
    f.preparing(a, 2, 2).await;
    // B: it died after the Lua Try, before the MySQL transaction.
    let b = 601_000 + s;
    f.preparing(b, 3, 3).await;
    f.lua
        .step(
            &f.keys(),
            b,
            &try_operation_id(b),
            Step::Try { quantity: 3 },
        )
        .await
        .expect("lua");
    // C: it died after the CAS into CONFIRMING, before the Lua Confirm.
    let c = f.reserve(4, 4).await;
    let row = repo::find(&f.pool, c).await.expect("find").expect("row");
    let op = stocksvr_core::reservation::confirm_operation_id(c);
    let step = repo::Step {
        to: ReservationStatus::Confirming,
        operation_id: &op,
        pending_quantity: 4,
        resume_status: None,
    };
    let mut conn = f.pool.acquire().await.expect("conn");
    assert!(repo::begin_step(
        &mut conn,
        c,
        ReservationStatus::Reserved,
        row.version,
        &step
    )
    .await
    .expect("cas"));
    drop(conn);

    // Fresh intermediate rows belong to their request for a grace period.
    let early = recover_once(&f.service, &RecoveryConfig::default())
        .await
        .expect("round");
    assert_eq!(early.resumed, 0, "nothing is due during the grace period");
    make_due(&f.pool).await;
    let report = recover_once(&f.service, &RecoveryConfig::default())
        .await
        .expect("round");
    assert_eq!((report.resumed, report.failed, report.dead), (3, 0, 0));
    assert_eq!(f.status(a).await, "RESERVED");
    assert_eq!(f.status(b).await, "RESERVED");
    assert_eq!(f.status(c).await, "CONFIRMED");
    // 1 + 2 + 3 reserved, 4 sold: B's Try counted once although it ran before the crash.
    assert_eq!(f.numbers().await, (20, 10, 6, 4));
    make_due(&f.pool).await;
    let again = recover_once(&f.service, &RecoveryConfig::default())
        .await
        .expect("round");
    assert_eq!(
        again.resumed, 0,
        "terminal and settled rows are not touched"
    );
    assert_eq!(f.numbers().await, (20, 10, 6, 4));
}

#[tokio::test]
async fn recovery_gives_up_after_its_bound_and_alerts_without_moving_the_row() {
    use stocksvr_reservation::recovery::{recover_once, RecoveryConfig};
    let config = ServiceConfig {
        recovery_max_attempts: 2,
        recovery_delay: chrono::TimeDelta::zero(),
        unknown_retries: 0,
        ..ServiceConfig::default()
    };
    let f = Fixture::with_config(10, config).await;
    f.reserve(1, 1).await;
    // CONFIRMING with no fence in Redis: the Confirm script refuses, every attempt fails.
    let id = 650_000 + seed() % 1000;
    f.preparing(id, 2, 2).await;
    sqlx::query(
        "UPDATE inventory_reservation SET status = ?, current_operation_id = ? WHERE id = ?",
    )
    .bind(ReservationStatus::Confirming.code() as i8)
    .bind(stocksvr_core::reservation::confirm_operation_id(id))
    .bind(id)
    .execute(&f.pool)
    .await
    .expect("stuck row");
    let mut dead = 0;
    for _ in 0..3 {
        make_due(&f.pool).await;
        dead += recover_once(&f.service, &RecoveryConfig::default())
            .await
            .expect("round")
            .dead;
    }
    assert_eq!(dead, 1, "marked dead once");
    assert_eq!(
        f.status(id).await,
        "CONFIRMING",
        "a dead row is never moved backwards"
    );
    let (flag, retries): (i8, u32) =
        sqlx::query_as("SELECT dead, retry_count FROM inventory_reservation WHERE id = ?")
            .bind(id)
            .fetch_one(&f.pool)
            .await
            .expect("row");
    assert_eq!((flag, retries), (1, 2));
    let (alerts,): (i64,) = sqlx::query_as(
        "SELECT COUNT(*) FROM inventory_outbox WHERE event_type = 'InventoryOperationDead' AND aggregate_id = ?",
    )
    .bind(id)
    .fetch_one(&f.pool)
    .await
    .expect("outbox");
    assert_eq!(alerts, 1, "one alert event for the order domain");
    make_due(&f.pool).await;
    let after = recover_once(&f.service, &RecoveryConfig::default())
        .await
        .expect("round");
    assert_eq!(
        after.resumed + after.failed,
        0,
        "dead rows wait for an operator"
    );
}

/// Moves the reservations' `expire_at` a minute into the past: stale for the watcher.
async fn expire(f: &Fixture, ids: &[u64]) {
    let mut age = sqlx::QueryBuilder::<sqlx::MySql>::new(
        "UPDATE inventory_reservation SET expire_at = NOW(3) - INTERVAL 1 MINUTE WHERE id IN (",
    );
    let mut list = age.separated(", ");
    for id in ids {
        list.push_bind(*id);
    }
    list.push_unseparated(")");
    age.build().execute(&f.pool).await.expect("expire them");
}

/// The stale watcher's alert events in the outbox.
async fn stale_events(f: &Fixture) -> i64 {
    let (n,): (i64,) = sqlx::query_as(
        "SELECT COUNT(*) FROM inventory_outbox WHERE event_type = 'InventoryReserved' AND event_id LIKE 'stale_%'",
    )
    .fetch_one(&f.pool)
    .await
    .expect("stale events");
    n
}

#[tokio::test]
async fn stale_reservations_are_alerted_once_and_never_cancelled() {
    use stocksvr_reservation::stale::{alert_stale_once, STALE_REASON};
    let f = Fixture::new(10).await;
    let stale = f.reserve(1, 2).await;
    let fresh = f.reserve(2, 1).await;
    expire(&f, &[stale]).await;
    let (stale_order,): (u64,) =
        sqlx::query_as("SELECT order_id FROM inventory_reservation WHERE id = ?")
            .bind(stale)
            .fetch_one(&f.pool)
            .await
            .expect("order");
    let first = alert_stale_once(&f.service, 100, true).await.expect("scan");
    assert_eq!((first.found, first.alerted), (1, 1));
    assert_eq!(first.stale, Some(1), "the gauge counts the stale one only");
    assert_eq!(first.orders, vec![stale_order]);
    let again = alert_stale_once(&f.service, 100, true).await.expect("scan");
    assert_eq!(
        (again.found, again.alerted, again.stale),
        (0, 0, Some(1)),
        "alerted once, still stale"
    );
    assert_eq!(
        f.status(stale).await,
        "RESERVED",
        "the watcher never cancels"
    );
    assert_eq!(f.status(fresh).await, "RESERVED");
    assert_eq!(f.numbers().await, (10, 7, 3, 0), "no stock moved");
    let (payload,): (String,) = sqlx::query_as(
        "SELECT CAST(payload AS CHAR) FROM inventory_outbox WHERE event_type = 'InventoryReserved' AND event_id LIKE 'stale_%'",
    )
    .fetch_one(&f.pool)
    .await
    .expect("one alert event");
    assert!(
        payload.contains(STALE_REASON) && payload.contains(&stale.to_string()),
        "{payload}"
    );
}

/// The watcher reads the stale ids first and marks them in a transaction of its own; between
/// the two a reservation may be confirmed, or alerted by another instance. The mark rereads
/// every row under its lock and alerts only what is still RESERVED, past expire_at and not
/// alerted: one event each, none for the rest.
#[tokio::test]
async fn a_stale_mark_rechecks_each_row_under_its_lock() {
    use stocksvr_reservation::stale::stale_event as event;
    use stocksvr_store::reservations::alert_stale;
    let f = Fixture::new(10).await;
    let (a, b, confirmed, fresh) = (
        f.reserve(1, 1).await,
        f.reserve(2, 1).await,
        f.reserve(3, 1).await,
        f.reserve(4, 1).await,
    );
    expire(&f, &[a, b, confirmed]).await;
    f.service.confirm(confirmed).await.expect("confirm");
    assert_eq!(f.status(confirmed).await, "CONFIRMED");
    let ids = [fresh, confirmed, b, a];
    let first: Vec<u64> = alert_stale(&f.pool, &ids, event)
        .await
        .expect("mark")
        .iter()
        .map(|r| r.id)
        .collect();
    let mut expected = vec![a, b];
    expected.sort_unstable();
    assert_eq!(
        first, expected,
        "only the two still RESERVED and past expire_at"
    );
    let again = alert_stale(&f.pool, &ids, event).await.expect("mark again");
    assert!(again.is_empty(), "alerted once: {again:?}");
    assert_eq!(stale_events(&f).await, 2);
    assert_eq!(f.status(fresh).await, "RESERVED");
}

/// An outage of the order domain leaves a backlog of stale reservations far larger than one
/// batch. The watcher takes batch after batch at its pace, not one batch an interval (with
/// the interval of an hour here, a second batch would otherwise come an hour later), and
/// each reservation is alerted exactly once.
#[tokio::test]
async fn a_backlog_of_stale_reservations_is_alerted_batch_after_batch() {
    use stocksvr_reservation::stale::{run_with, StaleScan};
    let f = Fixture::new(100).await;
    let mut ids = Vec::new();
    for item in 1..=7 {
        ids.push(f.reserve(item, 1).await);
    }
    let fresh = f.reserve(8, 1).await;
    expire(&f, &ids).await;
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let scan = StaleScan {
        interval: std::time::Duration::from_secs(3600),
        batch: 2,
        pace: std::time::Duration::from_millis(20),
    };
    let watcher = tokio::spawn(run_with(f.service.clone(), scan, stop));
    let alerted = |pool: sqlx::MySqlPool| async move {
        let (n,): (i64,) = sqlx::query_as(
            "SELECT COUNT(*) FROM inventory_reservation WHERE stale_alerted_at IS NOT NULL",
        )
        .fetch_one(&pool)
        .await
        .expect("count");
        n
    };
    let all_alerted =
        stocksvr_test_support::eventually(std::time::Duration::from_secs(20), || async {
            alerted(f.pool.clone()).await >= 7
        })
        .await;
    assert!(
        all_alerted,
        "only {} of 7 stale reservations alerted in 20 s (batches of 2)",
        alerted(f.pool.clone()).await
    );
    stop_tx.send(true).expect("stop");
    watcher.await.expect("join").expect("watcher");
    assert_eq!(
        stale_events(&f).await,
        7,
        "one event per stale reservation, none twice"
    );
    assert_eq!(
        alerted(f.pool.clone()).await,
        7,
        "the fresh one is not stale"
    );
    assert_eq!(f.status(fresh).await, "RESERVED");
    assert_eq!(f.numbers().await, (100, 92, 8, 0), "no stock moved");
}

/// The TCC hanging problem at the order level: an OrderCreatedFailed (the order fence) and
/// the order's Try race on 200 orders, started in both orders and interleaved by the
/// scheduler. Whatever the interleaving, nothing stays held for a failed order: a Try that
/// came first is cancelled by the fence's cancel, a Try that came after is refused in the
/// statement that would have inserted it, and one in flight is fenced in Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_order_fence_and_a_racing_try_never_leave_stock_held() {
    let f = Fixture::new(10_000).await;
    f.reserve(1, 1).await; // initialise the bucket so every Try races on the same key
    let base = 8_000_000 + seed() % 100_000 * 1_000;
    let mut by_reply = std::collections::BTreeMap::<String, u32>::new();
    // Waves of ten orders: with all 200 at once the pool's queue, not the race, would decide.
    for wave in 0..20u64 {
        let mut tasks = Vec::new();
        for i in wave * 10..wave * 10 + 10 {
            let order_id = base + i;
            let mut req = f.request(order_id * 10 + 1, 2);
            req.order_id = order_id;
            let (a, b) = (f.service.clone(), f.service.clone());
            let event_id = format!("failed-{order_id}");
            // A head start of 0..25 ms for one side, alternating which, spreads the fence over
            // every point of the Try: before its insert, between insert and Redis, after Redis.
            let head_start =
                std::time::Duration::from_micros((i / 2 % 25) * 1_000 + i * 37 % 1_000);
            let (try_delay, fence_delay) = if i % 2 == 0 {
                (std::time::Duration::ZERO, head_start)
            } else {
                (head_start, std::time::Duration::ZERO)
            };
            // Not waits: the head starts that place the two sides against each other.
            let try_task = tokio::spawn(async move {
                tokio::time::sleep(try_delay).await;
                a.try_reserve(&req).await
            });
            let fence_task = tokio::spawn(async move {
                tokio::time::sleep(fence_delay).await;
                b.fail_order(order_id, &event_id, Some("timeout")).await
            });
            tasks.push((order_id, try_task, fence_task));
        }
        for (order_id, try_task, fence_task) in tasks {
            let reply = try_task
                .await
                .expect("task")
                .expect("the Try gets a definite answer");
            let fenced = fence_task
                .await
                .expect("task")
                .expect("the fence is written");
            for (id, outcome) in &fenced {
                assert!(outcome.is_ok(), "cancel of {id}: {outcome:?}");
            }
            let status = reply.reservation.status_name().to_string();
            match status.as_str() {
                // Reserved before the fence: the fence's cancel found it and released it.
                "RESERVED" | "CANCELING" | "CANCELED" => {
                    assert_eq!(
                        fenced.len(),
                        1,
                        "order {order_id}: the fence saw the reservation"
                    );
                    assert_eq!(
                        f.status(reply.reservation.id).await,
                        "CANCELED",
                        "order {order_id}"
                    );
                }
                "REJECTED" => {
                    assert_eq!(
                        reply.reservation.reject_reason.as_deref(),
                        Some("ORDER_FAILED")
                    );
                }
                other => panic!("order {order_id}: unexpected Try reply {other}"),
            }
            *by_reply.entry(status).or_default() += 1;
            // Any later Try of the order, another item included, is refused.
            let mut late = f.request(order_id * 10 + 2, 1);
            late.order_id = order_id;
            let late = f.service.try_reserve(&late).await.expect("late Try");
            assert_eq!(
                (
                    late.reservation.status_name(),
                    late.reservation.reject_reason.as_deref()
                ),
                ("REJECTED", Some("ORDER_FAILED")),
                "order {order_id}"
            );
        }
    }
    // Nothing of the 200 failed orders is held: only the initial reservation of 1.
    let (total, available, reserved, sold) = f.numbers().await;
    assert_eq!(
        (reserved, sold),
        (1, 0),
        "held after the fence: {by_reply:?}"
    );
    assert_eq!(available + reserved + sold, total);
    let held: (i64,) = sqlx::query_as(
        "SELECT COUNT(*) FROM inventory_reservation WHERE order_id >= ? AND status IN (10, 20, 25, 30, 50)",
    )
    .bind(base)
    .fetch_one(&f.pool)
    .await
    .expect("count");
    assert_eq!(held.0, 0, "{by_reply:?}");
    // And the books say so: each reservation's stock-change events sum to nothing (a Cancel
    // that released a Try caught between Redis and its commit must book that Try too).
    let ours: std::collections::HashSet<u64> =
        sqlx::query_scalar("SELECT id FROM inventory_reservation WHERE order_id >= ?")
            .bind(base)
            .fetch_all(&f.pool)
            .await
            .expect("reservations")
            .into_iter()
            .collect();
    let mut sums: std::collections::BTreeMap<u64, (i64, i64)> = Default::default();
    for row in stocksvr_test_support::outbox_rows(&f.pool).await {
        if row.topic == stocksvr_core::events::topics::STOCK_CHANGE
            && ours.contains(&row.aggregate_id)
        {
            let sum = sums.entry(row.aggregate_id).or_default();
            sum.0 += row.json["data"]["available_delta"]
                .as_i64()
                .unwrap_or_default();
            sum.1 += row.json["data"]["reserved_delta"]
                .as_i64()
                .unwrap_or_default();
        }
    }
    let unbalanced: Vec<(u64, i64, i64)> = sums
        .into_iter()
        .filter(|(_, (a, r))| *a != 0 || *r != 0)
        .map(|(id, (a, r))| (id, a, r))
        .collect();
    assert_eq!(unbalanced, vec![], "{by_reply:?}");
    // Both sides of the race were exercised, or the test proved nothing.
    eprintln!("Try replies: {by_reply:?}");
    assert!(
        by_reply.get("REJECTED").is_some_and(|n| *n > 0),
        "{by_reply:?}"
    );
    assert!(
        by_reply.keys().any(|s| s != "REJECTED"),
        "no Try ever got in before the fence: {by_reply:?}"
    );
}

/// A transaction heavier than any single step (InnoDB rolls back the one that has done
/// less), for the deadlock tests: 200 rows in a table of its own.
async fn heavy_transaction(f: &Fixture) -> sqlx::Transaction<'static, sqlx::MySql> {
    sqlx::query("CREATE TABLE IF NOT EXISTS deadlock_ballast (id INT PRIMARY KEY)")
        .execute(&f.pool)
        .await
        .expect("ballast table");
    let mut other = f.pool.begin().await.expect("begin");
    for n in 0..200 {
        sqlx::query("INSERT INTO deadlock_ballast (id) VALUES (?)")
            .bind(n)
            .execute(&mut *other)
            .await
            .expect("ballast");
    }
    other
}

/// Closes a deadlock: `step` (spawned) holds reservation `id` and waits, in a statement
/// starting with `waits_in`, for a lock `other` holds; `other` then asks for the row and
/// InnoDB rolls the lighter `step` back. Answers `step`'s result once `other` is gone.
async fn deadlock<T>(
    f: &Fixture,
    mut other: sqlx::Transaction<'static, sqlx::MySql>,
    id: u64,
    waits_in: &str,
    step: tokio::task::JoinHandle<T>,
) -> T {
    let deadlocks = || async {
        let (_, n): (String, String) = sqlx::query_as("SHOW GLOBAL STATUS LIKE 'Innodb_deadlocks'")
            .fetch_one(&f.pool)
            .await
            .expect("Innodb_deadlocks");
        n.parse::<u64>().expect("a count")
    };
    let before = deadlocks().await;
    // The statement being executed on the step's connection for 100 ms already (innodb_trx's
    // LOCK WAIT was not dependable: in some runs the waiting statement was not listed there).
    // One row's statement still running after 100 ms is waiting for `other`'s lock; seen any
    // sooner, it might not have locked its row yet, and `other` could take the row first with
    // no deadlock formed (a CI run under load, 2026-12-05).
    let pattern = format!("{waits_in}%");
    let waiting = stocksvr_test_support::eventually(std::time::Duration::from_secs(4), || async {
        let n: Vec<(i64,)> = sqlx::query_as(
            "SELECT id FROM information_schema.processlist WHERE db = DATABASE() \
             AND command = 'Execute' AND info LIKE ? AND time_ms >= 100",
        )
        .bind(&pattern)
        .fetch_all(&f.pool)
        .await
        .expect("processlist");
        n.len() == 1
    })
    .await;
    assert!(waiting, "the step never waited in `{waits_in}`");
    sqlx::query("UPDATE inventory_reservation SET last_error = last_error WHERE id = ?")
        .bind(id)
        .execute(&mut *other)
        .await
        .expect("the test's deadlock must pick the step as its victim");
    other.rollback().await.expect("rollback");
    let result = step.await.expect("task");
    assert!(
        deadlocks().await > before,
        "InnoDB saw no deadlock: the test did not make one"
    );
    result
}

/// A completion that InnoDB picks as a deadlock's victim is run again, not answered to the
/// caller: its transaction was rolled back whole, and the Redis step it records has already
/// happened. The deadlock is made for real: a transaction holds the gap at the end of the
/// outbox (where the completion inserts its event) and then asks for the reservation row
/// the completion's CAS holds. It has written more rows than the completion, so InnoDB
/// rolls the completion back (asserted: the other side's UPDATE goes through).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_chosen_as_deadlock_victim_is_run_again() {
    use stocksvr_store::outbox::NewOutbox;
    let f = Fixture::new(5).await;
    let id = 700_000 + seed() % 1000;
    f.preparing(id, 1, 1).await;
    let row = repo::find(&f.pool, id).await.expect("find").expect("row");
    let mut other = heavy_transaction(&f).await;
    // The next-key lock on the outbox's supremum: an INSERT of a new event waits for it.
    sqlx::query("SELECT id FROM inventory_outbox WHERE id > (SELECT COALESCE(MAX(id), 0) FROM inventory_outbox) FOR UPDATE")
        .fetch_all(&mut *other)
        .await
        .expect("gap lock");

    let completion = repo::Completion {
        to: ReservationStatus::Rejected,
        expected_redis_version: None,
        refunded_add: 0,
        reject_reason: Some("test".to_string()),
        outbox: vec![NewOutbox {
            event_id: format!("deadlock-victim-{id}"),
            aggregate_id: id,
            event_type: "InventoryRejected".to_string(),
            topic: "deadlock-test".to_string(),
            partition_key: id.to_string(),
            payload: serde_json::json!({ "reservation_id": id }),
            body: None,
        }],
    };
    let completing = {
        let pool = f.pool.clone();
        let version = row.version;
        tokio::spawn(async move {
            repo::complete_step(
                &pool,
                id,
                ReservationStatus::Preparing,
                version,
                &completion,
            )
            .await
        })
    };
    let landed = deadlock(&f, other, id, "INSERT INTO inventory_outbox", completing).await;
    assert!(
        matches!(landed, Ok(true)),
        "the completion must run again after losing the deadlock, got {landed:?}"
    );
    assert_eq!(f.status(id).await, "REJECTED");
    let (events,): (i64,) =
        sqlx::query_as("SELECT COUNT(*) FROM inventory_outbox WHERE aggregate_id = ?")
            .bind(id)
            .fetch_one(&f.pool)
            .await
            .expect("outbox");
    assert_eq!(
        events, 1,
        "the event is written once, by the attempt that committed"
    );
}

/// A failed attempt recorded on a PREPARING row (the Try's reply lost) that InnoDB picks as
/// a deadlock's victim is recorded once, not answered to the caller as a MySQL error: the
/// failure window test saw exactly that once (a Try answered 1213). Its UPDATE moves the
/// row's (status, next_retry_at) index entry into a gap the other transaction holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recorded_failure_chosen_as_deadlock_victim_is_run_again() {
    let f = Fixture::new(5).await;
    let id = 710_000 + seed() % 1000;
    f.preparing(id, 1, 1).await;
    let row = repo::find(&f.pool, id).await.expect("find").expect("row");
    let mut other = heavy_transaction(&f).await;
    // Every PREPARING entry after this row's in (status, next_retry_at), and the gap after.
    sqlx::query(
        "SELECT id FROM inventory_reservation FORCE INDEX (idx_state_retry) \
         WHERE status = ? AND next_retry_at > ? FOR UPDATE",
    )
    .bind(ReservationStatus::Preparing.code() as i8)
    .bind(row.next_retry_at)
    .fetch_all(&mut *other)
    .await
    .expect("gap lock");
    let recording = {
        let pool = f.pool.clone();
        tokio::spawn(async move {
            repo::record_failure(
                &pool,
                id,
                ReservationStatus::Preparing,
                "reply lost",
                chrono::TimeDelta::hours(1),
            )
            .await
        })
    };
    let recorded = deadlock(&f, other, id, "UPDATE inventory_reservation", recording).await;
    assert!(
        recorded.is_ok(),
        "the failure must be recorded after losing the deadlock, got {recorded:?}"
    );
    let row = repo::find(&f.pool, id).await.expect("find").expect("row");
    assert_eq!(
        row.retry_count, 1,
        "recorded once, by the attempt that committed"
    );
    assert_eq!(row.last_error.as_deref(), Some("reply lost"));
}

/// A step begun alone (a group of one, or a group that lost a CAS and begins each row by
/// itself) that InnoDB picks as a deadlock's victim is begun again, not answered to the
/// caller as a MySQL error. Its autocommitted CAS moves the row's (status, next_retry_at)
/// entry into the CONFIRMING range of `idx_state_retry`, whose gap the other side holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_begun_alone_chosen_as_deadlock_victim_is_begun_again() {
    let f = Fixture::new(5).await;
    let id = 720_000 + seed() % 1000;
    f.preparing(id, 1, 1).await;
    let preparing = repo::find(&f.pool, id).await.expect("find").expect("row");
    let reserved = repo::complete_one(
        &f.pool,
        &preparing,
        &repo::Completion {
            to: ReservationStatus::Reserved,
            expected_redis_version: None,
            refunded_add: 0,
            reject_reason: None,
            outbox: Vec::new(),
        },
    )
    .await
    .expect("reserve")
    .expect("landed");
    let mut other = heavy_transaction(&f).await;
    // The CONFIRMING range of (status, next_retry_at) and the gap after it.
    sqlx::query(
        "SELECT id FROM inventory_reservation FORCE INDEX (idx_state_retry) \
         WHERE status = ? AND next_retry_at > '2000-01-01' FOR UPDATE",
    )
    .bind(ReservationStatus::Confirming.code() as i8)
    .fetch_all(&mut *other)
    .await
    .expect("gap lock");
    let beginning = {
        let pool = f.pool.clone();
        let begin = repo::Begin {
            row: reserved.clone(),
            to: ReservationStatus::Confirming,
            operation_id: stocksvr_core::reservation::confirm_operation_id(id),
            pending_quantity: reserved.held(),
            resume_status: None,
        };
        tokio::spawn(async move { repo::begin_steps(&pool, &[begin]).await })
    };
    let begun = deadlock(&f, other, id, "UPDATE inventory_reservation", beginning).await;
    let begun = match begun {
        Ok(rows) => rows,
        Err(e) => panic!("the step must be begun again after losing the deadlock, got {e:?}"),
    };
    let row = repo::find(&f.pool, id).await.expect("find").expect("row");
    assert_eq!(row.status_name(), "CONFIRMING");
    assert_eq!(row.version, reserved.version + 1, "begun once");
    assert_eq!(begun, vec![Some(row)], "answered as the row MySQL holds");
}

/// The test merchants' zone (see `stocksvr_test_support::zone`) is one the service accepts,
/// and its days are the service's business days, for the zone of every hour a test binary
/// may start at (an inverted Etc sign would put the day boundary 2 x offset hours off).
#[test]
fn the_test_merchants_zone_is_the_services_business_day() {
    use stocksvr_core::bucket::{business_date, parse_timezone};
    use stocksvr_test_support::zone::NoonZone;
    let day = chrono::NaiveDate::from_ymd_opt(2026, 3, 29).expect("a day");
    for hour in 0..24 {
        let zone = NoonZone::for_utc_hour(hour);
        let tz = parse_timezone(zone.name()).expect("the service knows the zone");
        let start = zone.start_of(day);
        for t in [
            start - chrono::TimeDelta::milliseconds(1),
            start,
            start + chrono::TimeDelta::hours(12),
            start + chrono::TimeDelta::days(1) - chrono::TimeDelta::milliseconds(1),
            start + chrono::TimeDelta::days(1),
        ] {
            assert_eq!(
                zone.date_of(t),
                business_date(t, tz),
                "{t} in {}",
                zone.name()
            );
        }
    }
    let now = Utc::now();
    let tz = parse_timezone(zone::zone_name()).expect("this process's zone");
    assert_eq!(zone::date_of(now), business_date(now, tz));
}
