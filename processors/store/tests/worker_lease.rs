//! Snowflake worker-id leases against the real MariaDB: two live instances never hold the
//! same id, an expired lease is taken over, and the old holder learns it lost the id.

use chrono::TimeDelta;
use std::time::Duration;
use stocksvr_store::worker_lease::{LeaseError, WorkerLease};

async fn fresh_pool() -> stocksvr_test_support::TestDb {
    stocksvr_test_support::TestDb::migrated().await
}

#[tokio::test]
async fn concurrent_instances_get_distinct_worker_ids() {
    let pool = fresh_pool().await;
    let mut tasks = Vec::new();
    for i in 0..20 {
        let pool = pool.clone();
        tasks.push(tokio::spawn(async move {
            WorkerLease::acquire(&pool, &format!("instance-{i}"), TimeDelta::seconds(30)).await
        }));
    }
    let mut ids = std::collections::HashSet::new();
    for t in tasks {
        let lease = t.await.expect("task").expect("lease");
        assert!(
            ids.insert(lease.worker_id),
            "worker id {} handed out twice",
            lease.worker_id
        );
        lease.renew(&pool).await.expect("renew own lease");
    }
    assert_eq!(ids.len(), 20);
}

#[tokio::test]
async fn an_expired_lease_is_taken_over_and_the_old_holder_is_told() {
    let pool = fresh_pool().await;
    let old = WorkerLease::acquire(&pool, "old", TimeDelta::milliseconds(200))
        .await
        .expect("lease");
    let live = WorkerLease::acquire(&pool, "other", TimeDelta::seconds(30))
        .await
        .expect("lease");
    assert_ne!(
        old.worker_id, live.worker_id,
        "a live lease is never shared"
    );
    // A fixed wait on the wall clock: `acquire` compares `lease_expire_at` with the caller's
    // clock, and polling `acquire` instead would itself take (and hold) worker ids.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let new = WorkerLease::acquire(&pool, "new", TimeDelta::seconds(30))
        .await
        .expect("lease");
    assert_eq!(new.worker_id, old.worker_id, "the expired id is reused");
    assert!(matches!(old.renew(&pool).await, Err(LeaseError::Lost(id)) if id == old.worker_id));
    new.release(&pool).await.expect("release");
    let again = WorkerLease::acquire(&pool, "again", TimeDelta::seconds(30))
        .await
        .expect("lease");
    assert_eq!(
        again.worker_id, old.worker_id,
        "a released id is free at once"
    );
}
