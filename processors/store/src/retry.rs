//! InnoDB picks a victim when two transactions wait for each other (1213) and rolls the
//! victim's statement or transaction back: nothing of it happened, so running it again is
//! safe, and the normal answer. Short and bounded here: a caller that still loses gets the
//! error, which the one classifier treats as an unavailable dependency.

use std::future::Future;
use std::time::Duration;

/// Deadlock victim (1213) or lock wait timeout (1205).
pub fn is_lock_conflict(e: &sqlx::Error) -> bool {
    matches!(
        e,
        sqlx::Error::Database(db)
            if matches!(
                db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>().map(|m| m.number()),
                Some(1213 | 1205)
            )
    )
}

/// Runs `work` again (up to `attempts` times in all) while it loses a lock conflict.
pub async fn on_lock_conflict<T, F, Fut>(attempts: u32, mut work: F) -> Result<T, sqlx::Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, sqlx::Error>>,
{
    let mut attempt = 1;
    loop {
        match work().await {
            Err(e) if is_lock_conflict(&e) && attempt < attempts => {
                // A little jitter so the two transactions do not meet again at once.
                let wait = stocksvr_core::backoff::jittered(
                    attempt - 1,
                    Duration::from_millis(5),
                    Duration::from_millis(100),
                );
                tracing::debug!(attempt, error = %e, ?wait, "lock conflict; running the statement again");
                tokio::time::sleep(wait).await;
                attempt += 1;
            }
            other => return other,
        }
    }
}
