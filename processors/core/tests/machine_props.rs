//! The MySQL state machine (`decide`, `after_redis`) driven together with the Redis model:
//! random events, crash windows between the Lua step and the MySQL commit, recovery
//! replays, late Trys. Every answer must be legal, and once everything settles MySQL and
//! the fences must tell the same story.

mod common;

use std::collections::HashSet;

use common::XorShift;
use stocksvr_core::model::{BucketModel, FencePhase, OpCode, OpResult};
use stocksvr_core::reservation::ReservationStatus::{self, *};
use stocksvr_core::reservation::*;

/// One `inventory_reservation` row as the simulation keeps it.
#[derive(Debug, Clone)]
struct Row {
    id: u64,
    quantity: u32,
    status: ReservationStatus,
    current_operation_id: String,
    /// Units the running refund returns.
    refund_qty: u32,
    refunded_quantity: u32,
    /// A Lua answer not yet committed to MySQL, with the status it was run for.
    pending: Option<(ReservationStatus, OpResult)>,
    /// Operation ids whose completion committed (what the completing TX records).
    committed: HashSet<String>,
}

fn run_lua(m: &mut BucketModel, row: &Row) -> Option<OpResult> {
    let op = row.current_operation_id.as_str();
    Some(match row.status {
        Preparing => m.try_(op, row.id, row.quantity),
        Confirming => m.confirm(op, row.id),
        Canceling => m.cancel(op, row.id, row.quantity),
        Refunding => m.refund(op, row.id, row.refund_qty),
        _ => return None,
    })
}

/// The commit TX: a CAS from the status the Lua ran for, so a stale answer changes nothing.
fn commit(row: &mut Row, seed: u64) {
    let Some((ran_for, r)) = row.pending.take() else {
        return;
    };
    if row.status != ran_for {
        return; // CAS hits 0 rows: someone else moved the row (e.g. Cancel beat the Try).
    }
    match after_redis(row.status, r.code, r.fence) {
        Completion::Advance { to } => {
            assert!(is_legal(row.status, to), "seed {seed}");
            if row.status == Refunding {
                row.refunded_quantity += row.refund_qty;
            }
            row.status = to;
            row.committed.insert(row.current_operation_id.clone());
        }
        Completion::RefundRefused { to } => {
            assert!(is_legal(row.status, to), "seed {seed}");
            row.status = to;
            row.committed.insert(row.current_operation_id.clone());
        }
        Completion::YieldToCancel => {
            panic!("seed {seed}: a fenced Try while the row is still PREPARING: {row:?}")
        }
        Completion::Inconsistent { reason } => panic!("seed {seed}: {reason}: {row:?} {r:?}"),
    }
}

fn deliver(row: &mut Row, intent: Intent, rng: &mut XorShift, seed: u64) {
    let (op, refund_qty) = match intent {
        Intent::Confirm => (confirm_operation_id(row.id), 0),
        Intent::Cancel => (cancel_operation_id(row.id), 0),
        Intent::MarkCreated => (String::new(), 0),
        // OrderCanceled returns whatever is still held.
        Intent::Refund => (
            refund_operation_id(row.id, None),
            row.quantity - row.refunded_quantity,
        ),
        Intent::PartialRefund => {
            let key = format!("rfd_{}", rng.below(3));
            (
                refund_operation_id(row.id, Some(&key)),
                rng.range(1, row.quantity),
            )
        }
    };
    deliver_op(row, intent, op, refund_qty, seed);
}

fn deliver_op(row: &mut Row, intent: Intent, op: String, refund_qty: u32, seed: u64) {
    let committed = row.committed.contains(&op);
    let decision = decide_for_operation(
        row.status,
        intent,
        &row.current_operation_id,
        &op,
        committed,
    );
    if let Decision::Start { to } = decision {
        assert!(
            is_legal(row.status, to),
            "seed {seed}: {} -> {to}",
            row.status
        );
        row.status = to;
        if to != CreatedReserved {
            row.current_operation_id = op;
            row.refund_qty = refund_qty;
            row.pending = None;
        }
    }
}

fn new_row(id: u64, quantity: u32) -> Row {
    Row {
        id,
        quantity,
        status: Preparing,
        current_operation_id: try_operation_id(id),
        refund_qty: 0,
        refunded_quantity: 0,
        pending: None,
        committed: HashSet::new(),
    }
}

/// Runs the row's Redis step and commits it, as the Try path or recovery does.
fn settle(m: &mut BucketModel, row: &mut Row) {
    if let Some(r) = run_lua(m, row) {
        row.pending = Some((row.status, r));
        commit(row, 0);
    }
}

#[test]
fn a_refused_refund_re_sent_after_confirm_stays_done() {
    let mut m = BucketModel::new(10);
    let mut row = new_row(1, 3);
    settle(&mut m, &mut row);
    deliver_op(&mut row, Intent::MarkCreated, String::new(), 0, 0);
    let a = refund_operation_id(1, Some("rfd_a"));
    let b = refund_operation_id(1, Some("rfd_b"));
    deliver_op(&mut row, Intent::PartialRefund, a.clone(), 2, 0);
    settle(&mut m, &mut row);
    assert_eq!((row.status, row.refunded_quantity), (CreatedReserved, 2));
    deliver_op(&mut row, Intent::PartialRefund, b.clone(), 2, 0);
    settle(&mut m, &mut row);
    assert_eq!(
        (row.status, row.refunded_quantity),
        (CreatedReserved, 2),
        "refused"
    );
    deliver_op(&mut row, Intent::Confirm, confirm_operation_id(1), 0, 0);
    settle(&mut m, &mut row);
    assert_eq!(row.status, Confirmed);
    // Both refunds re-sent: their Lua answers carry the RESERVED phase of their first run.
    for op in [a, b] {
        deliver_op(&mut row, Intent::PartialRefund, op, 2, 0);
        settle(&mut m, &mut row);
        assert_eq!((row.status, row.refunded_quantity), (Confirmed, 2));
    }
    assert_eq!(
        m.fence(1).map(|f| (f.phase, f.refunded)),
        Some((FencePhase::Confirmed, 2))
    );
}

/// `MACHINE_SEEDS=100000` for a long soak.
fn seeds() -> u64 {
    std::env::var("MACHINE_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2000)
}

#[test]
fn state_machine_and_fences_agree_under_random_delivery() {
    let mut outcomes = std::collections::HashMap::<ReservationStatus, u32>::new();
    for seed in 0..seeds() {
        let mut rng = XorShift::new(seed);
        let mut m = BucketModel::new(rng.range(5, 40).into());
        let mut rows: Vec<Row> = (0..12)
            .map(|i| new_row(1000 + i, rng.range(1, 5)))
            .collect();
        for _ in 0..300 {
            let row = &mut rows[rng.below(12) as usize];
            match rng.below(10) {
                // The Try path or a recovery worker runs the row's Redis step (maybe again).
                0..=2 => {
                    if let Some(r) = run_lua(&mut m, row) {
                        row.pending = Some((row.status, r));
                    }
                }
                3..=4 => commit(row, seed),
                // A Try that was stuck in the network lands whenever it likes.
                5 => {
                    let op = try_operation_id(row.id);
                    let replay = m.op_result(&op).is_some();
                    let canceled = m
                        .fence(row.id)
                        .is_some_and(|f| f.phase == FencePhase::Canceled);
                    let r = m.try_(&op, row.id, row.quantity);
                    if canceled && !replay {
                        assert_eq!(r.code, OpCode::Fenced, "seed {seed}: hanging try");
                    }
                }
                _ => {
                    let intent = Intent::ALL[rng.below(Intent::ALL.len() as u64) as usize];
                    deliver(row, intent, &mut rng, seed);
                }
            }
        }
        // Let recovery finish everything that is in flight.
        for row in &mut rows {
            for _ in 0..3 {
                if let Some(r) = run_lua(&mut m, row) {
                    row.pending = Some((row.status, r));
                    commit(row, seed);
                }
            }
            assert!(!row.status.is_intermediate(), "seed {seed}: stuck {row:?}");
            *outcomes.entry(row.status).or_default() += 1;
            let fence = m.fence(row.id).copied();
            let phase = fence.map_or(FencePhase::None, |f| f.phase);
            let expected = match row.status {
                Reserved | CreatedReserved => FencePhase::Reserved,
                Confirmed => FencePhase::Confirmed,
                Canceled => FencePhase::Canceled,
                Refunded => FencePhase::Refunded,
                Rejected => FencePhase::None,
                s => unreachable!("{s}"),
            };
            assert_eq!(phase, expected, "seed {seed}: {row:?} {fence:?}");
            if let Some(f) = fence.filter(|f| f.phase != FencePhase::Canceled) {
                assert_eq!(f.refunded, row.refunded_quantity, "seed {seed}: {row:?}");
            }
        }
        let s = m.stock();
        assert!(s.is_consistent(), "seed {seed}: {s:?}");
    }
    for status in [
        Reserved,
        CreatedReserved,
        Confirmed,
        Canceled,
        Rejected,
        Refunded,
    ] {
        assert!(
            outcomes.get(&status).copied().unwrap_or(0) > 20,
            "{status}: {outcomes:?}"
        );
    }
}
