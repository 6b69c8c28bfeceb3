//! The background evictor: one thread per cache, woken by the page
//! allocators' low-watermark signal, that evicts unpinned leaves until every
//! tier with an allocator (each device, and the host tier) is back at its
//! high watermark.
//!
//! ```
//! use radixkv::{DeviceId, RadixCache, TokenKey};
//! use std::sync::Arc;
//! let cache = Arc::new(
//!     RadixCache::builder().page_size(4).pages_per_device(64).watermarks(8, 16).build()?,
//! );
//! let evictor = cache.start_evictor()?;
//! for k in 0..40u32 {
//!     let span = cache.alloc(DeviceId(0), 8)?;
//!     cache.insert_pages(TokenKey::new(&[k, 1, 2, 3, 4, 5, 6, 7]), span, 0)?;
//! }
//! drop(evictor); // stops and joins the thread
//! cache.audit();
//! # Ok::<(), radixkv::CacheError>(())
//! ```

use super::{CacheError, PagedCache};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Counters of a background evictor.
#[non_exhaustive]
#[derive(Debug, Default)]
pub struct EvictorStats {
    wakeups: AtomicU64,
    evictions: AtomicU64,
    evicted_pages: AtomicU64,
}

impl EvictorStats {
    /// Low-watermark signals received.
    pub fn wakeups(&self) -> u64 {
        self.wakeups.load(Ordering::Relaxed)
    }
    /// `evict` calls made.
    pub fn evictions(&self) -> u64 {
        self.evictions.load(Ordering::Relaxed)
    }
    /// Pages returned to the allocators.
    pub fn evicted_pages(&self) -> u64 {
        self.evicted_pages.load(Ordering::Relaxed)
    }
}

/// A running background evictor. Dropping it stops the thread and waits for
/// it (an eviction in progress finishes first).
#[derive(Debug)]
pub struct Evictor {
    stop: Arc<AtomicBool>,
    stats: Arc<EvictorStats>,
    thread: Option<JoinHandle<()>>,
}

impl Evictor {
    /// The evictor's counters.
    pub fn stats(&self) -> &EvictorStats {
        &self.stats
    }
}

impl Drop for Evictor {
    fn drop(&mut self) {
        // Relaxed suffices for both: the flag is polled at least every
        // POLL, and `join` synchronizes with the thread's end.
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// How often the thread looks at the stop flag and the free counts when no
/// signal comes.
const POLL: Duration = Duration::from_millis(20);

impl PagedCache {
    /// Starts the background evictor (the cache must have been built with
    /// [`watermarks`](super::RadixCacheBuilder::watermarks); one evictor
    /// per cache). The thread holds only a weak reference: dropping the
    /// cache ends it too.
    pub fn start_evictor(self: &Arc<Self>) -> Result<Evictor, CacheError> {
        self.pages.watermarks.ok_or_else(|| {
            CacheError::InvalidConfig(
                "no watermarks: build the cache with .watermarks(low, high)".into(),
            )
        })?;
        let rx = self
            .pages
            .evictor_signal
            .lock()
            .map_err(|_| CacheError::InvalidConfig("evictor state poisoned".into()))?
            .take()
            .ok_or_else(|| CacheError::InvalidConfig("the evictor was already started".into()))?;
        let stop = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(EvictorStats::default());
        let weak = Arc::downgrade(self);
        let thread = {
            let (stop, stats) = (Arc::clone(&stop), Arc::clone(&stats));
            std::thread::Builder::new()
                .name("radixkv-evictor".into())
                .spawn(move || run(weak, rx, &stop, &stats))
                .map_err(|e| {
                    CacheError::InvalidConfig(format!("cannot start the evictor thread: {e}"))
                })?
        };
        Ok(Evictor {
            stop,
            stats,
            thread: Some(thread),
        })
    }
}

/// Per device, since when the evictor has seen it below the low watermark
/// without accounting the time yet.
struct BelowLow(Vec<Option<Instant>>);

impl BelowLow {
    /// Accounts the time since the last look at device `d` (if it was
    /// below) and notes whether it is below now.
    fn look(&mut self, cache: &PagedCache, d: usize, below: bool, wakeup: bool) {
        let now = Instant::now();
        let spent = self.0[d].map_or(Duration::ZERO, |t| now.saturating_duration_since(t));
        self.0[d] = below.then_some(now);
        if wakeup || !spent.is_zero() {
            cache.record_evictor(d, wakeup, spent);
        }
    }
}

fn run(cache: Weak<PagedCache>, signal: Receiver<usize>, stop: &AtomicBool, stats: &EvictorStats) {
    let mut below = BelowLow(Vec::new());
    loop {
        let woken = match signal.recv_timeout(POLL) {
            Ok(d) => {
                stats.wakeups.fetch_add(1, Ordering::Relaxed);
                Some(d)
            }
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => return,
        };
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let Some(cache) = cache.upgrade() else {
            return;
        };
        // The levels now (RadixCache::set_watermarks moves them).
        let Some((low, high)) = cache.watermarks() else {
            return;
        };
        // Every tier with an allocator: the devices and the host tier.
        below.0.resize(cache.tiers(), None);
        for d in 0..cache.tiers() {
            let tier = cache.tier_of(d);
            let Ok(a) = cache.allocator(tier) else {
                continue;
            };
            // The signal is sent as the allocation crosses the watermark,
            // so a woken device has been below since about now.
            let wakeup = woken == Some(d);
            if wakeup && below.0[d].is_none() {
                below.0[d] = Some(Instant::now());
            }
            below.look(&cache, d, a.free_pages() < low, wakeup);
            while !stop.load(Ordering::Relaxed) {
                let free = a.free_pages();
                if free >= high {
                    break;
                }
                let Ok(ev) = cache.evict(tier, (high - free) * cache.page_size()) else {
                    break;
                };
                stats.evictions.fetch_add(1, Ordering::Relaxed);
                stats
                    .evicted_pages
                    .fetch_add(ev.pages as u64, Ordering::Relaxed);
                if ev.pages == 0 {
                    break; // everything left is pinned
                }
            }
            below.look(&cache, d, a.free_pages() < low, false);
        }
    }
}
