//! The figures of `/stats` and `/metrics` from hand-made engine and HTTP
//! figures.

use super::openmetrics::BucketedHistogram;
use super::*;
use radixkv::metrics::LatencyHistogram;
use radixkv_engine::{DeviceLatencies, DeviceMetrics, HostTierMetrics};
use std::collections::BTreeMap;
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
        open_connections: 4,
        max_connections: 64,
        shed_connections: 0,
        send_timeouts: 1,
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
    d.metrics.tokens.copied.peer_copied_tokens = 512;
    d.metrics.tokens.copied.time = std::time::Duration::from_millis(250);
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
        "radixkv_http_send_timeouts_total 1",
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
    assert_eq!(types.len(), 30, "{text}");
    // Without a host tier, no host-tier families.
    let plain = prometheus(vec![device(0)], None, latencies(1), http(), None).unwrap();
    assert!(!plain.contains("host_tier"), "{plain}");
}
