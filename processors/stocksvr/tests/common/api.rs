//! A shop (fresh database, merchant, today's bucket) and small HTTP helpers for API tests.

use super::server::Server;
use serde_json::Value;
use std::time::Duration;
use stocksvr_core::bucket::BucketKey;
use stocksvr_store::baselines::Baseline;
use stocksvr_test_support::zone;

pub struct Shop {
    /// The test's database, topics and groups.
    pub env: super::TestEnv,
    pub db_url: String,
    pub merchant_id: u64,
    pub dish_id: u64,
}

impl Shop {
    /// `stocksvr all` in this shop's environment, plus `extra` variables.
    pub fn server(&self, extra: &[(&str, &str)]) -> Server {
        self.env.server(extra)
    }
}

/// A test environment (database, topics, groups) with a merchant (in the tests' noon zone,
/// see `stocksvr_test_support::zone`) and today's bucket of `total` for one dish.
pub async fn shop(total: i64) -> Shop {
    shop_in(super::TestEnv::new().await, total).await
}

/// [`shop`] in `env` (with a private server, say); migrates `env`'s database first.
pub async fn shop_in(env: super::TestEnv, total: i64) -> Shop {
    let db_url = env.mysql_url();
    let pool = env.pool();
    stocksvr_store::migrate(&pool).await.expect("migrate");
    // Redis keys are per merchant and shared by every test database: the merchant id must
    // be unique per test, not just per microsecond (parallel tests start together).
    let merchant_id = stocksvr_test_support::unique_id(2_000_000);
    let dish_id = 31;
    stocksvr_store::baselines::set_merchant_timezone(&pool, merchant_id, zone::zone_name())
        .await
        .expect("tz");
    let today = zone::today();
    stocksvr_store::baselines::ensure_baseline(
        &pool,
        &Baseline {
            stock_bucket_id: BucketKey::new(merchant_id, dish_id, today).stock_bucket_id(),
            merchant_id,
            dish_id,
            stock_date: today,
            timezone: zone::zone_name().into(),
            total_stock: total,
            baseline_version: 1,
            stock_status: 1,
            bucket_status: 10,
            lost_at: None,
        },
    )
    .await
    .expect("baseline");
    Shop {
        env,
        db_url,
        merchant_id,
        dish_id,
    }
}

pub async fn post(server: &Server, path: &str, body: &str) -> (u16, Value) {
    let resp = reqwest::Client::new()
        .post(format!("{}{path}", server.base))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .expect("request");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// What the server's `/metrics` says now.
pub async fn metrics_text(server: &Server) -> String {
    reqwest::get(format!("{}/metrics", server.base))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics text")
}

/// The sum of the series in `metrics` (a `/metrics` text) whose line starts with `prefix`
/// (a name, or a name and labels) and contains `matching`; 0 when there is none.
pub fn series_sum(metrics: &str, prefix: &str, matching: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(prefix) && l.contains(matching))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

pub async fn get(server: &Server, path: &str) -> (u16, Value) {
    let resp = reqwest::get(format!("{}{path}", server.base))
        .await
        .expect("request");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// Polls a Try until the service is installed (it comes up right after Redis answers).
pub async fn wait_for_api(server: &Server) {
    wait_for_api_as(server, None).await
}

/// [`wait_for_api`] for a service with caller authentication, as the client of `token`.
pub async fn wait_for_api_as(server: &Server, token: Option<&str>) {
    let client = reqwest::Client::new();
    let url = format!("{}/v1/reservations/1", server.base);
    let up = stocksvr_test_support::eventually(Duration::from_secs(60), || async {
        let mut req = client.get(&url);
        if let Some(token) = token {
            req = req.bearer_auth(token);
        }
        // Connection refused until the listener is bound; 503 until the service is installed.
        let Ok(resp) = req.send().await else {
            return false;
        };
        if resp.status().as_u16() != 404 {
            return false;
        }
        let body: Value = resp.json().await.unwrap_or(Value::Null);
        assert_eq!(body["error"], "reservation_not_found");
        true
    })
    .await;
    assert!(up, "the Try API never came up; log:\n{}", server.log());
}

/// An admin request with the bearer token.
pub async fn admin_post(server: &Server, token: &str, path: &str, body: Value) -> (u16, Value) {
    let resp = reqwest::Client::new()
        .post(format!("{}{path}", server.base))
        .bearer_auth(token)
        .json(&body)
        .send()
        .await
        .expect("request");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}
