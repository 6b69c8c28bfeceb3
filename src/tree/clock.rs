//! Access and creation stamps.
//!
//! Eviction order depends only on the order of stamps (SEMANTICS.md, Clock).
//! Each match or insert takes one *path stamp* before it creates anything,
//! and each node it creates takes two fresh ticks (last access, then
//! creation).

use crate::sync::{AtomicU64, Ordering};
#[cfg(not(loom))]
use std::time::Instant;

/// Where stamps come from.
#[derive(Debug)]
pub(crate) enum Clock {
    /// A counter: every tick is unique and strictly increasing, so eviction
    /// keys never tie. What the conformance runner uses.
    Logical(AtomicU64),
    /// Nanoseconds since the cache was built. Ticks may repeat; eviction
    /// breaks ties by creation stamp, then node id.
    #[cfg(not(loom))]
    Monotonic(Instant),
}

impl Clock {
    /// A logical clock starting at 1.
    pub(crate) fn logical() -> Self {
        Clock::Logical(AtomicU64::new(1))
    }

    /// A wall clock (monotonic nanoseconds since now).
    #[cfg(not(loom))]
    pub(crate) fn monotonic() -> Self {
        Clock::Monotonic(Instant::now())
    }

    /// A new stamp, not smaller than any stamp taken before it.
    pub(crate) fn tick(&self) -> u64 {
        match self {
            // Relaxed suffices: uniqueness and monotonicity of a single
            // atomic counter hold under any ordering (all RMWs on one location
            // are totally ordered), and no other memory is published through it.
            Clock::Logical(c) => c.fetch_add(1, Ordering::Relaxed),
            #[cfg(not(loom))]
            Clock::Monotonic(start) => start.elapsed().as_nanos() as u64 + 1,
        }
    }
}
