//! Snowflake ids: unique and increasing under threads, worker ids, and a clock that misbehaves.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use stocksvr_core::snowflake::*;

const T0: u64 = EPOCH_UNIX_MS + 86_400_000;

/// A clock the test sets by hand.
fn manual_clock(start: u64) -> (Arc<AtomicU64>, impl Fn() -> u64 + Send + Sync) {
    let now = Arc::new(AtomicU64::new(start));
    let read = Arc::clone(&now);
    (now, move || read.load(Ordering::SeqCst))
}

#[test]
fn layout_and_range_checks() {
    assert_eq!(EPOCH_UNIX_MS, 1_767_225_600_000); // 2026-01-01T00:00:00Z
    assert!(SnowflakeGenerator::new(1023).is_ok());
    assert_eq!(
        SnowflakeGenerator::new(1024).err(),
        Some(SnowflakeError::WorkerIdOutOfRange(1024))
    );
    let (_, clock) = manual_clock(T0);
    let g = SnowflakeGenerator::with_clock(513, clock).unwrap();
    let a = g.next_id().unwrap();
    let b = g.next_id().unwrap();
    assert_eq!(
        decompose(a),
        SnowflakeParts {
            unix_millis: T0,
            worker_id: 513,
            sequence: 0
        }
    );
    assert_eq!(decompose(b).sequence, 1);
    assert!(
        i64::try_from(a).is_ok(),
        "ids fit the i64 of the Avro contracts"
    );
}

#[test]
fn unique_and_increasing_over_100k_ids_from_4_threads() {
    let g = Arc::new(SnowflakeGenerator::new(7).unwrap());
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let g = Arc::clone(&g);
            std::thread::spawn(move || {
                (0..25_000)
                    .map(|_| g.next_id().unwrap())
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let mut all = HashSet::new();
    for h in handles {
        let ids = h.join().unwrap();
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "per-thread monotonic");
        for id in ids {
            assert!(all.insert(id), "duplicate id {id}");
            assert_eq!(decompose(id).worker_id, 7);
        }
    }
    assert_eq!(all.len(), 100_000);
}

#[test]
fn different_workers_never_collide() {
    // Same frozen millisecond for both: only the worker bits tell them apart.
    let (_, c1) = manual_clock(T0);
    let (_, c2) = manual_clock(T0);
    let g1 = SnowflakeGenerator::with_clock(1, c1).unwrap();
    let g2 = SnowflakeGenerator::with_clock(2, c2).unwrap();
    let mut seen = HashSet::new();
    for _ in 0..4096 {
        assert!(seen.insert(g1.next_id().unwrap()));
        assert!(seen.insert(g2.next_id().unwrap()));
    }
}

#[test]
fn exhausted_sequence_waits_for_the_next_millisecond() {
    // The clock advances by one ms after a number of reads, as a real one would.
    let reads = Arc::new(AtomicU64::new(0));
    let r = Arc::clone(&reads);
    let clock = move || T0 + r.fetch_add(1, Ordering::SeqCst) / 10_000;
    let g = SnowflakeGenerator::with_clock(3, clock).unwrap();
    let ids: Vec<u64> = (0..4097).map(|_| g.next_id().unwrap()).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]));
    let last = decompose(ids[4096]);
    assert!(last.unix_millis > T0, "4097th id must be in a later ms");
    // The wait really waited: the clock itself moved, nothing was borrowed.
    assert!(reads.load(Ordering::SeqCst) >= 10_000);
}

#[test]
fn a_backwards_clock_never_repeats_an_id() {
    let (now, clock) = manual_clock(T0 + 1_000);
    let g = SnowflakeGenerator::with_clock(9, clock).unwrap();
    let mut seen = HashSet::new();
    let mut last = 0;
    let mut take = |n: usize| {
        for _ in 0..n {
            let id = g.next_id().unwrap();
            assert!(id > last, "not increasing");
            assert!(seen.insert(id), "repeated {id}");
            last = id;
        }
    };
    take(10);
    now.store(T0 + 500, Ordering::SeqCst); // NTP step back by half a second
    take(10_000); // more than one ms worth of sequence: borrows ahead instead of stalling
    now.store(T0 + 1_000, Ordering::SeqCst); // back to where it was: still behind the ids
    take(10);
    now.store(T0 + 5_000, Ordering::SeqCst);
    take(10);
    now.store(0, Ordering::SeqCst); // before the custom epoch altogether
    take(5_000);
}

#[test]
fn timestamp_space_exhaustion_is_an_error_not_a_wrap() {
    let end = EPOCH_UNIX_MS + (1u64 << 41);
    let (_, clock) = manual_clock(end);
    let g = SnowflakeGenerator::with_clock(0, clock).unwrap();
    assert_eq!(g.next_id(), Err(SnowflakeError::TimestampExhausted));
    let (_, clock) = manual_clock(end - 1);
    let g = SnowflakeGenerator::with_clock(0, clock).unwrap();
    assert!(g.next_id().is_ok());
}
