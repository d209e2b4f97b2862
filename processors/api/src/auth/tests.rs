//! The gate on a stand-in router, called in-process: who gets through, what a refusal looks
//! like, that a refused request never reaches its handler, and what is counted.

use super::*;
use axum::body::Body;
use axum::routing::{get, post};
use axum::Router;
use std::sync::atomic::AtomicUsize;
use stocksvr_telemetry::testing::Capture;
use tower::ServiceExt;

const API: Scopes = Scopes {
    api: true,
    admin: false,
};
const ADMIN: Scopes = Scopes {
    api: false,
    admin: true,
};

fn callers() -> Callers {
    let mut callers = Callers::new();
    callers
        .add_token("orders", &digest_hex("orders-token"), API)
        .expect("orders");
    callers
        .add_token("ops", &digest_hex("ops-token"), ADMIN)
        .expect("ops");
    callers.add_subject("orders.internal", "orders-cert", API);
    callers
}

fn policy(guard: Guard) -> Policy {
    Policy {
        public_paths: vec!["/healthz".into(), "/metrics".into()],
        api: guard,
        admin: guard,
    }
}

/// A router whose handlers count their runs, behind the gate.
fn app(gate: Gate, runs: Arc<AtomicUsize>) -> Router {
    let (r1, r2) = (runs.clone(), runs.clone());
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/v1/reservations",
            post(move || async move {
                r1.fetch_add(1, Ordering::SeqCst);
                "tried"
            }),
        )
        .route(
            "/admin/config",
            get(move || async move {
                r2.fetch_add(1, Ordering::SeqCst);
                "config"
            }),
        )
        .layer(axum::middleware::from_fn_with_state(gate, check))
}

async fn call(
    app: &Router,
    method: &str,
    path: &str,
    authorization: Option<&str>,
    peer: Option<PeerNames>,
) -> (u16, Option<String>, serde_json::Value) {
    let mut req = axum::http::Request::builder().method(method).uri(path);
    if let Some(a) = authorization {
        req = req.header(header::AUTHORIZATION, a);
    }
    let mut req = req.body(Body::empty()).expect("request");
    if let Some(peer) = peer {
        req.extensions_mut().insert(peer);
    }
    let resp = app.clone().oneshot(req).await.expect("infallible");
    let status = resp.status().as_u16();
    let challenge = resp
        .headers()
        .get(header::WWW_AUTHENTICATE)
        .map(|v| v.to_str().expect("ascii").to_string());
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 16)
        .await
        .expect("body");
    let body = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
    (status, challenge, body)
}

#[test]
fn the_bearer_scheme_is_read_in_any_case_and_nothing_else_is_a_token() {
    let token = |raw: &'static str| bearer(&HeaderValue::from_static(raw)).map(str::to_string);
    assert_eq!(token("Bearer abc").as_deref(), Some("abc"));
    assert_eq!(token("bearer abc").as_deref(), Some("abc"));
    assert_eq!(token("BEARER  abc ").as_deref(), Some("abc"));
    for bad in [
        "Basic abc",
        "Bearer",
        "Bearer ",
        "Bearerabc",
        "Bearer a b",
        "abc",
    ] {
        assert_eq!(token(bad), None, "{bad}");
    }
}

#[tokio::test]
async fn refused_callers_get_401_or_403_and_never_reach_the_handler() {
    let capture = Capture::default();
    let _recorder = metrics::set_default_local_recorder(&capture);
    let runs = Arc::new(AtomicUsize::new(0));
    let app = app(Gate::new(policy(Guard::Callers), callers()), runs.clone());
    let try_ = |auth, peer| {
        let app = app.clone();
        async move { call(&app, "POST", "/v1/reservations", auth, peer).await }
    };

    for (auth, says) in [
        (None, "needs a caller"),
        (Some("Bearer wrong-token"), "unknown or revoked"),
        (Some("Basic b3JkZXJz"), "must be `Bearer <token>`"),
    ] {
        let (status, challenge, body) = try_(auth, None).await;
        assert_eq!(status, 401, "{auth:?}");
        assert_eq!(challenge.as_deref(), Some("Bearer realm=\"stocksvr\""));
        assert_eq!(body["error"], "unauthorized");
        assert_eq!(body["field"], "authorization");
        let message = body["message"].as_str().expect("message");
        assert!(message.contains(says), "{message}");
        assert!(!message.contains("wrong-token"), "{message}");
    }
    let stranger = PeerNames::from_names(vec!["intruder".into()]);
    assert_eq!(try_(None, Some(stranger)).await.0, 401);
    // A known client without the scope: 403, no challenge.
    let (status, challenge, body) = try_(Some("Bearer ops-token"), None).await;
    assert_eq!((status, challenge), (403, None));
    assert_eq!(body["error"], "forbidden");
    assert_eq!(
        call(
            &app,
            "GET",
            "/admin/config",
            Some("Bearer orders-token"),
            None
        )
        .await
        .0,
        403
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "a refused request ran its handler"
    );

    assert_eq!(try_(Some("bearer orders-token"), None).await.0, 200);
    let allowed = PeerNames::from_names(vec!["ORDERS.INTERNAL".into()]);
    assert_eq!(try_(None, Some(allowed)).await.0, 200);
    assert_eq!(
        call(&app, "GET", "/admin/config", Some("Bearer ops-token"), None)
            .await
            .0,
        200
    );
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    // Public paths need nobody, and are not counted.
    assert_eq!(call(&app, "GET", "/healthz", None, None).await.0, 200);

    let count = |client, outcome| {
        capture
            .counter(
                names::HTTP_AUTH,
                &[("client", client), ("outcome", outcome)],
            )
            .unwrap_or(0)
    };
    assert_eq!(count("anonymous", "unauthorized"), 1);
    assert_eq!(count("unknown", "unauthorized"), 3);
    assert_eq!(count("ops", "forbidden"), 1);
    assert_eq!(count("orders", "forbidden"), 1);
    assert_eq!(count("orders", "allowed"), 1);
    assert_eq!(count("orders-cert", "allowed"), 1);
    assert_eq!(count("ops", "allowed"), 1);
    let clients: HashSet<String> = capture
        .label_sets(names::HTTP_AUTH)
        .iter()
        .filter_map(|set| {
            set.iter()
                .find(|(k, _)| k == "client")
                .map(|(_, v)| v.clone())
        })
        .collect();
    let expected: HashSet<String> = ["anonymous", "unknown", "orders", "ops", "orders-cert"]
        .map(String::from)
        .into();
    assert_eq!(
        clients, expected,
        "only configured names and the two others"
    );
}

#[tokio::test]
async fn a_replaced_set_of_callers_revokes_a_removed_token_at_once() {
    let runs = Arc::new(AtomicUsize::new(0));
    let gate = Gate::new(policy(Guard::Callers), callers());
    let app = app(gate.clone(), runs);
    let orders = Some("Bearer orders-token");
    assert_eq!(
        call(&app, "POST", "/v1/reservations", orders, None).await.0,
        200
    );
    let mut fewer = Callers::new();
    fewer
        .add_token("ops", &digest_hex("ops-token"), ADMIN)
        .expect("ops");
    gate.replace(fewer);
    assert_eq!(
        call(&app, "POST", "/v1/reservations", orders, None).await.0,
        401
    );
    // Nobody left with the api scope closes the API; it never opens it.
    gate.replace(Callers::new());
    assert_eq!(
        call(&app, "POST", "/v1/reservations", None, None).await.0,
        401
    );
}

#[tokio::test]
async fn an_open_guard_serves_everyone_and_counts_them_as_anonymous() {
    let capture = Capture::default();
    let _recorder = metrics::set_default_local_recorder(&capture);
    let runs = Arc::new(AtomicUsize::new(0));
    let gate = Gate::new(
        Policy {
            public_paths: vec![],
            api: Guard::Open,
            admin: Guard::Callers,
        },
        callers(),
    );
    let app = app(gate, runs);
    assert_eq!(
        call(&app, "POST", "/v1/reservations", None, None).await.0,
        200
    );
    assert_eq!(call(&app, "GET", "/admin/config", None, None).await.0, 401);
    assert_eq!(
        capture.counter(
            names::HTTP_AUTH,
            &[("client", "anonymous"), ("outcome", "allowed")]
        ),
        Some(1)
    );
    // Every configured client's series exists from the start.
    assert_eq!(
        capture.counter(
            names::HTTP_AUTH,
            &[("client", "ops"), ("outcome", "allowed")]
        ),
        Some(0)
    );
}
