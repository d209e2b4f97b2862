//! The stock projector: keeps MySQL's projection of the Redis stock in step with
//! `inventory.stock-change.v1`.
//!
//! Delivery: at-least-once from Kafka, exactly-once effects in MySQL. The shared loop
//! ([`stocksvr_pipeline::consumer`]) stores a batch's offsets only after [`Projector`]
//! returned, and the projector returns only after the batch's transactions committed (one
//! per lane, [`LANES`]: a bucket's events always in the same one): an event's ledger row
//! (`INSERT IGNORE` on the unique operation_id), its snapshot write and its reservation sync
//! commit together or not at all. The ledger row is the dedupe key: an operation announces
//! one stock-change event (event id `<operation_id>:<kind>`), so an event whose operation is
//! booked already is a redelivery, and it changes nothing. No inbox row is written: it
//! would only repeat, per event, what the ledger's unique key already records.
//!
//! Order: events carry absolute after-quantities and the Redis version that produced
//! them, and the snapshot only ever moves to a newer version, so reordered events (a
//! retried batch, a re-published outbox row) cannot drift it; a stale event still books
//! its ledger row and advances its reservation's synced version, never backwards. The
//! snapshot row of a bucket is inserted once, by its first event; after that it is a
//! plain UPDATE guarded by the version.
//!
//! Flow per batch: decide (pure, [`decide`]) → read what the batch touches, plan what each
//! event would have done on its own (pure, [`plan`]) and write each table with one
//! statement, all in one transaction per lane ([`store`]) → commit → the loop stores
//! offsets. When the database does not answer as planned (another consumer wrote
//! meanwhile) the lane is rolled back and applied event by event instead. A record that
//! can never be projected is answered `Failure::Invalid` on its own and dead-lettered by the
//! loop while the rest of the batch applies; a database failure fails the whole batch
//! (classified by [`stocksvr_pipeline::failure`], see [`error`]).

pub mod decide;
pub mod error;
pub mod plan;
pub mod store;
pub mod telemetry;

use chrono::{NaiveDateTime, Utc};
use decide::{InvalidEvent, LedgerRow, Projection, SnapshotRow};
use error::ProjectorError;
use futures::future::BoxFuture;
use futures::FutureExt;
use plan::SnapshotWrite;
use sqlx::{MySqlConnection, MySqlPool};
use std::collections::HashSet;
use stocksvr_core::events::topics;
use stocksvr_pipeline::config::KafkaSettings;
use stocksvr_pipeline::consumer::{Applied, Failure, Handler, LoopConfig, Record};
use stocksvr_store::deadline::Deadline;
use telemetry::Tally;

/// Processor name: metrics label, client id and consumer group suffix.
pub const NAME: &str = "projector";

/// Records per transaction. A batch costs a fixed handful of statements whatever its size, so a backlog
/// is drained at hundreds of events per commit; 500 ledger rows bind 8,000 values, far
/// below MariaDB's limit, and a retried batch still redoes well under a second of work.
pub const MAX_BATCH: usize = 500;

/// Transactions a batch is split into, by bucket, run at the same time on connections of
/// their own. One transaction at a time left the machine half idle while a batch drained a
/// backlog: about a third of each batch's time was this process building statements and
/// two thirds MariaDB applying them, one after the other. Two lanes let MariaDB apply one
/// while the other is being built and use a second core. The lanes touch disjoint rows
/// (every row a projection writes hangs off its bucket: the snapshot row, the reservation,
/// and the ledger rows of its own events), so they neither wait for nor deadlock on each
/// other. A lane that fails fails the batch while another may have committed: every write
/// is idempotent (ledger operation id, version-guarded snapshot, GREATEST), so the retried
/// batch finds that lane's events as duplicates and applies nothing twice.
pub const LANES: usize = 2;

/// Below this many events a batch stays one transaction: a projector that keeps up gets
/// small batches, for which a second transaction is a second commit (and fsync) and more
/// statements for MariaDB, for no time saved worth having. A backlog comes in full batches.
pub const LANES_FROM_EVENTS: usize = 100;

/// The loop settings of the projector: `inventory.stock-change.v1`, batches of 500.
pub fn loop_config(kafka: &KafkaSettings) -> LoopConfig {
    LoopConfig {
        max_batch: MAX_BATCH,
        ..LoopConfig::new(NAME, vec![kafka.topic(topics::STOCK_CHANGE)])
    }
}

/// The consumer group [`stocksvr_pipeline::consumer::run`] uses for the projector.
pub fn group_name(settings: &KafkaSettings) -> String {
    format!("{}.{}", settings.group_prefix, NAME)
}

/// The projector's [`Handler`].
#[derive(Debug, Clone)]
pub struct Projector {
    pool: MySqlPool,
    group: String,
    lanes: usize,
    lanes_from: usize,
}

impl Projector {
    /// `group` names the consumer group in logs. Deduplication does not depend on it: the
    /// ledger is one per database, so another group replaying the topic into the same
    /// database (a rebuild) books nothing twice either. Refused when empty, which Kafka
    /// refuses as a group id.
    pub fn new(pool: MySqlPool, group: impl Into<String>) -> Result<Self, ProjectorError> {
        let group = group.into();
        if group.is_empty() {
            return Err(ProjectorError::InvalidGroup(group));
        }
        Ok(Self {
            pool,
            group,
            lanes: LANES,
            lanes_from: LANES_FROM_EVENTS,
        })
    }

    /// Splits batches of at least `from_events` valid events into `lanes` transactions
    /// (default [`LANES`] from [`LANES_FROM_EVENTS`]); 1 lane keeps every batch whole.
    pub fn with_lanes(mut self, lanes: usize, from_events: usize) -> Self {
        self.lanes = lanes.max(1);
        self.lanes_from = from_events;
        self
    }

    pub fn group(&self) -> &str {
        &self.group
    }

    #[tracing::instrument(skip_all, fields(processor = NAME, records = batch.len()), err(Debug))]
    async fn project(&self, batch: &[Record]) -> Result<Vec<Result<Applied, Failure>>, Failure> {
        // Decided before the transactions open: they hold no locks while decoding.
        let decided: Vec<Result<Projection, InvalidEvent>> =
            batch.iter().map(|r| decide::decide(&r.event)).collect();
        let valid: Vec<&Projection> = decided.iter().filter_map(|d| d.as_ref().ok()).collect();
        let now = Utc::now().naive_utc();
        let lanes = if valid.len() >= self.lanes_from {
            lanes(&valid, self.lanes)
        } else {
            vec![(0..valid.len()).collect()]
        };
        // Every lane runs to its end, even when another failed, rather than being dropped
        // halfway: each lane is then committed or rolled back as a whole and the retried
        // batch finds it that way.
        let booked = futures::future::join_all(
            lanes
                .iter()
                .filter(|lane| !lane.is_empty())
                .map(|lane| self.project_lane(&valid, lane, now)),
        )
        .await
        .into_iter()
        .collect::<Result<Vec<_>, Failure>>()?;
        let mut applied: Vec<Option<Applied>> = vec![None; valid.len()];
        for (lane, outcomes) in lanes.iter().filter(|lane| !lane.is_empty()).zip(booked) {
            debug_assert_eq!(
                lane.len(),
                outcomes.len(),
                "one outcome per event of a lane"
            );
            for (&i, outcome) in lane.iter().zip(outcomes) {
                applied[i] = Some(outcome);
            }
        }
        let mut applied = applied.into_iter();
        let mut results = Vec::with_capacity(batch.len());
        for (record, decision) in batch.iter().zip(decided) {
            let result = match decision {
                Ok(_) => Ok(applied.next().flatten().unwrap_or(Applied::Applied)),
                Err(invalid) => {
                    tracing::warn!(
                        topic = record.topic(),
                        partition = record.partition(),
                        offset = record.offset(),
                        error = %invalid,
                        "invalid stock-change event"
                    );
                    Err(Failure::Invalid(invalid.to_string()))
                }
            };
            results.push(result);
        }
        Ok(results)
    }

    /// The events `lane` (positions in `valid`, in batch order) in one transaction of their
    /// own, committed before this returns; its tally is emitted then. Lanes run at once, and
    /// two lanes' first events of new buckets can deadlock on the gaps their snapshot reads
    /// lock; InnoDB rolls one lane back whole, so that lane simply runs again.
    async fn project_lane(
        &self,
        valid: &[&Projection],
        lane: &[usize],
        now: NaiveDateTime,
    ) -> Result<Vec<Applied>, Failure> {
        let events: Vec<&Projection> = lane.iter().map(|&i| valid[i]).collect();
        let (applied, tally) =
            stocksvr_store::retry::on_lock_conflict(3, || self.project_lane_once(&events, now))
                .await
                .map_err(|e| Failure::from_sqlx(&e))?;
        tally.emit(events.len(), Utc::now());
        Ok(applied)
    }

    /// One attempt of [`Self::project_lane`]: the lane in one transaction, committed.
    async fn project_lane_once(
        &self,
        events: &[&Projection],
        now: NaiveDateTime,
    ) -> Result<(Vec<Applied>, Tally), sqlx::Error> {
        let mut tx = stocksvr_store::deadline::begin(&self.pool).await?;
        let mut tally = Tally::default();
        let applied = match self.apply_all(&mut tx, events, now, &mut tally).await? {
            Some(applied) => applied,
            None => {
                // Rare (a rebalance, ids the collation equates): redo the lane the slow way,
                // which needs no prediction, rather than guess what the other consumer did.
                tracing::info!("batch raced another writer; applying it event by event");
                tx.rollback().deadline().await?;
                tx = stocksvr_store::deadline::begin(&self.pool).await?;
                tally = Tally::default();
                self.apply_each(&mut tx, events, now, &mut tally).await?
            }
        };
        // Dropping the transaction on any error above rolls back the whole lane, so no part
        // of it is durable when the lane or the loop runs it again.
        tx.commit().deadline().await?;
        Ok((applied, tally))
    }

    /// The whole batch with one statement per table (chunked only past
    /// `store::ROWS_PER_STATEMENT` rows), with the outcome and tally each event would have
    /// had applied on its own in batch order ([`plan`]). One outcome per projection, in
    /// order. `None`: the database did not do what the plan predicted (another consumer
    /// wrote meanwhile); the transaction must be rolled back.
    async fn apply_all(
        &self,
        conn: &mut MySqlConnection,
        batch: &[&Projection],
        now: NaiveDateTime,
        tally: &mut Tally,
    ) -> Result<Option<Vec<Applied>>, sqlx::Error> {
        if batch.is_empty() {
            return Ok(Some(Vec::new()));
        }
        let ops: Vec<&str> = batch
            .iter()
            .map(|p| p.ledger.operation_id.as_str())
            .collect();
        let booked = store::booked(conn, &ops).await?;
        let claims = plan::claims(&ops, &booked);
        let claimed: Vec<&Projection> = batch
            .iter()
            .zip(&claims)
            .filter_map(|(p, claim)| claim.then_some(*p))
            .collect();
        if claimed.is_empty() {
            tally_duplicates(&claims, tally);
            return Ok(Some(vec![Applied::Duplicate; batch.len()]));
        }
        let ledger: Vec<&LedgerRow> = claimed.iter().map(|p| &p.ledger).collect();
        if store::book_all(conn, &ledger, now).await? != claimed.len() as u64 {
            return Ok(None);
        }

        let rows: Vec<&SnapshotRow> = claimed.iter().filter_map(|p| p.snapshot.as_ref()).collect();
        let mut buckets: Vec<&str> = rows.iter().map(|r| r.stock_bucket_id.as_str()).collect();
        buckets.sort_unstable();
        buckets.dedup();
        let stored = store::snapshot_versions(conn, &buckets).await?;
        let snapshots = plan::snapshots(&stored, &rows);
        if store::write_snapshots(conn, &snapshots.writes, now).await?
            != snapshots.expected_rows_affected()
        {
            return Ok(None);
        }

        let syncs = plan::syncs(claimed.iter().filter_map(|p| p.sync));
        if !syncs.is_empty() {
            let found = store::sync_all(conn, &syncs).await?;
            if found < syncs.len() as u64 {
                tracing::debug!(
                    missing = syncs.len() as u64 - found,
                    "reservations to sync not in this database"
                );
            }
        }

        // The tally as the per-event path counts it, event by event in batch order.
        tally_duplicates(&claims, tally);
        for outcome in &snapshots.outcomes {
            if *outcome == SnapshotWrite::Stale {
                tally.stale();
            }
        }
        for p in &claimed {
            tally.projected(p.kind, p.occurred_at);
        }
        Ok(Some(
            claims
                .iter()
                .map(|claim| {
                    if *claim {
                        Applied::Applied
                    } else {
                        Applied::Duplicate
                    }
                })
                .collect(),
        ))
    }

    /// The batch one event at a time: the fallback of a batch [`Self::apply_all`] could not
    /// predict. One outcome per projection, in order.
    async fn apply_each(
        &self,
        conn: &mut MySqlConnection,
        batch: &[&Projection],
        now: NaiveDateTime,
        tally: &mut Tally,
    ) -> Result<Vec<Applied>, sqlx::Error> {
        let mut buckets: Vec<&str> = batch
            .iter()
            .filter_map(|p| p.snapshot.as_ref())
            .map(|s| s.stock_bucket_id.as_str())
            .collect();
        buckets.sort_unstable();
        buckets.dedup();
        let mut existing = store::existing_buckets(conn, &buckets).await?;
        let mut applied = Vec::with_capacity(batch.len());
        for p in batch {
            applied.push(self.apply(conn, p, now, &mut existing, tally).await?);
        }
        Ok(applied)
    }

    /// One event inside the batch transaction ([`Self::apply_each`]).
    #[tracing::instrument(skip_all, fields(event_id = %p.event_id, operation_id = %p.ledger.operation_id, redis_version = ?p.ledger.redis_version))]
    async fn apply(
        &self,
        conn: &mut MySqlConnection,
        p: &Projection,
        now: NaiveDateTime,
        existing: &mut HashSet<String>,
        tally: &mut Tally,
    ) -> Result<Applied, sqlx::Error> {
        if !store::book(conn, &p.ledger, now).await? {
            tally.duplicate();
            return Ok(Applied::Duplicate);
        }
        if let Some(row) = &p.snapshot {
            let existed = existing.contains(&row.stock_bucket_id);
            match store::advance_snapshot(conn, row, existed, now).await? {
                SnapshotWrite::Created | SnapshotWrite::Advanced => {}
                SnapshotWrite::Stale => {
                    tally.stale();
                    tracing::debug!("older than the snapshot; snapshot kept");
                }
            }
            existing.insert(row.stock_bucket_id.clone());
        }
        if let Some(sync) = p.sync {
            if !store::sync_reservation(conn, sync).await? {
                tracing::debug!(
                    reservation_id = sync.reservation_id,
                    "no such reservation to sync"
                );
            }
        }
        tally.projected(p.kind, p.occurred_at);
        Ok(Applied::Applied)
    }
}

/// Positions of `valid` by lane: all events of one bucket in one lane, in batch order, so
/// each lane's plan sees every event of its buckets exactly as the whole batch would.
fn lanes(valid: &[&Projection], lanes: usize) -> Vec<Vec<usize>> {
    let lanes = lanes.max(1);
    let mut out: Vec<Vec<usize>> = vec![Vec::new(); lanes];
    for (i, p) in valid.iter().enumerate() {
        out[lane_of(&p.ledger.stock_bucket_id, lanes)].push(i);
    }
    out
}

/// The lane of `bucket`'s events among `lanes`: FNV-1a of the bucket id, cheap and spread
/// over ids that differ in a digit or two (dishes of one merchant on one day).
pub fn lane_of(bucket: &str, lanes: usize) -> usize {
    let hash = stocksvr_core::ids::fnv1a64(bucket.as_bytes());
    (hash % lanes.max(1) as u64) as usize
}

fn tally_duplicates(claims: &[bool], tally: &mut Tally) {
    for _ in claims.iter().filter(|claim| !**claim) {
        tally.duplicate();
    }
}

impl Handler for Projector {
    fn handle<'a>(
        &'a self,
        batch: &'a [Record],
    ) -> BoxFuture<'a, Result<Vec<Result<Applied, Failure>>, Failure>> {
        self.project(batch).boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::lane_of;

    #[test]
    fn every_lane_gets_buckets_of_one_merchant_and_day_and_one_lane_takes_all() {
        for lanes in [2, 3, 4] {
            let mut seen = vec![0; lanes];
            for dish in 90_001..90_101 {
                let lane = lane_of(&format!("bucket_10001_{dish}_20260726"), lanes);
                seen[lane] += 1;
            }
            assert!(
                seen.iter().all(|&n| n >= 100 / lanes / 2),
                "{lanes} lanes: {seen:?}"
            );
        }
        assert_eq!(lane_of("bucket_10001_90001_20260726", 1), 0);
    }
}
