//! Access and creation stamps.
//!
//! Eviction order depends only on the order of stamps (docs/semantics.md).
//! Each match or insert takes one *path stamp* before it creates anything,
//! and each node it creates takes two fresh ticks (last access, then
//! creation).
//!
//! Stamps are only ever compared within one device (stamps, hit counts and
//! eviction are per device), so the logical clock is one counter per
//! device: each scheduler ticks its own, cache-padded counter and no atomic
//! is shared between schedulers on the match path.
//!
//! | atomic | ordering | why |
//! | --- | --- | --- |
//! | a tier's counter (`fetch_add`) | Relaxed | uniqueness and monotonicity of one counter hold under any ordering (all RMWs on one location are totally ordered), and no other memory is published through it |

use crate::sync::{AtomicU64, Ordering};
use crossbeam_utils::CachePadded;
#[cfg(not(loom))]
use std::time::Instant;

/// Where stamps come from.
#[derive(Debug)]
pub(crate) enum Clock {
    /// A counter: every tick is unique and strictly increasing, so eviction
    /// keys never tie. What the conformance runner uses.
    Logical(Box<[CachePadded<AtomicU64>]>),
    /// Nanoseconds since the cache was built. Ticks may repeat; eviction
    /// breaks ties by creation stamp, then node id.
    #[cfg(not(loom))]
    Monotonic(Instant),
}

impl Clock {
    /// Logical clocks for `devices` devices, each starting at 1.
    pub(crate) fn logical(devices: usize) -> Self {
        Clock::Logical(
            (0..devices)
                .map(|_| CachePadded::new(AtomicU64::new(1)))
                .collect(),
        )
    }

    /// A wall clock (monotonic nanoseconds since now).
    #[cfg(not(loom))]
    pub(crate) fn monotonic() -> Self {
        Clock::Monotonic(Instant::now())
    }

    /// A new stamp for device `d`, not smaller than any stamp of `d` taken
    /// before it.
    pub(crate) fn tick(&self, d: usize) -> u64 {
        match self {
            // Relaxed suffices: uniqueness and monotonicity of a single
            // atomic counter hold under any ordering (all RMWs on one location
            // are totally ordered), and no other memory is published through it.
            Clock::Logical(c) => c[d].fetch_add(1, Ordering::Relaxed),
            #[cfg(not(loom))]
            Clock::Monotonic(start) => start.elapsed().as_nanos() as u64 + 1,
        }
    }
}
