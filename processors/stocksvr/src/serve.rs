//! `stocksvr all` and the single-role commands: the HTTP listener plus the selected roles,
//! stopped together by one shutdown signal (SIGTERM or Ctrl-C for the binary, any future for
//! a test).
//!
//! The stop goes in the order a load balancer needs: `/readyz` answers 503 `draining` at
//! once while the listener serves on for `http.drain_grace_ms` (the balancer's health checks
//! take the instance out of rotation meanwhile); then the listener stops accepting and the
//! requests in flight finish (a Try needs the reservation service, which still runs); then
//! the processors stop taking records, commit what they finished and leave their groups.

use crate::listener::Front;
use crate::roles::Roles;
use crate::settings::{Access, AdminAccess, Settings};
use crate::{boot, probes};
use anyhow::Context;
use axum::http::StatusCode;
use axum::routing::{any, get};
use axum::{Json, Router};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use stocksvr_pipeline::catalog::Catalog;
use stocksvr_pipeline::codec::AvroCodec;
use stocksvr_pipeline::http::{self, HealthState, Probe};
use stocksvr_pipeline::registry::RegistryClient;
use stocksvr_pipeline::telemetry;
use tokio::sync::{watch, Notify};
use tokio::task::JoinSet;

/// The long-running parts of one process, each a named task. A part's name is kept by its
/// task id until the task ends (returned, failed or panicked), so a drain that runs out of
/// time says which parts were still busy.
struct Parts {
    tasks: JoinSet<anyhow::Result<()>>,
    names: std::collections::HashMap<tokio::task::Id, &'static str>,
}

impl Parts {
    fn new() -> Self {
        Self {
            tasks: JoinSet::new(),
            names: Default::default(),
        }
    }

    fn spawn<F>(&mut self, name: &'static str, part: F)
    where
        F: std::future::Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        let id = self.tasks.spawn(part).id();
        self.names.insert(id, name);
    }

    /// The next part to end, by name, with its result (a panic is an error); None once
    /// every part has ended.
    async fn next(&mut self) -> Option<(&'static str, anyhow::Result<()>)> {
        let (id, result) = match self.tasks.join_next_with_id().await? {
            Ok((id, result)) => (id, result),
            Err(e) => (e.id(), Err(anyhow::anyhow!("panicked: {e}"))),
        };
        Some((self.names.remove(&id).unwrap_or("a task"), result))
    }

    /// Waits until the part named `name` has ended (or `deadline`), logging any part that
    /// ends meanwhile with an error. False when it was still running at the deadline.
    async fn wait_for(&mut self, name: &'static str, deadline: tokio::time::Instant) -> bool {
        if !self.names.values().any(|n| *n == name) {
            return true; // it ended already (the failure that stops the process, say)
        }
        let ended = async {
            while let Some((ended, result)) = self.next().await {
                if let Err(e) = result {
                    tracing::warn!(task = ended, error = %format!("{e:#}"), "task ended with an error while draining");
                }
                if ended == name {
                    return;
                }
            }
        };
        tokio::time::timeout_at(deadline, ended).await.is_ok()
    }

    /// Waits up to `within` for every part to end, logging a part that ended with an error.
    /// `Err` names the parts still running when the time ran out.
    async fn drain(&mut self, within: Duration) -> Result<(), Vec<&'static str>> {
        let all = async {
            while let Some((name, result)) = self.next().await {
                if let Err(e) = result {
                    tracing::warn!(task = name, error = %format!("{e:#}"), "task ended with an error while draining");
                }
            }
        };
        match tokio::time::timeout(within, all).await {
            Ok(()) => Ok(()),
            Err(_) => {
                let mut busy: Vec<&'static str> = self.names.values().copied().collect();
                busy.sort_unstable();
                busy.dedup();
                Err(busy)
            }
        }
    }
}

/// How long the parts get to finish their work after the grace period (the listener's
/// requests in flight first, then the processors, all within this).
const DRAIN_WITHIN: Duration = Duration::from_secs(15);

/// The listener's part name: it is stopped (and waited for) before the others.
const HTTP_LISTENER: &str = "http listener";

/// Resolves on SIGTERM or SIGINT. The handlers are installed here, before anything is
/// served: a SIGTERM that arrives while the process is still starting must drain it, not
/// kill it with the default disposition.
pub fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let term = signal(SignalKind::terminate());
        let int = signal(SignalKind::interrupt());
        async move {
            match (term, int) {
                (Ok(mut term), Ok(mut int)) => {
                    tokio::select! {
                        _ = term.recv() => {},
                        _ = int.recv() => {},
                    }
                }
                _ => {
                    let _ = tokio::signal::ctrl_c().await;
                }
            }
        }
    }
    #[cfg(not(unix))]
    {
        async {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

fn admin_refused_message(bound: SocketAddr) -> String {
    format!(
        "/admin/* is not served: the listener {bound} is not a loopback address and no caller \
         is configured (http.auth.clients with scopes = [\"admin\"]); the Try API still serves"
    )
}

/// The `/admin/*` part of the router as [`AdminAccess`] decided: as is (the caller check in
/// front of the whole router asks for the `admin` scope when callers are configured), or
/// replaced by a 403 `admin_disabled` for every admin path (the handlers are not even
/// routed, so nothing behind them can be reached).
pub fn admin_routes(admin: Router, access: AdminAccess, bound: SocketAddr) -> Router {
    match access {
        AdminAccess::Open | AdminAccess::Token => admin,
        AdminAccess::Refused => {
            let refuse = move || async move {
                (
                    StatusCode::FORBIDDEN,
                    Json(serde_json::json!({
                        "error": "admin_disabled",
                        "field": "http.auth.clients",
                        "message": admin_refused_message(bound),
                    })),
                )
            };
            Router::new()
                .route("/admin", any(refuse))
                .route("/admin/{*rest}", any(refuse))
        }
    }
}

/// Binds `settings.http.listen` and serves until SIGTERM or Ctrl-C.
pub async fn run_until_signal(settings: Settings, roles: Roles) -> anyhow::Result<()> {
    let signal = shutdown_signal();
    let listener = tokio::net::TcpListener::bind(&settings.http.listen)
        .await
        .with_context(|| format!("binding the HTTP listener to {}", settings.http.listen))?;
    run(settings, roles, listener, signal).await
}

/// Runs the HTTP listener on `listener` and the `roles` until `shutdown` resolves or a part
/// fails. After `shutdown`: `/readyz` fails and the listener serves on for
/// `http.drain_grace_ms`; then (at once after a failure) the listener stops and its requests
/// in flight finish, then every other part drains (processors commit what they finished),
/// all within 15 s.
pub async fn run(
    settings: Settings,
    roles: Roles,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    // Before anything else: an exposed listener without caller authentication is refused.
    let bound = listener.local_addr()?;
    let access = crate::settings::access(bound, &settings.http).map_err(anyhow::Error::msg)?;
    let metrics = telemetry::init_metrics();
    let catalog = Arc::new(Catalog::for_deployment(&settings.kafka)?);
    let registry = RegistryClient::new(&settings.registry)?;
    let pool = mysql_pool(&settings).await?;
    let api = stocksvr_api::ApiState::new()
        .with_reconcile_config(settings.reconcile.reconcile_config())
        .with_shed_config(stocksvr_api::shed::ShedConfig {
            max_in_flight: settings.http.max_in_flight,
            max_queued: settings.http.max_queued,
            admission_deadline: Duration::from_millis(settings.http.admission_deadline_ms),
        });
    let mut checks = probes(&settings, registry, &pool)?;
    if roles.reservations {
        // The dependencies can all answer while the service still waits for its first Redis
        // connection or its worker id; until then every Try would get 503 "starting".
        checks.push(Arc::new(probes::ReservationServiceProbe(api.clone())));
    }
    let health = HealthState::new(checks, &settings.http, metrics)
        .with_advisories(vec![Arc::new(probes::LostBuckets(pool.clone()))]);
    let front = Front::prepare(&settings.http, access).await?;
    let router = router(
        &settings,
        &pool,
        &catalog,
        &api,
        health.clone(),
        bound,
        access,
    )?;
    let router = http::close_connections_while_draining(router, &health);
    tracing::info!(listen = %bound, ?roles, api = ?access.api, admin = ?access.admin,
        https = front.https(), callers = front.callers(), "stocksvr started");
    if access.api == stocksvr_api::auth::Guard::Open && !crate::settings::is_loopback(bound) {
        tracing::warn!(listen = %bound, "serving every caller without authentication (http.allow_unauthenticated = true)");
    }
    if settings.http.admin_token().is_some() {
        tracing::warn!("http.admin_token is deprecated: give the admin client a token in http.auth.clients with scopes = [\"admin\"]");
    }

    // Two stops: the listener's (and its file reloads') first, then every other part's.
    let (http_stop_tx, http_stop_rx) = watch::channel(false);
    let (stop_tx, stop_rx) = watch::channel(false);
    // Every long-running part is one named task; the first to end (always a failure
    // while no shutdown was asked for) or a signal stops them all.
    let mut tasks = Parts::new();
    let (serve, reload) = front.into_tasks(listener, router, http_stop_rx);
    tasks.spawn(HTTP_LISTENER, serve);
    if let Some(reload) = reload {
        tasks.spawn("http reload", reload);
    }
    let codec = AvroCodec::new(&settings.registry, catalog.clone())?;
    let start = Start {
        settings: &settings,
        pool: &pool,
        codec: &codec,
        stop: &stop_rx,
    };
    // The relay starts first so the reservation service can wake it after each commit.
    let outbox_waker = if roles.relay {
        Some(start.outbox_relay(&mut tasks)?)
    } else {
        None
    };
    if roles.dead_letter {
        start.dead_letter(&mut tasks)?;
    }
    if roles.lag_exporter {
        start.lag_exporter(&mut tasks);
    }
    if roles.projector {
        start.projector(&mut tasks)?;
    }
    if roles.needs_service() {
        start.reservation_service(&mut tasks, api, outbox_waker, roles);
    }
    let outcome = until_shutdown_or_failure(&mut tasks, shutdown).await;
    let grace = Duration::from_millis(settings.http.drain_grace_ms);
    // Only the Try API sits behind a balancer: a processor-only process stops at once.
    let grace = if outcome.is_ok() && roles.reservations {
        grace
    } else {
        Duration::ZERO
    };
    stop_in_order(&mut tasks, &health, grace, http_stop_tx, stop_tx).await;
    tracing::info!("stocksvr stopped");
    outcome
}

/// The MySQL pool, after a look at the schema: running against an unmigrated schema would
/// fail record after record, so that is said once, at start. An unreachable MySQL is not a
/// reason to refuse to start: /readyz reports it.
async fn mysql_pool(settings: &Settings) -> anyhow::Result<sqlx::MySqlPool> {
    let pool = stocksvr_store::mysql_pool_with(
        settings.mysql.url.expose(),
        settings.mysql.max_connections,
        Duration::from_millis(settings.mysql.acquire_timeout_ms),
        settings.mysql.ping_before_use,
    )?;
    match stocksvr_store::pending_migrations(&pool).await {
        Ok(pending) if !pending.is_empty() => {
            anyhow::bail!("the database lacks migrations {pending:?}: run `stocksvr migrate` first")
        }
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "cannot check the database schema yet"),
    }
    Ok(pool)
}

/// What `/readyz` asks: Kafka, the registry, MySQL and Redis.
fn probes(
    settings: &Settings,
    registry: RegistryClient,
    pool: &sqlx::MySqlPool,
) -> anyhow::Result<Vec<Arc<dyn Probe>>> {
    let redis = probes::RedisProbe {
        target: crate::settings::redis_target(&settings.redis),
        tls: crate::settings::redis_tls(&settings.redis)?,
        timeout: Duration::from_millis(settings.http.readiness_timeout_ms),
    };
    Ok(vec![
        Arc::new(probes::KafkaProbe::new(
            &settings.kafka,
            Duration::from_millis(settings.http.readiness_timeout_ms),
        )),
        Arc::new(probes::RegistryProbe(registry)),
        Arc::new(probes::MysqlProbe(pool.clone())),
        Arc::new(redis),
    ])
}

/// Health, the Try API and the admin endpoints (as `access` decided for `bound`); the caller
/// check goes in front of it all ([`Front`]).
fn router(
    settings: &Settings,
    pool: &sqlx::MySqlPool,
    catalog: &Arc<Catalog>,
    api: &stocksvr_api::ApiState,
    health: HealthState,
    bound: SocketAddr,
    access: Access,
) -> anyhow::Result<Router> {
    let redacted = serde_json::to_value(settings)?;
    let dlq = stocksvr_dead_letter::AdminState::with_lazy_producer(
        pool.clone(),
        settings.kafka.clone(),
        Some(AvroCodec::new(&settings.registry, catalog.clone())?),
    );
    let admin = Router::new()
        .route("/admin/config", get(move || async move { Json(redacted) }))
        .merge(stocksvr_dead_letter::admin_routes(dlq))
        .merge(stocksvr_api::admin_router(api.clone()));
    if access.admin == AdminAccess::Refused {
        tracing::warn!(listen = %bound, "{}", admin_refused_message(bound));
    }
    Ok(http::health_routes(health)
        .merge(stocksvr_api::router(api.clone()))
        .merge(admin_routes(admin, access.admin, bound)))
}

/// What starting a role needs; each role is one named task of [`Parts`].
struct Start<'a> {
    settings: &'a Settings,
    pool: &'a sqlx::MySqlPool,
    codec: &'a AvroCodec,
    stop: &'a watch::Receiver<bool>,
}

impl Start<'_> {
    /// Starts the relay; its waker lets the reservation service wake it after each commit.
    fn outbox_relay(&self, tasks: &mut Parts) -> anyhow::Result<Arc<Notify>> {
        let settings = self.settings;
        let producer = stocksvr_pipeline::kafka::producer(&settings.kafka, "outbox-relay")?;
        let relay = stocksvr_outbox_relay::OutboxRelay::new(
            self.pool.clone(),
            producer,
            self.codec.clone(),
            settings.relay.config()?,
        )?
        .in_namespace(settings.kafka.namespace());
        let waker = relay.waker();
        let stop = self.stop.clone();
        tasks.spawn("outbox relay", async move {
            relay.run(stop).await.map_err(anyhow::Error::from)
        });
        Ok(waker)
    }

    fn dead_letter(&self, tasks: &mut Parts) -> anyhow::Result<()> {
        let config = stocksvr_dead_letter::loop_config_from_file(&self.settings.kafka)
            .context("reading the dead-letter topics from the topics file")?
            .with_consumer(&self.settings.consumer);
        let handler = Arc::new(stocksvr_dead_letter::Parker::new(
            self.pool.clone(),
            &self.settings.kafka.group_prefix,
        ));
        let (kafka, stop, codec) = (
            self.settings.kafka.clone(),
            self.stop.clone(),
            self.codec.clone(),
        );
        tasks.spawn(stocksvr_dead_letter::NAME, async move {
            stocksvr_pipeline::consumer::run(&kafka, codec, config, handler, stop)
                .await
                .map_err(anyhow::Error::from)
        });
        Ok(())
    }

    fn lag_exporter(&self, tasks: &mut Parts) {
        let (kafka, config, stop) = (
            self.settings.kafka.clone(),
            self.settings.lag_exporter.clone(),
            self.stop.clone(),
        );
        tasks.spawn("lag exporter", async move {
            stocksvr_lag_exporter::run(&kafka, config, stop)
                .await
                .map_err(anyhow::Error::from)
        });
    }

    fn projector(&self, tasks: &mut Parts) -> anyhow::Result<()> {
        let settings = self.settings;
        let group = stocksvr_projector::group_name(&settings.kafka);
        let handler = Arc::new(stocksvr_projector::Projector::new(
            self.pool.clone(),
            group,
        )?);
        let config =
            stocksvr_projector::loop_config(&settings.kafka).with_consumer(&settings.consumer);
        let (kafka, stop, codec) = (
            settings.kafka.clone(),
            self.stop.clone(),
            self.codec.clone(),
        );
        tasks.spawn("projector", async move {
            stocksvr_pipeline::consumer::run(&kafka, codec, config, handler, stop)
                .await
                .map_err(anyhow::Error::from)
        });
        Ok(())
    }

    /// The reservation service and the processors that need it ([`boot::run`]).
    fn reservation_service(
        &self,
        tasks: &mut Parts,
        api: stocksvr_api::ApiState,
        outbox_waker: Option<Arc<Notify>>,
        roles: Roles,
    ) {
        let (settings, pool, stop, codec) = (
            self.settings.clone(),
            self.pool.clone(),
            self.stop.clone(),
            self.codec.clone(),
        );
        tasks.spawn("reservation service and its processors", async move {
            boot::run(settings, pool, api, codec, outbox_waker, roles, stop).await
        });
    }
}

/// The stop, in the order a load balancer needs: `/readyz` fails, the listener serves on for
/// `grace`, then stops and its requests in flight finish, then every other part drains
/// (processors commit what they finished); the last two within [`DRAIN_WITHIN`].
async fn stop_in_order(
    tasks: &mut Parts,
    health: &HealthState,
    grace: Duration,
    http_stop: watch::Sender<bool>,
    stop: watch::Sender<bool>,
) {
    health.drain();
    serve_through_grace(tasks, grace).await;
    let deadline = tokio::time::Instant::now() + DRAIN_WITHIN;
    let _ = http_stop.send(true);
    if !tasks.wait_for(HTTP_LISTENER, deadline).await {
        tracing::warn!(
            "requests still in flight when the drain ran out; stopping the processors anyway"
        );
    }
    let _ = stop.send(true);
    // The processors get what the listener left, and never less than 5 s to commit.
    let left = deadline
        .saturating_duration_since(tokio::time::Instant::now())
        .max(Duration::from_secs(5));
    if let Err(busy) = tasks.drain(left).await {
        tracing::warn!(
            still_running = %busy.join(", "),
            "drain did not finish within {} s; exiting anyway",
            DRAIN_WITHIN.as_secs()
        );
    }
}

/// The grace period after a shutdown was asked for: `/readyz` already answers 503
/// `draining`, and everything keeps working (the listener accepts and serves, the processors
/// consume) while the load balancers notice. A part that ends meanwhile (a failure) ends the
/// grace: the process is going down anyway.
async fn serve_through_grace(tasks: &mut Parts, grace: Duration) {
    if grace.is_zero() {
        return;
    }
    tracing::info!(
        grace_ms = grace.as_millis() as u64,
        "draining: /readyz answers 503, serving on for http.drain_grace_ms"
    );
    tokio::select! {
        () = tokio::time::sleep(grace) => {}
        Some((name, result)) = tasks.next() => {
            let error = result.err().map(|e| format!("{e:#}")).unwrap_or_default();
            tracing::warn!(task = name, error, "a part ended during the grace period; stopping now");
        }
    }
    tracing::info!("grace period over: the listener stops accepting, requests in flight finish");
}

/// Waits for the shutdown signal or the first part to end (always a failure while no
/// shutdown was asked for, even when it returned Ok).
async fn until_shutdown_or_failure(
    tasks: &mut Parts,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    tokio::select! {
        _ = shutdown => {
            tracing::info!("shutdown requested, draining");
            Ok(())
        }
        Some((name, result)) = tasks.next() => match result {
            Ok(()) => Err(anyhow::anyhow!("{name} stopped unexpectedly")),
            Err(e) => Err(e.context(format!("{name} failed"))),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_drain_that_runs_out_of_time_names_the_parts_still_running() {
        let mut parts = Parts::new();
        parts.spawn("quick", async { Ok(()) });
        parts.spawn("failing", async { Err(anyhow::anyhow!("boom")) });
        parts.spawn("panicking", async { panic!("a part that panics") });
        parts.spawn("stuck", std::future::pending());
        parts.spawn("stuck", std::future::pending());
        assert_eq!(
            parts.drain(Duration::from_secs(1)).await,
            Err(vec!["stuck"])
        );
        // Both of the same name are still counted.
        assert_eq!(parts.names.values().filter(|n| **n == "stuck").count(), 2);
        // Waiting for one part ends when it ends, or at once when it is gone already.
        let soon = tokio::time::Instant::now() + Duration::from_secs(1);
        assert!(!parts.wait_for("stuck", soon).await);
        parts.spawn("quick", async { Ok(()) });
        let later = tokio::time::Instant::now() + Duration::from_secs(5);
        assert!(parts.wait_for("quick", later).await);
        assert!(parts.wait_for("quick", later).await, "gone already");

        let mut parts = Parts::new();
        parts.spawn("quick", async { Ok(()) });
        parts.spawn("failing", async { Err(anyhow::anyhow!("boom")) });
        assert_eq!(parts.drain(Duration::from_secs(1)).await, Ok(()));
        assert!(parts.names.is_empty());
    }

    /// The admin part as `run` assembles it (a stand-in for the real handlers), next to a
    /// Try API route, served on a loopback port: the decision is an input, so the refused
    /// shape is tested without binding an address other hosts could reach.
    async fn serve(access: AdminAccess, token: Option<&str>) -> String {
        use stocksvr_api::auth::{self, Callers, Gate, Guard, Policy, Scopes};
        let admin = Router::new()
            .route(
                "/admin/config",
                get(|| async { Json(serde_json::json!({"ok": true})) }),
            )
            .route(
                "/admin/buckets/{id}/close",
                axum::routing::post(|| async { "closed" }),
            );
        let exposed: SocketAddr = "0.0.0.0:8080".parse().expect("address");
        let mut callers = Callers::new();
        if let Some(token) = token {
            let admin = Scopes {
                api: false,
                admin: true,
            };
            callers
                .add_token("admin", &auth::digest_hex(token), admin)
                .expect("token");
        }
        let policy = Policy {
            public_paths: vec![],
            api: Guard::Open,
            admin: match access {
                AdminAccess::Token => Guard::Callers,
                _ => Guard::Open,
            },
        };
        let router = Router::new()
            .route("/v1/reservations/{id}", get(|| async { "reservation" }))
            .merge(admin_routes(admin, access, exposed))
            .layer(axum::middleware::from_fn_with_state(
                Gate::new(policy, callers),
                auth::check,
            ));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let base = format!("http://{}", listener.local_addr().expect("addr"));
        tokio::spawn(async move { axum::serve(listener, router).await });
        base
    }

    async fn call(method: reqwest::Method, url: String, token: Option<&str>) -> (u16, String) {
        stocksvr_pipeline::tls::install_crypto_provider();
        let mut req = reqwest::Client::new().request(method, url);
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let resp = req.send().await.expect("request");
        (resp.status().as_u16(), resp.text().await.expect("body"))
    }

    #[tokio::test]
    async fn refused_admin_answers_403_naming_the_clients_and_the_api_still_serves() {
        let base = serve(AdminAccess::Refused, None).await;
        for (method, path) in [
            (reqwest::Method::GET, "/admin/config"),
            (reqwest::Method::POST, "/admin/buckets/1:2:2026-01-01/close"),
            (reqwest::Method::GET, "/admin"),
            (reqwest::Method::DELETE, "/admin/anything/else"),
        ] {
            // A token the server does not know changes nothing: there is none to match.
            let (status, body) = call(method, format!("{base}{path}"), Some("guess")).await;
            assert_eq!(status, 403, "{path}: {body}");
            let body: serde_json::Value = serde_json::from_str(&body).expect("JSON");
            assert_eq!(body["error"], "admin_disabled", "{path}");
            assert_eq!(body["field"], "http.auth.clients", "{path}");
            let message = body["message"].as_str().expect("message");
            assert!(message.contains("0.0.0.0:8080"), "{message}");
        }
        let (status, body) = call(
            reqwest::Method::GET,
            format!("{base}/v1/reservations/1"),
            None,
        )
        .await;
        assert_eq!((status, body.as_str()), (200, "reservation"));
    }

    #[tokio::test]
    async fn open_and_token_guarded_admin_serve_as_before() {
        let open = serve(AdminAccess::Open, None).await;
        let (status, _) = call(reqwest::Method::GET, format!("{open}/admin/config"), None).await;
        assert_eq!(status, 200);

        let guarded = serve(AdminAccess::Token, Some("s3cret")).await;
        let url = || format!("{guarded}/admin/config");
        assert_eq!(call(reqwest::Method::GET, url(), None).await.0, 401);
        assert_eq!(call(reqwest::Method::GET, url(), Some("nope")).await.0, 401);
        assert_eq!(
            call(reqwest::Method::GET, url(), Some("s3cret")).await.0,
            200
        );
    }
}
