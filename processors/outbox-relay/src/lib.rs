//! The transactional outbox relay (docs/design.md, the outbox).
//!
//! Services write `inventory_outbox` rows in the same transaction as the state change they
//! announce; this crate publishes them to Kafka as Avro in the Confluent wire format, keyed
//! by `partition_key` and carrying the `stocksvr.event-id` header.
//!
//! **Delivery guarantee: at least once.** A row counts as sent only after the broker
//! acknowledged it (idempotent producer, `acks=all`), so a crash, a timeout or a lost
//! acknowledgement can only cause a row to be published again, never lost. Consumers
//! deduplicate on `event_id` (the consumer inbox).
//!
//! **One row, one or two records.** A reservation step's row stands for its stock-change
//! event and its lifecycle event (docs/design.md, one outbox row per reservation step); the
//! relay rebuilds both envelopes from it and sends them in that order, each to its topic with
//! its key and event id. The row counts as sent only once both are acknowledged; a failure of
//! either, or a crash between them, sends both again (module `records` says why). Every other row
//! is one record, its payload the whole envelope, as all rows were before.
//!
//! **One leader, a high-water mark.** Of all running relays, the one holding the lease in
//! `inventory_outbox_relay` publishes new rows: it reads them by primary key above its
//! cursor (no lock, no per-row write), publishes them in id order and, once a prefix is
//! acknowledged, moves the persisted mark (`hwm`) with one compare-and-set on its epoch,
//! which also renews the lease. A row is sent when its id is at or below the mark and its
//! status is still PENDING, or when its status is SENT (the retry path). The others wait and
//! take the lease over when it runs out; the new leader starts from the mark, so rows the
//! old one published above it go out again (the expected duplicates), and a stalled old
//! leader can no longer move the mark.
//!
//! **Gaps.** Ids are allocated at insert and committed in any order, and a rollback leaves a
//! hole, so an id below rows already published may still appear. The leader keeps such
//! gaps in memory and never moves the mark over one; it re-reads them each round and
//! publishes what shows up. A gap closes as never written once every transaction open when
//! it was seen has ended (`information_schema.INNODB_TRX`, PROCESS privilege), after one
//! last read; without the privilege, after `gap_timeout` (a warning says so at start).
//!
//! **Failures.** A row that cannot be published (payload off its schema, registry or
//! broker failure) goes to RETRY with exponential backoff and the reason in `last_error`
//! before the mark passes it; the per-row retry path claims due RETRY rows with
//! `SELECT … FOR UPDATE SKIP LOCKED` under a lease (status SENDING) and marks them SENT or
//! RETRY again. It is never dropped and never holds up other rows. Order: records are
//! enqueued in id order, so one key's records keep their order unless a retry or a late
//! commit intervenes; consumers do not rely on it (they use versions: docs/design.md,
//! ordering).
//!
//! Polling is adaptive: a full batch goes again at once, a partial one waits `min_poll`,
//! empty rounds double the wait up to `max_poll`, and [`OutboxRelay::waker`] cuts any wait
//! short when a local transaction has just written rows. Sent rows are purged after the
//! retention, and the backlog gauges feed the `StocksvrOutboxBacklogGrowing` alert
//! (docs/runbook.md).

mod config;
mod error;
mod publish;
mod records;
mod relay;
mod schedule;
mod store;

pub use config::{RelayConfig, RelaySettings};
pub use error::RelayError;
pub use publish::EVENT_ID_HEADER;
pub use relay::{OutboxRelay, RelayReport};
pub use store::{status, Backlog, UNSENT, UNSENT_CODES};
