//! The state machine table: codes, names, `decide`, `after_redis` and the legal edges.

use stocksvr_core::events::{OrderType, StockAction};
use stocksvr_core::model::{FencePhase, OpCode};
use stocksvr_core::reservation::ReservationStatus::{self, *};
use stocksvr_core::reservation::*;

#[test]
fn status_codes_and_names_round_trip() {
    let expected = [
        (Preparing, 10, "PREPARING"),
        (Reserved, 20, "RESERVED"),
        (CreatedReserved, 25, "CREATED_RESERVED"),
        (Confirming, 30, "CONFIRMING"),
        (Confirmed, 40, "CONFIRMED"),
        (Canceling, 50, "CANCELING"),
        (Canceled, 60, "CANCELED"),
        (Rejected, 70, "REJECTED"),
        (Refunding, 80, "REFUNDING"),
        (Refunded, 90, "REFUNDED"),
    ];
    assert_eq!(expected.len(), ReservationStatus::ALL.len());
    for (status, code, name) in expected {
        assert_eq!(status.code(), code);
        assert_eq!(ReservationStatus::from_code(code), Some(status));
        assert_eq!(status.name(), name);
        assert_eq!(status.to_string(), name);
        assert_eq!(ReservationStatus::from_name(name), Some(status));
        let json = serde_json::to_string(&status).unwrap();
        assert_eq!(json, format!("\"{name}\""));
        assert_eq!(
            serde_json::from_str::<ReservationStatus>(&json).unwrap(),
            status
        );
    }
    assert_eq!(ReservationStatus::from_code(0), None);
    assert_eq!(ReservationStatus::from_code(26), None);
    assert_eq!(ReservationStatus::from_name("reserved"), None);
}

#[test]
fn status_classes() {
    let terminal: Vec<_> = ReservationStatus::ALL
        .into_iter()
        .filter(|s| s.is_terminal())
        .collect();
    assert_eq!(terminal, [Canceled, Rejected, Refunded]);
    let intermediate: Vec<_> = ReservationStatus::ALL
        .into_iter()
        .filter(|s| s.is_intermediate())
        .collect();
    assert_eq!(intermediate, [Preparing, Confirming, Canceling, Refunding]);
    for s in ReservationStatus::ALL {
        assert_eq!(s.resume_action().is_some(), s.is_intermediate(), "{s}");
    }
    assert_eq!(Preparing.resume_action(), Some(StockAction::Try));
    assert_eq!(Refunding.resume_action(), Some(StockAction::Refund));
    assert!(Confirmed.holds_stock() && CreatedReserved.holds_stock());
    assert!(!Preparing.holds_stock() && !Canceling.holds_stock() && !Rejected.holds_stock());
    assert!(!Confirmed.blocks_bucket_archive() && !Refunded.blocks_bucket_archive());
    assert!(Preparing.blocks_bucket_archive() && CreatedReserved.blocks_bucket_archive());
}

#[test]
fn order_type_codes_match_the_migration_and_the_avro_symbols() {
    for (t, code, name) in [
        (OrderType::Instant, 1, "INSTANT"),
        (OrderType::Scheduled, 2, "SCHEDULED"),
    ] {
        assert_eq!(t.code(), code);
        assert_eq!(OrderType::from_code(code), Some(t));
        assert_eq!(serde_json::to_string(&t).unwrap(), format!("\"{name}\""));
    }
    assert_eq!(OrderType::from_code(0), None);
}

fn start(to: ReservationStatus) -> Decision {
    Decision::Start { to }
}

#[test]
fn decide_follows_the_seed_table() {
    use Decision::*;
    use Intent::*;
    let cases = [
        (Reserved, Confirm, start(Confirming)),
        (CreatedReserved, Confirm, start(Confirming)),
        (Confirmed, Confirm, AlreadyDone),
        (Confirming, Confirm, InProgress { status: Confirming }),
        (Preparing, Confirm, NotYet { status: Preparing }),
        (Refunding, Confirm, NotYet { status: Refunding }),
        (Reserved, MarkCreated, start(CreatedReserved)),
        (CreatedReserved, MarkCreated, AlreadyDone),
        (Confirmed, MarkCreated, AlreadyDone),
        (Preparing, MarkCreated, NotYet { status: Preparing }),
        (Preparing, Cancel, start(Canceling)),
        (Reserved, Cancel, start(Canceling)),
        (Canceling, Cancel, InProgress { status: Canceling }),
        (Canceled, Cancel, AlreadyDone),
        (Rejected, Cancel, AlreadyDone),
        (Confirmed, Refund, start(Refunding)),
        (CreatedReserved, Refund, start(Refunding)),
        (Reserved, Refund, start(Refunding)),
        (Reserved, PartialRefund, NotYet { status: Reserved }),
        (Confirmed, PartialRefund, start(Refunding)),
        (Refunding, Refund, InProgress { status: Refunding }),
        (Refunded, Refund, AlreadyDone),
        (Preparing, Refund, NotYet { status: Preparing }),
        (Confirming, Refund, NotYet { status: Confirming }),
    ];
    for (current, intent, expected) in cases {
        assert_eq!(decide(current, intent), expected, "{current} {intent:?}");
    }
    let conflicts = [
        (Canceling, Confirm),
        (Canceled, Confirm),
        (Refunded, Confirm),
        (Rejected, Confirm),
        (Canceled, MarkCreated),
        (Rejected, MarkCreated),
        (Refunded, MarkCreated),
        (CreatedReserved, Cancel),
        (Confirming, Cancel),
        (Confirmed, Cancel),
        (Refunding, Cancel),
        (Refunded, Cancel),
        (Canceling, Refund),
        (Canceled, Refund),
        (Rejected, PartialRefund),
    ];
    for (current, intent) in conflicts {
        assert!(
            matches!(decide(current, intent), Conflict { status, .. } if status == current),
            "{current} {intent:?}"
        );
    }
    assert_eq!(
        decide(CreatedReserved, Cancel),
        Conflict {
            status: CreatedReserved,
            reason: "cancel impossible after OrderCreated; use refund"
        }
    );
}

#[test]
fn confirm_and_cancel_race_on_one_cas_and_exactly_one_wins() {
    for (first, second) in [
        (Intent::Confirm, Intent::Cancel),
        (Intent::Cancel, Intent::Confirm),
    ] {
        let Decision::Start { to } = decide(Reserved, first) else {
            panic!("{first:?} must start from RESERVED");
        };
        assert!(!matches!(decide(to, second), Decision::Start { .. }));
    }
}

#[test]
fn another_refund_in_flight_is_not_yet_not_in_progress() {
    let a = refund_operation_id(7, Some("rfd_1"));
    let b = refund_operation_id(7, Some("rfd_2"));
    assert_eq!(
        decide_for_operation(Refunding, Intent::PartialRefund, &a, &a, false),
        Decision::InProgress { status: Refunding }
    );
    assert_eq!(
        decide_for_operation(Refunding, Intent::PartialRefund, &a, &b, false),
        Decision::NotYet { status: Refunding }
    );
    assert_eq!(
        decide_for_operation(Confirmed, Intent::PartialRefund, &a, &b, false),
        start(Refunding)
    );
    // The same refund_id again after it committed: done, not a second refund.
    assert_eq!(
        decide_for_operation(Confirmed, Intent::PartialRefund, &b, &a, true),
        Decision::AlreadyDone
    );
}

#[test]
fn after_redis_completes_each_intermediate_state() {
    use Completion::*;
    use FencePhase as F;
    let cases = [
        (
            Preparing,
            OpCode::Succeeded,
            F::Reserved,
            Advance { to: Reserved },
        ),
        (
            Preparing,
            OpCode::Insufficient,
            F::None,
            Advance { to: Rejected },
        ),
        (Preparing, OpCode::Fenced, F::Canceled, YieldToCancel),
        (
            Confirming,
            OpCode::Succeeded,
            F::Confirmed,
            Advance { to: Confirmed },
        ),
        (
            Canceling,
            OpCode::Succeeded,
            F::Canceled,
            Advance { to: Canceled },
        ),
        (
            Refunding,
            OpCode::Succeeded,
            F::Refunded,
            Advance { to: Refunded },
        ),
        (
            Refunding,
            OpCode::Succeeded,
            F::Confirmed,
            Advance { to: Confirmed },
        ),
        (
            Refunding,
            OpCode::Succeeded,
            F::Reserved,
            Advance {
                to: CreatedReserved,
            },
        ),
        (
            Refunding,
            OpCode::OverRefund,
            F::Confirmed,
            RefundRefused { to: Confirmed },
        ),
        (
            Refunding,
            OpCode::OverRefund,
            F::Reserved,
            RefundRefused {
                to: CreatedReserved,
            },
        ),
    ];
    for (current, code, fence, expected) in cases {
        assert_eq!(
            after_redis(current, code, fence),
            expected,
            "{current} {code:?} {fence:?}"
        );
    }
    for (current, code, fence) in [
        (Preparing, OpCode::Fenced, F::Confirmed),
        (Confirming, OpCode::Conflict, F::Canceled),
        (Canceling, OpCode::Conflict, F::Confirmed),
        (Refunding, OpCode::Conflict, F::None),
        (Refunding, OpCode::OverRefund, F::Refunded),
        (Reserved, OpCode::Succeeded, F::Reserved),
        (Confirming, OpCode::Succeeded, F::Reserved),
    ] {
        assert!(
            matches!(after_redis(current, code, fence), Inconsistent { .. }),
            "{current} {code:?} {fence:?}"
        );
    }
}

#[test]
fn decide_and_after_redis_only_walk_legal_edges() {
    let mut walked = Vec::new();
    for current in ReservationStatus::ALL {
        for intent in Intent::ALL {
            if let Decision::Start { to } = decide(current, intent) {
                assert!(is_legal(current, to), "decide: {current} -> {to}");
                assert_ne!(current, to);
                walked.push((current, to));
            }
        }
        for code in OpCode::ALL {
            for fence in FencePhase::ALL {
                match after_redis(current, code, fence) {
                    Completion::Advance { to } | Completion::RefundRefused { to } => {
                        assert!(is_legal(current, to), "after_redis: {current} -> {to}");
                        walked.push((current, to));
                    }
                    Completion::YieldToCancel => assert_eq!(current, Preparing),
                    Completion::Inconsistent { .. } => {}
                }
            }
        }
    }
    // Every edge of the table is used by something, except the retry self-loops.
    for &(from, to) in TRANSITIONS {
        assert!(
            from == to || walked.contains(&(from, to)),
            "unused edge {from} -> {to}"
        );
    }
}

#[test]
fn no_edge_leaves_a_terminal_state() {
    for &(from, to) in TRANSITIONS {
        assert!(!from.is_terminal(), "{from} -> {to}");
    }
    for s in ReservationStatus::ALL
        .into_iter()
        .filter(|s| s.is_terminal())
    {
        for intent in Intent::ALL {
            assert!(!matches!(decide(s, intent), Decision::Start { .. }));
        }
    }
    // Every non-terminal status can still reach a terminal one.
    for s in ReservationStatus::ALL {
        let mut seen = vec![s];
        let mut i = 0;
        while i < seen.len() {
            for &(from, to) in TRANSITIONS {
                if from == seen[i] && !seen.contains(&to) {
                    seen.push(to);
                }
            }
            i += 1;
        }
        assert!(seen.iter().any(|t| t.is_terminal()), "{s} cannot terminate");
    }
}

#[test]
fn operation_ids_are_deterministic_and_fit_64_chars() {
    assert_eq!(try_operation_id(100123001), "op_try_100123001");
    assert_eq!(confirm_operation_id(100123001), "op_confirm_100123001");
    assert_eq!(cancel_operation_id(100123020), "op_cancel_100123020");
    assert_eq!(refund_operation_id(100123010, None), "op_refund_100123010");
    assert_eq!(
        refund_operation_id(100123001, Some("rfd_90000001_1")),
        "op_refund_100123001_rfd_90000001_1"
    );
    let long = "r".repeat(200);
    let odd = "rfd:1/ü";
    for key in [
        Some(""),
        Some(long.as_str()),
        Some(odd),
        Some("x".repeat(33).as_str()),
    ] {
        let id = refund_operation_id(u64::MAX, key);
        assert!(id.len() <= MAX_OPERATION_ID_LEN, "{id}");
        assert_eq!(id, refund_operation_id(u64::MAX, key), "deterministic");
    }
    assert_eq!(
        refund_operation_id(u64::MAX, Some(&"x".repeat(33))).len(),
        MAX_OPERATION_ID_LEN
    );
    assert!(refund_operation_id(1, Some(&long)).contains("_~"));
    assert!(refund_operation_id(1, Some(odd)).contains("_~"));
    // Distinct refunds never share an id; the full refund differs from any partial one.
    let ids = [
        refund_operation_id(1, None),
        refund_operation_id(1, Some("")),
        refund_operation_id(1, Some("a")),
        refund_operation_id(1, Some("b")),
        refund_operation_id(1, Some(&long)),
        refund_operation_id(11, None),
    ];
    for (i, a) in ids.iter().enumerate() {
        for b in &ids[i + 1..] {
            assert_ne!(a, b);
        }
    }
    for id in [
        try_operation_id(u64::MAX),
        confirm_operation_id(u64::MAX),
        cancel_operation_id(u64::MAX),
    ] {
        assert!(id.len() <= MAX_OPERATION_ID_LEN);
    }
}

/// Every status reachable from RESERVED along legal edges (up to `depth` steps), with the
/// milestone bits the CASes along the way set. A refund ends REFUNDED or goes back to the
/// status it started from (`resume_status`), whatever other edges out of REFUNDING exist.
fn reachable_with_milestones(depth: usize) -> Vec<(Vec<ReservationStatus>, Reached)> {
    let mut found = vec![(vec![Reserved], Reached::default())];
    let mut frontier = found.clone();
    for _ in 0..depth {
        let mut next = Vec::new();
        for (path, reached) in &frontier {
            let at = *path.last().expect("a path has a start");
            let resumes = path.len() >= 2 && at == Refunding;
            let before_refund = resumes.then(|| path[path.len() - 2]);
            for (from, to) in TRANSITIONS {
                let resumed = before_refund.is_none_or(|b| *to == b || *to == Refunded);
                if *from == at && resumed {
                    let mut longer = path.clone();
                    longer.push(*to);
                    let bits = reached.bits() | Reached::landing_in(*to);
                    next.push((longer, Reached::from_bits(bits)));
                }
            }
        }
        found.extend(next.iter().cloned());
        frontier = next;
    }
    found
}

#[test]
fn a_milestone_never_claims_an_order_event_that_may_still_start() {
    // If the bits say an OrderCreated (Confirm or MarkCreated) committed, the state machine
    // must never want to start it again from there: otherwise a replay recognised by the
    // bits would skip a step that is still due.
    let paths = reachable_with_milestones(6);
    assert!(
        paths.len() > 50,
        "the walk covers the machine: {}",
        paths.len()
    );
    for (path, reached) in &paths {
        let at = *path.last().expect("a path has a start");
        for intent in [Intent::Confirm, Intent::MarkCreated] {
            if reached.committed(intent) {
                assert!(
                    !matches!(decide(at, intent), Decision::Start { .. }),
                    "{path:?}: {intent:?} is marked committed but would start"
                );
            }
        }
        for intent in [Intent::Cancel, Intent::Refund, Intent::PartialRefund] {
            assert!(!reached.committed(intent), "{path:?}: {intent:?}");
        }
    }
}

#[test]
fn an_order_created_replayed_after_its_refund_is_done_not_a_conflict() {
    let confirm_op = confirm_operation_id(7);
    // Instant: confirmed, then refunded in full; the OrderCreated comes again.
    let reached = Reached::from_bits(Reached::landing_in(Confirmed));
    let replay = decide_for_operation(
        Refunded,
        Intent::Confirm,
        "op_refund_7",
        &confirm_op,
        reached.committed(Intent::Confirm),
    );
    assert_eq!(replay, Decision::AlreadyDone);
    // Scheduled: parked in CREATED_RESERVED, refunded; the OrderCreated comes again.
    let reached = Reached::from_bits(Reached::landing_in(CreatedReserved));
    assert!(reached.committed(Intent::MarkCreated));
    assert!(
        !reached.committed(Intent::Confirm),
        "the wheel's confirm is still due"
    );
    // Refunded before any OrderCreated (an OrderCanceled that overtook it): still a conflict.
    let never = Reached::default();
    assert!(matches!(
        decide_for_operation(
            Refunded,
            Intent::Confirm,
            "op_refund_7",
            &confirm_op,
            never.committed(Intent::Confirm)
        ),
        Decision::Conflict { .. }
    ));
}
