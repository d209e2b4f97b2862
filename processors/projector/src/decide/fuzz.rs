//! Decoder fuzz of the projector's decode step (0 panics): arbitrary bytes and mutated
//! `schemas/examples` records through the codec (schemas pre-loaded, no registry), then
//! whatever decodes through [`decide`]. A record is either refused as an [`InvalidEvent`]
//! (a dead letter) or becomes rows MySQL accepts: ids within their VARCHAR(64), no negative
//! quantity, every value in its column. `STOCKSVR_FUZZ_CASES` raises the case count (see
//! `stocksvr_pipeline::codec::fuzz`).

use super::*;
use proptest::prop_assert;
use proptest::test_runner::TestCaseError;
use stocksvr_pipeline::codec::fuzz::{self, Preloaded};

fn id_fits(id: &str) -> bool {
    !id.is_empty() && id.chars().count() <= MAX_ID_LEN
}

fn step(preloaded: &Preloaded, bytes: &[u8]) -> Result<(), TestCaseError> {
    let Ok(decoded) = preloaded.decode(Some(bytes)) else {
        return Ok(());
    };
    let Ok(p) = decide(&decoded) else {
        return Ok(());
    };
    prop_assert!(id_fits(&p.event_id), "event_id {:?}", p.event_id);
    prop_assert!(id_fits(&p.ledger.operation_id), "{:?}", p.ledger);
    prop_assert!(id_fits(&p.ledger.stock_bucket_id), "{:?}", p.ledger);
    if let Some(s) = &p.snapshot {
        let a = s.after;
        prop_assert!(
            a.total >= 0 && a.available >= 0 && a.reserved >= 0 && a.sold >= 0,
            "{s:?}"
        );
        prop_assert!(s.deficit.is_none_or(|d| d >= 0), "{s:?}");
        prop_assert!(s.redis_version > 0, "{s:?}");
    }
    Ok(())
}

#[test]
fn stock_changes_decide_or_are_invalid_never_panic() {
    fuzz::run_decode_fuzz(step);
}
