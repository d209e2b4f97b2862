//! Why a dependency refuses this process right now (a password it does not accept, a
//! certificate it does not trust, a missing ACL), said once per change and kept for
//! `/readyz`.
//!
//! Client libraries retry such a refusal by themselves, librdkafka at every reconnect:
//! logged as it comes, one wrong password is a line every few seconds for as long as it
//! lasts, and the line that names the cause drowns. Here a cause is logged when it first
//! appears (and again if it returns after it was gone); later sightings only count.
//!
//! A cause is kept until something proves it gone ([`ruled_out`]): a metadata request that
//! authenticated, a consumer that fetched or joined its group, a dead letter written.
//! Waiting for silence instead would not do: librdkafka reports a refused fetch once per
//! partition and then keeps retrying quietly, so a missing ACL goes silent while it lasts.

use crate::failure::Dependency;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Instant;

struct Entry {
    first: Instant,
    repeats: u64,
}

type Causes = BTreeMap<(&'static str, String), Entry>;

static CAUSES: Mutex<Causes> = Mutex::new(BTreeMap::new());
/// True while any cause is kept: what a success on a hot path looks at before it takes the
/// lock to rule one out.
static ANY: AtomicBool = AtomicBool::new(false);

fn causes() -> std::sync::MutexGuard<'static, Causes> {
    // A panic elsewhere while holding the lock leaves a whole map behind.
    CAUSES.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `cause` of `dependency` was just seen: logged at warn the first time, counted after.
pub fn seen(dependency: Dependency, cause: &str) {
    let mut all = causes();
    let key = (dependency.name(), cause.to_string());
    if let Some(entry) = all.get_mut(&key) {
        entry.repeats += 1;
        tracing::debug!(%dependency, cause, repeats = entry.repeats, "still refused");
        return;
    }
    tracing::warn!(
        %dependency,
        retried = "by itself; said again only once it changes",
        "{dependency}: {cause}"
    );
    all.insert(
        key,
        Entry {
            first: Instant::now(),
            repeats: 0,
        },
    );
    ANY.store(true, Ordering::Release);
}

/// True while any cause of any dependency is kept.
pub fn any() -> bool {
    ANY.load(Ordering::Acquire)
}

/// The causes of `dependency` that still hold, oldest first.
pub fn current(dependency: Dependency) -> Vec<String> {
    let all = causes();
    let mut found: Vec<(&Instant, &String)> = all
        .iter()
        .filter(|((dep, _), _)| *dep == dependency.name())
        .map(|((_, cause), e)| (&e.first, cause))
        .collect();
    found.sort();
    found.into_iter().map(|(_, c)| c.clone()).collect()
}

/// `dependency` answered in a way that rules the `matching` causes out (a metadata request
/// that authenticated rules out a refused password): they are logged as gone and dropped.
pub fn ruled_out(dependency: Dependency, matching: impl Fn(&str) -> bool) {
    if !any() {
        return;
    }
    let mut all = causes();
    let gone: Vec<_> = all
        .keys()
        .filter(|(dep, cause)| *dep == dependency.name() && matching(cause))
        .cloned()
        .collect();
    for (dependency, cause) in gone {
        if let Some(entry) = all.remove(&(dependency, cause.clone())) {
            tracing::info!(
                dependency,
                lasted_s = entry.first.elapsed().as_secs(),
                repeats = entry.repeats,
                "{dependency}: no longer refused: {cause}"
            );
        }
    }
    ANY.store(!all.is_empty(), Ordering::Release);
}

/// One place's failure, said when it changes rather than at every retry: a loop that
/// retries a dependency (a relay round, a gauge read) logs the first failure, a different
/// one, and the recovery, not each attempt in between.
#[derive(Debug, Default)]
pub struct OnChange(Mutex<Option<String>>);

impl OnChange {
    /// True when `failure` is not the one said last: the caller logs it now.
    pub fn failed(&self, failure: &str) -> bool {
        let mut last = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if last.as_deref() == Some(failure) {
            return false;
        }
        *last = Some(failure.to_string());
        true
    }

    /// True when a failure had been said: the caller logs the recovery.
    pub fn recovered(&self) -> bool {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cause_is_kept_once_and_forgotten_when_ruled_out() {
        // Dependency::Other is used by no other test of this crate.
        let dep = Dependency::Other;
        seen(dep, "test: one");
        seen(dep, "test: one");
        seen(dep, "test: two");
        assert_eq!(current(dep), ["test: one", "test: two"]);
        ruled_out(dep, |c| c.ends_with("one"));
        assert_eq!(current(dep), ["test: two"]);
        ruled_out(dep, |_| true);
        assert!(current(dep).is_empty());
    }

    #[test]
    fn a_failure_is_said_when_it_changes_and_its_end_once() {
        let said = OnChange::default();
        assert!(!said.recovered());
        assert!(said.failed("down"));
        assert!(!said.failed("down"));
        assert!(said.failed("refused"));
        assert!(said.recovered());
        assert!(!said.recovered());
        assert!(said.failed("refused"));
    }
}
