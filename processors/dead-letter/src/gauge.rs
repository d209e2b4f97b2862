//! `stocksvr_dead_letters_parked`: dead letters waiting for an operator (parked, neither
//! replayed nor discarded). Read from MySQL on a fixed cadence rather than counted up and
//! down here, because a replay or discard may run in another process (`stocksvr dlq`, the
//! admin API of another instance); the count uses `idx_status_created`.

use crate::store::Status;
use sqlx::MySqlPool;
use std::time::Duration;
use stocksvr_pipeline::periodic::{self, Cadence, Round};
use stocksvr_store::deadline::Deadline;
use stocksvr_telemetry::names;
use tokio::sync::watch;

/// How often [`run_gauge`] counts.
pub const GAUGE_INTERVAL: Duration = Duration::from_secs(15);

/// Counts the parked dead letters and sets the gauge.
pub async fn refresh_parked(pool: &MySqlPool) -> Result<u64, sqlx::Error> {
    let (n,): (i64,) =
        sqlx::query_as("SELECT COUNT(*) FROM inventory_dead_letter WHERE status = ?")
            .bind(Status::Parked.code())
            .fetch_one(pool)
            .deadline()
            .await?;
    let n = u64::try_from(n).unwrap_or(0);
    metrics::gauge!(names::DEAD_LETTERS_PARKED).set(n as f64);
    Ok(n)
}

/// Refreshes the gauge every `every` until `stop`. A failed count keeps the last value and
/// is logged: nothing here stops the process.
pub async fn run_gauge(
    pool: MySqlPool,
    every: Duration,
    stop: watch::Receiver<bool>,
) -> Result<(), sqlx::Error> {
    periodic::run(
        "dead-letter gauge",
        Cadence::fixed(every),
        None,
        stop,
        || async {
            Ok(match refresh_parked(&pool).await {
                Ok(_) => Round::Partial,
                Err(e) => {
                    tracing::warn!(error = %e, "counting parked dead letters failed");
                    Round::Failed
                }
            })
        },
    )
    .await
}
