//! Confirm through group commit: the CAS into CONFIRMING and the completion to CONFIRMED of
//! concurrent Confirms are written in groups (one multi-row CAS per group), against the real
//! MariaDB and Redis of the local stack. Each test uses its own database and merchant.

mod common;

use common::Fixture;
use std::collections::HashMap;
use stocksvr_core::reservation::{confirm_operation_id, ReservationStatus};
use stocksvr_reservation::IntentOutcome;
use stocksvr_store::reservations::{self as repo, Begin, Completion, Reservation};

async fn row(f: &Fixture, id: u64) -> Reservation {
    repo::find(&f.pool, id)
        .await
        .expect("find")
        .expect("row exists")
}

/// Outbox events of `event_type` per reservation: rows of that type, or step rows carrying it
/// as their lifecycle event.
async fn events_per_reservation(f: &Fixture, event_type: &str) -> HashMap<u64, i64> {
    let rows: Vec<(u64, i64)> = sqlx::query_as(&format!(
        "SELECT o.aggregate_id, COUNT(*) FROM inventory_outbox o \
         WHERE o.event_type = ? OR {} = ? GROUP BY o.aggregate_id",
        stocksvr_store::outbox::LIFECYCLE_EVENT_TYPE
    ))
    .bind(event_type)
    .bind(stocksvr_core::events::topics::INVENTORY_LIFECYCLE)
    .bind(event_type)
    .fetch_all(&f.pool)
    .await
    .expect("outbox");
    rows.into_iter().collect()
}

/// MySQL's reserved and sold quantities of the fixture's bucket (RESERVED and CONFIRMED rows).
async fn mysql_held(f: &Fixture) -> (i64, i64) {
    let sum = |status: ReservationStatus| {
        let pool = f.pool.clone();
        async move {
            let (qty,): (Option<i64>,) = sqlx::query_as(
                "SELECT CAST(SUM(quantity) AS SIGNED) FROM inventory_reservation WHERE status = ?",
            )
            .bind(status.code() as i8)
            .fetch_one(&pool)
            .await
            .expect("sum");
            qty.unwrap_or(0)
        }
    };
    (
        sum(ReservationStatus::Reserved).await,
        sum(ReservationStatus::Confirmed).await,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_concurrent_confirms_in_groups_confirm_each_reservation_once() {
    // Hundreds of Confirms at once queue behind the group writes; this test is about the
    // invariants, so the statement deadline (which counts the wait for a connection) must
    // not turn the queue into errors.
    stocksvr_store::deadline::set_statement_deadline(std::time::Duration::from_secs(120));
    let f = Fixture::new(2_000).await;
    let mut reserved = Vec::new();
    for item in 1..=300u64 {
        let quantity = (item % 3) as u32 + 1;
        reserved.push(f.reserve(item, quantity).await);
    }
    // The last 20 stay RESERVED, so the bucket holds reserved and sold stock at the end.
    let (to_confirm, kept) = reserved.split_at(280);
    let before: HashMap<u64, Reservation> = {
        let mut rows = HashMap::new();
        for &id in to_confirm {
            rows.insert(id, row(&f, id).await);
        }
        rows
    };
    // Each reservation is confirmed three times at once: twice by id and once on the row
    // read before (stale once another Confirm moved it), so groups hold rows that lose
    // their CAS next to rows that win it.
    let mut tasks = Vec::new();
    for &id in to_confirm {
        for copy in 0..3 {
            let service = f.service.clone();
            let read = before[&id].clone();
            tasks.push(tokio::spawn(async move {
                let outcome = if copy == 0 {
                    service.confirm(read).await
                } else {
                    service.confirm(id).await
                };
                (id, outcome)
            }));
        }
    }
    for task in tasks {
        let (id, outcome) = task.await.expect("task");
        match outcome.expect("every Confirm gets a definite answer") {
            IntentOutcome::Done { reservation, .. } => {
                assert_eq!(reservation.id, id);
                assert_eq!(reservation.status_name(), "CONFIRMED", "{id}");
            }
            other => panic!("Confirm of {id} answered {other:?}"),
        }
    }
    for &id in to_confirm {
        let now = row(&f, id).await;
        assert_eq!(now.status_name(), "CONFIRMED");
        assert_eq!(now.current_operation_id, confirm_operation_id(id));
        // One CAS into CONFIRMING and one completion: each landed exactly once.
        assert_eq!(now.version, before[&id].version + 2, "reservation {id}");
    }
    for &id in kept {
        assert_eq!(f.status(id).await, "RESERVED");
    }
    let confirmed = events_per_reservation(&f, "InventoryConfirmed").await;
    let stock = events_per_reservation(&f, "InventoryRedisConfirmed").await;
    assert_eq!(confirmed.len(), to_confirm.len());
    assert_eq!(stock.len(), to_confirm.len());
    for &id in to_confirm {
        assert_eq!(confirmed.get(&id), Some(&1), "one confirmed event for {id}");
        assert_eq!(stock.get(&id), Some(&1), "one stock-change event for {id}");
    }
    let (total, available, redis_reserved, redis_sold) = f.numbers().await;
    assert_eq!(
        (redis_reserved, redis_sold),
        mysql_held(&f).await,
        "Redis reserved/sold equal MySQL's"
    );
    assert_eq!(available + redis_reserved + redis_sold, total);
}

#[tokio::test]
async fn a_group_with_one_lost_cas_still_settles_every_other_row() {
    let f = Fixture::new(100).await;
    let mut ids = Vec::new();
    for item in 1..=6u64 {
        ids.push(f.reserve(item, 1).await);
    }
    let mut stale = Vec::new();
    for &id in &ids {
        stale.push(row(&f, id).await);
    }
    // Another actor moves one row first: its CAS in the group is lost.
    let lost = ids[2];
    f.service.confirm(lost).await.expect("confirm");
    let moved = row(&f, lost).await;
    assert_eq!(moved.status_name(), "CONFIRMED");

    let begins: Vec<Begin> = stale
        .iter()
        .map(|r| Begin {
            row: r.clone(),
            to: ReservationStatus::Confirming,
            operation_id: confirm_operation_id(r.id),
            pending_quantity: r.held(),
            resume_status: None,
        })
        .collect();
    let begun = repo::begin_steps(&f.pool, &begins).await.expect("begin");
    assert_eq!(begun.len(), ids.len());
    for (i, &id) in ids.iter().enumerate() {
        match &begun[i] {
            None => assert_eq!(id, lost, "only the moved row loses its CAS"),
            Some(r) => {
                assert_ne!(id, lost, "the moved row must not be begun again");
                assert_eq!(r.status_name(), "CONFIRMING");
                // The row built from the CAS is the row MySQL holds.
                assert_eq!(*r, row(&f, id).await, "reservation {id}");
            }
        }
    }
    assert_eq!(row(&f, lost).await, moved, "the lost row is untouched");

    // The completion stage: one begun row is finished by someone else first.
    let begun: Vec<Reservation> = begun.into_iter().flatten().collect();
    let finished_first = begun[0].id;
    let done = Completion {
        to: ReservationStatus::Confirmed,
        expected_redis_version: None,
        refunded_add: 0,
        reject_reason: None,
        outbox: Vec::new(),
    };
    let first = repo::complete_one(&f.pool, &begun[0], &done)
        .await
        .expect("complete")
        .expect("landed");
    let items: Vec<(&Reservation, &Completion)> = begun.iter().map(|r| (r, &done)).collect();
    let landed = repo::complete_steps(&f.pool, &items)
        .await
        .expect("complete");
    assert_eq!(landed.len(), begun.len());
    assert!(landed[0].is_none(), "the finished row loses its CAS");
    assert_eq!(
        row(&f, finished_first).await,
        first,
        "and stays as finished"
    );
    for (r, l) in begun.iter().zip(&landed).skip(1) {
        let l = l.as_ref().expect("every other row lands");
        assert_eq!(l.status_name(), "CONFIRMED");
        assert_eq!(l.version, r.version + 1);
        assert_eq!(*l, row(&f, r.id).await, "reservation {}", r.id);
    }
}
