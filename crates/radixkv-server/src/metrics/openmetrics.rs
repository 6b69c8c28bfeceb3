//! `GET /metrics`: the figures of one read ([`super::stats`]) and each
//! device's latency histograms as OpenMetrics families, through
//! `prometheus-client`'s collectors (the family table is in the module
//! above).

use super::stats::{DeviceStats, HttpStats};
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
use radixkv_engine::{DeviceLatencies, HostTierMetrics};
use std::collections::HashMap;

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
pub(super) struct BucketedHistogram {
    pub(super) sum_s: f64,
    pub(super) count: u64,
    /// `(upper bound in seconds, values in this bucket only)`, the last
    /// bound `+Inf`.
    pub(super) buckets: Vec<(f64, u64)>,
}

impl BucketedHistogram {
    pub(super) fn of(h: &LatencyHistogram) -> Self {
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
                (|d| d.metrics.tokens.copied.host_loaded_tokens) as fn(&DeviceStats) -> u64,
            ),
            (
                "peer_copied_tokens",
                "Prompt tokens of finished requests copied from another device instead of computed.",
                |d| d.metrics.tokens.copied.peer_copied_tokens,
            ),
            (
                "recomputed_tokens",
                "Prompt tokens of finished requests computed (neither cached, loaded nor copied).",
                |d| d.metrics.tokens.recomputed_tokens(),
            ),
            (
                "copy_bytes",
                "Bytes of KV copied into the device for host loads and peer copies.",
                |d| d.metrics.tokens.copied.bytes,
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
            |d| ConstCounter::new(d.metrics.tokens.copied.time.as_secs_f64()),
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
            |d| counter(d.metrics.tokens.prompt_tokens),
        )?;
        per_device(
            e,
            (
                "cached_tokens",
                "Prompt tokens of finished requests served from the prefix cache.",
                None,
            ),
            d,
            |d| counter(d.metrics.tokens.cached_tokens),
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
            |d| ConstGauge::new(d.metrics.tokens.hit_rate()),
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
            (
                "http_send_timeouts",
                "Connections closed because a response waited on its client past the send timeout (their requests cancelled).",
            ),
            counter(h.send_timeouts),
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
