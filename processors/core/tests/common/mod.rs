//! A tiny deterministic generator for the property tests: reproducible from a seed, no crates.

// Each test binary compiles this module and uses a different subset of it.
#![allow(dead_code)]

pub struct XorShift(u64);

impl XorShift {
    pub fn new(seed: u64) -> Self {
        // xorshift has a fixed point at 0; mix the seed so small seeds differ a lot.
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// Uniform enough in `0..n` for test generation.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    pub fn range(&mut self, lo: u32, hi_inclusive: u32) -> u32 {
        lo + self.below(u64::from(hi_inclusive - lo + 1)) as u32
    }

    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}
