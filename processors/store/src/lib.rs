//! MySQL and Redis access for stocksvr: connection set-up, the embedded schema migrations
//! and (in later modules) the repositories and the Redis Lua executor.

pub mod baselines;
pub mod bucket_views;
pub mod buckets;
pub mod clock;
pub mod deadline;
pub mod lua;
pub mod one_off;
pub mod order_events;
pub mod outbox;
pub mod redis_conn;
pub mod refunds;
pub mod reservations;
pub mod retry;
pub mod wal;
pub mod wheel;
pub mod worker_lease;

use crate::deadline::Deadline;
pub use crate::redis_conn::{RedisConn, RedisTarget};
use sqlx::migrate::Migrator;
use sqlx::mysql::{MySqlConnectOptions, MySqlPool, MySqlPoolOptions};
use std::str::FromStr;
use std::time::Duration;

/// `migrations/` compiled into the binary: `stocksvr migrate` needs no files on disk.
pub static MIGRATOR: Migrator = sqlx::migrate!("../../migrations");

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("mysql: {0}")]
    Mysql(#[from] sqlx::Error),
    #[error("migration: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
}

/// A pool whose sessions run in UTC with strict SQL mode, so DATETIME(3) values mean the
/// same on every server and a bad value is an error rather than a silent truncation.
/// Connections are opened on first use: a process starts while MySQL is down and reports
/// it through `/readyz` instead of exiting.
///
/// Statements whose text depends on the batch run through [`one_off::OneOff`] so they are not
/// kept prepared on the pool's connections.
pub fn mysql_pool(
    url: &str,
    max_connections: u32,
    acquire_timeout: Duration,
) -> Result<MySqlPool, StoreError> {
    mysql_pool_with(url, max_connections, acquire_timeout, true)
}

/// As [`mysql_pool`]; `ping_before_use` pings an idle connection before handing it out
/// (`mysql.ping_before_use`). sqlx pings every connection when it is returned too, so with
/// this on each use of the pool costs two round trips besides its statements.
pub fn mysql_pool_with(
    url: &str,
    max_connections: u32,
    acquire_timeout: Duration,
    ping_before_use: bool,
) -> Result<MySqlPool, StoreError> {
    let options = MySqlConnectOptions::from_str(url)?
        .timezone(Some("+00:00".to_string()))
        .pipes_as_concat(false);
    let pool = MySqlPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(acquire_timeout)
        .test_before_acquire(ping_before_use)
        .after_connect(|conn, _| {
            Box::pin(async move {
                sqlx::query("SET SESSION sql_mode = 'STRICT_ALL_TABLES,NO_ZERO_DATE,NO_ZERO_IN_DATE,ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION'")
                    .execute(conn)
    .deadline()
                    .await
                    .map(|_| ())
            })
        })
        .connect_lazy_with(options);
    Ok(pool)
}

/// One embedded migration and whether this run applied it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrationStep {
    pub version: i64,
    pub description: String,
    pub applied_now: bool,
}

/// Applies the pending migrations; already-applied ones are left alone (a second run is
/// a no-op). A migration edited after it was applied is refused by checksum.
pub async fn migrate(pool: &MySqlPool) -> Result<Vec<MigrationStep>, StoreError> {
    let before = applied_versions(pool).await?;
    MIGRATOR.run(pool).await?;
    Ok(MIGRATOR
        .iter()
        .map(|m| MigrationStep {
            version: m.version,
            description: m.description.to_string(),
            applied_now: !before.contains(&m.version),
        })
        .collect())
}

/// Embedded migrations the database has not applied yet (all of them on an empty database).
pub async fn pending_migrations(pool: &MySqlPool) -> Result<Vec<i64>, StoreError> {
    let applied = applied_versions(pool).await?;
    Ok(MIGRATOR
        .iter()
        .map(|m| m.version)
        .filter(|v| !applied.contains(v))
        .collect())
}

async fn applied_versions(pool: &MySqlPool) -> Result<Vec<i64>, StoreError> {
    let exists: Option<(String,)> = sqlx::query_as(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = ?",
    )
    .bind("_sqlx_migrations")
    .fetch_optional(pool)
    .deadline()
    .await?;
    if exists.is_none() {
        return Ok(Vec::new());
    }
    let rows: Vec<(i64,)> =
        sqlx::query_as("SELECT version FROM _sqlx_migrations WHERE success = ?")
            .bind(true)
            .fetch_all(pool)
            .deadline()
            .await?;
    Ok(rows.into_iter().map(|(v,)| v).collect())
}

/// `SELECT 1`: the readiness probe of MySQL.
pub async fn ping_mysql(pool: &MySqlPool) -> Result<(), StoreError> {
    sqlx::query("SELECT 1").execute(pool).deadline().await?;
    Ok(())
}

/// A Redis connection (standalone: reconnecting manager; cluster: the cluster client) with a
/// per-command response timeout; see [`redis_conn`].
pub async fn connect_redis(
    target: &RedisTarget,
    response_timeout: Duration,
) -> Result<RedisConn, StoreError> {
    Ok(redis_conn::connect(target, response_timeout).await?)
}

/// As [`connect_redis`], over TLS with the CA and client certificate of `tls`.
pub async fn connect_redis_tls(
    target: &RedisTarget,
    tls: Option<&redis::TlsCertificates>,
    response_timeout: Duration,
) -> Result<RedisConn, StoreError> {
    Ok(redis_conn::connect_tls(target, tls, response_timeout).await?)
}

/// `PING`: the readiness probe of Redis. In cluster mode redis-rs sends it to every master and
/// fails if one does not answer, so `/readyz` reports a slot without a master.
pub async fn ping_redis(conn: &mut RedisConn) -> Result<(), StoreError> {
    let pong: String = redis::cmd("PING").query_async(conn).await?;
    if pong == "PONG" {
        Ok(())
    } else {
        Err(StoreError::Redis(redis::RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "PING did not answer PONG",
        ))))
    }
}
