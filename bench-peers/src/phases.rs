//! The Mooncake phase (the real trace) and the scaling phase (1 to 16
//! threads).

use crate::measure::{hist, timed, Figures, Report};
use crate::workload::{self, Workload};
use dynamo_kv_router::indexer::SyncIndexer;
use dynamo_kv_router::ConcurrentRadixTreeCompressed;
use radixkv::TokenKey;
use rand::rngs::StdRng;
use rand::SeedableRng;
use std::sync::Arc;
use std::time::Instant;

use crate::args::Args;
use crate::dynamo::{self, Lane};
use crate::mixed::{mixed_dynamo, mixed_radixkv};
use crate::setup::*;

/// A real trace in trace order on 4 devices: each request is first routed
/// (a query from its tokens), then stored on its device.
pub(crate) fn mooncake_phase(rep: &mut Report, w: Arc<Workload>) {
    let wl = w.name.clone();
    rep.header(&format!("{wl}: {}", w.about));
    // The workload before this one was just dropped (see `settle_allocator`).
    settle_allocator();
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
    // SMG's index, directly on this thread (no lock: one writer).
    let mut smg = crate::smg::Smg::new(w.devices);
    let (mut gq, mut gs) = (hist(), hist());
    let mut pairs = Vec::new();
    let t = Instant::now();
    for r in &w.stored {
        timed(&mut gq, || {
            std::hint::black_box(smg.query_tokens(&r.tokens, PAGE as u32));
        });
        timed(&mut gs, || smg.store(r, &mut pairs));
    }
    let smg_wall = t.elapsed();
    let smg_q = Figures::of(&gq, n, smg_wall);
    let smg_s = Figures::of(&gs, n, smg_wall);
    let mut gboth = gq.clone();
    gboth.add(&gs).expect("histogram add");
    let smg_both = Figures::of(&gboth, 2 * n, smg_wall);
    rep.phase(
        &wl,
        "route_then_store",
        &[
            ("radixkv", ours),
            ("crtc-tokens", crtc_both),
            ("smg-tokens", smg_both),
        ],
    );
    rep.phase(
        &wl,
        "its_queries",
        &[
            ("radixkv", ours_q),
            ("crtc-tokens", crtc_q),
            ("smg-tokens", smg_q),
        ],
    );
    rep.phase(
        &wl,
        "its_stores",
        &[("radixkv", ours_s), ("crtc", crtc_s), ("smg", smg_s)],
    );
    check_agree(&w, &cache, &crtc, "after the trace");
    check_agree_smg(&w, &cache, &smg, "after the trace");
}

/// Queries and mixed 50/50 at each thread count, on W1 with 16 devices
/// (thread t stores for devices t, t + n, ...), radixkv against CRTC.
pub(crate) fn scaling(rep: &mut Report, args: &Args) {
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
