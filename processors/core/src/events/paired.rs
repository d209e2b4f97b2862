//! One outbox row, two events: a completed reservation step writes a single row whose
//! payload is a [`StepBody`] (its stock-change facts and the few its lifecycle event has
//! beyond them); the relay publishes both events from that row (docs/design.md, one outbox
//! row per reservation step).
//!
//! Both events were always built from the same reservation and step, so the lifecycle event
//! is a pure function of the stock-change event plus [`LifecycleExtra`], and both envelopes
//! are the row's columns plus constants: the writer keeps nothing twice, and the relay
//! rebuilds exactly the events the step used to write as two rows, event ids included, so
//! consumers' dedupe is unchanged.

use serde::{Deserialize, Serialize};

use super::{
    EventData, EventKind, InventoryCanceledData, InventoryConfirmedData, InventoryRefundedData,
    InventoryReservedData, ReservationFields, StockAction, StockChangeData,
};
use crate::events::Envelope;

/// The member of a stock-change row's payload that makes it a [`StepBody`]. A stock-change
/// payload without it is one whole envelope, as rows written before one row per step were
/// (and the Try's stock change a Cancel books first, which has no lifecycle event).
pub const LIFECYCLE_MEMBER: &str = "lifecycle";

/// The `producer` of every event stocksvr writes.
pub const PRODUCER: &str = "stocksvr";

/// The payload of a step's row: only what the two envelopes cannot take from the row. Its
/// `event_id` (the stock change's), `event_type` and `partition_key` (the bucket) are the
/// row's columns, `schema_version` follows from the event, `producer` is [`PRODUCER`] and
/// there is no `trace_id`, as for every event a step writes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepBody {
    pub occurred_at: String,
    pub data: StockChangeData,
    pub lifecycle: LifecycleExtra,
}

impl StepBody {
    /// Both events of the row whose `event_id` column is `event_id`: its stock change, then
    /// its lifecycle event.
    pub fn events(self, event_id: &str) -> Result<(Envelope<StockChangeData>, Lifecycle), String> {
        let stock_change = Envelope::new(event_id, self.occurred_at, PRODUCER, None, self.data);
        let lifecycle = lifecycle_of(&stock_change, &self.lifecycle)?;
        Ok((stock_change, lifecycle))
    }
}

/// What a step's lifecycle event says beyond its stock-change event: the rest follows from it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LifecycleExtra {
    /// A Try's: when the RESERVED reservation counts as stale.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expire_at: Option<String>,
    /// A Refund's: a scheduled order refunded before its confirm returned reserved units.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before_confirm: Option<bool>,
}

/// An event's id: `<operation_id>:<event type>`. `inventory_outbox.event_id` is 64
/// characters, so a longer id (long merchant, dish or refund ids) keeps a readable prefix and
/// ends in a hash of the whole id, still deterministic, so it can never be truncated into
/// another event's id. The writer and the relay both derive ids here.
pub fn event_id(operation_id: &str, kind: &str) -> String {
    let id = format!("{operation_id}:{kind}");
    if id.len() <= 64 {
        return id;
    }
    let hash = crate::ids::fnv1a64(id.as_bytes());
    let mut cut = 47;
    while !id.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}~{hash:016x}", &id[..cut])
}

/// A lifecycle event rebuilt from a row: serialized, the envelope the step used to write
/// into a row of its own.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum Lifecycle {
    Reserved(Envelope<InventoryReservedData>),
    Confirmed(Envelope<InventoryConfirmedData>),
    Canceled(Envelope<InventoryCanceledData>),
    Refunded(Envelope<InventoryRefundedData>),
}

impl Lifecycle {
    pub fn kind(&self) -> EventKind {
        match self {
            Lifecycle::Reserved(e) => e.kind(),
            Lifecycle::Confirmed(e) => e.kind(),
            Lifecycle::Canceled(e) => e.kind(),
            Lifecycle::Refunded(e) => e.kind(),
        }
    }

    pub fn event_id(&self) -> &str {
        match self {
            Lifecycle::Reserved(e) => &e.event_id,
            Lifecycle::Confirmed(e) => &e.event_id,
            Lifecycle::Canceled(e) => &e.event_id,
            Lifecycle::Refunded(e) => &e.event_id,
        }
    }

    /// The Kafka key: the order id.
    pub fn partition_key(&self) -> &str {
        match self {
            Lifecycle::Reserved(e) => &e.partition_key,
            Lifecycle::Confirmed(e) => &e.partition_key,
            Lifecycle::Canceled(e) => &e.partition_key,
            Lifecycle::Refunded(e) => &e.partition_key,
        }
    }
}

/// The lifecycle event of the step `stock_change` booked, with `extra`. `Err` says why the
/// row cannot carry one (a Try without `expire_at`, a Refund without `before_confirm`).
pub fn lifecycle_of(
    stock_change: &Envelope<StockChangeData>,
    extra: &LifecycleExtra,
) -> Result<Lifecycle, String> {
    let s = &stock_change.data;
    let reservation = ReservationFields {
        order_id: s.order_id,
        order_item_id: s.order_item_id,
        reservation_id: s.reservation_id,
        merchant_id: s.merchant_id,
        dish_id: s.dish_id,
        stock_bucket_id: s.stock_bucket_id.clone(),
        stock_date: s.stock_date.clone(),
        quantity: s.quantity,
    };
    let missing = |what: &str| format!("a {:?} stock change row without {what}", s.action);
    match s.action {
        StockAction::Try => Ok(Lifecycle::Reserved(envelope(
            stock_change,
            InventoryReservedData {
                reservation,
                order_type: s.order_type,
                processing_time: s.processing_time.clone(),
                expire_at: extra
                    .expire_at
                    .clone()
                    .ok_or_else(|| missing("expire_at"))?,
                reason_code: None,
            },
        ))),
        StockAction::Confirm => Ok(Lifecycle::Confirmed(envelope(
            stock_change,
            InventoryConfirmedData {
                reservation,
                order_type: s.order_type,
                reason_code: None,
            },
        ))),
        StockAction::Cancel => Ok(Lifecycle::Canceled(envelope(
            stock_change,
            InventoryCanceledData {
                reservation,
                empty_rollback: s.empty_rollback,
                reason_code: s.empty_rollback.then(|| "EMPTY_ROLLBACK".to_string()),
            },
        ))),
        StockAction::Refund => Ok(Lifecycle::Refunded(envelope(
            stock_change,
            InventoryRefundedData {
                reservation,
                refund_id: s.refund_id.clone(),
                before_confirm: extra
                    .before_confirm
                    .ok_or_else(|| missing("before_confirm"))?,
                reason_code: None,
            },
        ))),
    }
}

fn envelope<D: EventData>(stock_change: &Envelope<StockChangeData>, data: D) -> Envelope<D> {
    let kind = data.kind();
    Envelope::new(
        event_id(&stock_change.data.operation_id, kind.name()),
        stock_change.occurred_at.clone(),
        stock_change.producer.clone(),
        stock_change.trace_id.clone(),
        data,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_ids_fit_the_column_and_stay_distinct() {
        assert_eq!(
            event_id("op_try_1", "InventoryReserved"),
            "op_try_1:InventoryReserved"
        );
        let a = event_id(
            "dead_op_adjust_123456789012_123456789012_20261129_v12",
            "InventoryOperationDead",
        );
        let b = event_id(
            "dead_op_adjust_123456789012_123456789012_20261129_v13",
            "InventoryOperationDead",
        );
        assert_eq!((a.len(), b.len()), (64, 64));
        assert_ne!(a, b);
        assert_eq!(
            a,
            event_id(
                "dead_op_adjust_123456789012_123456789012_20261129_v12",
                "InventoryOperationDead"
            )
        );
    }

    fn stock_change(action: StockAction) -> Envelope<StockChangeData> {
        Envelope::new(
            "x",
            "2026-12-07T10:00:00.000Z",
            "stocksvr",
            None,
            StockChangeData {
                order_id: 11,
                merchant_id: 1,
                dish_id: 2,
                stock_bucket_id: "bucket_1_2_20261207".into(),
                stock_date: "2026-12-07".into(),
                order_type: crate::events::OrderType::Instant,
                processing_time: None,
                reservation_id: 5,
                order_item_id: 12,
                operation_id: "op_1".into(),
                action,
                quantity: 3,
                available_delta: 0,
                reserved_delta: 0,
                sold_delta: 0,
                redis_version: 1,
                after: crate::events::StockAfter {
                    total: 3,
                    available: 0,
                    reserved: 3,
                    sold: 0,
                },
                reason_code: None,
                refund_id: None,
                empty_rollback: false,
            },
        )
    }

    /// `stocksvr_store::outbox::LIFECYCLE_EVENT_TYPE` names a row's lifecycle event by this
    /// rule, and keys and ids follow the order and the operation.
    #[test]
    fn a_steps_lifecycle_event_is_its_stock_change_type_without_redis() {
        let extra = LifecycleExtra {
            expire_at: Some("2026-12-07T10:15:00.000Z".into()),
            before_confirm: Some(false),
        };
        for action in [
            StockAction::Try,
            StockAction::Confirm,
            StockAction::Cancel,
            StockAction::Refund,
        ] {
            let sc = stock_change(action);
            let l = lifecycle_of(&sc, &extra).expect("a lifecycle event");
            assert_eq!(l.kind().name(), sc.kind().name().replace("Redis", ""));
            assert_eq!(l.event_id(), format!("op_1:{}", l.kind().name()));
            assert_eq!(l.partition_key(), "11");
        }
        assert!(lifecycle_of(&stock_change(StockAction::Try), &LifecycleExtra::default()).is_err());
        assert!(lifecycle_of(
            &stock_change(StockAction::Refund),
            &LifecycleExtra::default()
        )
        .is_err());
    }

    #[test]
    fn the_extra_is_omitted_when_empty_and_read_back() {
        let extra = LifecycleExtra::default();
        assert_eq!(serde_json::to_string(&extra).ok().as_deref(), Some("{}"));
        let back: LifecycleExtra =
            serde_json::from_str(r#"{"before_confirm":true}"#).unwrap_or_default();
        assert_eq!(back.before_confirm, Some(true));
    }
}
