//! What a repair or a rebuild writes back for each reservation: the fence phase it gets and
//! where its held units count, and the fences and op records restored from its row and its
//! completed refunds. Decided from MySQL alone, without I/O.

use stocksvr_core::model::FencePhase;
use stocksvr_core::reservation::{self as rules, ReservationStatus};
use stocksvr_store::bucket_views::RebuildRow;
use stocksvr_store::lua::{RestoredFence, RestoredOp};

/// Where a reservation's held units sit in a rebuilt bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Held {
    Reserved,
    Sold,
    Nothing,
}

/// The fence phase a reservation gets back and where its held units count. A step in flight
/// counts where it started (its script will run again on the rebuilt bucket); a Cancel in
/// flight from PREPARING never held anything (its Try's effect, if any, went with Redis).
pub(super) fn restored_phase(r: &RebuildRow) -> (Option<FencePhase>, Held) {
    use ReservationStatus as S;
    let Some(status) = u8::try_from(r.status)
        .ok()
        .and_then(ReservationStatus::from_code)
    else {
        return (None, Held::Nothing);
    };
    let resume = r
        .resume_status
        .and_then(|s| u8::try_from(s).ok())
        .and_then(ReservationStatus::from_code);
    match status {
        S::Reserved | S::CreatedReserved | S::Confirming => {
            (Some(FencePhase::Reserved), Held::Reserved)
        }
        S::Canceling if r.expected_redis_version.is_some() => {
            (Some(FencePhase::Reserved), Held::Reserved)
        }
        S::Refunding if resume == Some(S::Confirmed) => (Some(FencePhase::Confirmed), Held::Sold),
        S::Refunding => (Some(FencePhase::Reserved), Held::Reserved),
        S::Confirmed if r.quantity > r.refunded_quantity => {
            (Some(FencePhase::Confirmed), Held::Sold)
        }
        S::Confirmed | S::Refunded => (Some(FencePhase::Refunded), Held::Nothing),
        S::Canceled => (Some(FencePhase::Canceled), Held::Nothing),
        S::Canceling | S::Preparing | S::Rejected => (None, Held::Nothing),
    }
}

/// The fences and op records to restore for `rows` (with their completed refunds).
pub(super) fn restoration(
    rows: &[RebuildRow],
    refunds: &[(u64, String, u32)],
) -> (Vec<RestoredFence>, Vec<RestoredOp>) {
    let mut fences = Vec::new();
    let mut ops = Vec::new();
    for r in rows {
        let (Some(phase), _) = restored_phase(r) else {
            continue;
        };
        let id = r.id;
        let status = u8::try_from(r.status)
            .ok()
            .and_then(ReservationStatus::from_code);
        let confirmed = status == Some(ReservationStatus::Confirmed)
            || (status == Some(ReservationStatus::Refunding) && phase == FencePhase::Confirmed);
        let canceled = status == Some(ReservationStatus::Canceled);
        let own_refunds: Vec<&(u64, String, u32)> =
            refunds.iter().filter(|(rid, _, _)| *rid == id).collect();
        fences.push(RestoredFence {
            reservation_id: id,
            phase,
            quantity: r.quantity,
            refunded: r.refunded_quantity,
            try_op: (!canceled).then(|| rules::try_operation_id(id)),
            confirm_op: confirmed.then(|| rules::confirm_operation_id(id)),
            cancel_op: canceled.then(|| r.current_operation_id.clone()),
            last_refund_op: own_refunds.last().map(|(_, op, _)| op.clone()),
        });
        if !canceled {
            ops.push(RestoredOp {
                reservation_id: id,
                operation_id: rules::try_operation_id(id),
                action: "TRY",
                phase: FencePhase::Reserved,
                quantity: r.quantity,
            });
        }
        if confirmed {
            ops.push(RestoredOp {
                reservation_id: id,
                operation_id: rules::confirm_operation_id(id),
                action: "CONFIRM",
                phase: FencePhase::Confirmed,
                quantity: r.quantity,
            });
        }
        if canceled {
            ops.push(RestoredOp {
                reservation_id: id,
                operation_id: r.current_operation_id.clone(),
                action: "CANCEL",
                phase: FencePhase::Canceled,
                quantity: r.quantity,
            });
        }
        for (_, op, quantity) in own_refunds {
            ops.push(RestoredOp {
                reservation_id: id,
                operation_id: op.clone(),
                action: "REFUND",
                phase,
                quantity: *quantity,
            });
        }
    }
    (fences, ops)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(status: ReservationStatus, quantity: u32, refunded: u32) -> RebuildRow {
        RebuildRow {
            id: 7,
            status: status.code() as i8,
            quantity,
            refunded_quantity: refunded,
            current_operation_id: "op_x".into(),
            expected_redis_version: Some(3),
            resume_status: None,
        }
    }

    #[test]
    fn held_units_count_where_the_last_completed_step_left_them() {
        use ReservationStatus as S;
        let phase = |r: &RebuildRow| restored_phase(r);
        assert_eq!(
            phase(&row(S::Reserved, 2, 0)),
            (Some(FencePhase::Reserved), Held::Reserved)
        );
        assert_eq!(
            phase(&row(S::CreatedReserved, 3, 1)),
            (Some(FencePhase::Reserved), Held::Reserved)
        );
        assert_eq!(
            phase(&row(S::Confirming, 2, 0)),
            (Some(FencePhase::Reserved), Held::Reserved)
        );
        assert_eq!(
            phase(&row(S::Confirmed, 2, 1)),
            (Some(FencePhase::Confirmed), Held::Sold)
        );
        assert_eq!(
            phase(&row(S::Confirmed, 2, 2)),
            (Some(FencePhase::Refunded), Held::Nothing)
        );
        assert_eq!(
            phase(&row(S::Canceled, 2, 0)),
            (Some(FencePhase::Canceled), Held::Nothing)
        );
        // A cancel in flight after a completed Try still holds; from PREPARING it never did.
        assert_eq!(
            phase(&row(S::Canceling, 2, 0)),
            (Some(FencePhase::Reserved), Held::Reserved)
        );
        let mut early = row(S::Canceling, 2, 0);
        early.expected_redis_version = None;
        assert_eq!(phase(&early), (None, Held::Nothing));
        // A refund in flight counts where it started.
        let mut refunding = row(S::Refunding, 4, 1);
        refunding.resume_status = Some(S::Confirmed.code() as i8);
        assert_eq!(phase(&refunding), (Some(FencePhase::Confirmed), Held::Sold));
        refunding.resume_status = Some(S::CreatedReserved.code() as i8);
        assert_eq!(
            phase(&refunding),
            (Some(FencePhase::Reserved), Held::Reserved)
        );
        assert_eq!(phase(&row(S::Preparing, 1, 0)), (None, Held::Nothing));
    }

    #[test]
    fn fences_name_the_steps_taken_and_their_op_records_come_back() {
        let confirmed = row(ReservationStatus::Confirmed, 3, 1);
        let refunds = vec![(7, "op_refund_7_a".to_string(), 1)];
        let (fences, ops) = restoration(&[confirmed], &refunds);
        assert_eq!(fences.len(), 1);
        let f = &fences[0];
        assert_eq!(
            (f.phase, f.quantity, f.refunded),
            (FencePhase::Confirmed, 3, 1)
        );
        assert_eq!(
            f.try_op.as_deref(),
            Some(rules::try_operation_id(7).as_str())
        );
        assert_eq!(
            f.confirm_op.as_deref(),
            Some(rules::confirm_operation_id(7).as_str())
        );
        assert_eq!(f.last_refund_op.as_deref(), Some("op_refund_7_a"));
        let actions: Vec<&str> = ops.iter().map(|o| o.action).collect();
        assert_eq!(actions, ["TRY", "CONFIRM", "REFUND"]);
        let canceled = row(ReservationStatus::Canceled, 2, 0);
        let (fences, ops) = restoration(&[canceled], &[]);
        assert_eq!(fences[0].cancel_op.as_deref(), Some("op_x"));
        assert_eq!(fences[0].try_op, None);
        assert_eq!(ops.iter().map(|o| o.action).collect::<Vec<_>>(), ["CANCEL"]);
    }
}
