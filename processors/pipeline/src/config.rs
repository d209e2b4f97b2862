//! Layered configuration: built-in defaults, then an optional TOML file, then
//! `STOCKSVR__SECTION__FIELD` environment variables (double underscore between levels).
//!
//! Every field is documented here and in `config/stocksvr.example.toml`. Unknown keys are
//! rejected so a typo in a variable name fails at start instead of being silently ignored.
//! Credentials are held in [`Secret`] so `Debug` output and logs never show them.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::time::Duration;

/// Environment variable prefix; `STOCKSVR__MYSQL__URL` sets `mysql.url`.
pub const ENV_PREFIX: &str = "STOCKSVR";

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("configuration: {0}")]
    Load(#[from] config::ConfigError),
    #[error("configuration file {0} does not exist")]
    MissingFile(String),
}

/// A credential or a URL that embeds one. Shown as `***` by `Debug`, `Display` and `Serialize`.
#[derive(Clone, Deserialize, PartialEq, Eq)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }
    /// The raw value, for handing to a client library. Never log the result.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("\"***\"")
    }
}

impl Serialize for Secret {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str("***")
    }
}

/// Removes the password from `scheme://user:password@host/...` so a URL can be logged.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    match rest.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split(':').next().unwrap_or_default();
            format!("{scheme}://{user}:***@{host}")
        }
        None => url.to_string(),
    }
}

#[derive(Debug, Clone, Deserialize, Serialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    pub kafka: KafkaSettings,
    pub registry: RegistrySettings,
    pub mysql: MysqlSettings,
    pub redis: RedisSettings,
    pub http: HttpSettings,
    pub log: LogSettings,
    pub reservation: ReservationSettings,
    pub stock_ops: StockOpsSettings,
    pub schedule: ScheduleSettings,
}

/// Stock operations without a reservation (bucket init, adjust, close, archive) and the
/// daily bucket job.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct StockOpsSettings {
    /// Seconds a worker owns a WAL row it executes; after that another worker takes it over.
    pub wal_lease_secs: u64,
    /// Failed attempts after which a WAL row is marked dead and alerted.
    pub wal_max_attempts: u32,
    /// Hours an archived bucket's Redis key lives on. A refund after that cannot return stock
    /// to its day and is left to an operator: keep it at least the refund window.
    pub archive_ttl_hours: u64,
    /// Seconds between two rounds of the daily bucket job.
    pub daily_interval_secs: u64,
    /// Minutes before the merchant's local midnight the next day's buckets are prepared.
    pub daily_lead_minutes: u64,
    /// A dish without a baseline in this many days is not carried forward.
    pub daily_lookback_days: u32,
}

impl Default for StockOpsSettings {
    fn default() -> Self {
        Self {
            wal_lease_secs: 30,
            wal_max_attempts: 20,
            archive_ttl_hours: 720,
            daily_interval_secs: 300,
            daily_lead_minutes: 120,
            daily_lookback_days: 7,
        }
    }
}

/// Scheduled confirms: the Redis time wheel and the DB scan behind it.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ScheduleSettings {
    /// Namespace of the wheel's Redis keys (`inv:{schedule:<namespace>:<shard>}:due`).
    /// Instances with the same namespace share one wheel; give each environment that shares
    /// a Redis its own. 1-64 characters of `[A-Za-z0-9._-]`.
    pub wheel_namespace: String,
    /// Sorted sets the wheel is spread over (reservation id modulo shards). Entries left in a
    /// shard that a smaller count drops are re-armed by the load-ahead or confirmed by the scan.
    pub shards: u16,
    /// How often each instance claims due entries from the wheel, in milliseconds.
    pub tick_ms: u64,
    /// How long a claimed entry stays hidden from other pollers before it falls due again
    /// (its claimant died before emitting), in seconds.
    pub claim_timeout_secs: u64,
    /// Period of the DB scan that confirms CREATED_RESERVED reservations the wheel missed
    /// and re-arms those due soon, in seconds.
    pub scan_interval_secs: u64,
    /// The scan leaves a due reservation to the wheel for this many seconds past its
    /// processing_time before confirming it itself.
    pub scan_grace_secs: u64,
    /// The scan re-arms CREATED_RESERVED reservations due within this many seconds (an entry
    /// lost from Redis is rebuilt before it is due). At least `scan_interval_secs`.
    pub load_ahead_secs: u64,
}

impl Default for ScheduleSettings {
    fn default() -> Self {
        Self {
            wheel_namespace: "stocksvr".into(),
            shards: 8,
            tick_ms: 200,
            claim_timeout_secs: 30,
            scan_interval_secs: 30,
            scan_grace_secs: 30,
            load_ahead_secs: 600,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReservationSettings {
    /// Snowflake worker id (0-1023) of this instance. Unset: leased from MySQL
    /// (`snowflake_worker_lease`), which guarantees two running instances never share one.
    pub worker_id: Option<u16>,
    /// IANA time zone of merchants without a `merchant_settings` row.
    pub default_timezone: String,
    /// A RESERVED reservation is alerted after this many seconds (never cancelled).
    pub hold_ttl_secs: u64,
    /// How many seconds in the past a scheduled order's processing_time may lie.
    pub scheduled_grace_secs: u64,
    /// Largest quantity of one Try.
    pub max_quantity: u32,
    /// Days Redis keeps each operation's first result (the idempotency window).
    pub op_ttl_days: u64,
}

impl Default for ReservationSettings {
    fn default() -> Self {
        Self {
            worker_id: None,
            default_timezone: "UTC".into(),
            hold_ttl_secs: 1800,
            scheduled_grace_secs: 300,
            max_quantity: 999,
            op_ttl_days: 30,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct KafkaSettings {
    /// `bootstrap.servers`: comma-separated host:port list.
    pub brokers: String,
    /// `client.id` prefix; each processor appends its own name.
    pub client_id: String,
    /// Consumer group prefix; a processor's group is `<prefix>.<processor>`.
    pub group_prefix: String,
    /// Path of the topic declarations applied by `stocksvr topics apply`.
    pub topics_file: String,
    /// Timeout of admin and metadata requests, in milliseconds.
    pub request_timeout_ms: u64,
    /// Extra librdkafka properties for every client, with `_` standing for `.` so a key can
    /// also come from an environment variable (`security_protocol` is `security.protocol`;
    /// librdkafka names contain no underscores). Values are secrets and never printed.
    pub properties: BTreeMap<String, Secret>,
}

impl Default for KafkaSettings {
    fn default() -> Self {
        Self {
            brokers: "127.0.0.1:9092".into(),
            client_id: "stocksvr".into(),
            group_prefix: "stocksvr".into(),
            topics_file: "topics.yaml".into(),
            request_timeout_ms: 10_000,
            properties: BTreeMap::new(),
        }
    }
}

impl KafkaSettings {
    pub fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.request_timeout_ms)
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RegistrySettings {
    /// Base URL of a Confluent-compatible schema registry API (for Apicurio 3:
    /// `http://host:8081/apis/ccompat/v7`).
    pub url: String,
    /// Basic-auth user, if the registry requires one.
    pub username: Option<String>,
    /// Basic-auth password.
    pub password: Option<Secret>,
    /// Timeout of one registry request, in milliseconds.
    pub timeout_ms: u64,
}

impl Default for RegistrySettings {
    fn default() -> Self {
        Self {
            url: "http://127.0.0.1:8081/apis/ccompat/v7".into(),
            username: None,
            password: None,
            timeout_ms: 5_000,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct MysqlSettings {
    /// `mysql://user:password@host:port/database`; MariaDB 10.11+ or MySQL 8.0+.
    pub url: Secret,
    /// Upper bound of the connection pool.
    pub max_connections: u32,
    /// How long to wait for a pooled connection, in milliseconds.
    pub acquire_timeout_ms: u64,
}

impl Default for MysqlSettings {
    fn default() -> Self {
        Self {
            url: Secret::new("mysql://stocksvr:stocksvr@127.0.0.1:3307/stocksvr"),
            max_connections: 16,
            acquire_timeout_ms: 5_000,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RedisSettings {
    /// `redis://[:password@]host:port/db`.
    pub url: Secret,
    /// Timeout of one Redis command, in milliseconds. A Lua call that times out is an
    /// UNKNOWN outcome and is retried with the same operation id, never assumed failed.
    pub response_timeout_ms: u64,
}

impl Default for RedisSettings {
    fn default() -> Self {
        Self {
            url: Secret::new("redis://127.0.0.1:6380/"),
            response_timeout_ms: 2_000,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpSettings {
    /// Address of the HTTP listener serving the API, `/metrics`, `/healthz` and `/readyz`.
    pub listen: String,
    /// When set, every `/admin/...` endpoint requires `Authorization: Bearer <token>`.
    pub admin_token: Option<Secret>,
    /// Timeout of each dependency check behind `/readyz`, in milliseconds.
    pub readiness_timeout_ms: u64,
}

impl Default for HttpSettings {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:8080".into(),
            admin_token: None,
            readiness_timeout_ms: 2_000,
        }
    }
}

#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line, for log shippers.
    Json,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogSettings {
    pub format: LogFormat,
    /// `tracing` filter directive, e.g. `info,stocksvr=debug`. `RUST_LOG` overrides it.
    pub filter: String,
}

impl Default for LogSettings {
    fn default() -> Self {
        Self {
            format: LogFormat::Text,
            filter: "info,librdkafka=warn,sqlx=warn".into(),
        }
    }
}

impl Settings {
    /// Defaults, then `file` (if given; a missing file is an error), then the environment.
    pub fn load(file: Option<&Path>) -> Result<Self, ConfigError> {
        Self::load_from(file, None)
    }

    /// As [`Settings::load`], with the environment replaced by `env` (for tests).
    pub fn load_from(
        file: Option<&Path>,
        env: Option<std::collections::HashMap<String, String>>,
    ) -> Result<Self, ConfigError> {
        let mut builder = config::Config::builder();
        if let Some(path) = file {
            if !path.exists() {
                return Err(ConfigError::MissingFile(path.display().to_string()));
            }
            builder = builder.add_source(config::File::from(path));
        }
        let environment = config::Environment::with_prefix(ENV_PREFIX)
            .prefix_separator("__")
            .separator("__")
            .try_parsing(true)
            .source(env);
        builder = builder.add_source(environment);
        Ok(builder.build()?.try_deserialize()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn defaults_point_at_the_local_stack() {
        let s = Settings::load_from(None, Some(HashMap::new())).expect("defaults load");
        assert_eq!(s.kafka.brokers, "127.0.0.1:9092");
        assert_eq!(s.redis.url.expose(), "redis://127.0.0.1:6380/");
        assert_eq!(s.log.format, LogFormat::Text);
    }

    #[test]
    fn environment_overrides_nested_fields() {
        let env = HashMap::from([
            (
                "STOCKSVR__KAFKA__BROKERS".to_string(),
                "k1:9092,k2:9092".to_string(),
            ),
            (
                "STOCKSVR__MYSQL__MAX_CONNECTIONS".to_string(),
                "3".to_string(),
            ),
            ("STOCKSVR__LOG__FORMAT".to_string(), "json".to_string()),
            (
                "STOCKSVR__HTTP__ADMIN_TOKEN".to_string(),
                "t0ken".to_string(),
            ),
        ]);
        let s = Settings::load_from(None, Some(env)).expect("env loads");
        assert_eq!(s.kafka.brokers, "k1:9092,k2:9092");
        assert_eq!(s.mysql.max_connections, 3);
        assert_eq!(s.log.format, LogFormat::Json);
        assert_eq!(
            s.http.admin_token.as_ref().map(Secret::expose),
            Some("t0ken")
        );
    }

    #[test]
    fn unknown_keys_are_rejected() {
        let env = HashMap::from([("STOCKSVR__MYSQL__URLL".to_string(), "x".to_string())]);
        let err = Settings::load_from(None, Some(env)).expect_err("typo must fail");
        assert!(err.to_string().contains("urll"), "{err}");
    }

    #[test]
    fn secrets_never_reach_debug_or_serialized_output() {
        let env = HashMap::from([
            (
                "STOCKSVR__MYSQL__URL".to_string(),
                "mysql://u:hunter2@db/x".to_string(),
            ),
            (
                "STOCKSVR__HTTP__ADMIN_TOKEN".to_string(),
                "hunter3".to_string(),
            ),
        ]);
        let s = Settings::load_from(None, Some(env)).expect("loads");
        let debug = format!("{s:?}");
        let json = serde_json::to_string(&s).expect("serializes");
        for shown in [debug, json] {
            assert!(
                !shown.contains("hunter2") && !shown.contains("hunter3"),
                "{shown}"
            );
        }
    }

    #[test]
    fn redact_url_hides_only_the_password() {
        assert_eq!(
            redact_url("mysql://u:p@h:3307/db"),
            "mysql://u:***@h:3307/db"
        );
        assert_eq!(
            redact_url("redis://127.0.0.1:6380/"),
            "redis://127.0.0.1:6380/"
        );
    }

    #[test]
    fn the_example_file_loads_and_equals_the_defaults() {
        let dir = std::env::var("CARGO_MANIFEST_DIR")
            .unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").into());
        let file = format!("{dir}/../../config/stocksvr.example.toml");
        let path = Path::new(&file);
        let from_file =
            Settings::load_from(Some(path), Some(HashMap::new())).expect("example loads");
        let defaults = Settings::load_from(None, Some(HashMap::new())).expect("defaults");
        assert_eq!(
            serde_json::to_value(&from_file).expect("json"),
            serde_json::to_value(&defaults).expect("json")
        );
        assert_eq!(from_file.mysql.url.expose(), defaults.mysql.url.expose());
    }

    #[test]
    fn missing_config_file_is_an_error() {
        let err = Settings::load_from(Some(Path::new("/nonexistent/x.toml")), Some(HashMap::new()))
            .expect_err("must fail");
        assert!(matches!(err, ConfigError::MissingFile(_)));
    }
}
