//! A stock operation whose executor crashes (a failpoint abandons it right there, as a killed
//! process would) at each window of the operation WAL: the row is committed and leased but
//! Redis untouched, or Redis applied but the completion not committed. The lease is respected
//! while live, taken over after it expires, and the operation applied and announced once.
//! Its own test binary: armed failpoints are process-wide.

mod common;

use common::ops::{assert_conserved, Ops};
use stocksvr_failpoint::{scenario, Action};
use stocksvr_reservation::operations::{adjust_operation_id, init_operation_id};
use stocksvr_reservation::{OpsConfig, OpsError};
use stocksvr_store::wal::{self, WalStatus};

/// The dead executor's lease runs out; one worker round then takes the row over.
async fn take_over(f: &Ops, operation_id: &str) -> usize {
    f.expire_lease(operation_id).await;
    f.service
        .ops()
        .work_once(10)
        .await
        .expect("round")
        .succeeded
}

fn is_crash(e: &OpsError) -> bool {
    matches!(e, OpsError::Mysql(err) if stocksvr_failpoint::is_injected(err))
}

#[tokio::test]
async fn an_adjust_crashed_at_either_window_is_taken_over_and_applied_once() {
    let fp = scenario();
    let f = Ops::new(OpsConfig::default()).await;
    let bucket = f.bucket(f.today);
    let init = f
        .service
        .ops()
        .init_bucket(&f.baseline(f.today, 50))
        .await
        .expect("init");
    assert!(init.succeeded(), "{init:?}");
    f.reserve(1, 5).await;

    for (round, (point, redis_ran)) in [("wal.before_redis", false), ("wal.before_complete", true)]
        .into_iter()
        .enumerate()
    {
        let new_total = 60 + round as i64 * 10;
        let before = f.redis(f.today).await.expect("bucket");
        fp.arm(point, Action::Crash);
        let err = f
            .service
            .ops()
            .adjust(&bucket, new_total)
            .await
            .expect_err("the executor crashed");
        assert!(is_crash(&err), "{err}");
        fp.disarm(point);

        let version = 2 + round as u64;
        let op = adjust_operation_id(&bucket, version);
        let row = wal::find_by_op(&f.pool, &op)
            .await
            .expect("find")
            .expect("row");
        assert_eq!(row.status(), Some(WalStatus::Executing));
        assert!(
            row.lease_owner.is_some(),
            "the dead executor still holds the lease"
        );
        let after_crash = f.redis(f.today).await.expect("bucket");
        assert_eq!(
            after_crash.total == new_total,
            redis_ran,
            "Redis moved only if the crash came after the script: {after_crash:?}"
        );
        // The baseline is committed with the WAL row, before Redis.
        let b = stocksvr_store::baselines::find_baseline(&f.pool, &bucket)
            .await
            .expect("b")
            .expect("baseline");
        assert_eq!((b.total_stock, b.baseline_version), (new_total, version));

        // A live lease is left alone.
        let early = f.service.ops().work_once(10).await.expect("round");
        assert_eq!(early.succeeded, 0, "took over a live lease");

        assert_eq!(take_over(&f, &op).await, 1);
        let row = wal::find_by_op(&f.pool, &op)
            .await
            .expect("find")
            .expect("row");
        assert_eq!(row.status(), Some(WalStatus::Succeeded));
        let result: serde_json::Value =
            serde_json::from_str(row.result_payload.as_deref().expect("result")).expect("json");
        assert_eq!(result["replayed"], serde_json::json!(redis_ran));
        let n = f.redis(f.today).await.expect("bucket");
        assert_eq!(
            (n.total, n.available, n.reserved),
            (new_total, new_total - 5, 5)
        );
        assert_eq!(n.version, before.version + 1, "applied once");
        assert_conserved(&n);
        // Nothing is left to do, and the event went out once.
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
    assert_eq!(f.outbox_count("StockBaselineAdjusted").await, 2);
}

/// The first Try of the day finds no bucket and its lazy init crashes after Redis: the Try
/// fails (the order service retries), the WAL worker completes the init once after the lease,
/// and the reservation left PREPARING is finished by the recovery worker.
#[tokio::test]
async fn a_lazy_init_that_crashed_mid_try_converges_with_one_initialisation() {
    let fp = scenario();
    let f = Ops::new(OpsConfig::default()).await;
    stocksvr_store::baselines::ensure_baseline(&f.pool, &f.baseline(f.today, 30))
        .await
        .expect("baseline");
    fp.arm("wal.before_complete", Action::Crash);
    let err = f
        .service
        .try_reserve(&f.request(1, 4))
        .await
        .expect_err("the lazy init crashed");
    fp.disarm("wal.before_complete");
    assert!(err.is_transient(), "retryable for the order service: {err}");
    // A crashed process records nothing: the reservation is PREPARING as the insert left it.
    let (status, retries): (i8, u32) =
        sqlx::query_as("SELECT status, retry_count FROM inventory_reservation")
            .fetch_one(&f.pool)
            .await
            .expect("reservation");
    assert_eq!((status, retries), (10, 0));
    let op = init_operation_id(&f.bucket(f.today), 1);
    let row = wal::find_by_op(&f.pool, &op)
        .await
        .expect("find")
        .expect("row");
    assert_eq!(row.status(), Some(WalStatus::Executing));
    assert_eq!(f.redis(f.today).await.expect("bucket").total, 30);

    assert_eq!(take_over(&f, &op).await, 1);
    assert_eq!(f.outbox_count("StockBucketInitialized").await, 1);
    // The order service's retry of the same Try finishes the PREPARING reservation once.
    let reply = f
        .service
        .try_reserve(&f.request(1, 4))
        .await
        .expect("retry");
    assert_eq!(reply.reservation.status_name(), "RESERVED");
    assert!(!reply.created, "the retry resumed the first Try");
    let n = f.redis(f.today).await.expect("bucket");
    assert_eq!(
        (n.total, n.available, n.reserved, n.version),
        (30, 26, 4, 2)
    );
    assert_eq!(f.outbox_count("StockBucketInitialized").await, 1);
    assert_eq!(f.outbox_count("InventoryRedisReserved").await, 1);
}
