//! radixkv against NVIDIA Dynamo's KV indexes, in one process.
//!
//! `cargo run --release --manifest-path bench-peers/Cargo.toml -- [--quick]
//! [--json FILE] [--processes 3] [--scaling 1,2,4,8,16]` (see BENCHMARKS.md).
//!
//! Peers (crate `dynamo-kv-router` 1.6.1, through its public API):
//! * `crtc`: `ConcurrentRadixTreeCompressed`, the index behind Dynamo's KV
//!   router, events applied directly on the calling thread (its own event
//!   loop, `SyncIndexer::worker`; see `dynamo.rs` for how each event is
//!   timed);
//! * `crtc-pool-1` / `crtc-pool-2`: the same through `ThreadPoolIndexer`
//!   with one or two event threads (throughput only: its events are
//!   asynchronous);
//! * `positional`: `PositionalIndexer` (jump 32), applied directly;
//! * `radix-tree`: Dynamo's single-threaded `RadixTree`;
//! * `mutex` / `rwlock`: radixkv's sequential model behind a lock.
//!
//! And SMG's chain-native index (`smg-radix-tree` 0.1.0, see `smg.rs`):
//! `smg`, fed the blocks CRTC gets; directly on one thread, behind a
//! `std::sync::RwLock` (as SMG's own index service holds it) on two.
//!
//! radixkv's own router index (`radixkv_index::KvIndex`, see `rkindex.rs`):
//! `radixkv-index`, fed the same blocks as KV events and queried by
//! precomputed hashes, in phases of its own (`*_hashes_in`, `store_events`,
//! `remove_10pct_events`) whose ratios are against it: the comparison
//! with `crtc-pre` and `smg-pre` on equal terms (the `radixkv` rows read
//! tokens; those indexes get hashes).
//!
//! Queries: radixkv's `peek` (the resident prefix on every device, from
//! tokens) against `find_matches` (blocks matched per worker) with block
//! hashes precomputed (`pre`) or computed from the tokens inside the timed
//! call with Dynamo's own hashing (`tokens`). Both answers are compared on
//! every workload: the bench fails if they differ. The `floor-read-tokens`
//! rows are no index: they read each query's tokens once (cold, as the
//! indexes get them), the least any index that checks exact tokens pays.

mod args;
mod dynamo;
mod index_phases;
mod measure;
mod mixed;
mod phases;
mod rkindex;
mod setup;
mod smg;
mod workload;

use args::Args;
use clap::Parser;
use dynamo_kv_router::indexer::{SyncIndexer, ThreadPoolIndexer};
use dynamo_kv_router::{ConcurrentRadixTreeCompressed, PositionalIndexer, RadixTree};
use measure::{hist, timed, Figures, Report};
use mixed::*;
use phases::*;
use radixkv::reference::SequentialCache;
use radixkv::{DeviceId, EvictionPolicy, TokenKey};
use rand::rngs::StdRng;
use rand::SeedableRng;
use setup::*;
use std::collections::HashSet;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;
use workload::Workload;

#[path = "../../tests/common/counting_alloc.rs"]
mod counting_alloc;
use counting_alloc::{flush_epoch, live, Counting};

#[global_allocator]
static ALLOC: Counting = Counting;

fn main() {
    let args = Args::parse();
    if args.processes > 1 {
        medians(&args);
        return;
    }
    let started = Instant::now();
    println!(
        "radixkv peer bench ({} mode), {} hardware threads, dynamo-kv-router 1.6.1",
        if args.quick { "quick" } else { "full" },
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    let mut rep = Report::default();
    if !args.scaling.is_empty() {
        scaling(&mut rep, &args);
    } else {
        let per_prompt = if args.quick { 100 } else { 1_000 };
        for name in &args.workloads {
            let w = match name.as_str() {
                "w1" => workload::shared_prefix(
                    "w1",
                    64,
                    per_prompt,
                    1_000,
                    200,
                    PAGE,
                    DEVICES,
                    args.in_order,
                    1,
                ),
                "w2" => workload::shared_prefix(
                    "w2",
                    64,
                    16,
                    2_048,
                    128,
                    PAGE,
                    DEVICES,
                    args.in_order,
                    2,
                ),
                "mooncake" => {
                    let path = args.traces.join("mooncake_conversation_trace.jsonl.zst");
                    if !path.exists() {
                        if std::env::var_os("RADIXKV_REQUIRE_TRACES").is_some_and(|v| v == "1") {
                            eprintln!(
                                "no trace at {} and RADIXKV_REQUIRE_TRACES=1: the Mooncake phase cannot run",
                                path.display()
                            );
                            std::process::exit(1);
                        }
                        println!(
                            "\nSKIPPED: the Mooncake phase (no trace at {}; pass --traces DIR)",
                            path.display()
                        );
                        continue;
                    }
                    let limit = if args.quick { 2_000 } else { 0 };
                    match workload::mooncake(&path, PAGE, DEVICES, limit) {
                        Ok(w) => {
                            mooncake_phase(&mut rep, Arc::new(w));
                            continue;
                        }
                        Err(e) => {
                            eprintln!("cannot read {}: {e}", path.display());
                            std::process::exit(1);
                        }
                    }
                }
                other => {
                    eprintln!("unknown workload {other} (w1, w2, mooncake)");
                    std::process::exit(2);
                }
            };
            suite(&mut rep, Arc::new(w), args.quick);
        }
    }
    println!(
        "\ntotal bench time {:.1} s",
        started.elapsed().as_secs_f64()
    );
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&rep.json).expect("json");
        if let Err(e) = std::fs::write(path, text) {
            eprintln!("cannot write {}: {e}", path.display());
            std::process::exit(1);
        }
        println!("figures written to {}", path.display());
    }
}

// ---------------------------------------------------------------- the suite

fn suite(rep: &mut Report, w: Arc<Workload>, quick: bool) {
    let wl = w.name.clone();
    rep.header(&format!("{wl}: {}", w.about));
    let queries = if quick { 20_000 } else { 200_000 };

    // ---- store (full key), one thread, each index built from empty; the
    // workload before this one was just dropped (see `settle_allocator`).
    settle_allocator();
    let cache = radixkv_cache(w.devices);
    let mut vals = Vec::new();
    let mut h = hist();
    let t = Instant::now();
    for r in &w.stored {
        timed(&mut h, || radixkv_store(&cache, r, &mut vals));
    }
    let ours = Figures::of(&h, w.stored.len(), t.elapsed());

    // Two event threads per Dynamo index (the mixed phase uses both); the
    // store and remove phases apply every event on the first.
    let crtc = Arc::new(ConcurrentRadixTreeCompressed::new());
    let crtc_lanes = lanes(&crtc, 2);
    let b = crtc_lanes[0].run(store_events(&w.stored), Box::new(|_, _| {}));
    let crtc_f = Figures::of(&b.store, w.stored.len(), b.wall);

    let positional = Arc::new(PositionalIndexer::new(32));
    let pos_lanes = lanes(&positional, 2);
    let b = pos_lanes[0].run(store_events(&w.stored), Box::new(|_, _| {}));
    let pos_f = Figures::of(&b.store, w.stored.len(), b.wall);

    let mut tree = RadixTree::new();
    let events = store_events(&w.stored);
    let mut h = hist();
    let t = Instant::now();
    for e in events {
        timed(&mut h, || tree.apply_event(e).expect("radix tree event"));
    }
    let tree_f = Figures::of(&h, w.stored.len(), t.elapsed());

    let mut pools = Vec::new();
    for threads in [1usize, 2] {
        let pool =
            ThreadPoolIndexer::new(ConcurrentRadixTreeCompressed::new(), threads, PAGE as u32);
        let events = store_events(&w.stored);
        let t = Instant::now();
        for e in events {
            pool.enqueue_event(e).expect("enqueue");
        }
        pollster::block_on(pool.flush_and_wait()).expect("flush");
        pools.push(Figures::throughput(w.stored.len(), t.elapsed()));
    }

    let mut smg = smg::Smg::new(w.devices);
    let mut pairs = Vec::new();
    let mut h = hist();
    let t = Instant::now();
    for r in &w.stored {
        timed(&mut h, || smg.store(r, &mut pairs));
    }
    let smg_f = Figures::of(&h, w.stored.len(), t.elapsed());

    let mutex = Mutex::new(SequentialCache::new(PAGE, w.devices, EvictionPolicy::Lru));
    let mut h = hist();
    let t = Instant::now();
    for r in &w.stored {
        r.values_into(&mut vals);
        timed(&mut h, || {
            let _ = mutex
                .lock()
                .expect("model lock")
                .insert(None, &r.tokens, &vals, r.device, 0);
        });
    }
    let mutex_f = Figures::of(&h, w.stored.len(), t.elapsed());
    let rwlock = RwLock::new(mutex.into_inner().expect("model lock"));
    rep.phase(
        &wl,
        "store",
        &[
            ("radixkv", ours),
            ("crtc", crtc_f),
            ("crtc-pool-1", pools[0]),
            ("crtc-pool-2", pools[1]),
            ("positional", pos_f),
            ("radix-tree", tree_f),
            ("smg", smg_f),
            ("mutex", mutex_f),
        ],
    );
    check_agree(&w, &cache, &crtc, "after the store phase");
    check_agree_smg(&w, &cache, &smg, "after the store phase");

    // ---- routing query, one thread, cold input (random stored keys)
    let mut rng = StdRng::seed_from_u64(11);
    let picks = sample(&mut rng, queries, w.stored.len());
    let one = |f: &mut dyn FnMut(&workload::Request)| queries_here(&w, &picks, f);
    let q_ours = one(&mut |r| {
        std::hint::black_box(cache.peek(TokenKey::new(&r.tokens)));
    });
    let q_crtc_tok = one(&mut |r| {
        let hs = dynamo::local_hashes(&r.tokens, PAGE as u32);
        std::hint::black_box(crtc.find_matches(&hs, false));
    });
    let q_crtc_pre = one(&mut |r| {
        std::hint::black_box(crtc.find_matches(&r.local, false));
    });
    let q_pos_tok = one(&mut |r| {
        let hs = dynamo::local_hashes(&r.tokens, PAGE as u32);
        std::hint::black_box(positional.find_matches(&hs, false));
    });
    let q_pos_pre = one(&mut |r| {
        std::hint::black_box(positional.find_matches(&r.local, false));
    });
    let q_tree_pre = one(&mut |r| {
        std::hint::black_box(tree.find_matches(r.local.clone(), false));
    });
    let q_smg_tok = one(&mut |r| {
        std::hint::black_box(smg.query_tokens(&r.tokens, PAGE as u32));
    });
    let q_smg_pre = one(&mut |r| {
        std::hint::black_box(smg.query(&r.content));
    });
    let q_rw = one(&mut |r| {
        std::hint::black_box(rwlock.read().expect("model lock").peek(None, &r.tokens));
    });
    // Not an index: the least any index that checks exact tokens pays per
    // query, reading the (cold) tokens once.
    let q_floor = one(&mut |r| {
        std::hint::black_box(r.tokens.iter().fold(0u32, |a, &t| a ^ t));
    });
    // Where radixkv's time goes: the same queries cut to the shared prompt
    // (root and prompt node only), and to the prompt and the first page of
    // the request's own leaf (adds the lookup among the prompt's children
    // and the leaf's node, image and key: dependent misses).
    let parts = w.shared_len.map(|n| {
        let prompt = one(&mut |r| {
            std::hint::black_box(cache.peek(TokenKey::new(&r.tokens[..n])));
        });
        let leaf_page = one(&mut |r| {
            std::hint::black_box(cache.peek(TokenKey::new(&r.tokens[..n + w.page])));
        });
        (prompt, leaf_page)
    });
    if let Some((prompt, leaf_page)) = parts {
        rep.phase(
            &wl,
            "query_parts",
            &[
                ("radixkv", q_ours),
                ("radixkv-prompt-only", prompt),
                ("radixkv-prompt+1-leaf-page", leaf_page),
            ],
        );
    }
    rep.phase(
        &wl,
        "query",
        &[
            ("radixkv", q_ours),
            ("crtc-tokens", q_crtc_tok),
            ("crtc-pre", q_crtc_pre),
            ("positional-tokens", q_pos_tok),
            ("positional-pre", q_pos_pre),
            ("radix-tree-pre", q_tree_pre),
            ("smg-tokens", q_smg_tok),
            ("smg-pre", q_smg_pre),
            ("rwlock", q_rw),
            ("floor-read-tokens", q_floor),
        ],
    );
    drop(tree);

    // ---- routing query, 2 threads
    let two = |f: &(dyn Fn(&workload::Request) + Sync)| queries_on(&w, &picks, 2, f);
    let q2_ours = two(&|r| {
        std::hint::black_box(cache.peek(TokenKey::new(&r.tokens)));
    });
    let q2_crtc = two(&|r| {
        std::hint::black_box(crtc.find_matches(&r.local, false));
    });
    let q2_crtc_tok = two(&|r| {
        let hs = dynamo::local_hashes(&r.tokens, PAGE as u32);
        std::hint::black_box(crtc.find_matches(&hs, false));
    });
    let q2_pos = two(&|r| {
        std::hint::black_box(positional.find_matches(&r.local, false));
    });
    let smg = RwLock::new(smg);
    let q2_smg = two(&|r| {
        std::hint::black_box(smg.read().expect("smg lock").query(&r.content));
    });
    let q2_smg_tok = two(&|r| {
        let hs = workload::contents(&dynamo::local_hashes(&r.tokens, PAGE as u32));
        std::hint::black_box(smg.read().expect("smg lock").query(&hs));
    });
    let q2_rw = two(&|r| {
        std::hint::black_box(rwlock.read().expect("model lock").peek(None, &r.tokens));
    });
    let q2_floor = two(&|r| {
        std::hint::black_box(r.tokens.iter().fold(0u32, |a, &t| a ^ t));
    });
    rep.phase(
        &wl,
        "query_2t",
        &[
            ("radixkv", q2_ours),
            ("crtc-pre", q2_crtc),
            ("crtc-tokens", q2_crtc_tok),
            ("positional-pre", q2_pos),
            ("smg-pre", q2_smg),
            ("smg-tokens", q2_smg_tok),
            ("rwlock", q2_rw),
            ("floor-read-tokens", q2_floor),
        ],
    );
    drop(rwlock);
    // The model's tens of thousands of small blocks were just freed: the
    // allocator sorts them into its free lists at the next request large
    // enough (glibc consolidates its fast bins then), which would land in
    // the first timed eviction below.
    settle_allocator();

    // ---- remove 10 % of every device: radixkv picks the victims (LRU
    // leaves), Dynamo's indexes are told the same blocks.
    let mut removals = Vec::new();
    // The sizes come from counters, read before the clock starts (a scan of
    // the tree would be timed as part of the removal otherwise).
    let totals: Vec<usize> = (0..w.devices)
        .map(|dev| cache.resident_tokens(DeviceId(dev as u32)).expect("device"))
        .collect();
    let t = Instant::now();
    let mut evicted = Vec::new();
    for (dev, total) in totals.iter().enumerate() {
        let ev = cache
            .evict(DeviceId(dev as u32), total / 10)
            .expect("evict");
        evicted.push(ev.values);
    }
    let ours_ms = t.elapsed().as_secs_f64() * 1e3;
    let evicted_pages: usize = evicted.iter().map(|v| v.len() / w.page).sum();
    let mut id = 1_000_000_000u64;
    let mut smg_removals = Vec::new();
    for (dev, values) in evicted.iter().enumerate() {
        for hashes in removed_blocks(&w, values) {
            id += 1;
            smg_removals.push((dev, hashes.clone()));
            removals.push(dynamo::removed(dev, id, hashes));
        }
    }
    settle_allocator();
    let b = crtc_lanes[0].run(removals.clone(), Box::new(|_, _| {}));
    let crtc_ms = b.wall.as_secs_f64() * 1e3;
    let b = pos_lanes[0].run(removals.clone(), Box::new(|_, _| {}));
    let pos_ms = b.wall.as_secs_f64() * 1e3;
    let mut smg = smg.into_inner().expect("smg lock");
    settle_allocator();
    let t = Instant::now();
    for (dev, hashes) in &smg_removals {
        smg.remove(*dev, hashes);
    }
    let smg_ms = t.elapsed().as_secs_f64() * 1e3;
    let note = format!("{evicted_pages} blocks in {} events", removals.len());
    rep.timing(
        &wl,
        "remove_10pct",
        &[
            ("radixkv", ours_ms),
            ("crtc", crtc_ms),
            ("positional", pos_ms),
            ("smg", smg_ms),
        ],
        &note,
    );
    check_agree(&w, &cache, &crtc, "after the removal");
    check_agree_smg(&w, &cache, &smg, "after the removal");

    // ---- mixed 50/50 on 2 threads: query a stored key, store a fresh one
    // (thread t stores the fresh requests of devices t, t + 2, ...).
    let threads = 2;
    let mixed_ours = mixed_radixkv(&cache, &w, threads, 21);
    let mixed_crtc = mixed_dynamo(&crtc, &crtc_lanes, &w, 21);
    let mixed_pos = mixed_dynamo(&positional, &pos_lanes, &w, 21);
    let smg = RwLock::new(smg);
    let mixed_smg = mixed_smg(&smg, &w, threads, 21);
    let smg = smg.into_inner().expect("smg lock");
    rep.phase(
        &wl,
        "mixed_50_2t",
        &[
            ("radixkv", mixed_ours),
            ("crtc-pre", mixed_crtc),
            ("positional-pre", mixed_pos),
            ("smg-pre", mixed_smg),
        ],
    );
    check_agree(&w, &cache, &crtc, "after the mixed phase");
    check_agree_smg(&w, &cache, &smg, "after the mixed phase");
    // radixkv's router index, alone after the phases above (alive beside
    // them, its tree and block maps slowed radixkv's removal by a third),
    // through the same steps, beside the peers' figures from above.
    let peers = index_phases::Peers {
        store: [("crtc", crtc_f), ("smg", smg_f)],
        query: [
            ("crtc-pre", q_crtc_pre),
            ("positional-pre", q_pos_pre),
            ("smg-pre", q_smg_pre),
        ],
        query_2t: [
            ("crtc-pre", q2_crtc),
            ("positional-pre", q2_pos),
            ("smg-pre", q2_smg),
        ],
        remove_ms: [("crtc", crtc_ms), ("smg", smg_ms)],
        mixed: [
            ("crtc-pre", mixed_crtc),
            ("positional-pre", mixed_pos),
            ("smg-pre", mixed_smg),
        ],
    };
    let kv = index_phases::phases(rep, &w, &picks, &smg_removals, &note, &peers);
    check_agree_index(&w, &cache, &kv, "after the same steps");
    drop(kv);
    drop(smg);
    drop((crtc_lanes, pos_lanes));
    drop((cache, crtc, positional));

    // ---- memory of the stored requests, each index built alone
    let blocks: usize = {
        let mut set = HashSet::new();
        for r in &w.stored {
            for s in &r.seq {
                set.insert((r.device, *s));
            }
        }
        set.len()
    };
    let ours_b = {
        flush_epoch();
        let before = live();
        let cache = radixkv_cache(w.devices);
        for r in &w.stored {
            radixkv_store(&cache, r, &mut vals);
        }
        flush_epoch();
        cache.reclaim();
        let b = live() - before;
        drop(cache);
        flush_epoch();
        b
    };
    let crtc_b = memory_of(Arc::new(ConcurrentRadixTreeCompressed::new()), &w.stored);
    let pos_b = memory_of(Arc::new(PositionalIndexer::new(32)), &w.stored);
    let tree_b = {
        let before = live();
        let mut tree = RadixTree::new();
        for e in store_events(&w.stored) {
            tree.apply_event(e).expect("radix tree event");
        }
        live() - before
    };
    let (smg_b, smg_own) = {
        let before = live();
        let s = smg::built(w.devices, &w.stored);
        (live() - before, s.bytes_estimate())
    };
    println!("    ({blocks} distinct blocks over {} devices)", w.devices);
    let per = |b: isize| b as f64 / blocks as f64;
    rep.memory(
        &wl,
        "bytes_per_block",
        &[
            ("radixkv", per(ours_b)),
            ("crtc", per(crtc_b)),
            ("positional", per(pos_b)),
            ("radix-tree", per(tree_b)),
            ("smg", per(smg_b)),
            ("smg-own-estimate", per(smg_own as isize)),
        ],
    );
    // One device: bytes per cached token (distinct tokens on it).
    let one_dev = {
        flush_epoch();
        let before = live();
        let cache = radixkv_cache(1);
        for r in &w.stored {
            r.values_into(&mut vals);
            cache
                .insert(TokenKey::new(&r.tokens), DeviceId(0), &vals, 0)
                .expect("insert");
        }
        flush_epoch();
        cache.reclaim();
        let b = live() - before;
        let tokens = cache.sizes(DeviceId(0)).expect("sizes").total;
        b as f64 / tokens as f64
    };
    rep.memory(&wl, "bytes_per_token_1dev", &[("radixkv", one_dev)]);
}

// ---------------------------------------------------------------- medians

/// Runs the bench in `--processes` fresh processes and prints the median of
/// every figure (and writes them with `--json`).
fn medians(args: &Args) {
    let exe = std::env::current_exe().expect("own path");
    let dir = std::env::temp_dir().join(format!("radixkv-peer-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let mut runs: Vec<std::collections::BTreeMap<String, f64>> = Vec::new();
    for k in 0..args.processes {
        let out = dir.join(format!("run{k}.json"));
        let mut cmd = std::process::Command::new(&exe);
        if args.quick {
            cmd.arg("--quick");
        }
        if args.in_order {
            cmd.arg("--in-order");
        }
        if !args.scaling.is_empty() {
            let s: Vec<String> = args.scaling.iter().map(|t| t.to_string()).collect();
            cmd.arg("--scaling").arg(s.join(","));
        }
        cmd.arg("--workloads").arg(args.workloads.join(","));
        cmd.arg("--traces").arg(&args.traces);
        cmd.arg("--json").arg(&out);
        println!("== process {} of {}", k + 1, args.processes);
        let status = cmd.status().expect("run the bench");
        if !status.success() {
            eprintln!("process {} failed: {status}", k + 1);
            std::process::exit(1);
        }
        let text = std::fs::read_to_string(&out).expect("figures");
        runs.push(serde_json::from_str(&text).expect("figures json"));
    }
    let _ = std::fs::remove_dir_all(&dir);
    let mut med = std::collections::BTreeMap::new();
    for key in runs[0].keys() {
        let mut v: Vec<f64> = runs.iter().filter_map(|r| r.get(key).copied()).collect();
        v.sort_by(f64::total_cmp);
        med.insert(key.clone(), v[v.len() / 2]);
    }
    println!(
        "\n== medians of {} processes: every ratio (radixkv / peer ops/s; peer / radixkv p99, ms and bytes)",
        args.processes
    );
    for (k, v) in &med {
        if k.contains("ratio_vs") {
            println!("{k:<60} {v:>8.2}");
        }
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&med).expect("json"))
            .expect("write json");
        println!("median figures written to {}", path.display());
    }
}
