//! A deadline on every MySQL statement.
//!
//! A stalled server (a SIGSTOP, a network black hole, a lock held by a dead session) answers
//! nothing at all: without a deadline a statement would wait for ever and the processor with
//! it, never recognising the outage. Every statement of stocksvr goes through
//! [`Deadline::deadline`], which gives up after `mysql.statement_timeout_ms` with an I/O
//! timeout, the same error a refused connection gives, so the caller classifies it as an
//! unavailable dependency and retries. (The pool's `acquire_timeout` bounds waiting for a
//! connection; this bounds the statement on it.) A statement cut off mid-flight leaves its
//! connection to sqlx, which discards the rest of the reply before reusing it, and an open
//! transaction dropped here is rolled back. Transactions open with [`begin`], which is
//! cancel-safe where sqlx's own `begin` is not.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

static DEADLINE_MS: AtomicU64 = AtomicU64::new(5_000);

/// Sets the deadline of every statement from now on (`mysql.statement_timeout_ms`).
pub fn set_statement_deadline(deadline: Duration) {
    let ms = u64::try_from(deadline.as_millis())
        .unwrap_or(u64::MAX)
        .max(1);
    DEADLINE_MS.store(ms, Ordering::Relaxed);
}

pub fn statement_deadline() -> Duration {
    Duration::from_millis(DEADLINE_MS.load(Ordering::Relaxed))
}

/// `.deadline()` on any sqlx future.
pub trait Deadline<T>: Future<Output = Result<T, sqlx::Error>> + Sized {
    fn deadline(self) -> impl Future<Output = Result<T, sqlx::Error>> {
        let limit = statement_deadline();
        async move {
            match tokio::time::timeout(limit, self).await {
                Ok(result) => result,
                Err(_) => Err(timed_out(limit)),
            }
        }
    }
}

impl<T, F: Future<Output = Result<T, sqlx::Error>>> Deadline<T> for F {}

fn timed_out(limit: Duration) -> sqlx::Error {
    sqlx::Error::Io(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("mysql statement took longer than its {limit:?} deadline"),
    ))
}

/// Opens a transaction within the statement deadline, without the hole a plain
/// `pool.begin().deadline()` has: sqlx counts the transaction only once the server has
/// answered `BEGIN`, so a future dropped in between leaves the session inside a transaction
/// that nothing rolls back, and the pool hands that connection on (its next users read an
/// old snapshot, and their writes wait for someone's COMMIT; sqlx issues #2054, #4393). The
/// `BEGIN` runs in a task of its own instead: past the deadline the caller gets the usual
/// timeout while the task finishes the round trip and drops the transaction it got, which
/// rolls it back before the connection returns to the pool.
pub async fn begin(
    pool: &sqlx::MySqlPool,
) -> Result<sqlx::Transaction<'static, sqlx::MySql>, sqlx::Error> {
    let limit = statement_deadline();
    let pool = pool.clone();
    let task = tokio::spawn(async move { pool.begin().await });
    match tokio::time::timeout(limit, task).await {
        Ok(Ok(result)) => result,
        Ok(Err(join)) => Err(sqlx::Error::Io(std::io::Error::other(format!(
            "the task opening a transaction ended without an answer: {join}"
        )))),
        Err(_) => Err(timed_out(limit)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_statement_past_its_deadline_is_an_io_timeout() {
        set_statement_deadline(Duration::from_millis(100));
        let stalled = std::future::pending::<Result<(), sqlx::Error>>();
        match stalled.deadline().await {
            Err(sqlx::Error::Io(e)) => assert_eq!(e.kind(), std::io::ErrorKind::TimedOut),
            other => panic!("expected an I/O timeout, got {other:?}"),
        }
        let quick = async { Ok::<_, sqlx::Error>(7) };
        assert_eq!(quick.deadline().await.expect("in time"), 7);
    }
}
