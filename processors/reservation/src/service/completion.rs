//! What a finished Redis step commits, decided without I/O: the status the row moves to,
//! the version the projection must reach, and the outbox row: one per step, its stock-change
//! event with the step's deltas for the projector, carrying what the relay needs to publish
//! the lifecycle event for the order domain beside it. Event ids derive from the operation
//! id, so a step can never enqueue two different events.

use crate::outbox::{self, Deltas};
use stocksvr_core::codes::RejectReason;
use stocksvr_core::events::paired::LifecycleExtra;
use stocksvr_core::events::{StockAction, StockChangeData};
use stocksvr_core::model::{OpCode, OpResult};
use stocksvr_core::reservation::ReservationStatus;
use stocksvr_store::outbox::NewOutbox;
use stocksvr_store::reservations::{Completion, Reservation};

/// A Try that will never hold stock: REJECTED with `reason`, and the InventoryRejected event.
pub fn rejection(row: &Reservation, reason: RejectReason, available: Option<i64>) -> Completion {
    Completion {
        to: ReservationStatus::Rejected,
        expected_redis_version: None,
        refunded_add: 0,
        reject_reason: Some(reason.name().to_string()),
        outbox: vec![outbox::rejected(
            row,
            &row.current_operation_id,
            reason.name(),
            available,
        )],
    }
}

/// The Try's stock change: its quantity from available to reserved, booked at the Try
/// script's own `result`.
fn try_stock_change(row: &Reservation, op: &str, result: &OpResult) -> StockChangeData {
    let q = i64::from(row.quantity);
    let d = Deltas {
        available: -q,
        reserved: q,
        sold: 0,
    };
    outbox::stock_change_data(row, StockAction::Try, op, row.quantity, d, result, None)
}

/// Whether the Cancel that `result` answered released the stock of a Try that was never
/// booked: the row went to CANCELING straight from PREPARING (an OrderCreatedFailed while its
/// Try was in flight, or after the Try died between Redis and its commit; only the Try's
/// commit sets `expected_redis_version`), yet the Cancel was no empty rollback, so the Try's
/// script had run.
pub fn cancels_an_unbooked_try(row: &Reservation, result: &OpResult) -> bool {
    row.expected_redis_version.is_none()
        && result.code == OpCode::Succeeded
        && !result.empty_rollback
}

/// Puts the Try's stock-change event before the Cancel's in `completion` (see
/// [`cancels_an_unbooked_try`]): the ledger would otherwise book a Cancel of units never
/// reserved. `try_result` is the Try's op record, so the event carries the version and
/// numbers its script gave; without one (expired after the op TTL) it carries version 0: the
/// ledger books the deltas without a version and the snapshot waits for the Cancel's.
pub fn book_unbooked_try(
    completion: &mut Completion,
    row: &Reservation,
    try_result: Option<&OpResult>,
    cancel_result: &OpResult,
) {
    let versionless = OpResult {
        version: 0,
        ..*cancel_result
    };
    let result = try_result
        .filter(|r| r.code == OpCode::Succeeded)
        .unwrap_or(&versionless);
    let op = stocksvr_core::reservation::try_operation_id(row.id);
    completion
        .outbox
        .insert(0, outbox::stock_change(try_stock_change(row, &op, result)));
}

/// The completion of a step from `from` that the state machine sends to `to`, given the
/// script's `result`; `refund_id` names the partial refund a REFUNDING row carries out.
/// `Err` names a pair no step produces.
pub fn completion(
    row: &Reservation,
    from: ReservationStatus,
    to: ReservationStatus,
    result: &OpResult,
    refund_id: Option<&str>,
) -> Result<Completion, String> {
    let op = row.current_operation_id.as_str();
    let (outbox, refunded_add) = match (from, to) {
        (ReservationStatus::Preparing, ReservationStatus::Rejected) => {
            return Ok(rejection(
                row,
                RejectReason::InsufficientStock,
                Some(result.after.available),
            ));
        }
        (ReservationStatus::Preparing, _) => (
            vec![outbox::step(
                try_stock_change(row, op, result),
                outbox::reserved_extra(row),
            )],
            0,
        ),
        (ReservationStatus::Confirming, _) => (confirmed(row, op, result), 0),
        (ReservationStatus::Canceling, _) => (canceled(row, op, result), 0),
        (ReservationStatus::Refunding, _) => {
            (refunded(row, op, result, refund_id), row.pending_quantity)
        }
        _ => {
            return Err(format!(
                "no completion from {} to {}",
                from.name(),
                to.name()
            ))
        }
    };
    Ok(Completion {
        to,
        expected_redis_version: Some(result.version),
        refunded_add,
        reject_reason: None,
        outbox,
    })
}

/// A Confirm's row: what the reservation still holds moves from reserved to sold.
fn confirmed(row: &Reservation, op: &str, result: &OpResult) -> Vec<NewOutbox> {
    let held = row.held();
    let d = Deltas {
        available: 0,
        reserved: -i64::from(held),
        sold: i64::from(held),
    };
    vec![outbox::step(
        outbox::stock_change_data(row, StockAction::Confirm, op, held, d, result, None),
        LifecycleExtra::default(),
    )]
}

/// A Cancel's row: what the reservation held goes back, unless the Cancel was an empty
/// rollback that only fenced the Try.
fn canceled(row: &Reservation, op: &str, result: &OpResult) -> Vec<NewOutbox> {
    let released = if result.empty_rollback {
        0
    } else {
        i64::from(row.held())
    };
    // Units that paid down a deficit (an adjust below what was accepted) did not become
    // available: the ledger books what Redis really did.
    let d = Deltas {
        available: released - result.paid,
        reserved: -released,
        sold: 0,
    };
    vec![outbox::step(
        outbox::stock_change_data(row, StockAction::Cancel, op, row.quantity, d, result, None),
        LifecycleExtra::default(),
    )]
}

/// A Refund's row for the row's pending quantity, returned from sold (after Confirm) or
/// from reserved (a scheduled order before its confirm): the ledger must say which pool the
/// units left.
fn refunded(
    row: &Reservation,
    op: &str,
    result: &OpResult,
    refund_id: Option<&str>,
) -> Vec<NewOutbox> {
    let qty = i64::from(row.pending_quantity);
    let from_sold = row.resume_status() == Some(ReservationStatus::Confirmed);
    let (reserved, sold) = if from_sold { (0, -qty) } else { (-qty, 0) };
    let d = Deltas {
        available: qty - result.paid,
        reserved,
        sold,
    };
    vec![outbox::step(
        outbox::stock_change_data(
            row,
            StockAction::Refund,
            op,
            row.pending_quantity,
            d,
            result,
            refund_id,
        ),
        outbox::refunded_extra(!from_sold),
    )]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixture::reservation as row;
    use stocksvr_core::events::StockAfter;
    use stocksvr_core::model::{FencePhase, OpCode};

    fn result(code: OpCode, available: i64, empty_rollback: bool) -> OpResult {
        OpResult {
            code,
            empty_rollback,
            replayed: false,
            created: false,
            after: StockAfter {
                total: 10,
                available,
                reserved: 3,
                sold: 0,
            },
            deficit: 0,
            paid: 0,
            version: 42,
            fence: FencePhase::Reserved,
        }
    }

    fn deltas(c: &Completion) -> (i64, i64, i64) {
        let d = &c.outbox[0].payload["data"];
        let n = |k: &str| d[k].as_i64().unwrap_or(i64::MIN);
        (n("available_delta"), n("reserved_delta"), n("sold_delta"))
    }

    /// The lifecycle event the relay publishes from a step's row (as `outbox-relay`'s
    /// records do): `None` when the row carries none.
    fn lifecycle(o: &NewOutbox) -> Option<serde_json::Value> {
        use stocksvr_core::events::paired::{StepBody, LIFECYCLE_MEMBER};
        o.payload.get(LIFECYCLE_MEMBER)?;
        let body: StepBody = serde_json::from_value(o.payload.clone()).expect("a step body");
        let (stock_change, l) = body.events(&o.event_id).expect("both events");
        // The stock change is the one the step used to write alone.
        assert_eq!(stock_change.event_id, o.event_id);
        assert_eq!(stock_change.partition_key, o.partition_key);
        assert_eq!(stock_change.event_type, o.event_type);
        serde_json::to_value(l).ok()
    }

    /// `a` and `b` without `occurred_at` (the clock at build time).
    fn same_event(mut a: serde_json::Value, mut b: serde_json::Value) {
        for v in [&mut a, &mut b] {
            v.as_object_mut().map(|o| o.remove("occurred_at"));
        }
        assert_eq!(a, b);
    }

    #[test]
    fn each_step_writes_one_row_that_carries_the_lifecycle_event_it_used_to_write_alone() {
        let ok = result(OpCode::Succeeded, 7, false);
        let mut refund_row = row(ReservationStatus::Refunding, "op_refund_1_r1");
        let steps = [
            (
                row(ReservationStatus::Preparing, "op_try_1"),
                ReservationStatus::Preparing,
                ReservationStatus::Reserved,
                None,
            ),
            (
                row(ReservationStatus::Confirming, "op_confirm_1"),
                ReservationStatus::Confirming,
                ReservationStatus::Confirmed,
                None,
            ),
            (
                row(ReservationStatus::Canceling, "op_cancel_1"),
                ReservationStatus::Canceling,
                ReservationStatus::Canceled,
                None,
            ),
            (
                refund_row.clone(),
                ReservationStatus::Refunding,
                ReservationStatus::Confirmed,
                Some("r1"),
            ),
        ];
        for (r, from, to, refund_id) in steps {
            let c = completion(&r, from, to, &ok, refund_id).expect("a completion");
            assert_eq!(c.outbox.len(), 1, "{from:?}: one row");
            let op = r.current_operation_id.as_str();
            let alone = match from {
                ReservationStatus::Preparing => outbox::reserved(&r, op),
                ReservationStatus::Confirming => outbox::confirmed(&r, op),
                ReservationStatus::Canceling => outbox::canceled(&r, op, false),
                _ => outbox::refunded(&r, op, r.pending_quantity, refund_id, false),
            };
            let derived = lifecycle(&c.outbox[0]).expect("the step's lifecycle event");
            assert_eq!(
                derived["event_id"],
                alone.event_id.as_str(),
                "the same event id"
            );
            same_event(derived, alone.payload);
        }
        // An empty rollback and a refund before confirm say so in the derived event too.
        let r = row(ReservationStatus::Canceling, "op_cancel_1");
        let empty = result(OpCode::Succeeded, 10, true);
        let c = completion(
            &r,
            ReservationStatus::Canceling,
            ReservationStatus::Canceled,
            &empty,
            None,
        )
        .expect("a completion");
        same_event(
            lifecycle(&c.outbox[0]).expect("an event"),
            outbox::canceled(&r, "op_cancel_1", true).payload,
        );
        refund_row.resume_status = Some(ReservationStatus::CreatedReserved.code() as i8);
        let c = completion(
            &refund_row,
            ReservationStatus::Refunding,
            ReservationStatus::CreatedReserved,
            &ok,
            None,
        )
        .expect("a completion");
        same_event(
            lifecycle(&c.outbox[0]).expect("an event"),
            outbox::refunded(
                &refund_row,
                "op_refund_1_r1",
                refund_row.pending_quantity,
                None,
                true,
            )
            .payload,
        );
        // A rejection is a lifecycle event of its own row, with nothing to split.
        let r = row(ReservationStatus::Preparing, "op_try_1");
        let insufficient = result(OpCode::Insufficient, 1, false);
        let c = completion(
            &r,
            ReservationStatus::Preparing,
            ReservationStatus::Rejected,
            &insufficient,
            None,
        )
        .expect("a completion");
        assert_eq!(lifecycle(&c.outbox[0]), None);
    }

    #[test]
    fn a_try_books_its_quantity_from_available_to_reserved_in_one_row() {
        let r = row(ReservationStatus::Preparing, "op_try_1");
        let c = completion(
            &r,
            ReservationStatus::Preparing,
            ReservationStatus::Reserved,
            &result(OpCode::Succeeded, 7, false),
            None,
        )
        .expect("a completion");
        assert_eq!(c.to, ReservationStatus::Reserved);
        assert_eq!(c.expected_redis_version, Some(42));
        assert_eq!(deltas(&c), (-3, 3, 0));
        let types: Vec<&str> = c.outbox.iter().map(|o| o.event_type.as_str()).collect();
        assert_eq!(types, ["InventoryRedisReserved"]);
        assert_eq!(c.outbox[0].event_id, "op_try_1:InventoryRedisReserved");
        let reserved = lifecycle(&c.outbox[0]).expect("the row carries InventoryReserved");
        assert_eq!(reserved["event_id"], "op_try_1:InventoryReserved");
        assert_eq!(reserved["partition_key"], r.order_id.to_string());
    }

    #[test]
    fn an_insufficient_try_is_rejected_with_the_stock_it_saw() {
        let r = row(ReservationStatus::Preparing, "op_try_1");
        let c = completion(
            &r,
            ReservationStatus::Preparing,
            ReservationStatus::Rejected,
            &result(OpCode::Insufficient, 1, false),
            None,
        )
        .expect("a completion");
        assert_eq!(c.reject_reason.as_deref(), Some("INSUFFICIENT_STOCK"));
        assert_eq!(c.expected_redis_version, None, "nothing to project");
        assert_eq!(c.outbox.len(), 1);
        assert_eq!(c.outbox[0].event_type, "InventoryRejected");
    }

    #[test]
    fn an_empty_rollback_returns_no_stock() {
        let r = row(ReservationStatus::Canceling, "op_cancel_1");
        let c = completion(
            &r,
            ReservationStatus::Canceling,
            ReservationStatus::Canceled,
            &result(OpCode::Succeeded, 10, true),
            None,
        )
        .expect("a completion");
        assert_eq!(deltas(&c), (0, 0, 0));
        let c = completion(
            &r,
            ReservationStatus::Canceling,
            ReservationStatus::Canceled,
            &result(OpCode::Succeeded, 10, false),
            None,
        )
        .expect("a completion");
        assert_eq!(deltas(&c), (3, -3, 0));
    }

    #[test]
    fn a_cancel_from_preparing_that_released_stock_books_the_try_first() {
        let mut r = row(ReservationStatus::Canceling, "op_cancel_1");
        r.expected_redis_version = None;
        let released = result(OpCode::Succeeded, 10, false);
        assert!(cancels_an_unbooked_try(&r, &released));
        assert!(
            !cancels_an_unbooked_try(&r, &result(OpCode::Succeeded, 10, true)),
            "an empty rollback: the Try never ran"
        );
        let mut booked = r.clone();
        booked.expected_redis_version = Some(41);
        assert!(
            !cancels_an_unbooked_try(&booked, &released),
            "a RESERVED row's Try was booked by its own commit"
        );

        let cancel = || {
            completion(
                &r,
                ReservationStatus::Canceling,
                ReservationStatus::Canceled,
                &released,
                None,
            )
            .expect("a completion")
        };
        let mut c = cancel();
        let try_result = OpResult {
            version: 41,
            ..result(OpCode::Succeeded, 7, false)
        };
        book_unbooked_try(&mut c, &r, Some(&try_result), &released);
        let ops: Vec<(&str, &str, bool)> = c
            .outbox
            .iter()
            .map(|o| {
                (
                    o.event_type.as_str(),
                    o.payload["data"]["operation_id"].as_str().unwrap_or(""),
                    lifecycle(o).is_some(),
                )
            })
            .collect();
        assert_eq!(
            ops,
            [
                // The Try had no lifecycle event to announce here: its stock change alone.
                ("InventoryRedisReserved", "op_try_100123001", false),
                ("InventoryRedisCanceled", "op_cancel_1", true),
            ]
        );
        assert_eq!(deltas(&c), (-3, 3, 0), "the Try's deltas come first");
        assert_eq!(c.outbox[0].payload["data"]["redis_version"], 41);
        assert_eq!(c.outbox[0].payload["data"]["after"]["available"], 7);
        assert_eq!(c.expected_redis_version, Some(42), "the Cancel's version");

        // The Try's op record expired: booked without a version (no snapshot write).
        let mut c = cancel();
        book_unbooked_try(&mut c, &r, None, &released);
        assert_eq!(deltas(&c), (-3, 3, 0));
        assert_eq!(c.outbox[0].payload["data"]["redis_version"], 0);
    }

    #[test]
    fn a_refund_after_confirm_comes_from_sold_and_counts_what_it_returned() {
        let r = row(ReservationStatus::Refunding, "op_refund_1_r1");
        let c = completion(
            &r,
            ReservationStatus::Refunding,
            ReservationStatus::Confirmed,
            &result(OpCode::Succeeded, 9, false),
            Some("r1"),
        )
        .expect("a completion");
        assert_eq!(deltas(&c), (2, 0, -2));
        assert_eq!(c.refunded_add, 2);
        assert_eq!(c.outbox[0].payload["data"]["refund_id"], "r1");
    }

    #[test]
    fn a_pair_no_step_produces_is_refused() {
        let r = row(ReservationStatus::Reserved, "op");
        assert!(completion(
            &r,
            ReservationStatus::Reserved,
            ReservationStatus::Confirmed,
            &result(OpCode::Succeeded, 0, false),
            None,
        )
        .is_err());
    }
}
