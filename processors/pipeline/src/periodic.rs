//! The one runner of every periodic task of stocksvr (the outbox relay, the reservation
//! recovery worker, the stale-reservation watcher, the operation WAL worker, the daily bucket
//! job, the time-wheel poller and the due scan): run a round, sleep as its outcome says, stop
//! promptly on shutdown.
//!
//! The rhythm is adaptive polling (docs/design.md): no sleep while there is a backlog,
//! `min` after a round that found some work, and doubling towards `max` while idle or
//! failing, so an idle deployment costs a query every few seconds per task instead of
//! several a second. A [`Notify`] wake-up (a commit in the same process) ends a sleep at
//! once and resets it; after a round that found work, not before the task's `linger` has
//! passed since that round (see [`Cadence::with_linger`]).

use crate::telemetry::names;
use std::future::Future;
use std::time::Duration;
use tokio::sync::{watch, Notify};

/// The outcome of one round, as far as the poll rhythm cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Round {
    /// As many rows as a batch holds: there is a backlog.
    Full,
    /// Some rows, fewer than a batch.
    Partial,
    /// Nothing claimable.
    Empty,
    /// Nothing claimable now, and the earliest work known comes due in this long (a time
    /// wheel's next entry): sleep as after [`Round::Empty`], but not past it, so that entry
    /// is taken on time while the idle sleeps grow.
    EmptyUntil(Duration),
    /// Work done, and no more due before the longest sleep (a task on a schedule of its own,
    /// like the reconciler's shards): sleep `max` once, then start again from `min`.
    Idle,
    /// The database failed with a retryable error.
    Failed,
}

/// Adaptive polling (docs/design.md): no sleep under backlog, `min` after a partial batch,
/// doubling towards `max` while idle or failing. A wake-up resets it to `min`.
/// The rhythm of one task.
#[derive(Debug, Clone)]
pub struct Poller {
    min: Duration,
    max: Duration,
    idle: Duration,
}

impl Round {
    /// The `outcome` label of `stocksvr_periodic_rounds_total`.
    pub fn label(self) -> &'static str {
        match self {
            Round::Full => "full",
            Round::Partial => "partial",
            Round::Empty | Round::EmptyUntil(_) => "empty",
            Round::Idle => "idle",
            Round::Failed => "failed",
        }
    }
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
            Round::EmptyUntil(due) => {
                // At least a millisecond: a round must never come back at once with nothing
                // done (a due time rounded down to now would spin).
                let sleep = self.idle.min(due.max(Duration::from_millis(1)));
                self.idle = (self.idle * 2).min(self.max);
                sleep
            }
            Round::Idle => {
                self.idle = self.min;
                self.max
            }
        }
    }

    /// A local transaction wrote rows: the next idle sleeps start short again.
    pub fn woken(&mut self) {
        self.idle = self.min;
    }
}

/// How a task sleeps between rounds: `min` after some work, doubling to `max` while idle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cadence {
    pub min: Duration,
    pub max: Duration,
    /// After a partial round, the shortest time before a wake-up starts the next one.
    pub linger: Duration,
}

impl Cadence {
    /// The same sleep after every round (a scan on a fixed interval).
    pub const fn fixed(every: Duration) -> Self {
        Self {
            min: every,
            max: every,
            linger: Duration::ZERO,
        }
    }

    /// `min` after work, doubling to `max` while idle.
    pub const fn adaptive(min: Duration, max: Duration) -> Self {
        Self {
            min,
            max,
            linger: Duration::ZERO,
        }
    }

    /// A wake-up that comes less than `linger` after a partial round waits for the rest of
    /// it. Under a steady stream of commits every commit wakes the task, so without it each
    /// round takes the few rows of one commit: the relay then made a Kafka produce request
    /// (and the projector a fetch) for every handful of rows. With it, rounds come at most
    /// every `linger` while work keeps arriving, each taking what arrived meanwhile; a
    /// wake-up after an empty round (the first rows after a quiet spell) still starts one at
    /// once, so a lone row is not delayed. Capped at `min`, the sleep after a partial round.
    pub const fn with_linger(mut self, linger: Duration) -> Self {
        self.linger = linger;
        self
    }
}

/// Runs `round` until `stop` turns true (or `round` fails fatally: its error is returned).
/// A transient failure is the round's to log; it answers [`Round::Failed`] and the runner
/// backs off like an idle round.
pub async fn run<F, Fut, E>(
    name: &'static str,
    cadence: Cadence,
    wake: Option<&Notify>,
    mut stop: watch::Receiver<bool>,
    mut round: F,
) -> Result<(), E>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Round, E>>,
{
    let mut poller = Poller::new(cadence.min, cadence.max.max(cadence.min));
    tracing::info!(task = name, min = ?cadence.min, max = ?cadence.max, "periodic task started");
    let linger = cadence.linger.min(cadence.min);
    while !*stop.borrow() {
        let outcome = round().await?;
        metrics::counter!(names::PERIODIC_ROUNDS, "task" => name, "outcome" => outcome.label())
            .increment(1);
        let ended = tokio::time::Instant::now();
        let sleep = poller.next(outcome);
        if sleep.is_zero() {
            continue;
        }
        let woken = async {
            match wake {
                Some(n) => n.notified().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(sleep) => {}
            _ = woken => {
                poller.woken();
                if outcome == Round::Partial && !linger.is_zero() {
                    tokio::select! {
                        _ = tokio::time::sleep_until(ended + linger) => {}
                        changed = stop.changed() => {
                            if changed.is_err() {
                                break;
                            }
                        }
                    }
                }
            }
            changed = stop.changed() => {
                if changed.is_err() {
                    break;
                }
            }
        }
    }
    tracing::info!(task = name, "periodic task stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

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
        // Done until the schedule says otherwise: the longest sleep, then short ones again.
        assert_eq!(p.next(Round::Idle), 2000 * MS);
        assert_eq!(p.next(Round::Empty), 20 * MS);
    }

    #[test]
    fn an_idle_sleep_ends_when_the_next_known_work_comes_due() {
        let mut p = Poller::new(200 * MS, 1000 * MS);
        // Work due in 10 s: the idle sleeps grow as after an empty round ...
        let far: Vec<_> = (0..5)
            .map(|_| p.next(Round::EmptyUntil(10_000 * MS)))
            .collect();
        assert_eq!(far, [200, 400, 800, 1000, 1000].map(|m| m * MS));
        // ... but never past the due time, even below `min` ...
        assert_eq!(p.next(Round::EmptyUntil(350 * MS)), 350 * MS);
        assert_eq!(p.next(Round::EmptyUntil(30 * MS)), 30 * MS);
        // ... and never zero: a round that did nothing does not come back at once.
        assert_eq!(p.next(Round::EmptyUntil(Duration::ZERO)), MS);
        // Work found: back to `min`, and the growth starts again.
        assert_eq!(p.next(Round::Partial), 200 * MS);
        assert_eq!(p.next(Round::EmptyUntil(10_000 * MS)), 200 * MS);
        assert_eq!(p.next(Round::EmptyUntil(10_000 * MS)), 400 * MS);
    }

    #[tokio::test(start_paused = true)]
    async fn the_runner_sleeps_as_the_round_says_and_stops_on_the_signal() {
        let rounds = Arc::new(AtomicUsize::new(0));
        let (stop_tx, stop_rx) = watch::channel(false);
        let counted = rounds.clone();
        let task = tokio::spawn(async move {
            run::<_, _, ()>(
                "test",
                Cadence::adaptive(100 * MS, 400 * MS),
                None,
                stop_rx,
                move || {
                    let n = counted.fetch_add(1, Ordering::SeqCst);
                    // Three rounds of backlog, then idle.
                    async move { Ok(if n < 3 { Round::Full } else { Round::Empty }) }
                },
            )
            .await
        });
        tokio::time::sleep(50 * MS).await;
        assert_eq!(
            rounds.load(Ordering::SeqCst),
            4,
            "backlog rounds run back to back"
        );
        // Idle sleeps: 100, 200, 400, 400 ms after the 4th round.
        tokio::time::sleep(1000 * MS).await;
        assert_eq!(rounds.load(Ordering::SeqCst), 7);
        stop_tx.send(true).expect("runner listening");
        task.await.expect("joined").expect("clean stop");
    }

    #[tokio::test(start_paused = true)]
    async fn a_wake_up_ends_an_idle_sleep() {
        let wake = Arc::new(Notify::new());
        let rounds = Arc::new(AtomicUsize::new(0));
        let (stop_tx, stop_rx) = watch::channel(false);
        let (counted, waker) = (rounds.clone(), wake.clone());
        let task = tokio::spawn(async move {
            run::<_, _, ()>(
                "test",
                Cadence::fixed(Duration::from_secs(3600)),
                Some(&waker),
                stop_rx,
                move || {
                    counted.fetch_add(1, Ordering::SeqCst);
                    async { Ok(Round::Empty) }
                },
            )
            .await
        });
        tokio::time::sleep(10 * MS).await;
        assert_eq!(rounds.load(Ordering::SeqCst), 1);
        wake.notify_one();
        tokio::time::sleep(10 * MS).await;
        assert_eq!(rounds.load(Ordering::SeqCst), 2, "woken before the hour");
        stop_tx.send(true).expect("runner listening");
        task.await.expect("joined").expect("clean stop");
    }

    /// Runs rounds answering `outcome` for 100 ms of paused time while a commit wakes the
    /// runner every millisecond; the times the rounds started.
    async fn rounds_under_wakes(cadence: Cadence, outcome: Round) -> Vec<Duration> {
        let wake = Arc::new(Notify::new());
        let starts = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (stop_tx, stop_rx) = watch::channel(false);
        let (seen, waker) = (starts.clone(), wake.clone());
        let t0 = tokio::time::Instant::now();
        let task = tokio::spawn(async move {
            run::<_, _, ()>("test", cadence, Some(&waker), stop_rx, move || {
                seen.lock().expect("not poisoned").push(t0.elapsed());
                async move { Ok(outcome) }
            })
            .await
        });
        for _ in 0..100 {
            tokio::time::sleep(MS).await;
            wake.notify_one();
        }
        stop_tx.send(true).expect("runner listening");
        task.await.expect("joined").expect("clean stop");
        let starts = starts.lock().expect("not poisoned").clone();
        starts
    }

    #[tokio::test(start_paused = true)]
    async fn under_a_stream_of_wakes_rounds_after_work_come_at_most_every_linger() {
        let cadence = Cadence::adaptive(20 * MS, 2000 * MS);
        let eager = rounds_under_wakes(cadence, Round::Partial).await;
        assert!(
            eager.len() >= 90,
            "without linger every wake-up starts a round: {eager:?}"
        );

        let lingering = rounds_under_wakes(cadence.with_linger(10 * MS), Round::Partial).await;
        assert!(
            (9..=11).contains(&lingering.len()),
            "one round per 10 ms: {lingering:?}"
        );
        for pair in lingering.windows(2) {
            assert!(
                pair[1] - pair[0] >= 10 * MS,
                "rounds too close: {lingering:?}"
            );
        }

        // After an empty round the first rows go at once: no linger before that round.
        let idle = rounds_under_wakes(cadence.with_linger(10 * MS), Round::Empty).await;
        assert!(
            idle.len() >= 90,
            "a wake after an empty round waits: {idle:?}"
        );
    }
}
