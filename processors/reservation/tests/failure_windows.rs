//! A crash at every failure window (docs/design.md, failure windows), for every step it applies to, ends in the
//! right terminal status with no double effect once the recovery path runs.
//!
//! A crash is a failpoint (`stocksvr-failpoint`, live in test builds only) that abandons the
//! call at its line: MySQL and Redis are left exactly as a process killed there leaves them.
//! Each case then checks the state the crash left, lets the recovery path run, and checks
//! the invariants: the terminal status, Redis numbers that conserve (available + reserved +
//! sold = total) and moved once, the fence phase, exactly one stock-change outbox row (and
//! one lifecycle row) per operation id, and that the worker and a repeated request change
//! nothing afterwards. Steps: Try (reserved and rejected), Confirm, Cancel, Refund and a
//! partial Refund.
//!
//! | §10.2 window | where | tests |
//! |---|---|---|
//! | 1. reservation insert fails: no row, the order service retries | `try.before_insert` | `window_1_a_try_that_died_before_its_insert_is_retried_and_reserves_once` |
//! | 2. inserted, Redis not run: PREPARING, the worker runs Redis | `try.before_redis` | `window_2_a_try_left_preparing_is_finished_by_the_worker`; also `service.rs` `recovery_resumes_each_interrupted_step_once` (row A) |
//! | 3. Redis ran, the client timed out: retry with the same operation id | `<step>.reply_lost` | `window_3_a_lost_redis_reply_is_answered_by_the_op_record` (in-call retry, the order service's retry, the worker; every step) |
//! | 4. Redis ran, the MySQL commit failed: the worker hits the op record | `<step>.before_commit` | `window_4_redis_applied_mysql_not_committed_is_completed_once` (every step); `a_worker_that_dies_mid_recovery_is_followed_by_one_that_finishes_once`; also `service.rs` `lua_succeeded_mysql_not_updated_resumes_without_reserving_twice` |
//! | 5. MySQL committed, Kafka not sent: outbox PENDING, the relay retries | relay `relay.before_publish` | `processors/stocksvr/tests/outbox_windows.rs` `a_relay_that_dies_around_the_publish_leaves_each_operation_booked_once`; also `outbox-relay/tests/relay.rs` `a_sending_row_with_an_expired_lease_is_published_by_the_next_relay` and `a_row_that_does_not_fit_its_schema_is_retried_and_does_not_block_others` |
//! | 6. Kafka sent, outbox not marked: duplicate on Kafka, the inbox dedupes | relay `relay.after_publish` | the same `outbox_windows.rs` test (one ledger row per operation); also `projector/tests/handler.rs` `duplicates_in_one_batch_and_across_batches_change_nothing`, `projector/tests/end_to_end.rs`, `stocksvr/tests/projector_kill.rs` |
//! | 7. the process exits during Confirm/Cancel/Refund: the worker continues | `<step>.before_redis`, `<step>.before_commit` | `window_7_confirm_cancel_refund_interrupted_are_continued_by_the_worker` and the non-Try rows of windows 3 and 4; also `service.rs` `recovery_resumes_each_interrupted_step_once` (row C) |
//! | 4 + OrderCreatedFailed: the Try's script ran, its commit did not, its order failed (the row goes PREPARING → CANCELING) | `try.before_commit`, `cancel.before_commit` | `a_try_applied_in_redis_then_cancelled_from_preparing_books_the_try_and_the_cancel` (the Cancel books the Try's stock-change too) |
//! | a Try giving up its row (bucket lost) died between its fence and removing the row | the fence written by hand | `a_row_left_by_a_try_that_gave_it_up_is_removed_not_resumed_for_ever` |
//! | a Try refused for a closed day, its bucket then built by a racing lazy init | the init and the late Try by hand | `a_try_refused_for_a_closed_day_is_fenced_against_its_late_copies` |

mod common;

use common::{make_due, series, Fixture};
use stocksvr_core::events::topics;
use stocksvr_core::reservation::{
    cancel_operation_id, confirm_operation_id, refund_operation_id, try_operation_id,
};
use stocksvr_failpoint::{is_injected, scenario, Action};
use stocksvr_reservation::recovery::{recover_once, RecoveryConfig, RecoveryReport};
use stocksvr_reservation::{IntentOutcome, ServiceConfig, ServiceError, TryReply};
use stocksvr_store::outbox::LIFECYCLE_EVENT_TYPE;
use stocksvr_store::reservations as repo;

const TOTAL: i64 = 10;
const QTY: u32 = 3;
/// The order item every case reserves (each case has a merchant of its own).
const ITEM: u64 = 2;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// A Try that reserves.
    Try,
    /// A Try for more than the bucket holds: Redis answers INSUFFICIENT.
    TryRejected,
    Confirm,
    Cancel,
    /// OrderCanceled after Confirm: everything held goes back.
    Refund,
    /// RefundRequested for one of the three units after Confirm.
    PartialRefund,
}

const ALL_STEPS: [Step; 6] = [
    Step::Try,
    Step::TryRejected,
    Step::Confirm,
    Step::Cancel,
    Step::Refund,
    Step::PartialRefund,
];

const PARTIAL_REFUND_ID: &str = "r1";

/// How the work a crash left undone gets finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Recovery {
    /// The recovery worker's round, once the row is due.
    Worker,
    /// The caller repeats its request (the order service retrying after a timeout).
    Retry,
}

impl Step {
    fn prefix(self) -> &'static str {
        match self {
            Step::Try | Step::TryRejected => "try",
            Step::Confirm => "confirm",
            Step::Cancel => "cancel",
            Step::Refund | Step::PartialRefund => "refund",
        }
    }

    /// The failpoint `place` of this step (names are static in the service; leaking the
    /// few strings of a test run is harmless).
    fn point(self, place: &str) -> &'static str {
        Box::leak(format!("{}.{place}", self.prefix()).into_boxed_str())
    }

    fn quantity(self) -> u32 {
        if self == Step::TryRejected {
            TOTAL as u32 + 1
        } else {
            QTY
        }
    }

    /// The intermediate status a crash in this step leaves.
    fn intermediate(self) -> &'static str {
        match self {
            Step::Try | Step::TryRejected => "PREPARING",
            Step::Confirm => "CONFIRMING",
            Step::Cancel => "CANCELING",
            Step::Refund | Step::PartialRefund => "REFUNDING",
        }
    }

    fn operation_id(self, id: u64) -> String {
        match self {
            Step::Try | Step::TryRejected => try_operation_id(id),
            Step::Confirm => confirm_operation_id(id),
            Step::Cancel => cancel_operation_id(id),
            Step::Refund => refund_operation_id(id, None),
            Step::PartialRefund => refund_operation_id(id, Some(PARTIAL_REFUND_ID)),
        }
    }

    /// Where the reservation ends, once and only once.
    fn terminal(self, id: u64) -> Terminal {
        let t = try_operation_id(id);
        let c = confirm_operation_id(id);
        let (status, numbers, phase, refunded, stock_ops, lifecycle): (_, _, _, _, Vec<_>, &[_]) =
            match self {
                Step::Try => (
                    "RESERVED",
                    (TOTAL, 7, 3, 0),
                    Some("RESERVED"),
                    0,
                    vec![t],
                    &["InventoryReserved"],
                ),
                Step::TryRejected => (
                    "REJECTED",
                    (TOTAL, TOTAL, 0, 0),
                    None,
                    0,
                    vec![],
                    &["InventoryRejected"],
                ),
                Step::Confirm => (
                    "CONFIRMED",
                    (TOTAL, 7, 0, 3),
                    Some("CONFIRMED"),
                    0,
                    vec![t, c],
                    &["InventoryReserved", "InventoryConfirmed"],
                ),
                Step::Cancel => (
                    "CANCELED",
                    (TOTAL, TOTAL, 0, 0),
                    Some("CANCELED"),
                    0,
                    vec![t, cancel_operation_id(id)],
                    &["InventoryReserved", "InventoryCanceled"],
                ),
                Step::Refund => (
                    "REFUNDED",
                    (TOTAL, TOTAL, 0, 0),
                    Some("REFUNDED"),
                    3,
                    vec![t, c, refund_operation_id(id, None)],
                    &[
                        "InventoryReserved",
                        "InventoryConfirmed",
                        "InventoryRefunded",
                    ],
                ),
                Step::PartialRefund => (
                    "CONFIRMED",
                    (TOTAL, 8, 0, 2),
                    Some("CONFIRMED"),
                    1,
                    vec![t, c, refund_operation_id(id, Some(PARTIAL_REFUND_ID))],
                    &[
                        "InventoryReserved",
                        "InventoryConfirmed",
                        "InventoryRefunded",
                    ],
                ),
            };
        Terminal {
            status: status.to_string(),
            numbers,
            phase: phase.map(str::to_string),
            refunded: (refunded, i64::from(refunded)),
            stock_ops,
            lifecycle: lifecycle.iter().map(|s| s.to_string()).collect(),
        }
    }
}

/// What a reservation and its bucket look like at rest.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Terminal {
    status: String,
    numbers: (i64, i64, i64, i64),
    /// Fence phase; None when no fence exists (a rejected Try writes none).
    phase: Option<String>,
    /// Units refunded: by the reservation row, by the fence.
    refunded: (u32, i64),
    /// Operation ids of the reservation's stock-change outbox rows, in commit order.
    stock_ops: Vec<String>,
    /// Its lifecycle events (a step's own row carries one beside its stock change), in
    /// commit order.
    lifecycle: Vec<String>,
}

/// What the state looks like right now, in the shape of [`Terminal`].
async fn observe(f: &Fixture, id: u64) -> Terminal {
    let status = f.status(id).await;
    let fence = f.lua.read_fence(&f.keys(), id).await.expect("read fence");
    let row = repo::find(&f.pool, id).await.expect("find").expect("row");
    let stock_ops: Vec<(String,)> = stock_change_rows(f, id)
        .await
        .into_iter()
        .map(|row| (data_str(&row, "operation_id"),))
        .collect();
    let lifecycle: Vec<(String,)> = sqlx::query_as(&format!(
        "SELECT {LIFECYCLE_EVENT_TYPE} AS t FROM inventory_outbox o \
         WHERE o.aggregate_id = ? HAVING t IS NOT NULL ORDER BY o.id"
    ))
    .bind(topics::INVENTORY_LIFECYCLE)
    .bind(id)
    .fetch_all(&f.pool)
    .await
    .expect("lifecycle rows");
    let numbers = f.numbers().await;
    let (total, available, reserved, sold) = numbers;
    assert_eq!(available + reserved + sold, total, "Redis conserves stock");
    Terminal {
        status,
        numbers,
        phase: fence.as_ref().map(|f| f.fence.phase.name().to_string()),
        refunded: (
            row.refunded_quantity,
            fence.as_ref().map_or(0, |f| i64::from(f.fence.refunded)),
        ),
        stock_ops: stock_ops.into_iter().map(|(op,)| op).collect(),
        lifecycle: lifecycle.into_iter().map(|(t,)| t).collect(),
    }
}

/// A fixture whose bucket exists in Redis, as after the daily initialisation (the Try's
/// lazy initialisation is the lead's to test; here the numbers must be readable at every
/// point of the crash). One in-call retry of an unknown outcome keeps the cases quick.
async fn fixture() -> Fixture {
    let config = ServiceConfig {
        unknown_retries: 1,
        ..ServiceConfig::default()
    };
    let f = Fixture::with_config(TOTAL, config).await;
    f.init_today(TOTAL).await;
    f
}

/// Brings a new reservation to where `step` starts, without failpoints armed. Returns its
/// id (None for the Try steps: their reservation does not exist yet).
async fn prepare(f: &Fixture, step: Step) -> Option<u64> {
    match step {
        Step::Try | Step::TryRejected => None,
        Step::Confirm | Step::Cancel => Some(f.reserve(ITEM, QTY).await),
        Step::Refund | Step::PartialRefund => {
            let id = f.reserve(ITEM, QTY).await;
            let confirmed = f.service.confirm(id).await.expect("confirm");
            assert!(
                matches!(confirmed, IntentOutcome::Done { .. }),
                "{confirmed:?}"
            );
            Some(id)
        }
    }
}

/// What one run of a step answered.
#[derive(Debug)]
enum Reply {
    Try(Box<TryReply>),
    Intent(IntentOutcome),
}

impl Reply {
    /// True when the reply says the work had been done before (a repeat).
    fn repeated(&self) -> bool {
        match self {
            Reply::Try(r) => !r.created,
            Reply::Intent(o) => matches!(o, IntentOutcome::Done { already: true, .. }),
        }
    }
}

/// Runs `step` on `id` (the Try creates its reservation) as its caller would.
async fn run(f: &Fixture, step: Step, id: Option<u64>) -> Result<Reply, ServiceError> {
    let id = || id.expect("the reservation exists for this step");
    Ok(match step {
        Step::Try | Step::TryRejected => Reply::Try(Box::new(
            f.service
                .try_reserve(&f.request(ITEM, step.quantity()))
                .await?,
        )),
        Step::Confirm => Reply::Intent(f.service.confirm(id()).await?),
        Step::Cancel => Reply::Intent(f.service.cancel(id()).await?),
        Step::Refund => Reply::Intent(f.service.refund(id(), None, None).await?),
        Step::PartialRefund => Reply::Intent(
            f.service
                .refund(id(), Some(PARTIAL_REFUND_ID), Some(1))
                .await?,
        ),
    })
}

/// The reservation of this fixture's order item (the Try steps learn their id this way).
async fn reservation_of_item(f: &Fixture) -> Option<u64> {
    repo::find_by_item(&f.pool, ITEM, f.dish_id)
        .await
        .expect("find by item")
        .map(|r| r.id)
}

async fn worker_round(f: &Fixture) -> RecoveryReport {
    make_due(&f.pool).await;
    recover_once(&f.service, &RecoveryConfig::default())
        .await
        .expect("recovery round")
}

/// Row status and version, Redis numbers and the number of outbox rows: anything a second
/// effect would move.
async fn fingerprint(f: &Fixture, id: u64) -> (String, u32, (i64, i64, i64, i64), i64) {
    let row = repo::find(&f.pool, id).await.expect("find").expect("row");
    let (outbox,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM inventory_outbox")
        .fetch_one(&f.pool)
        .await
        .expect("outbox count");
    (f.status(id).await, row.version, f.numbers().await, outbox)
}

/// After the terminal state: the worker finds nothing to do, and the caller repeating its
/// request gets the first result without any effect.
async fn assert_settled(f: &Fixture, step: Step, id: u64, case: &str) {
    let expected = step.terminal(id);
    assert_eq!(observe(f, id).await, expected, "{case}: terminal state");
    assert!(
        !repo::find(&f.pool, id)
            .await
            .expect("find")
            .expect("row")
            .status()
            .expect("status")
            .is_intermediate(),
        "{case}"
    );
    if matches!(step, Step::Refund | Step::PartialRefund) {
        let key = if step == Step::Refund {
            ""
        } else {
            PARTIAL_REFUND_ID
        };
        let refund = stocksvr_store::refunds::find_refund(&f.pool, id, key)
            .await
            .expect("refund row")
            .expect("refund recorded");
        assert_eq!(
            refund.status,
            stocksvr_core::reservation::RefundStatus::Done.code() as i8,
            "{case}: refund row done"
        );
    }
    let before = fingerprint(f, id).await;
    let again = worker_round(f).await;
    assert_eq!(
        again,
        RecoveryReport::default(),
        "{case}: nothing left to recover"
    );
    let repeat = run(f, step, Some(id)).await.expect("repeat answers");
    assert!(
        repeat.repeated(),
        "{case}: the repeat is told it repeats: {repeat:?}"
    );
    assert_eq!(fingerprint(f, id).await, before, "{case}: no second effect");
}

/// Crashes `step` at `place`, checks what the crash left, then recovers with `recovery`
/// and checks the terminal state.
async fn crash_and_recover(step: Step, place: &str, recovery: Recovery) {
    let case = format!("{step:?} crashed at {place}, recovered by {recovery:?}");
    let f = fixture().await;
    let fp = scenario();
    let id = prepare(&f, step).await;
    let before = match id {
        Some(id) => observe(&f, id).await,
        None => Terminal {
            status: String::new(),
            numbers: (TOTAL, TOTAL, 0, 0),
            phase: None,
            refunded: (0, 0),
            stock_ops: vec![],
            lifecycle: vec![],
        },
    };
    let point = step.point(place);
    fp.arm(point, Action::Crash);
    let crashed = run(&f, step, id).await;
    assert!(fp.fired(point) > 0, "{case}: the failpoint was reached");
    match (&crashed, place) {
        // Every reply lost, also the in-call retry's: the caller cannot tell what happened.
        (Err(ServiceError::OutcomeUnknown { .. }), "reply_lost") => {}
        (Err(e), _) if is_injected(e) => {}
        other => panic!("{case}: expected the crash, got {other:?}"),
    }
    fp.disarm_all();
    let id = match id {
        Some(id) => id,
        None => reservation_of_item(&f)
            .await
            .expect("the Try inserted its row"),
    };

    // What the crash left: the intermediate status; Redis moved only if its step ran, and
    // then by exactly its step (the op record is there); no outbox row of the step yet.
    let terminal = step.terminal(id);
    let redis_ran = place != "before_redis";
    let left = observe(&f, id).await;
    assert_eq!(left.status, step.intermediate(), "{case}");
    let (before_numbers, before_phase) = (before.numbers, before.phase);
    assert_eq!(
        left.numbers,
        if redis_ran {
            terminal.numbers
        } else {
            before_numbers
        },
        "{case}: Redis numbers after the crash"
    );
    assert_eq!(
        left.phase,
        if redis_ran {
            terminal.phase
        } else {
            before_phase
        },
        "{case}: fence after the crash"
    );
    assert_eq!(
        (left.stock_ops, left.lifecycle),
        (before.stock_ops, before.lifecycle),
        "{case}: the step committed nothing to MySQL"
    );
    let row = repo::find(&f.pool, id).await.expect("find").expect("row");
    assert_eq!(
        row.current_operation_id,
        step.operation_id(id),
        "{case}: the row keeps the operation id to resume with"
    );

    match recovery {
        Recovery::Worker => {
            let report = worker_round(&f).await;
            assert_eq!(
                (report.resumed, report.failed, report.dead),
                (1, 0, 0),
                "{case}"
            );
        }
        Recovery::Retry => {
            let reply = run(&f, step, Some(id)).await.expect("the retry answers");
            if let Reply::Try(r) = &reply {
                assert!(!r.created, "{case}: the retry finds the first Try");
            }
        }
    }
    assert_settled(&f, step, id, &case).await;
    drop(fp);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn window_1_a_try_that_died_before_its_insert_is_retried_and_reserves_once() {
    let f = fixture().await;
    let fp = scenario();
    fp.arm("try.before_insert", Action::Crash);
    let crashed = f.service.try_reserve(&f.request(ITEM, QTY)).await;
    assert!(matches!(&crashed, Err(e) if is_injected(e)), "{crashed:?}");
    assert_eq!(fp.fired("try.before_insert"), 1);
    assert_eq!(
        reservation_of_item(&f).await,
        None,
        "no row, nothing to recover"
    );
    assert_eq!(f.numbers().await, (TOTAL, TOTAL, 0, 0));
    assert_eq!(worker_round(&f).await, RecoveryReport::default());
    fp.disarm_all();

    // The order service retries, impatiently and more than once: one reservation results.
    let retries: Vec<_> = (0..8)
        .map(|_| {
            let (service, req) = (f.service.clone(), f.request(ITEM, QTY));
            tokio::spawn(async move { service.try_reserve(&req).await })
        })
        .collect();
    let mut replies = Vec::new();
    for retry in retries {
        replies.push(retry.await.expect("task"));
    }
    let created = replies
        .iter()
        .filter(|r| matches!(r, Ok(r) if r.created))
        .count();
    assert_eq!(
        created, 1,
        "exactly one retry creates the reservation: {replies:?}"
    );
    for reply in &replies {
        let reply = reply.as_ref().expect("every retry answers");
        assert_eq!(reply.reservation.status_name(), "RESERVED");
    }
    let id = reservation_of_item(&f).await.expect("reserved");
    assert_settled(&f, Step::Try, id, "Try crashed before its insert").await;
}

#[tokio::test]
async fn window_2_a_try_left_preparing_is_finished_by_the_worker() {
    for step in [Step::Try, Step::TryRejected] {
        crash_and_recover(step, "before_redis", Recovery::Worker).await;
    }
}

#[tokio::test]
async fn window_3_a_lost_redis_reply_is_answered_by_the_op_record() {
    for step in ALL_STEPS {
        // Only the first reply is lost: the in-call retry with the same operation id gets
        // the first result from the op record and the caller never notices.
        let case = format!("{step:?}, first reply lost");
        let f = fixture().await;
        let fp = scenario();
        let id = prepare(&f, step).await;
        let point = step.point("reply_lost");
        fp.arm(point, Action::CrashTimes(1));
        let reply = run(&f, step, id)
            .await
            .expect("answered despite the timeout");
        assert_eq!(fp.fired(point), 1, "{case}");
        assert!(!reply.repeated(), "{case}: {reply:?}");
        let id = reservation_of_item(&f).await.expect("row");
        assert_settled(&f, step, id, &case).await;
        drop(fp);

        // Every reply lost: the caller gets "unknown", then its retry, or the worker,
        // replays the op record.
        crash_and_recover(step, "reply_lost", Recovery::Retry).await;
        crash_and_recover(step, "reply_lost", Recovery::Worker).await;
    }
}

#[tokio::test]
async fn window_4_redis_applied_mysql_not_committed_is_completed_once() {
    for step in ALL_STEPS {
        crash_and_recover(step, "before_commit", Recovery::Worker).await;
    }
}

#[tokio::test]
async fn window_7_confirm_cancel_refund_interrupted_are_continued_by_the_worker() {
    for step in [
        Step::Confirm,
        Step::Cancel,
        Step::Refund,
        Step::PartialRefund,
    ] {
        crash_and_recover(step, "before_redis", Recovery::Worker).await;
        crash_and_recover(step, "before_commit", Recovery::Worker).await;
    }
}

#[tokio::test]
async fn a_worker_that_dies_mid_recovery_is_followed_by_one_that_finishes_once() {
    for step in [Step::Try, Step::Confirm, Step::PartialRefund] {
        let case = format!("{step:?}: the step and its first recovery crash before the commit");
        let f = fixture().await;
        let fp = scenario();
        let id = prepare(&f, step).await;
        let point = step.point("before_commit");
        fp.arm(point, Action::Crash);
        assert!(run(&f, step, id).await.is_err(), "{case}");
        let id = reservation_of_item(&f).await.expect("row");
        // The worker resumes, replays the op record and dies at the same line.
        make_due(&f.pool).await;
        let died = recover_once(&f.service, &RecoveryConfig::default()).await;
        assert!(
            matches!(&died, Err(e) if is_injected(e)),
            "{case}: {died:?}"
        );
        assert_eq!(fp.fired(point), 2, "{case}");
        assert_eq!(f.status(id).await, step.intermediate(), "{case}");
        assert_eq!(
            f.numbers().await,
            step.terminal(id).numbers,
            "{case}: the replay moved nothing"
        );
        fp.disarm_all();
        // The next worker (after the dead one's claim lease) finishes.
        let report = worker_round(&f).await;
        assert_eq!((report.resumed, report.failed), (1, 0), "{case}");
        assert_settled(&f, step, id, &case).await;
    }
}

/// Count and sum of `stocksvr_try_group_size{stage="lua"}` in a /metrics text: the script
/// calls of grouped Trys, and the Trys in them.
fn lua_stage(metrics: &str) -> (f64, f64) {
    let lua = "stage=\"lua\"";
    (
        series(metrics, "stocksvr_try_group_size_count", lua),
        series(metrics, "stocksvr_try_group_size_sum", lua),
    )
}

/// Group commit: forty concurrent Trys share one group writer (one group in flight, so they
/// queue and go out together), and ten of them crash at a window inside their group; with
/// `try_lua_group` their script calls are grouped too. Every
/// row ends as the single-row path leaves it: the crashed ones in PREPARING with their
/// operation id, finished once by the worker; the others RESERVED by the group's commit.
/// Afterwards each reservation has exactly one stock-change and one lifecycle row, and
/// Redis holds exactly the forty units.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trys_in_a_group_interrupted_at_each_window_are_each_finished_once() {
    const TRYS: u64 = 40;
    const CRASHES: usize = 10;
    // Each window with the Trys' script calls one by one, and in one call per bucket.
    let runs = ["before_redis", "reply_lost", "before_commit"]
        .into_iter()
        .flat_map(|place| [(place, false), (place, true)]);
    for (place, lua_group) in runs {
        let config = ServiceConfig {
            unknown_retries: 0,
            try_group_max: 64,
            try_groups_in_flight: 1,
            try_lua_group: lua_group,
            ..ServiceConfig::default()
        };
        let f = std::sync::Arc::new(Fixture::with_config(100, config).await);
        f.init_today(100).await;
        let fp = scenario();
        let point = Step::Try.point(place);
        fp.arm(point, Action::CrashTimes(CRASHES));
        let metrics = stocksvr_pipeline::telemetry::init_metrics();
        let (calls_before, items_before) = lua_stage(&metrics.render());
        let trys: Vec<_> = (1..=TRYS)
            .map(|item| {
                let f = f.clone();
                tokio::spawn(async move { f.service.try_reserve(&f.request(item, 1)).await })
            })
            .collect();
        let mut failed = 0;
        for t in trys {
            match t.await.expect("task") {
                Ok(reply) => assert_eq!(
                    reply.reservation.status_name(),
                    "RESERVED",
                    "{place} (lua_group {lua_group})"
                ),
                Err(ServiceError::OutcomeUnknown { .. }) if place == "reply_lost" => failed += 1,
                Err(e) if is_injected(&e) => failed += 1,
                Err(e) => panic!("{place} (lua_group {lua_group}): {e:?}"),
            }
        }
        assert_eq!(fp.fired(point), CRASHES, "{place} (lua_group {lua_group})");
        // Only this test groups script calls: what the Lua stage counted is these Trys'.
        let (calls, items) = lua_stage(&metrics.render());
        let (calls, items) = (calls - calls_before, items - items_before);
        if lua_group {
            let reached = if place == "before_redis" {
                TRYS as usize - CRASHES
            } else {
                TRYS as usize
            };
            assert_eq!(
                items, reached as f64,
                "{place}: every Try that reached Redis went through a group call"
            );
            assert!(
                calls < items,
                "{place}: {items} Trys in {calls} script calls, none shared"
            );
        } else {
            assert_eq!(
                (calls, items),
                (0.0, 0.0),
                "{place}: grouped while try_lua_group is off"
            );
        }
        assert_eq!(
            failed, CRASHES,
            "{place} (lua_group {lua_group}): each crash fails its own Try only"
        );
        fp.disarm_all();
        let report = worker_round(&f).await;
        assert_eq!(
            (report.resumed, report.failed, report.dead),
            (CRASHES, 0, 0),
            "{place} (lua_group {lua_group}): the worker finishes exactly the crashed rows"
        );
        let (total, available, reserved, sold) = f.numbers().await;
        assert_eq!(
            (total, available, reserved, sold),
            (100, 100 - TRYS as i64, TRYS as i64, 0),
            "{place} (lua_group {lua_group}): each Try held its unit once"
        );
        let per_row: Vec<(String, i64, i64, i64)> = sqlx::query_as(&format!(
            "SELECT CAST(r.status AS CHAR), \
             (SELECT COUNT(*) FROM inventory_outbox o WHERE o.aggregate_id = r.id), \
             (SELECT COUNT(*) FROM inventory_outbox o WHERE o.aggregate_id = r.id AND o.topic = ?), \
             (SELECT COUNT(*) FROM inventory_outbox o WHERE o.aggregate_id = r.id \
               AND {LIFECYCLE_EVENT_TYPE} IS NOT NULL) \
             FROM inventory_reservation r WHERE r.merchant_id = ?"
        ))
        .bind(topics::STOCK_CHANGE)
        .bind(topics::INVENTORY_LIFECYCLE)
        .bind(f.merchant_id)
        .fetch_all(&f.pool)
        .await
        .expect("rows");
        assert_eq!(
            per_row.len(),
            TRYS as usize,
            "{place} (lua_group {lua_group})"
        );
        let reserved_code = stocksvr_core::reservation::ReservationStatus::Reserved
            .code()
            .to_string();
        for (status, rows, stock, lifecycle) in &per_row {
            assert_eq!(
                (status, *rows, *stock, *lifecycle),
                (&reserved_code, 1, 1, 1),
                "{place} (lua_group {lua_group}): one RESERVED row with one outbox row, \
                 carrying one event of each kind"
            );
        }
        drop(fp);
    }
}

/// The stock-change outbox rows of reservation `id`: (operation id, available, reserved and
/// sold deltas, Redis version), in commit order.
async fn stock_changes(f: &Fixture, id: u64) -> Vec<(String, i64, i64, i64, i64)> {
    let n = |row: &stocksvr_test_support::OutboxRow, field: &str| {
        row.json["data"][field].as_i64().unwrap_or_default()
    };
    stock_change_rows(f, id)
        .await
        .iter()
        .map(|row| {
            (
                data_str(row, "operation_id"),
                n(row, "available_delta"),
                n(row, "reserved_delta"),
                n(row, "sold_delta"),
                n(row, "redis_version"),
            )
        })
        .collect()
}

/// The stock-change outbox rows of reservation `id`, in commit order.
async fn stock_change_rows(f: &Fixture, id: u64) -> Vec<stocksvr_test_support::OutboxRow> {
    stocksvr_test_support::outbox_rows(&f.pool)
        .await
        .into_iter()
        .filter(|row| row.aggregate_id == id && row.topic == topics::STOCK_CHANGE)
        .collect()
}

/// A string member of a stock-change row's data ("" when absent).
fn data_str(row: &stocksvr_test_support::OutboxRow, field: &str) -> String {
    row.json["data"][field]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// A Try whose script ran but whose RESERVED commit never happened (a crash, or a Try still
/// in flight) is cancelled by its order's OrderCreatedFailed while the row is PREPARING. The
/// Cancel releases what the Try holds in Redis, so the ledger must book the Try as well as the
/// Cancel: the Try's own stock-change (its deltas and the version its script gave, read from
/// its op record) goes out with the Cancel's, before it. Without it the ledger held a CANCEL
/// of 3 units never reserved (a chaos run found one: reserved −3 with no TRY row).
/// Also when the Cancel itself dies before its commit and the worker finishes it.
#[tokio::test]
async fn a_try_applied_in_redis_then_cancelled_from_preparing_books_the_try_and_the_cancel() {
    for cancel_crashes in [false, true] {
        let case = format!("cancel crashes before its commit: {cancel_crashes}");
        let f = fixture().await;
        let fp = scenario();
        fp.arm("try.before_commit", Action::Crash);
        let crashed = f.service.try_reserve(&f.request(ITEM, QTY)).await;
        assert!(matches!(&crashed, Err(e) if is_injected(e)), "{crashed:?}");
        fp.disarm_all();
        let id = reservation_of_item(&f)
            .await
            .expect("the Try inserted its row");
        assert_eq!(f.status(id).await, "PREPARING", "{case}");
        assert_eq!(
            f.numbers().await,
            (TOTAL, 7, 3, 0),
            "{case}: the Try holds 3"
        );
        let try_version = i64::try_from(
            f.lua
                .read_bucket(&f.keys())
                .await
                .expect("read")
                .expect("bucket")
                .version,
        )
        .expect("version");

        if cancel_crashes {
            fp.arm("cancel.before_commit", Action::Crash);
        }
        let order_id = f.request(ITEM, QTY).order_id;
        let outcomes = f
            .service
            .fail_order(
                order_id,
                &format!("evt_failed_{order_id}"),
                Some("PAYMENT_FAILED"),
            )
            .await
            .expect("the fence and the decision commit");
        assert_eq!(outcomes.len(), 1, "{case}");
        if cancel_crashes {
            assert!(
                matches!(&outcomes[0].1, Err(e) if is_injected(e)),
                "{case}: {outcomes:?}"
            );
            fp.disarm_all();
            assert_eq!(f.status(id).await, "CANCELING", "{case}");
            let report = worker_round(&f).await;
            assert_eq!((report.resumed, report.failed), (1, 0), "{case}");
        } else {
            assert!(
                matches!(
                    &outcomes[0].1,
                    Ok(IntentOutcome::Done { already: false, .. })
                ),
                "{case}: {outcomes:?}"
            );
        }

        assert_eq!(f.status(id).await, "CANCELED", "{case}");
        assert_eq!(f.numbers().await, (TOTAL, TOTAL, 0, 0), "{case}");
        let q = i64::from(QTY);
        assert_eq!(
            stock_changes(&f, id).await,
            vec![
                (try_operation_id(id), -q, q, 0, try_version),
                (cancel_operation_id(id), q, -q, 0, try_version + 1),
            ],
            "{case}: the ledger gets the Try and the Cancel, each once"
        );
        let before = fingerprint(&f, id).await;
        assert_eq!(worker_round(&f).await, RecoveryReport::default(), "{case}");
        let again = f.service.cancel(id).await.expect("a repeat answers");
        assert!(
            matches!(again, IntentOutcome::Done { already: true, .. }),
            "{case}: {again:?}"
        );
        assert_eq!(
            fingerprint(&f, id).await,
            before,
            "{case}: no second effect"
        );
        drop(fp);
    }
}

/// A Try that found its bucket lost fences its reservation (the fence-only Cancel) and then
/// removes its PREPARING row; when it stops in between (a crash, MySQL gone), the row is left
/// PREPARING under a CANCELED fence that no Cancel in MySQL owns. The worker's resume is
/// fenced and removes the row then, instead of yielding to a Cancel that never comes (the row
/// stayed PREPARING for good, and its order's Confirm waited on it); the item's retry starts
/// afresh.
#[tokio::test]
async fn a_row_left_by_a_try_that_gave_it_up_is_removed_not_resumed_for_ever() {
    // Nothing is armed here, but the failpoints are process-wide: without the scenario's
    // lock this test's Trys met another test's armed `try.before_commit` (seen in CI).
    let _exclusive = scenario();
    let f = fixture().await;
    let id = 121_000_000_000_000_000 + common::seed() % 1_000_000;
    f.preparing(id, ITEM, QTY).await;
    let fenced = f
        .lua
        .step(
            &f.keys(),
            id,
            &cancel_operation_id(id),
            stocksvr_store::lua::Step::FenceTry { quantity: QTY },
        )
        .await
        .expect("fence");
    assert!(fenced.empty_rollback, "{fenced:?}");

    let report = worker_round(&f).await;
    assert_eq!((report.resumed, report.failed), (0, 1), "{report:?}");
    assert!(
        repo::find(&f.pool, id).await.expect("find").is_none(),
        "the row is removed"
    );
    assert_eq!(f.numbers().await, (TOTAL, TOTAL, 0, 0), "nothing held");
    assert_eq!(worker_round(&f).await, RecoveryReport::default());
    let id2 = f.reserve(ITEM, QTY).await;
    assert_ne!(id2, id, "the retry starts afresh");
    assert_eq!(f.numbers().await, (TOTAL, TOTAL - 3, 3, 0));
}

/// A Try refused because its day closed before its bucket reached Redis fences its
/// reservation before it commits REJECTED: a lazy init racing the close may still build the
/// bucket, and a late copy of the Try (a repeat on another instance) must not reserve under a
/// REJECTED row that nothing would ever cancel.
#[tokio::test]
async fn a_try_refused_for_a_closed_day_is_fenced_against_its_late_copies() {
    // Nothing is armed here; the lock keeps other tests' armed failpoints away (see above).
    let _exclusive = scenario();
    let f = Fixture::with_config(
        TOTAL,
        ServiceConfig {
            unknown_retries: 1,
            ..ServiceConfig::default()
        },
    )
    .await;
    let bucket = f.keys().stock_bucket_id();
    sqlx::query("UPDATE dish_stock_baseline SET bucket_status = ? WHERE stock_bucket_id = ?")
        .bind(stocksvr_core::bucket::BucketState::Closed.code())
        .bind(&bucket)
        .execute(&f.pool)
        .await
        .expect("close the day");
    let id = 122_000_000_000_000_000 + common::seed() % 1_000_000;
    f.preparing(id, ITEM, QTY).await;
    let report = worker_round(&f).await;
    assert_eq!((report.resumed, report.failed), (1, 0), "{report:?}");
    assert_eq!(f.status(id).await, "REJECTED");
    let fence = f.lua.read_fence(&f.keys(), id).await.expect("read fence");
    assert_eq!(
        fence.map(|f| f.fence.phase.name()),
        Some("CANCELED"),
        "fenced before the refusal"
    );

    // The lazy init that raced the close builds the bucket; a late copy of the Try arrives.
    f.lua
        .init_bucket(&f.keys(), &format!("init_{bucket}_v1"), TOTAL, 1)
        .await
        .expect("init");
    let late = f
        .lua
        .step(
            &f.keys(),
            id,
            &try_operation_id(id),
            stocksvr_store::lua::Step::Try { quantity: QTY },
        )
        .await
        .expect("late Try");
    assert_eq!(late.code, stocksvr_core::model::OpCode::Fenced, "{late:?}");
    assert_eq!(f.numbers().await, (TOTAL, TOTAL, 0, 0), "nothing held");
}
