//! Brings the reservation service up inside `stocksvr all`: connects Redis, obtains a
//! snowflake worker id (configured, or leased from MySQL and renewed), then installs the
//! service into the API and runs the processors that need it (order-lifecycle and the
//! reservation recovery worker, the stale-reservation watcher, the gauges read from MySQL,
//! the operation WAL worker, the daily bucket job and scheduled confirms, whose time wheel
//! order-lifecycle arms). Until then the API answers 503 (fail closed) and `/readyz` says
//! which dependency is missing. A lost worker-id lease stops the process: minting ids
//! another instance may also mint would break reservation-id uniqueness.

use crate::roles::Roles;
use crate::settings::Settings;
use anyhow::Context;
use backon::{ExponentialBuilder, Retryable};
use chrono::TimeDelta;
use std::sync::Arc;
use std::time::Duration;
use stocksvr_api::ApiState;
use stocksvr_core::snowflake::SnowflakeGenerator;
use stocksvr_pipeline::codec::AvroCodec;
use stocksvr_reservation::ReservationService;
use stocksvr_schedule::{ScheduleConfig, TimeWheel};
use stocksvr_store::lua::LuaExecutor;
use stocksvr_store::worker_lease::WorkerLease;
use tokio::sync::watch;

const LEASE_TTL: TimeDelta = TimeDelta::seconds(30);

/// Resolves once shutdown was asked; the watch guard is dropped inside so the future is Send.
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

fn owner() -> String {
    let host = std::fs::read_to_string("/etc/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "host".into());
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or_default();
    format!("{host}:{}:{started}", std::process::id())
}

pub async fn run(
    settings: Settings,
    pool: sqlx::MySqlPool,
    api: ApiState,
    codec: AvroCodec,
    outbox_waker: Option<Arc<tokio::sync::Notify>>,
    roles: Roles,
    mut stop: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let config = settings
        .reservation
        .service_config(&settings.recovery)
        .map_err(anyhow::Error::msg)?;
    let schedule = ScheduleConfig {
        consumer: settings.consumer.clone(),
        ..ScheduleConfig::from_settings(&settings.schedule)?
    };
    let backoff = ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(500))
        .with_max_delay(Duration::from_secs(10))
        .without_max_times();
    let redis_target = crate::settings::redis_target(&settings.redis);
    let timeout = Duration::from_millis(settings.redis.response_timeout_ms);
    let connect = || stocksvr_store::connect_redis(&redis_target, timeout);
    let conn = tokio::select! {
        _ = stopped(&mut stop) => return Ok(()),
        c = connect.retry(backoff).notify(|e, after| tracing::warn!(error = %e, ?after, "redis not reachable; the Try API stays unavailable")) => c?,
    };
    let lease = match settings.reservation.worker_id {
        Some(_) => None,
        None => {
            let owner = owner();
            let acquire = || WorkerLease::acquire(&pool, &owner, LEASE_TTL);
            Some(tokio::select! {
                _ = stopped(&mut stop) => return Ok(()),
                l = acquire.retry(backoff).notify(|e, after| tracing::warn!(error = %e, ?after, "cannot lease a snowflake worker id yet")) => l?,
            })
        }
    };
    let worker_id = settings
        .reservation
        .worker_id
        .or(lease.as_ref().map(|l| l.worker_id))
        .context("no worker id")?;
    let ids = SnowflakeGenerator::new(worker_id)
        .map_err(|e| anyhow::anyhow!("reservation.worker_id: {e}"))?;
    // Armed by order-lifecycle wherever it runs, fired by the schedule part wherever that runs.
    let wheel = TimeWheel::new(
        conn.clone(),
        &settings.schedule.wheel_namespace,
        settings.schedule.shards,
    )
    .map_err(anyhow::Error::msg)?;
    let lua = Arc::new(
        LuaExecutor::new(conn, config.op_ttl)
            .with_replication_wait(crate::settings::replication_wait(&settings.redis)),
    );
    let mut service = ReservationService::new(pool.clone(), lua, ids, config)
        .with_ops_config(settings.stock_ops.ops_config());
    if let Some(waker) = outbox_waker.clone() {
        service = service.with_outbox_waker(waker);
    }
    let service = Arc::new(service);
    if roles.reservations {
        api.install(service.clone());
    }
    tracing::info!(
        worker_id,
        leased = lease.is_some(),
        "reservation service ready"
    );

    // The processors that need the reservation service start once it exists.
    let lifecycle = async {
        if !roles.reservations {
            return Ok(());
        }
        let handler = Arc::new(
            stocksvr_order_lifecycle::OrderLifecycle::new(
                service.clone(),
                stocksvr_order_lifecycle::group_name(&settings.kafka),
            )
            .with_wheel(wheel.clone()),
        );
        let consume = async {
            stocksvr_pipeline::consumer::run(
                &settings.kafka,
                codec.clone(),
                stocksvr_order_lifecycle::loop_config(&settings.kafka)
                    .with_consumer(&settings.consumer),
                handler.clone(),
                stop.clone(),
            )
            .await
            .context("order-lifecycle processor")
        };
        let redrive = async {
            stocksvr_order_lifecycle::run_redriver(handler.clone(), stop.clone())
                .await
                .map_err(|f| anyhow::anyhow!("deferred order events: {f:?}"))
        };
        tokio::try_join!(consume, redrive).map(|_| ())
    };
    let recovery = async {
        stocksvr_reservation::recovery::run(
            service.clone(),
            settings.recovery.recovery_config(),
            stop.clone(),
        )
        .await
        .context("recovery worker")
    };
    let stale = async {
        if !roles.reservations {
            return Ok(());
        }
        stocksvr_reservation::stale::run(
            service.clone(),
            settings.recovery.stale_interval(),
            stop.clone(),
        )
        .await
        .context("stale-reservation watcher")
    };
    // Gauges read from MySQL (seed §15): reservations per intermediate status and parked
    // dead letters. The facts are the database's, so any instance may report them (the
    // dashboards take the max across instances).
    let gauges = async {
        let reservations = async {
            if !roles.reservations {
                return Ok(());
            }
            stocksvr_reservation::gauges::run(
                service.clone(),
                stocksvr_reservation::gauges::INTERVAL,
                stop.clone(),
            )
            .await
            .context("reservation gauges")
        };
        let dead_letters = async {
            if !(roles.reservations || roles.dead_letter) {
                return Ok(());
            }
            stocksvr_dead_letter::run_gauge(
                pool.clone(),
                stocksvr_dead_letter::GAUGE_INTERVAL,
                stop.clone(),
            )
            .await
            .context("dead-letter gauge")
        };
        tokio::try_join!(reservations, dead_letters).map(|_| ())
    };
    let wal_worker = async {
        stocksvr_reservation::operations::run_worker(
            service.clone(),
            50,
            Duration::from_secs(1),
            stop.clone(),
        )
        .await
        .context("operation WAL worker")
    };
    let daily = async {
        stocksvr_reservation::operations::run_daily(
            service.clone(),
            settings.stock_ops.daily_config(),
            stop.clone(),
        )
        .await
        .context("daily bucket job")
    };
    let scheduled = async {
        if !roles.schedule {
            return Ok(());
        }
        stocksvr_schedule::run(
            schedule,
            wheel.clone(),
            service.clone(),
            outbox_waker,
            &settings.kafka,
            codec.clone(),
            stop.clone(),
        )
        .await
        .context("scheduled confirms")
    };
    let reconciler = async {
        if !roles.reconciler {
            return Ok(());
        }
        let reconciler = Arc::new(stocksvr_reconciler::Reconciler::new(
            service.clone(),
            settings.reconcile.reconcile_config(),
        ));
        stocksvr_reconciler::run(reconciler, stop.clone())
            .await
            .context("reconciler")
    };
    let renewals = renew(lease, &pool, stop.clone());
    tokio::try_join!(
        lifecycle, recovery, stale, gauges, wal_worker, daily, scheduled, reconciler, renewals
    )?;
    Ok(())
}

/// Keeps the worker-id lease alive until shutdown, then gives it back.
async fn renew(
    lease: Option<WorkerLease>,
    pool: &sqlx::MySqlPool,
    mut stop: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let Some(lease) = lease else {
        stopped(&mut stop).await;
        return Ok(());
    };
    let mut tick = tokio::time::interval(Duration::from_secs(10));
    loop {
        tokio::select! {
            _ = stopped(&mut stop) => break,
            _ = tick.tick() => {
                match lease.renew(pool).await {
                    Ok(()) => {}
                    Err(e @ stocksvr_store::worker_lease::LeaseError::Lost(_)) => return Err(e.into()),
                    // MySQL briefly down: the lease has 30 s; keep trying.
                    Err(e) => tracing::warn!(error = %e, "renewing the worker-id lease failed"),
                }
            }
        }
    }
    if let Err(e) = lease.release(pool).await {
        tracing::warn!(error = %e, "releasing the worker-id lease failed; it expires by itself");
    }
    Ok(())
}
