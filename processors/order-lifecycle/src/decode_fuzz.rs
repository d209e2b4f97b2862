//! Decoder fuzz of this processor's decode step (0 panics): arbitrary bytes and mutated
//! `schemas/examples` records through the codec (schemas pre-loaded, no registry), then
//! whatever decodes through [`OrderLifecycle::decode`], the order id check, the parking
//! round trip (`to_json`/`from_json`) and [`plan`]. Each step may refuse a record, only
//! ever as `Failure::Invalid` (a dead letter), never panic or claim an outage.
//! `STOCKSVR_FUZZ_CASES` raises the case count (see `stocksvr_pipeline::codec::fuzz`).

use super::*;
use crate::plan::{plan, Known};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use stocksvr_core::events::OrderType;
use stocksvr_pipeline::codec::fuzz::{self, Preloaded};

fn step(preloaded: &Preloaded, bytes: &[u8]) -> Result<(), TestCaseError> {
    // What the codec refuses never reaches the processor (the loop dead-letters it); the
    // codec's own fuzz test covers that part.
    let Ok(decoded) = preloaded.decode(Some(bytes)) else {
        return Ok(());
    };
    let record = fuzz::record(topics::ORDER_LIFECYCLE, bytes, decoded);
    let event = match OrderLifecycle::decode(&record) {
        Ok(event) => event,
        Err(Failure::Invalid(_)) => return Ok(()),
        Err(other) => return Err(TestCaseError::fail(format!("not Invalid: {other:?}"))),
    };
    match OrderLifecycle::order_id(&event) {
        Ok(_) | Err(Failure::Invalid(_)) => {}
        Err(other) => return Err(TestCaseError::fail(format!("order id: {other:?}"))),
    }
    // A parked event must come back as it went in, or its re-drive applies something else.
    let back = OrderEvent::from_json(event.name(), event.to_json())
        .map_err(|e| TestCaseError::fail(format!("parked event does not decode: {e}")))?;
    prop_assert_eq!(&back, &event);
    // Every reservation the event names belongs to the order, as the plan needs to go on.
    let (merchant, order_type) = match &event {
        OrderEvent::Created(e) => (e.data.merchant_id, e.data.order_type),
        OrderEvent::CreatedFailed(e) => (e.data.merchant_id, OrderType::Instant),
        OrderEvent::Canceled(e) => (e.data.merchant_id, OrderType::Instant),
        OrderEvent::RefundRequested(e) => (e.data.merchant_id, OrderType::Instant),
    };
    let ids: Vec<i64> = match &event {
        OrderEvent::Created(e) => e.data.inventory_reservation_ids.clone(),
        OrderEvent::CreatedFailed(e) => e.data.inventory_reservation_ids.clone(),
        OrderEvent::Canceled(e) => e.data.inventory_reservation_ids.clone(),
        OrderEvent::RefundRequested(e) => e
            .data
            .items
            .iter()
            .map(|i| i.inventory_reservation_id)
            .collect(),
    };
    let known: HashMap<u64, Known> = ids
        .iter()
        .filter_map(|&id| u64::try_from(id).ok())
        .map(|id| {
            let merchant_id = u64::try_from(merchant).unwrap_or(0);
            (
                id,
                Known {
                    merchant_id,
                    order_type,
                },
            )
        })
        .collect();
    let _ = plan(&event, &known);
    let _ = plan(&event, &HashMap::new());
    Ok(())
}

#[test]
fn order_events_decode_or_are_invalid_never_panic() {
    fuzz::run_decode_fuzz(step);
}
