//! The reservation state machine of docs/design.md as data: statuses, the legal edges, what an
//! incoming intent does in each status ([`decide`]) and where a finished Redis step leads
//! ([`after_redis`]).
//!
//! Both functions are pure so the consumers, the HTTP Try path and the recovery worker share
//! one answer, and the tests can prove that no answer ever walks an illegal edge. The caller
//! turns a [`Decision::Start`] into a CAS `UPDATE … WHERE status=? AND version=?`; a CAS that
//! hits 0 rows re-reads the row and calls [`decide`] again.

use crate::events::{OrderType, StockAction};
use crate::model::{FencePhase, OpCode};

pub use crate::codes::{RefundStatus, ReservationStatus, SyncStatus};

impl ReservationStatus {
    /// No edge leaves these. CONFIRMED is not among them: a created order can be refunded.
    pub const fn is_terminal(self) -> bool {
        use ReservationStatus::*;
        matches!(self, Canceled | Rejected | Refunded)
    }

    /// A Redis step may be in flight; the recovery worker scans these (docs/design.md, failure windows).
    pub const fn is_intermediate(self) -> bool {
        use ReservationStatus::*;
        matches!(self, Preparing | Confirming | Canceling | Refunding)
    }

    /// The Redis step an intermediate status stands for, i.e. what recovery re-runs with
    /// the row's `current_operation_id`.
    pub const fn resume_action(self) -> Option<StockAction> {
        use ReservationStatus::*;
        match self {
            Preparing => Some(StockAction::Try),
            Confirming => Some(StockAction::Confirm),
            Canceling => Some(StockAction::Cancel),
            Refunding => Some(StockAction::Refund),
            _ => None,
        }
    }

    /// The Try is known to have taken units out of `available` and not all of them are back
    /// (they sit in `reserved` or `sold`). PREPARING and CANCELING are uncertain (the Try may
    /// never have landed: only the fence knows) and answer `false`.
    pub const fn holds_stock(self) -> bool {
        use ReservationStatus::*;
        matches!(
            self,
            Reserved | CreatedReserved | Confirming | Confirmed | Refunding
        )
    }

    /// Work on the bucket is unfinished: its bucket may not be archived (docs/design.md, bucket lifecycle).
    pub const fn blocks_bucket_archive(self) -> bool {
        !self.is_terminal() && !matches!(self, ReservationStatus::Confirmed)
    }
}

/// `inventory_reservation.order_type` codes for the one [`OrderType`] of the event contracts.
impl OrderType {
    pub const fn code(self) -> u8 {
        match self {
            OrderType::Instant => 1,
            OrderType::Scheduled => 2,
        }
    }

    pub const fn from_code(code: u8) -> Option<Self> {
        match code {
            1 => Some(OrderType::Instant),
            2 => Some(OrderType::Scheduled),
            _ => None,
        }
    }
}

/// What an incoming event asks of a reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Intent {
    /// Instant `OrderCreated`, or `InventoryConfirmDue` for a scheduled one.
    Confirm,
    /// Scheduled `OrderCreated`: RESERVED -> CREATED_RESERVED, no Redis step.
    MarkCreated,
    /// `OrderCreatedFailed`, and nothing else.
    Cancel,
    /// `OrderCanceled`: everything still held goes back. Always a refund, never a cancel.
    Refund,
    /// `RefundRequested`: part (or all) of the units, keyed by the order service's refund_id.
    PartialRefund,
}

impl Intent {
    pub const ALL: [Intent; 5] = [
        Intent::Confirm,
        Intent::MarkCreated,
        Intent::Cancel,
        Intent::Refund,
        Intent::PartialRefund,
    ];
}

/// The answer of [`decide`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// CAS `current -> to` (storing the step's operation id), then run the Redis step;
    /// for `MarkCreated` (`to = CREATED_RESERVED`) there is no Redis step.
    Start { to: ReservationStatus },
    /// Idempotent success: return the stored result, change nothing.
    AlreadyDone,
    /// Another worker runs this step: resume it with the stored operation id, or answer
    /// "processing". See [`decide_for_operation`] when the stored id may belong to another
    /// refund.
    InProgress { status: ReservationStatus },
    /// Too early (e.g. Confirm while PREPARING): retry later, never skip.
    NotYet { status: ReservationStatus },
    /// Incompatible with the current state: emit a conflict event and stop retrying.
    Conflict {
        status: ReservationStatus,
        reason: &'static str,
    },
}

const REVERSE_FLOW: &str = "order already in reverse flow";
const CREATE_FAILED: &str = "order creation already failed (OrderCreatedFailed)";
const TRY_REJECTED: &str = "try was rejected; nothing is held";

/// What `intent` does to a reservation in status `current` (docs/design.md, reservation state machine and flows).
pub fn decide(current: ReservationStatus, intent: Intent) -> Decision {
    use Decision::*;
    use ReservationStatus::*;
    let start = |to| Start { to };
    let conflict = |reason| Conflict {
        status: current,
        reason,
    };
    let not_yet = NotYet { status: current };
    let in_progress = InProgress { status: current };
    match intent {
        Intent::Confirm => match current {
            Reserved | CreatedReserved => start(Confirming),
            Confirmed => AlreadyDone,
            Confirming => in_progress,
            Preparing => not_yet,
            // A partial refund returns to CREATED_RESERVED or CONFIRMED: wait for it to
            // settle instead of refusing a confirm that will be valid (or done) then.
            Refunding => not_yet,
            Canceling | Canceled => conflict(CREATE_FAILED),
            Refunded => conflict(REVERSE_FLOW),
            Rejected => conflict(TRY_REJECTED),
        },
        Intent::MarkCreated => match current {
            Reserved => start(CreatedReserved),
            CreatedReserved | Confirming | Confirmed => AlreadyDone,
            // PREPARING: the Try has not settled. REFUNDING: it ends REFUNDED (conflict) or
            // back in CREATED_RESERVED/CONFIRMED (done); only then is the answer known.
            Preparing | Refunding => not_yet,
            Canceling | Canceled => conflict(CREATE_FAILED),
            Rejected => conflict(TRY_REJECTED),
            Refunded => conflict(REVERSE_FLOW),
        },
        Intent::Cancel => match current {
            // From PREPARING the cancel races the Try; the fence settles it in Redis.
            Preparing | Reserved => start(Canceling),
            Canceling => in_progress,
            Canceled => AlreadyDone,
            // A rejected Try holds nothing, so the failed order has nothing to release.
            Rejected => AlreadyDone,
            CreatedReserved => conflict("cancel impossible after OrderCreated; use refund"),
            Confirming | Confirmed => conflict("order already created; cancel lost to confirm"),
            Refunding | Refunded => conflict(REVERSE_FLOW),
        },
        Intent::Refund | Intent::PartialRefund => match current {
            Confirmed | CreatedReserved => start(Refunding),
            // An OrderCanceled that overtook its OrderCreated: refund all of it. A partial
            // refund waits for the OrderCreated instead, because a refund from RESERVED
            // could only return to RESERVED and the fence cannot tell that apart from
            // CREATED_RESERVED (see `after_redis`).
            Reserved if intent == Intent::Refund => start(Refunding),
            Reserved => not_yet,
            Refunding => in_progress,
            // Same refund again. A different refund_id on a fully refunded reservation is
            // an over-refund: the caller tells them apart by the ledger's operation_id.
            Refunded => AlreadyDone,
            Preparing | Confirming => not_yet,
            Canceling | Canceled => conflict(CREATE_FAILED),
            Rejected => conflict(TRY_REJECTED),
        },
    }
}

/// [`decide`], told which operation the row is running, which one the caller brings, and
/// whether the caller's operation already committed in MySQL.
///
/// Needed because refunds repeat on one reservation. A `RefundRequested` for a refund_id
/// that already committed (re-sent under a new event_id, so the inbox lets it through) would
/// otherwise start REFUNDING again, the Lua would replay its first result and the commit
/// would count the units twice, or even walk a since-confirmed row back to
/// CREATED_RESERVED with the stale fence phase. `requested_committed` must come from a
/// record written in the completing TX itself (the refund row keyed by operation id, or the
/// row's [`Reached`] milestones for an OrderCreated), not from the asynchronously projected
/// ledger. It makes the answer `AlreadyDone` whatever the status.
///
/// REFUNDING with another refund's operation id is not "this refund in progress": that
/// refund has to finish first, then this one starts, so the answer becomes `NotYet`.
pub fn decide_for_operation(
    current: ReservationStatus,
    intent: Intent,
    stored_operation_id: &str,
    requested_operation_id: &str,
    requested_committed: bool,
) -> Decision {
    if requested_committed {
        return Decision::AlreadyDone;
    }
    match decide(current, intent) {
        Decision::InProgress { status } if stored_operation_id != requested_operation_id => {
            Decision::NotYet { status }
        }
        other => other,
    }
}

/// The milestones of an order a reservation has passed, kept as bits in
/// `inventory_reservation.reached` and set by the completing CAS that lands in them.
///
/// A replayed order event is recognised by them instead of by a consumer inbox row: an
/// OrderCreated replayed after the order was refunded must answer "done", not a reverse-flow
/// conflict, and the status alone cannot tell "created, then refunded" from "refunded before
/// it was created" (an OrderCanceled that overtook its OrderCreated). The bits are written in
/// the row the step already changes, so recognising a replay costs no row of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Reached(u8);

impl Reached {
    /// OrderCreated applied: CREATED_RESERVED (scheduled) or CONFIRMED (instant) was reached.
    pub const CREATED: u8 = 1;
    /// The Confirm landed: CONFIRMED was reached.
    pub const CONFIRMED: u8 = 2;

    pub fn from_bits(bits: u8) -> Self {
        Self(bits)
    }

    pub fn bits(self) -> u8 {
        self.0
    }

    /// The bits a CAS landing in `to` adds (every status a refund returns to was reached
    /// before, so adding them again changes nothing).
    pub fn landing_in(to: ReservationStatus) -> u8 {
        match to {
            ReservationStatus::CreatedReserved => Self::CREATED,
            ReservationStatus::Confirmed => Self::CREATED | Self::CONFIRMED,
            _ => 0,
        }
    }

    /// Whether `intent` already committed on a row that reached these milestones: the
    /// `requested_committed` of [`decide_for_operation`] for a Confirm or a MarkCreated.
    pub fn committed(self, intent: Intent) -> bool {
        match intent {
            Intent::Confirm => self.0 & Self::CONFIRMED != 0,
            Intent::MarkCreated => self.0 & Self::CREATED != 0,
            Intent::Cancel | Intent::Refund | Intent::PartialRefund => false,
        }
    }
}

/// Where an intermediate status goes once its Redis step answered.
///
/// The completing TX of `Advance` and `RefundRefused` must record the operation id as
/// committed (see [`decide_for_operation`]): a replayed refund answer carries the fence
/// phase of its first run and must never be applied to a row that has moved on since.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Completion {
    /// CAS the intermediate status to `to`, with ledger and outbox rows, in one TX.
    Advance { to: ReservationStatus },
    /// Try path only: the Try was FENCED by a CANCELED fence. A Cancel won the race and
    /// already moved the row out of PREPARING (its CAS precedes its Lua), so the cancel path
    /// owns the row: the Try path must not write it, only re-read it and answer the caller
    /// with what it finds (CANCELING/CANCELED).
    YieldToCancel,
    /// The refund asked for more than is still held; nothing moved in Redis. CAS back to
    /// `to` and report the refusal to the order domain.
    RefundRefused { to: ReservationStatus },
    /// Redis and MySQL disagree in a way no legal history produces (or the script answered
    /// out of contract). Keep the intermediate status, alert; never guess.
    Inconsistent { reason: &'static str },
}

/// The completion of `current` given the step's result code and the fence phase it
/// reported (`OpResult::fence`, also on replays of a recorded operation).
///
/// A refund returns to where it started, which the fence tells: CONFIRMED -> CONFIRMED,
/// RESERVED -> CREATED_RESERVED (partial refunds never start from RESERVED, see
/// [`decide`]), REFUNDED -> REFUNDED once every unit is back.
pub fn after_redis(current: ReservationStatus, code: OpCode, fence: FencePhase) -> Completion {
    use Completion::*;
    use ReservationStatus::*;
    let to = |to| Advance { to };
    match (current, code) {
        (Preparing, OpCode::Succeeded) if fence == FencePhase::Reserved => to(Reserved),
        (Preparing, OpCode::Insufficient) => to(Rejected),
        (Preparing, OpCode::Fenced) if fence == FencePhase::Canceled => YieldToCancel,
        (Preparing, OpCode::Fenced) => Inconsistent {
            reason: "try fenced by a confirmed/refunded fence while MySQL is PREPARING",
        },
        (Confirming, OpCode::Succeeded) if fence == FencePhase::Confirmed => to(Confirmed),
        (Canceling, OpCode::Succeeded) if fence == FencePhase::Canceled => to(Canceled),
        (Refunding, OpCode::Succeeded) => match fence {
            FencePhase::Refunded => to(Refunded),
            FencePhase::Confirmed => to(Confirmed),
            FencePhase::Reserved => to(CreatedReserved),
            _ => Inconsistent {
                reason: "refund succeeded on a fence that holds nothing",
            },
        },
        (Refunding, OpCode::OverRefund) => match fence {
            FencePhase::Confirmed => RefundRefused { to: Confirmed },
            FencePhase::Reserved => RefundRefused {
                to: CreatedReserved,
            },
            _ => Inconsistent {
                reason: "over-refund on a fully refunded fence while MySQL still holds units",
            },
        },
        (Confirming | Canceling | Refunding, OpCode::Conflict) => Inconsistent {
            reason: "the fence refused a step MySQL's state machine allowed",
        },
        (s, _) if !s.is_intermediate() => Inconsistent {
            reason: "no Redis step runs in this status",
        },
        _ => Inconsistent {
            reason: "result code or fence phase out of contract for this step",
        },
    }
}

/// Every legal edge: the diagram of docs/design.md (with its retry self-loops), plus
/// RESERVED -> REFUNDING (an `OrderCanceled` overtaking its `OrderCreated`) and the partial
/// refund returns REFUNDING -> CONFIRMED / CREATED_RESERVED.
pub const TRANSITIONS: &[(ReservationStatus, ReservationStatus)] = {
    use ReservationStatus::*;
    &[
        (Preparing, Reserved),
        (Preparing, Rejected),
        (Preparing, Canceling),
        (Reserved, Confirming),
        (Reserved, CreatedReserved),
        (Reserved, Canceling),
        (Reserved, Refunding),
        (CreatedReserved, Confirming),
        (CreatedReserved, Refunding),
        (Confirming, Confirmed),
        (Confirming, Confirming),
        (Canceling, Canceled),
        (Canceling, Canceling),
        (Confirmed, Refunding),
        (Refunding, Refunded),
        (Refunding, Refunding),
        (Refunding, Confirmed),
        (Refunding, CreatedReserved),
    ]
};

pub fn is_legal(from: ReservationStatus, to: ReservationStatus) -> bool {
    TRANSITIONS.iter().any(|&(f, t)| f == from && t == to)
}

/// `VARCHAR(64)` of `current_operation_id` and `inventory_ledger.operation_id`.
pub const MAX_OPERATION_ID_LEN: usize = 64;

/// Deterministic, so a retried or recovered Try hits the same Redis op record.
pub fn try_operation_id(reservation_id: u64) -> String {
    format!("op_try_{reservation_id}")
}

pub fn confirm_operation_id(reservation_id: u64) -> String {
    format!("op_confirm_{reservation_id}")
}

pub fn cancel_operation_id(reservation_id: u64) -> String {
    format!("op_cancel_{reservation_id}")
}

/// `None` for the full refund of `OrderCanceled` (`op_refund_<id>`), `Some(refund_id)` for a
/// `RefundRequested` (`op_refund_<id>_<refund_id>`), so the same refund twice returns stock
/// once and two refund ids are two partial refunds.
///
/// The refund id comes from another service: when it is empty, longer than fits in 64
/// characters or has characters outside `[A-Za-z0-9_.-]`, it is replaced by `~` and its
/// 64-bit FNV-1a hash, which stays deterministic and cannot be mistaken for a verbatim id.
pub fn refund_operation_id(reservation_id: u64, refund_id: Option<&str>) -> String {
    let base = format!("op_refund_{reservation_id}");
    let Some(key) = refund_id else {
        return base;
    };
    let room = MAX_OPERATION_ID_LEN - base.len() - 1;
    let verbatim = !key.is_empty()
        && key.len() <= room
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if verbatim {
        format!("{base}_{key}")
    } else {
        format!("{base}_~{:016x}", crate::ids::fnv1a64(key.as_bytes()))
    }
}
