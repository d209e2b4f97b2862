//! The Kafka event contracts, mirrored field for field from `schemas/*.avsc`.
//!
//! The `.avsc` files are the contract other teams code against (a Java or Python producer
//! with the stock Confluent serializer must be understood here), so they are the source of
//! truth and these types follow them, never the other way round. The unit tests in
//! `events/tests.rs` hold the two together: every example payload in `schemas/examples`
//! must conform to its schema, decode into these types and encode back unchanged, and every
//! schema's record name must match `schemas/catalog.yaml` and [`EventKind`].
//!
//! Each event is its own top-level Avro record (registry subject `<topic>-<full name>`,
//! TopicRecordNameStrategy) made of the common envelope fields plus a `data` record. In Rust
//! that is [`Envelope<D>`] where `D` is the event's data type. Timestamps and dates stay
//! strings (RFC 3339 / `YYYY-MM-DD`) because that is what crosses the wire; parsing them is
//! the consumer's business and a malformed one must become a dead letter, not a panic here.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

// Most payloads are keyed by one of their own fields; these spell that out once.
// `Data.part => Kind` keys by `part`'s `order_id` (the reservation a lifecycle event is about).
macro_rules! keyed_by_order {
    ($($data:ident $(.$part:ident)* => $kind:ident),+ $(,)?) => {$(
        impl EventData for $data {
            fn kind(&self) -> EventKind {
                EventKind::$kind
            }
            fn partition_key(&self) -> String {
                self$(.$part)*.order_id.to_string()
            }
        }
    )+};
}

macro_rules! keyed_by_bucket {
    ($($data:ident => $kind:ident),+ $(,)?) => {$(
        impl EventData for $data {
            fn kind(&self) -> EventKind {
                EventKind::$kind
            }
            fn partition_key(&self) -> String {
                self.stock_bucket_id.clone()
            }
        }
    )+};
}

mod inbound;
mod outbound;
pub mod paired;
#[cfg(test)]
mod tests;

pub use inbound::*;
pub use outbound::*;

/// Topic names, as declared in `topics.yaml` and `schemas/catalog.yaml`.
pub mod topics {
    pub const ORDER_LIFECYCLE: &str = "order.lifecycle.v1";
    pub const INVENTORY_SCHEDULE: &str = "inventory.schedule.v1";
    pub const STOCK_CHANGE: &str = "inventory.stock-change.v1";
    pub const INVENTORY_LIFECYCLE: &str = "inventory.lifecycle.v1";
}

/// Fields every event carries ahead of its payload (docs/design.md, events, outbox,
/// inbox, projection).
///
/// `event_type` and `partition_key` repeat what the schema name and the Kafka key already
/// say; they are kept in the value so that dead letters, JSON dumps and re-publishing from
/// the outbox keep that information without the registry or the original record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Envelope<D> {
    /// Deduplication key for consumer inboxes; a re-sent event keeps it.
    pub event_id: String,
    pub event_type: String,
    pub schema_version: i32,
    /// RFC 3339 with an explicit offset.
    pub occurred_at: String,
    pub producer: String,
    #[serde(default)]
    pub trace_id: Option<String>,
    pub partition_key: String,
    pub data: D,
}

/// A payload that knows which event it travels as and which Kafka key it needs.
///
/// The kind is a method of the value rather than a constant of the type because the four
/// `InventoryRedis*` events share [`StockChangeData`]; their kind follows from `action`.
pub trait EventData: Serialize + DeserializeOwned {
    fn kind(&self) -> EventKind;

    /// The Kafka record key (and envelope `partition_key`): `order_id` or `stock_bucket_id`,
    /// as `schemas/catalog.yaml` says, so all events of one order or one bucket stay ordered.
    fn partition_key(&self) -> String;
}

impl<D: EventData> Envelope<D> {
    /// Builds an envelope whose redundant fields cannot disagree with the payload.
    pub fn new(
        event_id: impl Into<String>,
        occurred_at: impl Into<String>,
        producer: impl Into<String>,
        trace_id: Option<String>,
        data: D,
    ) -> Self {
        let kind = data.kind();
        Self {
            event_id: event_id.into(),
            event_type: kind.name().to_owned(),
            schema_version: kind.schema_version(),
            occurred_at: occurred_at.into(),
            producer: producer.into(),
            trace_id,
            partition_key: data.partition_key(),
            data,
        }
    }

    pub fn kind(&self) -> EventKind {
        self.data.kind()
    }

    /// Rejects a decoded event whose envelope contradicts its payload or its schema.
    ///
    /// `writer_full_name` is the record name of the schema the bytes were written with (from
    /// the registry). A producer bug such as an `InventoryRedisReserved` record whose action
    /// is `CONFIRM` must become a dead letter with a clear reason instead of being applied.
    pub fn check(&self, writer_full_name: &str) -> Result<(), EventError> {
        let kind = self.kind();
        if kind.full_name() != writer_full_name {
            return Err(EventError::KindMismatch {
                schema: writer_full_name.to_owned(),
                data: kind.full_name(),
            });
        }
        if self.event_type != kind.name() {
            return Err(EventError::EventTypeMismatch {
                event_type: self.event_type.clone(),
                expected: kind.name(),
            });
        }
        let key = self.data.partition_key();
        if self.partition_key != key {
            return Err(EventError::PartitionKeyMismatch {
                partition_key: self.partition_key.clone(),
                expected: key,
            });
        }
        Ok(())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EventError {
    #[error("record written as {schema} but its data describes {data}")]
    KindMismatch { schema: String, data: &'static str },
    #[error("event_type is {event_type:?}, expected {expected:?}")]
    EventTypeMismatch {
        event_type: String,
        expected: &'static str,
    },
    #[error("partition_key is {partition_key:?} but the data says {expected:?}")]
    PartitionKeyMismatch {
        partition_key: String,
        expected: String,
    },
}

macro_rules! event_kinds {
    ($($kind:ident => $ns:literal, $topic:expr;)+) => {
        /// Every event type of the system, one per `.avsc` file.
        ///
        /// Consumers get the writer schema's full name from the registry and use
        /// [`EventKind::from_full_name`] to pick the payload type to decode into.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum EventKind { $($kind,)+ }

        impl EventKind {
            pub const ALL: &'static [EventKind] = &[$(EventKind::$kind,)+];

            /// Simple record name, also the envelope's `event_type`.
            pub const fn name(self) -> &'static str {
                match self { $(EventKind::$kind => stringify!($kind),)+ }
            }

            pub const fn namespace(self) -> &'static str {
                match self { $(EventKind::$kind => $ns,)+ }
            }

            /// Avro full name; with the topic it forms the registry subject.
            pub const fn full_name(self) -> &'static str {
                match self { $(EventKind::$kind => concat!($ns, ".", stringify!($kind)),)+ }
            }

            pub const fn topic(self) -> &'static str {
                match self { $(EventKind::$kind => $topic,)+ }
            }

            /// File name under `schemas/`.
            pub const fn schema_file(self) -> &'static str {
                match self { $(EventKind::$kind => concat!(stringify!($kind), ".avsc"),)+ }
            }
        }
    };
}

event_kinds! {
    OrderCreated => "io.stocksvr.order", topics::ORDER_LIFECYCLE;
    OrderCreatedFailed => "io.stocksvr.order", topics::ORDER_LIFECYCLE;
    OrderCanceled => "io.stocksvr.order", topics::ORDER_LIFECYCLE;
    RefundRequested => "io.stocksvr.order", topics::ORDER_LIFECYCLE;
    InventoryConfirmDue => "io.stocksvr.schedule", topics::INVENTORY_SCHEDULE;
    InventoryRedisReserved => "io.stocksvr.inventory", topics::STOCK_CHANGE;
    InventoryRedisConfirmed => "io.stocksvr.inventory", topics::STOCK_CHANGE;
    InventoryRedisCanceled => "io.stocksvr.inventory", topics::STOCK_CHANGE;
    InventoryRedisRefunded => "io.stocksvr.inventory", topics::STOCK_CHANGE;
    StockBucketInitialized => "io.stocksvr.inventory", topics::STOCK_CHANGE;
    StockBaselineAdjusted => "io.stocksvr.inventory", topics::STOCK_CHANGE;
    StockBucketRepaired => "io.stocksvr.inventory", topics::STOCK_CHANGE;
    StockBucketRebuilt => "io.stocksvr.inventory", topics::STOCK_CHANGE;
    InventoryReserved => "io.stocksvr.inventory", topics::INVENTORY_LIFECYCLE;
    InventoryRejected => "io.stocksvr.inventory", topics::INVENTORY_LIFECYCLE;
    InventoryConfirmed => "io.stocksvr.inventory", topics::INVENTORY_LIFECYCLE;
    InventoryCanceled => "io.stocksvr.inventory", topics::INVENTORY_LIFECYCLE;
    InventoryRefunded => "io.stocksvr.inventory", topics::INVENTORY_LIFECYCLE;
    InventoryOperationDead => "io.stocksvr.inventory", topics::INVENTORY_LIFECYCLE;
}

impl EventKind {
    /// Contract version written into `schema_version`. Bump it together with a compatible
    /// change of the `.avsc` (e.g. an added field) so logs and dead letters show which
    /// generation a producer spoke; decoding never depends on it, the registry id does that.
    pub const fn schema_version(self) -> i32 {
        1
    }

    /// Registry subject under TopicRecordNameStrategy.
    pub fn subject(self) -> String {
        format!("{}-{}", self.topic(), self.full_name())
    }

    pub fn from_full_name(full_name: &str) -> Option<Self> {
        Self::ALL
            .iter()
            .copied()
            .find(|k| k.full_name() == full_name)
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|k| k.name() == name)
    }
}

/// Avro enum `io.stocksvr.order.OrderType`, shared by order and inventory events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum OrderType {
    /// Confirmed as soon as `OrderCreated` arrives.
    Instant,
    /// Held as `CREATED_RESERVED` until `processing_time`; no longer cancelable.
    Scheduled,
}

impl std::fmt::Display for OrderType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            OrderType::Instant => "INSTANT",
            OrderType::Scheduled => "SCHEDULED",
        })
    }
}
