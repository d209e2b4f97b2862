//! The HTTP listener every stocksvr process runs: `/metrics`, `/healthz`, `/readyz`;
//! processors merge their own routes, and the binary puts its caller check in front
//! (`stocksvr_api::auth`).
//!
//! Draining ([`HealthState::drain`], on SIGTERM): `/readyz` answers 503 `draining` at once,
//! without asking the dependencies, while every other route keeps serving; each response then
//! carries `Connection: close`, so a caller's kept-alive connection is not reused for a
//! request that could meet the listener closing.

use crate::config::HttpSettings;
use crate::telemetry::names;
use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use futures::future::BoxFuture;
use metrics_exporter_prometheus::PrometheusHandle;
use serde_json::json;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A dependency `/readyz` asks before it says the process can take traffic.
pub trait Probe: Send + Sync {
    fn name(&self) -> &'static str;
    fn check(&self) -> BoxFuture<'_, Result<(), String>>;
}

/// Something `/readyz` reports without it deciding readiness: a condition that degrades the
/// service for part of its data (a lost stock bucket) while every dependency answers. Taking
/// an instance out of rotation would not help (every instance shares the same stores), so it
/// is reported, counted and alerted on instead.
pub trait Advisory: Send + Sync {
    fn name(&self) -> &'static str;
    /// `Ok(None)`: nothing to report; `Ok(Some(detail))`: degraded, with why.
    fn check(&self) -> BoxFuture<'_, Result<Option<serde_json::Value>, String>>;
}

#[derive(Clone)]
pub struct HealthState {
    probes: Arc<Vec<Arc<dyn Probe>>>,
    advisories: Arc<Vec<Arc<dyn Advisory>>>,
    timeout: Duration,
    metrics: PrometheusHandle,
    draining: Arc<AtomicBool>,
}

impl HealthState {
    pub fn new(
        probes: Vec<Arc<dyn Probe>>,
        settings: &HttpSettings,
        metrics: PrometheusHandle,
    ) -> Self {
        Self {
            probes: Arc::new(probes),
            advisories: Arc::new(Vec::new()),
            timeout: Duration::from_millis(settings.readiness_timeout_ms),
            metrics,
            draining: Arc::default(),
        }
    }

    /// From now on `/readyz` answers 503 `draining` and responses close their connection:
    /// the process is stopping and wants no new traffic, but still serves what comes.
    pub fn drain(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// Adds conditions `/readyz` reports under `advisories` without failing readiness.
    pub fn with_advisories(mut self, advisories: Vec<Arc<dyn Advisory>>) -> Self {
        self.advisories = Arc::new(advisories);
        self
    }

    /// Runs every probe concurrently, each bounded by the readiness timeout.
    pub async fn readiness(&self) -> (bool, serde_json::Value) {
        let checks = self.probes.iter().map(|p| async move {
            let started = Instant::now();
            let outcome = match tokio::time::timeout(self.timeout, p.check()).await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(e),
                Err(_) => Err(format!("no answer within {} ms", self.timeout.as_millis())),
            };
            metrics::gauge!(names::DEPENDENCY_READY, "dependency" => p.name())
                .set(if outcome.is_ok() { 1.0 } else { 0.0 });
            (p.name(), outcome, started.elapsed())
        });
        let results = futures::future::join_all(checks).await;
        let ready = results.iter().all(|(_, r, _)| r.is_ok());
        let detail: serde_json::Map<String, serde_json::Value> = results
            .into_iter()
            .map(|(name, result, took)| {
                let v = match result {
                    Ok(()) => json!({"ok": true, "ms": took.as_millis() as u64}),
                    Err(e) => json!({"ok": false, "ms": took.as_millis() as u64, "error": e}),
                };
                (name.to_string(), v)
            })
            .collect();
        let advised = futures::future::join_all(self.advisories.iter().map(|a| async move {
            let outcome = match tokio::time::timeout(self.timeout, a.check()).await {
                Ok(Ok(v)) => v,
                Ok(Err(e)) => Some(json!({ "error": e })),
                Err(_) => Some(
                    json!({ "error": format!("no answer within {} ms", self.timeout.as_millis()) }),
                ),
            };
            (a.name(), outcome)
        }))
        .await;
        let degraded = advised.iter().any(|(_, v)| v.is_some());
        let advisories: serde_json::Map<String, serde_json::Value> = advised
            .into_iter()
            .filter_map(|(name, v)| v.map(|v| (name.to_string(), v)))
            .collect();
        (
            ready,
            json!({ "ready": ready, "degraded": degraded, "dependencies": detail, "advisories": advisories }),
        )
    }
}

async fn healthz() -> Json<serde_json::Value> {
    Json(json!({ "status": "ok" }))
}

async fn readyz(State(state): State<HealthState>) -> Response {
    if state.is_draining() {
        // Not the dependencies' fault: no probe runs, so the answer is immediate and a
        // dependency alert does not fire for a stopping instance.
        let body = json!({
            "ready": false,
            "status": "draining",
            "message": "shutting down: still serving for http.drain_grace_ms, then stopping; send new requests elsewhere",
        });
        return (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response();
    }
    let (ready, body) = state.readiness().await;
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(body)).into_response()
}

async fn metrics_endpoint(State(state): State<HealthState>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics.render(),
    )
        .into_response()
}

/// While `state` drains, every response says `Connection: close` (hyper then closes the
/// connection after it): a kept-alive caller reconnects, through its balancer, elsewhere.
pub fn close_connections_while_draining(router: Router, state: &HealthState) -> Router {
    let draining = state.draining.clone();
    router.layer(middleware::from_fn(move |req: Request, next: Next| {
        let draining = draining.clone();
        async move {
            let mut resp = next.run(req).await;
            if draining.load(Ordering::SeqCst) {
                resp.headers_mut().insert(
                    header::CONNECTION,
                    header::HeaderValue::from_static("close"),
                );
            }
            resp
        }
    }))
}

/// `/metrics`, `/healthz`, `/readyz`.
pub fn health_routes(state: HealthState) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_endpoint))
        .with_state(state)
}

/// Counts every request by route and status class.
pub async fn count_requests(req: Request, next: Next) -> Response {
    let path = req
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "unmatched".into());
    let response = next.run(req).await;
    metrics::counter!(names::HTTP_REQUESTS, "route" => path, "status" => response.status().as_u16().to_string())
        .increment(1);
    response
}

/// Serves `router` until `shutdown` resolves; in-flight requests finish first.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let router = router.layer(middleware::from_fn(count_requests));
    // `into_make_service` turns every route into its service once, here. Handing axum::serve
    // the Router itself makes it do that again for every accepted connection (a copy of the
    // route table and of every layered route per connection): about 32 KB per connection,
    // `stocksvr all` grew by 33 MB with 1,024 idle connections, and by 1 MB this way.
    axum::serve(listener, router.into_make_service())
        .with_graceful_shutdown(shutdown)
        .await
}
