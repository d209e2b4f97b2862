//! Snowflake worker ids leased from MySQL, so two running instances never share one.
//!
//! An instance claims the first worker id whose lease is free or expired and renews it
//! well within the TTL. If a renewal finds the lease taken (the instance stalled longer than
//! the TTL), the holder must stop minting ids: [`WorkerLease::renew`] says so.

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
            .await?;
        Ok(())
    }
}

/// Inserts the row, or takes it over only if its lease expired; true when `owner` holds it.
async fn claim(
    pool: &MySqlPool,
    worker_id: u16,
    owner: &str,
    ttl: TimeDelta,
) -> Result<bool, sqlx::Error> {
    let now = Utc::now().naive_utc();
    let mut tx = pool.begin().await?;
    let current: Option<(String, chrono::NaiveDateTime)> = sqlx::query_as(
        "SELECT lease_owner, lease_expire_at FROM snowflake_worker_lease WHERE worker_id = ? FOR UPDATE",
    )
    .bind(worker_id)
    .fetch_optional(&mut *tx)
    .await?;
    let free = match &current {
        None => true,
        Some((holder, expires)) => holder == owner || *expires < now,
    };
    if !free {
        tx.rollback().await?;
        return Ok(false);
    }
    let written = sqlx::query(
        "INSERT INTO snowflake_worker_lease (worker_id, lease_owner, lease_expire_at, updated_at) VALUES (?, ?, ?, ?) \
         ON DUPLICATE KEY UPDATE lease_owner = VALUES(lease_owner), lease_expire_at = VALUES(lease_expire_at), updated_at = VALUES(updated_at)",
    )
    .bind(worker_id)
    .bind(owner)
    .bind(now + ttl)
    .bind(now)
    .execute(&mut *tx)
    .await;
    match written {
        Ok(_) => {
            tx.commit().await?;
            Ok(true)
        }
        // Two instances inserting the same absent id: the loser moves on to the next id.
        Err(sqlx::Error::Database(db)) if db.is_unique_violation() => Ok(false),
        Err(e) => Err(e),
    }
}
