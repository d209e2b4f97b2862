//! Every `schemas/examples/*.json` through the decode step of each processor that reads its
//! topic: order events through order-lifecycle, due confirms through the schedule processor,
//! stock changes through the projector. An example a processor refused would be a contract
//! the service documents but does not accept. Topics stocksvr only produces (the inventory
//! lifecycle for the order domain) have no processor here and are counted apart.

use std::collections::BTreeMap;
use stocksvr_core::events::topics;
use stocksvr_core::events::EventKind;
use stocksvr_pipeline::codec::fuzz::{self, Preloaded};

#[test]
fn every_example_passes_each_processor_that_reads_it() {
    let preloaded = Preloaded::embedded();
    let mut by_topic: BTreeMap<&'static str, usize> = BTreeMap::new();
    for example in fuzz::examples(&preloaded) {
        let kind = EventKind::from_full_name(&example.full_name)
            .unwrap_or_else(|| panic!("{}: unknown event {}", example.file, example.full_name));
        let decoded = preloaded
            .decode(Some(&example.framed))
            .unwrap_or_else(|e| panic!("{}: {e}", example.file));
        let record = fuzz::record(kind.topic(), &example.framed, decoded.clone());
        let outcome = match kind.topic() {
            topics::ORDER_LIFECYCLE => stocksvr_order_lifecycle::OrderLifecycle::decode(&record)
                .map(|_| ())
                .map_err(|e| format!("{e:?}")),
            topics::INVENTORY_SCHEDULE => stocksvr_schedule::ScheduleProcessor::decode(&record)
                .map(|_| ())
                .map_err(|e| format!("{e:?}")),
            topics::STOCK_CHANGE => stocksvr_projector::decide::decide(&decoded)
                .map(|_| ())
                .map_err(|e| e.to_string()),
            _ => Ok(()),
        };
        outcome.unwrap_or_else(|e| panic!("{}: refused by its processor: {e}", example.file));
        *by_topic.entry(kind.topic()).or_default() += 1;
    }
    for consumed in [
        topics::ORDER_LIFECYCLE,
        topics::INVENTORY_SCHEDULE,
        topics::STOCK_CHANGE,
    ] {
        assert!(
            by_topic.get(consumed).copied().unwrap_or(0) > 0,
            "no example of {consumed}: {by_topic:?}"
        );
    }
    eprintln!("examples by topic: {by_topic:?}");
}
