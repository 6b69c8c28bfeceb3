//! radixkv's KV events read by NVIDIA Dynamo's own code: a four-device
//! engine with a host tier runs a workload that evicts (small pools,
//! write-back to the host), publishing over ZeroMQ; a subscriber that
//! joins only afterwards reads every device's socket through its replay
//! socket; Dynamo's decoder (`zmq_wire::decode_event_batch`), its event
//! normalizer and its `RadixTree` index take the events as worker 1, rank
//! d. Then, for every prompt of the workload (both namespaces), Dynamo's
//! overlap for (1, d), in blocks, must equal radixkv's `peek` on device d;
//! and Dynamo's host-tier (CPU) index must match radixkv's host tier.
//!
//! radixkv's own index (`radixkv-index`) reads the same batches as worker
//! 1, rank d: its score per (rank, medium) must equal Dynamo's, by tokens
//! and by Dynamo's per-block hashes (which its `local_hash` must compute
//! bit for bit).

use dynamo_kv_router::protocols::{
    compute_block_hash_for_seq, BlockHashOptions, StorageTier, WorkerWithDpRank,
};
use dynamo_kv_router::zmq_wire::{decode_event_batch, ZmqEventNormalizer};
use dynamo_kv_router::RadixTree;
use radixkv::TokenKey;
use radixkv_engine::simulator::{CostModel, SimulatedBackend};
use radixkv_engine::tiers::TierConfig;
use radixkv_engine::{CacheListeners, Engine, EngineConfig, EngineRequest};
use radixkv_events::subscriber::replay;
use radixkv_events::{Encoding, KvEventPublisher, KvEventsConfig};
use radixkv_index::decode::{decode_batch, Medium};
use radixkv_index::{local_hash, KvIndex, Source};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;

const DEVICES: usize = 4;
const PAGE: usize = 4;

fn free_ports(n: u16) -> u16 {
    for _ in 0..200 {
        let p = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if p > 65_000 - n {
            continue;
        }
        if (0..n).all(|i| std::net::TcpListener::bind(("127.0.0.1", p + i)).is_ok()) {
            return p;
        }
    }
    panic!("no {n} consecutive free ports");
}

/// 10 groups × 6 prompts: a 64-token shared prefix, a 26-token question
/// (not page-aligned: the tail page is never published); every other group
/// under a cache salt.
fn workload() -> Vec<(Option<&'static str>, Vec<u32>)> {
    let mut rng = StdRng::seed_from_u64(7);
    let mut out = Vec::new();
    for g in 0..10 {
        let system: Vec<u32> = (0..64).map(|_| rng.random_range(0..50_000)).collect();
        for _ in 0..6 {
            let mut p = system.clone();
            p.extend((0..26).map(|_| rng.random_range(0..50_000u32)));
            out.push(([None, Some("tenant-a")][g % 2], p));
        }
    }
    out
}

async fn run(encoding: Encoding) {
    let port = free_ports(2 * DEVICES as u16);
    let mut ecfg = KvEventsConfig::new(format!("tcp://127.0.0.1:{port}"));
    ecfg.replay_endpoint = Some(format!("tcp://127.0.0.1:{}", port + DEVICES as u16));
    ecfg.replay_buffer = 1 << 20; // everything, for the late subscriber
    ecfg.encoding = encoding;
    let publisher = KvEventPublisher::start(ecfg, DEVICES, PAGE).await.unwrap();
    let sink = publisher.listener();
    let cfg = EngineConfig {
        devices: DEVICES,
        page_size: PAGE,
        // 200 tokens a device: the workload (60 prompts of 90 + 4) evicts.
        pages_per_device: 51,
        tiers: TierConfig {
            host_pages: Some(120),
            ..TierConfig::default()
        },
        listeners: Some(CacheListeners::new(move |_| sink.clone())),
        ..EngineConfig::default()
    };
    let engine = Engine::start(
        cfg,
        Arc::new(SimulatedBackend::new(CostModel::default(), 1000.0)),
    )
    .unwrap();
    let w = workload();
    // In waves, so that later requests find earlier ones cached and the
    // pools turn over.
    for wave in w.chunks(8) {
        for (ns, p) in wave {
            let mut r = EngineRequest::new(p.clone(), 4);
            r.namespace = ns.map(Arc::from);
            engine.submit(r).unwrap();
        }
        for _ in wave {
            let c = engine.completions().recv().unwrap();
            assert!(c.error.is_none(), "{:?}", c.error);
        }
    }
    publisher.flush().await;
    let stats = publisher.stats();
    assert!(stats.iter().all(|s| s.dropped_events == 0));

    // The late subscriber: everything through the replay sockets.
    let mut norm = ZmqEventNormalizer::new(PAGE as u32);
    let mut gpu = RadixTree::new();
    let mut cpu: Vec<RadixTree> = (0..DEVICES).map(|_| RadixTree::new()).collect();
    let (mut stored, mut removed, mut cpu_events) = (0, 0, 0);
    let mut id = 0u64;
    let index = KvIndex::new(PAGE, 2 * DEVICES).unwrap();
    let mut per_device = Vec::new();
    for d in 0..DEVICES {
        let batches = replay(&publisher.replay_endpoints()[d], 0).await.unwrap();
        assert!(
            batches.windows(2).all(|b| b[1].seq == b[0].seq + 1),
            "gapless"
        );
        per_device.push(batches);
    }
    // Every socket's first batch (AllBlocksCleared) came before any change.
    for first in [true, false] {
        for (d, batches) in per_device.iter().enumerate() {
            let worker = WorkerWithDpRank {
                worker_id: 1,
                dp_rank: d as u32,
            };
            let range = if first { 0..1 } else { 1..batches.len() };
            for b in &batches[range] {
                let ours = decode_batch(&b.payload).expect("radixkv-index decodes the batch");
                assert!(ours.skipped.is_empty(), "{:?}", ours.skipped);
                let source = Source {
                    worker: 1,
                    rank: d as u32,
                };
                let (_, errors) = index.apply(source, &ours.events);
                assert!(errors.is_empty(), "{errors:?}");
                let batch = decode_event_batch(&b.payload).expect("Dynamo decodes the batch");
                assert_eq!(batch.data_parallel_rank, Some(d as i32));
                for raw in batch.events {
                    let label = raw.event_type_label();
                    id += 1;
                    let Some(ev) = norm.normalize(raw, id, worker) else {
                        panic!("Dynamo's normalizer dropped a {label} event");
                    };
                    let tier = ev.placement.tier;
                    match label {
                        "stored" => stored += 1,
                        "removed" => removed += 1,
                        _ => {}
                    }
                    let router_event = ev.into_router_event().expect("a local worker's event");
                    match tier {
                        StorageTier::Device => gpu.apply_event(router_event).unwrap(),
                        StorageTier::HostPinned => {
                            cpu_events += 1;
                            cpu[d].apply_event(router_event).unwrap()
                        }
                        other => panic!("unexpected tier {other:?}"),
                    }
                }
            }
        }
    }
    assert!(
        stored > 0 && removed > 0,
        "stored {stored}, removed {removed}"
    );
    assert!(cpu_events > 0, "the host tier published nothing");

    // Every prompt: Dynamo's overlap per (1, d) == radixkv's peek on d.
    let (cache, _) = engine.cache(0).unwrap();
    let mut nonzero = 0;
    for (ns, p) in &w {
        let local = compute_block_hash_for_seq(
            p,
            PAGE as u32,
            BlockHashOptions {
                cache_namespace: *ns,
                ..BlockHashOptions::default()
            },
        );
        let ours: Vec<u64> = local_hash::block_hashes(p, PAGE, local_hash::seed(None, *ns));
        assert_eq!(
            ours,
            local.iter().map(|h| h.0).collect::<Vec<_>>(),
            "per-block hashes under {ns:?}"
        );
        let by_tokens = index.scores(p, ns.as_deref());
        let by_hash = index.scores_by_hash(&ours);
        let score = |scores: &[radixkv_index::Score], d: usize, m: Medium| {
            scores
                .iter()
                .find(|s| s.source.rank == d as u32 && s.medium == m)
                .map_or(0, |s| s.tokens)
        };
        let scores = gpu.find_matches(local.clone(), false).scores;
        let tiers = cache.peek_tiers(TokenKey::new(p).in_namespace(*ns));
        for (d, host_index) in cpu.iter().enumerate() {
            let worker = WorkerWithDpRank {
                worker_id: 1,
                dp_rank: d as u32,
            };
            let dynamo = scores.get(&worker).copied().unwrap_or(0) as usize;
            assert_eq!(
                dynamo,
                tiers.devices[d] / PAGE,
                "prompt under {ns:?}, device {d}: Dynamo {dynamo} blocks, radixkv {} tokens",
                tiers.devices[d]
            );
            nonzero += usize::from(dynamo > 0);
            for (what, s) in [("tokens", &by_tokens), ("hashes", &by_hash)] {
                assert_eq!(
                    score(s, d, Medium::Gpu),
                    dynamo * PAGE,
                    "radixkv-index by {what}, rank {d}, under {ns:?}"
                );
            }
            let host = host_index
                .find_matches(local.clone(), false)
                .scores
                .get(&worker)
                .copied()
                .unwrap_or(0) as usize;
            assert_eq!(
                host,
                tiers.host / PAGE,
                "host tier on rank {d}, under {ns:?}"
            );
            for (what, s) in [("tokens", &by_tokens), ("hashes", &by_hash)] {
                assert_eq!(
                    score(s, d, Medium::Cpu),
                    host * PAGE,
                    "radixkv-index's host tier by {what}, rank {d}, under {ns:?}"
                );
            }
        }
    }
    assert!(nonzero > 0, "nothing cached at the end");
    println!(
        "{encoding:?}: {stored} stores, {removed} removals, {cpu_events} host-tier events; \
         {nonzero} (prompt, device) overlaps agree with Dynamo's index, all {} prompts x {DEVICES} devices equal",
        w.len()
    );
    engine.shutdown();
    publisher.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamos_decoder_and_index_agree_with_peek_map_encoding() {
    run(Encoding::Map).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamos_decoder_and_index_agree_with_peek_array_encoding() {
    run(Encoding::Array).await;
}
