//! Failpoints: named places where a test makes the process "crash" (the failure
//! windows). Code calls [`hit`] at each place; a test arms the place through a
//! [`Scenario`], and the next call there returns [`Injected`], which the caller turns into
//! an error that leaves the call at once, writing nothing more. MySQL and Redis are then
//! left exactly as a process killed at that line would leave them, and the test checks that
//! the recovery paths finish the work once.
//!
//! Without the `enabled` feature, [`hit`] is an inline `Ok(())` and the registry does not
//! exist: release and `cargo build` binaries carry no failpoint code. Only test builds turn
//! the feature on, through a dev-dependency
//! (`stocksvr-failpoint = { workspace = true, features = ["enabled"] }`).

use std::fmt;

/// The error a failpoint returns when a test armed it: "the process died here".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Injected {
    pub point: &'static str,
}

impl fmt::Display for Injected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "failpoint {}: injected crash", self.point)
    }
}

impl std::error::Error for Injected {}

impl Injected {
    /// As an I/O error, for callers whose errors carry one: to them a crashed peer is a
    /// connection that went away.
    pub fn into_io(self) -> std::io::Error {
        std::io::Error::other(self)
    }
}

/// True when `err` or anything in its source chain is an [`Injected`] crash, also when it
/// is wrapped in an `std::io::Error` (whose `source()` skips the wrapped error).
pub fn is_injected(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(err);
    while let Some(e) = next {
        if e.is::<Injected>() {
            return true;
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            if io.get_ref().is_some_and(|inner| inner.is::<Injected>()) {
                return true;
            }
        }
        next = e.source();
    }
    false
}

/// Passes unless a test armed `point`. Without the `enabled` feature it always passes and
/// the call compiles away.
#[cfg(not(feature = "enabled"))]
#[inline(always)]
pub fn hit(_point: &'static str) -> Result<(), Injected> {
    Ok(())
}

#[cfg(feature = "enabled")]
pub use registry::{hit, scenario, Action, Scenario};

#[cfg(feature = "enabled")]
mod registry {
    use super::Injected;
    use std::collections::HashMap;
    use std::sync::{Mutex, MutexGuard, PoisonError};

    /// What an armed failpoint does when reached.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Action {
        /// Crash every time until disarmed.
        Crash,
        /// Crash the next `n` times, then pass.
        CrashTimes(usize),
    }

    #[derive(Default)]
    struct Point {
        action: Option<Action>,
        /// Crashes injected at this point since the scenario began.
        fired: usize,
    }

    static POINTS: Mutex<Option<HashMap<&'static str, Point>>> = Mutex::new(None);
    /// One scenario at a time per process: the registry is global, and a failpoint armed by
    /// one test must not fire in another test running on another thread.
    static SCENARIO: Mutex<()> = Mutex::new(());

    fn points() -> MutexGuard<'static, Option<HashMap<&'static str, Point>>> {
        // A test that panicked while holding the lock left a usable map behind.
        POINTS.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Passes unless a test armed `point`.
    pub fn hit(point: &'static str) -> Result<(), Injected> {
        let mut guard = points();
        let Some(p) = guard.as_mut().and_then(|m| m.get_mut(point)) else {
            return Ok(());
        };
        let crash = match p.action {
            None => false,
            Some(Action::Crash) => true,
            Some(Action::CrashTimes(0)) => {
                p.action = None;
                false
            }
            Some(Action::CrashTimes(n)) => {
                p.action = (n > 1).then_some(Action::CrashTimes(n - 1));
                true
            }
        };
        if crash {
            p.fired += 1;
            return Err(Injected { point });
        }
        Ok(())
    }

    /// Exclusive use of the failpoints for one test: waits for any other scenario of this
    /// process to end, starts with every point disarmed and disarms them all when dropped
    /// (also when the test panics). A test holds it across `.await`s on purpose: each
    /// `#[tokio::test]` runs on a runtime and thread of its own, so waiting for it blocks
    /// only the other test that wants the failpoints, never a runtime it shares.
    pub struct Scenario {
        _exclusive: MutexGuard<'static, ()>,
    }

    pub fn scenario() -> Scenario {
        let exclusive = SCENARIO.lock().unwrap_or_else(PoisonError::into_inner);
        *points() = Some(HashMap::new());
        Scenario {
            _exclusive: exclusive,
        }
    }

    impl Scenario {
        pub fn arm(&self, point: &'static str, action: Action) {
            if let Some(map) = points().as_mut() {
                map.entry(point).or_default().action = Some(action);
            }
        }

        /// Disarms `point`; its count of injected crashes is kept.
        pub fn disarm(&self, point: &'static str) {
            if let Some(p) = points().as_mut().and_then(|m| m.get_mut(point)) {
                p.action = None;
            }
        }

        pub fn disarm_all(&self) {
            if let Some(map) = points().as_mut() {
                for p in map.values_mut() {
                    p.action = None;
                }
            }
        }

        /// Crashes injected at `point` in this scenario: a test asserts it is not zero, so
        /// a renamed or unreachable point cannot make the test pass vacuously.
        pub fn fired(&self, point: &'static str) -> usize {
            points()
                .as_ref()
                .and_then(|m| m.get(point))
                .map_or(0, |p| p.fired)
        }
    }

    impl Drop for Scenario {
        fn drop(&mut self) {
            *points() = None;
        }
    }
}

#[cfg(all(test, feature = "enabled"))]
mod tests {
    use super::*;

    #[test]
    fn armed_points_crash_as_told_and_disarm_on_drop() {
        {
            let s = scenario();
            assert_eq!(hit("a"), Ok(()));
            s.arm("a", Action::CrashTimes(2));
            assert_eq!(hit("a"), Err(Injected { point: "a" }));
            assert_eq!(hit("a"), Err(Injected { point: "a" }));
            assert_eq!(hit("a"), Ok(()));
            assert_eq!(s.fired("a"), 2);
            s.arm("b", Action::Crash);
            assert!(hit("b").is_err() && hit("b").is_err());
            s.disarm("b");
            assert_eq!(hit("b"), Ok(()));
            s.arm("c", Action::Crash);
        }
        assert_eq!(hit("c"), Ok(()), "dropping the scenario disarms everything");
    }

    #[test]
    fn injected_is_found_through_io_wrapping() {
        let io = Injected { point: "x" }.into_io();
        assert!(is_injected(&io));
        assert!(!is_injected(&std::io::Error::other("other")));
    }
}
