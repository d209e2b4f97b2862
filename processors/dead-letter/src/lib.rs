//! dead-letter processor: consumes every dead-letter topic (`<topic>.dlt`, derived from
//! topics.yaml) and parks each record in `inventory_dead_letter` with its original key and
//! bytes, its origin and its error, read from the `stocksvr.dlt.*` headers. An operator then
//! lists, shows, replays or discards it with `stocksvr dlq ...` or `/admin/dlq/...`.
//!
//! Delivery: at-least-once in, parked once. The shared loop (in raw mode: a dead letter is
//! usually not decodable) stores an offset only after its batch's transaction committed; a
//! redelivered dead letter meets the unique key (dlt_topic, dlt_partition, dlt_offset) and
//! `INSERT IGNORE` keeps the first row. A database outage is retried in place for as long as
//! it lasts: a dead letter of a dead letter would land on a topic nobody reads, so this
//! processor never gives a record up (a shutdown meanwhile ends it uncommitted, and the
//! batch is delivered again). Bad headers never fail a record either: what can be read is
//! stored, the rest falls back (error class `unknown`).
//!
//! Replay: produces the stored key and bytes to the original topic and partition, then marks
//! the row replayed, only after the broker acknowledged the record. A crash between the two
//! leaves the row as it was, so a second replay may produce the record twice; downstream
//! processors apply an event once (inbox on event_id, CAS on the reservation state machine),
//! so a replayed record that now succeeds is applied once.

mod admin;
mod cli;
mod gauge;
mod origin;
mod park;
mod preview;
mod replay;
mod store;

pub use admin::{admin_routes, AdminState};
pub use cli::{run_cli, DlqAction, StatusArg};
pub use gauge::{refresh_parked, run_gauge, GAUGE_INTERVAL};
pub use origin::{parse_dead_letter, NewParked, KEY_MAX_BYTES, NOT_STORED_MARKER, VALUE_MAX_BYTES};
pub use park::{park_batch, Parker};
pub use preview::hex_preview;
pub use replay::{replay, replay_producer, ReplayOutcome, REPLAY_OF_HEADER};
pub use store::{
    discard, list, show, DiscardOutcome, DlqError, Filter, Parked, ParkedSummary, Status,
    MAX_LIST_LIMIT,
};

use stocksvr_pipeline::config::KafkaSettings;
use stocksvr_pipeline::consumer::LoopConfig;
use stocksvr_pipeline::topics::{self, TopicSpec, TopicsError};

/// Processor name: metrics label, client id and consumer group suffix.
pub const NAME: &str = "dead-letter";

/// The loop over every dead-letter topic among `topics`.
pub fn loop_config(topics: &[TopicSpec]) -> LoopConfig {
    let dead_letter_topics = topics
        .iter()
        .filter(|t| t.dead_letter_of.is_some())
        .map(|t| t.name.clone())
        .collect();
    let mut config = LoopConfig::new(NAME, dead_letter_topics);
    // Dead letters are stored as bytes; decoding them is what failed in the first place.
    config.raw = true;
    // One transaction per batch: parking is a row insert, cheap to group.
    config.max_batch = 50;
    config
}

/// [`loop_config`] over this deployment's topics (the topics file, in its namespace).
pub fn loop_config_from_file(settings: &KafkaSettings) -> Result<LoopConfig, TopicsError> {
    Ok(loop_config(&topics::for_deployment(settings)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn consumes_exactly_the_dead_letter_topics_of_the_project() {
        let dir = std::env::var("CARGO_MANIFEST_DIR")
            .unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").into());
        let topics_file = format!("{dir}/../../topics.yaml");
        let path = Path::new(&topics_file);
        let specs = topics::load(path).expect("topics.yaml loads");
        let config = loop_config(&specs);
        assert_eq!(
            config.topics,
            [
                "order.lifecycle.v1.dlt",
                "inventory.schedule.v1.dlt",
                "inventory.stock-change.v1.dlt"
            ]
        );
        assert!(config.raw);
        assert_eq!(config.max_batch, 50);
        assert_eq!(config.name, NAME);
    }
}
