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
use chrono::TimeDelta;
use std::sync::Arc;
use std::time::Duration;
use stocksvr_api::ApiState;
use stocksvr_core::retry::RetryPolicy;
use stocksvr_core::snowflake::SnowflakeGenerator;
use stocksvr_pipeline::causes;
use stocksvr_pipeline::codec::AvroCodec;
use stocksvr_pipeline::failure::{describe_sqlx, Dependency};
use stocksvr_reservation::{ReservationService, ServiceConfig};
use stocksvr_schedule::{ScheduleConfig, TimeWheel};
use stocksvr_store::lua::LuaExecutor;
use stocksvr_store::worker_lease::WorkerLease;
use stocksvr_store::RedisConn;
use tokio::sync::{watch, Notify};

const LEASE_TTL: TimeDelta = TimeDelta::seconds(30);

/// How the service waits for Redis and for a worker-id lease at start: until they come or
/// shutdown is asked, every 0.5 s doubling to 10 s.
const START_RETRY: RetryPolicy =
    RetryPolicy::new(Duration::from_millis(500), Duration::from_secs(10)).without_jitter();

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
    outbox_waker: Option<Arc<Notify>>,
    roles: Roles,
    mut stop: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    // Settings first: a mistake there fails the start at once, not after Redis answered.
    let config = settings
        .reservation
        .service_config(&settings.recovery)
        .map_err(anyhow::Error::msg)?;
    let schedule = ScheduleConfig {
        consumer: settings.consumer.clone(),
        ..ScheduleConfig::from_settings(&settings.schedule)?
    };
    let Some(conn) = connect_redis(&settings, &mut stop).await? else {
        return Ok(());
    };
    let lease = match settings.reservation.worker_id {
        Some(_) => None,
        None => match lease_worker_id(&pool, &mut stop).await? {
            Some(lease) => Some(lease),
            None => return Ok(()),
        },
    };
    let worker_id = settings
        .reservation
        .worker_id
        .or(lease.as_ref().map(|l| l.worker_id))
        .context("no worker id")?;
    let (service, wheel) = build_service(&settings, &pool, config, conn, worker_id, &outbox_waker)?;
    if roles.reservations {
        api.install(service.clone());
    }
    tracing::info!(
        worker_id,
        leased = lease.is_some(),
        "reservation service ready"
    );
    // The processors that need the reservation service start once it exists.
    let parts = Processors {
        settings: &settings,
        pool: &pool,
        service,
        wheel,
        codec: &codec,
        roles,
        stop: stop.clone(),
    };
    tokio::try_join!(
        parts.order_lifecycle(),
        parts.recovery(),
        parts.stale_watcher(),
        parts.gauges(),
        parts.wal_worker(),
        parts.daily(),
        parts.scheduled(schedule, outbox_waker),
        parts.reconciler(),
        renew(lease, &pool, stop.clone()),
    )?;
    Ok(())
}

/// Connects Redis, trying until it answers; `None` when shutdown was asked first.
async fn connect_redis(
    settings: &Settings,
    stop: &mut watch::Receiver<bool>,
) -> anyhow::Result<Option<RedisConn>> {
    let target = crate::settings::redis_target(&settings.redis);
    let tls = crate::settings::redis_tls(&settings.redis)?;
    let timeout = Duration::from_millis(settings.redis.response_timeout_ms);
    // Said once per cause (a refused password, an untrusted certificate, a server down),
    // not at every retry; /readyz names it meanwhile.
    let connect = START_RETRY.run(
        || stocksvr_store::connect_redis_tls(&target, tls.as_ref(), timeout),
        |_| true,
        |e, _| {
            causes::seen(
                Dependency::Redis,
                &format!("not connected, the Try API waits for it: {e}"),
            )
        },
    );
    let conn = tokio::select! {
        _ = stopped(stop) => return Ok(None),
        c = connect => c?,
    };
    causes::ruled_out(Dependency::Redis, |_| true);
    Ok(Some(conn))
}

/// Leases a snowflake worker id from MySQL, trying until one is free; `None` when
/// shutdown was asked first.
async fn lease_worker_id(
    pool: &sqlx::MySqlPool,
    stop: &mut watch::Receiver<bool>,
) -> anyhow::Result<Option<WorkerLease>> {
    let owner = owner();
    let acquire = START_RETRY.run(
        || WorkerLease::acquire(pool, &owner, LEASE_TTL),
        |_| true,
        |e, _| {
            let cause = match e {
                stocksvr_store::worker_lease::LeaseError::Mysql(e) => describe_sqlx(e),
                other => other.to_string(),
            };
            causes::seen(
                Dependency::Mysql,
                &format!("no snowflake worker id leased yet: {cause}"),
            )
        },
    );
    let lease = tokio::select! {
        _ = stopped(stop) => return Ok(None),
        l = acquire => l?,
    };
    causes::ruled_out(Dependency::Mysql, |c| {
        c.starts_with("no snowflake worker id")
    });
    Ok(Some(lease))
}

/// The reservation service on Redis and MySQL, and the time wheel of scheduled confirms
/// (armed by order-lifecycle wherever it runs, fired by the schedule part wherever that
/// runs).
fn build_service(
    settings: &Settings,
    pool: &sqlx::MySqlPool,
    config: ServiceConfig,
    conn: RedisConn,
    worker_id: u16,
    outbox_waker: &Option<Arc<Notify>>,
) -> anyhow::Result<(Arc<ReservationService>, TimeWheel)> {
    let ids = SnowflakeGenerator::new(worker_id)
        .map_err(|e| anyhow::anyhow!("reservation.worker_id: {e}"))?;
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
    Ok((Arc::new(service), wheel))
}

/// The processors that need the reservation service, each a step that runs until shutdown
/// (or returns at once when its role is not this process's).
struct Processors<'a> {
    settings: &'a Settings,
    pool: &'a sqlx::MySqlPool,
    service: Arc<ReservationService>,
    wheel: TimeWheel,
    codec: &'a AvroCodec,
    roles: Roles,
    stop: watch::Receiver<bool>,
}

impl Processors<'_> {
    /// The order-lifecycle processor and the re-driver of its deferred events.
    async fn order_lifecycle(&self) -> anyhow::Result<()> {
        if !self.roles.reservations {
            return Ok(());
        }
        let settings = self.settings;
        let handler = Arc::new(
            stocksvr_order_lifecycle::OrderLifecycle::new(
                self.service.clone(),
                stocksvr_order_lifecycle::group_name(&settings.kafka),
            )
            .with_wheel(self.wheel.clone()),
        );
        let consume = async {
            stocksvr_pipeline::consumer::run(
                &settings.kafka,
                self.codec.clone(),
                stocksvr_order_lifecycle::loop_config(&settings.kafka)
                    .with_consumer(&settings.consumer),
                handler.clone(),
                self.stop.clone(),
            )
            .await
            .context("order-lifecycle processor")
        };
        let redrive = async {
            stocksvr_order_lifecycle::run_redriver(handler.clone(), self.stop.clone())
                .await
                .map_err(|f| anyhow::anyhow!("deferred order events: {f:?}"))
        };
        tokio::try_join!(consume, redrive).map(|_| ())
    }

    async fn recovery(&self) -> anyhow::Result<()> {
        stocksvr_reservation::recovery::run(
            self.service.clone(),
            self.settings.recovery.recovery_config(),
            self.stop.clone(),
        )
        .await
        .context("recovery worker")
    }

    async fn stale_watcher(&self) -> anyhow::Result<()> {
        if !self.roles.reservations {
            return Ok(());
        }
        stocksvr_reservation::stale::run(
            self.service.clone(),
            self.settings.recovery.stale_interval(),
            self.stop.clone(),
        )
        .await
        .context("stale-reservation watcher")
    }

    /// Gauges read from MySQL: reservations per intermediate status and parked dead
    /// letters. The facts are the database's, so any instance may report them (the
    /// dashboards take the max across instances).
    async fn gauges(&self) -> anyhow::Result<()> {
        let roles = self.roles;
        let reservations = async {
            if !roles.reservations {
                return Ok(());
            }
            stocksvr_reservation::gauges::run(
                self.service.clone(),
                stocksvr_reservation::gauges::INTERVAL,
                self.stop.clone(),
            )
            .await
            .context("reservation gauges")
        };
        let dead_letters = async {
            if !(roles.reservations || roles.dead_letter) {
                return Ok(());
            }
            stocksvr_dead_letter::run_gauge(
                self.pool.clone(),
                stocksvr_dead_letter::GAUGE_INTERVAL,
                self.stop.clone(),
            )
            .await
            .context("dead-letter gauge")
        };
        tokio::try_join!(reservations, dead_letters).map(|_| ())
    }

    async fn wal_worker(&self) -> anyhow::Result<()> {
        // An idle worker's rounds back off from 0.3 s to ten times that: a row whose holder
        // died is taken over within its lease (stock_ops.wal_lease_secs) plus 3 s.
        stocksvr_reservation::operations::run_worker(
            self.service.clone(),
            50,
            Duration::from_millis(300),
            self.stop.clone(),
        )
        .await
        .context("operation WAL worker")
    }

    async fn daily(&self) -> anyhow::Result<()> {
        stocksvr_reservation::operations::run_daily(
            self.service.clone(),
            self.settings.stock_ops.daily_config(),
            self.stop.clone(),
        )
        .await
        .context("daily bucket job")
    }

    /// Scheduled confirms: the time wheel poller, the due scan and the schedule processor.
    async fn scheduled(
        &self,
        schedule: ScheduleConfig,
        outbox_waker: Option<Arc<Notify>>,
    ) -> anyhow::Result<()> {
        if !self.roles.schedule {
            return Ok(());
        }
        stocksvr_schedule::run(
            schedule,
            self.wheel.clone(),
            self.service.clone(),
            outbox_waker,
            &self.settings.kafka,
            self.codec.clone(),
            self.stop.clone(),
        )
        .await
        .context("scheduled confirms")
    }

    async fn reconciler(&self) -> anyhow::Result<()> {
        if !self.roles.reconciler {
            return Ok(());
        }
        let reconciler = Arc::new(stocksvr_reconciler::Reconciler::new(
            self.service.clone(),
            self.settings.reconcile.reconcile_config(),
        ));
        stocksvr_reconciler::run(reconciler, self.stop.clone())
            .await
            .context("reconciler")
    }
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
