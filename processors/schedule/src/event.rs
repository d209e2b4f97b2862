//! The InventoryConfirmDue outbox row the wheel emits.

use chrono::{DateTime, SecondsFormat, Utc};
use stocksvr_core::events::{Envelope, EventData, InventoryConfirmDueData};
use stocksvr_store::outbox::NewOutbox;
use stocksvr_store::reservations::Reservation;

/// RFC 3339 with milliseconds, as every stocksvr event writes times.
pub fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// The due trigger of `row`, or None when the row has no processing_time (not scheduled).
///
/// Everything in it follows from the row: the event id is `due_<id>_<due ms>:InventoryConfirmDue`
/// and `occurred_at` is the due time, so however often the entry is claimed (a claimant that
/// died, a re-armed entry) the outbox holds one row and Kafka gets one event per due time.
pub fn confirm_due(row: &Reservation) -> Option<NewOutbox> {
    let due = row.processing_time?.and_utc();
    let data = InventoryConfirmDueData {
        reservation_id: row.id as i64,
        order_id: row.order_id as i64,
        stock_bucket_id: row.stock_bucket_id.clone(),
        processing_time: rfc3339(due),
    };
    let kind = data.kind();
    let operation_id = format!("due_{}_{}", row.id, due.timestamp_millis());
    let envelope = Envelope::new(
        format!("{operation_id}:{}", kind.name()),
        rfc3339(due),
        crate::PRODUCER,
        None,
        data,
    );
    Some(NewOutbox {
        event_id: envelope.event_id.clone(),
        aggregate_id: row.id,
        event_type: kind.name().to_string(),
        topic: kind.topic().to_string(),
        partition_key: envelope.partition_key.clone(),
        // Serializing a plain struct of strings and numbers cannot fail.
        payload: serde_json::to_value(&envelope).unwrap_or(serde_json::Value::Null),
        body: None,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use chrono::NaiveDate;
    use stocksvr_core::codes::SyncStatus;
    use stocksvr_core::reservation::ReservationStatus;

    /// A scheduled CREATED_RESERVED row due at 2026-11-29 12:00:00.250 UTC.
    pub(crate) fn row() -> Reservation {
        let at = |h, m, s, ms| {
            NaiveDate::from_ymd_opt(2026, 11, 29)
                .and_then(|d| d.and_hms_milli_opt(h, m, s, ms))
                .expect("valid time")
        };
        Reservation {
            id: 7_000_001,
            order_id: 42,
            order_item_id: 420,
            merchant_id: 5,
            dish_id: 6,
            stock_bucket_id: "bucket_5_6_20261129".into(),
            stock_date: NaiveDate::from_ymd_opt(2026, 11, 29).expect("date"),
            quantity: 2,
            refunded_quantity: 0,
            pending_quantity: 0,
            order_type: crate::store::SCHEDULED,
            processing_time: Some(at(12, 0, 0, 250)),
            expire_at: at(12, 30, 0, 0),
            status: ReservationStatus::CreatedReserved.code() as i8,
            resume_status: None,
            reject_reason: None,
            current_operation_id: "op_try_7000001".into(),
            retry_count: 0,
            next_retry_at: at(11, 0, 0, 0),
            last_error: None,
            sync_status: SyncStatus::Synced.code() as i8,
            expected_redis_version: None,
            synced_redis_version: 0,
            version: 2,
            created_at: at(11, 0, 0, 0),
            updated_at: at(11, 0, 0, 0),
            stale_alerted_at: None,
            dead: 0,
            reached: 0,
        }
    }

    #[test]
    fn the_trigger_is_deterministic_and_keyed_by_order() {
        let a = confirm_due(&row()).expect("scheduled");
        let b = confirm_due(&row()).expect("scheduled");
        assert_eq!(a.event_id, "due_7000001_1795953600250:InventoryConfirmDue");
        assert_eq!(
            a.payload, b.payload,
            "a repeated claim writes the same event"
        );
        assert_eq!(a.topic, "inventory.schedule.v1");
        assert_eq!(a.partition_key, "42");
        assert_eq!(
            a.payload["data"]["processing_time"],
            "2026-11-29T12:00:00.250Z"
        );
        assert_eq!(a.payload["data"]["reservation_id"], 7_000_001);
        let envelope: Envelope<InventoryConfirmDueData> =
            serde_json::from_value(a.payload).expect("an envelope");
        envelope
            .check("io.stocksvr.schedule.InventoryConfirmDue")
            .expect("consistent envelope");
    }

    #[test]
    fn an_instant_row_has_no_trigger() {
        let mut r = row();
        r.processing_time = None;
        assert!(confirm_due(&r).is_none());
    }
}
