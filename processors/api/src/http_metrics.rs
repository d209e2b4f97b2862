//! HTTP metrics of the Try API, as one middleware layer on its router:
//! `stocksvr_http_request_seconds{route}` (latency to the response headers) and
//! `stocksvr_http_in_flight`. `stocksvr_http_requests_total{route,status}` is counted for
//! every route of the listener by `stocksvr_pipeline::http::count_requests`.
//!
//! The route label is the matched path template (`/v1/reservations/{id}`), never the raw
//! path: one series per declared route whatever ids clients send, so the cardinality stays
//! bounded. A request the router did not match is `unmatched`.

use axum::extract::{MatchedPath, Request};
use axum::middleware::Next;
use axum::response::Response;
use std::time::Instant;
use stocksvr_telemetry::{metrics, names};

/// Counts a request in flight from its creation to its drop, so a request whose client went
/// away (the future dropped mid-way) leaves the gauge too.
struct InFlight;

impl InFlight {
    fn enter() -> Self {
        metrics::gauge!(names::HTTP_IN_FLIGHT).increment(1.0);
        InFlight
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        metrics::gauge!(names::HTTP_IN_FLIGHT).decrement(1.0);
    }
}

/// The middleware: `router.layer(axum::middleware::from_fn(http_metrics::track))`. Layered
/// on a `Router`, it runs after routing, so the matched template is known.
pub async fn track(req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_else(|| "unmatched".to_owned());
    let _in_flight = InFlight::enter();
    let started = Instant::now();
    let response = next.run(req).await;
    metrics::histogram!(names::HTTP_REQUEST_SECONDS, "route" => route)
        .record(started.elapsed().as_secs_f64());
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_client::until;
    use axum::extract::Path;
    use axum::routing::get;
    use axum::Router;
    use std::sync::Arc;
    use stocksvr_telemetry::testing::Capture;
    use tokio::sync::Notify;

    /// The status line of a GET.
    async fn get_status(addr: std::net::SocketAddr, path: &str) -> String {
        let reply = crate::test_client::get(addr, path).await;
        reply.lines().next().unwrap_or_default().to_owned()
    }

    /// Everything runs on the test's one thread (current-thread runtime), so the local
    /// recorder sees what the server's tasks record.
    #[tokio::test]
    async fn latency_by_route_template_and_requests_in_flight() {
        let capture = Capture::default();
        let _recorder = metrics::set_default_local_recorder(&capture);
        let release = Arc::new(Notify::new());
        let held = release.clone();
        let router = Router::new()
            .route(
                "/v1/things/{id}",
                get(|Path(id): Path<u64>| async move { id.to_string() }),
            )
            .route(
                "/v1/slow",
                get(move || {
                    let held = held.clone();
                    async move { held.notified().await }
                }),
            )
            .layer(axum::middleware::from_fn(track));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let server = tokio::spawn(async move { axum::serve(listener, router).await });

        assert!(get_status(addr, "/v1/things/41").await.contains("200"));
        assert!(get_status(addr, "/v1/things/42").await.contains("200"));
        let things =
            capture.histogram(names::HTTP_REQUEST_SECONDS, &[("route", "/v1/things/{id}")]);
        assert_eq!(things.len(), 2, "both ids under one template");
        assert!(things.iter().all(|s| (0.0..1.0).contains(s)), "{things:?}");
        assert_eq!(
            capture.label_sets(names::HTTP_REQUEST_SECONDS).len(),
            1,
            "no series per raw path: {:?}",
            capture.label_sets(names::HTTP_REQUEST_SECONDS)
        );

        let slow = tokio::spawn(get_status(addr, "/v1/slow"));
        until("the slow request counted in flight", || {
            capture.gauge(names::HTTP_IN_FLIGHT, &[]) == Some(1.0)
        })
        .await;
        release.notify_one();
        assert!(slow.await.expect("joined").contains("200"));
        until("the finished request leaves the gauge", || {
            capture.gauge(names::HTTP_IN_FLIGHT, &[]) == Some(0.0)
        })
        .await;
        assert_eq!(
            capture
                .histogram(names::HTTP_REQUEST_SECONDS, &[("route", "/v1/slow")])
                .len(),
            1
        );
        server.abort();
    }
}
