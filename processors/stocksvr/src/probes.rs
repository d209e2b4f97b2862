//! Readiness probes of the four dependencies behind `/readyz`. Each names the cause of a
//! failure in one line: what the check itself met, and for Kafka also what refuses the
//! process's other clients ([`stocksvr_pipeline::causes`]: a refused password, a missing
//! ACL), which a metadata request alone does not see.

use futures::future::BoxFuture;
use futures::FutureExt;
use rdkafka::admin::AdminClient;
use sqlx::MySqlPool;
use std::sync::{Arc, PoisonError};
use stocksvr_pipeline::causes;
use stocksvr_pipeline::config::KafkaSettings;
use stocksvr_pipeline::failure::{describe_sqlx, Dependency};
use stocksvr_pipeline::http::{Advisory, Probe};
use stocksvr_pipeline::kafka::KafkaContext;
use stocksvr_pipeline::registry::RegistryClient;

pub struct KafkaProbe {
    pub settings: KafkaSettings,
    /// How long the metadata request may take: less than the readiness timeout, so a
    /// refusal known from the other clients is answered instead of a timeout.
    pub within: std::time::Duration,
    /// The deployment's topics (dead-letter topics included), each of which must be
    /// visible to this process.
    pub topics: Vec<String>,
    /// The client the checks share while nothing refuses the process, so a check costs one
    /// metadata request instead of a new connection (a TLS handshake and a SCRAM exchange
    /// with `SASL_SSL`, which took half a second on a loaded host).
    client: std::sync::Mutex<Option<Arc<AdminClient<KafkaContext>>>>,
}

impl KafkaProbe {
    pub fn new(settings: &KafkaSettings, readiness_timeout: std::time::Duration) -> Self {
        let topics = stocksvr_pipeline::topics::for_deployment(settings)
            .map(|specs| specs.into_iter().map(|s| s.name).collect())
            .unwrap_or_default();
        Self {
            settings: settings.clone(),
            within: readiness_timeout * 3 / 4,
            topics,
            client: std::sync::Mutex::default(),
        }
    }

    /// The shared client, or a new one while a refusal is kept: only a connection that
    /// authenticated just now proves a refused password or an untrusted certificate gone
    /// (a kept connection authenticated before the change). The new client is kept.
    fn client(&self) -> Result<Arc<AdminClient<KafkaContext>>, String> {
        let mut kept = self.client.lock().unwrap_or_else(PoisonError::into_inner);
        let refused = !causes::current(Dependency::Kafka).is_empty();
        if let (Some(client), false) = (kept.as_ref(), refused) {
            return Ok(Arc::clone(client));
        }
        let client = Arc::new(
            stocksvr_pipeline::kafka::admin_client(&self.settings).map_err(|e| e.to_string())?,
        );
        *kept = Some(Arc::clone(&client));
        Ok(client)
    }

    /// Metadata of the cluster, with every declared topic in it.
    async fn metadata(&self) -> Result<(), String> {
        let client = self.client()?;
        let metadata =
            stocksvr_pipeline::kafka::fetch_metadata_on(&client, self.settings.request_timeout())
                .await
                .map_err(|e| e.to_string())?;
        if metadata.brokers().is_empty() {
            return Err("metadata lists no broker".into());
        }
        // The request authenticated over TLS with the process's credentials.
        causes::ruled_out(Dependency::Kafka, |c| {
            c.starts_with("SASL") || c.starts_with("TLS")
        });
        let listed: std::collections::HashSet<&str> =
            metadata.topics().iter().map(|t| t.name()).collect();
        let Some(missing) = self.topics.iter().find(|t| !listed.contains(t.as_str())) else {
            return Ok(());
        };
        // A topic this principal may not Describe is left out of the list just like one
        // that does not exist; asking for it by name tells which.
        let settings = self.settings.clone();
        let topic = missing.clone();
        tokio::task::spawn_blocking(move || {
            stocksvr_pipeline::kafka::describe_topic(&settings, &topic)
        })
        .await
        .map_err(|e| e.to_string())?
    }
}

impl Probe for KafkaProbe {
    fn name(&self) -> &'static str {
        "kafka"
    }
    fn check(&self) -> BoxFuture<'_, Result<(), String>> {
        async move {
            let checked = match tokio::time::timeout(self.within, self.metadata()).await {
                Ok(checked) => checked,
                Err(_) => Err(format!("no metadata within {} ms", self.within.as_millis())),
            };
            let refusals = causes::current(Dependency::Kafka);
            match (checked, refusals.is_empty()) {
                (Ok(()), true) => Ok(()),
                (Err(e), true) => Err(e),
                // A refusal says more than the timeout it causes here.
                (_, false) => Err(refusals.join("; ")),
            }
        }
        .boxed()
    }
}

pub struct RegistryProbe(pub RegistryClient);

impl Probe for RegistryProbe {
    fn name(&self) -> &'static str {
        "schema_registry"
    }
    fn check(&self) -> BoxFuture<'_, Result<(), String>> {
        async move {
            self.0
                .subjects()
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        }
        .boxed()
    }
}

pub struct MysqlProbe(pub MySqlPool);

impl Probe for MysqlProbe {
    fn name(&self) -> &'static str {
        "mysql"
    }
    fn check(&self) -> BoxFuture<'_, Result<(), String>> {
        async move {
            stocksvr_store::ping_mysql(&self.0)
                .await
                .map_err(|e| match e {
                    stocksvr_store::StoreError::Mysql(e) => describe_sqlx(&e),
                    other => other.to_string(),
                })
        }
        .boxed()
    }
}

/// Holds where Redis is, not a connection: each check dials afresh so a Redis restart is seen
/// as soon as it happens and a dead server never blocks start-up. In cluster mode the PING goes
/// to every master (redis-rs routes it to all primaries), so a slot range whose master is down
/// and not yet replaced makes the service not ready.
pub struct RedisProbe {
    pub target: stocksvr_store::RedisTarget,
    /// CA and client certificate of `rediss://` (`redis.tls.*`).
    pub tls: Option<redis::TlsCertificates>,
    pub timeout: std::time::Duration,
}

impl Probe for RedisProbe {
    fn name(&self) -> &'static str {
        "redis"
    }
    fn check(&self) -> BoxFuture<'_, Result<(), String>> {
        async move {
            let mut conn: stocksvr_store::RedisConn = match &self.target {
                // A plain connection: the manager would retry a dead server inside the check.
                stocksvr_store::RedisTarget::Standalone { url } => {
                    let client = stocksvr_store::redis_conn::client(url, self.tls.as_ref())
                        .map_err(|e| e.to_string())?;
                    let conn = client
                        .get_multiplexed_async_connection()
                        .await
                        .map_err(|e| e.to_string())?;
                    let pong: String = redis::cmd("PING")
                        .query_async(&mut { conn })
                        .await
                        .map_err(|e| e.to_string())?;
                    return if pong == "PONG" {
                        Ok(())
                    } else {
                        Err(format!("PING answered {pong}"))
                    };
                }
                target @ stocksvr_store::RedisTarget::Cluster { .. } => {
                    stocksvr_store::connect_redis_tls(target, self.tls.as_ref(), self.timeout)
                        .await
                        .map_err(|e| e.to_string())?
                }
            };
            stocksvr_store::ping_redis(&mut conn)
                .await
                .map_err(|e| e.to_string())
        }
        .boxed()
    }
}

/// The Try API's reservation service: built once Redis answered and a worker id is leased,
/// which can come seconds after every dependency answers its own probe (the start retries
/// Redis with backoff). Ready before that, an instance behind a load balancer would answer
/// every Try 503 "starting".
pub struct ReservationServiceProbe(pub stocksvr_api::ApiState);

impl Probe for ReservationServiceProbe {
    fn name(&self) -> &'static str {
        "reservation_service"
    }
    fn check(&self) -> BoxFuture<'_, Result<(), String>> {
        async move {
            if self.0.is_serving() {
                Ok(())
            } else {
                Err("starting: waiting for its first Redis connection and a worker id".into())
            }
        }
        .boxed()
    }
}

/// Buckets Redis lost and that are not rebuilt yet: each refuses its Trys (503 bucket_lost)
/// while everything else sells, so `/readyz` names them without failing readiness.
pub struct LostBuckets(pub MySqlPool);

impl Advisory for LostBuckets {
    fn name(&self) -> &'static str {
        "buckets_lost"
    }
    fn check(&self) -> BoxFuture<'_, Result<Option<serde_json::Value>, String>> {
        async move {
            let count = stocksvr_store::baselines::count_lost(&self.0)
                .await
                .map_err(|e| e.to_string())?;
            metrics::gauge!(stocksvr_telemetry::names::BUCKETS_LOST).set(count as f64);
            if count == 0 {
                return Ok(None);
            }
            let first = stocksvr_store::baselines::lost_buckets(&self.0, 20)
                .await
                .map_err(|e| e.to_string())?;
            Ok(Some(serde_json::json!({
                "count": count,
                "buckets": first,
                "action": "stocksvr bucket rebuild --all --execute",
            })))
        }
        .boxed()
    }
}
