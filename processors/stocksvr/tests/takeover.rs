//! Takeover in seconds (issue 51): what a killed instance held under a lease is taken over by
//! a live `stocksvr all` within the lease plus one idle round of the worker that takes it,
//! at most 10 s with the default settings. The dead holder is written as kill -9 leaves it
//! right after its last renewal or claim: the relay's lead, a reconciler shard, a WAL row being
//! executed, a reservation its recovery worker had claimed (a Try whose Lua never ran). The
//! partitions' takeover (the consumers' session) is measured by the chaos suite's scale-out
//! run, which kills a real instance.

mod common;

use common::api::{shop, wait_for_api};
use common::flow::count;
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use stocksvr::Settings;
use stocksvr_core::codes::WalStatus;

const DEAD: &str = "dead-host:1";

#[tokio::test]
async fn a_dead_instances_leases_are_taken_over_within_ten_seconds() {
    let defaults = Settings::default();
    let secs = |s: u64| Duration::from_secs(s);
    let ms = Duration::from_millis;
    // Lease, then the longest idle sleep of the loop that takes it over.
    let relay = (
        secs(defaults.relay.claim_lease_secs),
        ms(defaults.relay.max_poll_ms),
    );
    let reconcile = (
        secs(defaults.reconcile.lease_secs),
        secs(defaults.reconcile.interval_secs) / defaults.reconcile.shards.max(1),
    );
    let wal = (secs(defaults.stock_ops.wal_lease_secs), ms(3_000));
    let recovery = (
        secs(defaults.recovery.lease_secs),
        ms(defaults.recovery.idle_poll_ms * 10),
    );
    let leases = [
        ("relay lead", relay),
        ("reconciler shard", reconcile),
        ("WAL row", wal),
        ("recovery claim", recovery),
    ];
    for (what, (lease, idle)) in leases {
        assert!(
            lease + idle <= secs(10),
            "{what}: a {lease:?} lease and {idle:?} idle rounds exceed the 10 s bound"
        );
    }

    let shop = shop(100).await;
    let server = shop.server(&[]);
    wait_for_api(&server).await;
    let pool = shop.env.pool();
    // A WAL row: a bucket of another dish, initialised (and executed) by the command line.
    let merchant = shop.merchant_id.to_string();
    let (ok, _, err) = common::run(shop.env.stocksvr().args([
        "bucket",
        "init",
        "--merchant-id",
        merchant.as_str(),
        "--dish-id",
        "32",
        "--total",
        "10",
    ]));
    assert!(ok, "bucket init: {err}");
    // The reconciler wrote its shard rows and the relay leads.
    let ready = stocksvr_test_support::eventually(Duration::from_secs(60), || async {
        let shards = count(&pool, "SELECT COUNT(*) FROM inventory_reconcile_shard").await;
        let led = count(
            &pool,
            "SELECT COUNT(*) FROM inventory_outbox_relay WHERE owner IS NOT NULL",
        )
        .await;
        shards > 0 && led > 0
    })
    .await;
    assert!(
        ready,
        "no shard rows or no relay leader; log:\n{}",
        server.log()
    );
    let reservation = 910_000_000 + shop.merchant_id % 1_000_000;
    common::flow::insert_preparing(&pool, &shop, 9_100, 91_000, reservation, 1).await;

    // kill -9 of their holder, right after it renewed or claimed each.
    let lease_of = |l: (Duration, Duration)| l.0.as_secs();
    let mut tx = pool.begin().await.expect("begin");
    sqlx::query(
        "UPDATE inventory_outbox_relay SET owner = ?, epoch = epoch + 1, \
         lease_until = NOW(3) + INTERVAL ? SECOND WHERE id = 1",
    )
    .bind("dead-host-1-1")
    .bind(lease_of(relay))
    .execute(&mut *tx)
    .await
    .expect("relay");
    sqlx::query(
        "UPDATE inventory_reconcile_shard SET lease_owner = ?, last_pass_at = NULL, \
         lease_expire_at = UTC_TIMESTAMP(3) + INTERVAL ? SECOND WHERE shard = 0",
    )
    .bind(DEAD)
    .bind(lease_of(reconcile))
    .execute(&mut *tx)
    .await
    .expect("shard");
    let wal_rows = sqlx::query(
        "UPDATE inventory_operation_wal SET status = ?, lease_owner = ?, \
         lease_expire_at = UTC_TIMESTAMP(3) + INTERVAL ? SECOND, \
         next_retry_at = UTC_TIMESTAMP(3) + INTERVAL ? SECOND WHERE stock_bucket_id = ?",
    )
    .bind(WalStatus::Executing.code())
    .bind(format!("{DEAD}:1"))
    .bind(lease_of(wal))
    .bind(lease_of(wal))
    .bind(
        stocksvr_core::bucket::BucketKey::new(
            shop.merchant_id,
            32,
            stocksvr_test_support::zone::today(),
        )
        .stock_bucket_id(),
    )
    .execute(&mut *tx)
    .await
    .expect("wal");
    assert_eq!(wal_rows.rows_affected(), 1, "the bucket init's WAL row");
    sqlx::query(
        "UPDATE inventory_reservation SET next_retry_at = UTC_TIMESTAMP(3) + INTERVAL ? SECOND \
         WHERE id = ?",
    )
    .bind(lease_of(recovery))
    .bind(reservation)
    .execute(&mut *tx)
    .await
    .expect("reservation");
    tx.commit().await.expect("commit");
    let dead_at = Instant::now();

    // Taken over: another owner holds it (or the work is done).
    let checks = [
        (
            "relay lead",
            "SELECT COUNT(*) FROM inventory_outbox_relay WHERE owner = 'dead-host-1-1'".to_string(),
        ),
        (
            "reconciler shard",
            format!("SELECT COUNT(*) FROM inventory_reconcile_shard WHERE lease_owner = '{DEAD}'"),
        ),
        (
            "WAL row",
            format!("SELECT COUNT(*) FROM inventory_operation_wal WHERE lease_owner = '{DEAD}:1'"),
        ),
        (
            "recovery claim",
            format!(
                "SELECT COUNT(*) FROM inventory_reservation WHERE id = {reservation} AND status = {}",
                stocksvr_core::reservation::ReservationStatus::Preparing.code()
            ),
        ),
    ];
    let taken: Mutex<BTreeMap<&str, Duration>> = Mutex::default();
    let all = stocksvr_test_support::eventually(Duration::from_secs(30), || async {
        for (what, sql) in checks.iter() {
            let seen = taken.lock().expect("lock").contains_key(what);
            if !seen && count(&pool, sql).await == 0 {
                taken.lock().expect("lock").insert(what, dead_at.elapsed());
            }
        }
        taken.lock().expect("lock").len() == checks.len()
    })
    .await;
    let taken = taken.into_inner().expect("lock");
    eprintln!("taken over after the dead holder's last renewal or claim: {taken:?}");
    assert!(
        all,
        "not all taken over within 30 s: {taken:?}; log:\n{}",
        server.log()
    );
    // Within the lease plus the idle round, and a second for the polls and the statements.
    for (what, (lease, idle)) in leases {
        let took = taken[what];
        assert!(
            took >= lease.saturating_sub(ms(500)),
            "{what} taken over after {took:?}, before its {lease:?} lease ran out"
        );
        assert!(
            took <= lease + idle + secs(1),
            "{what} taken over after {took:?}"
        );
    }
}
