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

mod http;
mod security;
pub use self::http::{
    parse_clients_file, ClientAuth, HttpAuthSettings, HttpClient, HttpSettings, HttpTlsSettings,
    Scope, RESERVED_CLIENT_NAMES,
};
pub use security::{
    read_secret_file, resolve_connections, LoadedTls, SaslMechanism, SaslSettings,
    SecurityProtocol, TlsFiles,
};

/// Environment variable prefix; `STOCKSVR__MYSQL__URL` sets `mysql.url`.
pub const ENV_PREFIX: &str = "STOCKSVR";

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("configuration: {0}")]
    Load(#[from] config::ConfigError),
    #[error("configuration file {0} does not exist")]
    MissingFile(String),
    #[error("configuration: {0}")]
    Invalid(String),
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

/// The connection settings of the servers every part of stocksvr talks to. The binary's
/// whole configuration (`stocksvr::Settings`) holds these plus each domain crate's own
/// section; this struct alone reads just these sections and ignores the others, for tools
/// and tests that only need to reach the servers.
#[derive(Debug, Clone, Deserialize, Serialize, Default)]
#[serde(default)]
pub struct InfraSettings {
    pub kafka: KafkaSettings,
    pub registry: RegistrySettings,
    pub mysql: MysqlSettings,
    pub redis: RedisSettings,
    pub http: HttpSettings,
    pub log: LogSettings,
    pub consumer: ConsumerSettings,
}

/// The shared consumer loop of every processor ([`crate::consumer`]).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ConsumerSettings {
    /// First delay before a record whose dependency (MySQL, Redis, the registry) is
    /// unavailable is tried again, in milliseconds; it doubles up to `retry_max_backoff_ms`.
    /// An outage is retried without an attempt limit: a dead letter is for a record that can
    /// never apply, not for one that arrived while a server was down.
    pub retry_min_backoff_ms: u64,
    /// Longest delay between two attempts during an outage, in milliseconds.
    pub retry_max_backoff_ms: u64,
    /// Longest one attempt at a batch may take (every MySQL statement and Redis call has a
    /// shorter deadline of its own); an attempt past it counts as a dependency outage.
    pub attempt_timeout_ms: u64,
    /// librdkafka `max.poll.interval.ms`. The loop keeps polling while it waits out an
    /// outage (the partitions are paused, not abandoned), so the only thing that can exceed
    /// this is one attempt, bounded by `attempt_timeout_ms`: the default leaves four times
    /// that. A process stuck beyond it is taken out of the group and its partitions move to
    /// a healthy instance.
    pub max_poll_interval_ms: u64,
    /// librdkafka `session.timeout.ms` of every consumer group member: a member the group
    /// coordinator has not heard from for this long is dead, and its partitions go to the
    /// others. The heartbeats come from librdkafka's own thread, so a busy or stalled loop
    /// does not miss them; only a dead, frozen or cut-off process does. 6 s (librdkafka's
    /// default is 45 s) is the broker's lowest allowed (`group.min.session.timeout.ms`): a
    /// killed instance's partitions are read again by the others 6-9 s later instead of
    /// 45-48 s. The price: a process frozen (or cut off from the coordinator) for more than
    /// this is dropped and costs two rebalances instead of none. Not sent when
    /// `kafka.properties` set `group.protocol=consumer` (KIP-848: the broker owns the
    /// session timeout there, 45 s at least by default) or `session.timeout.ms` itself.
    pub session_timeout_ms: u64,
    /// librdkafka `heartbeat.interval.ms`: how often each member tells the coordinator it
    /// lives, and learns of a rebalance. At most a third of `session_timeout_ms`, so two
    /// lost heartbeats do not end a session. One heartbeat request per consumer loop (a
    /// processor's group) per interval: 2 s makes an `all` instance's four loops send two a
    /// second. Not sent under `group.protocol=consumer`, as above.
    pub heartbeat_interval_ms: u64,
}

impl Default for ConsumerSettings {
    fn default() -> Self {
        Self {
            retry_min_backoff_ms: 500,
            retry_max_backoff_ms: 10_000,
            attempt_timeout_ms: 30_000,
            max_poll_interval_ms: 120_000,
            session_timeout_ms: 6_000,
            heartbeat_interval_ms: 2_000,
        }
    }
}

impl ConsumerSettings {
    /// Rejects timings librdkafka or the broker would refuse later, in one line that names
    /// the keys: a heartbeat that cannot fit three times into the session, a session longer
    /// than the poll interval (librdkafka refuses to create the consumer), or a session
    /// outside the broker's default bounds (6 s to 30 min; the join is refused).
    pub fn validate(&self) -> Result<(), String> {
        if self.session_timeout_ms < 6_000 || self.session_timeout_ms > 1_800_000 {
            return Err(format!(
                "consumer.session_timeout_ms {} is outside 6000..=1800000 (the broker's \
                 group.min/max.session.timeout.ms by default)",
                self.session_timeout_ms
            ));
        }
        if self.heartbeat_interval_ms == 0
            || self.heartbeat_interval_ms.saturating_mul(3) > self.session_timeout_ms
        {
            return Err(format!(
                "consumer.heartbeat_interval_ms {} must be above 0 and at most a third of \
                 consumer.session_timeout_ms {}",
                self.heartbeat_interval_ms, self.session_timeout_ms
            ));
        }
        if self.max_poll_interval_ms < self.session_timeout_ms {
            return Err(format!(
                "consumer.max_poll_interval_ms {} must be at least consumer.session_timeout_ms {}",
                self.max_poll_interval_ms, self.session_timeout_ms
            ));
        }
        Ok(())
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
    /// Prefix of every topic of this deployment: with `staging` the order events are read
    /// from `staging.order.lifecycle.v1` and its dead letters go to
    /// `staging.order.lifecycle.v1.dlt`. Empty (the default): the names of the topics file as
    /// they are. Lets several deployments (or a test, a benchmark, the demo) share one Kafka
    /// cluster without reading each other's records. 0-100 characters of `[A-Za-z0-9._-]`.
    pub topic_namespace: String,
    /// The environment of the topics file whose replication factor and
    /// `min.insync.replicas` `stocksvr topics apply` uses (`local`: one broker, `cluster`:
    /// three brokers, 3 replicas, min.insync.replicas 2). Empty: the file's `environment`.
    pub topics_environment: String,
    /// Timeout of admin and metadata requests, in milliseconds.
    pub request_timeout_ms: u64,
    /// `plaintext` (the default, for a trusted network), `ssl`, `sasl_plaintext` or
    /// `sasl_ssl`: librdkafka's `security.protocol`, for every Kafka client of the process.
    pub security_protocol: SecurityProtocol,
    /// TLS of `ssl` and `sasl_ssl`: the CA that verifies the brokers (their host names are
    /// checked), and a client certificate and key for mutual TLS.
    pub tls: TlsFiles,
    /// SASL of `sasl_plaintext` and `sasl_ssl`: mechanism, user and password.
    pub sasl: SaslSettings,
    /// Extra librdkafka properties for every client, applied after the settings above (so
    /// they win), with `_` standing for `.` so a key can also come from an environment
    /// variable (`broker_address_family` is `broker.address.family`; librdkafka names
    /// contain no underscores). Values are secrets and never printed.
    pub properties: BTreeMap<String, Secret>,
}

impl Default for KafkaSettings {
    fn default() -> Self {
        Self {
            brokers: "127.0.0.1:9092".into(),
            client_id: "stocksvr".into(),
            group_prefix: "stocksvr".into(),
            topics_file: "topics.yaml".into(),
            topic_namespace: String::new(),
            topics_environment: String::new(),
            request_timeout_ms: 10_000,
            security_protocol: SecurityProtocol::default(),
            tls: TlsFiles::default(),
            sasl: SaslSettings::default(),
            properties: BTreeMap::new(),
        }
    }
}

impl KafkaSettings {
    pub fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.request_timeout_ms)
    }

    /// This deployment's topic namespace.
    pub fn namespace(&self) -> Namespace {
        Namespace::new(&self.topic_namespace)
    }

    /// The name of the topic the topics file declares as `logical` in this deployment.
    pub fn topic(&self, logical: &str) -> String {
        self.namespace().topic(logical)
    }

    /// The declared name of one of this deployment's topics, or None for a topic outside
    /// its namespace.
    pub fn logical_topic<'a>(&self, topic: &'a str) -> Option<&'a str> {
        if self.topic_namespace.is_empty() {
            return Some(topic);
        }
        topic
            .strip_prefix(self.topic_namespace.as_str())
            .and_then(|rest| rest.strip_prefix('.'))
    }

    /// Refuses a namespace Kafka would refuse inside a topic name.
    pub fn validate(&self) -> Result<(), String> {
        let ns = &self.topic_namespace;
        if ns.len() > 100
            || !ns
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        {
            return Err(format!(
                "kafka.topic_namespace {ns:?}: use at most 100 characters of [A-Za-z0-9._-]"
            ));
        }
        Ok(())
    }
}

/// The prefix that turns the topic names of the topics file into one deployment's
/// (`kafka.topic_namespace`): several deployments, tests or benchmarks share a cluster
/// without reading each other's records. Empty: the names as declared.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Namespace(String);

impl Namespace {
    pub fn new(namespace: &str) -> Self {
        Self(namespace.to_string())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The deployment's name of the declared topic `logical`.
    pub fn topic(&self, logical: &str) -> String {
        if self.0.is_empty() {
            logical.to_string()
        } else {
            format!("{}.{logical}", self.0)
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RegistrySettings {
    /// Base URL of a Confluent-compatible schema registry API (for Apicurio 3:
    /// `http://host:8081/apis/ccompat/v7`); `https://` for TLS.
    pub url: String,
    /// TLS of an `https://` URL: the CA that verifies the registry (its host name is
    /// checked), and a client certificate and key for mutual TLS.
    pub tls: TlsFiles,
    /// Basic-auth user, if the registry requires one.
    pub username: Option<String>,
    /// Basic-auth password. Prefer `password_file`.
    pub password: Option<Secret>,
    /// A file holding the basic-auth password (read at start; a trailing line break is
    /// dropped).
    pub password_file: Option<std::path::PathBuf>,
    /// Bearer token (`Authorization: Bearer`), instead of basic auth. Prefer `token_file`.
    pub token: Option<Secret>,
    /// A file holding the bearer token (read at start).
    pub token_file: Option<std::path::PathBuf>,
    /// Timeout of one registry request, in milliseconds.
    pub timeout_ms: u64,
}

impl Default for RegistrySettings {
    fn default() -> Self {
        Self {
            url: "http://127.0.0.1:8081/apis/ccompat/v7".into(),
            tls: TlsFiles::default(),
            username: None,
            password: None,
            password_file: None,
            token: None,
            token_file: None,
            timeout_ms: 5_000,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct MysqlSettings {
    /// `mysql://user:password@host:port/database`; MariaDB 10.11+ or MySQL 8.0+. TLS is
    /// set in the query as sqlx reads it: `?ssl-mode=VERIFY_IDENTITY&ssl-ca=<ca.pem>` (the
    /// server's certificate and host name checked), plus `&ssl-cert=..&ssl-key=..` for a
    /// `REQUIRE X509` user. `ssl-mode=REQUIRED` encrypts without checking the server.
    pub url: Secret,
    /// A file holding the password, which replaces the URL's (read at start; a trailing
    /// line break is dropped).
    pub password_file: Option<std::path::PathBuf>,
    /// Upper bound of the connection pool.
    pub max_connections: u32,
    /// How long to wait for a pooled connection, in milliseconds.
    pub acquire_timeout_ms: u64,
    /// Deadline of every statement, in milliseconds. A server that stalls (stopped, or a
    /// network black hole) answers nothing; past this the statement fails like a refused
    /// connection and the caller waits for MySQL as for any outage.
    pub statement_timeout_ms: u64,
    /// Ping a pooled connection before every use (sqlx's default). The pool pings every
    /// connection when it comes back anyway (sqlx does, to drop a broken one), so this second
    /// round trip only finds one that died while idle (a restarted server, a reset
    /// connection); off, such a connection fails its first statement as an I/O error, which
    /// every caller takes for MySQL being briefly unavailable (503, or the step retried).
    /// Off halves the pings (0.59 instead of 1.1 per Try at 64 connections, 3.4 instead of
    /// 6.4–7.1 at one), but the bench showed no throughput gain on two cores, so it stays on.
    pub ping_before_use: bool,
}

impl Default for MysqlSettings {
    fn default() -> Self {
        Self {
            url: Secret::new("mysql://stocksvr:stocksvr@127.0.0.1:3307/stocksvr"),
            password_file: None,
            max_connections: 16,
            acquire_timeout_ms: 5_000,
            statement_timeout_ms: 5_000,
            ping_before_use: true,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RedisSettings {
    /// `standalone`: one server at `url`. `cluster`: a Redis Cluster reached through `nodes`
    /// (every script call touches one bucket's hash tag, so one slot).
    pub mode: RedisMode,
    /// `redis://[user[:password]@]host:port/db`, `rediss://` for TLS; the server in
    /// `standalone` mode, unused in `cluster`.
    pub url: Secret,
    /// A file holding the password of `url`'s user (or of every seed's in `cluster` mode),
    /// which replaces the URL's (read at start; a trailing line break is dropped).
    pub password_file: Option<std::path::PathBuf>,
    /// TLS of `rediss://` URLs: the CA that verifies the servers (their host names or IPs
    /// are checked), and a client certificate and key for `tls-auth-clients`.
    pub tls: TlsFiles,
    /// Seed nodes of the cluster, `redis://[:password@]host:port` each (any reachable one is
    /// enough: the client learns the others from the cluster). Only read in `cluster` mode. As
    /// a variable: `STOCKSVR__REDIS__NODES=redis://h1:7000,redis://h2:7001`.
    pub nodes: Vec<Secret>,
    /// Replicas that must acknowledge a script's writes before its result counts (Redis
    /// `WAIT`); 0 = do not wait. Replication is asynchronous, so without it a master killed
    /// right after a Try can take the Try with it while MySQL records it RESERVED; with 1 (a
    /// cluster with one replica per master) such a Try is retried instead. A master without a
    /// reachable replica then refuses to answer (503) until one is back: fail closed.
    /// Unset: 1 in `cluster` mode (where a failover is expected), 0 in `standalone`.
    pub wait_replicas: Option<u32>,
    /// How long a script call waits for `wait_replicas`, in milliseconds; a shortfall is an
    /// UNKNOWN outcome, retried with the same operation id.
    pub wait_timeout_ms: u64,
    /// Timeout of one Redis command, in milliseconds. A Lua call that times out is an
    /// UNKNOWN outcome and is retried with the same operation id, never assumed failed.
    pub response_timeout_ms: u64,
}

/// How stocksvr reaches Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RedisMode {
    #[default]
    Standalone,
    Cluster,
}

impl RedisMode {
    pub const fn name(self) -> &'static str {
        match self {
            RedisMode::Standalone => "standalone",
            RedisMode::Cluster => "cluster",
        }
    }
}

impl RedisSettings {
    /// The settings checked: `cluster` needs at least one seed node.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.mode == RedisMode::Cluster && self.nodes.is_empty() {
            return Err(ConfigError::Invalid(
                "redis.mode = \"cluster\" needs at least one seed in redis.nodes".into(),
            ));
        }
        Ok(())
    }

    /// The seed URLs, for handing to the client library. Never log the result.
    pub fn exposed_nodes(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.expose().to_string()).collect()
    }
}

impl Default for RedisSettings {
    fn default() -> Self {
        Self {
            mode: RedisMode::Standalone,
            url: Secret::new("redis://127.0.0.1:6380/"),
            password_file: None,
            tls: TlsFiles::default(),
            nodes: Vec::new(),
            wait_replicas: None,
            wait_timeout_ms: 500,
            response_timeout_ms: 2_000,
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
    /// `text` (human-readable lines) or `json` (one object per line, with the span's ids,
    /// for log shippers).
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

/// Builds `T` from the layers: built-in defaults (`T`'s), then `file` (if given; a missing file
/// is an error), then `STOCKSVR__SECTION__FIELD` variables (`env` replaces the process
/// environment in tests).
pub fn load_layered<T: serde::de::DeserializeOwned>(
    file: Option<&Path>,
    env: Option<std::collections::HashMap<String, String>>,
) -> Result<T, ConfigError> {
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
        // Only these keys are lists; every other value keeps its commas (librdkafka properties).
        .list_separator(",")
        .with_list_parse_key("redis.nodes")
        .with_list_parse_key("http.public_paths")
        .with_list_parse_key("http.auth.allowed_subjects")
        .source(env);
    builder = builder.add_source(environment);
    Ok(builder.build()?.try_deserialize()?)
}

impl InfraSettings {
    /// Defaults, then `file`, then the environment (see [`load_layered`]).
    pub fn load(file: Option<&Path>) -> Result<Self, ConfigError> {
        let mut settings: Self = load_layered(file, None)?;
        settings.kafka.validate().map_err(ConfigError::Invalid)?;
        settings.redis.validate()?;
        resolve_connections(
            &mut settings.kafka,
            &mut settings.registry,
            &mut settings.mysql,
            &mut settings.redis,
        )?;
        Ok(settings)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn infra(env: HashMap<String, String>) -> InfraSettings {
        load_layered(None, Some(env)).expect("loads")
    }

    #[test]
    fn defaults_point_at_the_local_stack() {
        let s = infra(HashMap::new());
        assert_eq!(s.kafka.brokers, "127.0.0.1:9092");
        assert_eq!(s.redis.url.expose(), "redis://127.0.0.1:6380/");
        assert_eq!(s.log.format, LogFormat::Text);
        assert_eq!(s.consumer.max_poll_interval_ms, 120_000);
        assert_eq!(s.consumer.session_timeout_ms, 6_000);
        assert_eq!(s.consumer.heartbeat_interval_ms, 2_000);
        s.consumer
            .validate()
            .expect("the default group timing is valid");
        assert_eq!(s.http.max_in_flight, 256);
    }

    #[test]
    fn group_timings_librdkafka_or_the_broker_would_refuse_are_refused_naming_the_key() {
        let refused = |session: u64, heartbeat: u64, poll: u64| {
            ConsumerSettings {
                session_timeout_ms: session,
                heartbeat_interval_ms: heartbeat,
                max_poll_interval_ms: poll,
                ..ConsumerSettings::default()
            }
            .validate()
            .expect_err("refused")
        };
        assert!(refused(5_000, 1_000, 120_000).contains("session_timeout_ms"));
        assert!(refused(6_000, 2_001, 120_000).contains("heartbeat_interval_ms"));
        assert!(refused(6_000, 0, 120_000).contains("heartbeat_interval_ms"));
        assert!(refused(45_000, 3_000, 30_000).contains("max_poll_interval_ms"));
    }

    #[test]
    fn cluster_seeds_come_as_a_comma_separated_variable_and_stay_masked() {
        let s = infra(HashMap::from([
            ("STOCKSVR__REDIS__MODE".to_string(), "cluster".to_string()),
            (
                "STOCKSVR__REDIS__NODES".to_string(),
                "redis://:pw@127.0.0.1:7000,redis://:pw@127.0.0.1:7001".to_string(),
            ),
        ]));
        assert_eq!(s.redis.mode, RedisMode::Cluster);
        assert_eq!(
            s.redis.exposed_nodes(),
            ["redis://:pw@127.0.0.1:7000", "redis://:pw@127.0.0.1:7001"]
        );
        assert!(s.redis.validate().is_ok());
        let shown = serde_json::to_string(&s.redis).expect("serializes");
        assert!(!shown.contains("pw"), "{shown}");
        assert!(!format!("{:?}", s.redis).contains("pw"));
        // librdkafka properties keep their commas: only redis.nodes is a list.
        let s = infra(HashMap::from([(
            "STOCKSVR__KAFKA__BROKERS".to_string(),
            "a:1,b:2".to_string(),
        )]));
        assert_eq!(s.kafka.brokers, "a:1,b:2");
        let mut r = RedisSettings {
            mode: RedisMode::Cluster,
            ..RedisSettings::default()
        };
        assert!(r.validate().is_err(), "cluster without seeds");
        r.mode = RedisMode::Standalone;
        assert!(r.validate().is_ok());
    }

    #[test]
    fn infra_settings_ignore_the_domain_sections() {
        let s = infra(HashMap::from([
            (
                "STOCKSVR__RESERVATION__MAX_QUANTITY".to_string(),
                "5".to_string(),
            ),
            (
                "STOCKSVR__MYSQL__MAX_CONNECTIONS".to_string(),
                "3".to_string(),
            ),
        ]));
        assert_eq!(s.mysql.max_connections, 3);
    }

    #[test]
    fn a_namespace_prefixes_every_topic_and_is_validated() {
        let mut k = KafkaSettings::default();
        assert_eq!(
            k.topic("inventory.stock-change.v1"),
            "inventory.stock-change.v1"
        );
        k.topic_namespace = "bench_1".into();
        assert!(k.validate().is_ok());
        assert_eq!(
            k.topic("inventory.stock-change.v1"),
            "bench_1.inventory.stock-change.v1"
        );
        assert_eq!(
            k.logical_topic("bench_1.inventory.stock-change.v1"),
            Some("inventory.stock-change.v1")
        );
        assert_eq!(k.logical_topic("bench_10.inventory.stock-change.v1"), None);
        for bad in ["a b", "x/y", &"n".repeat(101)] {
            k.topic_namespace = bad.to_string();
            assert!(k.validate().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn secrets_never_reach_debug_or_serialized_output() {
        let s = infra(HashMap::from([
            (
                "STOCKSVR__MYSQL__URL".to_string(),
                "mysql://u:hunter2@db/x".to_string(),
            ),
            (
                "STOCKSVR__HTTP__ADMIN_TOKEN".to_string(),
                "hunter3".to_string(),
            ),
        ]));
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
    fn missing_config_file_is_an_error() {
        let err = load_layered::<InfraSettings>(
            Some(Path::new("/nonexistent/x.toml")),
            Some(HashMap::new()),
        )
        .expect_err("must fail");
        assert!(matches!(err, ConfigError::MissingFile(_)));
    }
}
