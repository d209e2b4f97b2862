//! Builds the outbox rows a completed step commits: one row per step (docs/design.md, the
//! outbox) holding its stock-change event (keyed by bucket, with `redis_version` and absolute
//! after-quantities, for the projector) and what its lifecycle event (keyed by order, for the
//! order domain) adds to it; the relay publishes both. Lifecycle events that stand alone
//! (rejections, conflict reports, stale alerts) and bucket events are rows of their own.
//! Event ids derive from the operation id, so a step can never enqueue two different events
//! for one Redis operation.

use chrono::{SecondsFormat, Utc};
use serde::Serialize;
use stocksvr_core::events::paired::{event_id, LifecycleExtra, StepBody};
use stocksvr_core::events::{
    Envelope, EventData, InventoryCanceledData, InventoryConfirmedData, InventoryOperationDeadData,
    InventoryRefundedData, InventoryRejectedData, InventoryReservedData, ReservationFields,
    StockAction, StockBaselineAdjustedData, StockBucketInitializedData, StockBucketRebuiltData,
    StockBucketRepairedData, StockChangeData, StockNumbers,
};
use stocksvr_core::model::OpResult;
use stocksvr_store::baselines::Baseline;
use stocksvr_store::outbox::NewOutbox;
use stocksvr_store::reservations::Reservation;
use stocksvr_store::wal::WalRow;

pub use stocksvr_core::events::paired::PRODUCER;

fn now_rfc3339() -> String {
    Utc::now().to_rfc3339_opts(SecondsFormat::Millis, true)
}

fn ts(t: chrono::NaiveDateTime) -> String {
    t.and_utc().to_rfc3339_opts(SecondsFormat::Millis, true)
}

fn row<D: EventData + Serialize>(aggregate_id: u64, operation_id: &str, data: D) -> NewOutbox {
    let kind = data.kind();
    let envelope = Envelope::new(
        event_id(operation_id, kind.name()),
        now_rfc3339(),
        PRODUCER,
        None,
        data,
    );
    NewOutbox {
        event_id: envelope.event_id.clone(),
        aggregate_id,
        event_type: kind.name().to_string(),
        topic: kind.topic().to_string(),
        partition_key: envelope.partition_key.clone(),
        // Serializing plain structs of strings and numbers cannot fail.
        payload: serde_json::to_value(&envelope).unwrap_or(serde_json::Value::Null),
        body: None,
    }
}

/// The reservation fields every event about `r` carries, for `quantity` units.
fn reservation_fields(r: &Reservation, quantity: u32) -> ReservationFields {
    ReservationFields {
        order_id: r.order_id as i64,
        order_item_id: r.order_item_id as i64,
        reservation_id: r.id as i64,
        merchant_id: r.merchant_id as i64,
        dish_id: r.dish_id as i64,
        stock_bucket_id: r.stock_bucket_id.clone(),
        stock_date: r.stock_date.to_string(),
        quantity: quantity as i32,
    }
}

/// The Redis step's effect on the bucket, for the ledger (docs/design.md, the fence:
/// what each step moves).
pub struct Deltas {
    pub available: i64,
    pub reserved: i64,
    pub sold: i64,
}

/// A step's stock-change facts: `quantity` units moved by `deltas`, booked at the script's
/// `result`.
#[allow(clippy::too_many_arguments)]
pub fn stock_change_data(
    r: &Reservation,
    action: StockAction,
    operation_id: &str,
    quantity: u32,
    deltas: Deltas,
    result: &OpResult,
    refund_id: Option<&str>,
) -> StockChangeData {
    // The projector's payload stays flat (it decodes every one of these on its hot path);
    // its reservation fields still come from the one conversion.
    let ReservationFields {
        order_id,
        order_item_id,
        reservation_id,
        merchant_id,
        dish_id,
        stock_bucket_id,
        stock_date,
        quantity,
    } = reservation_fields(r, quantity);
    StockChangeData {
        order_id,
        merchant_id,
        dish_id,
        stock_bucket_id,
        stock_date,
        order_type: r.order_type(),
        processing_time: r.processing_time.map(ts),
        reservation_id,
        order_item_id,
        operation_id: operation_id.to_string(),
        action,
        quantity,
        available_delta: deltas.available,
        reserved_delta: deltas.reserved,
        sold_delta: deltas.sold,
        redis_version: result.version as i64,
        after: result.after,
        reason_code: None,
        refund_id: refund_id.map(str::to_string),
        empty_rollback: result.empty_rollback,
    }
}

/// A stock-change event alone in its row, a whole envelope (the Try's stock change a Cancel
/// books first: it has no lifecycle event to carry).
pub fn stock_change(data: StockChangeData) -> NewOutbox {
    let operation_id = data.operation_id.clone();
    row(data.reservation_id as u64, &operation_id, data)
}

/// A step's one row (docs/design.md, one outbox row per reservation step): its stock-change
/// event, whose columns it takes, with a [`StepBody`] payload carrying `extra`, from which the
/// relay rebuilds both envelopes and publishes the step's lifecycle event beside the stock
/// change.
pub fn step(data: StockChangeData, extra: LifecycleExtra) -> NewOutbox {
    let kind = data.kind();
    let body = StepBody {
        occurred_at: now_rfc3339(),
        data,
        lifecycle: extra,
    };
    NewOutbox {
        event_id: event_id(&body.data.operation_id, kind.name()),
        aggregate_id: body.data.reservation_id as u64,
        event_type: kind.name().to_string(),
        topic: kind.topic().to_string(),
        partition_key: body.data.partition_key(),
        // Serializing plain structs of strings and numbers cannot fail.
        payload: without_defaults(serde_json::to_value(&body).unwrap_or_default()),
        body: stored_body(&body),
    }
}

/// A step body as the row stores it: Avro (about 150 bytes against 600 of JSON). Should the
/// body ever not encode (a value its schema cannot hold), the row keeps the JSON payload,
/// which the relay publishes just as well: the step's commit never fails for the row's form.
fn stored_body(body: &StepBody) -> Option<Vec<u8>> {
    match stocksvr_pipeline::step_body::encode(body) {
        Ok(bytes) => Some(bytes),
        Err(error) => {
            tracing::error!(
                operation_id = %body.data.operation_id,
                %error,
                "a step's outbox body does not encode as Avro: stored as JSON instead"
            );
            None
        }
    }
}

/// Leaves the members of the stock change's data that are at their default (null, false) out
/// of a step body: the relay reads them back as such, since each is `#[serde(default)]` in
/// `StockChangeData` (the test `a_step_body_leaves_defaults_out_and_reads_back_whole` holds
/// that). About 75 of a step row's 620 payload bytes.
fn without_defaults(mut body: serde_json::Value) -> serde_json::Value {
    if let Some(data) = body.get_mut("data").and_then(|d| d.as_object_mut()) {
        data.retain(|_, v| !(v.is_null() || *v == serde_json::Value::Bool(false)));
    }
    body
}

/// What a Try's InventoryReserved says beyond its stock change.
pub fn reserved_extra(r: &Reservation) -> LifecycleExtra {
    LifecycleExtra {
        expire_at: Some(ts(r.expire_at)),
        before_confirm: None,
    }
}

/// What a Refund's InventoryRefunded says beyond its stock change.
pub fn refunded_extra(before_confirm: bool) -> LifecycleExtra {
    LifecycleExtra {
        expire_at: None,
        before_confirm: Some(before_confirm),
    }
}

pub fn reserved(r: &Reservation, operation_id: &str) -> NewOutbox {
    row(
        r.id,
        operation_id,
        InventoryReservedData {
            reservation: reservation_fields(r, r.quantity),
            order_type: r.order_type(),
            processing_time: r.processing_time.map(ts),
            expire_at: ts(r.expire_at),
            reason_code: None,
        },
    )
}

pub fn rejected(
    r: &Reservation,
    operation_id: &str,
    reason: &str,
    available: Option<i64>,
) -> NewOutbox {
    row(
        r.id,
        operation_id,
        InventoryRejectedData {
            reservation: reservation_fields(r, r.quantity),
            available,
            reason_code: reason.to_string(),
        },
    )
}

pub fn confirmed(r: &Reservation, operation_id: &str) -> NewOutbox {
    row(
        r.id,
        operation_id,
        InventoryConfirmedData {
            reservation: reservation_fields(r, r.held()),
            order_type: r.order_type(),
            reason_code: None,
        },
    )
}

pub fn canceled(r: &Reservation, operation_id: &str, empty_rollback: bool) -> NewOutbox {
    row(
        r.id,
        operation_id,
        InventoryCanceledData {
            reservation: reservation_fields(r, r.quantity),
            empty_rollback,
            reason_code: empty_rollback.then(|| "EMPTY_ROLLBACK".to_string()),
        },
    )
}

pub fn refunded(
    r: &Reservation,
    operation_id: &str,
    quantity: u32,
    refund_id: Option<&str>,
    before_confirm: bool,
) -> NewOutbox {
    row(
        r.id,
        operation_id,
        InventoryRefundedData {
            reservation: reservation_fields(r, quantity),
            refund_id: refund_id.map(str::to_string),
            before_confirm,
            reason_code: None,
        },
    )
}

/// Recovery gave up on `r`: a person must look. Keyed by the stuck operation, so a repeated
/// verdict enqueues nothing new.
pub fn operation_dead(r: &Reservation, status_name: &str, action: &str) -> NewOutbox {
    row(
        r.id,
        &format!("dead_{}", r.current_operation_id),
        InventoryOperationDeadData {
            reservation_id: Some(r.id as i64),
            operation_id: r.current_operation_id.clone(),
            order_id: Some(r.order_id as i64),
            stock_bucket_id: r.stock_bucket_id.clone(),
            action: action.to_string(),
            stuck_status: status_name.to_string(),
            retry_count: r.retry_count as i32,
            last_error: r.last_error.clone(),
            stuck_since: Some(ts(r.updated_at)),
        },
    )
}

/// A bucket came into being from its baseline (WAL INIT_BUCKET). Keyed by the operation id:
/// one operation announces one initialisation.
pub fn bucket_initialized(
    wal_id: u64,
    operation_id: &str,
    b: &Baseline,
    result: &OpResult,
) -> NewOutbox {
    row(
        wal_id,
        operation_id,
        StockBucketInitializedData {
            operation_id: operation_id.to_string(),
            stock_bucket_id: b.stock_bucket_id.clone(),
            merchant_id: b.merchant_id as i64,
            dish_id: b.dish_id as i64,
            stock_date: b.stock_date.to_string(),
            timezone: b.timezone.clone(),
            baseline_version: b.baseline_version as i64,
            total: result.after.total,
            redis_version: result.version as i64,
            after: result.after,
        },
    )
}

/// What an adjust did to the bucket.
pub struct Adjusted<'a> {
    pub wal_id: u64,
    pub operation_id: &'a str,
    pub baseline: &'a Baseline,
    pub baseline_version: u64,
    pub old_total: i64,
    pub new_total: i64,
    pub available_delta: i64,
    pub result: &'a OpResult,
}

/// A merchant's new total applied (WAL ADJUST); `reason_code` is `DEFICIT` when accepted
/// orders exceed the new total, so the order domain and the merchant see it.
pub fn baseline_adjusted(a: &Adjusted<'_>) -> NewOutbox {
    row(
        a.wal_id,
        a.operation_id,
        StockBaselineAdjustedData {
            operation_id: a.operation_id.to_string(),
            stock_bucket_id: a.baseline.stock_bucket_id.clone(),
            merchant_id: a.baseline.merchant_id as i64,
            dish_id: a.baseline.dish_id as i64,
            stock_date: a.baseline.stock_date.to_string(),
            baseline_version: a.baseline_version as i64,
            old_total: a.old_total,
            new_total: a.new_total,
            available_delta: a.available_delta,
            deficit: a.result.deficit,
            redis_version: a.result.version as i64,
            after: a.result.after,
            reason_code: (a.result.deficit > 0).then(|| "DEFICIT".to_string()),
        },
    )
}

/// What a repair or a rebuild wrote, and what the ledger summed before it.
pub struct Corrected<'a> {
    pub wal_id: u64,
    pub operation_id: &'a str,
    pub baseline: &'a Baseline,
    pub ledger_before: StockNumbers,
    pub result: &'a OpResult,
}

impl Corrected<'_> {
    /// What the ledger books so that its sums equal `after`: after minus its sums before.
    fn deltas(&self) -> [i64; 4] {
        let a = self.result.after;
        let l = self.ledger_before;
        [
            a.total - l.total,
            a.available - l.available,
            a.reserved - l.reserved,
            a.sold - l.sold,
        ]
    }
}

/// A versioned repair applied (WAL REPAIR).
pub fn bucket_repaired(c: &Corrected<'_>, kinds: &[String], before: StockNumbers) -> NewOutbox {
    let [total_delta, available_delta, reserved_delta, sold_delta] = c.deltas();
    row(
        c.wal_id,
        c.operation_id,
        StockBucketRepairedData {
            operation_id: c.operation_id.to_string(),
            stock_bucket_id: c.baseline.stock_bucket_id.clone(),
            merchant_id: c.baseline.merchant_id as i64,
            dish_id: c.baseline.dish_id as i64,
            stock_date: c.baseline.stock_date.to_string(),
            kinds: kinds.to_vec(),
            before,
            ledger_before: c.ledger_before,
            total_delta,
            available_delta,
            reserved_delta,
            sold_delta,
            deficit: c.result.deficit,
            redis_version: c.result.version as i64,
            after: c.result.after,
            reason_code: Some("RECONCILE_REPAIR".into()),
        },
    )
}

/// A lost bucket rebuilt from MySQL (WAL REBUILD).
pub fn bucket_rebuilt(c: &Corrected<'_>, baseline_version: u64, fences_restored: u64) -> NewOutbox {
    let [total_delta, available_delta, reserved_delta, sold_delta] = c.deltas();
    row(
        c.wal_id,
        c.operation_id,
        StockBucketRebuiltData {
            operation_id: c.operation_id.to_string(),
            stock_bucket_id: c.baseline.stock_bucket_id.clone(),
            merchant_id: c.baseline.merchant_id as i64,
            dish_id: c.baseline.dish_id as i64,
            stock_date: c.baseline.stock_date.to_string(),
            baseline_version: baseline_version as i64,
            ledger_before: c.ledger_before,
            total_delta,
            available_delta,
            reserved_delta,
            sold_delta,
            deficit: c.result.deficit,
            redis_version: c.result.version as i64,
            after: c.result.after,
            fences_restored: fences_restored as i64,
            reason_code: Some("REDIS_LOST".into()),
        },
    )
}

/// The WAL worker gave up on a stock operation: a person must look.
pub fn wal_dead(w: &WalRow, action: &str, stuck_status: &str, error: &str) -> NewOutbox {
    row(
        w.id,
        &format!("dead_{}", w.operation_id),
        InventoryOperationDeadData {
            reservation_id: None,
            operation_id: w.operation_id.clone(),
            order_id: None,
            stock_bucket_id: w.stock_bucket_id.clone(),
            action: action.to_string(),
            stuck_status: stuck_status.to_string(),
            retry_count: w.retry_count as i32 + 1,
            last_error: Some(error.to_string()),
            stuck_since: Some(ts(w.created_at)),
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixture::reservation;
    use stocksvr_core::events::{EventKind, StockAfter};
    use stocksvr_core::model::{FencePhase, OpCode};
    use stocksvr_core::reservation::ReservationStatus;

    /// A succeeded step's answer at Redis `version`, leaving the numbers at `after`.
    fn succeeded(after: StockAfter, version: u64) -> OpResult {
        OpResult {
            code: OpCode::Succeeded,
            empty_rollback: false,
            replayed: false,
            created: false,
            after,
            deficit: 0,
            paid: 0,
            version,
            fence: FencePhase::Reserved,
        }
    }

    /// The fields `schemas/<event>.avsc` declares for the event's `data` record.
    fn schema_data_fields(event_type: &str) -> Vec<String> {
        let manifest = std::env::var("CARGO_MANIFEST_DIR")
            .unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").to_string());
        let kind = EventKind::from_name(event_type).expect("a known event");
        let path = format!("{manifest}/../../schemas/{}", kind.schema_file());
        let text = std::fs::read_to_string(&path).expect("the schema");
        let schema: serde_json::Value = serde_json::from_str(&text).expect("schema JSON");
        let fields = |record: &serde_json::Value| -> Vec<serde_json::Value> {
            record["fields"].as_array().cloned().unwrap_or_default()
        };
        let data = fields(&schema)
            .into_iter()
            .find(|f| f["name"] == "data")
            .expect("a data field");
        let mut names: Vec<String> = fields(&data["type"])
            .iter()
            .filter_map(|f| f["name"].as_str().map(str::to_string))
            .collect();
        names.sort();
        names
    }

    #[test]
    fn every_reservation_event_writes_exactly_its_schemas_data_fields() {
        let r = reservation(ReservationStatus::Reserved, "op_x");
        let result = succeeded(
            StockAfter {
                total: 10,
                available: 5,
                reserved: 3,
                sold: 2,
            },
            7,
        );
        let deltas = || Deltas {
            available: -3,
            reserved: 3,
            sold: 0,
        };
        let rows = [
            stock_change(stock_change_data(
                &r,
                StockAction::Try,
                "op_t",
                3,
                deltas(),
                &result,
                None,
            )),
            reserved(&r, "op_t"),
            rejected(&r, "op_t", "INSUFFICIENT_STOCK", Some(2)),
            confirmed(&r, "op_c"),
            canceled(&r, "op_x", true),
            refunded(&r, "op_r", 1, Some("r1"), false),
        ];
        for row in rows {
            let data = row.payload["data"].as_object().expect("a data object");
            let mut written: Vec<String> = data.keys().cloned().collect();
            written.sort();
            assert_eq!(
                written,
                schema_data_fields(&row.event_type),
                "{}",
                row.event_type
            );
            assert_eq!(data["reservation_id"], 100_123_001, "{}", row.event_type);
        }
    }

    #[test]
    fn a_step_body_leaves_defaults_out_and_reads_back_whole() {
        let r = reservation(ReservationStatus::Reserved, "op_x");
        let result = succeeded(
            StockAfter {
                total: 10,
                available: 5,
                reserved: 5,
                sold: 0,
            },
            7,
        );
        let deltas = Deltas {
            available: -3,
            reserved: 3,
            sold: 0,
        };
        // The fixture is an instant order: no processing time, no refund, no reason.
        let data = stock_change_data(&r, StockAction::Try, "op_t", 3, deltas, &result, None);
        let row = step(data.clone(), reserved_extra(&r));
        let written = row.payload["data"].as_object().expect("data");
        for left_out in [
            "processing_time",
            "reason_code",
            "refund_id",
            "empty_rollback",
        ] {
            assert!(!written.contains_key(left_out), "{left_out}");
        }
        let body: StepBody = serde_json::from_value(row.payload.clone()).expect("a step body");
        assert_eq!(body.data, data, "read back whole");
        assert_eq!(body.lifecycle, reserved_extra(&r));
    }
}
