//! The backoff rule of stocksvr: the delay doubles per failed attempt up to a cap, and jitter
//! spreads out the rows or records that failed together (an outage) so they do not all come
//! back in the same instant. Persisted retries (WAL rows, outbox rows, reservations under
//! recovery) compute their `next_retry_at` with it; in-process retries and waits use it
//! through [`crate::retry`].

use chrono::TimeDelta;
use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

/// Delay before retry number `retry_count + 1`: `initial` doubled per earlier
/// failure, capped at `max`, then shortened by up to a fifth (`jitter` in `[0, 1)`), so rows
/// that failed together (a broker outage) do not all come back in the same instant.
pub fn delay(retry_count: u32, initial: Duration, max: Duration, jitter: f64) -> Duration {
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

/// [`delay`] with fresh jitter.
pub fn jittered(retry_count: u32, initial: Duration, max: Duration) -> Duration {
    delay(retry_count, initial, max, jitter())
}

/// [`jittered`] over chrono durations, which is what a persisted retry adds to the time it
/// writes into `next_retry_at`; a delay chrono cannot hold becomes `max`.
pub fn jittered_delta(retry_count: u32, initial: TimeDelta, max: TimeDelta) -> TimeDelta {
    let std = |d: TimeDelta| d.to_std().unwrap_or_default();
    TimeDelta::from_std(jittered(retry_count, std(initial), std(max))).unwrap_or(max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_delay_doubles_to_the_cap() {
        let s = Duration::from_secs(1);
        let cap = Duration::from_secs(300);
        let delays: Vec<_> = (0..11).map(|n| delay(n, s, cap, 0.0)).collect();
        assert_eq!(
            delays,
            [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300].map(Duration::from_secs)
        );
        assert_eq!(delay(u32::MAX, s, cap, 0.0), cap);
    }

    #[test]
    fn jitter_only_shortens_and_by_at_most_a_fifth() {
        let s = Duration::from_secs(1);
        let cap = Duration::from_secs(300);
        for _ in 0..1000 {
            let j = jitter();
            assert!((0.0..1.0).contains(&j), "{j}");
            let d = delay(3, s, cap, j);
            assert!(d <= Duration::from_secs(8) && d >= Duration::from_millis(6400));
        }
        let shortest = delay(20, s, cap, 0.999_999);
        assert!(shortest >= Duration::from_secs(240) && shortest < cap);
    }

    #[test]
    fn the_chrono_delay_follows_the_same_rule() {
        let (s, cap) = (TimeDelta::seconds(1), TimeDelta::seconds(300));
        let d = jittered_delta(3, s, cap);
        assert!(d <= TimeDelta::seconds(8) && d >= TimeDelta::milliseconds(6400));
        assert!(jittered_delta(u32::MAX, s, cap) <= cap);
    }
}
