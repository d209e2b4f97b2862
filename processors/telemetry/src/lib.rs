//! Every metric stocksvr exports, declared in one place (vector's `internal_events` idea).
//!
//! Each metric has a stable name, a type, its labels with the values they can take where
//! those are known in advance, and the help text `/metrics` serves. [`register`] describes
//! them all and creates every counter and gauge whose labels are all known at zero, so a panel
//! or an alert on `increase()` sees 0 for "nothing happened" instead of "no data". Series with
//! a label known only at run time (a topic, a partition, a consumer group) are created by the
//! part that learns the value, through [`zero_counter`] and friends.
//!
//! `prometheus/metrics-catalog.json` is this catalog as data for the dashboard lint; the
//! test at the bottom keeps the two identical (`STOCKSVR_UPDATE_CATALOG=1` rewrites the file).

/// Bucket bounds (seconds) of every latency histogram: they resolve p50 and p99 between
/// 1 ms and 1 s, with room above for outages.
pub const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    pub const fn name(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// One label: its name and the values a series exists with from start-up (empty: values
/// known only at run time).
#[derive(Debug, Clone, Copy)]
pub struct Label {
    pub name: &'static str,
    pub values: &'static [&'static str],
}

#[derive(Debug, Clone, Copy)]
pub struct Metric {
    pub name: &'static str,
    pub kind: Kind,
    pub labels: &'static [Label],
    pub help: &'static str,
}

const fn label(name: &'static str) -> Label {
    Label { name, values: &[] }
}

const fn known(name: &'static str, values: &'static [&'static str]) -> Label {
    Label { name, values }
}

macro_rules! catalog {
    ($($konst:ident = $name:literal, $kind:ident, [$($label:expr),* $(,)?], $help:literal;)+) => {
        /// The metric names, for the `metrics::counter!`/`gauge!`/`histogram!` call sites.
        pub mod names {
            $(#[doc = $help] pub const $konst: &str = $name;)+
        }
        /// The whole catalog, in declaration order.
        pub const CATALOG: &[Metric] = &[
            $(Metric { name: $name, kind: Kind::$kind, labels: &[$($label),*], help: $help },)+
        ];
    };
}

const PROCESSORS: &[&str] = &["order-lifecycle", "projector", "dead-letter", "schedule"];
const OPERATIONS: &[&str] = &["try", "confirm", "cancel", "refund", "markcreated"];
const INTERMEDIATE: &[&str] = &[
    "PREPARING",
    "CONFIRMING",
    "CANCELING",
    "REFUNDING",
    "CREATED_RESERVED_OVERDUE",
];
const WAL_ACTIONS: &[&str] = &["init", "adjust", "repair", "rebuild", "close", "archive"];
const DIFFERENCES: &[&str] = &[
    "oversell",
    "undersell",
    "reserved_sold_mismatch",
    "snapshot_behind",
    "ledger_gap",
    "records_missing",
];

catalog! {
    BUILD_INFO = "stocksvr_build_info", Gauge, [label("version")],
        "Always 1; the version label names the running build.";
    DEPENDENCY_READY = "stocksvr_dependency_ready", Gauge,
        [known("dependency", &["kafka", "schema_registry", "mysql", "redis"])],
        "1 when the dependency answered its readiness probe, 0 when not.";
    HTTP_REQUESTS = "stocksvr_http_requests_total", Counter, [label("route"), label("status")],
        "HTTP requests answered, by route template and status code.";
    HTTP_REQUEST_SECONDS = "stocksvr_http_request_seconds", Histogram, [label("route")],
        "HTTP request latency from the first byte read to the response, by route template.";
    HTTP_IN_FLIGHT = "stocksvr_http_in_flight", Gauge, [],
        "HTTP requests being handled right now.";
    HTTP_SHED = "stocksvr_http_shed_total", Counter, [known("reason", &["overload", "deadline"])],
        "Requests refused with 503 under overload (too many in flight) or past their deadline.";
    EVENTS_CONSUMED = "stocksvr_events_consumed_total", Counter, [known("processor", PROCESSORS), label("topic")],
        "Records read from Kafka by a processor.";
    EVENTS_APPLIED = "stocksvr_events_applied_total", Counter,
        [known("processor", PROCESSORS), known("outcome", &["applied", "duplicate", "conflict", "deferred"])],
        "Records settled by a processor: applied, duplicate (already applied), conflict (reported, not retried) or deferred (waits for its predecessor).";
    EVENTS_DEAD_LETTERED = "stocksvr_events_dead_lettered_total", Counter,
        [known("processor", PROCESSORS), label("topic"), known("class", &["invalid", "undecodable"])],
        "Records sent to <topic>.dlt, by error class: they can never apply (an outage is never a reason).";
    EVENTS_PRODUCED = "stocksvr_events_produced_total", Counter, [label("topic")],
        "Records produced to Kafka and acknowledged by the broker.";
    PROCESSING_RETRIES = "stocksvr_processing_retries_total", Counter, [known("processor", PROCESSORS)],
        "Retry attempts of a record whose dependency was unavailable.";
    PROCESSING_SECONDS = "stocksvr_processing_seconds", Histogram, [label("processor")],
        "Time to settle one batch of records, by processor.";
    CONSUMER_PAUSED_PARTITIONS = "stocksvr_consumer_paused_partitions", Gauge, [known("processor", PROCESSORS)],
        "Partitions a processor has paused because a dependency is unavailable.";
    CONSUMER_PAUSES = "stocksvr_consumer_pauses_total", Counter,
        [known("processor", PROCESSORS), known("dependency", &["mysql", "redis", "schema_registry", "kafka", "other"])],
        "Pause episodes of a processor, by the dependency that caused them.";
    CONSUMER_GROUP_LAG = "stocksvr_consumer_group_lag", Gauge, [label("group"), label("topic"), label("partition")],
        "Records behind: high watermark minus committed offset, read from the broker by the lag exporter.";
    CONSUMER_GROUP_LAG_SECONDS = "stocksvr_consumer_group_lag_seconds", Gauge, [label("group"), label("topic"), label("partition")],
        "Now minus the timestamp of the first unconsumed record, read from the broker by the lag exporter; 0 when caught up.";
    CONSUMER_GROUP_COMMITTED_OFFSET = "stocksvr_consumer_group_committed_offset", Gauge, [label("group"), label("topic"), label("partition")],
        "The offset the consumer group resumes from, read from the broker by the lag exporter.";
    TOPIC_HIGH_WATERMARK = "stocksvr_topic_high_watermark", Gauge, [label("topic"), label("partition")],
        "Log end offset of a partition (the offset the next record gets), read by the lag exporter.";
    CONSUMER_GROUP_MEMBERS = "stocksvr_consumer_group_members", Gauge, [label("group")],
        "Members of the consumer group as the broker reports them; 0 while nobody consumes.";
    LAG_EXPORTER_SCRAPES = "stocksvr_lag_exporter_scrapes_total", Counter, [known("outcome", &["ok", "error"])],
        "Lag exporter rounds, ok or error (the broker did not answer in time).";
    RESERVATION_OPERATIONS = "stocksvr_reservation_operations_total", Counter,
        [known("operation", OPERATIONS), label("outcome")],
        "Reservation service operations by outcome (a status name, already_done, not_yet, conflict, or an error class: invalid, unavailable, unknown, inconsistent, order_failed, bucket_lost).";
    RESERVATION_OPERATION_SECONDS = "stocksvr_reservation_operation_seconds", Histogram, [known("operation", OPERATIONS)],
        "Latency of one reservation service operation (Try, Confirm, Cancel, Refund, MarkCreated).";
    RESERVATIONS_INTERMEDIATE = "stocksvr_reservations_intermediate", Gauge, [known("status", INTERMEDIATE)],
        "Reservations in an intermediate status (CREATED_RESERVED_OVERDUE: CREATED_RESERVED past its processing time).";
    RESERVATIONS_INTERMEDIATE_OLDEST_SECONDS = "stocksvr_reservations_intermediate_oldest_seconds", Gauge, [known("status", INTERMEDIATE)],
        "Age of the oldest reservation in that intermediate status; 0 when there is none.";
    RESERVATIONS_STALE = "stocksvr_reservations_stale", Gauge, [],
        "RESERVED reservations past expire_at (the order domain never created or failed the order).";
    RESERVATIONS_DEAD = "stocksvr_reservations_dead_total", Counter, [],
        "Reservations the recovery worker gave up on and marked dead.";
    RESERVATION_CONFLICTS = "stocksvr_reservation_conflicts_total", Counter, [label("reason")],
        "Conflicting order events reported (for example Confirm after Cancel), by reason.";
    RECOVERY_ATTEMPTS = "stocksvr_recovery_attempts_total", Counter, [known("outcome", &["resumed", "failed"])],
        "Recovery worker attempts to resume an intermediate reservation, by outcome.";
    REDIS_UNKNOWN_OUTCOMES = "stocksvr_redis_unknown_outcomes_total", Counter, [known("operation", &["try", "confirm", "cancel", "refund"])],
        "Redis calls whose outcome is unknown (timeout, lost reply); resumed with the same operation id.";
    FENCE_HITS = "stocksvr_fence_hits_total", Counter, [known("kind", &["hanging_prevented", "empty_rollback", "order_fenced"])],
        "Fence decisions: a late Try fenced (hanging prevented), a Cancel with no Try (empty rollback), a Try of a failed order refused.";
    LUA_INVARIANT_REFUSALS = "stocksvr_lua_invariant_refusals_total", Counter, [label("script")],
        "Oversell alarm: a Lua script refused because the stored numbers broke an invariant (negative, or not summing to total).";
    WAL_OPERATIONS = "stocksvr_wal_operations_total", Counter, [known("action", WAL_ACTIONS), known("outcome", &["succeeded", "retry", "dead"])],
        "Operation WAL rows finished or failed, by action and outcome.";
    WAL_BACKLOG = "stocksvr_wal_backlog", Gauge, [known("action", WAL_ACTIONS)],
        "Unfinished operation WAL rows, by action.";
    WAL_OLDEST_SECONDS = "stocksvr_wal_oldest_seconds", Gauge, [known("action", WAL_ACTIONS)],
        "Age of the oldest unfinished operation WAL row, by action; 0 when there is none.";
    WAL_DEAD = "stocksvr_wal_dead_total", Counter, [known("action", WAL_ACTIONS)],
        "Operation WAL rows marked dead after their last attempt, by action.";
    BUCKET_DEFICIT = "stocksvr_bucket_deficit_total", Counter, [],
        "Merchant adjusts that set a total below reserved + sold (a deficit was recorded).";
    BUCKETS_LOST = "stocksvr_buckets_lost", Gauge, [],
        "Buckets whose Redis key is lost and not yet rebuilt (they fail closed).";
    DAILY_BUCKETS_PREPARED = "stocksvr_daily_buckets_prepared_total", Counter, [],
        "Buckets the daily job created ahead of the merchant's day.";
    OUTBOX_BACKLOG = "stocksvr_outbox_backlog", Gauge, [],
        "Outbox rows not yet sent to Kafka.";
    OUTBOX_OLDEST_PENDING_SECONDS = "stocksvr_outbox_oldest_pending_seconds", Gauge, [],
        "Age of the oldest unsent outbox row; 0 when there is none.";
    OUTBOX_PUBLISHED = "stocksvr_outbox_published_total", Counter, [label("topic"), label("event_type")],
        "Outbox rows published and acknowledged by the broker.";
    OUTBOX_PUBLISH_FAILURES = "stocksvr_outbox_publish_failures_total", Counter, [label("topic"), label("event_type"), known("reason", &["encode", "delivery", "timeout"])],
        "Outbox rows whose publish failed (retried with backoff), by reason.";
    OUTBOX_PUBLISH_DELAY_SECONDS = "stocksvr_outbox_publish_delay_seconds", Histogram, [],
        "Delay from an outbox row created to sent.";
    OUTBOX_BATCH_PUBLISH_SECONDS = "stocksvr_outbox_batch_publish_seconds", Histogram, [],
        "Time to publish one claimed batch of outbox rows (encode, send, acknowledgements, mark SENT).";
    OUTBOX_PURGED = "stocksvr_outbox_purged_total", Counter, [],
        "SENT outbox rows deleted by the purge after their retention.";
    PROJECTOR_EVENTS_PROJECTED = "stocksvr_projector_events_projected_total", Counter, [label("event")],
        "Stock-change events booked by the projector, by event name.";
    PROJECTOR_DUPLICATES = "stocksvr_projector_duplicates_total", Counter, [],
        "Stock-change events the projector's inbox had seen already (a redelivery).";
    PROJECTOR_STALE = "stocksvr_projector_stale_total", Counter, [],
        "Stock-change events older than the snapshot's version: booked in the ledger, snapshot left as it is.";
    PROJECTOR_LEDGER_ALREADY_BOOKED = "stocksvr_projector_ledger_already_booked_total", Counter, [],
        "Events whose operation id already had a ledger row under another event id.";
    PROJECTOR_BATCH_SIZE = "stocksvr_projector_batch_size", Histogram, [],
        "Events per projector transaction.";
    PROJECTION_DELAY_SECONDS = "stocksvr_projection_delay_seconds", Histogram, [],
        "Delay from an event occurred_at to booked in snapshot and ledger.";
    ORDER_EVENTS_DEFERRED = "stocksvr_order_events_deferred", Gauge, [],
        "Order events parked while waiting for their predecessor (RefundRequested before its OrderCreated, say).";
    ORDER_EVENTS_DEFERRED_OLDEST_SECONDS = "stocksvr_order_events_deferred_oldest_seconds", Gauge, [],
        "Age of the oldest parked order event; 0 when there is none.";
    DEAD_LETTERS_PARKED_TOTAL = "stocksvr_dead_letters_parked_total", Counter, [label("topic"), known("class", &["invalid", "undecodable"])],
        "Dead letters parked in MySQL by the dead-letter processor, by dead-letter topic and error class.";
    DEAD_LETTERS_PARKED = "stocksvr_dead_letters_parked", Gauge, [],
        "Parked dead letters not yet replayed or discarded.";
    DEAD_LETTERS_FOREIGN = "stocksvr_dead_letters_foreign_total", Counter, [label("topic")],
        "Dead letters on a shared dead-letter topic written by another deployment's group: left alone.";
    DEAD_LETTERS_REPLAYED = "stocksvr_dead_letters_replayed_total", Counter, [label("topic")],
        "Parked dead letters put back on their original topic by an operator.";
    DEAD_LETTERS_DISCARDED = "stocksvr_dead_letters_discarded_total", Counter, [],
        "Parked dead letters an operator discarded.";
    SCHEDULE_ARMED = "stocksvr_schedule_armed_total", Counter,
        [known("source", &["order_created", "load_ahead"]), known("outcome", &["added", "present", "failed"])],
        "Time-wheel entries armed for scheduled reservations.";
    SCHEDULE_FIRED = "stocksvr_schedule_fired_total", Counter, [label("outcome"), label("reason")],
        "Time-wheel entries claimed, by outcome (emitted, already_emitted, dropped, later).";
    SCHEDULE_FIRE_LATENESS_SECONDS = "stocksvr_schedule_fire_lateness_seconds", Histogram, [],
        "How long after processing_time the wheel emitted InventoryConfirmDue.";
    SCHEDULE_TRIGGERS = "stocksvr_schedule_triggers_total", Counter, [label("outcome")],
        "InventoryConfirmDue records handled, by outcome.";
    SCHEDULE_REDRIVEN = "stocksvr_schedule_scan_redriven_total", Counter, [label("outcome")],
        "Scheduled reservations the scan confirmed itself because the wheel missed them.";
    SCHEDULE_OVERDUE = "stocksvr_schedule_overdue", Gauge, [],
        "CREATED_RESERVED reservations past processing_time + grace at the last scan.";
    RECONCILE_BUCKETS_CHECKED = "stocksvr_reconcile_buckets_checked_total", Counter, [],
        "Buckets the reconciler compared (Redis against MySQL).";
    RECONCILE_CONSISTENT_RATIO = "stocksvr_reconcile_consistent_ratio", Gauge, [],
        "Consistent buckets / buckets checked in the last reconcile pass.";
    RECONCILE_DIFFERENCES = "stocksvr_reconcile_differences", Gauge, [known("kind", DIFFERENCES)],
        "Unresolved differences between Redis and MySQL, by kind.";
    RECONCILE_HELD_BACK = "stocksvr_reconcile_held_back", Gauge, [known("reason", &["in_flight", "version_moved", "first_sighting"])],
        "Buckets with a difference not reported yet in the last pass, by why (in-flight work, the Redis version moved, seen once).";
    RECONCILE_OLDEST_DIFFERENCE_SECONDS = "stocksvr_reconcile_oldest_difference_seconds", Gauge, [],
        "Age of the oldest unresolved reconcile difference; 0 when there is none.";
    RECONCILE_REPAIRS = "stocksvr_reconcile_repairs_total", Counter, [known("outcome", &["repaired", "version_changed", "failed"])],
        "Versioned repairs, by outcome.";
    RECONCILE_REPAIR_SECONDS = "stocksvr_reconcile_repair_seconds", Histogram, [],
        "Time from a difference's first sighting to its repair (the on-demand check counts from its first pass).";
    RECONCILE_LAST_PASS_TIMESTAMP_SECONDS = "stocksvr_reconcile_last_pass_timestamp_seconds", Gauge, [],
        "Unix time of the last finished reconcile pass.";
}

/// Describes every metric (help text on `/metrics`) and creates every counter and gauge
/// whose labels all have known values, at zero. Call once at start-up, after the recorder
/// is installed and before any part sets a gauge.
pub fn register() {
    for m in CATALOG {
        match m.kind {
            Kind::Counter => metrics::describe_counter!(m.name, m.help),
            Kind::Gauge => metrics::describe_gauge!(m.name, m.help),
            Kind::Histogram => metrics::describe_histogram!(m.name, m.help),
        }
        if m.kind == Kind::Histogram || m.labels.iter().any(|l| l.values.is_empty()) {
            continue;
        }
        for labels in combinations(m.labels) {
            match m.kind {
                Kind::Counter => metrics::counter!(m.name, &labels).increment(0),
                Kind::Gauge => metrics::gauge!(m.name, &labels).increment(0.0),
                Kind::Histogram => {}
            }
        }
    }
}

/// Every combination of the known label values (one empty set for a metric without labels).
fn combinations(labels: &[Label]) -> Vec<Vec<(&'static str, &'static str)>> {
    let mut out: Vec<Vec<(&'static str, &'static str)>> = vec![Vec::new()];
    for l in labels {
        out = out
            .into_iter()
            .flat_map(|prefix| {
                l.values.iter().map(move |v| {
                    let mut set = prefix.clone();
                    set.push((l.name, *v));
                    set
                })
            })
            .collect();
    }
    out
}

/// Creates a counter series at zero (for a label value learned at run time, such as the
/// topics a processor consumes).
pub fn zero_counter(name: &'static str, labels: &[(&'static str, String)]) {
    let labels: Vec<metrics::Label> = labels
        .iter()
        .map(|(k, v)| metrics::Label::new(*k, v.clone()))
        .collect();
    metrics::counter!(name, labels).increment(0);
}

/// The catalog as the JSON of `prometheus/metrics-catalog.json`.
pub fn catalog_json() -> String {
    fn esc(s: &str) -> String {
        s.replace('\\', "\\\\").replace('"', "\\\"")
    }
    let mut out = String::from("{\n  \"description\": \"The metrics stocksvr exports, generated from processors/telemetry (STOCKSVR_UPDATE_CATALOG=1 cargo test -p stocksvr-telemetry). Dashboards and alert rules may only name these (tests/observability/lint_dashboards.py). label_values: the values each series exists with from start-up (at 0).\",\n");
    out.push_str("  \"histogram_buckets_seconds\": [");
    out.push_str(
        &LATENCY_BUCKETS
            .iter()
            .map(|b| b.to_string())
            .collect::<Vec<_>>()
            .join(", "),
    );
    out.push_str("],\n  \"metrics\": [\n");
    let rows: Vec<String> = CATALOG
        .iter()
        .map(|m| {
            let labels = m
                .labels
                .iter()
                .map(|l| format!("\"{}\"", l.name))
                .collect::<Vec<_>>()
                .join(", ");
            let values: Vec<String> = m
                .labels
                .iter()
                .filter(|l| !l.values.is_empty())
                .map(|l| {
                    format!(
                        "\"{}\": [{}]",
                        l.name,
                        l.values
                            .iter()
                            .map(|v| format!("\"{v}\""))
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                })
                .collect();
            let values = if values.is_empty() {
                String::new()
            } else {
                format!(", \"label_values\": {{{}}}", values.join(", "))
            };
            format!(
                "    {{\"name\": \"{}\", \"type\": \"{}\", \"labels\": [{labels}]{values}, \"help\": \"{}\"}}",
                m.name,
                m.kind.name(),
                esc(m.help)
            )
        })
        .collect();
    out.push_str(&rows.join(",\n"));
    out.push_str("\n  ]\n}\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn names_are_unique_prefixed_and_typed_by_suffix() {
        let mut seen = HashSet::new();
        for m in CATALOG {
            assert!(seen.insert(m.name), "{} declared twice", m.name);
            assert!(m.name.starts_with("stocksvr_"), "{}", m.name);
            assert_eq!(
                m.name.ends_with("_total"),
                m.kind == Kind::Counter,
                "counters and only counters end in _total: {}",
                m.name
            );
            assert!(!m.help.is_empty(), "{} has no help", m.name);
        }
    }

    #[test]
    fn known_label_values_expand_to_every_combination() {
        let labels = [known("a", &["1", "2"]), known("b", &["x", "y", "z"])];
        assert_eq!(combinations(&labels).len(), 6);
        assert_eq!(combinations(&[]), vec![Vec::new()]);
    }

    #[test]
    fn the_catalog_file_is_this_catalog() {
        let dir = std::env::var("CARGO_MANIFEST_DIR")
            .unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").into());
        let path = format!("{dir}/../../prometheus/metrics-catalog.json");
        let generated = catalog_json();
        serde_json::from_str::<serde_json::Value>(&generated).expect("valid JSON");
        if std::env::var("STOCKSVR_UPDATE_CATALOG").is_ok_and(|v| v == "1") {
            std::fs::write(&path, &generated).expect("write the catalog");
        }
        let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            on_disk == generated,
            "{path} differs from processors/telemetry: run STOCKSVR_UPDATE_CATALOG=1 cargo test -p stocksvr-telemetry"
        );
    }
}
