//! Metric names of the relay, declared once so dashboards and alerts have stable names.
//!
//! Seed 003's lesson: an outbox without backlog alerting hides an outage until users notice.
//! [`BACKLOG`] and [`OLDEST_PENDING_SECONDS`] are what the backlog alert watches (alert on
//! size together with growth, not on size alone, to stay trusted during peaks).

/// Rows the broker acknowledged. Labels: `topic`, `event_type`.
pub const PUBLISHED: &str = "stocksvr_outbox_published_total";
/// Rows that went to RETRY. Labels: `topic`, `event_type`, `reason` (`encode`, `delivery`,
/// `timeout`).
pub const PUBLISH_FAILURES: &str = "stocksvr_outbox_publish_failures_total";
/// Rows not SENT yet (PENDING, SENDING and RETRY).
pub const BACKLOG: &str = "stocksvr_outbox_backlog";
/// Age of the oldest row not SENT yet, 0 when there is none.
pub const OLDEST_PENDING_SECONDS: &str = "stocksvr_outbox_oldest_pending_seconds";
/// SENT rows deleted after the retention.
pub const PURGED: &str = "stocksvr_outbox_purged_total";
/// Time from claim to the last acknowledgement of one batch.
pub const BATCH_PUBLISH_SECONDS: &str = "stocksvr_outbox_batch_publish_seconds";

/// Registers descriptions with the installed recorder (idempotent).
pub fn describe() {
    metrics::describe_counter!(PUBLISHED, "outbox rows acknowledged by the broker");
    metrics::describe_counter!(
        PUBLISH_FAILURES,
        "outbox rows that could not be published and were scheduled for retry"
    );
    metrics::describe_gauge!(BACKLOG, "outbox rows not sent yet");
    metrics::describe_gauge!(
        OLDEST_PENDING_SECONDS,
        metrics::Unit::Seconds,
        "age of the oldest outbox row not sent yet"
    );
    metrics::describe_counter!(PURGED, "sent outbox rows deleted after the retention");
    metrics::describe_histogram!(
        BATCH_PUBLISH_SECONDS,
        metrics::Unit::Seconds,
        "time from claiming a batch to its last broker acknowledgement"
    );
}
