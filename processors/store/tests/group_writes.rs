//! The Try group's two writes against MariaDB: the PREPARING rows of a group
//! (`insert_preparing_many`, one INSERT of every row) and the group's completion with its
//! outbox rows (`complete_steps`, one CAS UPDATE of every row, one INSERT of the events, one
//! transaction). Every row must come out exactly as the caller builds it without a read
//! (`inserted_row`, `applied_to`), each with its own values, and the outbox rows in the
//! order the group wrote them.

use chrono::{NaiveDateTime, TimeDelta};
use serde_json::json;
use sqlx::MySqlPool;
use stocksvr_core::reservation::ReservationStatus;
use stocksvr_store::outbox::NewOutbox;
use stocksvr_store::reservations::{self as repo, Completion, InsertOutcome, NewReservation};

fn new_row(id: u64, processing_time: Option<NaiveDateTime>, at: NaiveDateTime) -> NewReservation {
    NewReservation {
        id,
        order_id: id * 10,
        order_item_id: id * 100,
        merchant_id: 7,
        dish_id: 31 + id % 2,
        stock_bucket_id: format!("b_{}", id % 2),
        stock_date: at.date(),
        quantity: 1 + (id % 3) as u32,
        order_type: if processing_time.is_some() { 2 } else { 1 },
        processing_time,
        // Milliseconds that are not zero: a time that lost or rounded them would show.
        expire_at: at + TimeDelta::milliseconds(1_800_123 + id as i64),
        try_operation_id: format!("try_{id}"),
    }
}

fn event(id: u64, kind: &str) -> NewOutbox {
    NewOutbox {
        event_id: format!("evt_{id}_{kind}"),
        aggregate_id: id,
        event_type: kind.to_string(),
        topic: "stock.change.v1".to_string(),
        partition_key: format!("b_{}", id % 2),
        // Nested values, a quote and a non-ASCII character travel inside the document.
        payload: json!({"reservation_id": id, "kind": kind, "note": "a \"quoted\" Ä", "lines": [1, 2]}),
        body: None,
    }
}

async fn outbox(pool: &MySqlPool) -> Vec<(String, u64, serde_json::Value)> {
    let rows: Vec<(String, u64, serde_json::Value)> =
        sqlx::query_as("SELECT event_id, aggregate_id, payload FROM inventory_outbox ORDER BY id")
            .fetch_all(pool)
            .await
            .expect("outbox rows");
    rows
}

#[tokio::test]
async fn a_group_lands_row_by_row_as_built_and_its_events_in_written_order() {
    let db = stocksvr_test_support::TestDb::migrated().await;
    let pool = &db.pool;
    // Times in milliseconds, as the service makes them (`clock::now`).
    let at = stocksvr_store::clock::now();
    // A repeat of an item: its earlier reservation stays, the group's row is skipped.
    let earlier = new_row(4_002, None, at);
    let (_, single) = repo::insert_preparing_many(pool, std::slice::from_ref(&earlier))
        .await
        .expect("earlier Try");
    assert_eq!(single, vec![InsertOutcome::Inserted]);
    // A failed order: its fence refuses the row.
    sqlx::query(
        "INSERT INTO inventory_order_fence (order_id, event_id, reason, created_at) \
         VALUES (?, 'evt_failed', 'test', NOW(3))",
    )
    .bind(4_005u64 * 10)
    .execute(pool)
    .await
    .expect("fence");

    // Ids out of order, a scheduled order next to instant ones.
    let repeat = NewReservation {
        id: 4_009,
        ..earlier.clone()
    };
    let group = vec![
        new_row(4_003, None, at),
        new_row(4_001, Some(at + TimeDelta::milliseconds(3_600_456)), at),
        repeat,
        new_row(4_005, None, at),
        new_row(4_004, None, at),
    ];
    let (written_at, outcomes) = repo::insert_preparing_many(pool, &group)
        .await
        .expect("group insert");
    assert_eq!(outcomes.len(), group.len());
    let mut inserted = Vec::new();
    for (new, outcome) in group.iter().zip(&outcomes) {
        match (new.id, outcome) {
            (4_009, InsertOutcome::Existing(row)) => assert_eq!(row.id, earlier.id),
            (4_005, InsertOutcome::OrderFailed) => {}
            (id, InsertOutcome::Inserted) if ![4_009, 4_005].contains(&id) => {
                let built = new.inserted_row(written_at);
                let read = repo::find(pool, id).await.expect("find").expect("row");
                assert_eq!(
                    read, built,
                    "reservation {id}: the row built without a read"
                );
                inserted.push(read);
            }
            (id, other) => panic!("reservation {id}: unexpected {other:?}"),
        }
    }
    assert_eq!(inserted.len(), 3);
    for gone in [4_005, 4_009] {
        assert!(repo::find(pool, gone).await.expect("find").is_none());
    }

    // Completions that differ in every column the group's CAS sets, items not by id.
    let reserved = |v: u64, id: u64| Completion {
        to: ReservationStatus::Reserved,
        expected_redis_version: Some(v),
        refunded_add: 0,
        reject_reason: None,
        outbox: vec![event(id, "InventoryReserved"), event(id, "StockChanged")],
    };
    let rejected = Completion {
        to: ReservationStatus::Rejected,
        expected_redis_version: None,
        refunded_add: 0,
        reject_reason: Some("INSUFFICIENT_STOCK".to_string()),
        outbox: vec![event(inserted[1].id, "InventoryRejected")],
    };
    let first = reserved(17, inserted[0].id);
    let third = reserved(19, inserted[2].id);
    let items: Vec<(&repo::Reservation, &Completion)> = vec![
        (&inserted[0], &first),
        (&inserted[1], &rejected),
        (&inserted[2], &third),
    ];
    let landed = repo::complete_steps(pool, &items).await.expect("complete");
    assert_eq!(landed.len(), 3);
    for ((row, c), l) in items.iter().zip(&landed) {
        let l = l.as_ref().expect("every row lands");
        let read = repo::find(pool, row.id).await.expect("find").expect("row");
        assert_eq!(
            *l, read,
            "reservation {}: the row built without a read",
            row.id
        );
        assert_eq!(read.status, c.to.code() as i8);
        assert_eq!(read.version, row.version + 1);
    }
    let rejected_row = repo::find(pool, inserted[1].id)
        .await
        .expect("find")
        .expect("row");
    assert_eq!(
        rejected_row.reject_reason.as_deref(),
        Some("INSUFFICIENT_STOCK")
    );
    assert_eq!(rejected_row.expected_redis_version, None);
    assert_eq!(
        repo::find(pool, inserted[2].id)
            .await
            .expect("find")
            .expect("row")
            .expected_redis_version,
        Some(19)
    );

    // The outbox: the group's events in the order the group wrote them, payloads intact.
    let written: Vec<(String, u64, serde_json::Value)> = items
        .iter()
        .flat_map(|(_, c)| &c.outbox)
        .map(|e| (e.event_id.clone(), e.aggregate_id, e.payload.clone()))
        .collect();
    assert_eq!(outbox(pool).await, written);
}

/// UPDATEs this session ran so far: the pool below has one connection, so every statement
/// of the group goes through the same session.
async fn updates_run(pool: &MySqlPool) -> u64 {
    stocksvr_test_support::session_status(pool, "Com_update").await
}

/// A group whose rows all win their CAS is one UPDATE for the whole group, for its begin and
/// for its completion. A broken group statement would not show in the rows: the group would
/// lose its CAS, roll back and write each row alone with the same result, one UPDATE a row.
#[tokio::test]
async fn a_clean_group_moves_all_its_rows_with_one_update() {
    let db = stocksvr_test_support::TestDb::migrated().await;
    let pool = stocksvr_store::mysql_pool(&db.url, 1, std::time::Duration::from_secs(10))
        .expect("a pool of one connection");
    let at = stocksvr_store::clock::now();
    let group: Vec<NewReservation> = (5_001..=5_004).map(|id| new_row(id, None, at)).collect();
    let (_, outcomes) = repo::insert_preparing_many(&pool, &group)
        .await
        .expect("group insert");
    assert!(outcomes.iter().all(|o| *o == InsertOutcome::Inserted));
    let mut rows = Vec::new();
    for new in &group {
        rows.push(repo::find(&pool, new.id).await.expect("find").expect("row"));
    }

    let begins: Vec<repo::Begin> = rows
        .iter()
        .map(|row| repo::Begin {
            row: row.clone(),
            to: ReservationStatus::Confirming,
            operation_id: format!("confirm_{}", row.id),
            pending_quantity: row.quantity,
            resume_status: None,
        })
        .collect();
    let before = updates_run(&pool).await;
    let begun = repo::begin_steps(&pool, &begins).await.expect("begin");
    assert_eq!(updates_run(&pool).await - before, 1, "the group's begin");
    let begun: Vec<repo::Reservation> = begun
        .into_iter()
        .map(|r| r.expect("every row begun"))
        .collect();

    let completions: Vec<Completion> = begun
        .iter()
        .map(|row| Completion {
            to: ReservationStatus::Confirmed,
            expected_redis_version: Some(3),
            refunded_add: 0,
            reject_reason: None,
            outbox: vec![event(row.id, "InventoryConfirmed")],
        })
        .collect();
    let items: Vec<(&repo::Reservation, &Completion)> = begun.iter().zip(&completions).collect();
    let before = updates_run(&pool).await;
    let landed = repo::complete_steps(&pool, &items).await.expect("complete");
    assert_eq!(
        updates_run(&pool).await - before,
        1,
        "the group's completion"
    );
    for (row, l) in begun.iter().zip(&landed) {
        let l = l.as_ref().expect("every row lands");
        assert_eq!(l.status_name(), "CONFIRMED");
        assert_eq!(
            *l,
            repo::find(&pool, row.id).await.expect("find").expect("row")
        );
    }
}

/// The order-lifecycle reads the reservations of a batch's orders in one statement: each
/// order gets its own rows (an order of two items both, an order with none nothing), in
/// order id order, and each row as the single-order read gives it.
#[tokio::test]
async fn the_reservations_of_several_orders_come_in_one_read_as_each_order_alone_reads_them() {
    let db = stocksvr_test_support::TestDb::migrated().await;
    let pool = &db.pool;
    let at = stocksvr_store::clock::now();
    let two_items = NewReservation {
        id: 5_003,
        order_item_id: 5_003 * 100 + 1,
        ..new_row(5_002, None, at)
    };
    let rows = [
        new_row(5_002, None, at),
        two_items,
        new_row(5_001, None, at),
    ];
    let (_, outcomes) = repo::insert_preparing_many(pool, &rows)
        .await
        .expect("PREPARING rows");
    assert_eq!(outcomes, vec![InsertOutcome::Inserted; 3]);

    let (a, b, none) = (5_001 * 10, 5_002 * 10, 5_004 * 10);
    let read = repo::list_by_orders(pool, &[b, none, a])
        .await
        .expect("orders' rows");
    let got: Vec<(u64, u64)> = read.iter().map(|r| (r.order_id, r.id)).collect();
    assert_eq!(got, vec![(a, 5_001), (b, 5_002), (b, 5_003)]);
    for order in [a, b] {
        let alone = repo::list_by_order(pool, order).await.expect("one order");
        let together: Vec<_> = read
            .iter()
            .filter(|r| r.order_id == order)
            .cloned()
            .collect();
        assert_eq!(together, alone, "order {order}");
    }
    assert!(repo::list_by_orders(pool, &[])
        .await
        .expect("no orders")
        .is_empty());
}
