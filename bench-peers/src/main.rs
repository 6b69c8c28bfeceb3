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
//! Queries: radixkv's `peek` (the resident prefix on every device, from
//! tokens) against `find_matches` (blocks matched per worker) with block
//! hashes precomputed (`pre`) or computed from the tokens inside the timed
//! call with Dynamo's own hashing (`tokens`). Both answers are compared on
//! every workload: the bench fails if they differ. The `floor-read-tokens`
//! rows are no index: they read each query's tokens once (cold, as the
//! indexes get them), the least any index that checks exact tokens pays.

mod dynamo;
mod measure;
mod workload;

use clap::Parser;
use dynamo_kv_router::indexer::{SyncIndexer, ThreadPoolIndexer};
use dynamo_kv_router::{ConcurrentRadixTreeCompressed, PositionalIndexer, RadixTree};
use hdrhistogram::Histogram;
use measure::{hist, timed, Figures, Report};
use radixkv::reference::SequentialCache;
use radixkv::{DeviceId, EvictionPolicy, RadixCache, TokenKey};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::{Arc, Barrier, Mutex, RwLock};
use std::time::{Duration, Instant};
use workload::Workload;

#[path = "../../tests/common/counting_alloc.rs"]
mod counting_alloc;
use counting_alloc::{flush_epoch, live, Counting};
use dynamo::Lane;

#[global_allocator]
static ALLOC: Counting = Counting;

/// radixkv against Dynamo's KV indexes (dynamo-kv-router 1.6.1) in one run.
#[derive(Parser, Debug, Clone)]
#[command(version, about)]
struct Args {
    /// CI size: 100 requests per prompt instead of 1,000, fewer queries.
    #[arg(long)]
    quick: bool,
    /// Write every figure as flat JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Run the whole bench in N fresh processes and report the median of
    /// each figure (the "medians of 3 fresh processes").
    #[arg(long, default_value_t = 1)]
    processes: usize,
    /// Only the scaling phase, at these thread counts (e.g. 1,2,4,8,16):
    /// queries and mixed 50/50 on W1 with 16 devices.
    #[arg(long, value_delimiter = ',')]
    scaling: Vec<usize>,
    /// Workloads to run (w1, w2, mooncake).
    #[arg(long, value_delimiter = ',', default_value = "w1,w2,mooncake")]
    workloads: Vec<String>,
    /// Requests in prompt order instead of shuffled (the old bench's order).
    #[arg(long)]
    in_order: bool,
    /// Directory of the shipped traces (the Mooncake phase).
    #[arg(long, default_value = "../shared/workloads")]
    traces: PathBuf,
}

const PAGE: usize = 16;
const DEVICES: usize = 4;

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

// ---------------------------------------------------------------- indexes

fn radixkv_cache(devices: usize) -> Arc<RadixCache> {
    Arc::new(
        RadixCache::builder()
            .page_size(PAGE)
            .devices(devices)
            .eviction_policy(EvictionPolicy::Lru)
            .build()
            .expect("cache"),
    )
}

fn radixkv_store(cache: &RadixCache, r: &workload::Request, vals: &mut Vec<u32>) {
    r.values_into(vals);
    cache
        .insert(TokenKey::new(&r.tokens), DeviceId(r.device as u32), vals, 0)
        .expect("insert");
}

/// The store event of the `i`-th request (event ids from 1).
fn store_event(i: usize, r: &workload::Request) -> dynamo_kv_router::protocols::RouterEvent {
    dynamo::stored(r.device, i as u64 + 1, &r.local, &r.seq)
}

/// Every request's store event, in order.
fn store_events(reqs: &[workload::Request]) -> Vec<dynamo_kv_router::protocols::RouterEvent> {
    reqs.iter()
        .enumerate()
        .map(|(i, r)| store_event(i, r))
        .collect()
}

/// Runs `f` on each of `picks` (indexes of stored requests), split evenly
/// over `threads` threads that start together; one histogram for all.
fn queries_on(
    w: &Workload,
    picks: &[usize],
    threads: usize,
    f: &(dyn Fn(&workload::Request) + Sync),
) -> Figures {
    let barrier = Barrier::new(threads);
    let per = picks.len() / threads;
    let out: Vec<(Histogram<u64>, Duration)> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let mine = &picks[t * per..(t + 1) * per];
                let barrier = &barrier;
                s.spawn(move || {
                    let mut h = hist();
                    barrier.wait();
                    let start = Instant::now();
                    for &i in mine {
                        timed(&mut h, || f(&w.stored[i]));
                    }
                    (h, start.elapsed())
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("thread")).collect()
    });
    merge(&out, per * threads)
}

// ---------------------------------------------------------------- the suite

fn sample(rng: &mut StdRng, n: usize, of: usize) -> Vec<usize> {
    (0..n).map(|_| rng.random_range(0..of)).collect()
}

/// Answers of radixkv and CRTC agree (in blocks per device) on `probe`.
fn check_agree(w: &Workload, cache: &RadixCache, crtc: &ConcurrentRadixTreeCompressed, what: &str) {
    let mut rng = StdRng::seed_from_u64(7);
    for i in sample(&mut rng, 500, w.stored.len()) {
        let r = &w.stored[i];
        let ours: Vec<usize> = cache
            .peek(TokenKey::new(&r.tokens))
            .iter()
            .map(|t| t / w.page)
            .collect();
        let theirs = dynamo::per_worker(&crtc.find_matches(&r.local, false), w.devices);
        assert_eq!(
            ours, theirs,
            "{}: radixkv and CRTC disagree on request {i} ({what})",
            w.name
        );
    }
}

fn suite(rep: &mut Report, w: Arc<Workload>, quick: bool) {
    let wl = w.name.clone();
    rep.header(&format!("{wl}: {}", w.about));
    let queries = if quick { 20_000 } else { 200_000 };

    // ---- store (full key), one thread, each index built from empty
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
            ("mutex", mutex_f),
        ],
    );
    check_agree(&w, &cache, &crtc, "after the store phase");

    // ---- routing query, one thread, cold input (random stored keys)
    let mut rng = StdRng::seed_from_u64(11);
    let picks = sample(&mut rng, queries, w.stored.len());
    let one = |f: &mut dyn FnMut(&workload::Request)| -> Figures {
        let mut h = hist();
        let t = Instant::now();
        for &i in &picks {
            timed(&mut h, || f(&w.stored[i]));
        }
        Figures::of(&h, picks.len(), t.elapsed())
    };
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
    for (dev, values) in evicted.iter().enumerate() {
        for hashes in removed_blocks(&w, values) {
            id += 1;
            removals.push(dynamo::removed(dev, id, hashes));
        }
    }
    settle_allocator();
    let b = crtc_lanes[0].run(removals.clone(), Box::new(|_, _| {}));
    let crtc_ms = b.wall.as_secs_f64() * 1e3;
    let b = pos_lanes[0].run(removals.clone(), Box::new(|_, _| {}));
    let pos_ms = b.wall.as_secs_f64() * 1e3;
    let note = format!("{evicted_pages} blocks in {} events", removals.len());
    rep.timing(
        &wl,
        "remove_10pct",
        &[
            ("radixkv", ours_ms),
            ("crtc", crtc_ms),
            ("positional", pos_ms),
        ],
        &note,
    );
    check_agree(&w, &cache, &crtc, "after the removal");

    // ---- mixed 50/50 on 2 threads: query a stored key, store a fresh one
    // (thread t stores the fresh requests of devices t, t + 2, ...).
    let threads = 2;
    let mixed_ours = mixed_radixkv(&cache, &w, threads, 21);
    let mixed_crtc = mixed_dynamo(&crtc, &crtc_lanes, &w, 21);
    let mixed_pos = mixed_dynamo(&positional, &pos_lanes, &w, 21);
    rep.phase(
        &wl,
        "mixed_50_2t",
        &[
            ("radixkv", mixed_ours),
            ("crtc-pre", mixed_crtc),
            ("positional-pre", mixed_pos),
        ],
    );
    check_agree(&w, &cache, &crtc, "after the mixed phase");
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

/// Lets the allocator sort what was freed before a timed phase, so that no
/// index pays for another's frees: a request of a few kilobytes is served
/// from the sorted bins (glibc consolidates its fast bins for it), and
/// freeing it returns it there.
fn settle_allocator() {
    drop(std::hint::black_box(Vec::<u8>::with_capacity(4096)));
}

fn merge(out: &[(Histogram<u64>, Duration)], ops: usize) -> Figures {
    let mut h = hist();
    let mut wall = Duration::ZERO;
    for (r, d) in out {
        h.add(r).expect("histogram add");
        wall = wall.max(*d);
    }
    Figures::of(&h, ops, wall)
}

/// The blocks behind evicted `values` (page by page), grouped into one
/// removal per run of consecutive blocks of the same request.
fn removed_blocks(w: &Workload, values: &[u32]) -> Vec<Vec<u64>> {
    let all: Vec<&workload::Request> = w.stored.iter().chain(&w.fresh).collect();
    let mut by_base: Vec<(u32, usize)> = all.iter().enumerate().map(|(i, r)| (r.base, i)).collect();
    by_base.sort_unstable();
    let mut out: Vec<Vec<u64>> = Vec::new();
    let mut last: Option<(usize, usize)> = None;
    for page in values.chunks(w.page) {
        let v = page[0];
        let at = by_base.partition_point(|(b, _)| *b <= v) - 1;
        let (base, ri) = by_base[at];
        let block = (v - base) as usize / w.page;
        let hash = all[ri].seq[block];
        match (last, out.last_mut()) {
            (Some((lr, lb)), Some(run)) if lr == ri && lb + 1 == block => run.push(hash),
            _ => out.push(vec![hash]),
        }
        last = Some((ri, block));
    }
    out
}

/// Per thread: the fresh requests it stores, and a query before each.
fn mixed_plan(w: &Workload, threads: usize, t: usize, seed: u64) -> (Vec<usize>, Vec<usize>) {
    let stores: Vec<usize> = (0..w.fresh.len())
        .filter(|&i| w.fresh[i].device % threads == t)
        .collect();
    let mut rng = StdRng::seed_from_u64(seed + t as u64);
    let queries = sample(&mut rng, stores.len(), w.stored.len());
    (stores, queries)
}

fn mixed_radixkv(cache: &RadixCache, w: &Workload, threads: usize, seed: u64) -> Figures {
    let barrier = Barrier::new(threads);
    let out: Vec<(Histogram<u64>, Duration)> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let barrier = &barrier;
                s.spawn(move || {
                    let (stores, queries) = mixed_plan(w, threads, t, seed);
                    let mut h = hist();
                    let mut vals = Vec::new();
                    barrier.wait();
                    let start = Instant::now();
                    for (&si, &qi) in stores.iter().zip(&queries) {
                        let q = &w.stored[qi];
                        timed(&mut h, || {
                            std::hint::black_box(cache.peek(TokenKey::new(&q.tokens)));
                        });
                        let r = &w.fresh[si];
                        r.values_into(&mut vals);
                        timed(&mut h, || {
                            cache
                                .insert(
                                    TokenKey::new(&r.tokens),
                                    DeviceId(r.device as u32),
                                    &vals,
                                    0,
                                )
                                .expect("insert")
                        });
                    }
                    (h, start.elapsed())
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("thread")).collect()
    });
    let ops = out.iter().map(|(h, _)| h.len() as usize).sum();
    merge(&out, ops)
}

/// Mixed 50/50 on one caller per lane: lane t stores thread t's fresh
/// requests and, right after each store, runs the next query.
fn mixed_dynamo<I: SyncIndexer>(
    index: &Arc<I>,
    lanes: &[Lane],
    w: &Arc<Workload>,
    seed: u64,
) -> Figures {
    let threads = lanes.len();
    let barrier = Barrier::new(threads);
    let out: Vec<(Histogram<u64>, Duration)> = std::thread::scope(|s| {
        let hs: Vec<_> = lanes
            .iter()
            .enumerate()
            .map(|(t, lane)| {
                let barrier = &barrier;
                s.spawn(move || {
                    let (stores, queries) = mixed_plan(w, threads, t, seed);
                    let events: Vec<_> = stores
                        .iter()
                        .map(|&i| {
                            let r = &w.fresh[i];
                            dynamo::stored(r.device, 2_000_000_000 + i as u64, &r.local, &r.seq)
                        })
                        .collect();
                    let n = queries.len();
                    let (ix, wi) = (Arc::clone(index), Arc::clone(w));
                    barrier.wait();
                    // Query j runs before store j (query 0 before the first
                    // event, query i + 1 right after event i).
                    let b = lane.run(
                        events,
                        Box::new(move |i, q| {
                            let j = i.map_or(0, |i| i + 1);
                            if j < n {
                                let r = &wi.stored[queries[j]];
                                timed(q, || {
                                    std::hint::black_box(ix.find_matches(&r.local, false));
                                });
                            }
                        }),
                    );
                    let mut h = b.store;
                    h.add(&b.query).expect("histogram add");
                    (h, b.wall)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("thread")).collect()
    });
    let ops = out.iter().map(|(h, _)| h.len() as usize).sum();
    merge(&out, ops)
}

/// `n` event threads of `index`.
fn lanes<I: SyncIndexer>(index: &Arc<I>, n: usize) -> Vec<Lane> {
    (0..n).map(|_| Lane::new(Arc::clone(index), None)).collect()
}

/// Live bytes of `index` after `reqs` were stored, its event thread (and so
/// its per-thread lookup state) still alive; fed through a bounded channel
/// so no backlog is counted.
fn memory_of<I: SyncIndexer>(index: Arc<I>, reqs: &[workload::Request]) -> isize {
    let before = live();
    let lane = Lane::new(Arc::clone(&index), Some(64));
    lane.feed(reqs.iter().enumerate().map(|(i, r)| store_event(i, r)));
    let b = live() - before;
    drop(lane);
    b
}

// ---------------------------------------------------------------- Mooncake

/// A real trace in trace order on 4 devices: each request is first routed
/// (a query from its tokens), then stored on its device.
fn mooncake_phase(rep: &mut Report, w: Arc<Workload>) {
    let wl = w.name.clone();
    rep.header(&format!("{wl}: {}", w.about));
    let cache = radixkv_cache(w.devices);
    let (mut hq, mut hs) = (hist(), hist());
    let mut vals = Vec::new();
    let t = Instant::now();
    for r in &w.stored {
        timed(&mut hq, || {
            std::hint::black_box(cache.peek(TokenKey::new(&r.tokens)));
        });
        timed(&mut hs, || radixkv_store(&cache, r, &mut vals));
    }
    let wall = t.elapsed();
    let n = w.stored.len();
    let ours_q = Figures::of(&hq, n, wall);
    let ours_s = Figures::of(&hs, n, wall);
    let mut both = hq.clone();
    both.add(&hs).expect("histogram add");
    let ours = Figures::of(&both, 2 * n, wall);

    let crtc = Arc::new(ConcurrentRadixTreeCompressed::new());
    let lane = Lane::new(Arc::clone(&crtc), None);
    let (ix, wi) = (Arc::clone(&crtc), Arc::clone(&w));
    let d = lane.run(
        store_events(&w.stored),
        Box::new(move |i, q| {
            let j = i.map_or(0, |i| i + 1);
            if let Some(r) = wi.stored.get(j) {
                timed(q, || {
                    let hs = dynamo::local_hashes(&r.tokens, PAGE as u32);
                    std::hint::black_box(ix.find_matches(&hs, false));
                });
            }
        }),
    );
    let (cs, cq) = (d.store, d.query);
    let crtc_s = Figures::of(&cs, n, d.wall);
    let crtc_q = Figures::of(&cq, n, d.wall);
    let mut cboth = cs.clone();
    cboth.add(&cq).expect("histogram add");
    let crtc_both = Figures::of(&cboth, 2 * n, d.wall);
    rep.phase(
        &wl,
        "route_then_store",
        &[("radixkv", ours), ("crtc-tokens", crtc_both)],
    );
    rep.phase(
        &wl,
        "its_queries",
        &[("radixkv", ours_q), ("crtc-tokens", crtc_q)],
    );
    rep.phase(&wl, "its_stores", &[("radixkv", ours_s), ("crtc", crtc_s)]);
    check_agree(&w, &cache, &crtc, "after the trace");
}

// ---------------------------------------------------------------- scaling

/// Queries and mixed 50/50 at each thread count, on W1 with 16 devices
/// (thread t stores for devices t, t + n, ...), radixkv against CRTC.
fn scaling(rep: &mut Report, args: &Args) {
    let per_prompt = if args.quick { 100 } else { 1_000 };
    let w = Arc::new(workload::shared_prefix(
        "scaling",
        64,
        per_prompt,
        1_000,
        200,
        PAGE,
        16,
        args.in_order,
        1,
    ));
    rep.header(&format!("scaling: {}", w.about));
    let queries = if args.quick { 20_000 } else { 400_000 };
    for &threads in &args.scaling {
        let threads = threads.max(1);
        let cache = radixkv_cache(w.devices);
        let mut vals = Vec::new();
        for r in &w.stored {
            radixkv_store(&cache, r, &mut vals);
        }
        let crtc = Arc::new(ConcurrentRadixTreeCompressed::new());
        let crtc_lanes = lanes(&crtc, threads);
        std::thread::scope(|s| {
            for (t, lane) in crtc_lanes.iter().enumerate() {
                let w = &w;
                s.spawn(move || {
                    lane.feed(
                        w.stored
                            .iter()
                            .enumerate()
                            .filter(|(_, r)| r.device % threads == t)
                            .map(|(i, r)| store_event(i, r)),
                    )
                });
            }
        });
        let mut rng = StdRng::seed_from_u64(31);
        let picks = sample(&mut rng, queries, w.stored.len());
        let run = |f: &(dyn Fn(&workload::Request) + Sync)| queries_on(&w, &picks, threads, f);
        let q_ours = run(&|r| {
            std::hint::black_box(cache.peek(TokenKey::new(&r.tokens)));
        });
        let q_crtc = run(&|r| {
            std::hint::black_box(crtc.find_matches(&r.local, false));
        });
        let q_crtc_tok = run(&|r| {
            let hs = dynamo::local_hashes(&r.tokens, PAGE as u32);
            std::hint::black_box(crtc.find_matches(&hs, false));
        });
        rep.phase(
            "scaling",
            &format!("query_{threads}t"),
            &[
                ("radixkv", q_ours),
                ("crtc-pre", q_crtc),
                ("crtc-tokens", q_crtc_tok),
            ],
        );
        let m_ours = mixed_radixkv(&cache, &w, threads, 41);
        let m_crtc = mixed_dynamo(&crtc, &crtc_lanes, &w, 41);
        rep.phase(
            "scaling",
            &format!("mixed_50_{threads}t"),
            &[("radixkv", m_ours), ("crtc-pre", m_crtc)],
        );
    }
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
