//! The mixed phase: stores, removals and queries from several threads at
//! once, on radixkv and on Dynamo's indexes.

use crate::measure::{hist, timed, Figures};
use crate::workload::{Request, Workload};
use dynamo_kv_router::indexer::SyncIndexer;
use hdrhistogram::Histogram;
use radixkv::{DeviceId, RadixCache, TokenKey};
use rand::rngs::StdRng;
use rand::SeedableRng;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use crate::dynamo::{self, Lane};
use crate::setup::*;

/// Per thread: the fresh requests it stores, and a query before each.
pub(crate) fn mixed_plan(
    w: &Workload,
    threads: usize,
    t: usize,
    seed: u64,
) -> (Vec<usize>, Vec<usize>) {
    let stores: Vec<usize> = (0..w.fresh.len())
        .filter(|&i| w.fresh[i].device % threads == t)
        .collect();
    let mut rng = StdRng::seed_from_u64(seed + t as u64);
    let queries = sample(&mut rng, stores.len(), w.stored.len());
    (stores, queries)
}

pub(crate) fn mixed_radixkv(
    cache: &RadixCache,
    w: &Workload,
    threads: usize,
    seed: u64,
) -> Figures {
    mixed_threads(
        w,
        threads,
        seed,
        |q| {
            std::hint::black_box(cache.peek(TokenKey::new(&q.tokens)));
        },
        |r, vals: &mut Vec<u32>| r.values_into(vals),
        |r, vals: &mut Vec<u32>| {
            cache
                .insert(TokenKey::new(&r.tokens), DeviceId(r.device as u32), vals, 0)
                .expect("insert");
        },
    )
}

/// Mixed 50/50 on `threads` threads that start together: each thread
/// alternates a timed `query` of a stored request and a timed `store` of
/// one of its fresh ones, with a scratch of its own that `prepare` fills
/// for the store before the clock starts; one histogram for all.
fn mixed_threads<S: Default>(
    w: &Workload,
    threads: usize,
    seed: u64,
    query: impl Fn(&Request) + Sync,
    prepare: impl Fn(&Request, &mut S) + Sync,
    store: impl Fn(&Request, &mut S) + Sync,
) -> Figures {
    let barrier = Barrier::new(threads);
    let (query, prepare, store) = (&query, &prepare, &store);
    let out: Vec<(Histogram<u64>, Duration)> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let barrier = &barrier;
                s.spawn(move || {
                    let (stores, queries) = mixed_plan(w, threads, t, seed);
                    let mut h = hist();
                    let mut scratch = S::default();
                    barrier.wait();
                    let start = Instant::now();
                    for (&si, &qi) in stores.iter().zip(&queries) {
                        timed(&mut h, || query(&w.stored[qi]));
                        let r = &w.fresh[si];
                        prepare(r, &mut scratch);
                        timed(&mut h, || store(r, &mut scratch));
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
pub(crate) fn mixed_dynamo<I: SyncIndexer>(
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

/// Mixed 50/50 on SMG's index behind the `RwLock` its service uses: each
/// thread queries a stored key on the read side, then stores a fresh one
/// on the write side.
pub(crate) fn mixed_smg(
    smg: &crate::smg::Shared,
    w: &Workload,
    threads: usize,
    seed: u64,
) -> Figures {
    mixed_threads(
        w,
        threads,
        seed,
        |q| {
            std::hint::black_box(smg.read().expect("smg lock").query(&q.content));
        },
        // Its block pairs are built inside the store, under the lock, as
        // its service builds them.
        |_, _: &mut Vec<(u64, u64)>| {},
        |r, pairs: &mut Vec<(u64, u64)>| smg.write().expect("smg lock").store(r, pairs),
    )
}

/// The mixed phase on radixkv's router index: queries by precomputed
/// hashes, stores as events (built before the clock starts), both through
/// `&self` from every thread.
pub(crate) fn mixed_index(
    kv: &radixkv_index::KvIndex,
    w: &Workload,
    threads: usize,
    seed: u64,
) -> Figures {
    mixed_threads(
        w,
        threads,
        seed,
        |q| {
            std::hint::black_box(crate::rkindex::query(kv, &q.content));
        },
        |r, ev: &mut Option<radixkv_index::decode::Event>| {
            *ev = Some(crate::rkindex::stored(r, w.page));
        },
        |r, ev: &mut Option<radixkv_index::decode::Event>| {
            let e = ev.take().expect("prepared");
            crate::rkindex::apply(kv, r.device, &e);
        },
    )
}
