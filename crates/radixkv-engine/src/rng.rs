//! A small seeded generator (SplitMix64) for everything that must be
//! reproducible from a seed alone: workloads, the `random` scheduling
//! policy, model weights. Not for cryptography, not for the concurrent
//! core (which uses no randomness).
//!
//! ```
//! use radixkv_engine::rng::SplitMix64;
//! let mut a = SplitMix64::new(7);
//! let mut b = SplitMix64::new(7);
//! assert_eq!(a.next_u64(), b.next_u64());
//! let mut v: Vec<u32> = (0..10).collect();
//! a.shuffle(&mut v);
//! v.sort();
//! assert_eq!(v, (0..10).collect::<Vec<_>>());
//! assert!(a.below(3) < 3);
//! ```

/// SplitMix64 (Steele, Lea and Flood): 64 bits of state, every seed valid.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A value in `0..n` by multiply-shift (bias below n / 2⁶⁴); 0 when
    /// `n` is 0.
    pub fn below(&mut self, n: usize) -> usize {
        ((u128::from(self.next_u64()) * n as u128) >> 64) as usize
    }

    /// Fisher–Yates, the same walk as Python's `random.shuffle`.
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i + 1);
            items.swap(i, j);
        }
    }

    /// Uniform in the open interval (0, 1).
    pub fn unit(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    /// An exponential variate with the given mean.
    pub fn exp(&mut self, mean: f64) -> f64 {
        -mean * self.unit().ln()
    }

    /// Uniform in [-1, 1), as `f32`.
    pub fn symmetric_f32(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}
