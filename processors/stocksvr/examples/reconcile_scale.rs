//! What the reconciler costs per bucket and how long a full rebuild takes, over 10,000
//! buckets (issue 10). A measurement, not a test: `scripts/bench-reconcile` builds it with
//! the `stocksvr` binary it starts and prints the figures (its lines starting with `scale:`).
//! `STOCKSVR_SCALE_BUCKETS` changes the count. Cargo builds it with the tests, so it keeps
//! compiling; it shares their helpers (`tests/common`).

#[path = "../tests/common/mod.rs"]
mod common;

use common::api::{admin_post, shop, wait_for_api, Shop};
use common::flow::{quiescent, tail};
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn buckets() -> u64 {
    std::env::var("STOCKSVR_SCALE_BUCKETS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000)
}

/// Runs `jobs` with at most `parallel` at once.
async fn bounded<F, Fut>(n: u64, parallel: usize, job: F)
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let job = Arc::new(job);
    let mut set = tokio::task::JoinSet::new();
    for i in 0..n {
        while set.len() >= parallel {
            set.join_next().await.expect("a task").expect("task");
        }
        let job = job.clone();
        set.spawn(async move { job(i).await });
    }
    while let Some(done) = set.join_next().await {
        done.expect("task");
    }
}

fn timed(shop: &Shop, args: &[&str]) -> (Duration, i32, String, String) {
    let started = Instant::now();
    let out = common::output_within(shop.env.stocksvr().args(args), Duration::from_secs(3600));
    (
        started.elapsed(),
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() {
    let n = buckets();
    let shop = Arc::new(shop(1).await);
    let server = Arc::new(shop.server(&[
        ("STOCKSVR__RESERVATION__WORKER_ID", "41"),
        ("STOCKSVR__HTTP__ADMIN_TOKEN", "scale"),
        ("STOCKSVR__MYSQL__MAX_CONNECTIONS", "32"),
        // The scheduled passes would run beside the measured ones.
        ("STOCKSVR__RECONCILE__INTERVAL_SECS", "86400"),
    ]));
    wait_for_api(&server).await;
    let merchant = shop.merchant_id;
    let started = Instant::now();
    {
        let server = server.clone();
        bounded(n, 16, move |i| {
            let server = server.clone();
            async move {
                let (status, body) = admin_post(
                    &server,
                    "scale",
                    "/admin/buckets",
                    json!({"merchant_id": merchant, "dish_id": 1000 + i, "total": 50}),
                )
                .await;
                assert!(status == 200 || status == 202, "{status} {body}");
            }
        })
        .await;
    }
    eprintln!(
        "scale: {n} buckets created in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let started = Instant::now();
    {
        let server = server.clone();
        bounded(n, 32, move |i| {
            let server = server.clone();
            async move {
                let order = 7_000_000 + merchant % 100_000 * 100_000 + i;
                let body = json!({"order_id": order, "order_item_id": order * 10 + 1, "merchant_id": merchant,
                                  "dish_id": 1000 + i, "quantity": 1 + i % 3, "order_type": "INSTANT"});
                let (status, reply) =
                    common::api::post(&server, "/v1/reservations", &body.to_string()).await;
                assert_eq!(status, 201, "{reply}");
            }
        })
        .await;
    }
    eprintln!(
        "scale: {n} Trys in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    quiescent(&server, &shop, Duration::from_secs(900)).await;

    // The reconciler over every bucket: one pass (no differences, so no second pass).
    let (took, code, out, err) = timed(&shop, &["reconcile"]);
    assert_eq!(code, 0, "{err}\n{}", tail(&out, 5));
    let per_bucket = took.as_secs_f64() * 1000.0 / n as f64;
    eprintln!(
        "scale: reconcile of {n} buckets: {:.1} s, {per_bucket:.3} ms per bucket (the command, including connecting)",
        took.as_secs_f64()
    );

    // Redis loses every bucket of the merchant: its keys deleted.
    let url = stocksvr_test_support::infra()
        .redis
        .url
        .expose()
        .to_string();
    let mut redis = stocksvr_store::connect_redis(
        &stocksvr_store::RedisTarget::Standalone { url },
        Duration::from_secs(30),
    )
    .await
    .expect("redis");
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("inv:{{{merchant}:*"))
        .query_async(&mut redis)
        .await
        .expect("keys");
    for chunk in keys.chunks(1000) {
        let _: i64 = redis::cmd("DEL")
            .arg(chunk)
            .query_async(&mut redis)
            .await
            .expect("del");
    }
    eprintln!("scale: deleted {} Redis keys", keys.len());
    let (took, code, out, err) = timed(
        &shop,
        &[
            "bucket",
            "rebuild",
            "--all",
            "--execute",
            "--parallel",
            "16",
        ],
    );
    assert_eq!(code, 0, "{err}\n{}", tail(&out, 5));
    let reopened = out
        .lines()
        .filter(|l| l.contains("rebuilt\treopened"))
        .count() as u64;
    assert_eq!(reopened, n, "{err}");
    eprintln!(
        "scale: rebuild of {n} lost buckets: {:.1} s ({:.2} ms per bucket), every one reopened",
        took.as_secs_f64(),
        took.as_secs_f64() * 1000.0 / n as f64
    );
    let (_, code, out, err) = timed(&shop, &["reconcile"]);
    assert_eq!(code, 0, "clean after the rebuild: {err}\n{}", tail(&out, 5));
    let server = Arc::try_unwrap(server).unwrap_or_else(|_| panic!("shared"));
    let (status, log) = server.terminate();
    assert!(status.success(), "{}", tail(&log, 40));
}
