//! What the phases share: radixkv's cache and stores, Dynamo's store
//! events, the queries, the agreement check, merging figures, memory.

use crate::measure::{hist, timed, Figures};
use crate::workload::{self, Workload};
use dynamo_kv_router::indexer::SyncIndexer;
use dynamo_kv_router::ConcurrentRadixTreeCompressed;
use hdrhistogram::Histogram;
use radixkv::{DeviceId, EvictionPolicy, RadixCache, TokenKey};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use crate::counting_alloc::live;
use crate::dynamo::{self, Lane};

pub(crate) const PAGE: usize = 16;
pub(crate) const DEVICES: usize = 4;

pub(crate) fn radixkv_cache(devices: usize) -> Arc<RadixCache> {
    Arc::new(
        RadixCache::builder()
            .page_size(PAGE)
            .devices(devices)
            .eviction_policy(EvictionPolicy::Lru)
            .build()
            .expect("cache"),
    )
}

pub(crate) fn radixkv_store(cache: &RadixCache, r: &workload::Request, vals: &mut Vec<u32>) {
    r.values_into(vals);
    cache
        .insert(TokenKey::new(&r.tokens), DeviceId(r.device as u32), vals, 0)
        .expect("insert");
}

/// The store event of the `i`-th request (event ids from 1).
pub(crate) fn store_event(
    i: usize,
    r: &workload::Request,
) -> dynamo_kv_router::protocols::RouterEvent {
    dynamo::stored(r.device, i as u64 + 1, &r.local, &r.seq)
}

/// Every request's store event, in order.
pub(crate) fn store_events(
    reqs: &[workload::Request],
) -> Vec<dynamo_kv_router::protocols::RouterEvent> {
    reqs.iter()
        .enumerate()
        .map(|(i, r)| store_event(i, r))
        .collect()
}

/// Runs `f` on each of `picks` (indexes of stored requests) on the calling
/// thread, each call timed.
pub(crate) fn queries_here(
    w: &Workload,
    picks: &[usize],
    f: &mut dyn FnMut(&workload::Request),
) -> Figures {
    let mut h = hist();
    let t = Instant::now();
    for &i in picks {
        timed(&mut h, || f(&w.stored[i]));
    }
    Figures::of(&h, picks.len(), t.elapsed())
}

/// Runs `f` on each of `picks` (indexes of stored requests), split evenly
/// over `threads` threads that start together; one histogram for all.
pub(crate) fn queries_on(
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

pub(crate) fn sample(rng: &mut StdRng, n: usize, of: usize) -> Vec<usize> {
    (0..n).map(|_| rng.random_range(0..of)).collect()
}

/// Answers of radixkv and CRTC agree (in blocks per device) on `probe`.
pub(crate) fn check_agree(
    w: &Workload,
    cache: &RadixCache,
    crtc: &ConcurrentRadixTreeCompressed,
    what: &str,
) {
    check_answers(w, cache, "CRTC", what, |r| {
        dynamo::per_worker(&crtc.find_matches(&r.local, false), w.devices)
    });
}

/// Answers of radixkv and SMG's index agree (in blocks per device) on the
/// same probe as [`check_agree`].
pub(crate) fn check_agree_smg(w: &Workload, cache: &RadixCache, smg: &crate::smg::Smg, what: &str) {
    check_answers(w, cache, "SMG's index", what, |r| {
        smg.per_device(&r.content)
    });
}

pub(crate) fn check_agree_index(
    w: &Workload,
    cache: &RadixCache,
    kv: &radixkv_index::KvIndex,
    what: &str,
) {
    check_answers(w, cache, "radixkv's router index", what, |r| {
        crate::rkindex::per_device(kv, &r.content, w.devices)
    });
}

/// radixkv's answer (blocks per device) equals `theirs` on 500 stored
/// requests drawn at random (the same ones every time).
fn check_answers(
    w: &Workload,
    cache: &RadixCache,
    peer: &str,
    what: &str,
    theirs: impl Fn(&workload::Request) -> Vec<usize>,
) {
    let mut rng = StdRng::seed_from_u64(7);
    for i in sample(&mut rng, 500, w.stored.len()) {
        let r = &w.stored[i];
        let ours: Vec<usize> = cache
            .peek(TokenKey::new(&r.tokens))
            .iter()
            .map(|t| t / w.page)
            .collect();
        assert_eq!(
            ours,
            theirs(r),
            "{}: radixkv and {peer} disagree on request {i} ({what})",
            w.name
        );
    }
}

/// Lets the allocator sort what was freed before a timed phase, so that no
/// index pays for another's frees. glibc leaves freed chunks in an unsorted
/// list (its fast bins are consolidated into it), and each request that its
/// thread cache and small bins cannot serve first sorts at most 10,000 of
/// them into their bins. After an index of hundreds of thousands of blocks
/// is dropped the list is far longer, and whichever index next asked for a
/// few kilobytes would sort it inside its own timed phase (BENCHMARKS.md,
/// "what the removal phase was paying for"). So requests of a few
/// kilobytes (too large for the thread cache) are made and freed here:
/// 1,024 of them sort up to about ten million chunks, and each costs a
/// fraction of a microsecond once the list is sorted.
pub(crate) fn settle_allocator() {
    for _ in 0..1024 {
        drop(std::hint::black_box(Vec::<u8>::with_capacity(4096)));
    }
}

pub(crate) fn merge(out: &[(Histogram<u64>, Duration)], ops: usize) -> Figures {
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
pub(crate) fn removed_blocks(w: &Workload, values: &[u32]) -> Vec<Vec<u64>> {
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

/// `n` event threads of `index`.
pub(crate) fn lanes<I: SyncIndexer>(index: &Arc<I>, n: usize) -> Vec<Lane> {
    (0..n).map(|_| Lane::new(Arc::clone(index), None)).collect()
}

/// Live bytes of `index` after `reqs` were stored, its event thread (and so
/// its per-thread lookup state) still alive; fed through a bounded channel
/// so no backlog is counted.
pub(crate) fn memory_of<I: SyncIndexer>(index: Arc<I>, reqs: &[workload::Request]) -> isize {
    let before = live();
    let lane = Lane::new(Arc::clone(&index), Some(64));
    lane.feed(reqs.iter().enumerate().map(|(i, r)| store_event(i, r)));
    let b = live() - before;
    drop(lane);
    b
}
