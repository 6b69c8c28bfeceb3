//! Counters and latency histograms (the lowest layer: it imports nothing
//! from the rest of the crate).
//!
//! * [`LatencyHistogram`]: an hdrhistogram of durations in nanoseconds
//!   (1 ns to 1 hour, two significant digits: every recorded value is
//!   within 1 % of its bucket), summarized as a [`LatencySummary`].
//! * [`EvictionRecorder`] / [`EvictionMetrics`]: what eviction did on one
//!   device. The cache keeps one recorder per device (see
//!   [`RadixCache::eviction_metrics`](crate::RadixCache::eviction_metrics))
//!   and updates it under the lock eviction on that device already holds,
//!   so recording adds no atomic and no lock to any other path.
//!
//! ```
//! use radixkv::metrics::LatencyHistogram;
//! use std::time::Duration;
//! let mut h = LatencyHistogram::new();
//! for us in 1..=100 {
//!     h.record(Duration::from_micros(us));
//! }
//! let s = h.summary();
//! assert_eq!(s.count, 100);
//! assert!((49_000..=51_000).contains(&s.p50_ns));
//! assert!(s.max_ns >= 99_000);
//! ```

use hdrhistogram::Histogram;
use std::time::Duration;

/// The largest recordable duration (one hour); longer ones are recorded
/// as this.
const MAX_NS: u64 = 3_600_000_000_000;

/// A histogram of durations (nanoseconds, 1 ns to 1 hour, 1 % precision).
#[derive(Clone, Debug)]
pub struct LatencyHistogram {
    h: Histogram<u64>,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self::new()
    }
}

impl LatencyHistogram {
    /// An empty histogram (about 30 KB).
    pub fn new() -> Self {
        // Bounds 1..=MAX_NS with 2 significant digits are always valid
        // arguments for `new_with_bounds` (low ≥ 1, high ≥ 2·low, sigfig ≤ 5).
        let h = Histogram::new_with_bounds(1, MAX_NS, 2)
            .unwrap_or_else(|_| unreachable!("constant, valid histogram bounds"));
        LatencyHistogram { h }
    }

    /// Records one duration (clamped to 1 ns..=1 hour).
    pub fn record(&mut self, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(MAX_NS);
        self.h.saturating_record(ns.clamp(1, MAX_NS));
    }

    /// Adds every value of `other`.
    pub fn merge(&mut self, other: &LatencyHistogram) {
        // Both histograms have the same bounds, so `add` cannot fail; a
        // failure would only drop values, never corrupt this histogram.
        let _ = self.h.add(&other.h);
    }

    /// Number of recorded values.
    pub fn len(&self) -> u64 {
        self.h.len()
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.h.is_empty()
    }

    /// Count, mean and percentiles (all 0 when empty).
    pub fn summary(&self) -> LatencySummary {
        if self.h.is_empty() {
            return LatencySummary::default();
        }
        LatencySummary {
            count: self.h.len(),
            mean_ns: self.h.mean().round() as u64,
            p50_ns: self.h.value_at_quantile(0.5),
            p90_ns: self.h.value_at_quantile(0.9),
            p99_ns: self.h.value_at_quantile(0.99),
            p999_ns: self.h.value_at_quantile(0.999),
            max_ns: self.h.max(),
        }
    }
}

/// A histogram's count, mean and percentiles, in nanoseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(not(loom), derive(serde::Serialize))]
pub struct LatencySummary {
    /// Recorded values.
    pub count: u64,
    /// Mean.
    pub mean_ns: u64,
    /// Median.
    pub p50_ns: u64,
    /// 90th percentile.
    pub p90_ns: u64,
    /// 99th percentile.
    pub p99_ns: u64,
    /// 99.9th percentile.
    pub p999_ns: u64,
    /// Largest recorded value.
    pub max_ns: u64,
}

/// What eviction did on one device since the cache was built.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(not(loom), derive(serde::Serialize))]
pub struct EvictionMetrics {
    /// `evict` calls asking for at least one token (the background
    /// evictor's, the synchronous fallback's in `alloc` and direct ones).
    pub evict_calls: u64,
    /// Leaves evicted.
    pub evicted_leaves: u64,
    /// Tokens evicted.
    pub evicted_tokens: u64,
    /// Pages returned to the device's allocator (0 without page ownership).
    pub evicted_pages: u64,
    /// Low-watermark signals the background evictor received.
    pub evictor_wakeups: u64,
    /// Time the device spent below its low watermark, as the background
    /// evictor saw it (it looks at least every 20 ms, so this is exact to
    /// about that).
    #[cfg_attr(not(loom), serde(serialize_with = "as_secs"))]
    pub time_below_low_watermark: Duration,
    /// Latency of the `evict` calls.
    pub latency: LatencySummary,
}

#[cfg(not(loom))]
fn as_secs<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

/// Accumulates one device's [`EvictionMetrics`]; the owner serializes
/// access (the cache keeps it under its per-device eviction lock).
///
/// ```
/// use radixkv::metrics::EvictionRecorder;
/// use std::time::Duration;
/// let mut r = EvictionRecorder::default();
/// r.record_evict(3, 48, 3, Duration::from_micros(5));
/// r.record_wakeup();
/// r.add_time_below_low(Duration::from_millis(2));
/// let m = r.metrics();
/// assert_eq!((m.evict_calls, m.evicted_leaves, m.evicted_tokens, m.evictor_wakeups), (1, 3, 48, 1));
/// assert_eq!(m.latency.count, 1);
/// ```
#[derive(Clone, Debug, Default)]
pub struct EvictionRecorder {
    m: EvictionMetrics,
    latency: LatencyHistogram,
}

impl EvictionRecorder {
    /// One `evict` call: what it freed and how long it took.
    pub fn record_evict(&mut self, leaves: usize, tokens: usize, pages: usize, took: Duration) {
        self.m.evict_calls += 1;
        self.m.evicted_leaves += leaves as u64;
        self.m.evicted_tokens += tokens as u64;
        self.m.evicted_pages += pages as u64;
        self.latency.record(took);
    }

    /// One low-watermark signal received by the background evictor.
    pub fn record_wakeup(&mut self) {
        self.m.evictor_wakeups += 1;
    }

    /// Time observed below the low watermark.
    pub fn add_time_below_low(&mut self, d: Duration) {
        self.m.time_below_low_watermark += d;
    }

    /// The figures so far.
    pub fn metrics(&self) -> EvictionMetrics {
        EvictionMetrics {
            latency: self.latency.summary(),
            ..self.m
        }
    }
}
