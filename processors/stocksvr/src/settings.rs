//! The whole configuration of the binary: the server connections every part shares
//! ([`InfraSettings`]' sections) plus each domain crate's own section, declared where the code
//! that reads it lives.
//!
//! Layers, later wins: built-in defaults, an optional TOML file, then
//! `STOCKSVR__SECTION__FIELD` environment variables (double underscore between levels). Every
//! field is documented at its declaration and in `config/stocksvr.example.toml`. Unknown keys
//! are rejected, so a typo in a variable name fails at start instead of being ignored.
//! Credentials are held in `Secret`, so neither `Debug` output nor `stocksvr config` shows
//! them; a credential given as a file (`*_file`) is read at load.

use serde::{Deserialize, Serialize};
use std::path::Path;
use stocksvr_api::auth::Guard;
use stocksvr_pipeline::config::{
    load_layered, resolve_connections, ConfigError, ConsumerSettings, HttpSettings, InfraSettings,
    KafkaSettings, LoadedTls, LogSettings, MysqlSettings, RedisSettings, RegistrySettings,
};
use stocksvr_pipeline::config::{redact_url, RedisMode};
use stocksvr_reconciler::ReconcileSettings;
use stocksvr_reservation::settings::{RecoverySettings, ReservationSettings, StockOpsSettings};
use stocksvr_schedule::ScheduleSettings;

#[derive(Debug, Clone, Deserialize, Serialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    pub kafka: KafkaSettings,
    pub registry: RegistrySettings,
    pub mysql: MysqlSettings,
    pub redis: RedisSettings,
    pub http: HttpSettings,
    pub log: LogSettings,
    pub consumer: ConsumerSettings,
    pub reservation: ReservationSettings,
    pub recovery: RecoverySettings,
    pub stock_ops: StockOpsSettings,
    pub reconcile: ReconcileSettings,
    pub schedule: ScheduleSettings,
    pub relay: stocksvr_outbox_relay::RelaySettings,
    pub lag_exporter: stocksvr_lag_exporter::LagExporterConfig,
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
        let mut settings: Self = load_layered(file, env)?;
        settings.kafka.validate().map_err(ConfigError::Invalid)?;
        settings.redis.validate()?;
        settings.http.validate().map_err(ConfigError::Invalid)?;
        settings.consumer.validate().map_err(ConfigError::Invalid)?;
        let Self {
            kafka,
            registry,
            mysql,
            redis,
            ..
        } = &mut settings;
        resolve_connections(kafka, registry, mysql, redis)?;
        Ok(settings)
    }

    /// The server connections alone, for the parts that need nothing else.
    pub fn infra(&self) -> InfraSettings {
        InfraSettings {
            kafka: self.kafka.clone(),
            registry: self.registry.clone(),
            mysql: self.mysql.clone(),
            redis: self.redis.clone(),
            http: self.http.clone(),
            log: self.log.clone(),
            consumer: self.consumer.clone(),
        }
    }
}

/// Who may reach `/admin/*` of a listener: the decision [`admin_access`] takes at start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdminAccess {
    /// Loopback listener and no caller configured: only processes on this host can
    /// connect, which is the trust boundary of an operator running `stocksvr` locally.
    Open,
    /// Callers are configured (`http.auth`, or the deprecated `http.admin_token`): every
    /// `/admin/*` request needs a client with the `admin` scope.
    Token,
    /// A listener other hosts can reach and no caller configured (only possible with
    /// `http.allow_unauthenticated`): `/admin/*` answers 403 `admin_disabled`; the Try API
    /// and the probes still serve.
    Refused,
}

/// Decides [`AdminAccess`] from the address the listener is bound to (after name
/// resolution, so `localhost:8080` counts as loopback and `0.0.0.0:8080`, every interface,
/// does not). Admin endpoints change stock and replay dead letters: served without a caller
/// check they must not be reachable from another host.
pub fn admin_access(bound: std::net::SocketAddr, callers_configured: bool) -> AdminAccess {
    match (callers_configured, is_loopback(bound)) {
        (true, _) => AdminAccess::Token,
        (false, true) => AdminAccess::Open,
        (false, false) => AdminAccess::Refused,
    }
}

pub fn is_loopback(bound: std::net::SocketAddr) -> bool {
    match bound.ip() {
        std::net::IpAddr::V4(ip) => ip.is_loopback(),
        // `::ffff:127.0.0.1` is the IPv4 loopback seen through an IPv6 socket.
        std::net::IpAddr::V6(ip) => {
            ip.is_loopback() || ip.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
    }
}

/// Who may call the listener, decided once at start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Access {
    /// Every path outside `/admin` and `http.public_paths`: a configured caller with the
    /// `api` scope once `http.auth` configures any (the deprecated `http.admin_token`
    /// alone leaves it open, as it always did).
    pub api: Guard,
    pub admin: AdminAccess,
}

/// Decides [`Access`] for a listener bound to `bound`. Secure by default: a listener other
/// hosts can reach without any caller authentication is refused (one line saying how to
/// fix it) unless `http.allow_unauthenticated` says that is meant.
pub fn access(bound: std::net::SocketAddr, http: &HttpSettings) -> Result<Access, String> {
    let callers = http.auth.configured();
    if !callers && !is_loopback(bound) && !http.allow_unauthenticated {
        return Err(format!(
            "refusing to start: the HTTP listener {bound} can be reached from other hosts and no \
             caller authentication is configured; configure http.auth (clients, clients_file or \
             allowed_subjects), or set http.allow_unauthenticated = true \
             (STOCKSVR__HTTP__ALLOW_UNAUTHENTICATED=true) to serve every caller"
        ));
    }
    Ok(Access {
        api: if callers { Guard::Callers } else { Guard::Open },
        admin: admin_access(bound, callers || http.admin_token().is_some()),
    })
}

/// Where Redis is, from `redis.mode`, `redis.url` and `redis.nodes` (validated at load).
pub fn redis_target(redis: &RedisSettings) -> stocksvr_store::RedisTarget {
    match redis.mode {
        RedisMode::Standalone => stocksvr_store::RedisTarget::Standalone {
            url: redis.url.expose().to_string(),
        },
        RedisMode::Cluster => stocksvr_store::RedisTarget::Cluster {
            nodes: redis.exposed_nodes(),
        },
    }
}

/// The CA and client certificate of `rediss://` (`redis.tls.*`), read now; `None` without
/// TLS files.
pub fn redis_tls(redis: &RedisSettings) -> Result<Option<redis::TlsCertificates>, ConfigError> {
    if redis.tls.is_empty() {
        return Ok(None);
    }
    let LoadedTls { ca, client } = redis.tls.read("redis.tls")?;
    Ok(Some(redis::TlsCertificates {
        client_tls: client.map(|(client_cert, client_key)| redis::ClientTlsConfig {
            client_cert,
            client_key,
        }),
        root_cert: ca,
    }))
}

/// The replication wait of the Lua executor (`redis.wait_replicas`, `redis.wait_timeout_ms`).
pub fn replication_wait(redis: &RedisSettings) -> stocksvr_store::lua::ReplicationWait {
    stocksvr_store::lua::ReplicationWait {
        // A cluster fails over by design, so by default nothing counts until a replica has
        // it; a standalone server has no replica to wait for.
        replicas: redis.wait_replicas.unwrap_or(match redis.mode {
            RedisMode::Cluster => 1,
            RedisMode::Standalone => 0,
        }),
        timeout: std::time::Duration::from_millis(redis.wait_timeout_ms),
    }
}

/// The Redis endpoint(s) for a log line or an error message, passwords masked.
pub fn redis_redacted(redis: &RedisSettings) -> String {
    match redis.mode {
        RedisMode::Standalone => redact_url(redis.url.expose()),
        RedisMode::Cluster => format!(
            "redis cluster [{}]",
            redis
                .nodes
                .iter()
                .map(|n| redact_url(n.expose()))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use stocksvr_pipeline::config::{LogFormat, Secret};

    #[test]
    fn defaults_point_at_the_local_stack() {
        let s = Settings::load_from(None, Some(HashMap::new())).expect("defaults load");
        assert_eq!(s.kafka.brokers, "127.0.0.1:9092");
        assert_eq!(s.redis.url.expose(), "redis://127.0.0.1:6380/");
        assert_eq!(s.log.format, LogFormat::Text);
        assert_eq!(s.kafka.topic("order.lifecycle.v1"), "order.lifecycle.v1");
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
            (
                "STOCKSVR__KAFKA__TOPIC_NAMESPACE".to_string(),
                "staging".to_string(),
            ),
            ("STOCKSVR__RELAY__BATCH_SIZE".to_string(), "50".to_string()),
        ]);
        let s = Settings::load_from(None, Some(env)).expect("env loads");
        assert_eq!(s.kafka.brokers, "k1:9092,k2:9092");
        assert_eq!(s.mysql.max_connections, 3);
        assert_eq!(s.log.format, LogFormat::Json);
        assert_eq!(s.relay.batch_size, 50);
        assert_eq!(
            s.http.admin_token.as_ref().map(Secret::expose),
            Some("t0ken")
        );
        assert_eq!(
            s.kafka.topic("order.lifecycle.v1"),
            "staging.order.lifecycle.v1"
        );
        assert_eq!(
            s.kafka.logical_topic("staging.order.lifecycle.v1"),
            Some("order.lifecycle.v1")
        );
        assert_eq!(s.kafka.logical_topic("order.lifecycle.v1"), None);
    }

    #[test]
    fn a_namespace_kafka_would_refuse_is_rejected() {
        let env = HashMap::from([(
            "STOCKSVR__KAFKA__TOPIC_NAMESPACE".to_string(),
            "a/b".to_string(),
        )]);
        let err = Settings::load_from(None, Some(env)).expect_err("must fail");
        assert!(err.to_string().contains("topic_namespace"), "{err}");
    }

    #[test]
    fn unknown_keys_are_rejected() {
        let env = HashMap::from([("STOCKSVR__MYSQL__URLL".to_string(), "x".to_string())]);
        let err = Settings::load_from(None, Some(env)).expect_err("typo must fail");
        assert!(err.to_string().contains("urll"), "{err}");
        let env = HashMap::from([("STOCKSVR__NOPE__X".to_string(), "x".to_string())]);
        assert!(Settings::load_from(None, Some(env)).is_err());
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

    fn example_file() -> std::path::PathBuf {
        let dir = std::env::var("CARGO_MANIFEST_DIR")
            .unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").into());
        Path::new(&dir).join("../../config/stocksvr.example.toml")
    }

    #[test]
    fn the_example_file_loads_and_equals_the_defaults() {
        let file = example_file();
        let path = file.as_path();
        let from_file =
            Settings::load_from(Some(path), Some(HashMap::new())).expect("example loads");
        let defaults = Settings::load_from(None, Some(HashMap::new())).expect("defaults");
        assert_eq!(
            serde_json::to_value(&from_file).expect("json"),
            serde_json::to_value(&defaults).expect("json")
        );
        assert_eq!(from_file.mysql.url.expose(), defaults.mysql.url.expose());
    }

    /// `section.key` of every `key = value` line of a TOML file, commented out or not, and
    /// every `[section]` header: an optional setting is documented as `# key = example`.
    fn documented_keys(text: &str) -> std::collections::BTreeSet<String> {
        let mut keys = std::collections::BTreeSet::new();
        let mut section = String::new();
        for line in text.lines().map(str::trim) {
            if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
                section = name.to_string();
                keys.insert(section.clone());
                continue;
            }
            let line = line.trim_start_matches('#').trim_start();
            let Some((key, _)) = line.split_once(" = ") else {
                continue;
            };
            if !key.is_empty() && key.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
                keys.insert(format!("{section}.{key}"));
            }
        }
        keys
    }

    fn setting_paths(value: &serde_json::Value, prefix: &str, out: &mut Vec<String>) {
        match value {
            serde_json::Value::Object(fields) if !fields.is_empty() => {
                for (key, field) in fields {
                    let path = if prefix.is_empty() {
                        key.clone()
                    } else {
                        format!("{prefix}.{key}")
                    };
                    setting_paths(field, &path, out);
                }
            }
            _ => out.push(prefix.to_string()),
        }
    }

    #[test]
    fn the_example_file_documents_every_setting() {
        let text = std::fs::read_to_string(example_file()).expect("example file");
        let documented = documented_keys(&text);
        let defaults = Settings::load_from(None, Some(HashMap::new())).expect("defaults");
        let mut paths = Vec::new();
        setting_paths(
            &serde_json::to_value(&defaults).expect("json"),
            "",
            &mut paths,
        );
        assert!(paths.len() > 50, "{paths:?}");
        let missing: Vec<&String> = paths.iter().filter(|p| !documented.contains(*p)).collect();
        assert!(
            missing.is_empty(),
            "settings missing from config/stocksvr.example.toml: {missing:?}"
        );
    }

    #[test]
    fn missing_config_file_is_an_error() {
        let err = Settings::load_from(Some(Path::new("/nonexistent/x.toml")), Some(HashMap::new()))
            .expect_err("must fail");
        assert!(matches!(err, ConfigError::MissingFile(_)));
    }

    #[test]
    fn an_exposed_listener_needs_callers_or_an_explicit_opt_out() {
        let addr = |s: &str| s.parse::<std::net::SocketAddr>().expect("address");
        let mut http = HttpSettings::default();
        let refused = access(addr("0.0.0.0:8080"), &http).expect_err("refused");
        assert_eq!(refused.lines().count(), 1, "{refused}");
        for fix in [
            "http.auth",
            "http.allow_unauthenticated = true",
            "0.0.0.0:8080",
        ] {
            assert!(refused.contains(fix), "{refused}");
        }
        // The deprecated admin token alone authenticates no API caller.
        http.admin_token = Some(Secret::new("t"));
        assert!(access(addr("10.0.0.1:80"), &http).is_err());
        assert_eq!(
            access(addr("127.0.0.1:8080"), &http),
            Ok(Access {
                api: Guard::Open,
                admin: AdminAccess::Token
            })
        );
        http.admin_token = None;
        http.allow_unauthenticated = true;
        assert_eq!(
            access(addr("0.0.0.0:8080"), &http),
            Ok(Access {
                api: Guard::Open,
                admin: AdminAccess::Refused
            })
        );
        http.allow_unauthenticated = false;
        http.auth.clients_file = Some("/run/secrets/clients".into());
        assert_eq!(
            access(addr("0.0.0.0:8080"), &http),
            Ok(Access {
                api: Guard::Callers,
                admin: AdminAccess::Token
            })
        );
    }

    #[test]
    fn admin_is_refused_only_off_loopback_without_a_token() {
        let addr = |s: &str| s.parse::<std::net::SocketAddr>().expect("address");
        for loopback in [
            "127.0.0.1:8080",
            "127.3.2.1:1",
            "[::1]:8080",
            "[::ffff:127.0.0.1]:80",
        ] {
            assert_eq!(
                admin_access(addr(loopback), false),
                AdminAccess::Open,
                "{loopback}"
            );
            assert_eq!(
                admin_access(addr(loopback), true),
                AdminAccess::Token,
                "{loopback}"
            );
        }
        for exposed in [
            "0.0.0.0:8080",
            "[::]:8080",
            "10.1.2.3:8080",
            "192.168.0.7:80",
            "[fe80::1]:8080",
            "[::ffff:10.0.0.1]:80",
        ] {
            assert_eq!(
                admin_access(addr(exposed), false),
                AdminAccess::Refused,
                "{exposed}"
            );
            assert_eq!(
                admin_access(addr(exposed), true),
                AdminAccess::Token,
                "{exposed}"
            );
        }
    }
}
