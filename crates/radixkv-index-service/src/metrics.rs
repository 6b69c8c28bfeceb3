//! `GET /metrics`: per worker (labels `model_name`, `routing_group`,
//! `instance_id`, `dp_rank`), per partition, and the query latency, as
//! OpenMetrics text through `prometheus-client`.
//!
//! | family | type | what |
//! | --- | --- | --- |
//! | `radixkv_index_batches` | counter | batches received (live and replayed) |
//! | `radixkv_index_live_batches` | counter | batches read from the worker's PUB socket (live), queued or dropped |
//! | `radixkv_index_events` | counter | events applied |
//! | `radixkv_index_skipped_events` | counter | events that could not be read or applied |
//! | `radixkv_index_junk_messages` | counter | messages that were not batches |
//! | `radixkv_index_gaps` | counter | sequence gaps found |
//! | `radixkv_index_recoveries` | counter | gaps filled by a replay |
//! | `radixkv_index_lost_gaps` | counter | gaps that could not be filled (the worker cleared, stale) |
//! | `radixkv_index_restarts` | counter | starts and restarts (the worker cleared) |
//! | `radixkv_index_duplicates` | counter | batches dropped as already applied |
//! | `radixkv_index_queue_overflows` | counter | batches dropped with the queue full (then replayed) |
//! | `radixkv_index_connect_failures` | counter | failed connections to the worker's endpoint |
//! | `radixkv_index_reconnects` | counter | connections made again after the first (then caught up by a replay) |
//! | `radixkv_index_worker_stale` | gauge | 1 while a lost gap keeps the worker cleared |
//! | `radixkv_index_worker_silent` | gauge | 1 while the worker is silent past the limit (not scored) |
//! | `radixkv_index_worker_subscribed` | gauge | 1 once the listener is subscribed |
//! | `radixkv_index_worker_blocks` | gauge | blocks the index knows of the worker |
//! | `radixkv_index_held_blocks` | gauge | blocks held in a partition, summed over its (worker, rank, medium) tiers |
//! | `radixkv_index_tree_nodes` | gauge | nodes of a partition's tree |
//! | `radixkv_index_query_duration_seconds` | histogram | time to answer, by `route` |

use crate::registry::Registry;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::TypedMetric;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The `Content-Type` of the text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The labels of a worker's series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WorkerLabels {
    model_name: String,
    routing_group: String,
    instance_id: u64,
    dp_rank: u32,
}

/// The labels of a partition's series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PartitionLabels {
    model_name: String,
    routing_group: String,
}

/// The labels of the query histogram.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    /// `query` or `query_by_hash`.
    pub route: &'static str,
}

/// The query latency histogram (shared by the handlers and the scrape).
pub type QueryLatency = Family<RouteLabels, Histogram>;

/// A new [`QueryLatency`]: buckets from 10 µs to about 1 s.
pub fn query_latency() -> QueryLatency {
    Family::new_with_constructor(|| {
        Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
            1e-5, 2.5, 14,
        ))
    })
}

fn family<L: EncodeLabelSet, M: EncodeMetric + TypedMetric>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    series: impl IntoIterator<Item = (L, M)>,
) -> std::fmt::Result {
    let mut f = enc.encode_descriptor(name, help, None, M::TYPE)?;
    for (labels, metric) in series {
        metric.encode(f.encode_family(&labels)?)?;
    }
    Ok(())
}

/// The registry's figures, read at the scrape.
#[derive(Debug)]
struct Figures(Arc<Registry>);

impl Collector for Figures {
    fn encode(&self, mut enc: DescriptorEncoder) -> std::fmt::Result {
        let workers = self.0.workers(None, None);
        let labels = |w: &crate::registry::WorkerView| WorkerLabels {
            model_name: w.registration.partition.model_name.clone(),
            routing_group: w.registration.partition.routing_group.clone(),
            instance_id: w.registration.instance_id,
            dp_rank: w.registration.dp_rank,
        };
        type Read = fn(&crate::registry::WorkerView) -> u64;
        // Relaxed loads throughout: statistics.
        let counters: [(&str, &str, Read); 13] = [
            ("batches", "Batches received (live and replayed).", |w| {
                w.counters.batches.load(Ordering::Relaxed)
            }),
            (
                "live_batches",
                "Batches read from the worker's PUB socket (live), queued or dropped.",
                |w| w.counters.live_batches.load(Ordering::Relaxed),
            ),
            ("events", "Events applied.", |w| {
                w.counters.events.load(Ordering::Relaxed)
            }),
            (
                "skipped_events",
                "Events that could not be read or applied.",
                |w| w.counters.skipped_events.load(Ordering::Relaxed),
            ),
            (
                "junk_messages",
                "Messages that were not KV-event batches.",
                |w| w.counters.junk.load(Ordering::Relaxed),
            ),
            ("gaps", "Sequence gaps found.", |w| {
                w.counters.feed_stats().gaps
            }),
            ("recoveries", "Gaps filled by a replay.", |w| {
                w.counters.feed_stats().recovered
            }),
            (
                "lost_gaps",
                "Gaps that could not be filled (the worker cleared and stale).",
                |w| w.counters.feed_stats().lost,
            ),
            (
                "restarts",
                "Starts and restarts seen (the worker cleared).",
                |w| w.counters.feed_stats().restarts,
            ),
            ("duplicates", "Batches dropped as already applied.", |w| {
                w.counters.feed_stats().duplicates
            }),
            (
                "queue_overflows",
                "Batches dropped with the queue full (then replayed).",
                |w| w.counters.overflow.load(Ordering::Relaxed),
            ),
            (
                "connect_failures",
                "Failed connections to the worker's endpoint.",
                |w| w.counters.connect_failures.load(Ordering::Relaxed),
            ),
            (
                "reconnects",
                "Connections made again after the first (then caught up by a replay).",
                |w| w.counters.reconnects.load(Ordering::Relaxed),
            ),
        ];
        for (name, help, read) in counters {
            family(
                &mut enc,
                &format!("index_{name}"),
                help,
                workers
                    .iter()
                    .map(|w| (labels(w), ConstCounter::new(read(w)))),
            )?;
        }
        let gauges: [(&str, &str, Read); 4] = [
            (
                "worker_stale",
                "1 while a lost gap keeps the worker cleared.",
                |w| u64::from(w.counters.stale.load(Ordering::Relaxed)),
            ),
            (
                "worker_silent",
                "1 while the worker is silent past the limit (not scored).",
                |w| u64::from(w.silent),
            ),
            (
                "worker_subscribed",
                "1 once the worker's listener is subscribed.",
                |w| u64::from(w.counters.subscribed.load(Ordering::Relaxed)),
            ),
            (
                "worker_blocks",
                "Blocks the index knows of the worker.",
                |w| w.blocks as u64,
            ),
        ];
        for (name, help, read) in gauges {
            family(
                &mut enc,
                &format!("index_{name}"),
                help,
                workers
                    .iter()
                    .map(|w| (labels(w), ConstGauge::new(read(w)))),
            )?;
        }
        let partitions = self.0.partitions();
        let partition = |k: &crate::registry::PartitionKey| PartitionLabels {
            model_name: k.model_name.clone(),
            routing_group: k.routing_group.clone(),
        };
        family(
            &mut enc,
            "index_held_blocks",
            "Blocks held in a partition, summed over its (worker, rank, medium) tiers.",
            partitions
                .iter()
                .map(|(k, p)| (partition(k), ConstGauge::new(p.index.held_blocks() as u64))),
        )?;
        family(
            &mut enc,
            "index_tree_nodes",
            "Nodes of a partition's tree.",
            partitions
                .iter()
                .map(|(k, p)| (partition(k), ConstGauge::new(p.index.tree_nodes()))),
        )
    }
}

/// The text of `GET /metrics`.
pub fn render(registry: &Arc<Registry>, latency: &QueryLatency) -> Result<String, std::fmt::Error> {
    let mut r = prometheus_client::registry::Registry::with_prefix("radixkv");
    r.register_collector(Box::new(Figures(Arc::clone(registry))));
    r.register(
        "index_query_duration_seconds",
        "Time to answer a query, by route",
        latency.clone(),
    );
    let mut out = String::new();
    encode(&mut out, &r)?;
    Ok(out)
}
