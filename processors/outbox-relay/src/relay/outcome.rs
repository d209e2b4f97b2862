//! What became of a round's rows, written down: the acknowledged ones counted, the failed
//! ones into RETRY with backoff, then the mark moved over everything settled (a scan round)
//! or each claimed row marked SENT or RETRY (the retry path).

use super::{crash_point, OutboxRelay, RelayReport, Started};
use crate::error::{sqlx_is_retryable, RelayError};
use crate::publish::{publish_delay, Acked, RowFailure};
use crate::records::Record;
use crate::store::{self, ClaimedRow, Failure};
use std::sync::PoisonError;
use std::time::{Duration, Instant};
use stocksvr_core::backoff;
use stocksvr_core::retry::RetryPolicy;
use stocksvr_telemetry::names;

impl OutboxRelay {
    /// Waits for a round's acknowledgements, puts the failed rows into RETRY and, for a
    /// scan round, moves the mark over everything now settled (renewing the lease).
    pub(super) async fn finish_round(&self, round: Started) -> Result<RelayReport, RelayError> {
        let Started {
            epoch,
            rows,
            records,
            read: _,
            lease_until,
            deliveries,
            started,
        } = round;
        let outcomes = deliveries.acknowledged().await;
        // A row is sent once all its records are acknowledged (its last acknowledgement ends
        // its delay); one failed record retries the whole row (crate::records says why).
        let mut per_row: Vec<Result<Option<Acked>, (RowFailure, &Record)>> =
            vec![Ok(None); rows.len()];
        for (record, outcome) in records.iter().zip(outcomes) {
            let Some(slot) = per_row.get_mut(record.row) else {
                continue;
            };
            match outcome {
                Ok(acked) => {
                    metrics::counter!(names::OUTBOX_PUBLISHED, "topic" => record.topic.clone(), "event_type" => record.event_type.clone())
                        .increment(1);
                    // The topic as written, as the lag exporter sees it on the broker.
                    metrics::counter!(names::EVENTS_PRODUCED, "topic" => self.namespace.topic(&record.topic))
                        .increment(1);
                    if let Ok(last) = slot {
                        *last = Some(
                            last.map_or(acked, |l: Acked| if l.at >= acked.at { l } else { acked }),
                        );
                    }
                }
                Err(failure) => {
                    if slot.is_ok() {
                        *slot = Err((failure, record));
                    }
                }
            }
        }
        let mut sent = Vec::with_capacity(rows.len());
        let mut delays = Vec::with_capacity(rows.len());
        let mut failed = Vec::new();
        for (row, outcome) in rows.iter().zip(per_row) {
            match outcome {
                Ok(Some(acked)) => {
                    sent.push(row.id);
                    delays.push(publish_delay(row.created_at, acked));
                }
                // Every row has a record; a row without one would have nothing to wait for.
                Ok(None) => sent.push(row.id),
                Err((failure, record)) => failed.push(self.failure(row, record, failure)),
            }
        }
        // Failure window 6 (docs/design.md, failure windows) in tests: the broker acknowledged,
        // nothing recorded.
        crash_point("relay.after_publish")?;
        let report = match (epoch, lease_until) {
            (Some(epoch), _) => self.settle(epoch, &sent, &failed).await?,
            (None, Some(lease_until)) => self.mark_claimed(lease_until, &sent, &failed).await?,
            (None, None) => RelayReport::default(),
        };
        // Recorded once the outcome is: a row acknowledged but not recorded (this round
        // failed) is published again, and its delay then runs to that acknowledgement.
        for delay in delays {
            metrics::histogram!(names::OUTBOX_PUBLISH_DELAY_SECONDS).record(delay.as_secs_f64());
        }
        if !rows.is_empty() {
            metrics::histogram!(names::OUTBOX_BATCH_PUBLISH_SECONDS)
                .record(started.elapsed().as_secs_f64());
        }
        Ok(RelayReport {
            claimed: rows.len(),
            ..report
        })
    }

    fn failure(&self, row: &ClaimedRow, record: &Record, failure: RowFailure) -> Failure {
        metrics::counter!(names::OUTBOX_PUBLISH_FAILURES, "topic" => record.topic.clone(), "event_type" => record.event_type.clone(), "reason" => failure.label())
            .increment(1);
        let reason = failure.reason();
        match &failure {
            // A row that cannot be encoded will not heal by itself: a person has to look
            // at the payload or the schema.
            RowFailure::Encode(_) => tracing::error!(
                outbox_id = row.id, event_id = %record.event_id, event_type = %record.event_type,
                topic = %record.topic, retry_count = row.retry_count, error = %reason,
                "outbox row cannot be encoded; it stays in RETRY"
            ),
            // Said once for the relay (the cause), not once per row and retry.
            RowFailure::Refused(_) => tracing::debug!(
                outbox_id = row.id, topic = %record.topic, retry_count = row.retry_count,
                error = %reason, "outbox row refused by the cluster; it will be retried"
            ),
            _ => tracing::warn!(
                outbox_id = row.id, event_id = %record.event_id, topic = %record.topic,
                retry_count = row.retry_count, error = %reason,
                "outbox row not acknowledged; it will be retried"
            ),
        }
        Failure {
            id: row.id,
            retry_after: backoff::delay(
                row.retry_count,
                self.config.retry_initial,
                self.config.retry_max,
                backoff::jitter(),
            ),
            reason,
        }
    }

    /// A scan round's outcome: failed rows to RETRY first (the mark may pass them only
    /// once the retry path owns them), then the mark over everything settled, in one
    /// compare-and-set that also renews the lease.
    async fn settle(
        &self,
        epoch: u64,
        sent: &[u64],
        failed: &[Failure],
    ) -> Result<RelayReport, RelayError> {
        let retried = with_retries("putting outbox rows into RETRY", || {
            store::retry_later(&self.pool, failed)
        })
        .await?;
        let (mark, renew) = {
            let mut guard = self.lock();
            let Some(l) = guard.as_mut().filter(|l| l.epoch == epoch) else {
                return Ok(RelayReport::default());
            };
            l.in_flight.pop_front();
            let mark = l.settled();
            // An idle leader renews at a third of the lease, so a missed write or two
            // still leaves it leading.
            let renew = l.renewed.elapsed() >= self.config.claim_lease / 3;
            (mark, renew || mark > l.hwm)
        };
        if renew {
            let sent_at = Instant::now();
            let held = with_retries("moving the outbox mark", || {
                store::advance(
                    &self.pool,
                    &self.owner,
                    epoch,
                    mark,
                    self.config.claim_lease,
                )
            })
            .await?;
            let mut guard = self.lock();
            if held {
                if let Some(l) = guard.as_mut().filter(|l| l.epoch == epoch) {
                    l.hwm = l.hwm.max(mark);
                    l.renewed = sent_at;
                }
            } else {
                tracing::warn!(
                    owner = %self.owner, epoch,
                    "outbox relay lease taken over; this relay stops publishing new rows \
                     (rows it published above the mark will be published again)"
                );
                guard.take();
            }
        }
        Ok(RelayReport {
            claimed: 0,
            sent: sent.len(),
            failed: retried as usize,
        })
    }

    async fn mark_claimed(
        &self,
        lease_until: chrono::NaiveDateTime,
        sent: &[u64],
        failed: &[Failure],
    ) -> Result<RelayReport, RelayError> {
        // The broker has the records now; losing this write would only mean publishing them
        // again after the lease, so it is worth a few quick retries.
        let marked = with_retries("marking outbox rows", || {
            store::mark(&self.pool, lease_until, sent, failed)
        })
        .await?;
        let lost =
            ((sent.len() + failed.len()) as u64).saturating_sub(marked.sent + marked.retried);
        if lost > 0 {
            // Only possible when a batch outlived its lease (it should not: publish_timeout
            // is below claim_lease) and another relay claimed the rows meanwhile.
            tracing::warn!(
                lost,
                "lease lost on outbox rows before their outcome was written; they may be published twice"
            );
        }
        Ok(RelayReport {
            claimed: 0,
            sent: marked.sent as usize,
            failed: marked.retried as usize,
        })
    }

    /// The first time this relay sees a (topic, event type), its published, failure (every
    /// reason) and produced counters are created at 0: an alert on `increase()` of a failure
    /// then sees 0, not "no data", until the first one. The topics are only known from the
    /// rows, so they cannot be created at start-up.
    pub(super) fn zero_series(&self, rows: &[Record]) {
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        for row in rows {
            if !seen.insert((row.topic.clone(), row.event_type.clone())) {
                continue;
            }
            let (topic, event_type) = (row.topic.clone(), row.event_type.clone());
            stocksvr_telemetry::zero_counter(
                names::OUTBOX_PUBLISHED,
                &[("topic", topic.clone()), ("event_type", event_type.clone())],
            );
            for reason in RowFailure::LABELS {
                stocksvr_telemetry::zero_counter(
                    names::OUTBOX_PUBLISH_FAILURES,
                    &[
                        ("topic", topic.clone()),
                        ("event_type", event_type.clone()),
                        ("reason", reason.to_string()),
                    ],
                );
            }
            stocksvr_telemetry::zero_counter(
                names::EVENTS_PRODUCED,
                &[("topic", self.namespace.topic(&topic))],
            );
        }
    }
}

/// Retries a write whose loss would only cost republishing (the broker has the records): a
/// few quick tries while MySQL is unavailable, then the error goes up to the round.
async fn with_retries<T, F, Fut>(what: &'static str, write: F) -> Result<T, sqlx::Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, sqlx::Error>>,
{
    RetryPolicy::new(Duration::from_millis(50), Duration::from_secs(1))
        .times(4)
        .without_jitter()
        .run(
            write,
            sqlx_is_retryable,
            |e, after| tracing::warn!(error = %e, ?after, "{what} failed; retrying"),
        )
        .await
}
