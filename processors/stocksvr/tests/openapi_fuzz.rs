//! schemathesis against `/openapi.json` of a running `stocksvr all`: every documented
//! operation with generated valid and invalid input (examples, coverage, fuzzing) and the
//! stateful links (a Try's reservation id feeding the reads), checking that no response is
//! a server error and that every status, content type, header and body conforms to the
//! document (`--checks all`).
//!
//! The server has a Redis of its own (the fuzzer writes buckets and reservations for the
//! ids the document's examples use, which must not meet another test's keys), the test's
//! database, topic namespace and consumer groups, a client token (caller authentication on,
//! so schemathesis also checks that a request without it is refused as documented), and
//! today's bucket of the examples' dish, so positive cases reach the success paths.
//!
//! schemathesis comes from `tests/api/venv.sh` (a pinned, git-ignored environment). The run
//! is seeded (`STOCKSVR_API_FUZZ_SEED`, default 1) and bounded
//! (`STOCKSVR_API_FUZZ_EXAMPLES` test cases per operation and phase, default 25);
//! a failure fails this test with schemathesis' report, which names the operation, the
//! check and a curl line reproducing the request.

mod common;

use common::api::wait_for_api_as;
use common::TestEnv;
use std::process::Command;
use std::time::{Duration, Instant};
use stocksvr_core::bucket::BucketKey;
use stocksvr_store::baselines::Baseline;
use stocksvr_test_support::{zone, PrivateStack};

const TOKEN: &str = "fuzz-admin-token";
/// The merchant and dish of the document's request examples (`processors/api`).
const MERCHANT: u64 = stocksvr_api::EXAMPLE_MERCHANT_ID;
const DISH: u64 = stocksvr_api::EXAMPLE_DISH_ID;

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_conforms_to_its_openapi_document_under_fuzzing() {
    // The environment first: installing it is the slow part of a first run, and it needs no
    // server.
    let venv = common::output_within(
        &mut Command::new(common::repo_root().join("tests/api/venv.sh")),
        Duration::from_secs(600),
    );
    assert!(
        venv.status.success(),
        "tests/api/venv.sh failed:\n{}",
        String::from_utf8_lossy(&venv.stderr)
    );
    let schemathesis = String::from_utf8_lossy(&venv.stdout).trim().to_string();

    let redis = PrivateStack::start(&["redis"]);
    let mut env = TestEnv::new().await;
    env.overrides
        .push(("STOCKSVR__REDIS__URL", redis.var("STOCKSVR__REDIS__URL")));
    let pool = env.pool();
    stocksvr_store::baselines::set_merchant_timezone(&pool, MERCHANT, zone::zone_name())
        .await
        .expect("time zone");
    let today = zone::today();
    stocksvr_store::baselines::ensure_baseline(
        &pool,
        &Baseline {
            stock_bucket_id: BucketKey::new(MERCHANT, DISH, today).stock_bucket_id(),
            merchant_id: MERCHANT,
            dish_id: DISH,
            stock_date: today,
            timezone: zone::zone_name().into(),
            // Enough that no generated Try runs the bucket dry.
            total_stock: 10_000_000,
            baseline_version: 1,
            stock_status: 1,
            bucket_status: 10,
            lost_at: None,
        },
    )
    .await
    .expect("baseline");
    // The token is a client's with the api scope: schemathesis sends it with every request
    // (and checks that a request without it is refused with the documented 401).
    let clients = std::env::temp_dir().join(common::unique("fuzz-clients"));
    std::fs::write(
        &clients,
        format!("fuzz {} api,admin\n", stocksvr_api::auth::digest_hex(TOKEN)),
    )
    .expect("clients file");
    let server = env.server(&[(
        "STOCKSVR__HTTP__AUTH__CLIENTS_FILE",
        clients.to_str().expect("utf-8"),
    )]);
    wait_for_api_as(&server, Some(TOKEN)).await;

    let config = common::repo_root().join("tests/api/schemathesis.toml");
    let config_text = std::fs::read_to_string(&config).expect("schemathesis.toml");
    for (what, id) in [("shop_merchant", MERCHANT), ("shop_dish", DISH)] {
        assert!(
            config_text.contains(&format!("[dictionaries.{what}]\nvalues = [{id}]")),
            "{} must bias {what} towards {id}",
            config.display()
        );
    }
    let seed = env_or("STOCKSVR_API_FUZZ_SEED", "1");
    let examples = env_or("STOCKSVR_API_FUZZ_EXAMPLES", "25");
    let report = std::env::temp_dir().join(common::unique("schemathesis-report"));
    let started = Instant::now();
    let out = common::output_within(
        Command::new(&schemathesis)
            .arg("--config-file")
            .arg(&config)
            .arg("run")
            .arg(format!("{}/openapi.json", server.base))
            .args(["--checks", "all"])
            .args(["--phases", "examples,coverage,fuzzing,stateful"])
            .args(["--seed", &seed, "--max-examples", &examples])
            .args(["--workers", "1", "--request-timeout", "10"])
            .args(["--generation-database", "none"])
            .args(["-H", &format!("Authorization: Bearer {TOKEN}")])
            .arg("--report-dir")
            .arg(&report)
            .args(["--report", "junit"])
            .args(["--no-color", "--output-truncate", "false"])
            // hypothesis writes its own files where it runs: not into the checkout.
            .current_dir(std::env::temp_dir()),
        Duration::from_secs(300),
    );
    let took = started.elapsed();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("schemathesis (seed {seed}, {examples} examples) took {took:.1?}:\n{stdout}");
    let log = server.log();
    assert!(
        out.status.success(),
        "schemathesis found problems (seed {seed}, report in {}):\n{stdout}\n{stderr}\nserver log tail:\n{}",
        report.display(),
        tail(&log, 40)
    );
    assert!(!log.contains("panicked"), "the server panicked:\n{log}");
    // Every operation of the document was tested, and the stateful phase followed links.
    assert!(
        stdout.contains("Selected: 5/5") && stdout.contains("Tested: 5"),
        "not every operation was tested:\n{stdout}"
    );
    let links_covered = stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix("API Links:"))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse::<u32>().ok())
        .unwrap_or(0);
    assert!(
        links_covered >= 3,
        "the stateful phase followed {links_covered} links:\n{stdout}"
    );
    let (status, log) = server.terminate();
    assert!(status.success(), "{log}");
    let _ = std::fs::remove_file(&clients);
    // A failed run keeps its JUnit report (the panic above names the directory).
    if std::env::var("STOCKSVR_TEST_KEEP").as_deref() != Ok("1") {
        let _ = std::fs::remove_dir_all(&report);
    }
}

fn tail(log: &str, lines: usize) -> String {
    let all: Vec<&str> = log.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
