//! The reservation steps (Try, Confirm, Cancel, Refund and the fence-only Cancel), one
//! script call each, and the Trys of one bucket as one call (group commit).

use super::{check_op, check_qty, refused, reply, traced, ExecError, LuaExecutor};
use redis::Value;
use stocksvr_core::bucket::BucketKey;
use stocksvr_core::model::OpResult;

/// One step of a reservation, each its own script over the same three keys (stock hash,
/// fence, op record) and arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// `available -= qty, reserved += qty`, fence RESERVED; refused when the bucket is
    /// missing or not OPEN (`BucketMissing`, `BucketClosed`), the fence is already past
    /// RESERVED (`Fenced`, anti-hanging), or stock is short (`Insufficient`).
    Try { quantity: u32 },
    /// Only from fence RESERVED: what is still held moves from reserved to sold. A second
    /// Confirm with another operation id is a `Conflict` (replays carry the same id).
    Confirm,
    /// From RESERVED the held quantity goes back; with no fence a CANCELED fence of `quantity`
    /// is written and no stock added (empty rollback); CONFIRMED/REFUNDED is a `Conflict`.
    /// Without the stock hash it is `BucketMissing` (the bucket was lost, fences with it)
    /// unless `never_built` says MySQL knows the bucket was never created: then the empty
    /// rollback is written so the Try waiting for the lazy init is fenced.
    Cancel { quantity: u32, never_built: bool },
    /// The empty rollback alone, by the Cancel's script and operation id: fences a Try that
    /// never ran (written even without the stock hash, as `never_built` does), but a RESERVED
    /// fence (another copy of the Try did run) is left as it is and nothing is recorded: the
    /// reply is a `Conflict` with the phase RESERVED, and the reservation's own steps decide.
    /// For a Try that gives up its row: its bucket lost, or its day closed before the bucket
    /// was built.
    FenceTry { quantity: u32 },
    /// From RESERVED (reserved -> available) or CONFIRMED (sold -> available); partial refunds
    /// add up; more than what is left is `OverRefund`.
    Refund { quantity: u32 },
}

impl Step {
    /// The `action` the op record stores, and the metric label.
    pub const fn name(self) -> &'static str {
        match self {
            Step::Try { .. } => "try",
            Step::Confirm => "confirm",
            Step::Cancel { .. } | Step::FenceTry { .. } => "cancel",
            Step::Refund { .. } => "refund",
        }
    }

    fn quantity(self) -> Option<u32> {
        match self {
            Step::Try { quantity }
            | Step::Cancel { quantity, .. }
            | Step::FenceTry { quantity }
            | Step::Refund { quantity } => Some(quantity),
            Step::Confirm => None,
        }
    }
}

impl LuaExecutor {
    /// One reservation step of `reservation_id` in `bucket` under `operation_id`.
    pub async fn step(
        &self,
        bucket: &BucketKey,
        reservation_id: u64,
        operation_id: &str,
        step: Step,
    ) -> Result<OpResult, ExecError> {
        check_op(operation_id)?;
        let script = match step {
            Step::Try { .. } => &self.scripts.try_reserve,
            Step::Confirm => &self.scripts.confirm,
            Step::Cancel { .. } | Step::FenceTry { .. } => &self.scripts.cancel,
            Step::Refund { .. } => &self.scripts.refund,
        };
        let mut args = vec![reservation_id.to_string(), operation_id.to_string()];
        if let Some(quantity) = step.quantity() {
            check_qty(quantity)?;
            args.push(quantity.to_string());
        }
        args.push(self.op_ttl_ms.to_string());
        match step {
            Step::Cancel { never_built, .. } => {
                args.push(if never_built { "1" } else { "" }.to_string());
            }
            Step::FenceTry { .. } => {
                args.push("1".to_string());
                args.push("1".to_string());
            }
            _ => {}
        }
        self.run(
            step.name(),
            script,
            operation_id,
            &[
                bucket.stock_key(),
                bucket.fence_key(reservation_id),
                bucket.op_key(operation_id),
            ],
            &args,
        )
        .await
    }

    /// The Trys of several reservations in one bucket in one call of `try.lua`: each item
    /// runs as its own call would have, in order, with its own operation id and fence, and
    /// gets its own result (group commit, issue 12). A call that failed as a whole tells
    /// every item the same error, so an unknown outcome is retried item by item with the
    /// same operation ids like any other. One item is [`step`](Self::step).
    pub async fn try_group(
        &self,
        bucket: &BucketKey,
        items: &[TryItem],
    ) -> Vec<Result<OpResult, ExecError>> {
        if let [one] = items {
            let step = Step::Try {
                quantity: one.quantity,
            };
            return vec![
                self.step(bucket, one.reservation_id, &one.operation_id, step)
                    .await,
            ];
        }
        let each_fails = |e: ExecError| {
            items
                .iter()
                .map(|i| Err(e.for_operation(&i.operation_id)))
                .collect()
        };
        if items.is_empty() {
            return Vec::new();
        }
        if let Err(e) = items.iter().try_for_each(|i| {
            check_op(&i.operation_id)?;
            check_qty(i.quantity)
        }) {
            return each_fails(e);
        }
        let ttl = self.op_ttl_ms.to_string();
        let mut keys = Vec::with_capacity(1 + 2 * items.len());
        let mut args = Vec::with_capacity(4 * items.len());
        keys.push(bucket.stock_key());
        for item in items {
            keys.push(bucket.fence_key(item.reservation_id));
            keys.push(bucket.op_key(&item.operation_id));
            args.extend([
                item.reservation_id.to_string(),
                item.operation_id.clone(),
                item.quantity.to_string(),
                ttl.clone(),
            ]);
        }
        // Errors of the call as a whole name the first item's operation.
        let first_op = items[0].operation_id.as_str();
        let action = "try";
        let replies = match self
            .invoke(action, &self.scripts.try_reserve, first_op, &keys, &args)
            .await
        {
            Ok(Value::Array(replies)) if replies.len() == items.len() => replies,
            Ok(other) => {
                return each_fails(ExecError::Protocol {
                    operation_id: first_op.to_string(),
                    detail: format!("expected {} replies, got {other:?}", items.len()),
                })
            }
            Err(e) => return each_fails(e),
        };
        // One wait covers every write of the call, replays included.
        if let Err(e) = self.replicated(first_op, &keys[0]).await {
            return each_fails(e);
        }
        items
            .iter()
            .zip(replies)
            .map(|(item, reply)| {
                let op = item.operation_id.as_str();
                let result = match reply::item_error(reply) {
                    Ok(reply) => reply::parse_reply(op, reply)?,
                    Err(e) => return Err(refused(action, ExecError::from_redis(op, e))),
                };
                traced(action, op, &result);
                Ok(result)
            })
            .collect()
    }
}

/// One Try of a [`LuaExecutor::try_group`] call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TryItem {
    pub reservation_id: u64,
    pub operation_id: String,
    pub quantity: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_name_their_script_and_carry_a_quantity_where_it_has_one() {
        assert_eq!(Step::Try { quantity: 2 }.quantity(), Some(2));
        assert_eq!(Step::Confirm.quantity(), None);
        assert_eq!(Step::Refund { quantity: 1 }.name(), "refund");
    }
}
