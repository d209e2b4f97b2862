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

pub mod testing;

/// The `metrics` crate these names are for, for crates that emit through the catalog alone.
pub use metrics;

/// Bucket bounds (seconds) of every latency histogram: they resolve p50 and p99 between
/// 1 ms and 1 s, with room above for outages. Finer from 50 to 250 ms, where the 100 ms
/// goals (OrderCreated -> CONFIRMED, projection delay under load) sit: with only 0.1 and
/// 0.25 there, the projection delay's p99 read 97 ms from the histogram where the bench's
/// direct measure of the same events said 67 ms.
pub const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
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
    /// What one unit of the value is: `seconds` (every `_seconds` metric), `unix seconds`,
    /// `ratio`, `boolean`, or what a counter or gauge counts (`rows`, `records`, ...).
    pub unit: &'static str,
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
    ($($konst:ident = $name:literal, $kind:ident, $unit:literal, [$($label:expr),* $(,)?], $help:literal;)+) => {
        /// The metric names, for the `metrics::counter!`/`gauge!`/`histogram!` call sites.
        pub mod names {
            $(#[doc = $help] pub const $konst: &str = $name;)+
        }
        /// The whole catalog, in declaration order.
        pub const CATALOG: &[Metric] = &[
            $(Metric { name: $name, kind: Kind::$kind, unit: $unit, labels: &[$($label),*], help: $help },)+
        ];
        /// `names::` constant → metric name, for the check of the call sites.
        #[cfg(test)]
        const CONSTANTS: &[(&str, &str)] = &[$((stringify!($konst), $name),)+];
    };
}

const PROCESSORS: &[&str] = &["order-lifecycle", "projector", "dead-letter", "schedule"];
/// The reservation service's operations as its call sites label them (`Intent` in lower
/// case; `partialrefund` is a RefundRequested for part of the units).
const OPERATIONS: &[&str] = &[
    "try",
    "confirm",
    "cancel",
    "refund",
    "partialrefund",
    "markcreated",
];
/// The statuses the recovery worker resumes (the row's own status names), the ones a dead
/// reservation can stay in.
const RESUMABLE: &[&str] = &["PREPARING", "CONFIRMING", "CANCELING", "REFUNDING"];
const INTERMEDIATE: &[&str] = &[
    "PREPARING",
    "CONFIRMING",
    "CANCELING",
    "REFUNDING",
    "CREATED_RESERVED_OVERDUE",
];
/// `inventory_operation_wal.action` as the WAL labels it (`WalAction::name`); REBUILD is the
/// rebuild the lead is adding.
const WAL_ACTIONS: &[&str] = &[
    "INIT_BUCKET",
    "ADJUST",
    "REPAIR",
    "REBUILD",
    "CLOSE",
    "ARCHIVE",
];
/// The Lua scripts that move stock, by the `action` their op record stores.
const LUA_SCRIPTS: &[&str] = &[
    "try",
    "confirm",
    "cancel",
    "refund",
    "init_bucket",
    "adjust",
    "set_state",
];
const DIFFERENCES: &[&str] = &[
    "oversell",
    "undersell",
    "reserved_sold_mismatch",
    "snapshot_behind",
    "ledger_gap",
    "records_missing",
    "version_regressed",
];

catalog! {
    BUILD_INFO = "stocksvr_build_info", Gauge, "info", [label("version")],
        "Always 1; the version label names the running build.";
    DEPENDENCY_READY = "stocksvr_dependency_ready", Gauge, "boolean",
        [known("dependency", &["kafka", "schema_registry", "mysql", "redis", "reservation_service"])],
        "1 when the dependency answered its readiness probe, 0 when not.";
    HTTP_REQUESTS = "stocksvr_http_requests_total", Counter, "requests", [label("route"), label("status")],
        "HTTP requests answered, by route template and status code.";
    HTTP_REQUEST_SECONDS = "stocksvr_http_request_seconds", Histogram, "seconds", [label("route")],
        "Latency of the Try API (/v1/..., /openapi.json) from the request reaching its route to the response headers, by route template (never the raw path).";
    HTTP_IN_FLIGHT = "stocksvr_http_in_flight", Gauge, "requests", [],
        "Try API requests being handled right now.";
    HTTP_SHED = "stocksvr_http_shed_total", Counter, "requests", [known("reason", &["overload", "deadline"])],
        "Requests refused with 503 under overload (too many in flight) or past their deadline.";
    HTTP_AUTH = "stocksvr_http_auth_total", Counter, "requests",
        [label("client"), known("outcome", &["allowed", "unauthorized", "forbidden"])],
        "Requests outside http.public_paths by caller: client is a configured client's name, anonymous (no credentials) or unknown (a token or certificate no client has); outcome allowed, unauthorized (401) or forbidden (403: the client lacks the scope).";
    HTTP_TLS_HANDSHAKES = "stocksvr_http_tls_handshakes_total", Counter, "handshakes", [known("outcome", &["ok", "failed"])],
        "TLS handshakes of the HTTPS listener: one per connection, so with keep-alive far fewer than requests; failed includes a caller refused for its certificate.";
    EVENTS_CONSUMED = "stocksvr_events_consumed_total", Counter, "records", [known("processor", PROCESSORS), label("topic")],
        "Records read from Kafka by a processor.";
    EVENTS_APPLIED = "stocksvr_events_applied_total", Counter, "records",
        [known("processor", PROCESSORS), known("outcome", &["applied", "duplicate", "conflict", "deferred"])],
        "Records settled by a processor: applied, duplicate (already applied), conflict (reported, not retried) or deferred (waits for its predecessor).";
    EVENTS_DEAD_LETTERED = "stocksvr_events_dead_lettered_total", Counter, "records",
        [known("processor", PROCESSORS), label("topic"), known("class", &["invalid", "undecodable"])],
        "Records sent to <topic>.dlt, by error class: they can never apply (an outage is never a reason).";
    EVENTS_PRODUCED = "stocksvr_events_produced_total", Counter, "records", [label("topic")],
        "Records the outbox relay produced to Kafka and the broker acknowledged, by the topic written (with its kafka.topic_namespace).";
    PROCESSING_RETRIES = "stocksvr_processing_retries_total", Counter, "attempts", [known("processor", PROCESSORS)],
        "Retry attempts of a record whose dependency was unavailable.";
    PROCESSING_SECONDS = "stocksvr_processing_seconds", Histogram, "seconds", [label("processor")],
        "Time to settle one batch of records, by processor.";
    CONSUMER_RECORD_AGE_SECONDS = "stocksvr_consumer_record_age_seconds", Histogram, "seconds", [known("processor", PROCESSORS)],
        "Age of a record when its processor takes it from its consumer: now minus the record's timestamp (the producer's create time, the broker's on a LogAppendTime topic). The part of an event's delay before its batch starts: the producer, the broker, the fetch, and the wait behind the batch in progress; stocksvr_processing_seconds is the part after.";
    CONSUMER_PAUSED_PARTITIONS = "stocksvr_consumer_paused_partitions", Gauge, "partitions", [known("processor", PROCESSORS)],
        "Partitions a processor has paused because a dependency is unavailable.";
    CONSUMER_PAUSES = "stocksvr_consumer_pauses_total", Counter, "episodes",
        [known("processor", PROCESSORS), known("dependency", &["mysql", "redis", "schema_registry", "kafka", "other"])],
        "Pause episodes of a processor, by the dependency that caused them.";
    CONSUMER_GROUP_LAG = "stocksvr_consumer_group_lag", Gauge, "records", [label("group"), label("topic"), label("partition")],
        "Records behind: high watermark minus committed offset, read from the broker by the lag exporter.";
    CONSUMER_GROUP_LAG_SECONDS = "stocksvr_consumer_group_lag_seconds", Gauge, "seconds", [label("group"), label("topic"), label("partition")],
        "Now minus the timestamp of the first unconsumed record, read from the broker by the lag exporter; 0 when caught up.";
    CONSUMER_GROUP_COMMITTED_OFFSET = "stocksvr_consumer_group_committed_offset", Gauge, "offset", [label("group"), label("topic"), label("partition")],
        "The offset the consumer group resumes from, read from the broker by the lag exporter.";
    TOPIC_HIGH_WATERMARK = "stocksvr_topic_high_watermark", Gauge, "offset", [label("topic"), label("partition")],
        "Log end offset of a partition (the offset the next record gets), read by the lag exporter.";
    CONSUMER_GROUP_MEMBERS = "stocksvr_consumer_group_members", Gauge, "members", [label("group")],
        "Members of the consumer group as the broker reports them; 0 while nobody consumes.";
    LAG_EXPORTER_SCRAPES = "stocksvr_lag_exporter_scrapes_total", Counter, "rounds", [known("outcome", &["ok", "error"])],
        "Lag exporter rounds, ok or error (the broker did not answer in time).";
    RESERVATION_OPERATIONS = "stocksvr_reservation_operations_total", Counter, "operations",
        [known("operation", OPERATIONS), label("outcome")],
        "Reservation service operations by outcome (a status name, already_done, not_yet, conflict, or an error class: invalid, unavailable, unknown, inconsistent, order_failed, bucket_lost).";
    RESERVATION_OPERATION_SECONDS = "stocksvr_reservation_operation_seconds", Histogram, "seconds", [known("operation", OPERATIONS)],
        "Latency of one reservation service operation (Try, Confirm, Cancel, Refund, MarkCreated).";
    TRY_GROUP_SIZE = "stocksvr_try_group_size", Histogram, "rows", [known("stage", &["insert", "begin", "commit", "lua"])],
        "Reservations written together by the reservation service's group commit: one INSERT of the Trys' PREPARING rows (insert), one CAS of Confirms and Cancels into their intermediate status (begin), one transaction completing steps with their outbox rows (commit: Trys, Confirms, Cancels, MarkCreated and recovery resumes; not refunds), or the Trys of one bucket in one call of try.lua (lua).";
    TRY_GROUP_WRITE_SECONDS = "stocksvr_try_group_write_seconds", Histogram, "seconds", [known("stage", &["insert", "begin", "commit", "lua"])],
        "Time one group of the reservation service's group commit took to write (stages as in stocksvr_try_group_size); with one group in flight a request waits up to one such write before its own, so this bounds what group commit adds to a Try.";
    TRY_GROUP_PART_SECONDS = "stocksvr_try_group_part_seconds", Histogram, "seconds", [known("part", &["open", "cas", "outbox", "commit"])],
        "Where one commit-stage group's transaction spends its time: taking a pool connection and BEGIN (open), the CAS UPDATE of its rows (cas), the INSERT of their outbox rows (outbox), COMMIT with its log flush (commit). Recorded for each group transaction that committed (an attempt lost to a deadlock or a lost CAS is not); the four add up to about its stocksvr_try_group_write_seconds{stage=\"commit\"}.";
    RESERVATIONS_INTERMEDIATE = "stocksvr_reservations_intermediate", Gauge, "reservations", [known("status", INTERMEDIATE)],
        "Reservations in an intermediate status, dead ones included (CREATED_RESERVED_OVERDUE: CREATED_RESERVED past its processing time).";
    RESERVATIONS_INTERMEDIATE_OLDEST_SECONDS = "stocksvr_reservations_intermediate_oldest_seconds", Gauge, "seconds", [known("status", INTERMEDIATE)],
        "Age of the oldest reservation in that intermediate status, dead ones included; 0 when there is none. PREPARING counts from the Try, CREATED_RESERVED_OVERDUE from processing_time, the others from the row's last change (entering the status, or a failed attempt the recovery worker recorded).";
    RESERVATIONS_STALE = "stocksvr_reservations_stale", Gauge, "reservations", [],
        "RESERVED reservations past expire_at (the order domain never created or failed the order).";
    RESERVATIONS_DEAD = "stocksvr_reservations_dead_total", Counter, "reservations", [known("status", RESUMABLE)],
        "Reservations the recovery worker gave up on and marked dead, by the status they stay in.";
    RESERVATION_CONFLICTS = "stocksvr_reservation_conflicts_total", Counter, "events", [label("reason")],
        "Conflicting order events reported (for example Confirm after Cancel), by reason.";
    RECOVERY_ATTEMPTS = "stocksvr_recovery_attempts_total", Counter, "attempts", [known("outcome", &["resumed", "failed"])],
        "Recovery worker attempts to resume an intermediate reservation, by outcome.";
    REDIS_UNKNOWN_OUTCOMES = "stocksvr_redis_unknown_outcomes_total", Counter, "calls", [known("operation", &["try", "confirm", "cancel", "refund"])],
        "Redis calls whose outcome is unknown (timeout, lost reply); resumed with the same operation id.";
    FENCE_HITS = "stocksvr_fence_hits_total", Counter, "decisions", [known("kind", &["hanging_prevented", "empty_rollback", "order_fenced"])],
        "Fence decisions: a late Try fenced (hanging prevented), a Cancel with no Try (empty rollback), a Try of a failed order refused.";
    LUA_INVARIANT_REFUSALS = "stocksvr_lua_invariant_refusals_total", Counter, "calls", [known("script", LUA_SCRIPTS)],
        "Oversell alarm: a Lua script refused because the stored numbers broke an invariant (negative, or not summing to total).";
    WAL_OPERATIONS = "stocksvr_wal_operations_total", Counter, "rows", [known("action", WAL_ACTIONS), known("outcome", &["succeeded", "retry", "dead"])],
        "Operation WAL rows finished or failed, by action and outcome.";
    WAL_BACKLOG = "stocksvr_wal_backlog", Gauge, "rows", [known("action", WAL_ACTIONS)],
        "Unfinished operation WAL rows (INIT, EXECUTING, RETRY, and DEAD until an operator retries them), by action.";
    WAL_OLDEST_SECONDS = "stocksvr_wal_oldest_seconds", Gauge, "seconds", [known("action", WAL_ACTIONS)],
        "Age since created_at of the oldest unfinished operation WAL row (dead ones included), by action; 0 when there is none.";
    WAL_DEAD = "stocksvr_wal_dead_total", Counter, "rows", [known("action", WAL_ACTIONS)],
        "Operation WAL rows marked dead after their last attempt, by action.";
    BUCKET_DEFICIT = "stocksvr_bucket_deficit_total", Counter, "adjusts", [],
        "Merchant adjusts that set a total below reserved + sold (a deficit was recorded).";
    BUCKETS_LOST = "stocksvr_buckets_lost", Gauge, "buckets", [],
        "Buckets whose Redis key is lost and not yet rebuilt (they fail closed).";
    DAILY_BUCKETS_PREPARED = "stocksvr_daily_buckets_prepared_total", Counter, "buckets", [],
        "Buckets the daily job created ahead of the merchant's day.";
    OUTBOX_BACKLOG = "stocksvr_outbox_backlog", Gauge, "rows", [],
        "Outbox rows not yet sent to Kafka.";
    OUTBOX_OLDEST_PENDING_SECONDS = "stocksvr_outbox_oldest_pending_seconds", Gauge, "seconds", [],
        "Age of the oldest unsent outbox row; 0 when there is none.";
    OUTBOX_PUBLISHED = "stocksvr_outbox_published_total", Counter, "rows", [label("topic"), label("event_type")],
        "Outbox events published and acknowledged by the broker, by the event's topic and type (a reservation step's row carries two: its stock change and its lifecycle event).";
    OUTBOX_PUBLISH_FAILURES = "stocksvr_outbox_publish_failures_total", Counter, "rows", [label("topic"), label("event_type"), known("reason", &["encode", "delivery", "timeout"])],
        "Outbox events whose publish failed, by reason; the row that carries the event is retried with backoff.";
    OUTBOX_PUBLISH_DELAY_SECONDS = "stocksvr_outbox_publish_delay_seconds", Histogram, "seconds", [],
        "Delay from an outbox row created (its transaction) to the broker's acknowledgement of its record.";
    OUTBOX_BATCH_PUBLISH_SECONDS = "stocksvr_outbox_batch_publish_seconds", Histogram, "seconds", [],
        "Time to publish one batch of outbox rows (encode, send, acknowledgements, then the high-water mark or the retry marks).";
    OUTBOX_PURGED = "stocksvr_outbox_purged_total", Counter, "rows", [],
        "Sent outbox rows deleted by the purge after their retention.";
    PROJECTOR_EVENTS_PROJECTED = "stocksvr_projector_events_projected_total", Counter, "events", [label("event")],
        "Stock-change events booked by the projector, by event name.";
    PROJECTOR_DUPLICATES = "stocksvr_projector_duplicates_total", Counter, "events", [],
        "Stock-change events whose operation the ledger had booked already (a redelivery): nothing applied.";
    PROJECTOR_STALE = "stocksvr_projector_stale_total", Counter, "events", [],
        "Stock-change events older than the snapshot's version: booked in the ledger, snapshot left as it is.";
    PROJECTOR_BATCH_SIZE = "stocksvr_projector_batch_size", Histogram, "events", [],
        "Events per projector transaction.";
    PROJECTION_DELAY_SECONDS = "stocksvr_projection_delay_seconds", Histogram, "seconds", [],
        "Delay from an event's occurred_at to its batch committed by the projector (snapshot and ledger booked); redeliveries are not counted.";
    ORDER_EVENTS_DEFERRED = "stocksvr_order_events_deferred", Gauge, "events", [],
        "Order events parked while waiting for their predecessor (RefundRequested before its OrderCreated, say).";
    ORDER_EVENTS_DEFERRED_OLDEST_SECONDS = "stocksvr_order_events_deferred_oldest_seconds", Gauge, "seconds", [],
        "Age of the oldest parked order event; 0 when there is none.";
    DEAD_LETTERS_PARKED_TOTAL = "stocksvr_dead_letters_parked_total", Counter, "dead letters", [label("topic"), known("class", &["invalid", "undecodable"])],
        "Dead letters parked in MySQL by the dead-letter processor, by dead-letter topic and error class.";
    DEAD_LETTERS_PARKED = "stocksvr_dead_letters_parked", Gauge, "dead letters", [],
        "Parked dead letters not yet replayed or discarded (read from MySQL every 15 s).";
    DEAD_LETTERS_FOREIGN = "stocksvr_dead_letters_foreign_total", Counter, "dead letters", [label("topic")],
        "Dead letters on a shared dead-letter topic written by another deployment's group: left alone.";
    DEAD_LETTERS_REPLAYED = "stocksvr_dead_letters_replayed_total", Counter, "dead letters", [label("topic")],
        "Parked dead letters put back on their original topic by an operator.";
    DEAD_LETTERS_DISCARDED = "stocksvr_dead_letters_discarded_total", Counter, "dead letters", [],
        "Parked dead letters an operator discarded.";
    SCHEDULE_ARMED = "stocksvr_schedule_armed_total", Counter, "entries",
        [known("source", &["order_created", "load_ahead"]), known("outcome", &["added", "present", "failed"])],
        "Time-wheel entries armed for scheduled reservations.";
    SCHEDULE_FIRED = "stocksvr_schedule_fired_total", Counter, "entries", [label("outcome"), label("reason")],
        "Time-wheel entries claimed, by outcome (emitted, already_emitted, dropped, later).";
    SCHEDULE_FIRE_LATENESS_SECONDS = "stocksvr_schedule_fire_lateness_seconds", Histogram, "seconds", [],
        "How long after processing_time the wheel emitted InventoryConfirmDue.";
    SCHEDULE_TRIGGERS = "stocksvr_schedule_triggers_total", Counter, "records",
        [known("outcome", &["confirmed", "already_confirmed", "stale", "left_to_scan", "lost_to_refund"])],
        "InventoryConfirmDue records handled, by outcome.";
    SCHEDULE_REDRIVEN = "stocksvr_schedule_scan_redriven_total", Counter, "reservations",
        [known("outcome", &["confirmed", "already_confirmed", "not_yet", "conflict", "failed"])],
        "Scheduled reservations the scan confirmed itself because the wheel missed them.";
    SCHEDULE_OVERDUE = "stocksvr_schedule_overdue", Gauge, "reservations", [],
        "CREATED_RESERVED reservations past processing_time + grace at the last scan.";
    RECONCILE_BUCKETS_CHECKED = "stocksvr_reconcile_buckets_checked_total", Counter, "buckets", [],
        "Buckets the reconciler compared (Redis against MySQL).";
    RECONCILE_GUARDS_READ = "stocksvr_reconcile_guards_read_total", Counter, "reservations", [],
        "Held reservations whose fence and op record a full check read from Redis (paced by reconcile.guard_reads_per_sec).";
    RECONCILE_CONSISTENT_RATIO = "stocksvr_reconcile_consistent_ratio", Gauge, "ratio", [],
        "Consistent buckets / buckets checked in the last reconcile pass.";
    RECONCILE_DIFFERENCES = "stocksvr_reconcile_differences", Gauge, "buckets", [known("kind", DIFFERENCES)],
        "Unresolved differences between Redis and MySQL, by kind.";
    PERIODIC_ROUNDS = "stocksvr_periodic_rounds_total", Counter, "rounds",
        [label("task"), known("outcome", &["full", "partial", "empty", "idle", "failed"])],
        "Rounds of each periodic task (outbox relay, recovery worker, re-driver of parked order events, time-wheel poller, ...) by what the round found: full (a backlog), partial, empty, idle (work done, next round on its own schedule) or failed (a retryable error). A task whose count stops growing has stopped; the rate of empty rounds is what an idle deployment costs in polls.";
    RECONCILE_HELD_BACK = "stocksvr_reconcile_held_back", Gauge, "buckets", [known("reason", &["in_flight", "version_moved", "first_sighting"])],
        "Buckets with a difference not reported yet in the last pass, by why (in-flight work, the Redis version moved, seen once).";
    RECONCILE_OLDEST_DIFFERENCE_SECONDS = "stocksvr_reconcile_oldest_difference_seconds", Gauge, "seconds", [],
        "Age of the oldest unresolved reconcile difference; 0 when there is none.";
    RECONCILE_REPAIRS = "stocksvr_reconcile_repairs_total", Counter, "repairs", [known("outcome", &["repaired", "version_changed", "failed"])],
        "Versioned repairs, by outcome.";
    RECONCILE_REPAIR_SECONDS = "stocksvr_reconcile_repair_seconds", Histogram, "seconds", [],
        "Time from a difference's first sighting to its repair (the on-demand check counts from its first pass).";
    RECONCILE_LAST_PASS_TIMESTAMP_SECONDS = "stocksvr_reconcile_last_pass_timestamp_seconds", Gauge, "unix seconds", [],
        "Unix time of the last finished reconcile pass.";
}

/// Declared metrics nothing emits yet, each with the part that will: the table says so and
/// the call-site check (`emitted.rs`) accepts them, and refuses them once a call site exists
/// (then they leave this list).
pub const NOT_EMITTED_YET: &[(&str, &str)] = &[];

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
    let mut out = String::from("{\n  \"description\": \"The metrics stocksvr exports, generated from processors/telemetry (STOCKSVR_UPDATE_CATALOG=1 cargo test -p stocksvr-telemetry). Dashboards and alert rules may only name these (tests/observability/lint_dashboards.py). label_values: the values each series exists with from start-up (at 0). not_emitted_yet: declared, no code emits it yet (the live query check skips it).\",\n");
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
            let pending = NOT_EMITTED_YET
                .iter()
                .find(|(name, _)| *name == m.name)
                .map(|(_, by)| format!(", \"not_emitted_yet\": \"{}\"", esc(by)))
                .unwrap_or_default();
            format!(
                "    {{\"name\": \"{}\", \"type\": \"{}\", \"unit\": \"{}\", \"labels\": [{labels}]{values}{pending}, \"help\": \"{}\"}}",
                m.name,
                m.kind.name(),
                m.unit,
                esc(m.help)
            )
        })
        .collect();
    out.push_str(&rows.join(",\n"));
    out.push_str("\n  ]\n}\n");
    out
}

/// `docs/metrics.md`: the catalog as a table (name, type, unit, labels with their known
/// values, help), kept identical by a test like the JSON file.
pub fn metrics_markdown() -> String {
    fn cell(s: &str) -> String {
        s.replace('|', "\\|")
    }
    let mut out = String::from(
        "# Metrics\n\n\
         Every metric stocksvr serves on `/metrics`, generated from the catalog in \
         `processors/telemetry/src/lib.rs` (`STOCKSVR_UPDATE_CATALOG=1 cargo test -p \
         stocksvr-telemetry` rewrites this file and `prometheus/metrics-catalog.json`; a test \
         fails while they differ). Counters and gauges whose labels all have known values \
         (listed in parentheses) exist from start-up at 0; a label without values gets them at \
         run time. Every histogram has the buckets ",
    );
    out.push_str(
        &LATENCY_BUCKETS
            .iter()
            .map(|b| b.to_string())
            .collect::<Vec<_>>()
            .join(", "),
    );
    out.push_str(" (seconds), which resolve p50 and p99 between 1 ms and 1 s");
    // The recorder has one bucket set for every histogram: say which ones it does not fit.
    let other: Vec<String> = CATALOG
        .iter()
        .filter(|m| m.kind == Kind::Histogram && m.unit != "seconds")
        .map(|m| format!("`{}` ({})", m.name, m.unit))
        .collect();
    if !other.is_empty() {
        out.push_str(&format!(
            "; {} count something else with the same bounds, so only their `_sum` and \
             `_count` mean anything",
            other.join(", ")
        ));
    }
    out.push_str(".\n\n| name | type | unit | labels | help |\n|---|---|---|---|---|\n");
    for m in CATALOG {
        let labels = if m.labels.is_empty() {
            "-".to_string()
        } else {
            m.labels
                .iter()
                .map(|l| {
                    if l.values.is_empty() {
                        format!("`{}`", l.name)
                    } else {
                        format!("`{}` ({})", l.name, l.values.join(", "))
                    }
                })
                .collect::<Vec<_>>()
                .join(", ")
        };
        let pending = NOT_EMITTED_YET
            .iter()
            .find(|(name, _)| *name == m.name)
            .map(|(_, by)| format!(" *Declared, not emitted yet: {by}.*"))
            .unwrap_or_default();
        out.push_str(&format!(
            "| `{}` | {} | {} | {} | {}{} |\n",
            m.name,
            m.kind.name(),
            m.unit,
            cell(&labels),
            cell(m.help),
            pending
        ));
    }
    out
}

#[cfg(test)]
mod emitted;

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

    /// Writes `generated` to `relative` (from the repository root) under
    /// `STOCKSVR_UPDATE_CATALOG=1`, then requires the file to equal it.
    fn in_sync(relative: &str, generated: &str) {
        let dir = std::env::var("CARGO_MANIFEST_DIR")
            .unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").into());
        let path = format!("{dir}/../../{relative}");
        if std::env::var("STOCKSVR_UPDATE_CATALOG").is_ok_and(|v| v == "1") {
            std::fs::write(&path, generated).expect("write the generated file");
        }
        let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            on_disk == generated,
            "{path} differs from processors/telemetry: run STOCKSVR_UPDATE_CATALOG=1 cargo test -p stocksvr-telemetry"
        );
    }

    #[test]
    fn the_catalog_file_is_this_catalog() {
        let generated = catalog_json();
        serde_json::from_str::<serde_json::Value>(&generated).expect("valid JSON");
        in_sync("prometheus/metrics-catalog.json", &generated);
    }

    #[test]
    fn the_metrics_table_is_this_catalog() {
        let table = metrics_markdown();
        // One row per metric, each naming its type and unit.
        for m in CATALOG {
            let row = format!("| `{}` | {} | {} |", m.name, m.kind.name(), m.unit);
            assert_eq!(table.matches(&row).count(), 1, "{row}");
        }
        assert!(table
            .contains("`operation` (try, confirm, cancel, refund, partialrefund, markcreated)"));
        in_sync("docs/metrics.md", &table);
    }

    #[test]
    fn units_agree_with_the_names() {
        for m in CATALOG {
            let want = if m.name.ends_with("_timestamp_seconds") {
                Some("unix seconds")
            } else if m.name.ends_with("_seconds") {
                Some("seconds")
            } else if m.name.ends_with("_ratio") {
                Some("ratio")
            } else {
                None
            };
            match want {
                Some(unit) => assert_eq!(m.unit, unit, "{}", m.name),
                None => assert!(
                    !m.unit.is_empty() && !m.unit.contains("seconds") && m.unit != "ratio",
                    "{}: unit {:?} belongs in the name's suffix",
                    m.name,
                    m.unit
                ),
            }
        }
    }

    #[test]
    fn latency_buckets_resolve_between_a_millisecond_and_a_second() {
        // histogram_quantile interpolates inside one bucket: bounds at most 2.5 times apart
        // from 1 ms to 1 s keep a p50 or p99 there within that factor of the truth.
        assert_eq!(LATENCY_BUCKETS.first(), Some(&0.001));
        assert!(LATENCY_BUCKETS.contains(&1.0));
        for w in LATENCY_BUCKETS.windows(2) {
            assert!(w[0] < w[1], "ascending");
            if w[1] <= 1.0 {
                assert!(w[1] / w[0] <= 2.5 + 1e-9, "{} .. {} too coarse", w[0], w[1]);
            }
        }
        assert!(LATENCY_BUCKETS.iter().any(|b| *b > 1.0), "room above 1 s");
    }

    #[test]
    fn metrics_not_emitted_yet_are_in_the_catalog() {
        for (name, _) in NOT_EMITTED_YET {
            assert!(CATALOG.iter().any(|m| m.name == *name), "{name}");
        }
    }
}
