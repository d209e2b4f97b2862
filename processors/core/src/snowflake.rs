//! Snowflake ids for reservations (docs/design.md, Try: the id exists before the row does, so a retried
//! Try can carry it and the Redis op/fence keys can be derived from it).
//!
//! Layout, most significant first: 1 zero bit, 41 bits of milliseconds since
//! [`EPOCH_UNIX_MS`] (2026-01-01T00:00:00Z, good until 2095), 10 bits worker id, 12 bits
//! sequence. The top bit stays 0 so every id also fits the `i64` of the Avro contracts.
//!
//! Ids of one generator strictly increase. The last issued (timestamp, sequence) lives in one
//! `AtomicU64` advanced by compare-and-swap, so concurrent callers never share a slot and
//! nobody blocks on a lock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// 2026-01-01T00:00:00Z in Unix milliseconds.
pub const EPOCH_UNIX_MS: u64 = 1_767_225_600_000;
pub const MAX_WORKER_ID: u16 = (1 << WORKER_BITS) - 1;

const SEQUENCE_BITS: u32 = 12;
const WORKER_BITS: u32 = 10;
const TIMESTAMP_BITS: u32 = 41;
const SEQUENCE_MASK: u64 = (1 << SEQUENCE_BITS) - 1;
const MAX_TIMESTAMP: u64 = (1 << TIMESTAMP_BITS) - 1;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SnowflakeError {
    #[error("worker id {0} out of range 0..={MAX_WORKER_ID}")]
    WorkerIdOutOfRange(u16),
    /// 41 bits of milliseconds ran out (year 2095), or a clock far in the future got there.
    #[error("snowflake timestamp space exhausted")]
    TimestampExhausted,
}

/// Wall-clock source, injectable so tests can stop, step or rewind time.
pub trait Clock: Send + Sync {
    /// Milliseconds since the Unix epoch.
    fn unix_millis(&self) -> u64;
}

#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn unix_millis(&self) -> u64 {
        // A clock before 1970 reads as 0, which the generator treats like any backwards step.
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }
}

impl<F> Clock for F
where
    F: Fn() -> u64 + Send + Sync,
{
    fn unix_millis(&self) -> u64 {
        self()
    }
}

/// The fields of an id, for logs and debugging.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnowflakeParts {
    pub unix_millis: u64,
    pub worker_id: u16,
    pub sequence: u16,
}

pub fn decompose(id: u64) -> SnowflakeParts {
    let ts = id >> (WORKER_BITS + SEQUENCE_BITS);
    // Both masks keep the values within u16, so the narrowing cannot lose bits.
    SnowflakeParts {
        unix_millis: ts + EPOCH_UNIX_MS,
        worker_id: ((id >> SEQUENCE_BITS) & u64::from(MAX_WORKER_ID)) as u16,
        sequence: (id & SEQUENCE_MASK) as u16,
    }
}

#[derive(Debug)]
pub struct SnowflakeGenerator<C = SystemClock> {
    worker_id: u16,
    clock: C,
    /// `(timestamp << SEQUENCE_BITS) | sequence` of the last id issued.
    last: AtomicU64,
}

impl SnowflakeGenerator<SystemClock> {
    pub fn new(worker_id: u16) -> Result<Self, SnowflakeError> {
        Self::with_clock(worker_id, SystemClock)
    }
}

impl<C: Clock> SnowflakeGenerator<C> {
    pub fn with_clock(worker_id: u16, clock: C) -> Result<Self, SnowflakeError> {
        if worker_id > MAX_WORKER_ID {
            return Err(SnowflakeError::WorkerIdOutOfRange(worker_id));
        }
        Ok(Self {
            worker_id,
            clock,
            last: AtomicU64::new(0),
        })
    }

    pub fn worker_id(&self) -> u16 {
        self.worker_id
    }

    fn now(&self) -> u64 {
        // Before the custom epoch reads as 0: treated like a clock that went backwards.
        self.clock.unix_millis().saturating_sub(EPOCH_UNIX_MS)
    }

    /// The next id, strictly greater than every id this generator issued before.
    ///
    /// - Clock ahead of the last id: its millisecond, sequence 0.
    /// - Same millisecond, or the clock went backwards: the last timestamp with the next
    ///   sequence, so an id is never reused whatever the clock does.
    /// - Sequence exhausted in the current millisecond: wait for the next one (< 1 ms).
    /// - Sequence exhausted while the clock is behind: borrow the next millisecond instead of
    ///   waiting, since a clock stepped back by minutes would otherwise stall every Try for
    ///   minutes; ids stay unique and ordered, their time runs ahead until the clock catches up.
    pub fn next_id(&self) -> Result<u64, SnowflakeError> {
        loop {
            let last = self.last.load(Ordering::Acquire);
            let (last_ts, last_seq) = (last >> SEQUENCE_BITS, last & SEQUENCE_MASK);
            let now = self.now();
            let (ts, seq) = if now > last_ts {
                (now, 0)
            } else if last_seq < SEQUENCE_MASK {
                (last_ts, last_seq + 1)
            } else if now == last_ts {
                std::thread::yield_now();
                continue;
            } else {
                (last_ts + 1, 0)
            };
            if ts > MAX_TIMESTAMP {
                return Err(SnowflakeError::TimestampExhausted);
            }
            let next = (ts << SEQUENCE_BITS) | seq;
            if self
                .last
                .compare_exchange_weak(last, next, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                return Ok((ts << (WORKER_BITS + SEQUENCE_BITS))
                    | (u64::from(self.worker_id) << SEQUENCE_BITS)
                    | seq);
            }
        }
    }
}
