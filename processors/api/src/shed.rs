//! Load shedding of the Try API: a bound on requests in flight, a bounded admission queue and
//! an admission deadline, answered with 503 and `Retry-After` instead of an unbounded queue.
//!
//! Only admission is bounded, never work in progress: a request that got a permit runs to
//! its end. Cutting a Try off mid-way would be safe (the recovery worker finishes whatever a
//! dropped request left, as after a crash), but it would turn a slow answer into a slower
//! repair; refusing before anything started costs the client one retry with the same ids,
//! which the contract makes safe. Every shed request is counted in
//! `stocksvr_http_shed_total{reason}`: `overload` when the queue is full, `deadline` when it
//! waited longer than the admission deadline.

use crate::error::ApiError;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use stocksvr_telemetry::{metrics, names};
use tokio::sync::Semaphore;

/// The bounds (the `[http]` settings `max_in_flight`, `max_queued`, `admission_deadline_ms`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShedConfig {
    /// Requests served at once. Past the point where MariaDB or the CPU saturates, more
    /// concurrency only adds queueing delay, so the bound sits well above the knee the
    /// benchmark finds and well below what would exhaust memory or sockets.
    pub max_in_flight: usize,
    /// Requests waiting for a slot; one more is refused at once.
    pub max_queued: usize,
    /// Longest wait for a slot. A client's own timeout is usually a few seconds: an answer
    /// it will not wait for is work thrown away.
    pub admission_deadline: Duration,
}

impl Default for ShedConfig {
    fn default() -> Self {
        Self {
            max_in_flight: 256,
            max_queued: 2048,
            admission_deadline: Duration::from_millis(1000),
        }
    }
}

/// The admission state shared by every request of one listener.
#[derive(Debug, Clone)]
pub struct Admission {
    slots: Arc<Semaphore>,
    queued: Arc<AtomicUsize>,
    config: ShedConfig,
}

impl Admission {
    pub fn new(config: ShedConfig) -> Self {
        // A zero bound would refuse every request: a configuration error read as "one".
        let config = ShedConfig {
            max_in_flight: config.max_in_flight.max(1),
            ..config
        };
        for reason in ["overload", "deadline"] {
            metrics::counter!(names::HTTP_SHED, "reason" => reason).absolute(0);
        }
        Self {
            slots: Arc::new(Semaphore::new(config.max_in_flight)),
            queued: Arc::new(AtomicUsize::new(0)),
            config,
        }
    }

    pub fn config(&self) -> ShedConfig {
        self.config
    }
}

impl Default for Admission {
    fn default() -> Self {
        Self::new(ShedConfig::default())
    }
}

/// Leaves the queue count when the waiting request is admitted, refused or dropped by its
/// client.
struct Queued<'a>(&'a AtomicUsize);

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

fn shed(reason: &'static str, message: String) -> Response {
    metrics::counter!(names::HTTP_SHED, "reason" => reason).increment(1);
    let mut error = ApiError::unavailable(message);
    error.body.error = "overloaded";
    error.into_response()
}

/// The middleware: `router.layer(axum::middleware::from_fn_with_state(admission, admit))`.
pub async fn admit(State(admission): State<Admission>, req: Request, next: Next) -> Response {
    let permit = match admission.slots.clone().try_acquire_owned() {
        Ok(permit) => permit,
        Err(_) => {
            let config = admission.config;
            let waiting = admission.queued.fetch_add(1, Ordering::AcqRel);
            let _queued = Queued(&admission.queued);
            if waiting >= config.max_queued {
                return shed(
                    "overload",
                    format!(
                        "overloaded: {} requests in flight and {} waiting; retry with the same ids",
                        config.max_in_flight, config.max_queued
                    ),
                );
            }
            match tokio::time::timeout(
                config.admission_deadline,
                admission.slots.clone().acquire_owned(),
            )
            .await
            {
                Ok(Ok(permit)) => permit,
                // The semaphore is never closed; treated like a full queue all the same.
                Ok(Err(_)) => return shed("overload", "overloaded".into()),
                Err(_) => {
                    return shed(
                        "deadline",
                        format!(
                            "overloaded: no slot within {} ms; retry with the same ids",
                            config.admission_deadline.as_millis()
                        ),
                    )
                }
            }
        }
    };
    let response = next.run(req).await;
    drop(permit);
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_client::until;
    use axum::routing::get;
    use axum::Router;
    use stocksvr_telemetry::testing::Capture;
    use tokio::sync::Notify;

    async fn get_reply(addr: std::net::SocketAddr) -> String {
        crate::test_client::get(addr, "/v1/held").await
    }

    #[tokio::test]
    async fn a_full_queue_and_a_long_wait_are_refused_with_503_and_retry_after() {
        let capture = Capture::default();
        let _recorder = metrics::set_default_local_recorder(&capture);
        let release = Arc::new(Notify::new());
        let entered = Arc::new(AtomicUsize::new(0));
        let (held, count) = (release.clone(), entered.clone());
        let admission = Admission::new(ShedConfig {
            max_in_flight: 1,
            max_queued: 1,
            admission_deadline: Duration::from_millis(300),
        });
        let queued = admission.queued.clone();
        let router = Router::new()
            .route(
                "/v1/held",
                get(move || {
                    let (held, count) = (held.clone(), count.clone());
                    async move {
                        count.fetch_add(1, Ordering::SeqCst);
                        held.notified().await;
                        "done"
                    }
                }),
            )
            .layer(axum::middleware::from_fn_with_state(admission, admit));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let server = tokio::spawn(async move { axum::serve(listener, router).await });

        // One request holds the only slot.
        let first = tokio::spawn(get_reply(addr));
        until("the first request runs", || {
            entered.load(Ordering::SeqCst) == 1
        })
        .await;
        // The second waits in the queue; the third finds it full and is refused at once.
        let second = tokio::spawn(get_reply(addr));
        until("the second request waits", || {
            queued.load(Ordering::SeqCst) == 1
        })
        .await;
        let third = get_reply(addr).await;
        assert!(third.starts_with("HTTP/1.1 503"), "{third}");
        assert!(third.to_lowercase().contains("retry-after: 1"), "{third}");
        assert!(third.contains("\"error\":\"overloaded\""), "{third}");
        assert_eq!(
            capture.counter(names::HTTP_SHED, &[("reason", "overload")]),
            Some(1)
        );
        // The second's admission deadline passes while the first still holds the slot.
        let second = second.await.expect("joined");
        assert!(second.starts_with("HTTP/1.1 503"), "{second}");
        assert!(second.contains("no slot within 300 ms"), "{second}");
        assert_eq!(
            capture.counter(names::HTTP_SHED, &[("reason", "deadline")]),
            Some(1)
        );
        assert_eq!(entered.load(Ordering::SeqCst), 1, "shed requests never ran");
        assert_eq!(queued.load(Ordering::SeqCst), 0, "the queue is empty again");

        // Work in progress is never cut off: the first ends normally, and the slot serves
        // the next request.
        release.notify_one();
        let first = first.await.expect("joined");
        assert!(first.starts_with("HTTP/1.1 200"), "{first}");
        let next = tokio::spawn(get_reply(addr));
        until("the next request runs", || {
            entered.load(Ordering::SeqCst) == 2
        })
        .await;
        release.notify_one();
        let next = next.await.expect("joined");
        assert!(next.starts_with("HTTP/1.1 200"), "{next}");
        server.abort();
    }
}
