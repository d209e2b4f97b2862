//! The first half of a stock operation: the WAL row written in one transaction with the
//! baseline change it executes (init, adjust, close, archive) or alone (repair, rebuild).

use super::{find_by_op, insert_ignore, NewWal, Refusal, WalRow};
use crate::baselines::{insert_baseline, read_baseline, Baseline};
use crate::clock::now;
use crate::deadline::Deadline;
use sqlx::{MySql, MySqlPool, Transaction};
use stocksvr_core::bucket::BucketState;

/// The bucket's baseline, locked for the rest of the transaction; refused when missing.
async fn locked_baseline(
    tx: &mut Transaction<'_, MySql>,
    bucket: &str,
) -> Result<Baseline, Refusal> {
    read_baseline(&mut **tx, bucket, true)
        .await?
        .ok_or_else(|| Refusal::NoBaseline(bucket.to_string()))
}

/// Writes `wal` (a repeat of the same operation id finds the row the first call wrote),
/// commits, and returns the stored row.
async fn write_and_commit(mut tx: Transaction<'_, MySql>, wal: &NewWal) -> Result<WalRow, Refusal> {
    insert_ignore(&mut tx, wal).await?;
    let row = find_by_op(&mut *tx, &wal.operation_id)
        .await?
        .ok_or(Refusal::Mysql(sqlx::Error::RowNotFound))?;
    tx.commit().deadline().await?;
    Ok(row)
}

/// Creates the baseline (if missing) and the INIT_BUCKET WAL row of its version in one
/// transaction (docs/design.md, daily buckets and their lifecycle). The WAL row is built by
/// `wal` from the baseline as stored, so an existing baseline keeps its values. Returns the
/// stored baseline and whether the WAL row is new.
pub async fn begin_init<F>(
    pool: &MySqlPool,
    b: &Baseline,
    wal: F,
) -> Result<(Baseline, bool), sqlx::Error>
where
    F: FnOnce(&Baseline) -> NewWal,
{
    let mut tx = crate::deadline::begin(pool).await?;
    insert_baseline(&mut *tx, b).await?;
    // A plain read, not FOR UPDATE: twenty concurrent lazy inits each hold a shared lock
    // from the INSERT IGNORE above, and upgrading them would deadlock. A concurrent adjust
    // is harmless here: the executor initialises from the baseline current at run time.
    let stored = read_baseline(&mut *tx, &b.stock_bucket_id, false)
        .await?
        .ok_or(sqlx::Error::RowNotFound)?;
    let new = insert_ignore(&mut tx, &wal(&stored)).await?;
    tx.commit().deadline().await?;
    Ok((stored, new))
}

/// A merchant adjustment, first half (docs/design.md, adjustments and deficit): bumps the
/// baseline version, stores the new total and writes the ADJUST WAL row, in one transaction
/// under the baseline's row lock, so adjusts of one bucket get distinct, ordered versions.
/// Returns the baseline before the change and the WAL row.
pub async fn begin_adjust<F>(
    pool: &MySqlPool,
    bucket: &str,
    new_total: i64,
    wal: F,
) -> Result<(Baseline, WalRow), Refusal>
where
    F: FnOnce(&Baseline) -> NewWal,
{
    let mut tx = crate::deadline::begin(pool).await?;
    let before = locked_baseline(&mut tx, bucket).await?;
    if before.state() == Some(BucketState::Archived) {
        return Err(Refusal::Archived(bucket.to_string()));
    }
    sqlx::query(
        "UPDATE dish_stock_baseline SET total_stock = ?, baseline_version = baseline_version + 1, \
         updated_at = ? WHERE stock_bucket_id = ?",
    )
    .bind(new_total)
    .bind(now())
    .bind(bucket)
    .execute(&mut *tx)
    .deadline()
    .await?;
    let row = write_and_commit(tx, &wal(&before)).await?;
    Ok((before, row))
}

/// Closing a bucket, first half: new Trys are refused from the moment this commits (the Try
/// path reads the baseline status); the CLOSE WAL row then carries the state to Redis, where
/// a Try already past the baseline check is refused by the script.
pub async fn begin_close(pool: &MySqlPool, bucket: &str, wal: NewWal) -> Result<WalRow, Refusal> {
    let mut tx = crate::deadline::begin(pool).await?;
    let b = locked_baseline(&mut tx, bucket).await?;
    if b.state() == Some(BucketState::Archived) {
        return Err(Refusal::Archived(bucket.to_string()));
    }
    sqlx::query(
        "UPDATE dish_stock_baseline SET bucket_status = ?, updated_at = ? \
         WHERE stock_bucket_id = ? AND bucket_status = ?",
    )
    .bind(BucketState::Closed.code())
    .bind(now())
    .bind(bucket)
    .bind(BucketState::Open.code())
    .execute(&mut *tx)
    .deadline()
    .await?;
    write_and_commit(tx, &wal).await
}

/// Archiving, first half: only a CLOSED bucket without unfinished reservations. The bucket
/// is CLOSED, so no new reservation can appear in it (a Try racing the close is refused by
/// the script, never left open).
pub async fn begin_archive(pool: &MySqlPool, bucket: &str, wal: NewWal) -> Result<WalRow, Refusal> {
    let mut tx = crate::deadline::begin(pool).await?;
    let b = locked_baseline(&mut tx, bucket).await?;
    if b.state() == Some(BucketState::Open) {
        return Err(Refusal::NotClosed {
            bucket: bucket.to_string(),
            status: BucketState::Open.name(),
        });
    }
    let open = crate::buckets::count_open_reservations(&mut *tx, bucket).await?;
    if open > 0 {
        return Err(Refusal::OpenReservations {
            bucket: bucket.to_string(),
            open,
        });
    }
    write_and_commit(tx, &wal).await
}

/// A repair or rebuild row: written as it is (idempotent on its operation id, which the
/// caller derives from what it repairs), no baseline change. Returns the stored row.
pub async fn begin_operation(pool: &MySqlPool, wal: NewWal) -> Result<WalRow, Refusal> {
    let mut tx = crate::deadline::begin(pool).await?;
    if read_baseline(&mut *tx, &wal.stock_bucket_id, false)
        .await?
        .is_none()
    {
        return Err(Refusal::NoBaseline(wal.stock_bucket_id.clone()));
    }
    write_and_commit(tx, &wal).await
}
