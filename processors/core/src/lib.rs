//! Domain of stocksvr: identifiers, statuses and the events exchanged over Kafka.
//! This crate performs no I/O so every rule in it can be unit-tested in isolation.

pub mod backoff;
pub mod bucket;
pub mod events;
pub mod ids;
pub mod model;
pub mod reservation;
pub mod snowflake;
