//! Decoder fuzz of the schedule processor's decode step (0 panics): arbitrary bytes and
//! mutated `schemas/examples` records through the codec (schemas pre-loaded, no registry),
//! then whatever decodes through [`ScheduleProcessor::decode`] and the pure [`decide`] over
//! a parked reservation. A record may be refused, only ever as `Failure::Invalid`.
//! `STOCKSVR_FUZZ_CASES` raises the case count (see `stocksvr_pipeline::codec::fuzz`).

use super::*;
use proptest::test_runner::TestCaseError;
use stocksvr_pipeline::codec::fuzz::{self, Preloaded};

fn step(preloaded: &Preloaded, bytes: &[u8]) -> Result<(), TestCaseError> {
    let Ok(decoded) = preloaded.decode(Some(bytes)) else {
        return Ok(());
    };
    let record = fuzz::record(topics::INVENTORY_SCHEDULE, bytes, decoded);
    match ScheduleProcessor::decode(&record) {
        Ok(data) => {
            // The fixture row, then one that matches the trigger's order and bucket so the
            // due-time parsing and the status branches are reached too.
            let mut row = crate::event::tests::row();
            let _ = decide(&data, &row, Utc::now());
            if let Ok(order_id) = u64::try_from(data.order_id) {
                row.order_id = order_id;
                row.stock_bucket_id = data.stock_bucket_id.clone();
                let _ = decide(&data, &row, Utc::now());
            }
            Ok(())
        }
        Err(Failure::Invalid(_)) => Ok(()),
        Err(other) => Err(TestCaseError::fail(format!("not Invalid: {other:?}"))),
    }
}

#[test]
fn confirm_due_triggers_decode_or_are_invalid_never_panic() {
    fuzz::run_decode_fuzz(step);
}
