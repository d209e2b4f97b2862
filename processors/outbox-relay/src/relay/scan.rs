//! The leader's half-round: take or keep the lease, read new rows by primary key above the
//! cursor, re-read the open gaps (closing those no open transaction can fill any more) and
//! enqueue the PENDING rows in id order.

use super::leadership::{Gap, Leadership, Reading, GAPS_PER_READ, TRX_READING_DELAY};
use super::{crash_point, OutboxRelay, Started};
use crate::error::RelayError;
use crate::publish::enqueue_batch;
use crate::records::records;
use crate::store::{self, status, ClaimedRow, ScannedRow};
use std::collections::{BTreeMap, HashSet, VecDeque};
use std::sync::atomic::Ordering;
use std::time::Instant;
use stocksvr_pipeline::failure;

impl OutboxRelay {
    /// Makes sure this relay leads: `Some((epoch, cursor))` when it does.
    pub(super) async fn lead(&self) -> Result<Option<(u64, u64)>, RelayError> {
        {
            let mut guard = self.lock();
            if let Some(l) = guard.as_ref() {
                // A lease that may have run out by now is not trusted: the next write
                // would tell, but publishing first could race a new leader for nothing.
                if l.renewed.elapsed() < self.config.claim_lease.mul_f64(0.8) {
                    return Ok(Some((l.epoch, l.cursor)));
                }
                guard.take();
            }
        }
        let cursor = store::cursor(&self.pool).await?;
        if !cursor.free && cursor.owner.as_deref() != Some(self.owner.as_str()) {
            return Ok(None);
        }
        let renewed = Instant::now();
        let Some((epoch, hwm)) = store::acquire(
            &self.pool,
            &self.owner,
            cursor.epoch,
            self.config.claim_lease,
        )
        .await?
        else {
            return Ok(None);
        };
        tracing::info!(owner = %self.owner, epoch, hwm, "outbox relay took the lead");
        *self.lock() = Some(Leadership {
            epoch,
            hwm,
            cursor: hwm,
            gaps: BTreeMap::new(),
            in_flight: VecDeque::new(),
            renewed,
        });
        Ok(Some((epoch, hwm)))
    }

    /// The leader's half-round: reads new rows above the cursor, re-reads open gaps (closing
    /// those no open transaction can fill any more) and enqueues the PENDING rows in id
    /// order. `None` when another relay leads.
    pub(super) async fn start_round(&self) -> Result<Option<Started>, RelayError> {
        let started = Instant::now();
        let Some((epoch, cursor)) = self.lead().await? else {
            return Ok(None);
        };
        let scanned = store::scan(&self.pool, cursor, self.config.batch_size).await?;
        let seen = Instant::now();
        let read = scanned.len();
        let judge = {
            let mut guard = self.lock();
            let Some(l) = guard.as_mut().filter(|l| l.epoch == epoch) else {
                return Ok(None);
            };
            let mut next = l.cursor;
            for row in &scanned {
                if row.row.id > next + 1 {
                    l.gaps.insert(
                        next + 1,
                        Gap {
                            hi: row.row.id - 1,
                            seen,
                            owners: None,
                        },
                    );
                }
                next = next.max(row.row.id);
            }
            l.cursor = next;
            // Registered with the cursor's move, so a concurrent finish never puts the
            // mark over rows read but not yet published.
            l.in_flight
                .push_back(scanned.first().map_or(u64::MAX, |r| r.row.id));
            // Most gaps are transactions committing out of order: they are re-read every
            // round while open, so such a row goes out with the next round. Judging them
            // against the open transactions waits until one is old enough for INNODB_TRX.
            (!l.gaps.is_empty())
                .then(|| l.gaps.values().any(|g| g.seen + TRX_READING_DELAY <= seen))
        };
        let found = match judge {
            Some(judge) => self.reread_gaps(epoch, judge).await?,
            None => Vec::new(),
        };
        let mut rows: Vec<ClaimedRow> = found
            .into_iter()
            .chain(scanned)
            .filter(|r| r.status == status::PENDING)
            .map(|r| r.row)
            .collect();
        // Publishing in id order keeps one key's events in the order they were written.
        rows.sort_by_key(|row| row.id);
        // A step's row is two records (stock change, then lifecycle), enqueued together.
        let records = records(&rows);
        self.zero_series(&records);
        // Failure window 5 (docs/design.md, failure windows) in tests: read, nothing published.
        crash_point("relay.before_publish")?;
        let deliveries = enqueue_batch(
            &self.codec,
            &self.producer,
            &self.namespace,
            &records,
            self.config.publish_timeout,
        )
        .await;
        Ok(Some(Started {
            epoch: Some(epoch),
            rows,
            records,
            read,
            lease_until: None,
            deliveries,
            started,
        }))
    }

    pub(super) fn warn_no_trx_view(&self, e: &sqlx::Error) {
        if !self.no_trx_view.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                error = %e,
                gap_timeout = ?self.config.gap_timeout,
                "information_schema.INNODB_TRX refused (PROCESS privilege missing): an outbox \
                 id missing below published rows is taken as never written after gap_timeout, \
                 and a row committed later than that is not published"
            );
        }
    }

    /// Judges the open gaps old enough against the open transactions, then re-reads the
    /// lowest ones: rows found there are returned (to publish) and taken out of the gaps,
    /// and a gap no transaction can fill any more is closed after that read.
    pub(super) async fn reread_gaps(
        &self,
        epoch: u64,
        judge: bool,
    ) -> Result<Vec<ScannedRow>, RelayError> {
        let asked = Instant::now();
        let reading = if !judge {
            Reading::NotNow
        } else if self.no_trx_view.load(Ordering::Relaxed) {
            Reading::Refused
        } else {
            match store::open_transactions(&self.pool).await {
                Ok(ids) => Reading::Open(ids.into_iter().collect()),
                Err(e) if failure::is_access_denied(&e) => {
                    self.warn_no_trx_view(&e);
                    Reading::Refused
                }
                Err(e) => return Err(e.into()),
            }
        };
        let (ranges, closable) = {
            let mut guard = self.lock();
            let Some(l) = guard.as_mut().filter(|l| l.epoch == epoch) else {
                return Ok(Vec::new());
            };
            let mut closable = HashSet::new();
            for (&lo, gap) in l.gaps.iter_mut().take(GAPS_PER_READ) {
                match &reading {
                    Reading::Open(open) if gap.seen + TRX_READING_DELAY <= asked => {
                        let owners = gap.owners.get_or_insert_with(|| open.clone());
                        owners.retain(|id| open.contains(id));
                        if owners.is_empty() {
                            closable.insert(lo);
                        }
                    }
                    Reading::Open(_) | Reading::NotNow => {}
                    Reading::Refused => {
                        if gap.seen + self.config.gap_timeout <= asked {
                            closable.insert(lo);
                        }
                    }
                }
            }
            let ranges: Vec<(u64, u64)> = l
                .gaps
                .iter()
                .take(GAPS_PER_READ)
                .map(|(&lo, g)| (lo, g.hi))
                .collect();
            (ranges, closable)
        };
        // After the reading: whatever a finished owner committed is visible to this read.
        let found = store::read_ranges(&self.pool, &ranges).await?;
        let mut guard = self.lock();
        let Some(l) = guard.as_mut().filter(|l| l.epoch == epoch) else {
            return Ok(Vec::new());
        };
        for lo in &closable {
            if let Some(gap) = l.gaps.remove(lo) {
                tracing::debug!(from = lo, to = gap.hi, "outbox id gap closed");
            }
        }
        for row in &found {
            l.found(row.row.id);
        }
        // The rows found are this round's now: it holds the mark below them until they
        // are acknowledged (or put into RETRY).
        if let (Some(lowest), Some(back)) = (found.first(), l.in_flight.back_mut()) {
            *back = (*back).min(lowest.row.id);
        }
        Ok(found)
    }
}
