//! Snowflake worker ids leased from MySQL, so two running instances never share one.
//!
//! An instance claims the first worker id whose lease is free or expired and renews it
//! well within the TTL. If a renewal finds the lease taken (the instance stalled longer than
//! the TTL), the holder must stop minting ids: [`WorkerLease::renew`] says so.

use crate::deadline::Deadline;
use chrono::{TimeDelta, Utc};
use sqlx::MySqlPool;

/// Worker ids a 10-bit snowflake field can hold.
pub const WORKER_IDS: u16 = 1024;

#[derive(Debug, Clone)]
pub struct WorkerLease {
    pub worker_id: u16,
    pub owner: String,
    pub ttl: TimeDelta,
}

#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error("mysql: {0}")]
    Mysql(#[from] sqlx::Error),
    #[error("all {WORKER_IDS} snowflake worker ids are leased")]
    Exhausted,
    #[error("worker id {0} was taken over by another instance; stop minting ids")]
    Lost(u16),
}

impl WorkerLease {
    /// Claims a free worker id for `owner` (unique per process, e.g. host:pid:start time).
    pub async fn acquire(
        pool: &MySqlPool,
        owner: &str,
        ttl: TimeDelta,
    ) -> Result<Self, LeaseError> {
        for worker_id in 0..WORKER_IDS {
            if claim(pool, worker_id, owner, ttl).await? {
                return Ok(Self {
                    worker_id,
                    owner: owner.to_string(),
                    ttl,
                });
            }
        }
        Err(LeaseError::Exhausted)
    }

    /// Extends the lease; `Lost` when another owner holds it now.
    pub async fn renew(&self, pool: &MySqlPool) -> Result<(), LeaseError> {
        let now = Utc::now().naive_utc();
        let done = sqlx::query(
            "UPDATE snowflake_worker_lease SET lease_expire_at = ?, updated_at = ? WHERE worker_id = ? AND lease_owner = ?",
        )
        .bind(now + self.ttl)
        .bind(now)
        .bind(self.worker_id)
        .bind(&self.owner)
        .execute(pool)
    .deadline()
        .await?;
        if done.rows_affected() == 1 {
            Ok(())
        } else {
            Err(LeaseError::Lost(self.worker_id))
        }
    }

    /// Gives the id back at shutdown so a restart does not wait for the TTL.
    pub async fn release(&self, pool: &MySqlPool) -> Result<(), LeaseError> {
        sqlx::query("DELETE FROM snowflake_worker_lease WHERE worker_id = ? AND lease_owner = ?")
            .bind(self.worker_id)
            .bind(&self.owner)
            .execute(pool)
            .deadline()
            .await?;
        Ok(())
    }
}

/// Inserts the row, or takes it over only if its lease expired; true when `owner` holds it.
/// Two single statements, no explicit transaction: a locking read of an absent row takes gap
/// locks, and concurrent claimers then deadlock each other on the insert.
async fn claim(
    pool: &MySqlPool,
    worker_id: u16,
    owner: &str,
    ttl: TimeDelta,
) -> Result<bool, sqlx::Error> {
    let now = Utc::now().naive_utc();
    let inserted = sqlx::query(
        "INSERT IGNORE INTO snowflake_worker_lease (worker_id, lease_owner, lease_expire_at, updated_at) VALUES (?, ?, ?, ?)",
    )
    .bind(worker_id)
    .bind(owner)
    .bind(now + ttl)
    .bind(now)
    .execute(pool)
    .deadline()
    .await?;
    if inserted.rows_affected() == 1 {
        return Ok(true);
    }
    let taken = sqlx::query(
        "UPDATE snowflake_worker_lease SET lease_owner = ?, lease_expire_at = ?, updated_at = ? \
         WHERE worker_id = ? AND (lease_expire_at < ? OR lease_owner = ?)",
    )
    .bind(owner)
    .bind(now + ttl)
    .bind(now)
    .bind(worker_id)
    .bind(now)
    .bind(owner)
    .execute(pool)
    .deadline()
    .await?;
    Ok(taken.rows_affected() == 1)
}
