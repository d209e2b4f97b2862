//! The transactional outbox relay (design §2, seed §4.6, seed 003's local message table).
//!
//! Services write `inventory_outbox` rows in the same transaction as the state change they
//! announce; this crate publishes them to Kafka as Avro in the Confluent wire format, keyed
//! by `partition_key` and carrying the `stocksvr.event-id` header.
//!
//! **Delivery guarantee: at least once.** A row becomes SENT only after the broker
//! acknowledged it (idempotent producer, `acks=all`), so a crash, a timeout or a lost
//! acknowledgement can only cause a row to be published again, never lost. Consumers
//! deduplicate on `event_id` (the consumer inbox). Duplicates stay exceptional:
//!
//! - a batch is claimed with `SELECT … FOR UPDATE SKIP LOCKED` and leased (status SENDING,
//!   `next_retry_at` = lease expiry) in one short transaction, so two relays running at once
//!   never claim the same row while its lease holds;
//! - the outcome is written only under that lease (it doubles as a fencing token), and the
//!   publish timeout is shorter than the lease;
//! - a SENDING row whose lease expired (its relay died mid-batch) is claimed again: that
//!   re-publish is the one expected duplicate.
//!
//! A row that cannot be published (payload off its schema, registry or broker failure) goes
//! to RETRY with exponential backoff and the reason in `last_error`; it is never dropped and
//! never holds up other rows. Order: records of one batch are enqueued in id order, so one
//! key's records keep their order within a batch; across retries and relays order is not
//! guaranteed, and consumers do not rely on it (they use versions, design §1).
//!
//! Polling is adaptive: a full batch goes again at once, a partial one waits `min_poll`,
//! empty rounds double the wait up to `max_poll`, and [`OutboxRelay::waker`] cuts any wait
//! short when a local transaction has just written rows. SENT rows are purged after the
//! retention, and the backlog gauges feed seed 003's backlog alert.

mod config;
mod error;
mod publish;
mod relay;
mod schedule;
mod store;

pub use config::{RelayConfig, RelaySettings};
pub use error::RelayError;
pub use publish::EVENT_ID_HEADER;
pub use relay::{OutboxRelay, RelayReport};
pub use store::{status, Backlog};
