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
mod outbox;
mod private_stack;
mod process;
mod secure_stack;
mod stack;
pub mod zone;

pub use db::{session_status, TestDb};
pub use ids::{unique, unique_id};
pub use kafka::{read_at, records_of, TestNamespace, TestTopic};
pub use outbox::{outbox_rows, OutboxRow};
pub use private_stack::PrivateStack;
pub use process::{output_within, ChildGuard};
pub use secure_stack::{secure_stack, SecureDb};
pub use stack::{infra, repo_root};

use std::future::Future;
use std::time::Duration;

/// How often the waits below look again: often enough that a test wakes within moments of
/// its condition, seldom enough not to load the servers it polls.
const POLL: Duration = Duration::from_millis(50);

/// Polls `check` every 50 ms until it returns true or `within` has passed. True if it held:
/// callers assert on the result with their own message, instead of sleeping and hoping.
pub async fn eventually<F, Fut>(within: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    eventually_some(within, || {
        let held = check();
        async move { held.await.then_some(()) }
    })
    .await
    .is_some()
}

/// Polls `check` every 50 ms until it returns `Some`, and returns that value; `None` once
/// `within` has passed. For a wait whose result the test goes on with.
pub async fn eventually_some<T, F, Fut>(within: Duration, mut check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    eventually_ok(within, || {
        let found = check();
        async move { found.await.ok_or(()) }
    })
    .await
    .ok()
}

/// Polls `check` every 50 ms until it returns `Ok`, and returns that; once `within` has passed,
/// the last `Err`: what was seen instead, for the caller's message (or its fallback).
pub async fn eventually_ok<T, E, F, Fut>(within: Duration, mut check: F) -> Result<T, E>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match check().await {
            Ok(found) => return Ok(found),
            Err(seen) if tokio::time::Instant::now() >= deadline => return Err(seen),
            Err(_) => tokio::time::sleep(POLL).await,
        }
    }
}

/// Like [`eventually_ok`], but a wait that ends without its condition panics, naming `what`
/// it waited for, how long, and the last thing seen instead (the `Err`).
pub async fn wait_for<T, E, F, Fut>(what: &str, within: Duration, check: F) -> T
where
    E: std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    match eventually_ok(within, check).await {
        Ok(found) => found,
        Err(seen) => panic!("waited {within:?} for {what}; last seen: {seen}"),
    }
}

/// [`eventually_some`] for code that runs outside a runtime or must not yield (a child
/// process's guard, a synchronous helper): blocks the thread between looks.
pub fn eventually_some_blocking<T>(
    within: Duration,
    mut check: impl FnMut() -> Option<T>,
) -> Option<T> {
    let deadline = std::time::Instant::now() + within;
    loop {
        if let Some(found) = check() {
            return Some(found);
        }
        if std::time::Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(POLL);
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[tokio::test]
    async fn eventually_some_returns_the_first_value_found() {
        let looks = AtomicU32::new(0);
        let found = eventually_some(Duration::from_secs(5), || async {
            let n = looks.fetch_add(1, Ordering::Relaxed) + 1;
            (n >= 3).then_some(n)
        })
        .await;
        assert_eq!(found, Some(3));
    }

    #[tokio::test]
    async fn eventually_ok_gives_the_last_thing_seen_when_the_time_is_up() {
        let looks = AtomicU32::new(0);
        let started = std::time::Instant::now();
        let seen: Result<(), u32> = eventually_ok(Duration::from_millis(200), || async {
            Err(looks.fetch_add(1, Ordering::Relaxed) + 1)
        })
        .await;
        let last = seen.expect_err("never Ok");
        assert!(last >= 2, "looked again until the time was up: {last}");
        assert_eq!(last, looks.load(Ordering::Relaxed), "the last look's");
        assert!(started.elapsed() >= Duration::from_millis(200));
    }

    #[tokio::test]
    async fn eventually_looks_once_more_at_the_deadline_and_says_false() {
        assert!(eventually(Duration::ZERO, || async { true }).await);
        assert!(!eventually(Duration::from_millis(100), || async { false }).await);
    }

    #[tokio::test]
    #[should_panic(expected = "for the answer; last seen: 41")]
    async fn wait_for_names_what_it_waited_for() {
        wait_for("the answer", Duration::from_millis(100), || async {
            Err::<(), _>(41)
        })
        .await;
    }

    #[test]
    fn eventually_some_blocking_waits_on_the_thread() {
        let started = std::time::Instant::now();
        let found = eventually_some_blocking(Duration::from_secs(5), || {
            (started.elapsed() >= Duration::from_millis(120)).then_some("done")
        });
        assert_eq!(found, Some("done"));
        assert_eq!(
            eventually_some_blocking(Duration::from_millis(60), || None::<()>),
            None
        );
    }
}
