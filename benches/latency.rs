//! Latency histograms under contention, with baselines in the same run.
//!
//! `cargo bench --bench latency -- [--quick] [--json FILE]`
//!
//! Workloads (token ids from a seeded PRNG):
//! * W1: 64 prompts of 1,000 tokens, each followed by requests with a
//!   unique 200-token suffix (1,000 warm + 1,000 fresh per prompt; 100 +
//!   100 with `--quick`), 1,200 tokens each.
//! * W2: SGLang's generated-shared-prefix shape: 64 groups x 16 requests of
//!   a 2,048-token group prompt + a 128-token question (warm), and 16 more
//!   questions per group (fresh).
//!
//! Each is run at page sizes 1 and 16 on one device. Per phase an
//! hdrhistogram of per-operation latency (wall clock around each call) and
//! ops/s. Baselines, in the same process on the same operation streams: the
//! sequential model (`radixkv::reference::SequentialCache`) behind a
//! `Mutex`, and behind an `RwLock` (matches take the read lock and do a
//! read-only lookup without stamps or splits: less work than radixkv does).
//! Ratios are "times better than the baseline": baseline latency /
//! radixkv latency, or radixkv ops/s / baseline ops/s.
//!
//! A counting global allocator measures bytes per cached token and node.

use hdrhistogram::Histogram;
use radixkv::reference::SequentialCache;
use radixkv::{DeviceId, EvictionPolicy, RadixCache, TokenKey};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Barrier, Mutex, RwLock};
use std::time::{Duration, Instant};

// ---------------------------------------------------------------- memory

#[path = "../tests/common/counting_alloc.rs"]
mod counting_alloc;
use counting_alloc::{flush_epoch, live, Counting};

#[global_allocator]
static ALLOC: Counting = Counting;

// ---------------------------------------------------------------- workloads

struct Workload {
    warm: Vec<Vec<u32>>,
    fresh: Vec<Vec<u32>>,
    prefix_len: usize,
}

fn tokens(rng: &mut StdRng, n: usize) -> Vec<u32> {
    (0..n).map(|_| rng.random_range(0..128_000)).collect()
}

fn shared_prefix(
    groups: usize,
    per_group: usize,
    prompt: usize,
    suffix: usize,
    seed: u64,
) -> Workload {
    let mut rng = StdRng::seed_from_u64(seed);
    let prompts: Vec<Vec<u32>> = (0..groups).map(|_| tokens(&mut rng, prompt)).collect();
    let make = |rng: &mut StdRng| -> Vec<Vec<u32>> {
        let mut v = Vec::with_capacity(groups * per_group);
        for _ in 0..per_group {
            for p in &prompts {
                let mut r = p.clone();
                r.extend(tokens(rng, suffix));
                v.push(r);
            }
        }
        v
    };
    let warm = make(&mut rng);
    let fresh = make(&mut rng);
    Workload {
        warm,
        fresh,
        prefix_len: prompt,
    }
}

/// Page-run values for `len` tokens (what a paged allocator hands out).
fn values(next: &mut u32, len: usize, ps: usize) -> Vec<u32> {
    let base = next.div_ceil(ps as u32) * ps as u32;
    *next = base + len as u32;
    (base..base + len as u32).collect()
}

// ---------------------------------------------------------------- indexes

trait Index: Sync {
    fn name(&self) -> &'static str;
    fn insert(&self, key: &[u32], values: &[u32]);
    fn match_len(&self, key: &[u32]) -> usize;
    fn match_pin_unpin(&self, key: &[u32]) -> usize;
}

impl Index for RadixCache {
    fn name(&self) -> &'static str {
        "radixkv"
    }
    fn insert(&self, key: &[u32], values: &[u32]) {
        RadixCache::insert(self, TokenKey::new(key), DeviceId(0), values, 0).expect("insert");
    }
    fn match_len(&self, key: &[u32]) -> usize {
        self.match_prefix(TokenKey::new(key), DeviceId(0))
            .expect("match")
            .len
    }
    fn match_pin_unpin(&self, key: &[u32]) -> usize {
        let m = self
            .match_and_pin(TokenKey::new(key), DeviceId(0))
            .expect("match");
        let n = m.values.len();
        drop(m.lease);
        n
    }
}

struct MutexModel(Mutex<SequentialCache>);
struct RwLockModel(RwLock<SequentialCache>);

impl Index for MutexModel {
    fn name(&self) -> &'static str {
        "mutex"
    }
    fn insert(&self, key: &[u32], values: &[u32]) {
        let _ = self.0.lock().unwrap().insert(None, key, values, 0, 0);
    }
    fn match_len(&self, key: &[u32]) -> usize {
        self.0.lock().unwrap().match_len(None, key, 0)
    }
    fn match_pin_unpin(&self, key: &[u32]) -> usize {
        let mut m = self.0.lock().unwrap();
        let r = m.match_prefix(None, key, 0);
        let _ = m.pin(&r.handle);
        drop(m);
        self.0.lock().unwrap().unpin(&r.handle);
        r.values.len()
    }
}

impl Index for RwLockModel {
    fn name(&self) -> &'static str {
        "rwlock"
    }
    fn insert(&self, key: &[u32], values: &[u32]) {
        let _ = self.0.write().unwrap().insert(None, key, values, 0, 0);
    }
    fn match_len(&self, key: &[u32]) -> usize {
        self.0.read().unwrap().peek(None, key)[0]
    }
    fn match_pin_unpin(&self, key: &[u32]) -> usize {
        let mut m = self.0.write().unwrap();
        let r = m.match_prefix(None, key, 0);
        let _ = m.pin(&r.handle);
        drop(m);
        self.0.write().unwrap().unpin(&r.handle);
        r.values.len()
    }
}

// ---------------------------------------------------------------- measuring

fn hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("histogram bounds")
}

#[derive(Clone, Copy, Default)]
struct Figures {
    ops_per_s: f64,
    p50: u64,
    p90: u64,
    p99: u64,
    p999: u64,
    max: u64,
}

fn figures(h: &Histogram<u64>, ops: usize, wall: Duration) -> Figures {
    Figures {
        ops_per_s: ops as f64 / wall.as_secs_f64(),
        p50: h.value_at_quantile(0.5),
        p90: h.value_at_quantile(0.9),
        p99: h.value_at_quantile(0.99),
        p999: h.value_at_quantile(0.999),
        max: h.max(),
    }
}

fn timed(h: &mut Histogram<u64>, f: impl FnOnce()) {
    let t = Instant::now();
    f();
    let _ = h.record(t.elapsed().as_nanos().max(1) as u64);
}

/// Runs `f` once per item on one thread.
fn phase<T>(items: &[T], mut f: impl FnMut(&T)) -> Figures {
    let mut h = hist();
    let start = Instant::now();
    for it in items {
        timed(&mut h, || f(it));
    }
    figures(&h, items.len(), start.elapsed())
}

/// Mixed match/insert on `threads` threads; `fresh` is split between them.
#[allow(clippy::too_many_arguments)]
fn mixed(
    index: &dyn Index,
    w: &Workload,
    fresh: &[Vec<u32>],
    ps: usize,
    threads: usize,
    match_pct: u32,
    ops: usize,
    seed: u64,
) -> Figures {
    let barrier = Barrier::new(threads);
    let per = ops / threads;
    let chunk = fresh.len() / threads;
    let results: Vec<(Histogram<u64>, Duration)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let barrier = &barrier;
                let mine = &fresh[t * chunk..(t + 1) * chunk];
                s.spawn(move || {
                    let mut rng = StdRng::seed_from_u64(seed + t as u64);
                    let mut next = (t as u32 + 1) * 100_000_000;
                    let mut h = hist();
                    let mut inserted = 0;
                    barrier.wait();
                    let start = Instant::now();
                    for _ in 0..per {
                        if rng.random_range(0..100) < match_pct || inserted >= mine.len() {
                            let k = &w.warm[rng.random_range(0..w.warm.len())];
                            timed(&mut h, || {
                                index.match_len(k);
                            });
                        } else {
                            let k = &mine[inserted];
                            inserted += 1;
                            let v = values(&mut next, k.len(), ps);
                            timed(&mut h, || index.insert(k, &v));
                        }
                    }
                    (h, start.elapsed())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("bench thread"))
            .collect()
    });
    let mut h = hist();
    let mut wall = Duration::ZERO;
    for (r, d) in &results {
        h.add(r).expect("histogram add");
        wall = wall.max(*d);
    }
    figures(&h, per * threads, wall)
}

/// Involuntary context switches of the calling thread so far (Linux's
/// `/proc/thread-self/status`; `None` elsewhere): how often the scheduler
/// took the core away, which shows up as tens-of-µs latencies.
fn preempted() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/thread-self/status").ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("nonvoluntary_ctxt_switches:"))
        .and_then(|v| v.trim().parse().ok())
}

// ---------------------------------------------------------------- report

struct Report {
    json: BTreeMap<String, f64>,
}

impl Report {
    fn put(&mut self, key: String, v: f64) {
        self.json.insert(key, v);
    }

    fn row(
        &mut self,
        key: &str,
        suffix: &str,
        name: &str,
        f: Figures,
        base: &[(&str, Figures)],
        throughput: bool,
    ) {
        print!(
            "{:<28} {:<8} {:>12.0} {:>9} {:>9} {:>9} {:>9} {:>10}",
            key, name, f.ops_per_s, f.p50, f.p90, f.p99, f.p999, f.max
        );
        if name == "radixkv" {
            self.put(format!("{key}_ops{suffix}"), f.ops_per_s);
            self.put(format!("{key}_p50_ns{suffix}"), f.p50 as f64);
            self.put(format!("{key}_p90_ns{suffix}"), f.p90 as f64);
            self.put(format!("{key}_p99_ns{suffix}"), f.p99 as f64);
            self.put(format!("{key}_p999_ns{suffix}"), f.p999 as f64);
            self.put(format!("{key}_max_ns{suffix}"), f.max as f64);
            for (bname, b) in base {
                let r = if throughput {
                    f.ops_per_s / b.ops_per_s
                } else {
                    b.p50 as f64 / f.p50.max(1) as f64
                };
                print!("   x{r:.2} vs {bname}");
                self.put(format!("{key}_ratio_vs_{bname}{suffix}"), r);
            }
        }
        println!();
    }
}

fn header(title: &str) {
    println!("\n== {title}");
    println!(
        "{:<28} {:<8} {:>12} {:>9} {:>9} {:>9} {:>9} {:>10}   ratios (>1: radixkv better; p50 for latency, ops/s for mixed)",
        "phase", "impl", "ops/s", "p50 ns", "p90 ns", "p99 ns", "p99.9 ns", "max ns"
    );
}

fn build(index: &dyn Index, w: &Workload, ps: usize) -> Figures {
    let mut next = 1;
    let vals: Vec<Vec<u32>> = w
        .warm
        .iter()
        .map(|k| values(&mut next, k.len(), ps))
        .collect();
    let pairs: Vec<(&Vec<u32>, &Vec<u32>)> = w.warm.iter().zip(&vals).collect();
    phase(&pairs, |(k, v)| index.insert(k, v))
}

fn truncated(w: &Workload, ps: usize) -> Workload {
    let cut = |v: &Vec<Vec<u32>>| v.iter().map(|k| k[..k.len() / ps * ps].to_vec()).collect();
    Workload {
        warm: cut(&w.warm),
        fresh: cut(&w.fresh),
        prefix_len: w.prefix_len / ps * ps,
    }
}

#[allow(clippy::too_many_arguments)]
fn run_config(
    rep: &mut Report,
    label: &str,
    suffix: &str,
    w: &Workload,
    ps: usize,
    baselines: bool,
    quick: bool,
    seed: u64,
) {
    header(label);
    let ops = if quick { 20_000 } else { 200_000 };
    let cache = RadixCache::builder()
        .page_size(ps)
        .eviction_policy(EvictionPolicy::Lru)
        .build()
        .expect("cache");
    let mutex = MutexModel(Mutex::new(SequentialCache::new(ps, 1, EvictionPolicy::Lru)));
    let rwlock = RwLockModel(RwLock::new(SequentialCache::new(
        ps,
        1,
        EvictionPolicy::Lru,
    )));
    let mut impls: Vec<&dyn Index> = vec![&cache];
    if baselines {
        impls.push(&mutex);
        impls.push(&rwlock);
    }
    let mut rng = StdRng::seed_from_u64(seed);
    let sample = |rng: &mut StdRng, v: &[Vec<u32>]| -> Vec<Vec<u32>> {
        (0..ops)
            .map(|_| v[rng.random_range(0..v.len())].clone())
            .collect()
    };
    let warm_sample = sample(&mut rng, &w.warm);
    let fresh_sample = sample(&mut rng, &w.fresh);

    type Phase<'a> = (&'a str, Box<dyn Fn(&dyn Index) -> Figures + 'a>, bool);
    let full_len = w.warm[0].len();
    let phases: Vec<Phase> = vec![
        ("insert", Box::new(|i: &dyn Index| build(i, w, ps)), false),
        (
            "match_full",
            Box::new(|i: &dyn Index| {
                phase(&warm_sample, |k| {
                    let n = i.match_len(k);
                    debug_assert_eq!(n, full_len);
                })
            }),
            false,
        ),
        (
            "match_prefix",
            Box::new(|i: &dyn Index| {
                phase(&fresh_sample, |k| {
                    let n = i.match_len(k);
                    debug_assert!(n >= w.prefix_len / ps * ps);
                })
            }),
            false,
        ),
        (
            "match_pin_unpin",
            Box::new(|i: &dyn Index| {
                phase(&warm_sample, |k| {
                    i.match_pin_unpin(k);
                })
            }),
            false,
        ),
    ];
    for (key, run, tp) in &phases {
        let mut results = Vec::new();
        for i in &impls {
            results.push((i.name(), run(*i)));
        }
        let base: Vec<(&str, Figures)> = results[1..].to_vec();
        for (name, f) in &results {
            rep.row(
                key,
                suffix,
                name,
                *f,
                if *name == "radixkv" { &base } else { &[] },
                *tp,
            );
        }
    }
    // Sanity: every implementation holds the same prefixes.
    let probe = &w.warm[w.warm.len() / 2];
    for i in &impls {
        assert_eq!(
            i.match_len(probe),
            probe.len(),
            "{} lost a warm key",
            i.name()
        );
    }

    // Mixed match/insert at 1, 2 and 4 threads.
    let mixed_ops = if quick { 20_000 } else { 100_000 };
    let mut fresh_at = 0;
    for pct in [50u32, 90] {
        for threads in [1usize, 2, 4] {
            let key = format!("mixed_{pct}_{threads}t");
            let need = mixed_ops * (100 - pct as usize) / 100 + threads;
            let fresh = &w.fresh[fresh_at..(fresh_at + need).min(w.fresh.len())];
            fresh_at = (fresh_at + need) % w.fresh.len().max(1);
            let mut results = Vec::new();
            for i in &impls {
                results.push((
                    i.name(),
                    mixed(*i, w, fresh, ps, threads, pct, mixed_ops, seed),
                ));
            }
            let base: Vec<(&str, Figures)> = results[1..].to_vec();
            for (name, f) in &results {
                rep.row(
                    &key,
                    suffix,
                    name,
                    *f,
                    if *name == "radixkv" { &base } else { &[] },
                    true,
                );
            }
        }
    }

    // Match latency while a background thread evicts 10 % of the tree
    // repeatedly. The measured keys are pinned first, so both phases do the
    // same full-hit matches; the background thread refills with other keys.
    let measured: Vec<Vec<u32>> = w.warm.iter().step_by(32).cloned().collect();
    let leases: Vec<_> = measured
        .iter()
        .map(|k| {
            cache
                .match_and_pin(TokenKey::new(k), DeviceId(0))
                .expect("pin")
        })
        .collect();
    let probe: Vec<Vec<u32>> = (0..ops)
        .map(|_| measured[rng.random_range(0..measured.len())].clone())
        .collect();
    let total = cache.sizes(DeviceId(0)).expect("sizes").total;
    let idle = phase(&probe, |k| {
        cache.match_len(k);
    });
    let stop = AtomicBool::new(false);
    let (during, evictions) = std::thread::scope(|s| {
        let bg = s.spawn(|| {
            let mut rounds = 0usize;
            let mut next = 2_000_000_000u32;
            let mut rng = StdRng::seed_from_u64(seed + 99);
            while !stop.load(Ordering::Relaxed) {
                // The resident counter (O(1)), as an evictor reads it: a
                // scan of the tree per round (`sizes`) would read every
                // node's device slot, the lines the matcher stamps.
                let now = cache.resident_tokens(DeviceId(0)).expect("device");
                if now < total / 2 {
                    // Refill with random warm keys (evicted leaves come back).
                    for _ in 0..w.warm.len() / 4 {
                        if stop.load(Ordering::Relaxed) {
                            break;
                        }
                        let k = &w.warm[rng.random_range(0..w.warm.len())];
                        if next > 4_000_000_000 {
                            next = 2_000_000_000;
                        }
                        let v = values(&mut next, k.len(), ps);
                        Index::insert(&cache, k, &v);
                    }
                } else {
                    cache.evict(DeviceId(0), now / 10).expect("evict");
                    rounds += 1;
                }
            }
            rounds
        });
        let switches = preempted();
        let f = phase(&probe, |k| {
            let n = cache.match_len(k);
            assert_eq!(n, k.len(), "a pinned key was evicted");
        });
        let switches = preempted().zip(switches).map(|(b, a)| b - a);
        stop.store(true, Ordering::Relaxed);
        if let Some(n) = switches {
            println!("    (the matching thread was preempted {n} times during the phase)");
        }
        (f, bg.join().expect("evictor"))
    });
    drop(leases);
    rep.row("match_idle", suffix, "radixkv", idle, &[], false);
    rep.row("match_during_evict", suffix, "radixkv", during, &[], false);
    println!(
        "    ({} pinned keys matched; background: {evictions} evictions of 10 % of the tree, from {total} tokens, with refills)",
        measured.len()
    );
    rep.put(
        format!("match_during_evict_vs_idle_p999{suffix}"),
        during.p999 as f64 / idle.p999.max(1) as f64,
    );

    // One eviction of 10 % of a freshly built tree.
    let fresh_cache = RadixCache::builder().page_size(ps).build().expect("cache");
    build(&fresh_cache, w, ps);
    let total = fresh_cache.sizes(DeviceId(0)).expect("sizes").total;
    let nodes = fresh_cache.node_count();
    let t = Instant::now();
    let ev = fresh_cache.evict(DeviceId(0), total / 10).expect("evict");
    let ms = t.elapsed().as_secs_f64() * 1e3;
    println!(
        "{:<28} radixkv  {ms:.2} ms for {} tokens of {total} ({nodes} nodes; the first call also takes in every leaf inserted so far)",
        "evict_10pct", ev.tokens
    );
    rep.put(format!("evict_10pct_ms{suffix}"), ms);
    let t = Instant::now();
    let ev = fresh_cache.evict(DeviceId(0), total / 10).expect("evict");
    let ms = t.elapsed().as_secs_f64() * 1e3;
    println!(
        "{:<28} radixkv  {ms:.2} ms for {} more tokens",
        "evict_10pct_again", ev.tokens
    );
    rep.put(format!("evict_10pct_again_ms{suffix}"), ms);
    // A small eviction (what an allocation shortfall asks for) on the big
    // tree: candidate selection no longer scans the tree.
    let t = Instant::now();
    let ev = fresh_cache.evict(DeviceId(0), 16).expect("evict");
    let us = t.elapsed().as_secs_f64() * 1e6;
    println!(
        "{:<28} radixkv  {us:.1} µs for {} tokens",
        "evict_small", ev.tokens
    );
    rep.put(format!("evict_small_us{suffix}"), us);
}

/// Memory of W1 built with contiguous values (`scattered` = false: what a
/// fresh allocator hands out, stored as runs) or with values that share no
/// runs at all (`scattered` = true: the worst case, stored verbatim).
fn memory(rep: &mut Report, w: &Workload, ps: usize, scattered: bool) {
    flush_epoch();
    let before = live();
    let cache = RadixCache::builder().page_size(ps).build().expect("cache");
    if scattered {
        let mut x = 0x9e37_79b9u32;
        for k in &w.warm {
            let v: Vec<u32> = k
                .iter()
                .map(|_| {
                    x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                    x
                })
                .collect();
            Index::insert(&cache, k, &v);
        }
    } else {
        build(&cache, w, ps);
    }
    flush_epoch();
    cache.reclaim();
    let bytes = live() - before;
    let tokens = cache.sizes(DeviceId(0)).expect("sizes").total;
    let nodes = cache.node_count();
    drop(cache);
    flush_epoch();
    let after = live() - before;
    let per_token = bytes as f64 / tokens as f64;
    let per_node = bytes as f64 / nodes as f64;
    let tag = if scattered { "_scattered" } else { "" };
    println!(
        "memory ps{ps:<3}{tag:<11} {tokens} tokens, {nodes} nodes: {bytes} bytes = {per_token:.2} B/token, {per_node:.0} B/node; {after} bytes left after drop"
    );
    rep.put(format!("bytes_per_token_ps{ps}{tag}"), per_token);
    rep.put(format!("bytes_per_node_ps{ps}{tag}"), per_node);
    rep.put(format!("bytes_after_drop_ps{ps}{tag}"), after as f64);
    let worst = rep
        .json
        .get("bytes_after_drop")
        .copied()
        .unwrap_or(0.0)
        .max(after as f64);
    rep.put("bytes_after_drop".into(), worst);
}

fn main() {
    let mut quick = false;
    let mut json = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--quick" => quick = true,
            "--json" => json = args.next(),
            "--bench" => {}
            other if other.starts_with("--") => {
                eprintln!("latency: ignoring unknown option {other}");
            }
            _ => {}
        }
    }
    let started = Instant::now();
    let per_prompt = if quick { 100 } else { 1_000 };
    println!(
        "radixkv latency bench ({} mode), {} hardware threads",
        if quick { "quick" } else { "full" },
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    let mut rep = Report {
        json: BTreeMap::new(),
    };
    let w1 = shared_prefix(64, per_prompt, 1_000, 200, 1);
    let w2 = shared_prefix(64, 16, 2_048, 128, 2);

    println!("\n== memory (W1, one device)");
    memory(&mut rep, &w1, 1, false);
    memory(&mut rep, &truncated(&w1, 16), 16, false);
    memory(&mut rep, &w1, 1, true);
    memory(&mut rep, &truncated(&w1, 16), 16, true);

    run_config(
        &mut rep,
        "W1, page size 1 (baselines: mutex, rwlock)",
        "",
        &w1,
        1,
        true,
        quick,
        11,
    );
    run_config(
        &mut rep,
        "W1, page size 16",
        "_w1_ps16",
        &truncated(&w1, 16),
        16,
        false,
        quick,
        12,
    );
    run_config(
        &mut rep,
        "W2, page size 1",
        "_w2_ps1",
        &w2,
        1,
        false,
        quick,
        13,
    );
    run_config(
        &mut rep,
        "W2, page size 16",
        "_w2_ps16",
        &truncated(&w2, 16),
        16,
        false,
        quick,
        14,
    );

    // The stable keys the issue names.
    let get = |rep: &Report, k: &str| rep.json.get(k).copied().unwrap_or(f64::NAN);
    let aliases = [
        ("match_full_p50_ns", "match_full_p50_ns"),
        ("match_full_p99_ns", "match_full_p99_ns"),
        ("mixed_50_2t_ops", "mixed_50_2t_ops"),
        ("match_idle_p999_ns", "match_idle_p999_ns"),
    ];
    for (k, from) in aliases {
        let v = get(&rep, from);
        rep.put(k.into(), v);
    }
    println!(
        "\ntotal bench time {:.1} s",
        started.elapsed().as_secs_f64()
    );
    if let Some(path) = json {
        let text = serde_json::to_string_pretty(&rep.json).expect("json");
        std::fs::write(&path, text).unwrap_or_else(|e| panic!("cannot write {path}: {e}"));
        println!("figures written to {path}");
    }
}
