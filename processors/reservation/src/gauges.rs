//! Work that should not stay where it is, read from MySQL (docs/metrics.md): reservations per
//! intermediate status with the age of the oldest, and the operation WAL's unfinished rows
//! with the age of the oldest, per action. Dead rows count too: they stay where they are until
//! an operator retries them, and the age is what tells an on-call for how long.
//!
//! Each is one statement over an index whose range holds only unfinished work, so it is cheap
//! at any table size. The reservation gauges run on a fixed cadence ([`run`]); the WAL
//! worker refreshes its gauges after each round ([`refresh_wal`]).
//!
//! Ages use the clock the rows were written with (the services write `Utc::now()`), not the
//! database's, so a MariaDB in another time zone cannot shift them.

use crate::ServiceError;
use chrono::{NaiveDateTime, Utc};
use sqlx::MySqlPool;
use std::sync::Arc;
use std::time::Duration;
use stocksvr_core::reservation::ReservationStatus;
use stocksvr_pipeline::periodic::{self, Cadence, Round};
use stocksvr_store::deadline::Deadline;
use stocksvr_store::wal::{WalAction, WalStatus};
use stocksvr_telemetry::names;
use tokio::sync::watch;

/// How often [`run`] reads the reservation gauges: below a scrape interval's worth of
/// staleness at the usual 15 s, one cheap statement per round.
pub const INTERVAL: Duration = Duration::from_secs(10);

/// The `status` label of CREATED_RESERVED rows past their processing_time (a scheduled
/// confirm the time wheel and the scan have not made yet).
pub const OVERDUE: &str = "CREATED_RESERVED_OVERDUE";

/// The statuses the recovery worker resumes, in the order the gauges report them.
const RESUMABLE: [ReservationStatus; 4] = [
    ReservationStatus::Preparing,
    ReservationStatus::Confirming,
    ReservationStatus::Canceling,
    ReservationStatus::Refunding,
];

/// One gauge pair: how many rows, and the age of the oldest (zero when none).
#[derive(Debug, Clone, PartialEq)]
pub struct Backlog {
    pub label: &'static str,
    pub rows: u64,
    pub oldest: Duration,
}

/// Elapsed from `since` to `now`; zero for a time in the future (a clock behind).
fn age(now: NaiveDateTime, since: Option<NaiveDateTime>) -> Duration {
    since
        .and_then(|s| (now - s).to_std().ok())
        .unwrap_or(Duration::ZERO)
}

/// Folds `(code, rows, oldest)` rows into one [`Backlog`] per label of `labels`, in order;
/// a label without a row has 0 rows and age 0, a code not in `labels` is ignored.
fn fold(
    labels: &[(i8, &'static str)],
    rows: &[(i8, i64, Option<NaiveDateTime>)],
    now: NaiveDateTime,
) -> Vec<Backlog> {
    labels
        .iter()
        .map(|(code, label)| {
            let row = rows.iter().find(|(c, _, _)| c == code);
            Backlog {
                label,
                rows: row.map_or(0, |(_, n, _)| u64::try_from(*n).unwrap_or(0)),
                oldest: age(now, row.and_then(|(_, _, since)| *since)),
            }
        })
        .collect()
}

/// The labels of the reservation gauges by status code; CREATED_RESERVED stands for the
/// overdue ones only (the statement selects no others).
fn intermediate_labels() -> Vec<(i8, &'static str)> {
    let mut labels: Vec<(i8, &'static str)> = RESUMABLE
        .iter()
        .map(|s| (s.code() as i8, s.name()))
        .collect();
    labels.push((ReservationStatus::CreatedReserved.code() as i8, OVERDUE));
    labels
}

/// Reads the reservation gauges in one statement. PREPARING ages from `created_at` (the row
/// is inserted in it); CONFIRMING, CANCELING and REFUNDING from `updated_at`, which their
/// step sets on entry but a failed recovery attempt also moves (the row has no column of its
/// own for the time it entered its status); overdue rows from `processing_time`.
///
/// Plans (MariaDB 10.11, EXPLAIN): a range over an index that begins with `status`
/// (`idx_expire_scan` or `idx_state_retry`) for the four statuses, which holds only work in
/// flight; `idx_schedule_scan (status, processing_time)` for the overdue rows.
pub async fn read_intermediate(
    pool: &sqlx::MySqlPool,
    now: NaiveDateTime,
) -> Result<Vec<Backlog>, sqlx::Error> {
    let [preparing, confirming, canceling, refunding] = RESUMABLE.map(|s| s.code() as i8);
    let created_reserved = ReservationStatus::CreatedReserved.code() as i8;
    let rows: Vec<(i8, i64, Option<NaiveDateTime>)> = sqlx::query_as(
        "SELECT status, COUNT(*), MIN(CASE WHEN status = ? THEN created_at ELSE updated_at END) \
         FROM inventory_reservation WHERE status IN (?, ?, ?, ?) GROUP BY status \
         UNION ALL \
         SELECT ?, COUNT(*), MIN(processing_time) FROM inventory_reservation \
         WHERE status = ? AND processing_time < ?",
    )
    .bind(preparing)
    .bind(preparing)
    .bind(confirming)
    .bind(canceling)
    .bind(refunding)
    .bind(created_reserved)
    .bind(created_reserved)
    .bind(now)
    .fetch_all(pool)
    .deadline()
    .await?;
    Ok(fold(&intermediate_labels(), &rows, now))
}

/// Reads and sets `stocksvr_reservations_intermediate{status}` and its `_oldest_seconds`.
pub async fn refresh_intermediate(pool: &sqlx::MySqlPool) -> Result<Vec<Backlog>, sqlx::Error> {
    let gauges = read_intermediate(pool, Utc::now().naive_utc()).await?;
    for g in &gauges {
        metrics::gauge!(names::RESERVATIONS_INTERMEDIATE, "status" => g.label).set(g.rows as f64);
        metrics::gauge!(names::RESERVATIONS_INTERMEDIATE_OLDEST_SECONDS, "status" => g.label)
            .set(g.oldest.as_secs_f64());
    }
    Ok(gauges)
}

/// Every WAL action the code knows, with its label (`WalAction::name`).
fn wal_labels() -> Vec<(i8, &'static str)> {
    (i8::MIN..=i8::MAX)
        .filter_map(|code| WalAction::from_code(code).map(|a| (code, a.name())))
        .collect()
}

/// Reads the WAL gauges in one statement: rows not SUCCEEDED, by action, and the oldest
/// `created_at` (a WAL row is one operation, so its age is the operation's). A range over
/// `idx_retry (status, next_retry_at)`, whose unfinished statuses hold only unfinished rows.
pub async fn read_wal(
    pool: &sqlx::MySqlPool,
    now: NaiveDateTime,
) -> Result<Vec<Backlog>, sqlx::Error> {
    let rows: Vec<(i8, i64, Option<NaiveDateTime>)> = sqlx::query_as(
        "SELECT action, COUNT(*), MIN(created_at) FROM inventory_operation_wal \
         WHERE status IN (?, ?, ?, ?) GROUP BY action",
    )
    .bind(WalStatus::Init as i8)
    .bind(WalStatus::Executing as i8)
    .bind(WalStatus::Retry as i8)
    .bind(WalStatus::Dead as i8)
    .fetch_all(pool)
    .deadline()
    .await?;
    Ok(fold(&wal_labels(), &rows, now))
}

/// Reads and sets `stocksvr_wal_backlog{action}` and `stocksvr_wal_oldest_seconds{action}`.
pub async fn refresh_wal(pool: &sqlx::MySqlPool) -> Result<Vec<Backlog>, sqlx::Error> {
    let gauges = read_wal(pool, Utc::now().naive_utc()).await?;
    for g in &gauges {
        metrics::gauge!(names::WAL_BACKLOG, "action" => g.label).set(g.rows as f64);
        metrics::gauge!(names::WAL_OLDEST_SECONDS, "action" => g.label).set(g.oldest.as_secs_f64());
    }
    Ok(gauges)
}

/// Refreshes the reservation gauges every `every` until `stop`, read through the MySQL pool
/// `source` holds (the reservation service's). A failed read keeps the last values (logged);
/// nothing here is fatal.
pub async fn run<S: AsRef<MySqlPool>>(
    source: Arc<S>,
    every: Duration,
    stop: watch::Receiver<bool>,
) -> Result<(), ServiceError> {
    periodic::run(
        "reservation gauges",
        Cadence::fixed(every),
        None,
        stop,
        || async {
            if let Err(e) = refresh_intermediate((*source).as_ref()).await {
                tracing::warn!(error = %e, "reading the intermediate reservations failed");
                return Ok(Round::Failed);
            }
            Ok(Round::Partial)
        },
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeDelta;

    fn at(secs: i64) -> NaiveDateTime {
        NaiveDateTime::default() + TimeDelta::seconds(secs)
    }

    #[test]
    fn every_label_is_reported_and_absent_ones_are_zero() {
        let labels = intermediate_labels();
        let rows = [(30, 2, Some(at(100))), (25, 1, Some(at(50)))];
        let got = fold(&labels, &rows, at(160));
        let want = [
            ("PREPARING", 0, 0),
            ("CONFIRMING", 2, 60),
            ("CANCELING", 0, 0),
            ("REFUNDING", 0, 0),
            (OVERDUE, 1, 110),
        ];
        assert_eq!(got.len(), want.len());
        for (g, (label, rows, secs)) in got.iter().zip(want) {
            assert_eq!(
                (g.label, g.rows, g.oldest),
                (label, rows, Duration::from_secs(secs))
            );
        }
    }

    #[test]
    fn a_time_ahead_of_the_clock_is_age_zero_and_unknown_codes_are_ignored() {
        let got = fold(
            &[(1, "A")],
            &[(1, 3, Some(at(10))), (9, 7, Some(at(0)))],
            at(5),
        );
        assert_eq!(
            got,
            [Backlog {
                label: "A",
                rows: 3,
                oldest: Duration::ZERO
            }]
        );
    }

    #[test]
    fn the_labels_are_the_catalogs() {
        let catalog = |name: &str| {
            stocksvr_telemetry::CATALOG
                .iter()
                .find(|m| m.name == name)
                .map(|m| m.labels[0].values.to_vec())
                .unwrap_or_default()
        };
        let statuses = catalog(names::RESERVATIONS_INTERMEDIATE);
        let ours: Vec<&str> = intermediate_labels().iter().map(|(_, l)| *l).collect();
        assert_eq!(ours, statuses, "one series per declared status, no other");
        let actions = catalog(names::WAL_BACKLOG);
        for (_, action) in wal_labels() {
            assert!(actions.contains(&action), "{action} is not declared");
        }
        assert!(wal_labels().len() >= 5);
    }
}
