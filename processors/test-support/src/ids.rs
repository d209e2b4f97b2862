//! Names and ids no other test, run or process uses at the same time.

use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// `<prefix>_<pid>_<nanos>_<counter>`: unique across parallel tests and test processes.
pub fn unique(prefix: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!(
        "{prefix}_{}_{}_{}",
        std::process::id(),
        nanos % 1_000_000_000_000,
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// A positive id (merchant, dish, order) unique per call, above `floor`. Redis keys are per
/// merchant and dish and shared by every test database, so ids must not repeat across tests
/// that start together. Stays below 2^53 so JSON clients read it exactly.
pub fn unique_id(floor: u64) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    unique("id").hash(&mut h);
    floor + h.finish() % (1 << 50)
}
