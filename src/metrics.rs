//! Counters and latency histograms (the lowest layer: it imports nothing
//! from the rest of the crate).
//!
//! * [`LatencyHistogram`]: an hdrhistogram of durations in nanoseconds
//!   (1 ns to 1 hour, two significant digits: every recorded value is
//!   within 1 % of its bucket) plus their exact sum, summarized as a
//!   [`LatencySummary`] or read as cumulative counts at chosen bounds
//!   ([`LatencyHistogram::cumulative_counts`], what a Prometheus
//!   histogram's `_bucket` series need).
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

/// A histogram of durations (nanoseconds, 1 ns to 1 hour, 1 % precision)
/// and the exact sum of the values recorded.
///
/// ```
/// use radixkv::metrics::LatencyHistogram;
/// use std::time::Duration;
/// let mut h = LatencyHistogram::new();
/// for us in [1, 2, 3, 50] {
///     h.record(Duration::from_micros(us));
/// }
/// // Values at or below 2 µs, 10 µs and 1 s.
/// assert_eq!(h.cumulative_counts(&[2_000, 10_000, 1_000_000_000]), [2, 3, 4]);
/// assert_eq!(h.sum_ns(), 56_000);
/// assert_eq!(h.len(), 4);
/// ```
#[derive(Clone, Debug)]
pub struct LatencyHistogram {
    h: Histogram<u64>,
    /// Exact sum of the (clamped) values recorded, in nanoseconds.
    sum_ns: u128,
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
        LatencyHistogram { h, sum_ns: 0 }
    }

    /// Records one duration (clamped to 1 ns..=1 hour).
    pub fn record(&mut self, d: Duration) {
        let ns = u64::try_from(d.as_nanos())
            .unwrap_or(MAX_NS)
            .clamp(1, MAX_NS);
        self.h.saturating_record(ns);
        self.sum_ns = self.sum_ns.saturating_add(u128::from(ns));
    }

    /// Adds every value of `other`.
    pub fn merge(&mut self, other: &LatencyHistogram) {
        // Both histograms have the same bounds, so `add` cannot fail; a
        // failure would only drop values, never corrupt this histogram
        // (and then the sum stays that of the values kept).
        if self.h.add(&other.h).is_ok() {
            self.sum_ns = self.sum_ns.saturating_add(other.sum_ns);
        }
    }

    /// For each bound (nanoseconds), how many recorded values are at or
    /// below it: what a Prometheus histogram's cumulative `le` buckets
    /// hold. The counts are non-decreasing where `bounds_ns` is.
    ///
    /// Values are kept to within 1 %, so this is exact to the histogram's
    /// resolution: every value at or below a bound is counted, and so are
    /// values less than 1 % above it that share its bucket (a bound of
    /// 1 s may count a value of 1.002 s, never one of 1.01 s). Bounds past
    /// one hour count every value. Costs O(buckets) per bound.
    pub fn cumulative_counts(&self, bounds_ns: &[u64]) -> Vec<u64> {
        bounds_ns
            .iter()
            .map(|&b| self.h.count_between(0, b))
            .collect()
    }

    /// Exact sum of the recorded values in nanoseconds (each clamped to
    /// 1 ns..=1 hour as recorded): not rounded to the histogram's buckets.
    pub fn sum_ns(&self) -> u128 {
        self.sum_ns
    }

    /// Number of recorded values.
    pub fn len(&self) -> u64 {
        self.h.len()
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.h.is_empty()
    }

    /// Count, mean (exact, from the sum) and percentiles (all 0 when
    /// empty).
    pub fn summary(&self) -> LatencySummary {
        if self.h.is_empty() {
            return LatencySummary::default();
        }
        let n = u128::from(self.h.len());
        let mean = (self.sum_ns + n / 2) / n;
        LatencySummary {
            count: self.h.len(),
            mean_ns: u64::try_from(mean).unwrap_or(MAX_NS),
            p50_ns: self.h.value_at_quantile(0.5),
            p90_ns: self.h.value_at_quantile(0.9),
            p99_ns: self.h.value_at_quantile(0.99),
            p999_ns: self.h.value_at_quantile(0.999),
            max_ns: self.h.max(),
        }
    }
}

/// A histogram's count, mean and percentiles, in nanoseconds.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
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
#[non_exhaustive]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
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
    #[cfg_attr(feature = "serde", serde(serialize_with = "as_secs"))]
    pub time_below_low_watermark: Duration,
    /// Latency of the `evict` calls.
    pub latency: LatencySummary,
}

#[cfg(feature = "serde")]
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

    /// The latency histogram of the `evict` calls recorded so far.
    pub fn latency(&self) -> &LatencyHistogram {
        &self.latency
    }

    /// The figures so far.
    pub fn metrics(&self) -> EvictionMetrics {
        EvictionMetrics {
            latency: self.latency.summary(),
            ..self.m
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cumulative_counts_and_sum_of_known_values() {
        // Values in nanoseconds. Below 256 ns the histogram is exact; above,
        // these are multiples of their bucket width, so each is its bucket's
        // lowest value and only the bound's own bucket can round.
        let values: [u64; 8] = [1, 7, 100, 255, 1_000, 4_096, 1 << 20, 3 << 24];
        let mut h = LatencyHistogram::new();
        assert_eq!(h.cumulative_counts(&[1, 1_000]), [0, 0]);
        assert_eq!(h.sum_ns(), 0);
        for &ns in &values {
            h.record(Duration::from_nanos(ns));
        }
        let bounds = [
            0,
            1,
            6,
            7,
            254,
            255,
            999,
            1_000,
            4_096,
            (1 << 20) - 1,
            1 << 20,
            10_000_000,
            60_000_000_000,
            u64::MAX,
        ];
        // By hand: values <= each bound.
        let expected = [0, 1, 1, 2, 3, 4, 4, 5, 6, 6, 7, 7, 8, 8];
        assert_eq!(h.cumulative_counts(&bounds), expected);
        // The same by brute force over the recorded values.
        let brute: Vec<u64> = bounds
            .iter()
            .map(|&b| values.iter().filter(|&&v| v <= b).count() as u64)
            .collect();
        assert_eq!(brute, expected);
        assert_eq!(h.sum_ns(), 51_385_683);
        assert_eq!(
            h.sum_ns(),
            values.iter().map(|&v| u128::from(v)).sum::<u128>()
        );
        assert_eq!(h.len(), 8);
        assert_eq!(h.summary().mean_ns, 6_423_210); // 51_385_683 / 8, rounded

        // A bound inside a wider bucket counts the values of that bucket
        // (less than 1 % above it), never a value of the next one.
        let mut w = LatencyHistogram::new();
        w.record(Duration::from_nanos(1_002_000_000)); // 1.002 s: 1 s's bucket
        w.record(Duration::from_nanos(1_010_000_000)); // 1.01 s: beyond it
        assert_eq!(
            w.cumulative_counts(&[990_000_000, 1_000_000_000, 1_010_000_000]),
            [0, 1, 2]
        );

        // Merging adds counts and sums; clamping applies to the sum too.
        let mut m = LatencyHistogram::new();
        m.record(Duration::ZERO); // recorded as 1 ns
        m.record(Duration::from_secs(7_200)); // recorded as 1 hour
        m.merge(&h);
        assert_eq!(m.len(), 10);
        assert_eq!(m.sum_ns(), 51_385_683 + 1 + MAX_NS as u128);
        assert_eq!(m.cumulative_counts(&[1, MAX_NS]), [2, 10]);
        let c = m.clone();
        assert_eq!((c.len(), c.sum_ns()), (m.len(), m.sum_ns()));
    }
}
