//! Pure timing decisions: how long to sleep between rounds and when a failed row is retried.

use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

/// The outcome of one round, as far as the poll rhythm cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Round {
    /// As many rows as a batch holds: there is a backlog.
    Full,
    /// Some rows, fewer than a batch.
    Partial,
    /// Nothing claimable.
    Empty,
    /// The database failed with a retryable error.
    Failed,
}

/// Adaptive polling (seed 003): no sleep under backlog, `min` after a partial batch,
/// doubling towards `max` while idle or failing. A wake-up resets it to `min`.
#[derive(Debug, Clone)]
pub struct Poller {
    min: Duration,
    max: Duration,
    idle: Duration,
}

impl Poller {
    pub fn new(min: Duration, max: Duration) -> Self {
        Self {
            min,
            max,
            idle: min,
        }
    }

    /// The sleep before the next round.
    pub fn next(&mut self, round: Round) -> Duration {
        match round {
            Round::Full => {
                self.idle = self.min;
                Duration::ZERO
            }
            Round::Partial => {
                self.idle = self.min;
                self.min
            }
            Round::Empty | Round::Failed => {
                let sleep = self.idle;
                self.idle = (self.idle * 2).min(self.max);
                sleep
            }
        }
    }

    /// A local transaction wrote rows: the next idle sleeps start short again.
    pub fn woken(&mut self) {
        self.idle = self.min;
    }
}

/// Delay before retry number `retry_count + 1` of a row: `initial` doubled per earlier
/// failure, capped at `max`, then shortened by up to a fifth (`jitter` in `[0, 1)`), so rows
/// that failed together (a broker outage) do not all come back in the same instant.
pub fn retry_delay(retry_count: u32, initial: Duration, max: Duration, jitter: f64) -> Duration {
    let base = 1u32
        .checked_shl(retry_count)
        .and_then(|factor| initial.checked_mul(factor))
        .map_or(max, |d| d.min(max));
    base.mul_f64(1.0 - 0.2 * jitter.clamp(0.0, 1.0))
}

/// A number in `[0, 1)` for jitter. The std hasher's per-instance random keys are enough:
/// jitter only has to spread retries, not be unpredictable.
pub fn jitter() -> f64 {
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(0);
    (hasher.finish() >> 11) as f64 / (1u64 << 53) as f64
}

/// Keeps `last_error` within its column (VARCHAR(1024)), cutting on a character boundary.
pub fn truncate_error(reason: &str) -> String {
    reason.chars().take(1000).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn polling_is_fast_under_backlog_and_slows_when_idle() {
        let mut p = Poller::new(20 * MS, 2000 * MS);
        assert_eq!(p.next(Round::Full), Duration::ZERO);
        assert_eq!(p.next(Round::Partial), 20 * MS);
        let idle: Vec<_> = (0..9).map(|_| p.next(Round::Empty)).collect();
        assert_eq!(
            idle,
            [20, 40, 80, 160, 320, 640, 1280, 2000, 2000].map(|m| m * MS)
        );
        // Work arriving resets the rhythm at once.
        assert_eq!(p.next(Round::Full), Duration::ZERO);
        assert_eq!(p.next(Round::Empty), 20 * MS);
        assert_eq!(p.next(Round::Empty), 40 * MS);
        p.woken();
        assert_eq!(p.next(Round::Failed), 20 * MS);
    }

    #[test]
    fn retry_delay_doubles_to_the_cap() {
        let s = Duration::from_secs(1);
        let cap = Duration::from_secs(300);
        let delays: Vec<_> = (0..11).map(|n| retry_delay(n, s, cap, 0.0)).collect();
        assert_eq!(
            delays,
            [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300].map(Duration::from_secs)
        );
        assert_eq!(retry_delay(u32::MAX, s, cap, 0.0), cap);
    }

    #[test]
    fn jitter_only_shortens_and_by_at_most_a_fifth() {
        let s = Duration::from_secs(1);
        let cap = Duration::from_secs(300);
        for _ in 0..1000 {
            let j = jitter();
            assert!((0.0..1.0).contains(&j), "{j}");
            let d = retry_delay(3, s, cap, j);
            assert!(d <= Duration::from_secs(8) && d >= Duration::from_millis(6400));
        }
        let shortest = retry_delay(20, s, cap, 0.999_999);
        assert!(shortest >= Duration::from_secs(240) && shortest < cap);
    }

    #[test]
    fn errors_are_cut_on_character_boundaries() {
        let long = "é".repeat(2000);
        let cut = truncate_error(&long);
        assert_eq!(cut.chars().count(), 1000);
        assert_eq!(truncate_error("short"), "short");
    }
}
