//! Group commit: concurrent requests for the same kind of MySQL write are handed to one
//! worker that writes them together, one statement (or one transaction) for the group.
//!
//! No timer forms a group. While `in_flight` groups are being written, new requests queue;
//! the next group takes everything queued (up to `max_group`). A lone request therefore
//! goes out at once, and under load the groups grow with the queue: the wait a request
//! sees is at most the write in front of it.
//!
//! The MySQL workers have one group in flight by default, so a write that stalls (a lock
//! wait, a deadlock's backoff) would hold every request of its stage behind it. When the
//! next group has waited [`STALL_AFTER`] for a slot, it goes out on a spare one (at most
//! [`SPARE_SLOTS`] of them): a normal write takes a few milliseconds, so under a normal load
//! the spares stay unused and the groups stay large.

use super::ReservationService;
use crate::error::ServiceError;
use chrono::NaiveDateTime;
use sqlx::MySqlPool;
use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use stocksvr_core::bucket::BucketKey;
use stocksvr_core::model::OpResult;
use stocksvr_store::lua::{ExecError, LuaExecutor, TryItem};
use stocksvr_store::reservations::{
    self as repo, Begin, Completion, InsertOutcome, NewReservation, Reservation,
};
use stocksvr_telemetry::names;
use tokio::sync::{mpsc, oneshot, Semaphore};

type Job<T, R> = (T, oneshot::Sender<R>);

/// How long the next group waits for one of the worker's slots before it takes a spare one:
/// ten times a commit group's usual write on the bench machine (5-6 ms at 3,000 Trys/s).
pub const STALL_AFTER: std::time::Duration = std::time::Duration::from_millis(50);

/// Spare slots of a MySQL group-commit worker, used only past [`STALL_AFTER`]; each holds a
/// pool connection while it writes.
pub const SPARE_SLOTS: usize = 3;

/// A handle to a group-commit worker for items `T` answered with `R`.
pub struct Coalescer<T, R> {
    queue: mpsc::UnboundedSender<Job<T, R>>,
}

impl<T: Send + 'static, R: Send + 'static> Coalescer<T, R> {
    /// Starts the worker on the current Tokio runtime. `write` gets a group and answers
    /// one result per item, in the group's order.
    pub fn spawn<F, Fut>(max_group: usize, in_flight: usize, write: F) -> Self
    where
        F: Fn(Vec<T>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Vec<R>> + Send + 'static,
    {
        Self::start(max_group, in_flight, false, None, write)
    }

    /// As [`Self::spawn`], with `spare` more slots for a group that waited `stall` for one
    /// of the `in_flight` slots (the writes in front of it stalled).
    pub fn spawn_with_spares<F, Fut>(
        max_group: usize,
        in_flight: usize,
        (stall, spare): (std::time::Duration, usize),
        write: F,
    ) -> Self
    where
        F: Fn(Vec<T>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Vec<R>> + Send + 'static,
    {
        Self::start(max_group, in_flight, false, Some((stall, spare)), write)
    }

    /// As [`Self::spawn`], but the worker lets every task that is ready run once before it
    /// takes a group: requests released together by one write (the Trys of one PREPARING
    /// insert) then reach the next stage as one group, not as a lone first one and the rest.
    /// A lone request waits for one pass of the scheduler, not for a timer.
    pub fn spawn_settled<F, Fut>(max_group: usize, in_flight: usize, write: F) -> Self
    where
        F: Fn(Vec<T>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Vec<R>> + Send + 'static,
    {
        Self::start(max_group, in_flight, true, None, write)
    }

    fn start<F, Fut>(
        max_group: usize,
        in_flight: usize,
        settle: bool,
        spares: Option<(std::time::Duration, usize)>,
        write: F,
    ) -> Self
    where
        F: Fn(Vec<T>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Vec<R>> + Send + 'static,
    {
        let (queue, mut jobs) = mpsc::unbounded_channel::<Job<T, R>>();
        let write = Arc::new(write);
        let slots = Arc::new(Semaphore::new(in_flight.max(1)));
        let spare = spares.map(|(stall, n)| (stall, Arc::new(Semaphore::new(n))));
        let max_group = max_group.max(1);
        tokio::spawn(async move {
            loop {
                // A free slot first: while every slot is busy, requests gather in the queue.
                let slot = match &spare {
                    None => slots.clone().acquire_owned().await,
                    Some((stall, spare)) => {
                        match tokio::time::timeout(*stall, slots.clone().acquire_owned()).await {
                            Ok(slot) => slot,
                            // The writes in front of it stalled: whichever slot frees first.
                            Err(_) => tokio::select! {
                                slot = slots.clone().acquire_owned() => slot,
                                slot = spare.clone().acquire_owned() => slot,
                            },
                        }
                    }
                };
                let Ok(slot) = slot else {
                    return;
                };
                let Some(first) = jobs.recv().await else {
                    return;
                };
                if settle {
                    tokio::task::yield_now().await;
                }
                let mut group = vec![first];
                while group.len() < max_group {
                    match jobs.try_recv() {
                        Ok(job) => group.push(job),
                        Err(_) => break,
                    }
                }
                let write = write.clone();
                tokio::spawn(async move {
                    let (items, replies): (Vec<T>, Vec<oneshot::Sender<R>>) =
                        group.into_iter().unzip();
                    let results = write(items).await;
                    drop(slot);
                    // A caller that went away (its client hung up) just misses its answer;
                    // the write happened either way.
                    for (reply, result) in replies.into_iter().zip(results) {
                        let _ = reply.send(result);
                    }
                });
            }
        });
        Self { queue }
    }

    /// Queues `item` for the next group and waits for its result. None only when the
    /// worker is gone (the runtime is shutting down) or `write` answered too few results.
    pub async fn submit(&self, item: T) -> Option<R> {
        let (reply, answer) = oneshot::channel();
        self.queue.send((item, reply)).ok()?;
        answer.await.ok()
    }
}

/// The group-commit workers of the reservation service. Each row in a group keeps the
/// single-row path's recovery semantics: a group's write is one transaction, and when any of
/// its rows lost its CAS it is rolled back and every row is written alone, so a crash at
/// any point leaves each row where the recovery worker finishes it.
///
/// - `inserts`: the Try's PREPARING rows (one INSERT);
/// - `begins`: the CAS into an intermediate status of Confirm and Cancel (one UPDATE);
/// - `commits`: the completion of any step but a refund's (Try, Confirm, Cancel, the
///   recovery worker's resumes, MarkCreated): one UPDATE and one INSERT of the outbox rows;
/// - `trys` (with `reservation.try_lua_group`): the Trys' script calls, one call of
///   `try.lua` per bucket of a group, in which each item runs as its own call would have
///   (its own operation id, fence and result).
///
/// The MySQL workers share the pool: each group in flight holds one connection, so
/// `in_flight` bounds what group commit can take from it (three workers at `in_flight` each).
pub(super) struct StepGroups {
    pub(super) inserts:
        Coalescer<NewReservation, Result<(NaiveDateTime, InsertOutcome), sqlx::Error>>,
    begins: Coalescer<Begin, Result<Option<Reservation>, sqlx::Error>>,
    commits: Coalescer<(Reservation, Completion), Result<Option<Reservation>, sqlx::Error>>,
    pub(super) trys: Option<Coalescer<(BucketKey, TryItem), Result<OpResult, ExecError>>>,
}

impl StepGroups {
    pub(super) fn start(
        pool: &MySqlPool,
        lua_groups: Option<&Arc<LuaExecutor>>,
        max_group: usize,
        in_flight: usize,
    ) -> Self {
        let stage = |name| Stage {
            pool: pool.clone(),
            name,
            max_group,
            in_flight,
        };
        let inserts = stage("insert").spawn(|pool, rows: Vec<NewReservation>| async move {
            let (at, outcomes) = repo::insert_preparing_many(&pool, &rows).await?;
            Ok(outcomes.into_iter().map(|o| (at, o)).collect())
        });
        let begins = stage("begin")
            .spawn(|pool, items: Vec<Begin>| async move { repo::begin_steps(&pool, &items).await });
        let commits =
            stage("commit").spawn(|pool, items: Vec<(Reservation, Completion)>| async move {
                let refs: Vec<(&Reservation, &Completion)> =
                    items.iter().map(|(r, c)| (r, c)).collect();
                repo::complete_steps(&pool, &refs).await
            });
        // Settled: the Trys of one insert group wake together and should meet in one call.
        let trys = lua_groups.map(|lua| {
            let lua = lua.clone();
            Coalescer::spawn_settled(max_group, in_flight, move |items| {
                let lua = lua.clone();
                async move { try_by_bucket(&lua, items).await }
            })
        });
        Self {
            inserts,
            begins,
            commits,
            trys,
        }
    }
}

/// The Trys of a group: one script call per bucket, the buckets' calls at the same time,
/// each result in its item's place.
async fn try_by_bucket(
    lua: &LuaExecutor,
    items: Vec<(BucketKey, TryItem)>,
) -> Vec<Result<OpResult, ExecError>> {
    let n = items.len();
    let mut buckets: Vec<(BucketKey, Vec<usize>, Vec<TryItem>)> = Vec::new();
    let mut of_bucket: HashMap<BucketKey, usize> = HashMap::new();
    for (position, (bucket, item)) in items.into_iter().enumerate() {
        let b = *of_bucket.entry(bucket).or_insert_with(|| {
            buckets.push((bucket, Vec::new(), Vec::new()));
            buckets.len() - 1
        });
        buckets[b].1.push(position);
        buckets[b].2.push(item);
    }
    let calls = buckets.iter().map(|(bucket, _, items)| {
        metrics::histogram!(names::TRY_GROUP_SIZE, "stage" => "lua").record(items.len() as f64);
        lua.try_group(bucket, items)
    });
    let started = std::time::Instant::now();
    let replies = futures::future::join_all(calls).await;
    metrics::histogram!(names::TRY_GROUP_WRITE_SECONDS, "stage" => "lua")
        .record(started.elapsed().as_secs_f64());
    let mut results: Vec<Option<Result<OpResult, ExecError>>> = (0..n).map(|_| None).collect();
    for ((_, positions, _), replies) in buckets.iter().zip(replies) {
        for (&position, reply) in positions.iter().zip(replies) {
            results[position] = Some(reply);
        }
    }
    // try_group answers one result per item; a missing one would be a bug there, told to
    // its caller as a reply of the wrong shape rather than a panic.
    results
        .into_iter()
        .map(|r| {
            r.unwrap_or_else(|| {
                Err(ExecError::Protocol {
                    operation_id: String::new(),
                    detail: "no reply for this item of the group".into(),
                })
            })
        })
        .collect()
}

/// What every group-commit worker of the service shares: the pool, the bounds, and its name
/// in `stocksvr_try_group_size{stage}`.
struct Stage {
    pool: MySqlPool,
    name: &'static str,
    max_group: usize,
    in_flight: usize,
}

impl Stage {
    /// A worker writing each group with `write`, which answers one result per item in order;
    /// a failed group tells each of its items the same kind of error.
    fn spawn<T, R, F, Fut>(self, write: F) -> Coalescer<T, Result<R, sqlx::Error>>
    where
        T: Send + 'static,
        R: Send + 'static,
        F: Fn(MySqlPool, Vec<T>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Vec<R>, sqlx::Error>> + Send + 'static,
    {
        let Stage {
            pool,
            name,
            max_group,
            in_flight,
        } = self;
        let spares = (STALL_AFTER, SPARE_SLOTS);
        Coalescer::spawn_with_spares(max_group, in_flight, spares, move |items: Vec<T>| {
            let n = items.len();
            metrics::histogram!(names::TRY_GROUP_SIZE, "stage" => name).record(n as f64);
            let written = write(pool.clone(), items);
            async move {
                let started = std::time::Instant::now();
                let written = written.await;
                metrics::histogram!(names::TRY_GROUP_WRITE_SECONDS, "stage" => name)
                    .record(started.elapsed().as_secs_f64());
                match written {
                    Ok(results) => results.into_iter().map(Ok).collect(),
                    Err(e) => (0..n).map(|_| Err(copy_error(&e))).collect(),
                }
            }
        })
    }
}

impl ReservationService {
    /// The CAS of `begin.row` into its intermediate status, in a group with concurrent ones
    /// when group commit is on. Returns the row as the CAS left it (built from the CAS, not
    /// read back), None when another actor moved the row first.
    pub(super) async fn begin_grouped(
        &self,
        begin: Begin,
    ) -> Result<Option<Reservation>, ServiceError> {
        Ok(match &self.groups {
            Some(groups) => groups
                .begins
                .submit(begin)
                .await
                .unwrap_or_else(|| Err(worker_gone()))?,
            None => repo::begin_steps(&self.pool, std::slice::from_ref(&begin))
                .await?
                .pop()
                .flatten(),
        })
    }

    /// Commits a step's completion (any but a refund's, which writes its refund row too), in
    /// a group with concurrent ones when group commit is on. Returns the row as committed,
    /// None when the CAS was lost (another actor finished first).
    pub(super) async fn complete_grouped(
        &self,
        row: Reservation,
        completion: &Completion,
    ) -> Result<Option<Reservation>, ServiceError> {
        Ok(match &self.groups {
            Some(groups) => groups
                .commits
                .submit((row, completion.clone()))
                .await
                .unwrap_or_else(|| Err(worker_gone()))?,
            None => repo::complete_one(&self.pool, &row, completion).await?,
        })
    }
}

/// One failed group write, told to each of its rows: the same kind of error (so it is
/// classified the same way: a lost connection or timeout is an unavailable dependency).
fn copy_error(e: &sqlx::Error) -> sqlx::Error {
    let kind = match e {
        sqlx::Error::Io(io) => io.kind(),
        sqlx::Error::PoolTimedOut => std::io::ErrorKind::TimedOut,
        _ => std::io::ErrorKind::Other,
    };
    sqlx::Error::Io(std::io::Error::new(kind, e.to_string()))
}

/// The group worker stopped (the runtime is shutting down): to the caller, MySQL is gone.
pub(super) fn worker_gone() -> sqlx::Error {
    sqlx::Error::Io(std::io::Error::new(
        std::io::ErrorKind::BrokenPipe,
        "a group-commit worker stopped",
    ))
}

/// The Trys' script worker stopped (the runtime is shutting down): whether the call ran is
/// not known to the caller, which keeps its row PREPARING for the recovery worker.
pub(super) fn lua_worker_gone(operation_id: &str) -> ExecError {
    ExecError::Unknown {
        operation_id: operation_id.to_string(),
        source: redis::RedisError::from((redis::ErrorKind::Io, "a group-commit worker stopped")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;

    // The default test runtime has one thread: a task that counted itself has also queued
    // its item, because nothing between the two yields.
    #[tokio::test]
    async fn a_lone_item_goes_out_alone_and_queued_items_go_out_together() {
        let groups = Arc::new(Mutex::new(Vec::<usize>::new()));
        let seen = groups.clone();
        let gate = Arc::new(tokio::sync::Notify::new());
        let open = gate.clone();
        let group = Arc::new(Coalescer::spawn(8, 1, move |items: Vec<u32>| {
            let seen = seen.clone();
            let open = open.clone();
            async move {
                seen.lock().expect("lock").push(items.len());
                if items == [0] {
                    // Holds the only slot until the others are queued.
                    open.notified().await;
                }
                items.iter().map(|i| i * 10).collect::<Vec<u32>>()
            }
        }));
        let first = tokio::spawn({
            let group = group.clone();
            async move { group.submit(0).await }
        });
        while groups.lock().expect("lock").is_empty() {
            tokio::task::yield_now().await;
        }
        let queued = Arc::new(AtomicUsize::new(0));
        let rest: Vec<_> = (1..=10)
            .map(|i| {
                let group = group.clone();
                let queued = queued.clone();
                tokio::spawn(async move {
                    queued.fetch_add(1, Ordering::SeqCst);
                    group.submit(i).await
                })
            })
            .collect();
        while queued.load(Ordering::SeqCst) < 10 {
            tokio::task::yield_now().await;
        }
        gate.notify_one();
        assert_eq!(first.await.expect("join"), Some(0));
        for (i, task) in rest.into_iter().enumerate() {
            assert_eq!(task.await.expect("join"), Some((i as u32 + 1) * 10));
        }
        let sizes = groups.lock().expect("lock").clone();
        assert_eq!(
            sizes,
            vec![1, 8, 2],
            "a lone item alone, then bounded groups"
        );
    }

    // Paused time: the runtime jumps to the next timer whenever every task waits, so the
    // stall bound passes without the test sleeping through it.
    #[tokio::test(start_paused = true)]
    async fn a_stalled_write_does_not_hold_the_next_group_longer_than_the_stall_bound() {
        let stall = std::time::Duration::from_millis(50);
        let gate = Arc::new(tokio::sync::Notify::new());
        let open = gate.clone();
        let entered = Arc::new(tokio::sync::Notify::new());
        let enter = entered.clone();
        let group = Arc::new(Coalescer::spawn_with_spares(
            8,
            1,
            (stall, 1),
            move |items: Vec<u32>| {
                let (open, enter) = (open.clone(), enter.clone());
                async move {
                    if items.contains(&0) {
                        // A write that stalls until the test lets it go.
                        enter.notify_one();
                        open.notified().await;
                    }
                    items.iter().map(|i| i * 10).collect::<Vec<u32>>()
                }
            },
        ));
        let stalled = tokio::spawn({
            let group = group.clone();
            async move { group.submit(0).await }
        });
        // The stalled write holds the only slot before anything else is queued.
        entered.notified().await;
        let started = tokio::time::Instant::now();
        let (a, b) = (group.clone(), group.clone());
        let both = async move {
            tokio::join!(a.submit(1), async move {
                // Queued behind the spare slot's own group: it waits for a slot to free.
                tokio::time::sleep(stall / 2).await;
                b.submit(2).await
            })
        };
        // Without a spare slot both would wait for the stalled write, that is for ever: a
        // bound turns that into a failure instead of a hung test.
        let (next, later) = tokio::time::timeout(stall * 10, both)
            .await
            .expect("the next groups were held behind the stalled write");
        assert_eq!(next, Some(10), "the next group went out on the spare slot");
        assert_eq!(later, Some(20));
        let waited = started.elapsed();
        assert!(
            waited >= stall && waited < stall * 3,
            "the next group waited the stall bound, not the stalled write: {waited:?}"
        );
        assert!(
            !stalled.is_finished(),
            "the stalled write is still in flight"
        );
        gate.notify_one();
        assert_eq!(stalled.await.expect("join"), Some(0));
    }
}
