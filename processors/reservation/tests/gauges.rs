//! The gauges read from MySQL (`stocksvr_reservation::gauges`) against the real MariaDB:
//! rows in every status, ages set in the past, and what each gauge must say about them.

use chrono::{TimeDelta, Utc};
use sqlx::MySqlPool;
use std::time::Duration;
use stocksvr_core::reservation::ReservationStatus;
use stocksvr_reservation::gauges::{self, Backlog, OVERDUE};
use stocksvr_store::wal::{WalAction, WalStatus};
use stocksvr_telemetry::names;
use stocksvr_telemetry::testing::Capture;
use stocksvr_test_support::TestDb;

/// A reservation row as the service would have left it: `created_at` and `updated_at`
/// `created_ago` and `updated_ago` before now, `processing_time` `due_in` from now.
async fn reservation(
    pool: &MySqlPool,
    id: u64,
    status: ReservationStatus,
    created_ago: i64,
    updated_ago: i64,
    due_in: Option<i64>,
    dead: bool,
) {
    let now = Utc::now().naive_utc();
    let ago = |s: i64| now - TimeDelta::seconds(s);
    sqlx::query(
        "INSERT INTO inventory_reservation (id, order_id, order_item_id, merchant_id, dish_id, \
         stock_bucket_id, stock_date, quantity, order_type, processing_time, expire_at, status, \
         current_operation_id, next_retry_at, dead, created_at, updated_at) \
         VALUES (?, ?, ?, 1, 1, 'bucket_1_1_20260101', '2026-01-01', 1, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(id)
    .bind(id)
    .bind(id)
    .bind(if due_in.is_some() { 2 } else { 1 })
    .bind(due_in.map(|s| now + TimeDelta::seconds(s)))
    .bind(now + TimeDelta::minutes(30))
    .bind(status.code() as i8)
    .bind(format!("op_{id}"))
    .bind(now)
    .bind(dead)
    .bind(ago(created_ago))
    .bind(ago(updated_ago))
    .execute(pool)
    .await
    .expect("reservation row");
}

async fn wal(pool: &MySqlPool, n: u32, action: WalAction, status: WalStatus, created_ago: i64) {
    let now = Utc::now().naive_utc();
    sqlx::query(
        "INSERT INTO inventory_operation_wal (operation_id, stock_bucket_id, action, status, \
         request_payload, next_retry_at, created_at, updated_at) VALUES (?, ?, ?, ?, '{}', ?, ?, ?)",
    )
    .bind(format!("wal_{n}"))
    .bind(format!("bucket_{n}"))
    .bind(action as i8)
    .bind(status as i8)
    .bind(now)
    .bind(now - TimeDelta::seconds(created_ago))
    // A failed attempt moved updated_at: the age must not follow it.
    .bind(now)
    .execute(pool)
    .await
    .expect("wal row");
}

fn find<'a>(gauges: &'a [Backlog], label: &str) -> &'a Backlog {
    gauges
        .iter()
        .find(|g| g.label == label)
        .unwrap_or_else(|| panic!("no gauge for {label}: {gauges:?}"))
}

/// Within two seconds of `secs` (the test's own statements take a moment).
fn about(age: Duration, secs: u64) -> bool {
    let got = age.as_secs_f64();
    got >= secs as f64 - 0.01 && got <= secs as f64 + 2.0
}

#[tokio::test]
async fn intermediate_reservations_are_counted_with_the_age_of_the_oldest() {
    let db = TestDb::migrated().await;
    let pool = &db.pool;
    use ReservationStatus::*;
    // PREPARING ages from its Try (created_at), whatever touched the row since.
    reservation(pool, 1, Preparing, 300, 5, None, false).await;
    reservation(pool, 2, Preparing, 40, 40, None, false).await;
    // CONFIRMING ages from its last change; a dead one counts and is the oldest.
    reservation(pool, 3, Confirming, 3600, 120, None, false).await;
    reservation(pool, 4, Confirming, 3600, 900, None, true).await;
    reservation(pool, 5, Refunding, 7200, 60, None, false).await;
    // CREATED_RESERVED counts only past its processing_time, aged from it.
    reservation(pool, 6, CreatedReserved, 900, 900, Some(-600), false).await;
    reservation(pool, 7, CreatedReserved, 900, 900, Some(600), false).await;
    // Settled and plain RESERVED rows are none of these gauges' business.
    reservation(pool, 8, Reserved, 5000, 5000, None, false).await;
    reservation(pool, 9, Confirmed, 5000, 5000, None, false).await;

    let capture = Capture::default();
    let _recorder = metrics::set_default_local_recorder(&capture);
    let gauges = gauges::refresh_intermediate(pool).await.expect("read");
    let labels: Vec<&str> = gauges.iter().map(|g| g.label).collect();
    assert_eq!(
        labels,
        ["PREPARING", "CONFIRMING", "CANCELING", "REFUNDING", OVERDUE]
    );
    let expect = [
        ("PREPARING", 2, 300),
        ("CONFIRMING", 2, 900),
        ("CANCELING", 0, 0),
        ("REFUNDING", 1, 60),
        (OVERDUE, 1, 600),
    ];
    for (label, rows, age) in expect {
        let g = find(&gauges, label);
        assert_eq!(g.rows, rows, "{label}");
        assert!(
            about(g.oldest, age),
            "{label}: {:?}, want about {age} s",
            g.oldest
        );
        let series = [("status", label)];
        assert_eq!(
            capture.gauge(names::RESERVATIONS_INTERMEDIATE, &series),
            Some(rows as f64),
            "{label}"
        );
        let shown = capture
            .gauge(names::RESERVATIONS_INTERMEDIATE_OLDEST_SECONDS, &series)
            .expect("age gauge set");
        assert!(
            about(Duration::from_secs_f64(shown), age),
            "{label}: {shown}"
        );
    }
}

#[tokio::test]
async fn the_wal_backlog_counts_unfinished_rows_per_action_aged_from_creation() {
    let db = TestDb::migrated().await;
    let pool = &db.pool;
    wal(pool, 1, WalAction::InitBucket, WalStatus::Retry, 120).await;
    wal(pool, 2, WalAction::InitBucket, WalStatus::Init, 10).await;
    wal(pool, 3, WalAction::Adjust, WalStatus::Dead, 4000).await;
    wal(pool, 4, WalAction::Adjust, WalStatus::Succeeded, 9000).await;
    wal(pool, 5, WalAction::Close, WalStatus::Executing, 30).await;
    wal(pool, 6, WalAction::Archive, WalStatus::Succeeded, 50).await;

    let capture = Capture::default();
    let _recorder = metrics::set_default_local_recorder(&capture);
    let gauges = gauges::refresh_wal(pool).await.expect("read");
    let expect = [
        ("INIT_BUCKET", 2, 120),
        ("ADJUST", 1, 4000),
        ("REPAIR", 0, 0),
        ("CLOSE", 1, 30),
        ("ARCHIVE", 0, 0),
        ("REBUILD", 0, 0),
    ];
    assert_eq!(gauges.len(), expect.len(), "{gauges:?}");
    for (label, rows, age) in expect {
        let g = find(&gauges, label);
        assert_eq!(g.rows, rows, "{label}");
        assert!(
            about(g.oldest, age),
            "{label}: {:?}, want about {age} s",
            g.oldest
        );
        let series = [("action", label)];
        assert_eq!(
            capture.gauge(names::WAL_BACKLOG, &series),
            Some(rows as f64)
        );
        assert!(capture.gauge(names::WAL_OLDEST_SECONDS, &series).is_some());
    }
}

/// The periodic task refreshes by itself and stops on the signal.
#[tokio::test]
async fn the_gauge_task_follows_the_table_until_stopped() {
    let db = TestDb::migrated().await;
    let pool = db.pool.clone();
    let capture = Capture::default();
    let _recorder = metrics::set_default_local_recorder(&capture);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let service = common_service(&pool).await;
    let task = gauges::run(service, Duration::from_millis(20), stop_rx);
    let confirming = [("status", "CONFIRMING")];
    let watch = async {
        let seen_zero = stocksvr_test_support::eventually(Duration::from_secs(10), || async {
            capture.gauge(names::RESERVATIONS_INTERMEDIATE, &confirming) == Some(0.0)
        })
        .await;
        reservation(
            &pool,
            11,
            ReservationStatus::Confirming,
            10,
            10,
            None,
            false,
        )
        .await;
        let seen_one = stocksvr_test_support::eventually(Duration::from_secs(10), || async {
            capture.gauge(names::RESERVATIONS_INTERMEDIATE, &confirming) == Some(1.0)
        })
        .await;
        stop_tx.send(true).expect("task listening");
        (seen_zero, seen_one)
    };
    let (ran, seen) = tokio::join!(task, watch);
    ran.expect("stops cleanly");
    assert_eq!(seen, (true, true));
}

/// A service over `pool`; the gauges use only its pool.
async fn common_service(
    pool: &MySqlPool,
) -> std::sync::Arc<stocksvr_reservation::ReservationService> {
    let config = stocksvr_reservation::ServiceConfig::default();
    let redis_url = std::env::var("STOCKSVR__REDIS__URL")
        .unwrap_or_else(|_| "redis://127.0.0.1:6380/".to_string());
    let conn = stocksvr_store::connect_redis(
        &stocksvr_store::RedisTarget::from_env(&redis_url).expect("redis settings"),
        Duration::from_secs(5),
    )
    .await
    .expect("redis");
    let lua = std::sync::Arc::new(stocksvr_store::lua::LuaExecutor::new(conn, config.op_ttl));
    let ids = stocksvr_core::snowflake::SnowflakeGenerator::new(1).expect("worker id");
    std::sync::Arc::new(stocksvr_reservation::ReservationService::new(
        pool.clone(),
        lua,
        ids,
        config,
    ))
}
