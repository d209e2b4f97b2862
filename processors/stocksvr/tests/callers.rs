//! Caller authentication of `stocksvr all` as a process: bearer tokens from a clients file
//! (no token, a wrong one, a revoked one: 401 and nothing written; the right one: served,
//! its client named in the log and in the metric; a client without the scope: 403), the
//! public paths, no token or digest in any log line or in the shown configuration, and the
//! secure-by-default refusal of an exposed listener without callers.

mod common;

use common::api::shop;
use common::server::Server;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::Duration;
use stocksvr_api::auth::digest_hex;
use stocksvr_test_support::eventually;

const ORDERS: &str = "it-orders-token-7f3a";
const OPS: &str = "it-ops-token-91bd";
const GONE: &str = "it-gone-token-c044";
const WRONG: &str = "it-wrong-token-5e21";

/// A clients file of the test's own, with `lines`.
fn clients_file(lines: &[(&str, &str, &str)]) -> PathBuf {
    let dir = std::env::temp_dir().join(common::unique("callers"));
    std::fs::create_dir_all(&dir).expect("dir");
    let file = dir.join("clients");
    write_clients(&file, lines);
    file
}

/// Replaces the file at once (a rename), the way a platform swaps a mounted secret.
fn write_clients(file: &PathBuf, lines: &[(&str, &str, &str)]) {
    let text: String = lines
        .iter()
        .map(|(name, token, scopes)| format!("{name} {} {scopes}\n", digest_hex(token)))
        .collect();
    let next = file.with_extension("next");
    std::fs::write(&next, format!("# test callers\n{text}")).expect("write");
    std::fs::rename(&next, file).expect("rename");
}

async fn call(
    server: &Server,
    method: reqwest::Method,
    path: &str,
    token: Option<&str>,
    body: Option<&Value>,
) -> (u16, Value) {
    let mut req = reqwest::Client::new().request(method, format!("{}{path}", server.base));
    if let Some(token) = token {
        req = req.header("authorization", format!("bearer {token}"));
    }
    if let Some(body) = body {
        req = req.json(body);
    }
    let resp = req.send().await.expect("request");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

async fn rows_of_order(pool: &sqlx::MySqlPool, order_id: u64) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM inventory_reservation WHERE order_id = ?")
        .bind(order_id)
        .fetch_one(pool)
        .await
        .expect("count")
}

#[tokio::test]
async fn only_configured_callers_with_the_scope_get_through_and_revoking_needs_no_restart() {
    let shop = shop(10).await;
    let file = clients_file(&[
        ("orders", ORDERS, "api"),
        ("ops", OPS, "admin"),
        ("gone", GONE, "api"),
    ]);
    let server = shop.server(&[
        (
            "STOCKSVR__HTTP__AUTH__CLIENTS_FILE",
            file.to_str().expect("utf-8"),
        ),
        ("STOCKSVR__HTTP__RELOAD_INTERVAL_MS", "200"),
        (
            "STOCKSVR__LOG__FILTER",
            "info,stocksvr_api::auth=debug,librdkafka=warn,sqlx=warn",
        ),
    ]);
    // The probes and the scrape need no caller.
    server.wait_for_readyz(200, Duration::from_secs(60)).await;
    for path in ["/healthz", "/metrics"] {
        let status = reqwest::get(format!("{}{path}", server.base))
            .await
            .expect(path)
            .status();
        assert_eq!(status.as_u16(), 200, "{path}");
    }
    let get = reqwest::Method::GET;
    let post = reqwest::Method::POST;
    assert!(
        eventually(Duration::from_secs(60), || async {
            call(
                &server,
                get.clone(),
                "/v1/reservations/1",
                Some(ORDERS),
                None,
            )
            .await
            .0 == 404
        })
        .await,
        "the Try API never came up; log:\n{}",
        server.log()
    );
    let pool = shop.env.pool();
    let order = |order_id: u64| {
        json!({"order_id": order_id, "order_item_id": order_id, "merchant_id": shop.merchant_id,
               "dish_id": shop.dish_id, "quantity": 1, "order_type": "INSTANT"})
    };

    // No token, a wrong one, and a known client without the api scope: refused, nothing written.
    for (order_id, token, status) in [
        (601, None, 401),
        (602, Some(WRONG), 401),
        (603, Some(OPS), 403),
    ] {
        let (got, body) = call(
            &server,
            post.clone(),
            "/v1/reservations",
            token,
            Some(&order(order_id)),
        )
        .await;
        assert_eq!(got, status, "{token:?}: {body}");
        assert_eq!(body["field"], "authorization", "{body}");
        assert_eq!(
            body["error"],
            if status == 401 {
                "unauthorized"
            } else {
                "forbidden"
            }
        );
        assert_eq!(
            rows_of_order(&pool, order_id).await,
            0,
            "{token:?} wrote a reservation"
        );
    }
    // The right token (the scheme in any case) is served.
    let (status, body) = call(
        &server,
        post.clone(),
        "/v1/reservations",
        Some(ORDERS),
        Some(&order(604)),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(rows_of_order(&pool, 604).await, 1);
    let (status, _) = call(
        &server,
        post.clone(),
        "/v1/reservations",
        Some(GONE),
        Some(&order(605)),
    )
    .await;
    assert_eq!(status, 201, "the token to be revoked works until then");

    // /admin needs the admin scope; what it shows holds no digest.
    assert_eq!(
        call(&server, get.clone(), "/admin/config", Some(ORDERS), None)
            .await
            .0,
        403
    );
    let shown = reqwest::Client::new()
        .get(format!("{}/admin/config", server.base))
        .bearer_auth(OPS)
        .send()
        .await
        .expect("config");
    assert_eq!(shown.status().as_u16(), 200);
    let shown = shown.text().await.expect("body");
    assert!(shown.contains("clients_file"), "{shown}");

    // Revoked: the line leaves the file; the running service refuses the token.
    write_clients(&file, &[("orders", ORDERS, "api"), ("ops", OPS, "admin")]);
    assert!(
        eventually(Duration::from_secs(10), || async {
            call(&server, get.clone(), "/v1/reservations/1", Some(GONE), None)
                .await
                .0
                == 401
        })
        .await,
        "the revoked token still works; log:\n{}",
        server.log()
    );
    let (status, _) = call(
        &server,
        post.clone(),
        "/v1/reservations",
        Some(GONE),
        Some(&order(606)),
    )
    .await;
    assert_eq!(status, 401);
    assert_eq!(
        rows_of_order(&pool, 606).await,
        0,
        "a revoked token wrote a reservation"
    );
    assert_eq!(
        call(
            &server,
            get.clone(),
            "/v1/reservations/1",
            Some(ORDERS),
            None
        )
        .await
        .0,
        404
    );

    let metrics = common::api::metrics_text(&server).await;
    for series in [
        r#"stocksvr_http_auth_total{client="orders",outcome="allowed"}"#,
        r#"stocksvr_http_auth_total{client="anonymous",outcome="unauthorized"} 1"#,
        r#"stocksvr_http_auth_total{client="ops",outcome="forbidden"} 1"#,
        r#"stocksvr_http_auth_total{client="unknown",outcome="unauthorized"}"#,
    ] {
        assert!(metrics.contains(series), "{series} missing:\n{metrics}");
    }
    let (status, log) = server.terminate();
    assert!(status.success(), "{log}");
    assert!(
        log.lines()
            .any(|l| l.contains("request served") && l.contains("orders")),
        "no log line names the client:\n{log}"
    );
    assert!(log.contains("reloaded"), "{log}");
    for secret in [ORDERS, OPS, GONE, WRONG] {
        assert!(!log.contains(secret), "a token is in the log:\n{log}");
        assert!(!log.contains(&digest_hex(secret)), "a digest is in the log");
        assert!(
            !shown.contains(&digest_hex(secret)),
            "a digest is in /admin/config"
        );
    }
    let _ = std::fs::remove_dir_all(file.parent().expect("dir"));
}

#[test]
fn an_exposed_listener_without_callers_is_refused_in_one_line() {
    let (ok, stdout, stderr) = common::run(
        common::stocksvr()
            .arg("all")
            .env("STOCKSVR__HTTP__LISTEN", "0.0.0.0:0")
            .env_remove("STOCKSVR__HTTP__AUTH__CLIENTS_FILE")
            .env_remove("STOCKSVR__HTTP__ALLOW_UNAUTHENTICATED"),
    );
    assert!(!ok, "started:\n{stdout}\n{stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    for says in ["0.0.0.0", "http.auth", "http.allow_unauthenticated = true"] {
        assert!(lines[0].contains(says), "{}", lines[0]);
    }
}

#[test]
fn the_shown_configuration_names_clients_and_hides_their_digests() {
    let dir = std::env::temp_dir().join(common::unique("callers-config"));
    std::fs::create_dir_all(&dir).expect("dir");
    let config = dir.join("stocksvr.toml");
    let digest = digest_hex(ORDERS);
    std::fs::write(
        &config,
        format!(
            "[http.auth]\nclients = [{{ name = \"orders\", token_sha256 = \"{digest}\", scopes = [\"api\", \"admin\"] }}]\n"
        ),
    )
    .expect("config");
    let (ok, stdout, stderr) = common::run(
        common::stocksvr()
            .arg("--config")
            .arg(&config)
            .arg("config"),
    );
    assert!(ok, "{stderr}");
    assert!(stdout.contains("\"orders\""), "{stdout}");
    assert!(!stdout.contains(&digest), "{stdout}");

    // `token hash` prints the digest of the token on standard input.
    let mut child = common::stocksvr()
        .args(["token", "hash"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("token hash");
    use std::io::Write;
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(format!("{ORDERS}\n").as_bytes())
        .expect("write");
    let out = child.wait_with_output().expect("runs");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), digest);
    let _ = std::fs::remove_dir_all(dir);
}
