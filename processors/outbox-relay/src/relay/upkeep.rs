//! The relay's upkeep beside publishing: the purge of sent rows past the retention and the
//! backlog gauges, each on its own loop.

use super::OutboxRelay;
use crate::error::RelayError;
use crate::store::{self, Backlog};
use std::sync::atomic::Ordering;
use stocksvr_pipeline::periodic::{self, Cadence, Round};
use stocksvr_telemetry::names;
use tokio::sync::watch;

impl OutboxRelay {
    /// Deletes sent rows older than the retention, in batches of `purge_batch` walking the
    /// primary key up to the mark, until a batch reaches rows still inside the retention.
    /// Returns the number of rows deleted.
    #[tracing::instrument(skip_all, err)]
    pub async fn purge_once(&self) -> Result<u64, RelayError> {
        let mut total = 0;
        let mut after = 0;
        loop {
            let purged = store::purge_batch(
                &self.pool,
                self.config.retention,
                after,
                self.config.purge_batch,
            )
            .await?;
            total += purged.deleted;
            metrics::counter!(names::OUTBOX_PURGED).increment(purged.deleted);
            match purged.next {
                Some(next) => after = next,
                None => break,
            }
        }
        if total > 0 {
            tracing::info!(deleted = total, "purged sent outbox rows");
        }
        Ok(total)
    }

    /// Reads the backlog and sets the backlog gauges.
    pub async fn refresh_backlog(&self) -> Result<Backlog, RelayError> {
        let backlog = store::backlog(&self.pool).await?;
        metrics::gauge!(names::OUTBOX_BACKLOG).set(backlog.rows as f64);
        metrics::gauge!(names::OUTBOX_OLDEST_PENDING_SECONDS).set(backlog.oldest_age.as_secs_f64());
        Ok(backlog)
    }

    pub(super) async fn purge_loop(&self, stop: watch::Receiver<bool>) -> Result<(), RelayError> {
        let cadence = Cadence::fixed(self.config.purge_every);
        let said = stocksvr_pipeline::causes::OnChange::default();
        let said = &said;
        periodic::run("outbox purge", cadence, None, stop, || async move {
            match self.purge_once().await {
                Ok(_) => {
                    said.recovered();
                    Ok(Round::Partial)
                }
                Err(e) if e.is_retryable() => {
                    let error = e.to_string();
                    if said.failed(&error) {
                        tracing::warn!(%error, "outbox purge failed; trying at the next interval (said again when the error changes)");
                    }
                    Ok(Round::Failed)
                }
                Err(e) => Err(e),
            }
        })
        .await
    }

    /// Refreshes the backlog gauges every `gauge_every` while there is a backlog or the relay
    /// moves rows; while neither, the gap doubles up to `gauge_idle_every`, and the relay's
    /// first round that moves rows ends it at once.
    pub(super) async fn gauge_loop(&self, stop: watch::Receiver<bool>) -> Result<(), RelayError> {
        let cadence = Cadence::adaptive(self.config.gauge_every, self.config.gauge_idle_every);
        let said = stocksvr_pipeline::causes::OnChange::default();
        let said = &said;
        periodic::run(
            "outbox gauges",
            cadence,
            Some(&self.gauge_wake),
            stop,
            || async move {
                let moved = self.moved.swap(0, Ordering::Relaxed);
                // A gauge is best effort: a failed read leaves the last value and is logged
                // when the error changes.
                let round = match self.refresh_backlog().await {
                    Ok(backlog) => {
                        said.recovered();
                        gauge_round(&backlog, moved)
                    }
                    Err(e) => {
                        let error = e.to_string();
                        if said.failed(&error) {
                            tracing::warn!(%error, "reading the outbox backlog failed (said again when the error changes)");
                        }
                        Round::Failed
                    }
                };
                self.gauge_idle
                    .store(round == Round::Empty, Ordering::Relaxed);
                Ok(round)
            },
        )
        .await
    }
}

/// The gauge loop's rhythm after a reading: busy while rows wait or the relay moved some since
/// the last reading, idle otherwise.
fn gauge_round(backlog: &Backlog, moved: u64) -> Round {
    if backlog.rows > 0 || moved > 0 {
        Round::Partial
    } else {
        Round::Empty
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_gauges_refresh_fast_only_while_rows_wait_or_move() {
        let backlog = |rows| Backlog {
            rows,
            oldest_age: Duration::ZERO,
        };
        assert_eq!(gauge_round(&backlog(0), 0), Round::Empty);
        assert_eq!(gauge_round(&backlog(3), 0), Round::Partial);
        assert_eq!(gauge_round(&backlog(0), 500), Round::Partial);
    }
}
