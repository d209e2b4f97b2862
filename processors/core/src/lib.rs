//! Domain of stocksvr: identifiers, the stored codes, the events exchanged over Kafka, the
//! state machine and bucket rules, and the retry policy. This crate performs no I/O (the
//! retry and wait loops use only tokio's timer) so every rule in it can be unit-tested in
//! isolation.

pub mod backoff;
pub mod bucket;
pub mod codes;
pub mod events;
pub mod ids;
pub mod model;
pub mod mysql_errors;
pub mod reservation;
pub mod retry;
pub mod snowflake;
