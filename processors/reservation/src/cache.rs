//! What the Try path reads on every request but rarely changes (a merchant's time zone, a
//! bucket's baseline row) and the list of buckets Redis lost, kept in memory for a bounded
//! time. The service reads through these caches; the stock operations drop a bucket's entry
//! when they change its baseline, and a rebuild waits out [`MAX_TTL`]: both sides depend on
//! this module, neither on the other.
//!
//! A stale entry is safe for as long as it can live:
//! - an OPEN baseline row and a time zone are kept for [`STATIC_TTL`]: Redis refuses a
//!   CLOSED or absent bucket by itself (`try.lua`), and a Try that finds its bucket missing
//!   reads the row again before it initialises anything;
//! - whether a bucket is lost is judged on a list of all lost buckets read at most
//!   `try_cache_ttl` ago (at most [`MAX_TTL`]), and a rebuild waits out [`MAX_TTL`] after
//!   the lost mark before it writes the bucket back (see `operations::repair`), so no
//!   instance takes a Try on a list from before the mark once Redis has the bucket again.
//!
//! One list read (by `idx_lost`) a second replaces a baseline read per bucket every two
//! seconds: on 1,000 dishes that was about 0.2 SELECTs per Try, and with more dishes than
//! Trys every two seconds it would be one per Try.

use std::collections::{HashMap, HashSet};
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use stocksvr_store::baselines::Baseline;

/// Longest time to live the configuration accepts for the lost list (and for rows that do
/// not take Trys); the rebuild waits this long after the lost mark, whatever an instance is
/// configured with.
pub const MAX_TTL: Duration = Duration::from_secs(2);

/// How long an OPEN baseline row and a merchant's time zone are kept.
pub const STATIC_TTL: Duration = Duration::from_secs(30);

/// Beyond this many entries the expired ones are dropped (and all, if none had expired),
/// so a scan over many buckets cannot grow the map without bound.
const MAX_ENTRIES: usize = 100_000;

/// Past this many lost buckets the list is not kept (a whole Redis lost: every Try is
/// refused anyway) and each Try reads its own row, as with the cache off.
const MAX_LOST_LISTED: u32 = 1_000;

/// Entries that live for a fixed time after they were put.
pub struct TtlCache<K, V> {
    ttl: Duration,
    entries: Mutex<HashMap<K, (Instant, V)>>,
}

impl<K: Eq + Hash, V: Clone> TtlCache<K, V> {
    /// A zero `ttl` keeps nothing (every read goes to MySQL).
    pub fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            entries: Mutex::new(HashMap::new()),
        }
    }

    pub fn get(&self, key: &K) -> Option<V> {
        self.get_aged(key).map(|(_, value)| value)
    }

    /// The entry and how long ago it was put, while it lives.
    pub fn get_aged(&self, key: &K) -> Option<(Duration, V)> {
        if self.ttl.is_zero() {
            return None;
        }
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        match entries.get(key) {
            Some((at, value)) if at.elapsed() < self.ttl => Some((at.elapsed(), value.clone())),
            _ => None,
        }
    }

    pub fn put(&self, key: K, value: V) {
        if self.ttl.is_zero() {
            return;
        }
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if entries.len() >= MAX_ENTRIES {
            let ttl = self.ttl;
            entries.retain(|_, (at, _)| at.elapsed() < ttl);
            if entries.len() >= MAX_ENTRIES {
                entries.clear();
            }
        }
        entries.insert(key, (Instant::now(), value));
    }

    pub fn forget(&self, key: &K) {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries.remove(key);
    }
}

/// Baseline rows by bucket id: read by the Try path, dropped by the stock operations that
/// change them (close, reopen, rebuild).
pub type BaselineCache = TtlCache<String, Baseline>;

/// The buckets marked lost (`lost_at`), all read at once and kept for at most `max_age`.
/// Read again when a Try finds the list older than half of that (that Try alone waits for
/// the read; the others go on with the list, still young enough), and by every Try, one at
/// a time, once it is older than `max_age`. An idle process reads nothing.
pub struct LostBuckets {
    max_age: Duration,
    list: Mutex<Option<(Instant, Arc<LostList>)>>,
    reading: tokio::sync::Mutex<()>,
}

enum LostList {
    Listed(HashSet<String>),
    /// More than [`MAX_LOST_LISTED`]: each Try reads its own row.
    TooMany,
}

impl LostBuckets {
    pub fn new(max_age: Duration) -> Self {
        Self {
            max_age: max_age.min(MAX_TTL),
            list: Mutex::new(None),
            reading: tokio::sync::Mutex::new(()),
        }
    }

    /// Whether `bucket` is lost on a list read at most `max_age` ago; None when the list
    /// cannot tell (too many lost buckets, or no list kept): the caller reads the row.
    pub async fn is_lost(
        &self,
        pool: &sqlx::MySqlPool,
        bucket: &str,
    ) -> Result<Option<bool>, sqlx::Error> {
        if self.max_age.is_zero() {
            return Ok(None);
        }
        if let Some((age, list)) = self.current() {
            if age < self.max_age / 2 {
                return Ok(list.has(bucket));
            }
            if age < self.max_age {
                // Read ahead, by whichever Try gets here first; a failed read leaves the
                // list as it is, still valid, and the next Try tries again.
                if let Ok(_reading) = self.reading.try_lock() {
                    if let Err(e) = self.read(pool).await {
                        tracing::warn!(error = %e, "reading the lost buckets ahead failed; the list in hand is still young enough");
                    }
                }
                return Ok(list.has(bucket));
            }
        }
        let _reading = self.reading.lock().await;
        if let Some((age, list)) = self.current() {
            if age < self.max_age {
                return Ok(list.has(bucket));
            }
        }
        Ok(self.read(pool).await?.has(bucket))
    }

    fn current(&self) -> Option<(Duration, Arc<LostList>)> {
        let list = self.list.lock().unwrap_or_else(|p| p.into_inner());
        list.as_ref().map(|(at, l)| (at.elapsed(), l.clone()))
    }

    async fn read(&self, pool: &sqlx::MySqlPool) -> Result<Arc<LostList>, sqlx::Error> {
        // The list's age counts from before the query: a mark committed before this
        // instant is in it.
        let at = Instant::now();
        let lost = stocksvr_store::baselines::lost_buckets(pool, MAX_LOST_LISTED + 1).await?;
        let list = Arc::new(if lost.len() > MAX_LOST_LISTED as usize {
            LostList::TooMany
        } else {
            LostList::Listed(lost.into_iter().collect())
        });
        *self.list.lock().unwrap_or_else(|p| p.into_inner()) = Some((at, list.clone()));
        Ok(list)
    }
}

impl LostList {
    fn has(&self, bucket: &str) -> Option<bool> {
        match self {
            LostList::Listed(set) => Some(set.contains(bucket)),
            LostList::TooMany => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_lives_for_its_ttl_and_a_zero_ttl_keeps_nothing() {
        let cache = TtlCache::new(Duration::from_secs(60));
        cache.put(1, "a");
        assert_eq!(cache.get(&1), Some("a"));
        cache.forget(&1);
        assert_eq!(cache.get(&1), None);
        let off = TtlCache::new(Duration::ZERO);
        off.put(1, "a");
        assert_eq!(off.get(&1), None);
        assert!(cache.get_aged(&2).is_none(), "nothing put under 2");
        cache.put(2, "b");
        let (age, value) = cache.get_aged(&2).expect("just put");
        assert_eq!(value, "b");
        assert!(age < Duration::from_secs(60));
    }

    #[test]
    fn the_lost_list_lives_at_most_max_ttl_and_too_many_lost_buckets_tell_nothing() {
        assert_eq!(LostBuckets::new(Duration::from_secs(3600)).max_age, MAX_TTL);
        let listed = LostList::Listed(["b1".to_string()].into_iter().collect());
        assert_eq!(listed.has("b1"), Some(true));
        assert_eq!(listed.has("b2"), Some(false));
        assert_eq!(LostList::TooMany.has("b1"), None);
    }
}
