//! The shard leases of scheduled passes (`inventory_reconcile_shard`): an instance checks a
//! shard only while it holds the shard's lease, so several instances share the work and no
//! bucket is checked twice at once.

use chrono::{NaiveDateTime, TimeDelta};
use sqlx::{MySql, MySqlPool, QueryBuilder};
use stocksvr_store::clock::now;
use stocksvr_store::deadline::{self, Deadline};
use stocksvr_store::one_off::OneOff;

/// Makes sure shard rows 0..shards exist (idempotent).
pub async fn ensure_shards(pool: &MySqlPool, shards: u32) -> Result<(), sqlx::Error> {
    let mut q = QueryBuilder::<MySql>::new(
        "INSERT IGNORE INTO inventory_reconcile_shard (shard, lease_expire_at) ",
    );
    let epoch = NaiveDateTime::default();
    q.push_values(0..shards, |mut b, shard| {
        b.push_bind(shard).push_bind(epoch);
    });
    q.one_off().execute(pool).deadline().await?;
    Ok(())
}

/// Leases the shard checked longest ago that nobody holds, for `lease`. `None` when every
/// shard is held, or was checked less than `min_interval` ago and has no recheck due
/// ([`finish_shard`]).
///
/// The shard rows must exist ([`ensure_shards`]). Also says whether another shard was due
/// at the same time (`more`): a caller then comes back soon instead of after its idle sleep.
pub async fn claim_shard(
    pool: &MySqlPool,
    owner: &str,
    shards: u32,
    lease: TimeDelta,
    min_interval: TimeDelta,
) -> Result<Option<ShardClaim>, sqlx::Error> {
    let now = now();
    let mut tx = deadline::begin(pool).await?;
    let due: Vec<(u32,)> = sqlx::query_as(
        "SELECT shard FROM inventory_reconcile_shard WHERE shard < ? AND lease_expire_at < ? \
         AND (last_pass_at IS NULL OR last_pass_at < ? OR recheck_at <= ?) \
         ORDER BY last_pass_at IS NOT NULL, last_pass_at, shard LIMIT 2 FOR UPDATE SKIP LOCKED",
    )
    .bind(shards)
    .bind(now)
    .bind(now - min_interval)
    .bind(now)
    .fetch_all(&mut *tx)
    .deadline()
    .await?;
    let Some(&(shard,)) = due.first() else {
        tx.commit().deadline().await?;
        return Ok(None);
    };
    sqlx::query(
        "UPDATE inventory_reconcile_shard SET lease_owner = ?, lease_expire_at = ? WHERE shard = ?",
    )
    .bind(owner)
    .bind(now + lease)
    .bind(shard)
    .execute(&mut *tx)
    .deadline()
    .await?;
    tx.commit().deadline().await?;
    Ok(Some(ShardClaim {
        shard,
        more: due.len() > 1,
    }))
}

/// A leased shard, and whether another one was due too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardClaim {
    pub shard: u32,
    pub more: bool,
}

/// Extends `owner`'s lease of `shard` to `lease` from now. False when the shard is no longer
/// `owner`'s: its lease ran out (a stalled process) and another instance claimed it.
pub async fn renew_shard(
    pool: &MySqlPool,
    shard: u32,
    owner: &str,
    lease: TimeDelta,
) -> Result<bool, sqlx::Error> {
    let renewed = sqlx::query(
        "UPDATE inventory_reconcile_shard SET lease_expire_at = ? WHERE shard = ? AND lease_owner = ?",
    )
    .bind(now() + lease)
    .bind(shard)
    .bind(owner)
    .execute(pool)
    .deadline()
    .await?;
    if renewed.rows_affected() == 1 {
        return Ok(true);
    }
    // MariaDB counts changed rows: a renewal within the column's precision of the last one
    // changes nothing and still holds the lease.
    let holder: Option<Option<String>> =
        sqlx::query_scalar("SELECT lease_owner FROM inventory_reconcile_shard WHERE shard = ?")
            .bind(shard)
            .fetch_optional(pool)
            .deadline()
            .await?;
    Ok(holder.flatten().as_deref() == Some(owner))
}

/// Ends `owner`'s lease of `shard` and records the pass. With `recheck`, the shard is due
/// again that long after the pass whatever its interval: the pass left a suspicion for a
/// second look, or did not finish.
pub async fn finish_shard(
    pool: &MySqlPool,
    shard: u32,
    owner: &str,
    recheck: Option<TimeDelta>,
) -> Result<(), sqlx::Error> {
    let now = now();
    sqlx::query(
        "UPDATE inventory_reconcile_shard SET lease_owner = NULL, lease_expire_at = ?, \
         last_pass_at = ?, recheck_at = ? WHERE shard = ? AND lease_owner = ?",
    )
    .bind(now)
    .bind(now)
    .bind(recheck.map(|d| now + d))
    .bind(shard)
    .bind(owner)
    .execute(pool)
    .deadline()
    .await?;
    Ok(())
}
