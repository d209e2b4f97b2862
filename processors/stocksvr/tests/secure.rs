//! stocksvr with every connection secured at once, against a secure private stack
//! (`scripts/stack up --secure`, started once for this test binary and shared by its tests):
//! Kafka over SASL_SSL with SCRAM-SHA-512 and a client certificate, the registry over HTTPS
//! with basic auth (the commands) and a bearer token (the service), MariaDB with
//! `ssl-mode=VERIFY_IDENTITY` as a DML-only user, Redis over TLS as an ACL user; every secret
//! from a file; and in Kafka only the ACLs `stocksvr acls print` prints.
//!
//! - The order flow goes through: a Try, an OrderCreated produced by the order service's own
//!   principal, CONFIRMED and projected, then a refund; a dead letter is parked and replayed.
//! - A missing ACL, a wrong Kafka password, a wrong Redis password and an untrusted MySQL
//!   certificate each give one clear line naming the dependency and the cause, `/readyz`
//!   names it, the clients' own retries are counted but not logged (no log storm), nothing
//!   is dead-lettered, and with the ACL added back the waiting order goes through by itself.
//! - A `REQUIRE X509` MariaDB user and Redis connect with the client certificate
//!   configured; without it, or with one no trusted CA signed, the command fails with one
//!   line naming the dependency.
//! - No password or token of the stack appears in any output of any of it.
//!
//! Every test but the X509 one starts its own `stocksvr all`; the stack is shared, so a new
//! test should rather add its case to a service another test already runs.

#[path = "secure/deployment.rs"]
mod deployment;

use deployment::{Deployment, Service};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::Duration;
use stocksvr_test_support::{eventually, unique, unique_id, zone};

const DISH: u64 = 31;

/// A merchant of the test's own with today's bucket of `total` for [`DISH`], made with the
/// operator command (MySQL and Redis over TLS).
fn merchant(deployment: &Deployment, total: u32) -> u64 {
    let merchant = unique_id(3_000_000);
    let args = bucket_init(merchant, total);
    deployment.run(&args.iter().map(String::as_str).collect::<Vec<_>>(), &[]);
    merchant
}

/// The arguments of `stocksvr bucket init` for today's bucket of `merchant` and [`DISH`].
fn bucket_init(merchant: u64, total: u32) -> Vec<String> {
    [
        "bucket",
        "init",
        "--merchant-id",
        &merchant.to_string(),
        "--dish-id",
        &DISH.to_string(),
        "--total",
        &total.to_string(),
        "--timezone",
        zone::zone_name(),
    ]
    .map(String::from)
    .to_vec()
}

/// A self-signed P-256 certificate (`CA:TRUE`, so it can stand for a CA too) and its key,
/// made with openssl in `dir`: something no server of the stack trusts.
fn self_signed(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    std::fs::create_dir_all(dir).expect("dir");
    let (cert, key) = (
        dir.join(format!("{name}.crt")),
        dir.join(format!("{name}.key")),
    );
    let made = std::process::Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-new",
            "-nodes",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-days",
            "1",
            "-subj",
            &format!("/CN={name}"),
            "-addext",
            "basicConstraints=critical,CA:TRUE",
        ])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("openssl runs");
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    (cert, key)
}

/// A Try through the API; the reservation id.
async fn try_one(service: &Service, merchant: u64, order_id: u64, quantity: u32) -> String {
    let body = json!({"order_id": order_id, "order_item_id": order_id * 10, "merchant_id": merchant,
                      "dish_id": DISH, "quantity": quantity, "order_type": "INSTANT"});
    let (status, reply) = service.post("/v1/reservations", &body).await;
    assert_eq!(status, 201, "{reply}; log:\n{}", service.log());
    assert_eq!(reply["reservation"]["status"], "RESERVED", "{reply}");
    reply["reservation"]["reservation_id"]
        .as_str()
        .expect("id")
        .to_string()
}

/// Produces an order event as the order service does it: its own Kafka principal (which
/// may only write the order topic), through the secure listener.
fn produce_as_order_service(deployment: &Deployment, kind: &str, order_id: u64, data: Value) {
    let event = json!({
        "event_id": unique(&format!("evt-{kind}")), "event_type": kind, "schema_version": 1,
        "occurred_at": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        "producer": "order-service", "trace_id": null, "partition_key": order_id.to_string(),
        "data": data,
    });
    // `stocksvr produce` takes the event name from the file name up to its first dot.
    let file = std::env::temp_dir().join(format!("{kind}.{}.json", unique("payload")));
    std::fs::write(&file, event.to_string()).expect("payload written");
    let principal = deployment.stack.kafka_principal_env("ORDER_SERVICE");
    let said = deployment.run(&["produce", &file.display().to_string()], &principal);
    assert!(
        said.contains(&deployment.topic("order.lifecycle.v1")),
        "{said}"
    );
    let _ = std::fs::remove_file(file);
}

fn order_created(merchant: u64, order_id: u64, reservation_id: &str) -> Value {
    json!({"order_id": order_id, "merchant_id": merchant, "order_type": "INSTANT",
           "processing_time": null, "inventory_reservation_ids": [reservation_id.parse::<u64>().expect("id")]})
}

/// Parked dead letters of this deployment, as the operator command lists them.
fn parked(deployment: &Deployment) -> String {
    deployment.run(&["dlq", "list"], &[])
}

/// The id of the first dead letter parked in this deployment's database, once there is one.
async fn parked_id(deployment: &Deployment, within: Duration) -> String {
    let deadline = std::time::Instant::now() + within;
    loop {
        let listing = parked(deployment);
        // The header, then one row per dead letter with its id first.
        if let Some(row) = listing.lines().nth(1) {
            return row.split_whitespace().next().expect("an id").to_string();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "nothing parked: {listing}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// True when the dead-letter processor parked nothing in this deployment's database.
fn none_parked(deployment: &Deployment) -> bool {
    parked(deployment).trim() == "no dead letters match"
}

/// The log filter that makes the service write each later sighting of a refusal it already
/// said (`stocksvr_pipeline::causes` at debug: `still refused ... repeats=N`), for
/// [`refused_again`]. Only at debug: at warn and above a cause is said once.
fn counting_refusals() -> (String, String) {
    (
        "RUST_LOG".into(),
        "info,stocksvr_pipeline::causes=debug".into(),
    )
}

/// Waits until the service saw `cause` of `dependency` refuse it `times` more times after
/// saying it (the client retried by itself), as its debug lines count them; a panic with
/// the log after 90 s. Started with [`counting_refusals`].
async fn refused_again(service: &Service, dependency: &str, cause: &str, times: u64) {
    let marker = format!("still refused dependency={dependency} ");
    let repeats = || {
        service
            .log()
            .lines()
            .filter(|l| l.contains(&marker) && l.contains(cause))
            .filter_map(|l| l.rsplit_once("repeats=")?.1.trim().parse::<u64>().ok())
            .max()
            .unwrap_or(0)
    };
    let seen = eventually(Duration::from_secs(90), || async { repeats() >= times }).await;
    assert!(
        seen,
        "{dependency} was not refused again {times} times ({} seen): {}",
        repeats(),
        service.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_order_flow_runs_with_every_connection_secured_and_only_the_printed_acls() {
    let deployment = Deployment::new("").await;
    let merchant = merchant(&deployment, 10);
    // The registry with the service's bearer token this time (basic auth set everything up).
    let service = deployment.start_with(&deployment.registry_token_env());
    let ready = service
        .readyz_until(
            "every secured dependency answers",
            Duration::from_secs(90),
            |code, _| code == 200,
        )
        .await;
    for dep in ["kafka", "schema_registry", "mysql", "redis"] {
        assert_eq!(ready["dependencies"][dep]["ok"], true, "{ready}");
    }

    let order_id = unique_id(700_000_000);
    let reservation = try_one(&service, merchant, order_id, 2).await;
    produce_as_order_service(
        &deployment,
        "OrderCreated",
        order_id,
        order_created(merchant, order_id, &reservation),
    );
    service
        .wait_for_status(&reservation, "CONFIRMED", Duration::from_secs(60))
        .await;

    // Projected: the relay published the stock changes, the projector folded them into the
    // snapshot, which converges on Redis (2 sold).
    let stock_path = format!("/v1/stock/{merchant}/{DISH}");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut stock = Value::Null;
    while std::time::Instant::now() < deadline {
        stock = service.get(&stock_path).await.1;
        if !stock["snapshot"].is_null() && stock["snapshot"]["version"] == stock["redis"]["version"]
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    for field in ["total", "available", "reserved", "sold", "version"] {
        assert_eq!(
            stock["snapshot"][field], stock["redis"][field],
            "snapshot {field}: {stock}"
        );
    }
    assert_eq!(stock["redis"]["sold"], 2, "{stock}");

    produce_as_order_service(
        &deployment,
        "RefundRequested",
        order_id,
        json!({"order_id": order_id, "merchant_id": merchant, "refund_id": unique("rfd"),
               "items": [{"inventory_reservation_id": reservation.parse::<u64>().expect("id"), "quantity": 2}],
               "reason": null}),
    );
    service
        .wait_for_status(&reservation, "REFUNDED", Duration::from_secs(60))
        .await;

    assert!(none_parked(&deployment), "{}", parked(&deployment));

    // A cancel naming this reservation under another order: dead-lettered (written to the
    // .dlt topic through the secure listener), parked by the dead-letter processor (which
    // reads it), and replayed to its topic by the operator command.
    let other = unique_id(720_000_000);
    produce_as_order_service(
        &deployment,
        "OrderCanceled",
        other,
        json!({"order_id": other, "merchant_id": merchant,
               "inventory_reservation_ids": [reservation.parse::<u64>().expect("id")], "reason": null}),
    );
    let id = parked_id(&deployment, Duration::from_secs(60)).await;
    let replayed = deployment.run(&["dlq", "replay", &id], &[]);
    assert!(
        replayed.contains(&format!(
            "replayed dead letter {id} to {}/",
            deployment.topic("order.lifecycle.v1")
        )),
        "{replayed}"
    );
    // Every processor and the lag exporter still served: ready, and no refusal (a missing
    // ACL, a failed login) was ever met, each of which is said once, by
    // stocksvr_pipeline::causes. Readiness is polled, not taken once: its Kafka check opens
    // a SASL_SSL connection of its own each time, which on a loaded machine can outlast the
    // check's 1.5 s and answer 503 for a moment though nothing is refused.
    service
        .readyz_until(
            "the lag exporter and every processor still served",
            Duration::from_secs(60),
            |code, _| code == 200,
        )
        .await;
    let complaints = service.complaints();
    assert!(
        complaints.iter().all(
            |l| !l.contains("authorization failed") && !l.contains("stocksvr_pipeline::causes")
        ),
        "refused by a server:\n{}",
        complaints.join("\n")
    );
    deployment.assert_no_secret_in_any_output(&[]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_acl_is_named_once_waited_out_and_the_order_goes_through_once_it_is_added() {
    // Everything but the service's Read on its topics: it may write them (so it still sees
    // them in metadata) but not fetch from them.
    let withheld = "User:stocksvr --operation Read --topic";
    let deployment = Deployment::new(withheld).await;
    let merchant = merchant(&deployment, 10);
    let service = deployment.start(&[]);
    let cause = format!(
        "topic authorization failed for {}",
        deployment.topic("order.lifecycle.v1")
    );
    let ready = service
        .readyz_until(
            "the refused fetch named",
            Duration::from_secs(90),
            |code, body| {
                code == 503
                    && body["dependencies"]["kafka"]["error"]
                        .as_str()
                        .is_some_and(|e| e.contains(&cause))
            },
        )
        .await;
    assert_eq!(ready["dependencies"]["mysql"]["ok"], true, "{ready}");

    // The Try API serves; the order event waits in Kafka, unread.
    let order_id = unique_id(710_000_000);
    let reservation = try_one(&service, merchant, order_id, 1).await;
    produce_as_order_service(
        &deployment,
        "OrderCreated",
        order_id,
        order_created(merchant, order_id, &reservation),
    );
    // Still refused a few seconds on (the processors retry by themselves), still RESERVED.
    service
        .readyz_until(
            "the refusal still named",
            Duration::from_secs(30),
            |code, body| {
                code == 503
                    && body["dependencies"]["kafka"]["error"]
                        .as_str()
                        .is_some_and(|e| e.contains(&cause))
            },
        )
        .await;
    let (_, now) = service
        .get(&format!("/v1/reservations/{reservation}"))
        .await;
    assert_eq!(now["status"], "RESERVED", "{now}");

    // A retry storm would be said while the refusal lasts: what is logged after the ACL is
    // added belongs to the recovery (on a loaded CI machine a stall of the broker there costs
    // the group its session, which librdkafka logs once per consumer; that is no storm).
    let during_refusal = service.complaints();
    let printed = deployment.run(&["acls", "print", "--role", "stocksvr"], &[]);
    deployment.apply_acls(&printed);
    service
        .wait_for_status(&reservation, "CONFIRMED", Duration::from_secs(60))
        .await;
    service
        .readyz_until(
            "ready once the ACL is there",
            Duration::from_secs(60),
            |code, _| code == 200,
        )
        .await;

    let complaints = service.complaints();
    let said = format!("kafka: {cause} ");
    let told: Vec<&String> = complaints.iter().filter(|l| l.contains(&said)).collect();
    assert_eq!(told.len(), 1, "said once, not at every retry: {told:#?}");
    assert!(told[0].contains("kafka: "), "{}", told[0]);
    assert!(
        during_refusal.len() <= 12,
        "no retry storm: {} complaints while refused:\n{}",
        during_refusal.len(),
        during_refusal.join("\n")
    );
    assert!(
        service
            .log()
            .contains(&format!("kafka: no longer refused: {cause}")),
        "{}",
        service.log()
    );
    assert!(
        none_parked(&deployment),
        "nothing dead-lettered: {}",
        parked(&deployment)
    );
    deployment.assert_no_secret_in_any_output(&[]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_kafka_and_redis_passwords_are_each_named_once_without_a_retry_storm() {
    // One service refused by two servers at once (the two are independent; one start
    // instead of two keeps the binary short).
    let deployment = Deployment::new("").await;
    let dir = std::env::temp_dir().join(unique("wrong-passwords"));
    std::fs::create_dir_all(&dir).expect("dir");
    let wrong = [0, 1].map(|_| format!("not-{}", unique("the-password")));
    let (kafka_file, redis_file) = (dir.join("kafka"), dir.join("redis"));
    std::fs::write(&kafka_file, format!("{}\n", wrong[0])).expect("password file");
    std::fs::write(&redis_file, format!("{}\n", wrong[1])).expect("password file");
    let service = deployment.start(&[
        (
            "STOCKSVR__KAFKA__SASL__PASSWORD_FILE".into(),
            kafka_file.display().to_string(),
        ),
        (
            "STOCKSVR__REDIS__PASSWORD_FILE".into(),
            redis_file.display().to_string(),
        ),
        counting_refusals(),
    ]);
    let kafka_cause = "SASL authentication failed for user stocksvr";
    let redis_cause = "Password authentication failed";
    // Polled, not read once: each readiness check opens connections of its own, and on a
    // loaded machine one can time out (`redis: timed out`) before it is refused.
    let both_named = |code: u16, body: &Value| {
        code == 503
            && body["dependencies"]["kafka"]["error"] == kafka_cause
            && body["dependencies"]["redis"]["error"]
                .as_str()
                .is_some_and(|e| e.contains(redis_cause))
    };
    let ready = service
        .readyz_until(
            "both refused passwords named",
            Duration::from_secs(90),
            both_named,
        )
        .await;
    assert_eq!(ready["dependencies"]["mysql"]["ok"], true, "{ready}");
    // librdkafka retries the login at every reconnect, the Redis connection at start keeps
    // trying: seen refused again, and still said once each.
    refused_again(&service, "kafka", kafka_cause, 10).await;
    refused_again(&service, "redis", redis_cause, 1).await;
    service
        .readyz_until(
            "both refusals still named",
            Duration::from_secs(60),
            both_named,
        )
        .await;
    let complaints = service.complaints();
    for (dependency, cause) in [("kafka", kafka_cause), ("redis", redis_cause)] {
        let told = complaints
            .iter()
            .filter(|l| l.contains(&format!("{dependency}: ")) && l.contains(cause))
            .count();
        assert_eq!(
            told,
            1,
            "{dependency} said once:\n{}",
            complaints.join("\n")
        );
    }
    assert!(
        complaints.len() <= 8,
        "no retry storm: {} complaints:\n{}",
        complaints.len(),
        complaints.join("\n")
    );
    let _ = std::fs::remove_dir_all(&dir);
    deployment.assert_no_secret_in_any_output(&[&wrong[0], &wrong[1]]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untrusted_mysql_certificate_is_named_once() {
    let deployment = Deployment::new("").await;
    // A CA of its own that signed nothing the stack runs.
    let dir = std::env::temp_dir().join(unique("other-ca"));
    let (ca, _) = self_signed(&dir, "not-the-stack-ca");
    let url = deployment.db.url.replace(
        &format!(
            "ssl-ca={}",
            deployment.stack.export("STACK_TLS_DIR") + "/ca.crt"
        ),
        &format!("ssl-ca={}", ca.display()),
    );
    assert_ne!(url, deployment.db.url, "the CA was swapped");
    let service = deployment.start(&[("STOCKSVR__MYSQL__URL".into(), url), counting_refusals()]);
    let cause = "TLS: invalid peer certificate: UnknownIssuer";
    let ready = service
        .readyz_until(
            "the untrusted certificate named",
            Duration::from_secs(90),
            // Kafka answering beside it: the refusal is MySQL's alone. Polled with the rest,
            // as each readiness check opens a Kafka connection of its own, which on a loaded
            // machine can outlast its 1.5 s for a moment.
            |code, body| {
                code == 503
                    && body["dependencies"]["mysql"]["error"] == cause
                    && body["dependencies"]["kafka"]["ok"] == true
            },
        )
        .await;
    assert_eq!(ready["dependencies"]["mysql"]["ok"], false, "{ready}");
    // The worker-id lease retried twice more (0.5 s, then 1 s, 2 s apart), the relay's loops
    // beside it, and nothing said twice.
    refused_again(&service, "mysql", "no snowflake worker id leased yet", 2).await;
    let complaints = service.complaints();
    // One line per part that needs MySQL at start (the schema check, the relay's three
    // loops, the worker-id lease), none repeated.
    let mut distinct = complaints
        .iter()
        .map(|l| {
            l.split_once('Z')
                .map_or(l.as_str(), |(_, rest)| rest)
                .to_string()
        })
        .collect::<Vec<_>>();
    let all = distinct.len();
    distinct.sort();
    distinct.dedup();
    assert_eq!(
        all,
        distinct.len(),
        "nothing said twice:\n{}",
        complaints.join("\n")
    );
    assert!(all <= 8, "no retry storm:\n{}", complaints.join("\n"));
    let _ = std::fs::remove_dir_all(&dir);
    deployment.assert_no_secret_in_any_output(&[]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_require_x509_mysql_user_and_redis_take_the_configured_client_certificates() {
    let deployment = Deployment::without_kafka().await;
    let stack = deployment.stack;
    let (cert, key) = (
        stack.export("STACK_MYSQL_X509_CERT_FILE"),
        stack.export("STACK_MYSQL_X509_KEY_FILE"),
    );
    // The database's URL as the `REQUIRE X509` user, with or without its certificate.
    let x509 = deployment
        .db
        .url
        .replacen("mysql://stocksvr@", "mysql://stocksvr_x509@", 1);
    assert_ne!(x509, deployment.db.url, "the user was swapped");
    let with_cert = format!("{x509}&ssl-cert={cert}&ssl-key={key}");
    let env = |url: &str, redis_cert: &str, redis_key: &str| -> Vec<(String, String)> {
        vec![
            ("STOCKSVR__MYSQL__URL".into(), url.into()),
            (
                "STOCKSVR__MYSQL__PASSWORD_FILE".into(),
                stack.export("STACK_MYSQL_X509_PASSWORD_FILE"),
            ),
            ("STOCKSVR__REDIS__TLS__CERT_FILE".into(), redis_cert.into()),
            ("STOCKSVR__REDIS__TLS__KEY_FILE".into(), redis_key.into()),
        ]
    };
    let init = |merchant: u64, env: &[(String, String)]| {
        let args = bucket_init(merchant, 10);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        deployment.try_run(&args, env)
    };

    // Both certificates presented: the bucket is made (its WAL row and baseline in MySQL by
    // stocksvr_x509, its stock in Redis).
    let merchant = unique_id(3_100_000);
    let (ok, out, err) = init(merchant, &env(&with_cert, &cert, &key));
    assert!(ok, "{out}{err}");
    assert!(err.contains("SUCCEEDED"), "{err}");
    let rows: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM dish_stock_baseline WHERE merchant_id = ?")
            .bind(merchant)
            .fetch_one(&deployment.db.pool)
            .await
            .expect("count");
    assert_eq!(rows, 1, "the bucket's baseline");

    // Without its certificate the X509 user is refused: one line naming MySQL and the cause.
    let (ok, _, err) = init(unique_id(3_100_000), &env(&x509, &cert, &key));
    assert!(!ok, "{err}");
    let line = err
        .lines()
        .find(|l| l.starts_with("stocksvr: "))
        .unwrap_or_else(|| panic!("no error line: {err}"));
    assert!(
        line.contains("mysql:") && line.contains("Access denied for user 'stocksvr_x509'"),
        "{line}"
    );
    assert_eq!(
        line.matches("Access denied").count(),
        1,
        "said once: {line}"
    );

    // A client certificate no CA of the stack signed: Redis refuses the handshake, named.
    let (stranger, stranger_key) =
        self_signed(&std::env::temp_dir().join(unique("stranger")), "stranger");
    let (ok, _, err) = init(
        unique_id(3_100_000),
        &env(
            &with_cert,
            &stranger.display().to_string(),
            &stranger_key.display().to_string(),
        ),
    );
    assert!(!ok, "{err}");
    let line = err
        .lines()
        .find(|l| l.starts_with("stocksvr: "))
        .unwrap_or_else(|| panic!("no error line: {err}"));
    assert!(
        line.contains("rediss://") && line.contains("redis: ") && line.contains("UnknownCA"),
        "{line}"
    );
    assert_eq!(line.matches("UnknownCA").count(), 1, "said once: {line}");
    let _ = std::fs::remove_dir_all(stranger.parent().expect("dir"));
    deployment.assert_no_secret_in_outputs(&[], 3);
}
