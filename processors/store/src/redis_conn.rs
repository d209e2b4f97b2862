//! The one Redis connection type of stocksvr: a standalone server through a reconnecting
//! [`ConnectionManager`], or a Redis Cluster through redis-rs' `cluster_async` client.
//!
//! Everything that talks to Redis (the Lua executor, the time wheel, the probes) holds a
//! [`RedisConn`] and never asks which one it is, with one exception: a pipeline of commands on
//! keys of different buckets. A cluster refuses a pipeline whose keys sit in different slots
//! (redis-rs 1.8.1 `cluster_handling/async_connection/routing.rs` `route_for_pipeline` answers
//! CROSSSLOT before sending), so [`RedisConn::pipeline_by_slot`] splits such a pipeline into
//! one pipeline per slot in cluster mode and keeps the single round trip on a standalone
//! server.
//!
//! What redis-rs does for us in cluster mode (read in `redis-1.8.1`):
//! - EVALSHA/EVAL are routed by their first key (`RouteBy::ThirdArgAfterKeyCount`); every
//!   script's keys share one hash tag, so the first key's slot is every key's slot.
//! - On NOSCRIPT `ScriptInvocation::invoke_async` sends `SCRIPT LOAD`, which the cluster
//!   client sends to every node (`RouteBy::AllNodes`), then repeats the EVALSHA once.
//! - MOVED and ASK replies are followed and refresh the slot map; connection errors are retried
//!   (16 times by default) within the overall response timeout, which we set to the response
//!   timeout: a call never waits longer than `redis.response_timeout_ms`, and one that gives up
//!   is an UNKNOWN outcome (`lua::outcome_unknown`).

use futures::future::try_join_all;
use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::Slot;
use redis::{Cmd, Pipeline, RedisFuture, RedisResult, Value};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Where Redis is: one server, or the seed nodes of a cluster (any reachable one is enough;
/// the client discovers the rest from `CLUSTER SLOTS`). URLs may carry credentials: never log
/// them (`Debug` shows only the mode and the number of seeds).
#[derive(Clone, PartialEq, Eq)]
pub enum RedisTarget {
    Standalone { url: String },
    Cluster { nodes: Vec<String> },
}

impl std::fmt::Debug for RedisTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RedisTarget::Standalone { .. } => f.write_str("RedisTarget::Standalone"),
            RedisTarget::Cluster { nodes } => {
                write!(f, "RedisTarget::Cluster({} seeds)", nodes.len())
            }
        }
    }
}

impl RedisTarget {
    /// From the `redis.mode`, `redis.url` and `redis.nodes` settings.
    pub fn from_settings(mode: &str, url: &str, nodes: &[String]) -> Result<Self, String> {
        match mode {
            "standalone" => Ok(RedisTarget::Standalone {
                url: url.to_string(),
            }),
            "cluster" if nodes.is_empty() => {
                Err("redis.mode = \"cluster\" needs at least one seed in redis.nodes".into())
            }
            "cluster" => Ok(RedisTarget::Cluster {
                nodes: nodes.to_vec(),
            }),
            other => Err(format!(
                "redis.mode must be \"standalone\" or \"cluster\", got {other:?}"
            )),
        }
    }

    /// For tests and tools that take their connection from the same variables as the
    /// service: `STOCKSVR__REDIS__MODE`, `STOCKSVR__REDIS__NODES` (comma-separated) and
    /// `STOCKSVR__REDIS__URL`, with `default_url` when the URL is not set. So the whole Lua and
    /// reservation test set runs against a cluster by exporting what `scripts/stack env` prints.
    pub fn from_env(default_url: &str) -> Result<Self, String> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let mode = var("STOCKSVR__REDIS__MODE").unwrap_or_else(|| "standalone".into());
        let url = var("STOCKSVR__REDIS__URL").unwrap_or_else(|| default_url.to_string());
        let nodes: Vec<String> = var("STOCKSVR__REDIS__NODES")
            .map(|v| {
                v.split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(String::from)
                    .collect()
            })
            .unwrap_or_default();
        Self::from_settings(&mode, &url, &nodes)
    }

    pub fn is_cluster(&self) -> bool {
        matches!(self, RedisTarget::Cluster { .. })
    }
}

/// A handle on Redis, standalone or cluster. Cheap to clone: both variants multiplex their
/// connections behind the handle.
#[derive(Clone)]
pub enum RedisConn {
    Standalone(ConnectionManager),
    Cluster(Arc<ClusterHandle>),
}

/// The cluster client's connection, replaced by a fresh one when calls keep failing.
///
/// Why: observed with redis-rs 1.8.1 against redis-server 7.0.15 (the failover test): after a
/// master was killed with kill -9 and its replica promoted, calls for that master's slots kept
/// timing out for the test's whole 240 s on the old connection, even after the killed node was
/// back as a replica. Reading the client (`async_connection/request.rs`), it refreshes its slot
/// map on MOVED and on a missing connection, while a node-level I/O error only reconnects to
/// the same address; the exact path of the stall was not traced further. A new connection
/// reads the slot map afresh from the seeds, as `ConnectionManager` reconnects a standalone
/// server. At most one rebuild runs at a
/// time and at most one starts per `REBUILD_EVERY`; calls in flight finish on the old one.
pub struct ClusterHandle {
    client: redis::cluster::ClusterClient,
    current: Mutex<ClusterConnection>,
    rebuilding: AtomicBool,
    last_rebuild: Mutex<Option<Instant>>,
}

const REBUILD_EVERY: Duration = Duration::from_secs(1);

impl ClusterHandle {
    fn current(&self) -> ClusterConnection {
        // A poisoned lock only means a panic elsewhere mid-clone; the value is still whole.
        self.current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// After a failed call: errors that say a node is gone or the topology moved start a
    /// rebuild of the connection in the background.
    fn failed(self: &Arc<Self>, err: &redis::RedisError) {
        let topology = err.is_io_error()
            || err.is_timeout()
            || err.is_connection_dropped()
            || err.is_connection_refusal()
            || matches!(
                err.kind(),
                redis::ErrorKind::ClusterConnectionNotFound
                    | redis::ErrorKind::Server(
                        redis::ServerErrorKind::ClusterDown
                            | redis::ServerErrorKind::TryAgain
                            | redis::ServerErrorKind::MasterDown
                    )
            );
        if !topology {
            return;
        }
        {
            let last = self.last_rebuild.lock().unwrap_or_else(|p| p.into_inner());
            if last.is_some_and(|t| t.elapsed() < REBUILD_EVERY) {
                return;
            }
        }
        if self.rebuilding.swap(true, Ordering::AcqRel) {
            return;
        }
        let handle = Arc::clone(self);
        tokio::spawn(async move {
            match handle.client.get_async_connection().await {
                Ok(conn) => {
                    *handle.current.lock().unwrap_or_else(|p| p.into_inner()) = conn;
                    tracing::warn!(
                        "redis cluster: calls failing; connection rebuilt from the seeds"
                    );
                }
                Err(e) => {
                    tracing::warn!(error = %e, "redis cluster: rebuilding the connection failed; the next failure tries again")
                }
            }
            *handle
                .last_rebuild
                .lock()
                .unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
            handle.rebuilding.store(false, Ordering::Release);
        });
    }
}

impl From<ConnectionManager> for RedisConn {
    fn from(conn: ConnectionManager) -> Self {
        RedisConn::Standalone(conn)
    }
}

impl ConnectionLike for RedisConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            RedisConn::Standalone(c) => c.req_packed_command(cmd),
            RedisConn::Cluster(h) => {
                let h = Arc::clone(h);
                Box::pin(async move {
                    let mut conn = h.current();
                    let reply = conn.req_packed_command(cmd).await;
                    if let Err(e) = &reply {
                        h.failed(e);
                    }
                    reply
                })
            }
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            RedisConn::Standalone(c) => c.req_packed_commands(cmd, offset, count),
            RedisConn::Cluster(h) => {
                let h = Arc::clone(h);
                Box::pin(async move {
                    let mut conn = h.current();
                    let reply = conn.req_packed_commands(cmd, offset, count).await;
                    if let Err(e) = &reply {
                        h.failed(e);
                    }
                    reply
                })
            }
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            RedisConn::Standalone(c) => c.get_db(),
            RedisConn::Cluster(h) => h.current().get_db(),
        }
    }
}

impl RedisConn {
    pub fn is_cluster(&self) -> bool {
        matches!(self, RedisConn::Cluster(_))
    }

    /// `WAIT replicas timeout_ms` on the connection that carried the last write to `key`'s
    /// master: how many replicas acknowledged every write sent on it so far (ours included,
    /// since its reply has arrived). The connection is multiplexed, so this may also wait for
    /// other callers' writes: never less safe, occasionally slower. In cluster mode WAIT would
    /// be sent to every master by default; it is routed to the key's master instead.
    pub async fn wait_replicas(
        &self,
        key: &str,
        replicas: u32,
        timeout_ms: u64,
    ) -> RedisResult<i64> {
        let mut cmd = redis::cmd("WAIT");
        cmd.arg(replicas).arg(timeout_ms);
        match self {
            RedisConn::Standalone(c) => cmd.query_async(&mut c.clone()).await,
            RedisConn::Cluster(h) => {
                use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
                let route = Route::with_key(key.as_bytes(), SlotAddr::Master);
                let reply = h
                    .current()
                    .route_command(
                        cmd,
                        RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route)),
                    )
                    .await;
                if let Err(e) = &reply {
                    h.failed(e);
                }
                Ok(redis::from_redis_value::<i64>(reply?)?)
            }
        }
    }

    /// Runs `cmds` (each given with the key that routes it) and returns their replies in the
    /// order given. Standalone: one pipeline, one round trip. Cluster: one pipeline per slot,
    /// sent concurrently, because a pipeline spanning slots is refused (CROSSSLOT). Not atomic
    /// in either mode: only reads and idempotent writes (`ZADD NX`) go through here.
    pub async fn pipeline_by_slot(&self, cmds: Vec<(String, Cmd)>) -> RedisResult<Vec<Value>> {
        if cmds.is_empty() {
            return Ok(Vec::new());
        }
        let mut conn = self.clone();
        if !self.is_cluster() {
            let mut pipe = redis::pipe();
            for (_, cmd) in cmds {
                pipe.add_command(cmd);
            }
            return pipe.query_async(&mut conn).await;
        }
        let total = cmds.len();
        let mut groups: HashMap<Slot, (Vec<usize>, Pipeline)> = HashMap::new();
        for (i, (key, cmd)) in cmds.into_iter().enumerate() {
            let (indices, pipe) = groups
                .entry(Slot::for_key(key.as_bytes()))
                .or_insert_with(|| (Vec::new(), redis::pipe()));
            indices.push(i);
            pipe.add_command(cmd);
        }
        let replies = try_join_all(groups.into_values().map(|(indices, pipe)| {
            let mut conn = conn.clone();
            async move {
                let values: Vec<Value> = pipe.query_async(&mut conn).await?;
                Ok::<_, redis::RedisError>((indices, values))
            }
        }))
        .await?;
        let mut out = vec![Value::Nil; total];
        for (indices, values) in replies {
            if indices.len() != values.len() {
                return Err(redis::RedisError::from((
                    redis::ErrorKind::UnexpectedReturnType,
                    "a per-slot pipeline answered a different number of replies",
                )));
            }
            for (i, v) in indices.into_iter().zip(values) {
                out[i] = v;
            }
        }
        Ok(out)
    }
}

/// Connects to `target` with a per-command response timeout (also the connect timeout).
/// Cluster: the overall timeout of a request, redirections and retries included, is the same
/// `response_timeout`, so a slot whose master is down fails the call within it (an UNKNOWN
/// outcome for a script: the caller keeps its row intermediate and retries with the same id).
pub async fn connect(target: &RedisTarget, response_timeout: Duration) -> RedisResult<RedisConn> {
    connect_tls(target, None, response_timeout).await
}

/// The client of one server: with `tls`, a `rediss://` URL verified against its CA (then
/// the only trusted one) and presenting its client certificate; without, as the URL says
/// (`rediss://` then trusts the system's store).
pub fn client(url: &str, tls: Option<&redis::TlsCertificates>) -> RedisResult<redis::Client> {
    match tls {
        Some(certs) => redis::Client::build_with_tls(url, certs.clone()),
        None => redis::Client::open(url),
    }
}

/// As [`connect`], over TLS with `tls`'s CA and client certificate (`redis.tls.*`).
pub async fn connect_tls(
    target: &RedisTarget,
    tls: Option<&redis::TlsCertificates>,
    response_timeout: Duration,
) -> RedisResult<RedisConn> {
    match target {
        RedisTarget::Standalone { url } => {
            let client = client(url, tls)?;
            let config = redis::aio::ConnectionManagerConfig::new()
                .set_response_timeout(Some(response_timeout))
                .set_connection_timeout(Some(response_timeout));
            Ok(ConnectionManager::new_with_config(client, config)
                .await?
                .into())
        }
        RedisTarget::Cluster { nodes } => {
            let mut builder =
                redis::cluster::ClusterClientBuilder::new(nodes.iter().map(String::as_str))
                    .response_timeout(response_timeout)
                    .connection_timeout(response_timeout);
            if let Some(certs) = tls {
                // The nodes a cluster announces are IPs (CLUSTER SLOTS): their certificates
                // must carry them as IP names.
                builder = builder.certs(certs.clone());
            }
            let client = builder.build()?;
            let conn = client.get_async_connection().await?;
            Ok(RedisConn::Cluster(Arc::new(ClusterHandle {
                client,
                current: Mutex::new(conn),
                rebuilding: AtomicBool::new(false),
                last_rebuild: Mutex::new(None),
            })))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mode_and_seeds_are_checked() {
        assert!(RedisTarget::from_settings("standalone", "redis://h/", &[])
            .is_ok_and(|t| !t.is_cluster()));
        assert!(RedisTarget::from_settings("cluster", "", &[]).is_err());
        assert!(RedisTarget::from_settings("sentinel", "", &[]).is_err());
        let t = RedisTarget::from_settings("cluster", "", &["redis://:pw@h:7000".into()]);
        let t = t.expect("a seed is enough");
        assert!(t.is_cluster());
        assert!(!format!("{t:?}").contains("pw"), "credentials never shown");
    }

    #[test]
    fn one_bucket_is_one_slot_and_buckets_spread() {
        use stocksvr_core::bucket::BucketKey;
        let date = chrono::NaiveDate::from_ymd_opt(2026, 12, 2).expect("date");
        let b = BucketKey::new(7, 42, date);
        let slot = Slot::for_key(b.stock_key());
        assert_eq!(slot, Slot::for_key(b.fence_key(9)));
        assert_eq!(slot, Slot::for_key(b.op_key("try-9")));
        let distinct: std::collections::HashSet<Slot> = (0..50)
            .map(|d| Slot::for_key(BucketKey::new(7, d, date).stock_key()))
            .collect();
        assert!(
            distinct.len() > 40,
            "{} slots for 50 buckets",
            distinct.len()
        );
        let wheel: std::collections::HashSet<Slot> = (0..16)
            .map(|s| Slot::for_key(crate::wheel::shard_key("prod", s)))
            .collect();
        assert_eq!(wheel.len(), 16, "each wheel shard its own slot");
    }
}
