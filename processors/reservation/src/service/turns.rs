//! Per-item turns of the Try path: a repeat of an in-flight Try (a client that did not hear
//! back and retried) waits for the first request of the same item instead of racing it.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex};

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
