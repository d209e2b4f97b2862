//! What the Try path reads on every request but rarely changes (a merchant's time zone, a
//! bucket's baseline row), kept for a short time, and the per-item turn that makes a repeat
//! of an in-flight Try wait for the first instead of racing it.
//!
//! A stale entry is safe for as long as it can live: Redis refuses a CLOSED or absent
//! bucket by itself (`try.lua`), and a rebuild waits out the time to live after a bucket is
//! marked lost before it writes the bucket back (see `operations::repair`), so no cached
//! "not lost" outlives the mark.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Longest time to live the configuration accepts; the rebuild waits this long after the
/// lost mark, whatever an instance is configured with.
pub const MAX_TTL: Duration = Duration::from_secs(2);

/// Beyond this many entries the expired ones are dropped (and all, if none had expired),
/// so a scan over many buckets cannot grow the map without bound.
const MAX_ENTRIES: usize = 100_000;

pub struct TtlCache<K, V> {
    ttl: Duration,
    entries: Mutex<HashMap<K, (Instant, V)>>,
}

impl<K: Eq + Hash, V: Clone> TtlCache<K, V> {
    /// A zero `ttl` keeps nothing (every read goes to MySQL).
    pub fn new(ttl: Duration) -> Self {
        Self {
            ttl: ttl.min(MAX_TTL),
            entries: Mutex::new(HashMap::new()),
        }
    }

    pub fn get(&self, key: &K) -> Option<V> {
        if self.ttl.is_zero() {
            return None;
        }
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        match entries.get(key) {
            Some((at, value)) if at.elapsed() < self.ttl => Some(value.clone()),
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

/// One turn per key at a time: the second request for a key waits until the first is done.
pub struct Turns<K> {
    held: Mutex<HashMap<K, Arc<tokio::sync::Mutex<()>>>>,
}

pub struct Turn<'a, K: Eq + Hash + Clone> {
    turns: &'a Turns<K>,
    key: K,
    guard: tokio::sync::OwnedMutexGuard<()>,
}

impl<K: Eq + Hash + Clone> Turns<K> {
    pub fn new() -> Self {
        Self {
            held: Mutex::new(HashMap::new()),
        }
    }

    pub async fn take(&self, key: K) -> Turn<'_, K> {
        let lock = {
            let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
            held.entry(key.clone()).or_default().clone()
        };
        let guard = lock.lock_owned().await;
        Turn {
            turns: self,
            key,
            guard,
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.held.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

impl<K: Eq + Hash + Clone> Default for Turns<K> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: Eq + Hash + Clone> Drop for Turn<'_, K> {
    fn drop(&mut self) {
        let mut held = self.turns.held.lock().unwrap_or_else(|p| p.into_inner());
        // Only the map and this turn hold the lock: nobody else waits, so the key can go.
        // (A waiter clones it under this same map lock, so the count cannot grow meanwhile.)
        if Arc::strong_count(tokio::sync::OwnedMutexGuard::mutex(&self.guard)) == 2 {
            held.remove(&self.key);
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
        assert_eq!(
            TtlCache::<u8, u8>::new(Duration::from_secs(3600)).ttl,
            MAX_TTL
        );
    }

    #[tokio::test]
    async fn a_second_turn_waits_for_the_first_and_the_key_goes_when_both_are_done() {
        let turns = Arc::new(Turns::new());
        let first = turns.take(7).await;
        let waiter = tokio::spawn({
            let turns = turns.clone();
            async move {
                let _turn = turns.take(7).await;
            }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "the second turn waits");
        drop(first);
        waiter.await.expect("join");
        assert_eq!(turns.len(), 0);
    }
}
