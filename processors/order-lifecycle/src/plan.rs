//! The pure part: which reservation operations an order event asks for, after checking the
//! event's reservation ids against the order's reservations.

use std::collections::HashMap;
use stocksvr_core::events::{
    Envelope, OrderCanceledData, OrderCreatedData, OrderCreatedFailedData, OrderType,
    RefundRequestedData,
};

/// A decoded order event.
#[derive(Debug, Clone, PartialEq)]
pub enum OrderEvent {
    Created(Envelope<OrderCreatedData>),
    CreatedFailed(Envelope<OrderCreatedFailedData>),
    Canceled(Envelope<OrderCanceledData>),
    RefundRequested(Envelope<RefundRequestedData>),
}

impl OrderEvent {
    /// The record name's last part (`OrderCreated`, ...).
    pub fn name(&self) -> &'static str {
        match self {
            OrderEvent::Created(_) => "OrderCreated",
            OrderEvent::CreatedFailed(_) => "OrderCreatedFailed",
            OrderEvent::Canceled(_) => "OrderCanceled",
            OrderEvent::RefundRequested(_) => "RefundRequested",
        }
    }

    /// The event as JSON, for parking it until it can apply.
    pub fn to_json(&self) -> serde_json::Value {
        let value = match self {
            OrderEvent::Created(e) => serde_json::to_value(e),
            OrderEvent::CreatedFailed(e) => serde_json::to_value(e),
            OrderEvent::Canceled(e) => serde_json::to_value(e),
            OrderEvent::RefundRequested(e) => serde_json::to_value(e),
        };
        // Plain structs of strings and numbers always serialize.
        value.unwrap_or(serde_json::Value::Null)
    }

    /// A parked event back from its name and JSON.
    pub fn from_json(name: &str, value: serde_json::Value) -> Result<Self, String> {
        let e = |e: serde_json::Error| format!("parked {name} does not decode: {e}");
        Ok(match name {
            "OrderCreated" => OrderEvent::Created(serde_json::from_value(value).map_err(e)?),
            "OrderCreatedFailed" => {
                OrderEvent::CreatedFailed(serde_json::from_value(value).map_err(e)?)
            }
            "OrderCanceled" => OrderEvent::Canceled(serde_json::from_value(value).map_err(e)?),
            "RefundRequested" => {
                OrderEvent::RefundRequested(serde_json::from_value(value).map_err(e)?)
            }
            other => return Err(format!("{other} is not an order event")),
        })
    }

    pub fn event_id(&self) -> &str {
        match self {
            OrderEvent::Created(e) => &e.event_id,
            OrderEvent::CreatedFailed(e) => &e.event_id,
            OrderEvent::Canceled(e) => &e.event_id,
            OrderEvent::RefundRequested(e) => &e.event_id,
        }
    }

    pub fn order_id(&self) -> i64 {
        match self {
            OrderEvent::Created(e) => e.data.order_id,
            OrderEvent::CreatedFailed(e) => e.data.order_id,
            OrderEvent::Canceled(e) => e.data.order_id,
            OrderEvent::RefundRequested(e) => e.data.order_id,
        }
    }
}

/// One reservation operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Confirm,
    MarkCreated,
    Cancel,
    Refund {
        refund_id: Option<String>,
        quantity: Option<u32>,
    },
}

impl Op {
    pub fn name(&self) -> &'static str {
        match self {
            Op::Confirm => "CONFIRM",
            Op::MarkCreated => "MARK_CREATED",
            Op::Cancel => "CANCEL",
            Op::Refund { .. } => "REFUND",
        }
    }
}

/// What MySQL knows of one reservation of the order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Known {
    pub merchant_id: u64,
    pub order_type: OrderType,
}

/// Turns an event into operations, or a reason to dead-letter it.
///
/// Every reservation id the event names must belong to the order (and merchant, and order
/// type): an id that does not is a producer bug or a mix-up between orders, and applying
/// it could move another order's stock. OrderCreatedFailed cancels every reservation of the
/// order, listed or not, including PREPARING ones, so a Try still in flight is fenced.
pub fn plan(
    event: &OrderEvent,
    reservations: &HashMap<u64, Known>,
) -> Result<Vec<(u64, Op)>, String> {
    let listed = listed(event, reservations)?;
    match event {
        OrderEvent::Created(e) => created(e, &listed),
        OrderEvent::CreatedFailed(_) => {
            let mut all: Vec<u64> = reservations.keys().copied().collect();
            all.sort_unstable();
            Ok(all.into_iter().map(|id| (id, Op::Cancel)).collect())
        }
        OrderEvent::Canceled(_) => Ok(listed
            .into_iter()
            .map(|(id, _)| {
                (
                    id,
                    Op::Refund {
                        refund_id: None,
                        quantity: None,
                    },
                )
            })
            .collect()),
        OrderEvent::RefundRequested(e) => refund_requested(e),
    }
}

/// The reservations the event names, each checked to belong to the order and its merchant.
fn listed(
    event: &OrderEvent,
    reservations: &HashMap<u64, Known>,
) -> Result<Vec<(u64, Known)>, String> {
    let (merchant_id, listed): (i64, Vec<i64>) = match event {
        OrderEvent::Created(e) => (e.data.merchant_id, e.data.inventory_reservation_ids.clone()),
        OrderEvent::CreatedFailed(e) => {
            (e.data.merchant_id, e.data.inventory_reservation_ids.clone())
        }
        OrderEvent::Canceled(e) => (e.data.merchant_id, e.data.inventory_reservation_ids.clone()),
        OrderEvent::RefundRequested(e) => (
            e.data.merchant_id,
            e.data
                .items
                .iter()
                .map(|i| i.inventory_reservation_id)
                .collect(),
        ),
    };
    let order_id = event.order_id();
    let mut ids = Vec::with_capacity(listed.len());
    for raw in listed {
        let id =
            u64::try_from(raw).map_err(|_| format!("reservation id {raw} is not a valid id"))?;
        let known = reservations
            .get(&id)
            .ok_or_else(|| format!("reservation {id} does not belong to order {order_id}"))?;
        if i64::try_from(known.merchant_id).ok() != Some(merchant_id) {
            return Err(format!(
                "reservation {id} belongs to merchant {} but the event names merchant {merchant_id}",
                known.merchant_id
            ));
        }
        ids.push((id, *known));
    }
    Ok(ids)
}

/// OrderCreated confirms an instant order's reservations and parks a scheduled one's; each
/// must have been reserved as the order type the event says.
fn created(
    e: &Envelope<OrderCreatedData>,
    listed: &[(u64, Known)],
) -> Result<Vec<(u64, Op)>, String> {
    if listed.is_empty() {
        return Err(format!(
            "OrderCreated for order {} names no reservation",
            e.data.order_id
        ));
    }
    listed
        .iter()
        .map(|(id, known)| {
            if known.order_type != e.data.order_type {
                return Err(format!(
                    "reservation {id} was reserved as {} but OrderCreated says {}",
                    known.order_type, e.data.order_type
                ));
            }
            Ok((
                *id,
                match e.data.order_type {
                    OrderType::Instant => Op::Confirm,
                    OrderType::Scheduled => Op::MarkCreated,
                },
            ))
        })
        .collect()
}

/// RefundRequested refunds each item's quantity under the request's refund id.
fn refund_requested(e: &Envelope<RefundRequestedData>) -> Result<Vec<(u64, Op)>, String> {
    if e.data.refund_id.is_empty() {
        return Err("RefundRequested has an empty refund_id".into());
    }
    e.data
        .items
        .iter()
        .map(|item| {
            let quantity = u32::try_from(item.quantity)
                .ok()
                .filter(|q| *q > 0)
                .ok_or_else(|| format!("refund quantity {} must be positive", item.quantity))?;
            Ok((
                item.inventory_reservation_id as u64,
                Op::Refund {
                    // One refund id covers several items; each reservation is its own
                    // refund, so the key is per (refund, reservation) by construction.
                    refund_id: Some(e.data.refund_id.clone()),
                    quantity: Some(quantity),
                },
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use stocksvr_core::events::RefundItem;

    fn env<D>(data: D) -> Envelope<D> {
        Envelope {
            event_id: "e1".into(),
            event_type: "X".into(),
            schema_version: 1,
            occurred_at: "2026-07-25T20:30:00.000+08:00".into(),
            producer: "order-service".into(),
            trace_id: None,
            partition_key: "1".into(),
            data,
        }
    }

    fn known(pairs: &[(u64, OrderType)]) -> HashMap<u64, Known> {
        pairs
            .iter()
            .map(|(id, t)| {
                (
                    *id,
                    Known {
                        merchant_id: 10,
                        order_type: *t,
                    },
                )
            })
            .collect()
    }

    fn created(ids: Vec<i64>, order_type: OrderType) -> OrderEvent {
        OrderEvent::Created(env(OrderCreatedData {
            order_id: 1,
            merchant_id: 10,
            order_type,
            processing_time: None,
            inventory_reservation_ids: ids,
        }))
    }

    #[test]
    fn instant_orders_confirm_and_scheduled_ones_are_marked_created() {
        let r = known(&[(5, OrderType::Instant), (6, OrderType::Instant)]);
        assert_eq!(
            plan(&created(vec![5, 6], OrderType::Instant), &r),
            Ok(vec![(5, Op::Confirm), (6, Op::Confirm)])
        );
        let s = known(&[(7, OrderType::Scheduled)]);
        assert_eq!(
            plan(&created(vec![7], OrderType::Scheduled), &s),
            Ok(vec![(7, Op::MarkCreated)])
        );
    }

    #[test]
    fn ids_that_do_not_match_the_order_are_refused() {
        let r = known(&[(5, OrderType::Instant)]);
        let err = plan(&created(vec![5, 99], OrderType::Instant), &r).unwrap_err();
        assert!(err.contains("99 does not belong to order 1"), "{err}");
        assert!(plan(&created(vec![], OrderType::Instant), &r).is_err());
        assert!(plan(&created(vec![-3], OrderType::Instant), &r).is_err());
        let err = plan(&created(vec![5], OrderType::Scheduled), &r).unwrap_err();
        assert!(err.contains("reserved as INSTANT"), "{err}");
        let mut other_merchant = r.clone();
        other_merchant.insert(
            5,
            Known {
                merchant_id: 11,
                order_type: OrderType::Instant,
            },
        );
        assert!(plan(&created(vec![5], OrderType::Instant), &other_merchant).is_err());
    }

    #[test]
    fn created_failed_cancels_every_reservation_of_the_order() {
        let r = known(&[(5, OrderType::Instant), (6, OrderType::Instant)]);
        let event = OrderEvent::CreatedFailed(env(OrderCreatedFailedData {
            order_id: 1,
            merchant_id: 10,
            inventory_reservation_ids: vec![],
            reason: None,
        }));
        assert_eq!(plan(&event, &r), Ok(vec![(5, Op::Cancel), (6, Op::Cancel)]));
    }

    #[test]
    fn order_canceled_refunds_in_full_and_refund_requested_in_part() {
        let r = known(&[(5, OrderType::Instant)]);
        let canceled = OrderEvent::Canceled(env(OrderCanceledData {
            order_id: 1,
            merchant_id: 10,
            inventory_reservation_ids: vec![5],
            reason: None,
        }));
        assert_eq!(
            plan(&canceled, &r),
            Ok(vec![(
                5,
                Op::Refund {
                    refund_id: None,
                    quantity: None
                }
            )])
        );
        let refund = |quantity| {
            OrderEvent::RefundRequested(env(RefundRequestedData {
                order_id: 1,
                merchant_id: 10,
                refund_id: "rf-1".into(),
                items: vec![RefundItem {
                    inventory_reservation_id: 5,
                    quantity,
                }],
                reason: None,
            }))
        };
        assert_eq!(
            plan(&refund(2), &r),
            Ok(vec![(
                5,
                Op::Refund {
                    refund_id: Some("rf-1".into()),
                    quantity: Some(2)
                }
            )])
        );
        assert!(plan(&refund(0), &r).is_err());
    }
}
