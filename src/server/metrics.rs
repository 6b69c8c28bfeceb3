//! The server's own counters, `GET /stats` ([`Stats`], JSON) and
//! `GET /metrics` (Prometheus text exposition format 0.0.4).

use crate::engine::DeviceMetrics;
use crate::metrics::LatencySummary;
use crate::sched::scheduler::Completion;
use crate::{DeviceId, RadixCache};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Upper bounds of the latency histograms' buckets, in seconds.
pub const BUCKETS_S: [f64; 16] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0,
];

/// A Prometheus histogram of durations with the fixed [`BUCKETS_S`].
#[derive(Debug, Default)]
pub struct Histogram {
    /// Non-cumulative counts; the last slot is `+Inf`.
    counts: [AtomicU64; BUCKETS_S.len() + 1],
    sum_ns: AtomicU64,
}

impl Histogram {
    /// Records one duration.
    pub fn record(&self, d: Duration) {
        let s = d.as_secs_f64();
        let i = BUCKETS_S
            .iter()
            .position(|&b| s <= b)
            .unwrap_or(BUCKETS_S.len());
        // Relaxed: independent counters, read for reporting only.
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(
            u64::try_from(d.as_nanos()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    /// Cumulative counts per bucket (the last is `+Inf`, the total) and the
    /// sum in seconds.
    pub fn snapshot(&self) -> (Vec<u64>, f64) {
        let mut acc = 0;
        let cum = self
            .counts
            .iter()
            .map(|c| {
                acc += c.load(Ordering::Relaxed);
                acc
            })
            .collect();
        (cum, self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9)
    }
}

/// What the HTTP layer counted since the server started.
#[derive(Debug)]
pub struct ServerStats {
    /// Responses per HTTP status code.
    responses: Mutex<BTreeMap<u16, u64>>,
    /// Requests refused with 429.
    pub rejected_busy: AtomicU64,
    /// Requests cancelled because their client went away.
    pub disconnects: AtomicU64,
    /// Arrival to first token per device, as completions report it.
    pub ttft: Vec<Histogram>,
    /// Arrival to last token per device.
    pub e2e: Vec<Histogram>,
}

impl ServerStats {
    /// Counters for `devices` devices.
    pub fn new(devices: usize) -> Self {
        ServerStats {
            responses: Mutex::default(),
            rejected_busy: AtomicU64::new(0),
            disconnects: AtomicU64::new(0),
            ttft: (0..devices).map(|_| Histogram::default()).collect(),
            e2e: (0..devices).map(|_| Histogram::default()).collect(),
        }
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

    /// Records a successful completion's latencies.
    pub fn completed(&self, c: &Completion) {
        let d = c.device.index();
        if let (Some(t), Some(e)) = (self.ttft.get(d), self.e2e.get(d)) {
            t.record(c.ttft);
            e.record(c.e2e);
        }
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
    /// The HTTP layer.
    pub http: HttpStats,
}

/// The engine's figures per device plus pinned and cached tokens from a
/// scan of each device's tree (`caches[d]`: device `d`'s cache and its id
/// there).
pub fn device_stats(
    metrics: Vec<DeviceMetrics>,
    caches: &[(Arc<RadixCache>, DeviceId)],
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
        http,
    }
}

struct Family<'a> {
    out: &'a mut String,
}

/// One per-device reading of a metric.
type Reading = dyn Fn(&DeviceStats) -> u64;

impl Family<'_> {
    fn head(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.out, "# HELP {name} {help}");
        let _ = writeln!(self.out, "# TYPE {name} {kind}");
    }

    fn line(&mut self, name: &str, labels: &str, v: impl std::fmt::Display) {
        let _ = writeln!(self.out, "{name}{{{labels}}} {v}");
    }

    /// One family split by device and by a second label: `(value of
    /// label, reading)` pairs.
    fn per_device_split(
        &mut self,
        (name, kind, help): (&str, &str, &str),
        devices: &[DeviceStats],
        label: &str,
        parts: &[(&str, &Reading)],
    ) {
        self.head(name, kind, help);
        for d in devices {
            for (value, f) in parts {
                let labels = format!("device=\"{}\",{label}=\"{value}\"", d.metrics.device);
                self.line(name, &labels, f(d));
            }
        }
    }

    fn per_device<T: std::fmt::Display>(
        &mut self,
        name: &str,
        kind: &str,
        help: &str,
        devices: &[DeviceStats],
        f: impl Fn(&DeviceStats) -> T,
    ) {
        self.head(name, kind, help);
        for d in devices {
            self.line(name, &format!("device=\"{}\"", d.metrics.device), f(d));
        }
    }

    fn summary(
        &mut self,
        name: &str,
        help: &str,
        devices: &[DeviceStats],
        f: impl Fn(&DeviceStats) -> &LatencySummary,
    ) {
        self.head(name, "summary", help);
        for d in devices {
            let s = f(d);
            let dev = d.metrics.device;
            for (q, v) in [
                ("0.5", s.p50_ns),
                ("0.9", s.p90_ns),
                ("0.99", s.p99_ns),
                ("0.999", s.p999_ns),
            ] {
                self.line(
                    name,
                    &format!("device=\"{dev}\",quantile=\"{q}\""),
                    v as f64 / 1e9,
                );
            }
            let sum = s.mean_ns as f64 * s.count as f64 / 1e9;
            self.line(&format!("{name}_sum"), &format!("device=\"{dev}\""), sum);
            self.line(
                &format!("{name}_count"),
                &format!("device=\"{dev}\""),
                s.count,
            );
        }
    }

    fn histogram(&mut self, name: &str, help: &str, per_device: &[Histogram]) {
        self.head(name, "histogram", help);
        for (dev, h) in per_device.iter().enumerate() {
            let (cum, sum) = h.snapshot();
            for (i, c) in cum.iter().enumerate() {
                let le = BUCKETS_S
                    .get(i)
                    .map_or_else(|| "+Inf".to_string(), |b| b.to_string());
                self.line(
                    &format!("{name}_bucket"),
                    &format!("device=\"{dev}\",le=\"{le}\""),
                    c,
                );
            }
            let total = cum.last().copied().unwrap_or(0);
            self.line(&format!("{name}_sum"), &format!("device=\"{dev}\""), sum);
            self.line(
                &format!("{name}_count"),
                &format!("device=\"{dev}\""),
                total,
            );
        }
    }
}

/// Renders `GET /metrics`.
pub fn prometheus(devices: &[DeviceStats], server: &ServerStats, http: &HttpStats) -> String {
    let mut out = String::new();
    let mut f = Family { out: &mut out };
    f.per_device_split(
        (
            "radixkv_requests_total",
            "counter",
            "Requests the engine finished or failed (including cancelled), per device.",
        ),
        devices,
        "outcome",
        &[
            ("finished", &|d| d.metrics.finished),
            ("failed", &|d| d.metrics.failed),
        ],
    );
    f.per_device(
        "radixkv_prompt_tokens_total",
        "counter",
        "Prompt tokens of finished requests.",
        devices,
        |d| d.metrics.prompt_tokens,
    );
    f.per_device(
        "radixkv_cached_tokens_total",
        "counter",
        "Prompt tokens of finished requests served from the prefix cache.",
        devices,
        |d| d.metrics.cached_tokens,
    );
    f.per_device(
        "radixkv_completion_tokens_total",
        "counter",
        "Output tokens of finished requests.",
        devices,
        |d| d.metrics.output_tokens,
    );
    f.per_device(
        "radixkv_cache_hit_rate",
        "gauge",
        "Cached prompt tokens / prompt tokens of finished requests.",
        devices,
        |d| d.metrics.hit_rate,
    );
    f.per_device(
        "radixkv_outstanding_requests",
        "gauge",
        "Requests queued or running.",
        devices,
        |d| d.metrics.outstanding,
    );
    f.per_device_split(
        (
            "radixkv_pool_pages",
            "gauge",
            "KV pool pages per device, free or used (cached or held by requests).",
        ),
        devices,
        "state",
        &[
            ("free", &|d| d.metrics.pages_free as u64),
            ("used", &|d| d.metrics.pages_used as u64),
        ],
    );
    f.per_device(
        "radixkv_pinned_tokens",
        "gauge",
        "Tokens on a pinned path (held by running requests).",
        devices,
        |d| d.pinned_tokens,
    );
    f.per_device(
        "radixkv_tree_tokens",
        "gauge",
        "Tokens cached in the tree.",
        devices,
        |d| d.tree_tokens,
    );
    f.per_device(
        "radixkv_evictions_total",
        "counter",
        "Leaves evicted.",
        devices,
        |d| d.metrics.eviction.evicted_leaves,
    );
    f.per_device(
        "radixkv_evicted_tokens_total",
        "counter",
        "Tokens evicted.",
        devices,
        |d| d.metrics.eviction.evicted_tokens,
    );
    f.per_device(
        "radixkv_evicted_pages_total",
        "counter",
        "Pages returned to the pool by eviction.",
        devices,
        |d| d.metrics.eviction.evicted_pages,
    );
    f.histogram(
        "radixkv_ttft_seconds",
        "Arrival to first token of finished requests.",
        &server.ttft,
    );
    f.histogram(
        "radixkv_e2e_seconds",
        "Arrival to last token of finished requests.",
        &server.e2e,
    );
    f.summary(
        "radixkv_match_seconds",
        "Match-and-pin at admission (engine-wide since start).",
        devices,
        |d| &d.metrics.match_latency,
    );
    f.summary(
        "radixkv_insert_seconds",
        "Cache inserts after prefill and at the end.",
        devices,
        |d| &d.metrics.insert_latency,
    );
    f.summary("radixkv_evict_seconds", "Eviction calls.", devices, |d| {
        &d.metrics.eviction.latency
    });
    f.head(
        "radixkv_http_responses_total",
        "counter",
        "HTTP responses by status code.",
    );
    for (code, n) in &http.responses {
        f.line(
            "radixkv_http_responses_total",
            &format!("code=\"{code}\""),
            n,
        );
    }
    let _ = writeln!(
        f.out,
        "# HELP radixkv_http_rejected_busy_total Requests refused with 429 (admission queue full).\n\
         # TYPE radixkv_http_rejected_busy_total counter\n\
         radixkv_http_rejected_busy_total {}\n\
         # HELP radixkv_http_disconnects_total Requests cancelled because the client went away.\n\
         # TYPE radixkv_http_disconnects_total counter\n\
         radixkv_http_disconnects_total {}\n\
         # HELP radixkv_http_in_flight Requests admitted and not finished.\n\
         # TYPE radixkv_http_in_flight gauge\n\
         radixkv_http_in_flight {}\n\
         # HELP radixkv_http_max_queue Capacity of the admission queue.\n\
         # TYPE radixkv_http_max_queue gauge\n\
         radixkv_http_max_queue {}",
        http.rejected_busy, http.disconnects, http.in_flight, http.max_queue
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let h = Histogram::default();
        h.record(Duration::from_micros(100));
        h.record(Duration::from_millis(3));
        h.record(Duration::from_secs(100));
        let (cum, sum) = h.snapshot();
        assert_eq!(cum.len(), BUCKETS_S.len() + 1);
        assert_eq!(cum[0], 1);
        assert_eq!(cum[3], 2); // ≤ 5 ms
        assert_eq!(cum[BUCKETS_S.len() - 1], 2);
        assert_eq!(*cum.last().unwrap(), 3);
        assert!((sum - 100.0031).abs() < 1e-6);
    }
}
