//! The time wheel's scripts against the real Redis of the local stack: arming is
//! idempotent, a claim hides an entry for its timeout and hands it out again if it is not
//! released, only the current claimant releases, and concurrent pollers never claim one
//! entry twice. Each test uses its own wheel namespace.

use chrono::{TimeDelta, Utc};
use std::collections::HashSet;
use std::time::Duration;
use stocksvr_schedule::TimeWheel;
use stocksvr_test_support::eventually_some;

async fn wheel(test: &str, shards: u16) -> TimeWheel {
    let settings = stocksvr_test_support::infra();
    let conn = stocksvr_store::connect_redis(
        &stocksvr_store::RedisTarget::from_env(settings.redis.url.expose())
            .expect("redis settings"),
        Duration::from_secs(2),
    )
    .await
    .expect("redis of the local stack");
    let nanos = Utc::now().timestamp_nanos_opt().unwrap_or_default();
    let namespace = format!("it-{test}-{}-{nanos}", std::process::id());
    TimeWheel::new(conn, &namespace, shards).expect("valid wheel")
}

#[tokio::test]
async fn an_entry_is_claimed_once_per_lease_and_released_only_by_its_claimant() {
    let wheel = wheel("lease", 1).await;
    let key = wheel.key_for(11);
    let future = Utc::now() + TimeDelta::minutes(5);
    assert!(wheel.arm(11, future).await.expect("arm"));
    assert!(
        !wheel.arm(11, Utc::now()).await.expect("arm"),
        "arming again keeps the entry as it is"
    );
    assert_eq!(
        wheel.score(11).await.expect("score"),
        Some(future.timestamp_millis())
    );
    let timeout = Duration::from_millis(600);
    let none = wheel.claim(&key, 10, timeout).await.expect("claim");
    assert!(none.members.is_empty(), "not due yet: {none:?}");

    let past = Utc::now() - TimeDelta::seconds(1);
    assert!(wheel.arm(12, past).await.expect("arm"));
    let first = wheel.claim(&key, 10, timeout).await.expect("claim");
    assert_eq!(first.members, vec!["12".to_string()]);
    assert!(first.lease > Utc::now().timestamp_millis(), "{first:?}");
    assert_eq!(wheel.score(12).await.expect("score"), Some(first.lease));
    let hidden = wheel.claim(&key, 10, timeout).await.expect("claim");
    assert!(hidden.members.is_empty(), "claimed entries are hidden");

    // The claimant "dies": after the timeout the entry is due again, under a new lease.
    let second = eventually_some(Duration::from_secs(10), || async {
        let c = wheel.claim(&key, 10, timeout).await.expect("claim");
        (!c.members.is_empty()).then_some(c)
    })
    .await
    .expect("the entry never fell due again");
    assert_eq!(second.members, vec!["12".to_string()]);
    assert!(second.lease > first.lease);
    assert!(
        !wheel
            .release(&key, "12", first.lease)
            .await
            .expect("release"),
        "the first claimant no longer owns it"
    );
    assert!(wheel
        .release(&key, "12", second.lease)
        .await
        .expect("release"));
    assert_eq!(wheel.score(12).await.expect("score"), None);
    assert_eq!(
        wheel.score(11).await.expect("score"),
        Some(future.timestamp_millis()),
        "the future entry is untouched"
    );
    assert!(wheel.remove(11).await.expect("remove"));
}

#[tokio::test]
async fn concurrent_pollers_claim_every_due_entry_exactly_once() {
    let wheel = wheel("race", 3).await;
    let due = Utc::now() - TimeDelta::seconds(1);
    let entries: Vec<_> = (1..=300u64).map(|id| (id, due)).collect();
    assert_eq!(wheel.arm_many(&entries).await.expect("arm"), 300);
    assert_eq!(
        wheel.arm_many(&entries).await.expect("arm"),
        0,
        "idempotent"
    );
    let pollers = (0..4).map(|_| {
        let wheel = wheel.clone();
        tokio::spawn(async move {
            let mut mine = Vec::new();
            for key in wheel.keys() {
                loop {
                    let c = wheel
                        .claim(&key, 7, Duration::from_secs(60))
                        .await
                        .expect("claim");
                    if c.members.is_empty() {
                        break;
                    }
                    mine.extend(c.members.iter().map(|m| m.parse::<u64>().expect("id")));
                }
            }
            mine
        })
    });
    let mut all = Vec::new();
    for p in pollers {
        all.extend(p.await.expect("poller"));
    }
    let distinct: HashSet<u64> = all.iter().copied().collect();
    assert_eq!(all.len(), 300, "no entry claimed twice");
    assert_eq!(distinct, (1..=300).collect(), "every entry claimed");
    for id in 1..=300 {
        wheel.remove(id).await.expect("clean up");
    }
}

/// The poller claims only from the shards `peek` names due: it must name every shard whose
/// head is due by the server's clock (a due entry, or a claim whose lease ran out) and no
/// other, or a tick would skip a due entry or run scripts for nothing.
#[tokio::test]
async fn peek_names_exactly_the_shards_with_a_due_head() {
    let wheel = wheel("peek", 4).await;
    let cluster =
        stocksvr_store::RedisTarget::from_env(stocksvr_test_support::infra().redis.url.expose())
            .expect("redis settings")
            .is_cluster();
    if cluster {
        // Each shard is judged by the clock of its own master: every shard is named and each
        // claim script decides (the claim tests above cover that path).
        assert_eq!(wheel.peek().await.expect("peek").due, wheel.keys());
        return;
    }
    assert!(
        wheel.peek().await.expect("peek").due.is_empty(),
        "an empty wheel has nothing due"
    );
    // Shard 1: due a moment ago. Shard 2: due in five minutes. Shards 0 and 3: empty.
    assert!(wheel
        .arm(1, Utc::now() - TimeDelta::milliseconds(10))
        .await
        .expect("arm"));
    assert!(wheel
        .arm(2, Utc::now() + TimeDelta::minutes(5))
        .await
        .expect("arm"));
    assert_eq!(
        wheel.peek().await.expect("peek").due,
        vec![wheel.key_for(1)]
    );
    // The same look says when the earliest entry not due yet comes due: shard 2's, in five
    // minutes (the poller sleeps until then at most).
    let next = wheel.peek().await.expect("peek").next_due_in;
    let five = Duration::from_secs(300);
    assert!(
        next.is_some_and(|n| n <= five && n > five - Duration::from_secs(10)),
        "{next:?}"
    );
    // Claimed: hidden under its lease, so the shard is not due ...
    let lease = Duration::from_millis(600);
    let claim = wheel
        .claim(&wheel.key_for(1), 10, lease)
        .await
        .expect("claim");
    assert_eq!(claim.members, vec!["1".to_string()]);
    assert!(wheel.peek().await.expect("peek").due.is_empty());
    // ... until the lease runs out by the server's clock: then it is due again.
    let due = eventually_some(Duration::from_secs(10), || async {
        let due = wheel.peek().await.expect("peek").due;
        (!due.is_empty()).then_some(due)
    })
    .await
    .expect("the claimed entry never fell due again");
    assert_eq!(due, vec![wheel.key_for(1)]);
    let again = wheel
        .claim(&wheel.key_for(1), 10, lease)
        .await
        .expect("claim");
    assert_eq!(again.members, vec!["1".to_string()], "the claim agrees");
    for id in [1, 2] {
        wheel.remove(id).await.expect("clean up");
    }
}

/// An entry armed through a handle wakes a poller of the same process sleeping on
/// `armed()` (a clone's too), so it is not left to the poller's next look; arming an entry
/// that is on the wheel already changes nothing and wakes nobody.
#[tokio::test]
async fn arming_an_entry_wakes_the_pollers_of_this_process() {
    let wheel = wheel("armed", 2).await;
    let armed = wheel.armed();
    let woken = armed.notified();
    tokio::pin!(woken);
    woken.as_mut().enable();
    let due = Utc::now() + TimeDelta::minutes(5);
    assert!(wheel.clone().arm(7, due).await.expect("arm"), "added");
    tokio::time::timeout(Duration::from_secs(1), woken)
        .await
        .expect("the arm woke the poller");
    // Already there: no wake-up (a poller would look again for nothing).
    assert!(!wheel.arm(7, due).await.expect("arm"), "not added twice");
    assert_eq!(wheel.arm_many(&[(7, due)]).await.expect("arm"), 0);
    assert!(
        tokio::time::timeout(Duration::from_millis(200), armed.notified())
            .await
            .is_err(),
        "no wake-up for an entry already armed"
    );
    assert_eq!(wheel.arm_many(&[(8, due)]).await.expect("arm"), 1);
    tokio::time::timeout(Duration::from_secs(1), armed.notified())
        .await
        .expect("arm_many woke the poller");
    for id in [7, 8] {
        wheel.remove(id).await.expect("clean up");
    }
}
