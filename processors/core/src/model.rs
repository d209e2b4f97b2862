//! Reference semantics of one bucket's Lua scripts (docs/design.md: fence and op records, adjustments), as plain Rust.
//!
//! Redis runs the real scripts; this model exists so the rules can be checked exhaustively
//! without a server: the property tests drive it through random interleavings, and the
//! store crate's Lua tests can replay the same sequences against Redis and compare results.
//! It therefore follows the scripts' semantics exactly, including their choices:
//!
//! - every outcome is recorded under its `operation_id` (also refusals), so a replay returns
//!   the first result even if the bucket has moved on since;
//! - the bucket `version` grows only when a quantity or the total changes: a fence-only write
//!   (empty rollback) or a refusal leaves it alone, so the projector has nothing newer to apply;
//! - units released while a deficit exists first pay the deficit down (see [`BucketModel::adjust`]),
//!   which keeps `available + reserved + sold == total + deficit` with `available == 0`
//!   whenever `deficit > 0`.

use std::collections::HashMap;

use crate::events::StockAfter;

pub use crate::codes::{FencePhase, OpCode};

impl FencePhase {
    /// The one-way edges of docs/design.md, fence phases. Staying put (partial refunds) is not an edge.
    pub const fn can_advance_to(self, next: FencePhase) -> bool {
        use FencePhase::*;
        matches!(
            (self, next),
            (None, Reserved)
                | (Reserved, Confirmed)
                | (None, Canceled)
                | (Reserved, Canceled)
                | (Reserved, Refunded)
                | (Confirmed, Refunded)
        )
    }

    /// A late Try must be refused in these phases, or the reservation would hang.
    pub const fn fences_try(self) -> bool {
        matches!(
            self,
            FencePhase::Canceled | FencePhase::Confirmed | FencePhase::Refunded
        )
    }
}

/// One reservation's fence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fence {
    pub phase: FencePhase,
    /// Units the Try took (or, for an empty rollback, the units the Cancel named).
    pub quantity: u32,
    /// Units already returned by partial refunds; never above `quantity`.
    pub refunded: u32,
}

impl Fence {
    /// Units this reservation still keeps out of `available` (in `reserved` or `sold`).
    pub const fn held(&self) -> u32 {
        match self.phase {
            FencePhase::Reserved | FencePhase::Confirmed => {
                self.quantity.saturating_sub(self.refunded)
            }
            _ => 0,
        }
    }
}

/// What a script returns, and what a replay of the same `operation_id` returns again (then
/// with `replayed` set). One type for the scripts in Redis and for this model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpResult {
    pub code: OpCode,
    /// Cancel found no Try and only wrote the CANCELED fence.
    pub empty_rollback: bool,
    /// This operation id had already been applied: the stored first result, nothing changed.
    pub replayed: bool,
    /// An init that created the bucket (an init finding it present changes nothing).
    pub created: bool,
    /// Absolute numbers after the step (the projector stores these, not deltas).
    pub after: StockAfter,
    pub deficit: i64,
    /// Of the units a cancel or refund released, those that paid down a deficit instead of
    /// becoming available (0 for every other step): the step's real available delta is the
    /// released quantity minus this.
    pub paid: i64,
    /// Bucket version after the step.
    pub version: u64,
    /// The reservation's fence phase after the step; `None` for `adjust`. The state machine
    /// reads it to tell where a partial refund returns to (see `reservation::after_redis`).
    pub fence: FencePhase,
}

/// One bucket (`inv:{tag}:stock`) with its fences and operation records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketModel {
    total: i64,
    available: i64,
    reserved: i64,
    sold: i64,
    deficit: i64,
    version: u64,
    fences: HashMap<u64, Fence>,
    ops: HashMap<String, OpResult>,
}

impl BucketModel {
    /// A freshly initialised bucket: version 1 like the init script. A negative total is
    /// treated as 0, as `adjust` would refuse it.
    pub fn new(total: i64) -> Self {
        let total = total.max(0);
        Self {
            total,
            available: total,
            reserved: 0,
            sold: 0,
            deficit: 0,
            version: 1,
            fences: HashMap::new(),
            ops: HashMap::new(),
        }
    }

    pub fn stock(&self) -> StockAfter {
        StockAfter {
            total: self.total,
            available: self.available,
            reserved: self.reserved,
            sold: self.sold,
        }
    }

    pub fn deficit(&self) -> i64 {
        self.deficit
    }

    pub fn version(&self) -> u64 {
        self.version
    }

    pub fn fence(&self, reservation_id: u64) -> Option<&Fence> {
        self.fences.get(&reservation_id)
    }

    pub fn fences(&self) -> impl Iterator<Item = (u64, &Fence)> {
        self.fences.iter().map(|(id, f)| (*id, f))
    }

    pub fn op_result(&self, operation_id: &str) -> Option<&OpResult> {
        self.ops.get(operation_id)
    }

    fn phase(&self, reservation_id: u64) -> FencePhase {
        self.fences
            .get(&reservation_id)
            .map_or(FencePhase::None, |f| f.phase)
    }

    /// Try: `available -> reserved` and fence NONE -> RESERVED.
    pub fn try_(&mut self, op_id: &str, reservation_id: u64, qty: u32) -> OpResult {
        if let Some(first) = self.ops.get(op_id) {
            return OpResult {
                replayed: true,
                ..*first
            };
        }
        if qty == 0 {
            return self.refuse(OpCode::Invalid, reservation_id);
        }
        let phase = self.phase(reservation_id);
        if phase.fences_try() {
            return self.record(op_id, OpCode::Fenced, false, reservation_id, 0);
        }
        if let Some(f) = self
            .fences
            .get(&reservation_id)
            .filter(|_| phase == FencePhase::Reserved)
        {
            // Already held under this reservation (e.g. the op record expired): succeed
            // without taking the units a second time, unless it asks for another quantity.
            let code = if f.quantity == qty {
                OpCode::Succeeded
            } else {
                OpCode::Conflict
            };
            return self.record(op_id, code, false, reservation_id, 0);
        }
        let qty_i = i64::from(qty);
        if self.available < qty_i {
            // No fence: a later Cancel of this reservation is an empty rollback.
            return self.record(op_id, OpCode::Insufficient, false, reservation_id, 0);
        }
        self.available -= qty_i;
        self.reserved += qty_i;
        self.version += 1;
        self.fences.insert(
            reservation_id,
            Fence {
                phase: FencePhase::Reserved,
                quantity: qty,
                refunded: 0,
            },
        );
        self.record(op_id, OpCode::Succeeded, false, reservation_id, 0)
    }

    /// Confirm: the units still held move `reserved -> sold`, fence RESERVED -> CONFIRMED.
    pub fn confirm(&mut self, op_id: &str, reservation_id: u64) -> OpResult {
        if let Some(first) = self.ops.get(op_id) {
            return OpResult {
                replayed: true,
                ..*first
            };
        }
        let code = match self.fences.get_mut(&reservation_id) {
            Some(f) if f.phase == FencePhase::Reserved => {
                // Partial refunds before the confirm already returned part of the units.
                let held = i64::from(f.held());
                f.phase = FencePhase::Confirmed;
                self.reserved -= held;
                self.sold += held;
                if held > 0 {
                    self.version += 1;
                }
                OpCode::Succeeded
            }
            // Confirmed under another op id (record expired): the units already moved.
            Some(f) if f.phase == FencePhase::Confirmed => OpCode::Succeeded,
            _ => OpCode::Conflict,
        };
        self.record(op_id, code, false, reservation_id, 0)
    }

    /// Cancel (only after `OrderCreatedFailed`): `reserved -> available`, or an empty rollback
    /// that writes the CANCELED fence without adding a unit when the Try never landed.
    pub fn cancel(&mut self, op_id: &str, reservation_id: u64, qty: u32) -> OpResult {
        if let Some(first) = self.ops.get(op_id) {
            return OpResult {
                replayed: true,
                ..*first
            };
        }
        let mut paid = 0;
        let (code, empty_rollback) = match self.fences.get(&reservation_id).copied() {
            None => {
                self.fences.insert(
                    reservation_id,
                    Fence {
                        phase: FencePhase::Canceled,
                        quantity: qty,
                        refunded: 0,
                    },
                );
                (OpCode::Succeeded, true)
            }
            Some(f) if f.phase == FencePhase::Reserved => {
                // The fence, not the caller, knows how much is held.
                let held = i64::from(f.held());
                self.reserved -= held;
                paid = self.release(held);
                if held > 0 {
                    self.version += 1;
                }
                if let Some(fence) = self.fences.get_mut(&reservation_id) {
                    fence.phase = FencePhase::Canceled;
                }
                (OpCode::Succeeded, false)
            }
            Some(f) if f.phase == FencePhase::Canceled => (OpCode::Succeeded, false),
            Some(_) => (OpCode::Conflict, false),
        };
        self.record(op_id, code, empty_rollback, reservation_id, paid)
    }

    /// Refund of `qty` units (all that is left for `OrderCanceled`, part for a
    /// `RefundRequested`): from `reserved` before Confirm, from `sold` after it. The fence
    /// becomes REFUNDED only once every unit is back; until then it keeps its phase.
    pub fn refund(&mut self, op_id: &str, reservation_id: u64, qty: u32) -> OpResult {
        if let Some(first) = self.ops.get(op_id) {
            return OpResult {
                replayed: true,
                ..*first
            };
        }
        if qty == 0 {
            return self.refuse(OpCode::Invalid, reservation_id);
        }
        let mut paid = 0;
        let code = match self.fences.get(&reservation_id).copied() {
            Some(f) if matches!(f.phase, FencePhase::Reserved | FencePhase::Confirmed) => {
                if qty > f.held() {
                    OpCode::OverRefund
                } else {
                    let q = i64::from(qty);
                    if f.phase == FencePhase::Reserved {
                        self.reserved -= q;
                    } else {
                        self.sold -= q;
                    }
                    paid = self.release(q);
                    self.version += 1;
                    if let Some(fence) = self.fences.get_mut(&reservation_id) {
                        fence.refunded += qty;
                        if fence.refunded == fence.quantity {
                            fence.phase = FencePhase::Refunded;
                        }
                    }
                    OpCode::Succeeded
                }
            }
            // Everything is back already: any further unit would be created out of nothing.
            Some(f) if f.phase == FencePhase::Refunded => OpCode::OverRefund,
            _ => OpCode::Conflict,
        };
        self.record(op_id, code, false, reservation_id, paid)
    }

    /// Merchant adjustment (docs/design.md, adjustments and deficit): `total = new_total`,
    /// `available = max(0, total - reserved - sold)`. Units already reserved or sold are
    /// never taken back; what does not fit is recorded as `deficit` for an operator.
    pub fn adjust(&mut self, op_id: &str, new_total: i64) -> OpResult {
        if let Some(first) = self.ops.get(op_id) {
            return OpResult {
                replayed: true,
                ..*first
            };
        }
        if new_total < 0 {
            return self.refuse_adjust();
        }
        let held = self.reserved + self.sold;
        let before = self.stock();
        self.total = new_total;
        self.available = (new_total - held).max(0);
        self.deficit = (held - new_total).max(0);
        if self.stock() != before {
            self.version += 1;
        }
        let result = self.result(OpCode::Succeeded, false, FencePhase::None);
        self.ops.insert(op_id.to_owned(), result);
        result
    }

    /// Returned units pay an outstanding deficit first: the merchant lowered the total below
    /// what was promised, so those units are not sellable again.
    fn release(&mut self, units: i64) -> i64 {
        let absorbed = units.min(self.deficit);
        self.deficit -= absorbed;
        self.available += units - absorbed;
        absorbed
    }

    fn result(&self, code: OpCode, empty_rollback: bool, fence: FencePhase) -> OpResult {
        OpResult {
            code,
            empty_rollback,
            replayed: false,
            created: false,
            after: self.stock(),
            deficit: self.deficit,
            paid: 0,
            version: self.version,
            fence,
        }
    }

    fn record(
        &mut self,
        op_id: &str,
        code: OpCode,
        empty_rollback: bool,
        reservation_id: u64,
        paid: i64,
    ) -> OpResult {
        let result = OpResult {
            paid,
            ..self.result(code, empty_rollback, self.phase(reservation_id))
        };
        self.ops.insert(op_id.to_owned(), result);
        result
    }

    fn refuse(&self, code: OpCode, reservation_id: u64) -> OpResult {
        self.result(code, false, self.phase(reservation_id))
    }

    fn refuse_adjust(&self) -> OpResult {
        self.result(OpCode::Invalid, false, FencePhase::None)
    }
}
