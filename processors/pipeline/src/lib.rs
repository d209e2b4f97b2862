//! What every stocksvr processor shares: configuration, the event catalog and Avro codec,
//! Kafka clients and topic administration, the schema registry, metrics, the HTTP health
//! listener, and the TLS and credentials of every connection.

pub mod catalog;
pub mod causes;
pub mod codec;
pub mod config;
pub mod consumer;
pub mod deadletter;
pub mod failure;
pub mod http;
pub mod json;
pub mod kafka;
pub mod offsets;
pub mod periodic;
pub mod producer;
pub mod registry;
pub mod step_body;
pub mod telemetry;
pub mod tls;
pub mod topics;
