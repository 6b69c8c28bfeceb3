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
//! [`LatencyHistogram::cumulative_counts`]).

use prometheus_client::collector::Collector;
use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeLabelSet, EncodeMetric, MetricEncoder, NoLabelSet,
};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::exemplar::Exemplar;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::{Registry, Unit};
use radixkv::metrics::LatencyHistogram;
use radixkv::{DeviceId, PagedCache};
use radixkv_engine::{DeviceLatencies, DeviceMetrics, HostTierMetrics};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

/// The `Content-Type` of [`prometheus`]'s text (OpenMetrics 1.0.0, what
/// `prometheus_client::encoding::text` writes; Prometheus scrapes it).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Upper bounds of the latency histograms' buckets, in seconds (plus
/// `+Inf`).
pub const BUCKETS_S: [f64; 16] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0,
];

/// The labels of a per-device series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DeviceLabels {
    device: u32,
}

impl DeviceLabels {
    fn of(d: &DeviceStats) -> Self {
        DeviceLabels {
            device: d.metrics.device,
        }
    }
}

/// A latency histogram read for one scrape, as a Prometheus histogram
/// with the buckets [`BUCKETS_S`] (seconds) and `+Inf`: the exact sum and
/// count of the values recorded and each bucket's own (not cumulative)
/// count, which the encoder accumulates.
#[derive(Clone, Debug, PartialEq)]
struct BucketedHistogram {
    sum_s: f64,
    count: u64,
    /// `(upper bound in seconds, values in this bucket only)`, the last
    /// bound `+Inf`.
    buckets: Vec<(f64, u64)>,
}

impl BucketedHistogram {
    fn of(h: &LatencyHistogram) -> Self {
        let bounds_ns: Vec<u64> = BUCKETS_S
            .iter()
            .map(|&s| (s * 1e9).round() as u64)
            .collect();
        let count = h.len();
        let mut below = 0;
        let mut buckets = Vec::with_capacity(BUCKETS_S.len() + 1);
        for (&le, at_or_below) in BUCKETS_S.iter().zip(h.cumulative_counts(&bounds_ns)) {
            // Non-decreasing and at most `count` already; the clamp only
            // keeps the exposition cumulative should that ever fail.
            let at_or_below = at_or_below.clamp(below, count);
            buckets.push((le, at_or_below - below));
            below = at_or_below;
        }
        buckets.push((f64::INFINITY, count.saturating_sub(below)));
        BucketedHistogram {
            sum_s: h.sum_ns() as f64 / 1e9,
            count,
            buckets,
        }
    }
}

impl TypedMetric for BucketedHistogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for BucketedHistogram {
    fn encode(&self, mut encoder: MetricEncoder) -> std::fmt::Result {
        encoder.encode_histogram::<NoLabelSet>(
            self.sum_s,
            self.count,
            &self.buckets,
            None::<&HashMap<usize, Exemplar<NoLabelSet, f64>>>,
        )
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

/// What the HTTP layer counted since the server started.
#[derive(Debug, Default)]
pub struct ServerStats {
    /// Responses per HTTP status code.
    responses: Mutex<BTreeMap<u16, u64>>,
    /// Requests refused with 429.
    pub rejected_busy: AtomicU64,
    /// Requests cancelled because their client went away.
    pub disconnects: AtomicU64,
}

impl ServerStats {
    /// Zero counters.
    pub fn new() -> Self {
        Self::default()
    }

    /// Counts one response.
    pub fn response(&self, code: u16) {
        if let Ok(mut m) = self.responses.lock() {
            *m.entry(code).or_default() += 1;
        }
    }

    /// Responses per status code.
    pub fn responses(&self) -> BTreeMap<u16, u64> {
        self.responses.lock().map(|m| m.clone()).unwrap_or_default()
    }
}

/// One device in [`Stats`].
#[derive(Clone, Debug, Serialize)]
pub struct DeviceStats {
    /// The engine's live figures.
    #[serde(flatten)]
    pub metrics: DeviceMetrics,
    /// Tokens on a pinned path (held by running requests).
    pub pinned_tokens: usize,
    /// Tokens cached in the tree on this device.
    pub tree_tokens: usize,
}

/// The HTTP layer's figures in [`Stats`].
#[derive(Clone, Debug, Serialize)]
pub struct HttpStats {
    /// Requests admitted and not finished.
    pub in_flight: usize,
    /// The admission queue's capacity.
    pub max_queue: usize,
    /// Requests refused with 429.
    pub rejected_busy: u64,
    /// Requests cancelled because their client went away.
    pub disconnects: u64,
    /// Responses per status code.
    pub responses: BTreeMap<u16, u64>,
    /// Seconds since the server started.
    pub uptime_s: f64,
    /// Whether a graceful shutdown is under way.
    pub draining: bool,
}

/// `GET /stats`.
#[derive(Clone, Debug, Serialize)]
pub struct Stats {
    /// The engine is idle (nothing admitted, queued or running), no token
    /// is pinned and the caches pass their audit (invariants and page
    /// conservation: every used page is cached in the tree, none is held
    /// by a request).
    pub audit_ok: bool,
    /// Why `audit_ok` is false.
    pub audit_error: Option<String>,
    /// Requests queued or running in the engine, all devices.
    pub outstanding: usize,
    /// Pinned tokens, all devices.
    pub pinned_tokens: usize,
    /// Per device.
    pub devices: Vec<DeviceStats>,
    /// The host tier shared by the devices (absent without one).
    pub host_tier: Option<HostTierMetrics>,
    /// The HTTP layer.
    pub http: HttpStats,
}

/// The engine's figures per device plus pinned and cached tokens from a
/// scan of each device's tree (`caches[d]`: device `d`'s cache and its id
/// there).
pub fn device_stats(
    metrics: Vec<DeviceMetrics>,
    caches: &[(Arc<PagedCache>, DeviceId)],
) -> Vec<DeviceStats> {
    metrics
        .into_iter()
        .enumerate()
        .map(|(d, metrics)| {
            let sizes = caches
                .get(d)
                .and_then(|(cache, dev)| cache.sizes(*dev).ok())
                .unwrap_or_default();
            DeviceStats {
                metrics,
                pinned_tokens: sizes.protected,
                tree_tokens: sizes.total,
            }
        })
        .collect()
}

/// Builds [`Stats`]; runs `audit` (the engine's) only when nothing is in
/// flight.
pub fn stats(
    devices: Vec<DeviceStats>,
    host_tier: Option<HostTierMetrics>,
    http: HttpStats,
    audit: impl FnOnce() -> Result<(), String>,
) -> Stats {
    let outstanding: usize = devices.iter().map(|d| d.metrics.outstanding).sum();
    let pinned_tokens: usize = devices.iter().map(|d| d.pinned_tokens).sum();
    let audit_error = if http.in_flight > 0 || outstanding > 0 {
        Some(format!(
            "busy: {} requests in flight, {outstanding} outstanding in the engine (audit skipped)",
            http.in_flight
        ))
    } else if pinned_tokens > 0 {
        Some(format!("{pinned_tokens} tokens pinned while idle"))
    } else {
        audit().err()
    };
    Stats {
        audit_ok: audit_error.is_none(),
        audit_error,
        outstanding,
        pinned_tokens,
        devices,
        host_tier,
        http,
    }
}

/// Renders `GET /metrics` ([`CONTENT_TYPE`]): a [`Registry`] of
/// collectors of the engine's, the trees' and the HTTP layer's figures
/// read for this scrape (`devices`, `http`) and of each device's latency
/// histograms (`latencies`, from
/// [`Engine::latency_histograms`](radixkv_engine::Engine::latency_histograms),
/// one entry per device), encoded by
/// `prometheus_client::encoding::text::encode`.
pub fn prometheus(
    devices: Vec<DeviceStats>,
    host_tier: Option<HostTierMetrics>,
    latencies: Vec<DeviceLatencies>,
    http: HttpStats,
    kv_events: Option<Vec<radixkv_events::SocketStats>>,
) -> Result<String, std::fmt::Error> {
    let mut registry = Registry::with_prefix("radixkv");
    registry.register_collector(Box::new(EngineFigures(devices, host_tier)));
    registry.register_collector(Box::new(LatencyFigures(latencies)));
    registry.register_collector(Box::new(HttpFigures(http)));
    if let Some(k) = kv_events {
        registry.register_collector(Box::new(KvEventFigures(k)));
    }
    let mut out = String::new();
    encode(&mut out, &registry)?;
    Ok(out)
}

/// One family: its descriptor, then each `(labels, metric)` series.
fn family<L: EncodeLabelSet, M: EncodeMetric + TypedMetric>(
    enc: &mut DescriptorEncoder,
    (name, help, unit): (&str, &str, Option<&Unit>),
    series: impl IntoIterator<Item = (L, M)>,
) -> std::fmt::Result {
    let mut family = enc.encode_descriptor(name, help, unit, M::TYPE)?;
    for (labels, metric) in series {
        metric.encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

/// One family with one series per device.
fn per_device<M: EncodeMetric + TypedMetric>(
    enc: &mut DescriptorEncoder,
    descriptor: (&str, &str, Option<&Unit>),
    devices: &[DeviceStats],
    value: impl Fn(&DeviceStats) -> M,
) -> std::fmt::Result {
    let series = devices.iter().map(|d| (DeviceLabels::of(d), value(d)));
    family(enc, descriptor, series)
}

/// One family split by device and by a second label `label`: one series
/// per device and `(value of label, reading)` pair.
fn per_device_split<M: EncodeMetric + TypedMetric>(
    enc: &mut DescriptorEncoder,
    descriptor: (&str, &str, Option<&Unit>),
    devices: &[DeviceStats],
    label: &'static str,
    parts: impl Fn(&DeviceStats) -> Vec<(&'static str, M)>,
) -> std::fmt::Result {
    let series = devices.iter().flat_map(|d| {
        parts(d)
            .into_iter()
            .map(move |(value, m)| ((DeviceLabels::of(d), [(label, value)]), m))
    });
    family(enc, descriptor, series)
}

/// One family with a single series and no labels.
fn single<M: EncodeMetric + TypedMetric>(
    enc: &mut DescriptorEncoder,
    (name, help): (&str, &str),
    metric: M,
) -> std::fmt::Result {
    metric.encode(enc.encode_descriptor(name, help, None, M::TYPE)?)
}

fn counter(v: u64) -> ConstCounter<u64> {
    ConstCounter::new(v)
}

fn gauge(v: usize) -> ConstGauge<u64> {
    ConstGauge::new(u64::try_from(v).unwrap_or(u64::MAX))
}

/// The engine's and the trees' figures of one scrape, per device.
#[derive(Debug)]
struct EngineFigures(Vec<DeviceStats>, Option<HostTierMetrics>);

impl Collector for EngineFigures {
    fn encode(&self, mut enc: DescriptorEncoder) -> std::fmt::Result {
        let d = &self.0;
        let e = &mut enc;
        for (name, help, f) in [
            (
                "host_loaded_tokens",
                "Prompt tokens of finished requests loaded from the host tier instead of computed.",
                (|d| d.metrics.host_loaded_tokens) as fn(&DeviceStats) -> u64,
            ),
            (
                "peer_copied_tokens",
                "Prompt tokens of finished requests copied from another device instead of computed.",
                |d| d.metrics.peer_copied_tokens,
            ),
            (
                "recomputed_tokens",
                "Prompt tokens of finished requests computed (neither cached, loaded nor copied).",
                |d| d.metrics.recomputed_tokens,
            ),
            (
                "copy_bytes",
                "Bytes of KV copied into the device for host loads and peer copies.",
                |d| d.metrics.copy_bytes,
            ),
        ] {
            per_device(e, (name, help, None), d, |d| counter(f(d)))?;
        }
        per_device(
            e,
            (
                "copy_seconds",
                "Model time of the KV copied into the device (the tier cost model).",
                None,
            ),
            d,
            |d| ConstCounter::new(d.metrics.copy_time_s),
        )?;
        if let Some(h) = &self.1 {
            family(
                e,
                (
                    "host_tier_pages",
                    "Host tier pages (shared by the devices), free or used.",
                    None,
                ),
                [
                    (vec![("state", "free")], gauge(h.pages_free)),
                    (vec![("state", "used")], gauge(h.pages_used)),
                ],
            )?;
            family(
                e,
                (
                    "host_tier_tokens",
                    "Tokens resident on the host tier.",
                    None,
                ),
                [(Vec::<(&str, &str)>::new(), gauge(h.tokens))],
            )?;
        }
        per_device_split(
            e,
            (
                "requests",
                "Requests the engine finished or failed (including cancelled), per device.",
                None,
            ),
            d,
            "outcome",
            |d| {
                vec![
                    ("finished", counter(d.metrics.finished)),
                    ("failed", counter(d.metrics.failed)),
                ]
            },
        )?;
        per_device(
            e,
            ("prompt_tokens", "Prompt tokens of finished requests.", None),
            d,
            |d| counter(d.metrics.prompt_tokens),
        )?;
        per_device(
            e,
            (
                "cached_tokens",
                "Prompt tokens of finished requests served from the prefix cache.",
                None,
            ),
            d,
            |d| counter(d.metrics.cached_tokens),
        )?;
        per_device(
            e,
            (
                "completion_tokens",
                "Output tokens of finished requests.",
                None,
            ),
            d,
            |d| counter(d.metrics.output_tokens),
        )?;
        per_device(
            e,
            (
                "cache_hit_rate",
                "Cached prompt tokens / prompt tokens of finished requests.",
                None,
            ),
            d,
            |d| ConstGauge::new(d.metrics.hit_rate),
        )?;
        per_device(
            e,
            ("outstanding_requests", "Requests queued or running.", None),
            d,
            |d| gauge(d.metrics.outstanding),
        )?;
        per_device_split(
            e,
            (
                "pool_pages",
                "KV pool pages per device, free or used (cached or held by requests).",
                None,
            ),
            d,
            "state",
            |d| {
                vec![
                    ("free", gauge(d.metrics.pages_free)),
                    ("used", gauge(d.metrics.pages_used)),
                ]
            },
        )?;
        per_device(
            e,
            (
                "pinned_tokens",
                "Tokens on a pinned path (held by running requests).",
                None,
            ),
            d,
            |d| gauge(d.pinned_tokens),
        )?;
        per_device(
            e,
            ("tree_tokens", "Tokens cached in the tree.", None),
            d,
            |d| gauge(d.tree_tokens),
        )?;
        per_device(e, ("evictions", "Leaves evicted.", None), d, |d| {
            counter(d.metrics.eviction.evicted_leaves)
        })?;
        per_device(e, ("evicted_tokens", "Tokens evicted.", None), d, |d| {
            counter(d.metrics.eviction.evicted_tokens)
        })?;
        per_device(
            e,
            (
                "evicted_pages",
                "Pages returned to the pool by eviction.",
                None,
            ),
            d,
            |d| counter(d.metrics.eviction.evicted_pages),
        )?;
        Ok(())
    }
}

/// Which of a device's latency histograms a family exposes.
type Pick = fn(&DeviceLatencies) -> &LatencyHistogram;

/// Each device's latency histograms of one scrape.
#[derive(Debug)]
struct LatencyFigures(Vec<DeviceLatencies>);

impl Collector for LatencyFigures {
    fn encode(&self, mut enc: DescriptorEncoder) -> std::fmt::Result {
        let e = &mut enc;
        let s = Some(&Unit::Seconds);
        let families: [(&str, &str, Pick); 5] = [
            (
                "ttft",
                "Arrival to first token of finished requests.",
                |d| &d.ttft,
            ),
            ("e2e", "Arrival to last token of finished requests.", |d| {
                &d.e2e
            }),
            ("match", "Match-and-pin latency at admission.", |d| {
                &d.matches
            }),
            (
                "insert",
                "Cache insert latency (after prefill and at the end).",
                |d| &d.inserts,
            ),
            (
                "evict",
                "Eviction call latency (calls asking for at least one token).",
                |d| &d.evict,
            ),
        ];
        for (name, help, of) in families {
            let series = self.0.iter().map(|d| {
                (
                    DeviceLabels { device: d.device },
                    BucketedHistogram::of(of(d)),
                )
            });
            family(e, (name, help, s), series)?;
        }
        Ok(())
    }
}

/// The HTTP layer's figures of one scrape.
#[derive(Debug)]
struct HttpFigures(HttpStats);

/// The KV-event publisher's counters, one series per device socket.
#[derive(Debug)]
struct KvEventFigures(Vec<radixkv_events::SocketStats>);

impl Collector for KvEventFigures {
    fn encode(&self, mut enc: DescriptorEncoder) -> std::fmt::Result {
        let e = &mut enc;
        let by_device = |f: fn(&radixkv_events::SocketStats) -> u64| {
            self.0
                .iter()
                .enumerate()
                .map(move |(d, s)| ([("device", d as u32)], counter(f(s))))
        };
        family(
            e,
            (
                "kv_events_batches",
                "KV-event batches published, per device socket.",
                None,
            ),
            by_device(|s| s.batches),
        )?;
        family(
            e,
            ("kv_events", "KV events published, per device socket.", None),
            by_device(|s| s.events),
        )?;
        family(
            e,
            (
                "kv_events_dropped",
                "KV events not sent because the device's queue was full, or because they depend on a store dropped so (a router that missed them must resynchronise).",
                None,
            ),
            by_device(|s| s.dropped_events),
        )?;
        family(
            e,
            (
                "kv_events_replays",
                "Replay requests answered, per device.",
                None,
            ),
            by_device(|s| s.replays),
        )?;
        family(
            e,
            (
                "kv_events_remembered_nodes",
                "Nodes whose block ids the device socket's task keeps (for their children's stores and their removals): bounded by what the device and the host tier hold.",
                None,
            ),
            self.0.iter().enumerate().map(|(d, s)| {
                (
                    [("device", d as u32)],
                    gauge(usize::try_from(s.remembered_nodes).unwrap_or(usize::MAX)),
                )
            }),
        )
    }
}

impl Collector for HttpFigures {
    fn encode(&self, mut enc: DescriptorEncoder) -> std::fmt::Result {
        let h = &self.0;
        let e = &mut enc;
        family(
            e,
            ("http_responses", "HTTP responses by status code.", None),
            h.responses
                .iter()
                .map(|(&code, &n)| ([("code", code)], counter(n))),
        )?;
        single(
            e,
            (
                "http_rejected_busy",
                "Requests refused with 429 (admission queue full).",
            ),
            counter(h.rejected_busy),
        )?;
        single(
            e,
            (
                "http_disconnects",
                "Requests cancelled because the client went away.",
            ),
            counter(h.disconnects),
        )?;
        single(
            e,
            ("http_in_flight", "Requests admitted and not finished."),
            gauge(h.in_flight),
        )?;
        single(
            e,
            ("http_max_queue", "Capacity of the admission queue."),
            gauge(h.max_queue),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn http() -> HttpStats {
        HttpStats {
            in_flight: 1,
            max_queue: 8,
            rejected_busy: 2,
            disconnects: 3,
            responses: BTreeMap::from([(200, 5), (429, 2)]),
            uptime_s: 1.0,
            draining: false,
        }
    }

    fn device(device: u32) -> DeviceStats {
        let metrics = DeviceMetrics {
            device,
            finished: 4,
            pages_free: 10,
            pages_used: 6,
            ..DeviceMetrics::default()
        };
        DeviceStats {
            metrics,
            pinned_tokens: 0,
            tree_tokens: 96,
        }
    }

    fn latencies(devices: u32) -> Vec<DeviceLatencies> {
        (0..devices)
            .map(|device| DeviceLatencies {
                device,
                ..DeviceLatencies::default()
            })
            .collect()
    }

    fn lines<'a>(text: &'a str, prefix: &str) -> Vec<&'a str> {
        text.lines().filter(|l| l.starts_with(prefix)).collect()
    }

    /// The `_bucket` lines of `name` on `device`.
    fn buckets<'a>(text: &'a str, name: &str, device: u32) -> Vec<&'a str> {
        lines(text, &format!("{name}_bucket{{"))
            .into_iter()
            .filter(|l| l.contains(&format!("device=\"{device}\"")))
            .collect()
    }

    #[test]
    fn histograms_have_cumulative_buckets_sum_and_count() {
        let ms = Duration::from_millis;
        let mut l = latencies(2);
        for (ttft, e2e) in [
            (Duration::from_micros(100), ms(3)),
            (ms(3), ms(40)),
            (Duration::from_secs(100), Duration::from_secs(100)),
        ] {
            l[1].ttft.record(ttft);
            l[1].e2e.record(e2e);
        }
        l[0].matches.record(Duration::from_micros(20));
        l[0].matches.record(ms(2));
        l[0].inserts.record(ms(7));
        l[1].evict.record(Duration::from_secs(90));
        let events = vec![
            radixkv_events::SocketStats {
                batches: 3,
                events: 7,
                dropped_events: 1,
                remembered_nodes: 5,
                ..Default::default()
            };
            2
        ];
        let text = prometheus(vec![device(0), device(1)], None, l, http(), Some(events)).unwrap();
        assert!(text.ends_with("# EOF\n"), "{text}");
        assert!(
            text.contains("radixkv_kv_events_total{device=\"1\"} 7\n"),
            "{text}"
        );
        assert!(
            text.contains("radixkv_kv_events_dropped_total{device=\"0\"} 1\n")
                && text.contains("radixkv_kv_events_remembered_nodes{device=\"1\"} 5\n"),
            "{text}"
        );
        assert!(
            text.contains("radixkv_kv_events_batches_total{device=\"0\"} 3\n"),
            "{text}"
        );
        for name in ["ttft", "e2e", "match", "insert", "evict"] {
            let family = format!("radixkv_{name}_seconds");
            assert!(
                text.contains(&format!("# TYPE {family} histogram\n")),
                "{text}"
            );
            assert!(
                text.contains(&format!("# UNIT {family} seconds\n")),
                "{text}"
            );
            for device in 0..2 {
                let b = buckets(&text, &family, device);
                assert_eq!(b.len(), BUCKETS_S.len() + 1, "{text}");
                assert!(b[BUCKETS_S.len()].starts_with(&format!("{family}_bucket{{le=\"+Inf\"")));
            }
        }
        let d1 = buckets(&text, "radixkv_ttft_seconds", 1);
        assert_eq!(
            d1[0],
            "radixkv_ttft_seconds_bucket{le=\"0.0005\",device=\"1\"} 1"
        );
        assert_eq!(
            d1[3],
            "radixkv_ttft_seconds_bucket{le=\"0.005\",device=\"1\"} 2"
        );
        assert_eq!(
            d1[15],
            "radixkv_ttft_seconds_bucket{le=\"60.0\",device=\"1\"} 2"
        );
        assert_eq!(
            d1[16],
            "radixkv_ttft_seconds_bucket{le=\"+Inf\",device=\"1\"} 3"
        );
        for line in [
            "radixkv_ttft_seconds_count{device=\"1\"} 3",
            "radixkv_ttft_seconds_count{device=\"0\"} 0",
            "radixkv_ttft_seconds_sum{device=\"0\"} 0.0",
            "radixkv_ttft_seconds_bucket{le=\"+Inf\",device=\"0\"} 0",
            "radixkv_e2e_seconds_count{device=\"1\"} 3",
            "radixkv_e2e_seconds_bucket{le=\"0.0025\",device=\"1\"} 0",
            "radixkv_e2e_seconds_bucket{le=\"0.005\",device=\"1\"} 1",
            "radixkv_e2e_seconds_bucket{le=\"0.05\",device=\"1\"} 2",
            "radixkv_match_seconds_count{device=\"0\"} 2",
            "radixkv_match_seconds_bucket{le=\"0.0005\",device=\"0\"} 1",
            "radixkv_match_seconds_bucket{le=\"0.0025\",device=\"0\"} 2",
            "radixkv_match_seconds_count{device=\"1\"} 0",
            "radixkv_insert_seconds_count{device=\"0\"} 1",
            "radixkv_insert_seconds_bucket{le=\"0.005\",device=\"0\"} 0",
            "radixkv_insert_seconds_bucket{le=\"0.01\",device=\"0\"} 1",
            "radixkv_evict_seconds_count{device=\"1\"} 1",
            "radixkv_evict_seconds_bucket{le=\"60.0\",device=\"1\"} 0",
            "radixkv_evict_seconds_bucket{le=\"+Inf\",device=\"1\"} 1",
            "radixkv_evict_seconds_sum{device=\"1\"} 90.0",
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
        }
        let sum = lines(&text, "radixkv_ttft_seconds_sum{device=\"1\"} ")[0];
        let sum: f64 = sum.rsplit(' ').next().unwrap().parse().unwrap();
        assert!((sum - 100.0031).abs() < 1e-9, "{sum}");
        let sum = lines(&text, "radixkv_match_seconds_sum{device=\"0\"} ")[0];
        let sum: f64 = sum.rsplit(' ').next().unwrap().parse().unwrap();
        assert!((sum - 0.00202).abs() < 1e-12, "{sum}");
    }

    #[test]
    fn bucketed_histogram_of_an_hdr_histogram() {
        let mut h = LatencyHistogram::new();
        assert_eq!(
            BucketedHistogram::of(&h).buckets,
            BUCKETS_S
                .iter()
                .copied()
                .chain([f64::INFINITY])
                .map(|le| (le, 0))
                .collect::<Vec<_>>()
        );
        for us in [1, 400, 600, 600, 30_000] {
            h.record(Duration::from_micros(us));
        }
        h.record(Duration::from_secs(61));
        let b = BucketedHistogram::of(&h);
        assert_eq!(b.count, 6);
        assert!((b.sum_s - 61.031_601).abs() < 1e-9, "{}", b.sum_s);
        // Per bucket, not cumulative: 0.0005 holds 1 µs and 400 µs, 0.001
        // the two 600 µs, 0.05 the 30 ms, +Inf the 61 s.
        let own: Vec<u64> = b.buckets.iter().map(|&(_, n)| n).collect();
        assert_eq!(own, [2, 2, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        assert_eq!(own.iter().sum::<u64>(), b.count);
    }

    #[test]
    fn engine_and_http_families() {
        let host = HostTierMetrics {
            pages_free: 30,
            pages_used: 2,
            tokens: 32,
        };
        let mut d = device(0);
        d.metrics.peer_copied_tokens = 512;
        d.metrics.copy_time_s = 0.25;
        let text = prometheus(vec![d], Some(host), latencies(1), http(), None).unwrap();
        for line in [
            "radixkv_peer_copied_tokens_total{device=\"0\"} 512",
            "radixkv_host_loaded_tokens_total{device=\"0\"} 0",
            "radixkv_copy_seconds_total{device=\"0\"} 0.25",
            "radixkv_host_tier_pages{state=\"free\"} 30",
            "radixkv_host_tier_pages{state=\"used\"} 2",
            "radixkv_host_tier_tokens 32",
            "# TYPE radixkv_requests counter",
            "radixkv_requests_total{device=\"0\",outcome=\"finished\"} 4",
            "radixkv_requests_total{device=\"0\",outcome=\"failed\"} 0",
            "# TYPE radixkv_pool_pages gauge",
            "radixkv_pool_pages{device=\"0\",state=\"free\"} 10",
            "radixkv_pool_pages{device=\"0\",state=\"used\"} 6",
            "radixkv_tree_tokens{device=\"0\"} 96",
            "radixkv_cache_hit_rate{device=\"0\"} 0.0",
            "# TYPE radixkv_match_seconds histogram",
            "# UNIT radixkv_match_seconds seconds",
            "radixkv_match_seconds_count{device=\"0\"} 0",
            "radixkv_evict_seconds_count{device=\"0\"} 0",
            "radixkv_http_responses_total{code=\"200\"} 5",
            "radixkv_http_responses_total{code=\"429\"} 2",
            "radixkv_http_rejected_busy_total 2",
            "radixkv_http_disconnects_total 3",
            "radixkv_http_in_flight 1",
            "radixkv_http_max_queue 8",
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
        }
        // No quantile gauges, no call counters beside the histograms.
        assert!(!text.contains("quantile="), "{text}");
        assert!(!text.contains("radixkv_matches_total"), "{text}");
        // Every family has one HELP and one TYPE line.
        let types = lines(&text, "# TYPE ");
        assert_eq!(types.len(), lines(&text, "# HELP ").len());
        assert_eq!(types.len(), 29, "{text}");
        // Without a host tier, no host-tier families.
        let plain = prometheus(vec![device(0)], None, latencies(1), http(), None).unwrap();
        assert!(!plain.contains("host_tier"), "{plain}");
    }
}
