//! The time wheel: Redis sorted sets scored by due time (see the crate docs for why Redis).
//!
//! ```text
//! shard  inv:{schedule:<namespace>:<n>}:due     n = reservation_id mod shards
//!        member = reservation id, score = processing_time in epoch milliseconds
//! ```
//!
//! Each shard is its own hash tag, so a cluster spreads the shards over slots and every
//! script touches one key. Entries are written with `ZADD NX`: arming an entry that exists
//! (possibly claimed, carrying its lease score) leaves it alone.

use crate::redis_conn::RedisConn;
use chrono::{DateTime, Utc};
use redis::{RedisError, Script};
use std::sync::Arc;
use std::time::Duration;

pub const CLAIM_LUA: &str = include_str!("../../../lua/wheel_claim.lua");
pub const RELEASE_LUA: &str = include_str!("../../../lua/wheel_release.lua");

/// `inv:{schedule:<namespace>:<shard>}:due`
pub fn shard_key(namespace: &str, shard: u16) -> String {
    format!("inv:{{schedule:{namespace}:{shard}}}:due")
}

/// A namespace that keeps the key inside one hash tag and readable in `redis-cli`.
pub fn check_namespace(namespace: &str) -> Result<(), String> {
    if namespace.is_empty()
        || namespace.len() > 64
        || !namespace
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return Err(format!(
            "schedule.wheel_namespace must be 1-64 characters of [A-Za-z0-9._-], got {namespace:?}"
        ));
    }
    Ok(())
}

/// What one claim took: the lease score the entries now carry and their members.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub lease: i64,
    pub members: Vec<String>,
}

/// What a poller's look at the wheel found ([`TimeWheel::peek`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peek {
    /// The shards worth a claim now.
    pub due: Vec<String>,
    /// How long until the earliest entry not due yet comes due, by the server's clock; None
    /// when no shard holds one, or in a cluster (each shard has its own clock there).
    pub next_due_in: Option<Duration>,
}

/// Handle on the wheel's shards. Cheap to clone; clones share [`TimeWheel::armed`].
#[derive(Clone)]
pub struct TimeWheel {
    conn: RedisConn,
    namespace: String,
    shards: u16,
    scripts: Arc<(Script, Script)>,
    armed: Arc<tokio::sync::Notify>,
}

impl std::fmt::Debug for TimeWheel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TimeWheel")
            .field("namespace", &self.namespace)
            .field("shards", &self.shards)
            .finish_non_exhaustive()
    }
}

impl TimeWheel {
    pub fn new(conn: impl Into<RedisConn>, namespace: &str, shards: u16) -> Result<Self, String> {
        check_namespace(namespace)?;
        if shards == 0 {
            return Err("schedule.shards must be at least 1".into());
        }
        Ok(Self {
            conn: conn.into(),
            namespace: namespace.to_string(),
            shards,
            scripts: Arc::new((Script::new(CLAIM_LUA), Script::new(RELEASE_LUA))),
            armed: Arc::new(tokio::sync::Notify::new()),
        })
    }

    /// Notified whenever this handle or a clone of it adds an entry: a poller in the same
    /// process that sleeps until the earliest entry it knew of wakes to look again, so an
    /// entry armed here for sooner than that fires on time. Entries armed by another process
    /// are seen at the poller's next look.
    pub fn armed(&self) -> Arc<tokio::sync::Notify> {
        self.armed.clone()
    }

    /// The shard holding `reservation_id`.
    pub fn key_for(&self, reservation_id: u64) -> String {
        // The remainder is below `shards`, a u16.
        shard_key(
            &self.namespace,
            (reservation_id % u64::from(self.shards)) as u16,
        )
    }

    /// Every shard, for the pollers.
    pub fn keys(&self) -> Vec<String> {
        (0..self.shards)
            .map(|s| shard_key(&self.namespace, s))
            .collect()
    }

    /// The shards worth a claim now (`due`): those whose earliest entry (due time, or the
    /// lease of a claimed entry) is at or before the server's clock; and how long until the
    /// earliest entry that is not due yet comes due (`next_due_in`, read in the same round
    /// trip), so an idle poller can sleep until then. A poller asks this every tick, so an
    /// idle wheel costs one round trip of plain reads (`TIME` and each shard's head) instead of
    /// one claim script per shard: 8 shards at 5 ticks a second were 40 script calls and 40
    /// round trips a second, the largest share of an idle `stocksvr all`'s wake-ups.
    ///
    /// Standalone only: the server's `TIME` in the same pipeline is the clock the claim script
    /// judges by, so the answer is exact as of that moment (an entry armed after it waits for
    /// the next tick, as it would after a claim). A cluster judges each shard by the clock of
    /// its own master, so there every shard is returned, each claim script decides, and
    /// `next_due_in` is `None`.
    pub async fn peek(&self) -> Result<Peek, RedisError> {
        let keys = self.keys();
        if self.conn.is_cluster() {
            return Ok(Peek {
                due: keys,
                next_due_in: None,
            });
        }
        let mut pipe = redis::pipe();
        pipe.cmd("TIME");
        for key in &keys {
            pipe.cmd("ZRANGE").arg(key).arg(0).arg(0).arg("WITHSCORES");
        }
        let mut conn = self.conn.clone();
        let mut replies: Vec<redis::Value> = pipe.query_async(&mut conn).await?;
        if replies.len() != keys.len() + 1 {
            return Err(RedisError::from((
                redis::ErrorKind::UnexpectedReturnType,
                "wheel peek answered a different number of replies",
            )));
        }
        let heads = replies.split_off(1);
        let (secs, micros): (i64, i64) = redis::from_redis_value(replies.remove(0))?;
        let now_ms = secs * 1000 + micros / 1000;
        let mut due = Vec::new();
        let mut next_ms: Option<i64> = None;
        for (key, head) in keys.into_iter().zip(heads) {
            let head: Vec<(String, f64)> = redis::from_redis_value(head)?;
            // Scores are whole epoch milliseconds, exact in a double.
            match head.first().map(|(_, score)| *score as i64) {
                Some(score) if score <= now_ms => due.push(key),
                Some(score) => next_ms = Some(next_ms.map_or(score, |n| n.min(score))),
                None => {}
            }
        }
        Ok(Peek {
            due,
            next_due_in: next_ms.map(|n| Duration::from_millis((n - now_ms).unsigned_abs())),
        })
    }

    /// Adds `reservation_id` due at `due` unless it is on the wheel already. True if added.
    pub async fn arm(&self, reservation_id: u64, due: DateTime<Utc>) -> Result<bool, RedisError> {
        let mut conn = self.conn.clone();
        let added: i64 = redis::cmd("ZADD")
            .arg(self.key_for(reservation_id))
            .arg("NX")
            .arg(due.timestamp_millis())
            .arg(reservation_id)
            .query_async(&mut conn)
            .await?;
        if added == 1 {
            self.armed.notify_one();
        }
        Ok(added == 1)
    }

    /// [`TimeWheel::arm`] for many entries in one round trip; returns how many were added.
    pub async fn arm_many(&self, entries: &[(u64, DateTime<Utc>)]) -> Result<usize, RedisError> {
        if entries.is_empty() {
            return Ok(0);
        }
        // Entries of different shards are different slots: one pipeline per slot in cluster
        // mode (ZADD NX is idempotent, so a partial failure is simply armed again).
        let cmds = entries
            .iter()
            .map(|(id, due)| {
                let key = self.key_for(*id);
                let mut cmd = redis::cmd("ZADD");
                cmd.arg(&key).arg("NX").arg(due.timestamp_millis()).arg(*id);
                (key, cmd)
            })
            .collect();
        let replies = self.conn.pipeline_by_slot(cmds).await?;
        let added = replies
            .into_iter()
            .map(redis::from_redis_value::<i64>)
            .collect::<Result<Vec<_>, _>>()
            .map_err(RedisError::from)?;
        let added = added.iter().filter(|a| **a == 1).count();
        if added > 0 {
            self.armed.notify_one();
        }
        Ok(added)
    }

    /// Claims up to `limit` due entries of `key` for `timeout` (see `lua/wheel_claim.lua`).
    pub async fn claim(
        &self,
        key: &str,
        limit: usize,
        timeout: Duration,
    ) -> Result<Claim, RedisError> {
        let mut conn = self.conn.clone();
        let mut reply: Vec<String> = self
            .scripts
            .0
            .key(key)
            .arg(limit.max(1))
            .arg(
                u64::try_from(timeout.as_millis())
                    .unwrap_or(u64::MAX)
                    .max(1),
            )
            .invoke_async(&mut conn)
            .await?;
        if reply.is_empty() {
            return Err(RedisError::from((
                redis::ErrorKind::UnexpectedReturnType,
                "wheel claim replied without a lease",
            )));
        }
        let lease = reply.remove(0);
        let lease = lease.parse().map_err(|_| {
            RedisError::from((
                redis::ErrorKind::UnexpectedReturnType,
                "wheel claim lease is not a number",
                lease,
            ))
        })?;
        Ok(Claim {
            lease,
            members: reply,
        })
    }

    /// Removes a fired entry if it still carries `lease`. True if removed.
    pub async fn release(&self, key: &str, member: &str, lease: i64) -> Result<bool, RedisError> {
        let mut conn = self.conn.clone();
        let removed: i64 = self
            .scripts
            .1
            .key(key)
            .arg(member)
            .arg(lease)
            .invoke_async(&mut conn)
            .await?;
        Ok(removed == 1)
    }

    /// Removes `member` from `key` whatever its score (an entry that is not a reservation id).
    pub async fn discard(&self, key: &str, member: &str) -> Result<bool, RedisError> {
        let mut conn = self.conn.clone();
        let removed: i64 = redis::cmd("ZREM")
            .arg(key)
            .arg(member)
            .query_async(&mut conn)
            .await?;
        Ok(removed == 1)
    }

    /// The entry's score (due time, or lease while claimed), if `reservation_id` is on the wheel.
    pub async fn score(&self, reservation_id: u64) -> Result<Option<i64>, RedisError> {
        let mut conn = self.conn.clone();
        let score: Option<f64> = redis::cmd("ZSCORE")
            .arg(self.key_for(reservation_id))
            .arg(reservation_id)
            .query_async(&mut conn)
            .await?;
        // Scores are whole epoch milliseconds, exact in a double.
        Ok(score.map(|s| s as i64))
    }

    /// Takes `reservation_id` off the wheel (operators; tests simulate a lost timer with it).
    pub async fn remove(&self, reservation_id: u64) -> Result<bool, RedisError> {
        self.discard(&self.key_for(reservation_id), &reservation_id.to_string())
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_follow_the_inventory_key_style_one_tag_per_shard() {
        assert_eq!(shard_key("prod", 3), "inv:{schedule:prod:3}:due");
    }

    #[test]
    fn namespaces_stay_inside_the_hash_tag() {
        assert!(check_namespace("stocksvr").is_ok());
        assert!(check_namespace("it_sched-1.a").is_ok());
        for bad in ["", "a}b", "a{b", "a b", "a:b", &"x".repeat(65)] {
            assert!(check_namespace(bad).is_err(), "{bad:?}");
        }
    }
}
