//! `migrate`, `topics apply` and `schemas register` against the real servers: each creates
//! what is missing the first time and changes nothing the second time.

mod common;

use common::{run, stocksvr, unique};
use stocksvr_pipeline::registry::{RegisterOutcome, RegistryClient, RegistryError, SubjectState};

const TABLES: &[&str] = &[
    "dish_stock_baseline",
    "dish_stock_snapshot",
    "inventory_reservation",
    "inventory_ledger",
    "inventory_operation_wal",
    "inventory_outbox",
    "inventory_outbox_relay",
    "inventory_consumer_inbox",
    "merchant_settings",
    "inventory_dead_letter",
    "snowflake_worker_lease",
    "inventory_refund",
];

#[tokio::test]
async fn migrate_creates_every_table_then_is_a_no_op() {
    let db = common::TestDb::empty().await;
    let url = db.url.clone();
    let total = stocksvr_store::MIGRATOR.iter().count();
    let (ok, first, err) = run(stocksvr().arg("migrate").env("STOCKSVR__MYSQL__URL", &url));
    assert!(ok, "first migrate failed: {err}");
    assert!(
        first.contains(&format!("{total} applied, 0 already up to date")),
        "{first}"
    );
    let (ok, second, err) = run(stocksvr().arg("migrate").env("STOCKSVR__MYSQL__URL", &url));
    assert!(ok, "second migrate failed: {err}");
    assert!(
        second.contains(&format!("0 applied, {total} already up to date")),
        "{second}"
    );

    let pool =
        stocksvr_store::mysql_pool(&url, 1, std::time::Duration::from_secs(5)).expect("pool");
    for table in TABLES {
        let found: Option<(String,)> = sqlx::query_as(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = ?",
        )
        .bind(table)
        .fetch_optional(&pool)
        .await
        .expect("query");
        assert!(found.is_some(), "table {table} missing");
    }
    // The keys the design relies on for idempotency exist as unique indexes.
    for (table, index) in [
        ("inventory_reservation", "uk_order_item_dish"),
        ("inventory_ledger", "uk_operation_id"),
        ("inventory_operation_wal", "uk_operation_id"),
        ("inventory_outbox", "uk_event_id"),
        ("dish_stock_baseline", "uk_merchant_dish_date"),
    ] {
        let (non_unique,): (Option<i64>,) = sqlx::query_as(
            "SELECT MIN(non_unique) FROM information_schema.statistics WHERE table_schema = DATABASE() AND table_name = ? AND index_name = ?",
        )
        .bind(table)
        .bind(index)
        .fetch_one(&pool)
        .await
        .expect("query");
        assert_eq!(non_unique, Some(0), "{table}.{index} must be unique");
    }
    // The inbox makes a redelivered event a no-op: the second INSERT IGNORE affects nothing.
    for expected in [1, 0] {
        let r = sqlx::query("INSERT IGNORE INTO inventory_consumer_inbox (event_id, consumer_group, consumed_at) VALUES (?, ?, NOW(3))")
            .bind("evt-1")
            .bind("g")
            .execute(&pool)
            .await
            .expect("insert");
        assert_eq!(r.rows_affected(), expected);
    }
}

#[tokio::test]
async fn topics_apply_creates_grows_and_then_changes_nothing() {
    let dir = std::env::temp_dir().join(unique("topics"));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let file = dir.join("topics.yaml");
    let name = unique("it.topic").replace('_', "-");
    // Created by the binary below, deleted when the test ends.
    let _cleanup = [
        common::TestTopic::adopt(&name),
        common::TestTopic::adopt(&format!("{name}.dlt")),
    ];
    let write = |partitions: u32, retention: &str| {
        std::fs::write(
            &file,
            format!(
                "environment: local\nenvironments:\n  local:\n    replication_factor: 1\n    min_insync_replicas: 1\ndefaults:\n  cleanup.policy: delete\ndead_letter:\n  suffix: .dlt\ntopics:\n  - name: {name}\n    partitions: {partitions}\n    dead_letter: true\n    config:\n      retention.ms: \"{retention}\"\n"
            ),
        )
        .expect("write topics file");
    };
    let apply = || {
        run(stocksvr()
            .args(["topics", "apply"])
            .env("STOCKSVR__KAFKA__TOPICS_FILE", &file))
    };
    let describe = || {
        run(stocksvr()
            .args(["topics", "describe"])
            .env("STOCKSVR__KAFKA__TOPICS_FILE", &file))
    };

    write(2, "3600000");
    let (ok, out, _) = describe();
    assert!(
        !ok && out.contains("missing"),
        "describe must report missing topics: {out}"
    );
    let (ok, out, err) = apply();
    assert!(ok, "{err}");
    assert!(out.contains(&format!("changed: create {name} ")), "{out}");
    assert!(
        out.contains(&format!("changed: create {name}.dlt ")),
        "{out}"
    );
    let (ok, out, err) = apply();
    assert!(ok, "{err}");
    assert!(
        out.contains("0 changes made"),
        "second apply must change nothing: {out}"
    );
    let (ok, out, _) = describe();
    assert!(ok, "describe after apply must find no drift: {out}");

    // Raising partitions and changing a config are applied; the DLT follows its source.
    write(4, "7200000");
    let (ok, out, err) = apply();
    assert!(ok, "{err}");
    assert!(
        out.contains(&format!("raise partitions of {name}: 2 -> 4")),
        "{out}"
    );
    assert!(
        out.contains(&format!("raise partitions of {name}.dlt: 2 -> 4")),
        "{out}"
    );
    assert!(
        out.contains(&format!("set {name} retention.ms: 3600000 -> 7200000")),
        "{out}"
    );

    // Shrinking is never attempted; it is reported as drift.
    write(3, "7200000");
    let (ok, out, _) = apply();
    assert!(ok);
    assert!(
        out.contains("drift (not fixed)") && out.contains("cannot shrink"),
        "{out}"
    );
}

#[tokio::test]
async fn the_project_topics_apply_twice_without_change() {
    // In a namespace of this test's own, deleted when it ends.
    let ns = common::TestNamespace::unapplied();
    let apply = || run(stocksvr().args(["topics", "apply"]).envs(ns.env()));
    let (ok, out, err) = apply();
    assert!(ok, "{err}");
    assert!(
        out.contains(&format!(
            "changed: create {}.order.lifecycle.v1.dlt ",
            ns.name
        )),
        "{out}"
    );
    let (ok, out, err) = apply();
    assert!(ok, "{err}");
    assert!(
        out.contains("7 topics declared, 0 changes made, 0 drift"),
        "{out}"
    );
}

#[tokio::test]
async fn schemas_register_twice_without_change() {
    let (ok, _, err) = run(stocksvr().args(["schemas", "register"]));
    assert!(ok, "{err}");
    let (ok, out, err) = run(stocksvr().args(["schemas", "register"]));
    assert!(ok, "{err}");
    assert!(out.contains("19 subjects, 0 new versions"), "{out}");
    assert!(!out.contains("compatibility set"), "{out}");
    let (ok, out, err) = run(stocksvr().args(["schemas", "check"]));
    assert!(ok, "{out}{err}");
    assert!(out.contains("0 incompatible"), "{out}");
}

fn record(fields: &str) -> String {
    format!(
        r#"{{"type":"record","name":"Probe","namespace":"io.stocksvr.test","fields":[{fields}]}}"#
    )
}

#[tokio::test]
async fn an_incompatible_change_is_reported_before_it_is_registered() {
    let client = RegistryClient::new(&common::settings().registry).expect("client");
    let subject = unique("it.compat-io.stocksvr.test.Probe");
    let v1 = record(r#"{"name":"a","type":"long"}"#);
    assert_eq!(
        client.check(&subject, &v1).await.expect("check"),
        SubjectState::New
    );
    let id = match client.register(&subject, &v1).await.expect("register v1") {
        RegisterOutcome::Registered { id } => id,
        other => panic!("expected a new registration, got {other:?}"),
    };
    client
        .set_compatibility(&subject, "BACKWARD")
        .await
        .expect("set level");
    assert_eq!(
        client.register(&subject, &v1).await.expect("again"),
        RegisterOutcome::Unchanged { id }
    );

    // A new required field breaks BACKWARD: old data has no value for it.
    let breaking = record(r#"{"name":"a","type":"long"},{"name":"b","type":"string"}"#);
    let state = client.check(&subject, &breaking).await.expect("check");
    assert!(
        matches!(state, SubjectState::Incompatible { .. }),
        "{state:?}"
    );
    let refused = client.register(&subject, &breaking).await;
    assert!(
        matches!(refused, Err(RegistryError::Incompatible { .. })),
        "{refused:?}"
    );

    // The same field with a default is a compatible evolution.
    let evolving =
        record(r#"{"name":"a","type":"long"},{"name":"b","type":"string","default":""}"#);
    let state = client.check(&subject, &evolving).await.expect("check");
    assert!(
        matches!(state, SubjectState::Compatible { latest_version: 1 }),
        "{state:?}"
    );
}

/// A registry that has just started can leave the first requests unanswered past the
/// client's timeout (seen once right after `scripts/stack up`). Here a hop in front of the
/// real registry holds its first connection open without an answer and forwards every later
/// one: `schemas register` tries that subject again and finishes.
#[tokio::test]
async fn schemas_register_tries_again_when_the_registry_does_not_answer() {
    use tokio::net::{TcpListener, TcpStream};
    let registry = common::settings().registry.url;
    // "127.0.0.1:8081" of "http://127.0.0.1:8081/apis/ccompat/v7".
    let target = registry
        .trim_start_matches("http://")
        .split('/')
        .next()
        .expect("host:port")
        .to_string();
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let hop = listener.local_addr().expect("addr");
    let url = registry.replacen(&target, &hop.to_string(), 1);
    let forward = tokio::spawn(async move {
        let mut held = Vec::new();
        loop {
            let Ok((mut client, _)) = listener.accept().await else {
                return;
            };
            if held.is_empty() {
                held.push(client); // stalled: never answered, closed when the test ends
                continue;
            }
            let target = target.clone();
            tokio::spawn(async move {
                if let Ok(mut server) = TcpStream::connect(&target).await {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                }
            });
        }
    });
    let (ok, out, err) = tokio::task::spawn_blocking(move || {
        run(stocksvr()
            .args(["schemas", "register"])
            .env("STOCKSVR__REGISTRY__URL", url)
            .env("STOCKSVR__REGISTRY__TIMEOUT_MS", "1000")
            // Subjects of its own: the other tests register the default ones meanwhile.
            .env("STOCKSVR__KAFKA__TOPIC_NAMESPACE", unique("reg-retry")))
    })
    .await
    .expect("joined");
    forward.abort();
    assert!(ok, "{out}{err}");
    assert!(err.contains("trying again in 1 s"), "{err}");
    assert!(out.contains("19 subjects"), "{out}");
}

/// Two instances deploying at once both run `schemas register` on the same new subjects: each
/// may find a subject unpinned and then lose the race to pin it (Apicurio answers 409, the
/// rule exists). Both must finish, with every subject registered once and pinned BACKWARD.
#[tokio::test]
async fn concurrent_schemas_register_runs_all_succeed() {
    let namespace = unique("reg-race");
    let runs: Vec<_> = (0..4)
        .map(|_| {
            let namespace = namespace.clone();
            std::thread::spawn(move || {
                run(stocksvr()
                    .args(["schemas", "register"])
                    .env("STOCKSVR__KAFKA__TOPIC_NAMESPACE", namespace))
            })
        })
        .collect();
    for r in runs {
        let (ok, out, err) = r.join().expect("joined");
        assert!(ok, "{out}{err}");
    }
    let (ok, out, err) = run(stocksvr()
        .args(["schemas", "register"])
        .env("STOCKSVR__KAFKA__TOPIC_NAMESPACE", &namespace));
    assert!(ok, "{err}");
    assert!(out.contains("19 subjects, 0 new versions"), "{out}");
    assert!(!out.contains("compatibility set"), "{out}");
}
