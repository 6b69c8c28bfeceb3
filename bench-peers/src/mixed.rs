//! The mixed phase: stores, removals and queries from several threads at
//! once, on radixkv and on Dynamo's indexes.

use crate::measure::{hist, timed, Figures};
use crate::workload::Workload;
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
