//! Readiness probes of the four dependencies behind `/readyz`.

use futures::future::BoxFuture;
use futures::FutureExt;
use sqlx::MySqlPool;
use stocksvr_pipeline::config::KafkaSettings;
use stocksvr_pipeline::http::{Advisory, Probe};
use stocksvr_pipeline::registry::RegistryClient;

pub struct KafkaProbe(pub KafkaSettings);

impl Probe for KafkaProbe {
    fn name(&self) -> &'static str {
        "kafka"
    }
    fn check(&self) -> BoxFuture<'_, Result<(), String>> {
        async move {
            let metadata = stocksvr_pipeline::kafka::fetch_metadata(&self.0)
                .await
                .map_err(|e| e.to_string())?;
            if metadata.brokers().is_empty() {
                return Err("metadata lists no broker".into());
            }
            Ok(())
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
                .map_err(|e| e.to_string())
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
                    let client = redis::Client::open(url.as_str()).map_err(|e| e.to_string())?;
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
                    stocksvr_store::connect_redis(target, self.timeout)
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
