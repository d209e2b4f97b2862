//! The work in flight of a chunk of buckets, read before their sums: unfinished and dead
//! stock operations, stock-change events not yet sent, and those sent but not yet booked by
//! the projector, with each bucket's snapshot. Any of them means MySQL may lag Redis.

use super::{in_list, MysqlViews, SnapshotView};
use crate::deadline::Deadline;
use crate::one_off::{in_list_of, OneOff};
use sqlx::mysql::MySqlRow;
use sqlx::{MySql, MySqlPool, QueryBuilder, Row};
use stocksvr_core::codes::{OpCode, OutboxStatus, StoredCode, WalAction, WalEffect, WalStatus};

/// The snapshots, stock operations and unsent or unbooked events of `buckets`: everything
/// [`super::mysql_views`] reads but the sums.
pub(super) async fn work_in_flight(
    pool: &MySqlPool,
    buckets: &[String],
    views: &mut MysqlViews,
) -> Result<(), sqlx::Error> {
    // One async level for the four statements: the stock operations' executor awaits these
    // views (a rebuild), and every future nested below it counts against the compiler's
    // depth limit of the processors that drive stock operations.
    for row in snapshots(buckets)
        .one_off()
        .fetch_all(pool)
        .deadline()
        .await?
    {
        views
            .snapshots
            .insert(row.try_get("stock_bucket_id")?, snapshot(&row)?);
    }
    for row in stock_operations(buckets)
        .one_off()
        .fetch_all(pool)
        .deadline()
        .await?
    {
        count_stock_operations(&row, views)?;
    }
    for row in unsent_events(buckets)
        .one_off()
        .fetch_all(pool)
        .deadline()
        .await?
    {
        views
            .outbox_unsent
            .insert(row.try_get("partition_key")?, row.try_get("n")?);
    }
    for row in unbooked_operations(buckets)
        .one_off()
        .fetch_all(pool)
        .deadline()
        .await?
    {
        views
            .wal_unbooked
            .insert(row.try_get("stock_bucket_id")?, row.try_get("n")?);
    }
    Ok(())
}

fn snapshots(buckets: &[String]) -> QueryBuilder<'_, MySql> {
    let mut q = QueryBuilder::<MySql>::new(
        "SELECT stock_bucket_id, total_stock, available_stock, reserved_stock, sold_stock, \
         deficit_stock, redis_version FROM dish_stock_snapshot WHERE stock_bucket_id IN ",
    );
    in_list(&mut q, buckets);
    q
}

fn snapshot(row: &MySqlRow) -> Result<SnapshotView, sqlx::Error> {
    Ok(SnapshotView {
        total: row.try_get("total_stock")?,
        available: row.try_get("available_stock")?,
        reserved: row.try_get("reserved_stock")?,
        sold: row.try_get("sold_stock")?,
        deficit: row.try_get("deficit_stock")?,
        redis_version: row.try_get("redis_version")?,
    })
}

/// INIT, EXECUTING and RETRY are unfinished; DEAD needs an operator. A repair or rebuild row
/// is the reconciler's own work and counts like any other. A succeeded INIT says the bucket
/// was built once.
fn stock_operations(buckets: &[String]) -> QueryBuilder<'_, MySql> {
    let mut q = QueryBuilder::<MySql>::new(
        "SELECT stock_bucket_id, status, COUNT(*) AS n, CAST(COALESCE(SUM(action = ",
    );
    q.push_bind(WalAction::InitBucket.code())
        .push(" AND status = ")
        .push_bind(WalStatus::Succeeded.code())
        .push("), 0) AS SIGNED) AS built FROM inventory_operation_wal WHERE stock_bucket_id IN ");
    in_list(&mut q, buckets);
    q.push(" GROUP BY stock_bucket_id, status");
    q
}

/// Adds one row of [`stock_operations`] (a bucket's operations in one status) to `views`.
fn count_stock_operations(row: &MySqlRow, views: &mut MysqlViews) -> Result<(), sqlx::Error> {
    let bucket: String = row.try_get("stock_bucket_id")?;
    let status = WalStatus::from_code(row.try_get("status")?);
    let n: i64 = row.try_get("n")?;
    let built: i64 = row.try_get("built")?;
    match status {
        Some(WalStatus::Init | WalStatus::Executing | WalStatus::Retry) => {
            *views.wal_unfinished.entry(bucket.clone()).or_default() += n
        }
        Some(WalStatus::Dead) => *views.wal_dead.entry(bucket.clone()).or_default() += n,
        Some(WalStatus::Succeeded) | None => {}
    }
    if built > 0 {
        views.built.insert(bucket, true);
    }
    Ok(())
}

/// Unsent rows are few (the relay keeps the backlog near zero): PENDING rows above the
/// relay's high-water mark (a primary-key range; the rows below it stay PENDING once
/// published) and the SENDING/RETRY range of idx_publish, filtered by key.
fn unsent_events(buckets: &[String]) -> QueryBuilder<'_, MySql> {
    let mut q = QueryBuilder::<MySql>::new(
        "SELECT partition_key, COUNT(*) AS n FROM ( \
           SELECT o.partition_key FROM inventory_outbox_relay c \
             JOIN inventory_outbox o FORCE INDEX (PRIMARY) ON o.id > c.hwm \
             WHERE c.id = 1 AND o.status = ",
    );
    q.push_bind(OutboxStatus::Pending.code()).push(
        " UNION ALL \
           SELECT partition_key FROM inventory_outbox FORCE INDEX (idx_publish) \
             WHERE status IN ",
    );
    in_list_of(
        &mut q,
        OutboxStatus::codes(&[OutboxStatus::Sending, OutboxStatus::Retry]),
    );
    q.push(") u WHERE partition_key IN ");
    in_list(&mut q, buckets);
    q.push(" GROUP BY partition_key");
    q
}

/// The stock operations whose script changed a bucket (an INIT that created it, an ADJUST,
/// REPAIR or REBUILD that succeeded).
const CHANGING: [WalAction; 4] = [
    WalAction::InitBucket,
    WalAction::Adjust,
    WalAction::Repair,
    WalAction::Rebuild,
];

/// Stock operations that changed the bucket and have no ledger row yet: their event is on its
/// way to the projector, so the ledger's sums lag Redis.
fn unbooked_operations(buckets: &[String]) -> QueryBuilder<'_, MySql> {
    let mut q = QueryBuilder::<MySql>::new(
        "SELECT w.stock_bucket_id, COUNT(*) AS n FROM inventory_operation_wal w WHERE w.status = ",
    );
    q.push_bind(WalStatus::Succeeded.code())
        .push(" AND w.action IN ");
    in_list_of(&mut q, WalAction::codes(&CHANGING));
    q.push(" AND JSON_VALUE(w.result_payload, '$.outcome') = ")
        .push_bind(OpCode::Succeeded.name())
        .push(" AND (w.action <> ")
        .push_bind(WalAction::InitBucket.code())
        .push(" OR JSON_VALUE(w.result_payload, '$.effect') = ")
        .push_bind(WalEffect::Initialized.name())
        .push(
            ") AND NOT EXISTS (SELECT 1 FROM inventory_ledger l \
             WHERE l.operation_id = w.operation_id) AND w.stock_bucket_id IN ",
        );
    in_list(&mut q, buckets);
    q.push(" GROUP BY w.stock_bucket_id");
    q
}
