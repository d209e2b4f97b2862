//! What an operator command connects to: MySQL and Redis, checked before the command starts,
//! and a reconciler over them for `stocksvr reconcile` and `stocksvr bucket rebuild`.

use anyhow::Context;
use std::sync::Arc;
use std::time::Duration;
use stocksvr::Settings;
use stocksvr_core::snowflake::SnowflakeGenerator;
use stocksvr_pipeline::config::redact_url;
use stocksvr_reconciler::Reconciler;
use stocksvr_reservation::{ReservationService, ServiceConfig};
use stocksvr_store::lua::LuaExecutor;

/// MySQL (a pool of `connections`) and Redis for a command, checked before it starts.
pub async fn connect_with(
    settings: &Settings,
    connections: u32,
) -> anyhow::Result<(sqlx::MySqlPool, Arc<LuaExecutor>)> {
    let url = settings.mysql.url.expose();
    let pool = stocksvr_store::mysql_pool(
        url,
        connections,
        Duration::from_millis(settings.mysql.acquire_timeout_ms),
    )?;
    stocksvr_store::ping_mysql(&pool)
        .await
        .with_context(|| format!("connecting to {}", redact_url(url)))?;
    let redis = stocksvr_store::connect_redis_tls(
        &stocksvr::settings::redis_target(&settings.redis),
        stocksvr::settings::redis_tls(&settings.redis)?.as_ref(),
        Duration::from_millis(settings.redis.response_timeout_ms),
    )
    .await
    .with_context(|| {
        format!(
            "connecting to {}",
            stocksvr::settings::redis_redacted(&settings.redis)
        )
    })?;
    let op_ttl = Duration::from_secs(settings.reservation.op_ttl_days * 24 * 3600);
    Ok((
        pool,
        Arc::new(
            LuaExecutor::new(redis, op_ttl)
                .with_replication_wait(stocksvr::settings::replication_wait(&settings.redis)),
        ),
    ))
}

/// A reconciler for a command, over a pool of `connections`.
pub async fn reconciler(settings: &Settings, connections: u32) -> anyhow::Result<Reconciler> {
    let (pool, lua) = connect_with(settings, connections).await?;
    // Repairs and rebuilds never mint a reservation id, so any worker id will do.
    let ids = SnowflakeGenerator::new(settings.reservation.worker_id.unwrap_or(0))
        .map_err(|e| anyhow::anyhow!("reservation.worker_id: {e}"))?;
    let service = ReservationService::new(pool, lua, ids, ServiceConfig::default())
        .with_ops_config(settings.stock_ops.ops_config());
    Ok(Reconciler::new(
        Arc::new(service),
        settings.reconcile.reconcile_config(),
    ))
}
