//! Why a dependency refuses this process right now (a password it does not accept, a
//! certificate it does not trust, a missing ACL), said once per change and kept for
//! `/readyz`.
//!
//! Client libraries retry such a refusal by themselves, librdkafka about every reconnect
//! backoff: logged as it comes, one wrong password is a line every half second for as long
//! as it lasts, and the one line that names the cause drowns. Here a cause is logged when
//! it first appears (and again if it returns after it was gone), later sightings only
//! refresh it, and it is logged as gone once it was not seen for [`FORGET_AFTER`]. The
//! readiness probes name the causes still current.

use crate::failure::Dependency;
use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// A cause not seen for this long is taken as fixed. librdkafka retries a refused
/// connection within its reconnect backoff (at most 10 s) and a refused fetch or group join
/// within a second or two, so a cause that still holds is seen again well within it.
pub const FORGET_AFTER: Duration = Duration::from_secs(30);

struct Entry {
    first: Instant,
    last: Instant,
    repeats: u64,
}

type Causes = BTreeMap<(&'static str, String), Entry>;

static CAUSES: Mutex<Causes> = Mutex::new(BTreeMap::new());

fn causes() -> std::sync::MutexGuard<'static, Causes> {
    // A panic elsewhere while holding the lock leaves a whole map behind.
    CAUSES.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `cause` of `dependency` was just seen: logged at warn the first time, counted after.
pub fn seen(dependency: Dependency, cause: &str) {
    let now = Instant::now();
    let mut all = causes();
    forget_old(&mut all, now);
    let key = (dependency.name(), cause.to_string());
    if let Some(entry) = all.get_mut(&key) {
        entry.last = now;
        entry.repeats += 1;
        tracing::debug!(%dependency, cause, repeats = entry.repeats, "still refused");
        return;
    }
    tracing::warn!(
        %dependency,
        cause,
        "{dependency} refuses this process: {cause} (retried by itself; logged again only when it changes)"
    );
    all.insert(
        key,
        Entry {
            first: now,
            last: now,
            repeats: 0,
        },
    );
}

/// The causes of `dependency` that still hold, oldest first.
pub fn current(dependency: Dependency) -> Vec<String> {
    let mut all = causes();
    forget_old(&mut all, Instant::now());
    let mut found: Vec<(&Instant, &String)> = all
        .iter()
        .filter(|((dep, _), _)| *dep == dependency.name())
        .map(|((_, cause), e)| (&e.first, cause))
        .collect();
    found.sort();
    found.into_iter().map(|(_, c)| c.clone()).collect()
}

/// `dependency` answered in a way that rules `matching` causes out (a metadata request that
/// authenticated rules out a refused password): forget those now.
pub fn ruled_out(dependency: Dependency, matching: impl Fn(&str) -> bool) {
    let mut all = causes();
    let gone: Vec<_> = all
        .keys()
        .filter(|(dep, cause)| *dep == dependency.name() && matching(cause))
        .cloned()
        .collect();
    for key in gone {
        if let Some(entry) = all.remove(&key) {
            log_gone(&key, &entry);
        }
    }
}

fn forget_old(all: &mut Causes, now: Instant) {
    let old: Vec<_> = all
        .iter()
        .filter(|(_, e)| now.duration_since(e.last) >= FORGET_AFTER)
        .map(|(k, _)| k.clone())
        .collect();
    for key in old {
        if let Some(entry) = all.remove(&key) {
            log_gone(&key, &entry);
        }
    }
}

fn log_gone((dependency, cause): &(&'static str, String), entry: &Entry) {
    tracing::info!(
        dependency,
        cause,
        lasted_s = entry.last.duration_since(entry.first).as_secs(),
        repeats = entry.repeats,
        "{dependency} no longer refuses this process: {cause}"
    );
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
}
