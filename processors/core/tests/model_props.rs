//! The bucket model (reference Lua semantics): seed scenarios, then thousands of random
//! interleavings of try/confirm/cancel/refund/adjust with repeated and reordered operations.

mod common;

use std::collections::HashMap;

use common::XorShift;
use stocksvr_core::events::StockAfter;
use stocksvr_core::model::{BucketModel, FencePhase, OpCode, OpResult};

fn stock(total: i64, available: i64, reserved: i64, sold: i64) -> StockAfter {
    StockAfter {
        total,
        available,
        reserved,
        sold,
    }
}

#[test]
fn try_confirm_cancel_move_the_numbers_of_seed_section_2() {
    let mut m = BucketModel::new(10);
    let r = m.try_("t1", 1, 3);
    assert_eq!(
        (r.code, r.after, r.version),
        (OpCode::Succeeded, stock(10, 7, 3, 0), 2)
    );
    assert_eq!(r.fence, FencePhase::Reserved);
    let r = m.confirm("c1", 1);
    assert_eq!((r.code, r.after), (OpCode::Succeeded, stock(10, 7, 0, 3)));
    m.try_("t2", 2, 2);
    let r = m.cancel("x2", 2, 2);
    assert_eq!((r.code, r.empty_rollback), (OpCode::Succeeded, false));
    assert_eq!(r.after, stock(10, 7, 0, 3));
    assert_eq!(
        m.cancel("c-again", 1, 3).code,
        OpCode::Conflict,
        "cancel after confirm"
    );
}

#[test]
fn empty_rollback_then_late_try_is_fenced() {
    let mut m = BucketModel::new(5);
    let r = m.cancel("x1", 1, 2);
    assert_eq!((r.code, r.empty_rollback), (OpCode::Succeeded, true));
    assert_eq!(
        (r.after, r.version),
        (stock(5, 5, 0, 0), 1),
        "no stock out of nothing"
    );
    let r = m.try_("t1", 1, 2);
    assert_eq!((r.code, r.after), (OpCode::Fenced, stock(5, 5, 0, 0)));
    let replay = m.try_("t1", 1, 2);
    assert!(replay.replayed, "a replay says so");
    assert_eq!(
        OpResult {
            replayed: false,
            ..replay
        },
        r,
        "replay returns the first result"
    );
}

#[test]
fn insufficient_writes_no_fence_and_stays_insufficient() {
    let mut m = BucketModel::new(1);
    let r = m.try_("t1", 1, 2);
    assert_eq!((r.code, r.fence), (OpCode::Insufficient, FencePhase::None));
    assert!(m.fence(1).is_none());
    m.adjust("a1", 10);
    assert_eq!(
        m.try_("t1", 1, 2).code,
        OpCode::Insufficient,
        "same op id, first result"
    );
    assert!(m.cancel("x1", 1, 2).empty_rollback);
    assert_eq!(m.stock(), stock(10, 10, 0, 0));
}

#[test]
fn partial_refunds_grow_refunded_until_everything_is_back() {
    let mut m = BucketModel::new(10);
    m.try_("t", 1, 4);
    m.confirm("c", 1);
    let r = m.refund("r-a", 1, 1);
    assert_eq!(
        (r.code, r.after, r.fence),
        (OpCode::Succeeded, stock(10, 7, 0, 3), FencePhase::Confirmed)
    );
    let r = m.refund("r-b", 1, 4);
    assert_eq!((r.code, r.after), (OpCode::OverRefund, stock(10, 7, 0, 3)));
    let r = m.refund("r-c", 1, 3);
    assert_eq!((r.code, r.fence), (OpCode::Succeeded, FencePhase::Refunded));
    assert_eq!(r.after, stock(10, 10, 0, 0));
    assert_eq!(m.refund("r-d", 1, 1).code, OpCode::OverRefund);
    assert_eq!(
        m.try_("t", 1, 4).code,
        OpCode::Succeeded,
        "replay of the first try"
    );
    assert_eq!(m.try_("t-other", 1, 4).code, OpCode::Fenced);
    // A second Try of a held reservation succeeds only with the same quantity, as try.lua.
    m.try_("t3", 3, 2);
    assert_eq!(m.try_("t3-again", 3, 2).code, OpCode::Succeeded);
    assert_eq!(m.try_("t3-more", 3, 3).code, OpCode::Conflict);
    m.cancel("x3", 3, 2);
    // Before confirm a refund returns reserved units, and confirm moves only what is left.
    m.try_("t2", 2, 5);
    m.refund("r2", 2, 2);
    assert_eq!(m.stock(), stock(10, 7, 3, 0));
    m.confirm("c2", 2);
    assert_eq!(m.stock(), stock(10, 7, 0, 3));
}

#[test]
fn adjust_below_what_was_promised_records_a_deficit_seed_12_3() {
    let mut m = BucketModel::new(100);
    m.try_("t1", 1, 20);
    m.confirm("c1", 1);
    m.try_("t2", 2, 10);
    assert_eq!(m.stock(), stock(100, 70, 10, 20));
    assert_eq!(m.adjust("a1", 120).after, stock(120, 90, 10, 20));
    let r = m.adjust("a2", 20);
    assert_eq!((r.after, r.deficit), (stock(20, 0, 10, 20), 10));
    // Released units pay the deficit first.
    m.cancel("x2", 2, 10);
    assert_eq!((m.stock(), m.deficit()), (stock(20, 0, 0, 20), 0));
    m.refund("r1", 1, 5);
    assert_eq!(m.stock(), stock(20, 5, 0, 15));
    assert_eq!(m.adjust("a-neg", -1).code, OpCode::Invalid);
    assert!(
        m.op_result("a-neg").is_none(),
        "refusals of bad arguments are not recorded"
    );
}

#[derive(Clone, Copy, Debug)]
enum Call {
    Try(u64, u32),
    Confirm(u64),
    Cancel(u64, u32),
    Refund(u64, u32),
    Adjust(i64),
}

const RESERVATIONS: u64 = 20;

fn random_call(rng: &mut XorShift, qty: &HashMap<u64, u32>, adjusts: &mut u64) -> (String, Call) {
    let rid = rng.below(RESERVATIONS);
    let q = qty[&rid];
    // A second op id for the same step now and then: an expired op record, or a bug.
    let alt = if rng.chance(10) { "_alt" } else { "" };
    match rng.below(100) {
        0..=29 => (format!("op_try_{rid}{alt}"), Call::Try(rid, q)),
        30..=49 => (format!("op_confirm_{rid}{alt}"), Call::Confirm(rid)),
        50..=64 => (format!("op_cancel_{rid}{alt}"), Call::Cancel(rid, q)),
        65..=89 => {
            let key = rng.below(4);
            (
                format!("op_refund_{rid}_{key}"),
                Call::Refund(rid, rng.range(1, 4)),
            )
        }
        _ => {
            if rng.chance(70) {
                *adjusts += 1;
            }
            (
                format!("op_adjust_{adjusts}"),
                Call::Adjust(rng.below(60) as i64),
            )
        }
    }
}

fn apply(m: &mut BucketModel, op: &str, call: Call) -> stocksvr_core::model::OpResult {
    match call {
        Call::Try(rid, q) => m.try_(op, rid, q),
        Call::Confirm(rid) => m.confirm(op, rid),
        Call::Cancel(rid, q) => m.cancel(op, rid, q),
        Call::Refund(rid, q) => m.refund(op, rid, q),
        Call::Adjust(total) => m.adjust(op, total),
    }
}

fn check_invariants(m: &BucketModel) {
    let s = m.stock();
    let d = m.deficit();
    assert!(
        s.total >= 0 && s.available >= 0 && s.reserved >= 0 && s.sold >= 0,
        "{s:?}"
    );
    assert!(d >= 0);
    if d == 0 {
        assert!(s.is_consistent(), "{s:?}");
    } else {
        assert_eq!(s.available, 0, "{s:?} deficit {d}");
        assert_eq!(s.reserved + s.sold, s.total + d, "{s:?} deficit {d}");
    }
    let held = |phase| -> i64 {
        m.fences()
            .filter(|(_, f)| f.phase == phase)
            .map(|(_, f)| i64::from(f.held()))
            .sum()
    };
    assert_eq!(held(FencePhase::Reserved), s.reserved);
    assert_eq!(held(FencePhase::Confirmed), s.sold);
    for (_, f) in m.fences() {
        assert!(f.refunded <= f.quantity);
    }
}

#[test]
fn random_interleavings_keep_every_invariant() {
    // Proof that the generator reaches every branch, not just the easy ones.
    let mut seen: HashMap<&'static str, u32> = HashMap::new();
    for seed in 0..300 {
        let mut rng = XorShift::new(seed);
        let qty: HashMap<u64, u32> = (0..RESERVATIONS).map(|r| (r, rng.range(1, 5))).collect();
        let mut m = BucketModel::new(rng.below(40) as i64);
        let mut executed: Vec<(String, Call)> = Vec::new();
        let mut adjusts = 0;
        // Units each reservation took from `available` and got back, seen from the outside.
        let mut taken: HashMap<u64, i64> = HashMap::new();
        let mut released: HashMap<u64, i64> = HashMap::new();
        for _ in 0..400 {
            let (op, call) = if !executed.is_empty() && rng.chance(15) {
                // Replay of an executed op id, sometimes with different arguments.
                let (op, call) = executed[rng.below(executed.len() as u64) as usize].clone();
                let call = match call {
                    Call::Refund(rid, _) => Call::Refund(rid, rng.range(1, 4)),
                    Call::Adjust(_) => Call::Adjust(rng.below(60) as i64),
                    other => other,
                };
                (op, call)
            } else {
                random_call(&mut rng, &qty, &mut adjusts)
            };
            let before = m.clone();
            let first = m.op_result(&op).copied();
            let r = apply(&mut m, &op, call);
            *seen.entry(r.code.name()).or_default() += 1;
            if r.empty_rollback {
                *seen.entry("empty rollback").or_default() += 1;
            }
            if m.deficit() > 0 {
                *seen.entry("deficit").or_default() += 1;
            }
            if let Some(first) = first {
                *seen.entry("replay").or_default() += 1;
                assert!(
                    r.replayed,
                    "seed {seed}: replay of {op} not marked replayed"
                );
                assert_eq!(
                    OpResult {
                        replayed: false,
                        ..r
                    },
                    first,
                    "seed {seed}: replay of {op} changed its result"
                );
                assert_eq!(m, before, "seed {seed}: replay of {op} changed the bucket");
                continue;
            }
            executed.push((op.clone(), call));
            check_invariants(&m);
            let (b, a) = (before.stock(), m.stock());
            assert!(m.version() >= before.version());
            assert_eq!(m.version() != before.version(), a != b, "seed {seed}: {op}");
            if let Call::Try(..) | Call::Confirm(..) | Call::Cancel(..) | Call::Refund(..) = call {
                assert_eq!(a.total, b.total);
            }
            match call {
                Call::Try(rid, q) => {
                    let prior = before.fence(rid).map(|f| f.phase);
                    if prior.is_some_and(FencePhase::fences_try) {
                        assert_eq!(r.code, OpCode::Fenced, "seed {seed}: hanging try");
                    }
                    if r.code == OpCode::Insufficient {
                        assert_eq!(m.fence(rid), before.fence(rid));
                    }
                    let took = a.reserved - b.reserved;
                    assert!(took == 0 || (took == i64::from(q) && prior.is_none()));
                    *taken.entry(rid).or_default() += took;
                }
                Call::Cancel(rid, _) | Call::Refund(rid, _) | Call::Confirm(rid) => {
                    let back = (b.reserved + b.sold) - (a.reserved + a.sold);
                    assert!(back >= 0);
                    *released.entry(rid).or_default() += back;
                    if r.empty_rollback {
                        assert_eq!((a, m.deficit()), (b, before.deficit()), "empty rollback");
                    }
                }
                Call::Adjust(_) => {}
            }
            if let Call::Try(rid, _)
            | Call::Confirm(rid)
            | Call::Cancel(rid, _)
            | Call::Refund(rid, _) = call
            {
                let p0 = before.fence(rid).map_or(FencePhase::None, |f| f.phase);
                let p1 = m.fence(rid).map_or(FencePhase::None, |f| f.phase);
                assert!(
                    p0 == p1 || p0.can_advance_to(p1),
                    "seed {seed}: fence {p0:?} -> {p1:?}"
                );
                let t = taken.get(&rid).copied().unwrap_or(0);
                let back = released.get(&rid).copied().unwrap_or(0);
                assert!(back <= t, "seed {seed}: reservation {rid} released twice");
                let held = m.fence(rid).map_or(0, |f| i64::from(f.held()));
                assert_eq!(t - back, held, "seed {seed}: reservation {rid}");
            }
        }
        if m.fences().any(|(_, f)| f.phase == FencePhase::Refunded) {
            *seen.entry("fully refunded").or_default() += 1;
        }
    }
    for what in [
        "SUCCEEDED",
        "INSUFFICIENT",
        "FENCED",
        "CONFLICT",
        "OVER_REFUND",
        "empty rollback",
        "deficit",
        "replay",
        "fully refunded",
    ] {
        assert!(
            seen.get(what).copied().unwrap_or(0) > 20,
            "{what} barely exercised: {seen:?}"
        );
    }
}
