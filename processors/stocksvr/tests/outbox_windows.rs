//! Failure windows 5 and 6 (docs/design.md, failure windows) from the reservation service
//! to the ledger: the outbox rows a real Try, Confirm, partial Refund and Cancel committed
//! are relayed by a relay that dies twice (failpoints, live in test builds only): once
//! after reading the rows and before publishing (window 5: MySQL committed, Kafka not
//! sent), once after the broker's acknowledgement and before moving the high-water mark
//! over the rows (window 6: every event is on Kafka twice under the same event_id). The
//! next relay publishes what was left; the projector, consuming all of it, books exactly
//! one ledger row per Redis operation and dedupes every copy in its inbox. The mapping of
//! every failure window to its tests is in `processors/reservation/tests/failure_windows.rs`.

mod common;

use common::api::shop;
use futures::future::{BoxFuture, FutureExt};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use stocksvr_core::bucket::BucketKey;
use stocksvr_core::events::topics;
use stocksvr_core::reservation::{
    cancel_operation_id, confirm_operation_id, refund_operation_id, try_operation_id,
};
use stocksvr_core::snowflake::SnowflakeGenerator;
use stocksvr_failpoint::{is_injected, scenario, Action};
use stocksvr_outbox_relay::{status, OutboxRelay, RelayConfig, UNSENT, UNSENT_CODES};
use stocksvr_pipeline::catalog::Catalog;
use stocksvr_pipeline::codec::AvroCodec;
use stocksvr_pipeline::consumer::{self, Applied, Failure, Handler, Record};
use stocksvr_projector::{loop_config, Projector};
use stocksvr_reservation::{
    IntentOutcome, ReservationService, ServiceConfig, TryReply, TryRequest,
};
use stocksvr_store::lua::LuaExecutor;
use stocksvr_test_support::eventually;
use tokio::sync::watch;

/// Partitions of the test namespace's topics (see `common::TestEnv`).
const PARTITIONS: i32 = 2;

/// The projector, tallying what it answered for each record handed to it.
struct Tally {
    inner: Projector,
    answers: Mutex<Vec<Applied>>,
}

impl Tally {
    fn answers(&self) -> Vec<Applied> {
        self.answers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

impl Handler for Tally {
    fn handle<'a>(
        &'a self,
        batch: &'a [Record],
    ) -> BoxFuture<'a, Result<Vec<Result<Applied, Failure>>, Failure>> {
        async move {
            let results = self.inner.handle(batch).await?;
            let mut answers = self
                .answers
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            for r in &results {
                answers.push(r.clone().expect("every relayed event projects"));
            }
            Ok(results)
        }
        .boxed()
    }
}

async fn outbox_statuses(pool: &sqlx::MySqlPool) -> BTreeMap<i8, i64> {
    let rows: Vec<(i8, i64)> =
        sqlx::query_as("SELECT status, COUNT(*) FROM inventory_outbox GROUP BY status")
            .fetch_all(pool)
            .await
            .expect("outbox statuses");
    rows.into_iter().collect()
}

/// The dead relay's leader lease runs out (instead of waiting its 30 s).
async fn expire_leases(pool: &sqlx::MySqlPool) {
    sqlx::query(
        "UPDATE inventory_outbox_relay SET lease_until = NOW(3) - INTERVAL 1 SECOND WHERE id = 1",
    )
    .execute(pool)
    .await
    .expect("expire leases");
}

/// The persisted high-water mark and the rows not sent yet (PENDING above the mark,
/// SENDING, RETRY).
async fn mark_and_unsent(pool: &sqlx::MySqlPool) -> (u64, i64) {
    let sql = format!(
        "SELECT c.hwm, (SELECT COUNT(*) FROM inventory_outbox o WHERE {UNSENT}) \
         FROM inventory_outbox_relay c WHERE c.id = 1"
    );
    UNSENT_CODES
        .iter()
        .fold(sqlx::query_as(&sql), |q, code| q.bind(code))
        .fetch_one(pool)
        .await
        .expect("mark")
}

/// Records on `topic` (sum of the partitions' high watermarks).
fn records_on(topic: &str) -> i64 {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let consumer: BaseConsumer =
        stocksvr_pipeline::kafka::client_config(&common::settings().kafka, "test-watermarks")
            .set("group.id", common::unique("test-watermarks"))
            .create()
            .expect("consumer");
    (0..PARTITIONS)
        .map(|p| {
            consumer
                .fetch_watermarks(topic, p, Duration::from_secs(10))
                .expect("watermarks")
                .1
        })
        .sum()
}

fn done(outcome: IntentOutcome) {
    assert!(
        matches!(outcome, IntentOutcome::Done { already: false, .. }),
        "{outcome:?}"
    );
}

fn id_of(reply: &TryReply) -> u64 {
    assert_eq!(reply.reservation.status_name(), "RESERVED");
    reply.reservation.id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_that_dies_around_the_publish_leaves_each_operation_booked_once() {
    let settings = common::settings();
    let shop = shop(10).await;
    let pool = stocksvr_store::mysql_pool(&shop.db_url, 8, Duration::from_secs(10)).expect("pool");
    let redis = stocksvr_store::connect_redis(
        &stocksvr::settings::redis_target(&settings.redis),
        Duration::from_secs(5),
    )
    .await
    .expect("redis");
    let config = ServiceConfig::default();
    let lua = Arc::new(LuaExecutor::new(redis, config.op_ttl));
    let ids = SnowflakeGenerator::new((shop.merchant_id % 1024) as u16).expect("worker id");
    let service = ReservationService::new(pool.clone(), lua.clone(), ids, config);
    let fp = scenario();

    // The reservation side commits its outbox rows: the bucket's lazy init, Try, Confirm and
    // a partial Refund of one reservation, Try and Cancel of another.
    let request = |item: u64, quantity: u32| TryRequest {
        order_id: item,
        order_item_id: item,
        merchant_id: shop.merchant_id,
        dish_id: shop.dish_id,
        quantity,
        order_type: stocksvr_core::events::OrderType::Instant,
        processing_time: None,
    };
    let a = id_of(&service.try_reserve(&request(1, 3)).await.expect("try a"));
    done(service.confirm(a).await.expect("confirm a"));
    done(
        service
            .refund(a, Some("r1"), Some(1))
            .await
            .expect("refund a"),
    );
    let b = id_of(&service.try_reserve(&request(2, 2)).await.expect("try b"));
    done(service.cancel(b).await.expect("cancel b"));
    // The first Try found no bucket in Redis and initialised it through the WAL: that init
    // is a stock-change event and a ledger row like the others.
    let bucket = stocksvr_core::bucket::BucketKey::new(
        shop.merchant_id,
        shop.dish_id,
        stocksvr_test_support::zone::today(),
    )
    .stock_bucket_id();
    let operations = [
        stocksvr_reservation::operations::init_operation_id(&bucket, 1),
        try_operation_id(a),
        confirm_operation_id(a),
        refund_operation_id(a, Some("r1")),
        try_operation_id(b),
        cancel_operation_id(b),
    ];

    // Topics of this test alone (its namespace): the stock-change events for the
    // projector and the lifecycle events beside them (the relay publishes those too).
    let stock_topic = shop.env.topic(topics::STOCK_CHANGE);
    let lifecycle_topic = shop.env.topic(topics::INVENTORY_LIFECYCLE);
    let kafka = shop.env.kafka();
    let (stock_rows,): (i64,) =
        sqlx::query_as("SELECT COUNT(*) FROM inventory_outbox WHERE topic = ?")
            .bind(topics::STOCK_CHANGE)
            .fetch_one(&pool)
            .await
            .expect("count");
    assert_eq!(stock_rows, operations.len() as i64, "one per operation");
    // One row per reservation step carries both its events: every operation but the
    // bucket's INIT is a step, and no step wrote a lifecycle row of its own.
    let (paired, lifecycle_rows): (i64, i64) = sqlx::query_as(
        "SELECT CAST(SUM(body IS NOT NULL OR JSON_EXISTS(payload, '$.lifecycle')) AS SIGNED), \
                CAST(SUM(topic = ?) AS SIGNED) FROM inventory_outbox",
    )
    .bind(topics::INVENTORY_LIFECYCLE)
    .fetch_one(&pool)
    .await
    .expect("count");
    assert_eq!(
        (paired, lifecycle_rows),
        (operations.len() as i64 - 1, 0),
        "each step's row carries its lifecycle event"
    );
    let rows: i64 = outbox_statuses(&pool).await.values().sum();
    // The records those rows stand for.
    let events = rows + paired;
    assert_eq!(
        outbox_statuses(&pool).await,
        BTreeMap::from([(status::PENDING, rows)])
    );

    let codec = AvroCodec::new(
        &settings.registry,
        Arc::new(Catalog::for_deployment(&kafka).expect("catalog")),
    )
    .expect("codec");
    let relay = || {
        let producer =
            stocksvr_pipeline::kafka::producer(&kafka, "it-outbox-windows").expect("producer");
        OutboxRelay::new(
            pool.clone(),
            producer,
            codec.clone(),
            RelayConfig::default(),
        )
        .expect("relay")
        .in_namespace(kafka.namespace())
    };

    // Window 5: the relay takes the lead, reads every row and dies before publishing.
    fp.arm("relay.before_publish", Action::Crash);
    let died = relay().relay_once().await;
    assert!(matches!(&died, Err(e) if is_injected(e)), "{died:?}");
    fp.disarm_all();
    assert_eq!(
        outbox_statuses(&pool).await,
        BTreeMap::from([(status::PENDING, rows)]),
        "read without a per-row write"
    );
    assert_eq!(
        mark_and_unsent(&pool).await,
        (0, rows),
        "the mark did not move"
    );
    assert_eq!(records_on(&stock_topic) + records_on(&lifecycle_topic), 0);

    // Window 6: the next relay (once the dead leader's lease ran out) publishes every row
    // and dies after the broker's acknowledgement, before moving the mark over them.
    expire_leases(&pool).await;
    fp.arm("relay.after_publish", Action::Crash);
    let died = relay().relay_once().await;
    assert!(matches!(&died, Err(e) if is_injected(e)), "{died:?}");
    fp.disarm_all();
    assert_eq!(
        mark_and_unsent(&pool).await,
        (0, rows),
        "the mark did not move"
    );
    assert_eq!(
        (records_on(&stock_topic), records_on(&lifecycle_topic)),
        (stock_rows, paired),
        "both events of every row on Kafka, not marked"
    );
    assert_eq!(stock_rows + paired, events);

    // A third relay publishes them all again, same event ids, from the mark, and moves it
    // over them.
    expire_leases(&pool).await;
    let report = relay().relay_once().await.expect("relay");
    assert_eq!(
        (report.claimed, report.sent),
        (rows as usize, rows as usize)
    );
    let (top,): (u64,) = sqlx::query_as("SELECT MAX(id) FROM inventory_outbox")
        .fetch_one(&pool)
        .await
        .expect("max id");
    assert_eq!(mark_and_unsent(&pool).await, (top, 0));
    assert_eq!(records_on(&stock_topic), 2 * stock_rows, "each event twice");
    assert_eq!(
        records_on(&lifecycle_topic),
        2 * paired,
        "the lifecycle half of each row twice too"
    );
    assert_eq!(relay().relay_once().await.expect("relay").claimed, 0);
    drop(fp);

    // The projector consumes every copy: each event applies once, its copy is a duplicate.
    let tally = Arc::new(Tally {
        inner: Projector::new(pool.clone(), format!("{}.projector", kafka.group_prefix))
            .expect("projector"),
        answers: Mutex::new(Vec::new()),
    });
    let loop_config = loop_config(&kafka);
    assert_eq!(loop_config.topics, std::slice::from_ref(&stock_topic));
    let (stop, stopped) = watch::channel(false);
    let running = {
        let (codec, tally) = (codec.clone(), tally.clone());
        tokio::spawn(async move { consumer::run(&kafka, codec, loop_config, tally, stopped).await })
    };
    let projected = eventually(Duration::from_secs(90), || async {
        assert!(!running.is_finished(), "the projector loop stopped early");
        tally.answers().len() as i64 >= 2 * stock_rows
    })
    .await;
    assert!(
        projected,
        "not every copy projected in time: {:?}",
        tally.answers()
    );
    stop.send(true).expect("stop");
    tokio::time::timeout(Duration::from_secs(30), running)
        .await
        .expect("the loop stops")
        .expect("task")
        .expect("the loop ends cleanly");

    let answers = tally.answers();
    let applied = answers.iter().filter(|a| **a == Applied::Applied).count();
    let duplicate = answers.iter().filter(|a| **a == Applied::Duplicate).count();
    assert_eq!(
        (applied, duplicate),
        (operations.len(), operations.len()),
        "{answers:?}"
    );
    let ledger: Vec<(String, i64)> = sqlx::query_as(
        "SELECT operation_id, COUNT(*) FROM inventory_ledger GROUP BY operation_id ORDER BY operation_id",
    )
    .fetch_all(&pool)
    .await
    .expect("ledger");
    let mut expected: Vec<(String, i64)> = operations.iter().map(|op| (op.clone(), 1)).collect();
    expected.sort();
    assert_eq!(ledger, expected, "one ledger row per operation");

    // And the snapshot converged on Redis.
    let keys = BucketKey::new(
        shop.merchant_id,
        shop.dish_id,
        stocksvr_test_support::zone::today(),
    );
    let redis = lua.read_bucket(&keys).await.expect("read").expect("bucket");
    assert_eq!(
        (redis.total, redis.available, redis.reserved, redis.sold),
        (10, 8, 0, 2)
    );
    let snapshot: (i64, i64, i64, i64) = sqlx::query_as(
        "SELECT total_stock, available_stock, reserved_stock, sold_stock FROM dish_stock_snapshot",
    )
    .fetch_one(&pool)
    .await
    .expect("snapshot");
    assert_eq!(snapshot, (10, 8, 0, 2));
}
