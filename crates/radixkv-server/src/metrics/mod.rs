//! The server's own counters, `GET /stats` ([`Stats`], JSON) and
//! `GET /metrics` ([`prometheus`]: the OpenMetrics 1.0 text format, see
//! [`CONTENT_TYPE`]), encoded by `prometheus-client`.
//!
//! Every family's name starts with `radixkv_`; per-device families have
//! the label `device` (the device's index). Counters' samples end in
//! `_total` (their `# TYPE` line names the family without it, as
//! OpenMetrics has it); durations are in seconds.
//!
//! | Family | Type | Labels | What |
//! |---|---|---|---|
//! | `radixkv_requests` | counter | `device`, `outcome` (`finished`, `failed`) | requests the engine finished or failed |
//! | `radixkv_prompt_tokens` | counter | `device` | prompt tokens of finished requests |
//! | `radixkv_cached_tokens` | counter | `device` | of which served from the device's own prefix cache |
//! | `radixkv_host_loaded_tokens` | counter | `device` | of which loaded from the host tier |
//! | `radixkv_peer_copied_tokens` | counter | `device` | of which copied from another device |
//! | `radixkv_recomputed_tokens` | counter | `device` | of which computed |
//! | `radixkv_copy_bytes` | counter | `device` | KV bytes copied into the device (host loads, peer copies) |
//! | `radixkv_copy_seconds` | counter | `device` | model time of those copies |
//! | `radixkv_host_tier_pages` | gauge | `state` (`free`, `used`) | host tier pages (with a host tier) |
//! | `radixkv_host_tier_tokens` | gauge | | tokens on the host tier (with a host tier) |
//! | `radixkv_completion_tokens` | counter | `device` | output tokens of finished requests |
//! | `radixkv_cache_hit_rate` | gauge | `device` | cached / prompt tokens |
//! | `radixkv_outstanding_requests` | gauge | `device` | requests queued or running |
//! | `radixkv_pool_pages` | gauge | `device`, `state` (`free`, `used`) | KV pool pages |
//! | `radixkv_pinned_tokens` | gauge | `device` | tokens held by running requests |
//! | `radixkv_tree_tokens` | gauge | `device` | tokens cached in the tree |
//! | `radixkv_evictions` | counter | `device` | leaves evicted |
//! | `radixkv_evicted_tokens` | counter | `device` | tokens evicted |
//! | `radixkv_evicted_pages` | counter | `device` | pages returned to the pool by eviction |
//! | `radixkv_ttft_seconds` | histogram | `device` | arrival to first token of finished requests |
//! | `radixkv_e2e_seconds` | histogram | `device` | arrival to last token of finished requests |
//! | `radixkv_match_seconds` | histogram | `device` | match-and-pin latency at admission |
//! | `radixkv_insert_seconds` | histogram | `device` | cache insert latency (after prefill and at the end) |
//! | `radixkv_evict_seconds` | histogram | `device` | `evict` call latency (calls asking for at least one token) |
//! | `radixkv_http_responses` | counter | `code` | HTTP responses by status code |
//! | `radixkv_http_rejected_busy` | counter | | requests refused with 429 |
//! | `radixkv_http_disconnects` | counter | | requests cancelled because the client went away |
//! | `radixkv_http_in_flight` | gauge | | requests admitted and not finished |
//! | `radixkv_http_max_queue` | gauge | | capacity of the admission queue |
//!
//! The five latency families are real Prometheus histograms
//! (`_bucket{le=...}` at the bounds [`BUCKETS_S`] plus `+Inf`, `_sum`,
//! `_count`; every device's series exists from the start), built at each
//! scrape from the one record of each latency: the engine's hdrhistograms
//! (TTFT, end to end, match, insert) and the cache's (evict), read through
//! [`Engine::latency_histograms`](radixkv_engine::Engine::latency_histograms).
//! The server records none itself. `_count` is the number of values
//! recorded (requests finished, calls timed), `_sum` their exact sum;
//! bucket counts are exact to the hdrhistogram's resolution (a value less
//! than 1 % above a bound may count in it, see
//! [`LatencyHistogram::cumulative_counts`](radixkv::metrics::LatencyHistogram::cumulative_counts)).
//!
//! | file | what it holds |
//! | --- | --- |
//! | `stats.rs` | the HTTP layer's counters and the figures of one read ([`Stats`], `GET /stats`) |
//! | `openmetrics.rs` | the collectors and histograms of `GET /metrics` ([`prometheus`]) |

mod openmetrics;
mod stats;
#[cfg(test)]
mod tests;

pub use openmetrics::{prometheus, BUCKETS_S, CONTENT_TYPE};
pub use stats::{device_stats, stats, DeviceStats, HttpStats, ServerStats, Stats};
