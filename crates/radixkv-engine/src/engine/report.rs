//! What the engine reports: per device at shutdown, live while it runs,
//! and each device's latency histograms.

use crate::accounting::PromptTokens;
use crate::sched::scheduler::SchedulerStats;
use radixkv::device::DeviceId;
use radixkv::metrics::{EvictionMetrics, LatencyHistogram, LatencySummary};

/// One device's figures at shutdown.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceReport {
    /// The device.
    pub device: DeviceId,
    /// Its scheduler's counters.
    pub scheduler: SchedulerStats,
    /// What eviction did there.
    pub eviction: EvictionMetrics,
    /// KV pages in the pool (page 0 excluded).
    pub pool_pages: usize,
    /// Pages in use at shutdown (cached in the tree).
    pub used_pages: usize,
}

/// What the engine did, per device.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineReport {
    /// One entry per device.
    pub devices: Vec<DeviceReport>,
}

/// Live figures of one device since the engine started.
#[derive(Debug, Default)]
pub(super) struct DeviceLive {
    pub(super) finished: u64,
    pub(super) failed: u64,
    pub(super) tokens: PromptTokens,
    pub(super) output_tokens: u64,
    pub(super) ttft: LatencyHistogram,
    pub(super) e2e: LatencyHistogram,
    pub(super) matches: LatencyHistogram,
    pub(super) inserts: LatencyHistogram,
}

/// One device's live figures ([`Engine::metrics`](crate::Engine::metrics)): counters since the
/// engine started and latency summaries (wall time).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct DeviceMetrics {
    /// The device.
    pub device: u32,
    /// Requests finished.
    pub finished: u64,
    /// Requests failed, cancelled or stopped.
    pub failed: u64,
    /// Prompt tokens of finished requests and where they came from
    /// (serialized flat: `prompt_tokens`, `cached_tokens`, …, `hit_rate`;
    /// see [`PromptTokens`]).
    #[serde(flatten)]
    pub tokens: PromptTokens,
    /// Output tokens of finished requests.
    pub output_tokens: u64,
    /// Outstanding requests (queued or running).
    pub outstanding: usize,
    /// Free pages in the device's pool.
    pub pages_free: usize,
    /// Pages in use (cached or held by requests).
    pub pages_used: usize,
    /// Arrival to first token.
    pub ttft: LatencySummary,
    /// Arrival to completion.
    pub e2e: LatencySummary,
    /// Match-and-pin at admission.
    pub match_latency: LatencySummary,
    /// Inserts (after prefill and at the end).
    pub insert_latency: LatencySummary,
    /// Eviction on this device.
    pub eviction: EvictionMetrics,
}

/// The host tier's pages and tokens ([`Engine::host_tier`](crate::Engine::host_tier)), summed over
/// the engine's trees (one shared tree, or each private tree's share).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct HostTierMetrics {
    /// Free pages.
    pub pages_free: usize,
    /// Pages in use (cached or held by copies in flight).
    pub pages_used: usize,
    /// Tokens resident on the host tier.
    pub tokens: usize,
}

/// Latency histograms of finished requests ([`Engine::latencies`](crate::Engine::latencies)).
#[derive(Debug, Default)]
pub struct Latencies {
    /// Arrival to first token.
    pub ttft: LatencyHistogram,
    /// Arrival to completion.
    pub e2e: LatencyHistogram,
}

/// One device's raw latency histograms ([`Engine::latency_histograms`](crate::Engine::latency_histograms)):
/// copies of the engine's and the cache's only records of them, for
/// exposition as buckets (the server's `/metrics`). Durations in
/// nanoseconds, wall time, since the engine started.
#[derive(Clone, Debug, Default)]
pub struct DeviceLatencies {
    /// The device.
    pub device: u32,
    /// Arrival to first token of finished requests.
    pub ttft: LatencyHistogram,
    /// Arrival to completion of finished requests.
    pub e2e: LatencyHistogram,
    /// Match-and-pin at admission.
    pub matches: LatencyHistogram,
    /// Inserts (after prefill and at the end).
    pub inserts: LatencyHistogram,
    /// `evict` calls on this device (the cache's record; see
    /// [`RadixCache::eviction_latency`](radixkv::RadixCache::eviction_latency)).
    pub evict: LatencyHistogram,
}
