//! The one in-process retry loop and the one wait-for-a-condition loop of stocksvr.
//!
//! Both take their pacing from a [`RetryPolicy`], whose delays are [`crate::backoff::delay`]:
//! the same doubling, cap and jitter that persisted retries (WAL rows, outbox rows, the
//! recovery worker) write into `next_retry_at`. Hand-built backoff loops and poll loops with
//! a fixed sleep drift apart from that rule and from each other; these two do not.
//!
//! Only tokio's timer is used here, no I/O: the caller's closure does the work.

use crate::backoff;
use std::future::Future;
use std::time::Duration;

/// How often and for how long to try again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Delay before the first retry; doubled per failure up to `max`.
    pub initial: Duration,
    pub max: Duration,
    /// Retries after the first attempt; `None` retries until the call succeeds or fails
    /// with an error the caller does not retry.
    pub max_retries: Option<u32>,
    /// Shorten each delay by up to a fifth, so callers that failed together (an outage) do
    /// not all come back in the same instant.
    pub jitter: bool,
}

impl RetryPolicy {
    /// Retries without limit, with jitter.
    pub const fn new(initial: Duration, max: Duration) -> Self {
        RetryPolicy {
            initial,
            max,
            max_retries: None,
            jitter: true,
        }
    }

    /// At most `n` retries after the first attempt.
    pub const fn times(mut self, n: u32) -> Self {
        self.max_retries = Some(n);
        self
    }

    /// The same delays every run (tests, and polls whose pacing should be predictable).
    pub const fn without_jitter(mut self) -> Self {
        self.jitter = false;
        self
    }

    /// Polls every `every`, always the same interval.
    pub const fn fixed(every: Duration) -> Self {
        RetryPolicy {
            initial: every,
            max: every,
            max_retries: None,
            jitter: false,
        }
    }

    /// Delay before retry number `retry + 1`.
    pub fn delay(&self, retry: u32) -> Duration {
        let jitter = if self.jitter { backoff::jitter() } else { 0.0 };
        backoff::delay(retry, self.initial, self.max, jitter)
    }

    fn may_retry(&self, retries_done: u32) -> bool {
        self.max_retries.is_none_or(|n| retries_done < n)
    }

    /// Runs `call` until it succeeds, fails with an error `retryable` refuses, or the policy
    /// runs out of retries; `notify` hears each error that will be retried and the delay
    /// before the retry (log it, count it).
    pub async fn run<T, E, F, Fut>(
        &self,
        mut call: F,
        retryable: impl Fn(&E) -> bool,
        mut notify: impl FnMut(&E, Duration),
    ) -> Result<T, E>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let mut retries = 0;
        loop {
            match call().await {
                Ok(v) => return Ok(v),
                Err(e) if retryable(&e) && self.may_retry(retries) => {
                    let after = self.delay(retries);
                    notify(&e, after);
                    tokio::time::sleep(after).await;
                    retries += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }
}

impl RetryPolicy {
    /// [`RetryPolicy::run`] for blocking code (a librdkafka call on a blocking thread):
    /// the same decisions and delays, the pause a thread sleep.
    pub fn run_blocking<T, E>(
        &self,
        mut call: impl FnMut() -> Result<T, E>,
        retryable: impl Fn(&E) -> bool,
        mut notify: impl FnMut(&E, Duration),
    ) -> Result<T, E> {
        let mut retries = 0;
        loop {
            match call() {
                Ok(v) => return Ok(v),
                Err(e) if retryable(&e) && self.may_retry(retries) => {
                    let after = self.delay(retries);
                    notify(&e, after);
                    std::thread::sleep(after);
                    retries += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// Polls `check` until it returns `Some`, paced by `every` (its delays grow as the policy
/// says), for at most `within`. `None` when the time ran out: the caller decides what that
/// means (an error naming what it waited for, a warning, a shorter path).
pub async fn wait_until<T, F, Fut>(within: Duration, every: RetryPolicy, mut check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + within;
    let mut polls = 0;
    loop {
        if let Some(v) = check().await {
            return Some(v);
        }
        let now = tokio::time::Instant::now();
        if now >= deadline {
            return None;
        }
        let pause = every.delay(polls).min(deadline - now);
        tokio::time::sleep(pause).await;
        polls = polls.saturating_add(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    const MS: Duration = Duration::from_millis(1);

    #[tokio::test(start_paused = true)]
    async fn run_retries_what_is_retryable_until_it_succeeds() {
        let calls = AtomicU32::new(0);
        let mut delays = Vec::new();
        let policy = RetryPolicy::new(10 * MS, 40 * MS).without_jitter();
        let out: Result<u32, &str> = policy
            .run(
                || async {
                    let n = calls.fetch_add(1, Ordering::SeqCst);
                    if n < 4 {
                        Err("down")
                    } else {
                        Ok(n)
                    }
                },
                |_| true,
                |_, after| delays.push(after),
            )
            .await;
        assert_eq!(out, Ok(4));
        assert_eq!(delays, [10 * MS, 20 * MS, 40 * MS, 40 * MS]);
    }

    #[test]
    fn run_blocking_retries_with_the_same_delays_and_stops_on_a_permanent_error() {
        let mut calls = 0;
        let mut delays = Vec::new();
        let policy = RetryPolicy::new(MS, 2 * MS).without_jitter();
        let out: Result<u32, &str> = policy.run_blocking(
            || {
                calls += 1;
                match calls {
                    1..=3 => Err("moving"),
                    _ => Err("refused"),
                }
            },
            |e| *e == "moving",
            |_, after| delays.push(after),
        );
        assert_eq!((out, calls), (Err("refused"), 4));
        assert_eq!(delays, [MS, 2 * MS, 2 * MS]);
        assert_eq!(
            RetryPolicy::new(MS, MS).times(1).run_blocking(
                || Err::<(), _>("moving"),
                |_| true,
                |_, _| {}
            ),
            Err("moving")
        );
    }

    #[tokio::test(start_paused = true)]
    async fn run_stops_at_the_retry_bound_and_on_a_permanent_error() {
        let calls = AtomicU32::new(0);
        let policy = RetryPolicy::new(MS, MS).times(2);
        let out: Result<(), &str> = policy
            .run(
                || async {
                    calls.fetch_add(1, Ordering::SeqCst);
                    Err("down")
                },
                |_| true,
                |_, _| {},
            )
            .await;
        assert_eq!((out, calls.load(Ordering::SeqCst)), (Err("down"), 3));

        calls.store(0, Ordering::SeqCst);
        let out: Result<(), &str> = policy
            .run(
                || async {
                    calls.fetch_add(1, Ordering::SeqCst);
                    Err("invalid")
                },
                |e| *e != "invalid",
                |_, _| {},
            )
            .await;
        assert_eq!((out, calls.load(Ordering::SeqCst)), (Err("invalid"), 1));
    }

    #[tokio::test(start_paused = true)]
    async fn wait_until_returns_the_value_or_none_at_the_deadline() {
        let polls = AtomicU32::new(0);
        let got = wait_until(
            Duration::from_secs(1),
            RetryPolicy::fixed(100 * MS),
            || async { (polls.fetch_add(1, Ordering::SeqCst) == 3).then_some("ready") },
        )
        .await;
        assert_eq!(got, Some("ready"));

        let start = tokio::time::Instant::now();
        let never: Option<()> = wait_until(
            Duration::from_secs(1),
            RetryPolicy::fixed(300 * MS),
            || async { None },
        )
        .await;
        assert_eq!(never, None);
        // The last pause is cut to the deadline, not a whole interval past it.
        assert_eq!(start.elapsed(), Duration::from_secs(1));
    }
}
