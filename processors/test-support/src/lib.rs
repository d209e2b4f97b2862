//! What the integration tests of every crate share (a dev-dependency only).
//!
//! Tests talk to the real local stack (`scripts/stack up`: Kafka, the schema registry, MariaDB
//! and Redis on 127.0.0.1) and isolate themselves: each gets its own database, its own topic
//! namespace and its own consumer groups, and everything it creates is released by a guard
//! when the test ends, pass or fail (a panicking test unwinds through the guards' `Drop`).
//! Set `STOCKSVR_TEST_KEEP=1` to keep databases and topics for a post-mortem. Test merchants
//! live in [`zone`]'s time zone, where it is about noon when the tests start, so no test
//! crosses their midnight.

mod db;
mod ids;
mod kafka;
mod private_stack;
mod process;
mod secure_stack;
mod stack;
pub mod zone;

pub use db::{session_status, TestDb};
pub use ids::{unique, unique_id};
pub use kafka::{read_at, records_of, TestNamespace, TestTopic};
pub use private_stack::PrivateStack;
pub use process::{output_within, ChildGuard};
pub use secure_stack::{secure_stack, SecureDb};
pub use stack::{infra, repo_root};

use std::future::Future;
use std::time::Duration;

/// Polls `check` every 50 ms until it returns true or `within` has passed. True if it held:
/// callers assert on the result with their own message, instead of sleeping and hoping.
pub async fn eventually<F, Fut>(within: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if check().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The payload of `schemas/examples/<stem>.json`.
pub fn example(stem: &str) -> serde_json::Value {
    let path = repo_root().join(format!("schemas/examples/{stem}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every example payload: (file stem, record name before the first dot, payload).
pub fn examples() -> Vec<(String, String, serde_json::Value)> {
    let dir = repo_root().join("schemas/examples");
    let mut all: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    all.sort();
    all.into_iter()
        .map(|p| {
            let stem = p
                .file_stem()
                .and_then(|s| s.to_str())
                .unwrap_or_default()
                .to_string();
            let record = stem.split('.').next().unwrap_or_default().to_string();
            (stem.clone(), record, example(&stem))
        })
        .collect()
}

/// Runs `cleanup` to completion from a `Drop`: on a thread of its own with a runtime of its
/// own, because a guard may be dropped inside a test's runtime (where blocking on it would
/// panic) or outside any runtime.
pub(crate) fn block_on_cleanup<F>(what: String, cleanup: F)
where
    F: Future<Output = Result<(), String>> + Send + 'static,
{
    if std::env::var("STOCKSVR_TEST_KEEP").is_ok_and(|v| v == "1") {
        eprintln!("STOCKSVR_TEST_KEEP=1: keeping {what}");
        return;
    }
    let joined = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        runtime.block_on(async {
            tokio::time::timeout(Duration::from_secs(30), cleanup)
                .await
                .map_err(|_| "timed out after 30 s".to_string())?
        })
    })
    .join();
    match joined {
        Ok(Ok(())) => {}
        Ok(Err(e)) => eprintln!("test cleanup of {what} failed: {e}"),
        Err(_) => eprintln!("test cleanup of {what} panicked"),
    }
}
