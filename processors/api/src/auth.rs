//! Caller authentication of the listener: one middleware in front of every route. A public
//! path (probes, scraping) passes as it is; any other needs a caller with the path's scope
//! (`admin` under `/admin`, `api` elsewhere) when its [`Guard`] says so: a bearer token of a
//! configured client, or a client certificate whose subject is allowed. A refused request
//! gets 401 (no or unknown credentials) or 403 (a known client without the scope) before
//! any handler runs, so nothing is written for it.
//!
//! The client's name goes into the request's span (every log line of its handler carries
//! it) and into `stocksvr_http_auth_total{client,outcome}`, whose `client` takes only the
//! configured names plus `anonymous` (no credentials) and `unknown` (credentials no client
//! has), so its cardinality stays bounded whatever callers send. A token is never logged.

mod callers;
mod peer;

pub use callers::{digest_hex, token_digest, Caller, Callers, Scopes};
pub use peer::PeerNames;

use crate::error::ErrorBody;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use stocksvr_telemetry::{metrics, names};
use tracing::Instrument;

/// Whether a group of paths needs a caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Guard {
    /// Every caller is served (a loopback listener, or `http.allow_unauthenticated`).
    Open,
    /// Only a configured caller with the scope.
    Callers,
}

/// What the gate decides from: the public paths and the guard of each scope.
#[derive(Debug, Clone)]
pub struct Policy {
    pub public_paths: Vec<String>,
    /// Every path outside `/admin` and the public ones.
    pub api: Guard,
    /// `/admin` and `/admin/*`.
    pub admin: Guard,
}

/// The middleware's state: the policy and the current callers, which a reload replaces
/// while requests are served.
#[derive(Clone)]
pub struct Gate(Arc<Inner>);

struct Inner {
    public: HashSet<String>,
    api: Guard,
    admin: Guard,
    callers: RwLock<Arc<Callers>>,
    refusals: LogLimiter,
}

/// The gate's verdict on one request.
#[derive(Debug)]
enum Decision {
    Public,
    /// Served without a caller ([`Guard::Open`]).
    Open,
    Allowed(Arc<str>),
    Refused(Refusal),
}

#[derive(Debug)]
struct Refusal {
    status: StatusCode,
    client: Arc<str>,
    message: &'static str,
}

impl Refusal {
    fn unauthorized(client: &str, message: &'static str) -> Self {
        Self {
            status: StatusCode::UNAUTHORIZED,
            client: client.into(),
            message,
        }
    }

    fn outcome(&self) -> &'static str {
        if self.status == StatusCode::FORBIDDEN {
            "forbidden"
        } else {
            "unauthorized"
        }
    }
}

const NO_CREDENTIALS: &str =
    "this endpoint needs a caller: send Authorization: Bearer <token> (or a client certificate of an allowed subject)";
const MALFORMED: &str = "the Authorization header must be `Bearer <token>`";
const UNKNOWN_TOKEN: &str =
    "the bearer token is not one of a configured client (unknown or revoked)";
const UNKNOWN_SUBJECT: &str = "the client certificate's subject is not an allowed caller";
const NO_API_SCOPE: &str = "this client may not call the API (it lacks the api scope)";
const NO_ADMIN_SCOPE: &str = "this client may not call /admin (it lacks the admin scope)";

impl Gate {
    pub fn new(policy: Policy, callers: Callers) -> Self {
        for name in callers.names() {
            zero_series(&name);
        }
        Self(Arc::new(Inner {
            public: policy.public_paths.into_iter().collect(),
            api: policy.api,
            admin: policy.admin,
            callers: RwLock::new(Arc::new(callers)),
            refusals: LogLimiter::default(),
        }))
    }

    /// Swaps in a new set of callers (a reload): from the next request on, a removed
    /// token is refused.
    pub fn replace(&self, callers: Callers) {
        for name in callers.names() {
            zero_series(&name);
        }
        let callers = Arc::new(callers);
        match self.0.callers.write() {
            Ok(mut current) => *current = callers,
            // A writer never panics while holding the lock; should one have, the data is a
            // whole `Arc` either way.
            Err(poisoned) => *poisoned.into_inner() = callers,
        }
    }

    /// The callers in effect.
    pub fn callers(&self) -> Arc<Callers> {
        match self.0.callers.read() {
            Ok(c) => c.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    fn decide(
        &self,
        path: &str,
        authorization: Option<&HeaderValue>,
        peer: Option<&PeerNames>,
    ) -> Decision {
        if self.0.public.contains(path) {
            return Decision::Public;
        }
        let admin = path == "/admin" || path.starts_with("/admin/");
        let guard = if admin { self.0.admin } else { self.0.api };
        if guard == Guard::Open {
            return Decision::Open;
        }
        let callers = self.callers();
        let caller = match (authorization, peer) {
            (Some(value), _) => match bearer(value) {
                None => return Decision::Refused(Refusal::unauthorized("unknown", MALFORMED)),
                Some(token) => match callers.by_token(token) {
                    Some(caller) => caller,
                    None => {
                        return Decision::Refused(Refusal::unauthorized("unknown", UNKNOWN_TOKEN))
                    }
                },
            },
            (None, Some(peer)) => match callers.by_subject(peer) {
                Some(caller) => caller,
                None => {
                    return Decision::Refused(Refusal::unauthorized("unknown", UNKNOWN_SUBJECT))
                }
            },
            (None, None) => {
                return Decision::Refused(Refusal::unauthorized("anonymous", NO_CREDENTIALS))
            }
        };
        let (allowed, missing) = if admin {
            (caller.scopes.admin, NO_ADMIN_SCOPE)
        } else {
            (caller.scopes.api, NO_API_SCOPE)
        };
        if allowed {
            Decision::Allowed(caller.name.clone())
        } else {
            Decision::Refused(Refusal {
                status: StatusCode::FORBIDDEN,
                client: caller.name.clone(),
                message: missing,
            })
        }
    }
}

/// The token of `Authorization: Bearer <token>`; the scheme in any case (RFC 9110 §11.1).
fn bearer(value: &HeaderValue) -> Option<&str> {
    let (scheme, token) = value.to_str().ok()?.split_once(' ')?;
    let token = token.trim_matches(' ');
    let valid = scheme.eq_ignore_ascii_case("bearer")
        && !token.is_empty()
        && !token.contains(char::is_whitespace);
    valid.then_some(token)
}

fn zero_series(client: &str) {
    metrics::counter!(names::HTTP_AUTH, "client" => client.to_string(), "outcome" => "allowed")
        .increment(0);
}

/// The middleware: `router.layer(axum::middleware::from_fn_with_state(gate, auth::check))`.
pub async fn check(State(gate): State<Gate>, req: Request, next: Next) -> Response {
    let decision = gate.decide(
        req.uri().path(),
        req.headers().get(header::AUTHORIZATION),
        req.extensions().get::<PeerNames>(),
    );
    match decision {
        Decision::Public => next.run(req).await,
        Decision::Open => {
            metrics::counter!(names::HTTP_AUTH, "client" => "anonymous", "outcome" => "allowed")
                .increment(1);
            next.run(req).await
        }
        Decision::Allowed(client) => {
            metrics::counter!(names::HTTP_AUTH, "client" => client.to_string(), "outcome" => "allowed")
                .increment(1);
            let route = route_of(&req);
            let span = tracing::info_span!("request", client = %client);
            async move {
                let response = next.run(req).await;
                tracing::debug!(client = %client, route, status = response.status().as_u16(), "request served");
                response
            }
            .instrument(span)
            .await
        }
        Decision::Refused(refusal) => {
            let outcome = refusal.outcome();
            metrics::counter!(names::HTTP_AUTH, "client" => refusal.client.to_string(), "outcome" => outcome)
                .increment(1);
            if let Some(suppressed) = gate.0.refusals.allow() {
                tracing::info!(client = %refusal.client, outcome, route = route_of(&req), status = refusal.status.as_u16(),
                    refused_since_last_line = suppressed, "request refused: {}", refusal.message);
            }
            refused(refusal)
        }
    }
}

/// The route template the request matched (never the raw path, which a caller chooses).
fn route_of(req: &Request) -> String {
    req.extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", |p| p.as_str())
        .to_string()
}

fn refused(refusal: Refusal) -> Response {
    let error = if refusal.status == StatusCode::FORBIDDEN {
        "forbidden"
    } else {
        "unauthorized"
    };
    let body = ErrorBody {
        error,
        field: Some("authorization".into()),
        message: refusal.message.to_string(),
    };
    let mut response = (refusal.status, Json(body)).into_response();
    if refusal.status == StatusCode::UNAUTHORIZED {
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer realm=\"stocksvr\""),
        );
    }
    response
}

/// At most one refusal line a second: a caller retrying with a revoked token, or a scanner,
/// must not flood the log. The next line says how many were not logged.
#[derive(Default)]
struct LogLimiter {
    second: AtomicU64,
    suppressed: AtomicU64,
}

impl LogLimiter {
    /// `Some(refusals not logged since the last line)` when this one may be logged.
    fn allow(&self) -> Option<u64> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        if self.second.swap(now, Ordering::Relaxed) != now {
            Some(self.suppressed.swap(0, Ordering::Relaxed))
        } else {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

#[cfg(test)]
mod tests;
