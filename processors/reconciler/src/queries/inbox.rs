//! The consumer inbox's retention: the reconciler's role purges rows older than
//! `reconcile.inbox_retention_days` beside its passes.

use chrono::NaiveDateTime;
use sqlx::MySqlPool;
use stocksvr_store::deadline::Deadline;

/// Deletes inbox rows consumed before `before`, at most `limit`; returns how many.
pub async fn purge_inbox(
    pool: &MySqlPool,
    before: NaiveDateTime,
    limit: u32,
) -> Result<u64, sqlx::Error> {
    let done = sqlx::query("DELETE FROM inventory_consumer_inbox WHERE consumed_at < ? LIMIT ?")
        .bind(before)
        .bind(limit)
        .execute(pool)
        .deadline()
        .await?;
    Ok(done.rows_affected())
}
