//! InnoDB picks a victim when two transactions wait for each other (1213) and rolls the
//! victim's statement or transaction back: nothing of it happened, so running it again is
//! safe, and the normal answer. Short and bounded here: a caller that still loses gets the
//! error, which the one classifier treats as an unavailable dependency. The error numbers
//! are `stocksvr_core::mysql_errors`' and the pacing is `stocksvr_core::retry`'s.

use std::future::Future;
use std::time::Duration;
use stocksvr_core::mysql_errors;
use stocksvr_core::retry::RetryPolicy;

/// Deadlock victim (1213) or lock wait timeout (1205).
pub fn is_lock_conflict(e: &sqlx::Error) -> bool {
    matches!(
        e,
        sqlx::Error::Database(db)
            if db
                .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
                .is_some_and(|m| mysql_errors::is_lock_conflict(m.number()))
    )
}

/// Runs `work` again (up to `attempts` times in all) while it loses a lock conflict, after a
/// short jittered pause so the two transactions do not meet again at once.
pub async fn on_lock_conflict<T, F, Fut>(attempts: u32, work: F) -> Result<T, sqlx::Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, sqlx::Error>>,
{
    let mut attempt = 1;
    RetryPolicy::new(Duration::from_millis(5), Duration::from_millis(100))
        .times(attempts.saturating_sub(1))
        .run(work, is_lock_conflict, |e, wait| {
            tracing::debug!(attempt, error = %e, ?wait, "lock conflict; running the statement again");
            attempt += 1;
        })
        .await
}
