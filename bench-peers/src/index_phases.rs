//! radixkv's router index through the suite's steps, on its own after
//! the suite's phases (alive through them, its tree and block maps slowed
//! radixkv's own removal by a third), each phase reported beside the
//! peers' figures of the same step. The index itself: `rkindex.rs`.

use crate::measure::{hist, timed, Figures, Report};
use crate::mixed::mixed_index;
use crate::rkindex::{apply, new, per_device, query, removed, stored};
use crate::setup::{queries_here, queries_on, settle_allocator};
use crate::workload::Workload;
use radixkv_index::KvIndex;
use std::time::{Duration, Instant};

/// The peers' figures of the same steps, measured earlier in the run.
pub(crate) struct Peers {
    pub store: [(&'static str, Figures); 2],
    pub query: [(&'static str, Figures); 3],
    pub query_2t: [(&'static str, Figures); 3],
    pub remove_ms: [(&'static str, f64); 2],
    pub mixed: [(&'static str, Figures); 3],
}

/// The router index through the suite's steps on its own: built from the
/// stored requests (`store_events`), queried by precomputed hashes on the
/// same picks on one and two threads, told the blocks radixkv removed
/// (`removals`: per device, each run's sequence hashes), then the mixed
/// phase on the fresh requests; each phase reported beside `peers`.
/// Returns the index, which then holds what radixkv's cache holds.
pub(crate) fn phases(
    rep: &mut Report,
    w: &Workload,
    picks: &[usize],
    removals: &[(usize, Vec<u64>)],
    note: &str,
    peers: &Peers,
) -> KvIndex {
    let wl = &w.name;
    let kv = new(w.devices, w.page);
    // Each event is built just before it is applied, outside the timed
    // call (all of them at once would be a copy of every request's tokens).
    let mut h = hist();
    let mut building = Duration::ZERO;
    let t = Instant::now();
    for r in &w.stored {
        let b = Instant::now();
        let e = stored(r, w.page);
        building += b.elapsed();
        timed(&mut h, || apply(&kv, r.device, &e));
    }
    let store = Figures::of(&h, w.stored.len(), t.elapsed() - building);
    let mut rows = vec![("radixkv-index", store)];
    rows.extend(peers.store);
    rep.phase(wl, "store_events", &rows);
    for r in &w.stored {
        let held = per_device(&kv, &r.content, w.devices)[r.device];
        assert_eq!(
            held,
            r.content.len(),
            "{wl}: the router index lost a stored request"
        );
    }

    let q1 = queries_here(w, picks, &mut |r| {
        std::hint::black_box(query(&kv, &r.content));
    });
    let mut rows = vec![("radixkv-index", q1)];
    rows.extend(peers.query);
    rep.phase(wl, "query_hashes_in", &rows);

    let q2 = queries_on(w, picks, 2, &|r| {
        std::hint::black_box(query(&kv, &r.content));
    });
    let mut rows = vec![("radixkv-index", q2)];
    rows.extend(peers.query_2t);
    rep.phase(wl, "query_2t_hashes_in", &rows);

    let events: Vec<_> = removals
        .iter()
        .map(|(dev, hs)| (*dev, removed(hs)))
        .collect();
    settle_allocator();
    let t = Instant::now();
    for (dev, e) in &events {
        apply(&kv, *dev, e);
    }
    let ms = t.elapsed().as_secs_f64() * 1e3;
    drop(events);
    let mut rows = vec![("radixkv-index", ms)];
    rows.extend(peers.remove_ms);
    rep.timing(wl, "remove_10pct_events", &rows, note);

    let mixed = mixed_index(&kv, w, 2, 21);
    let mut rows = vec![("radixkv-index", mixed)];
    rows.extend(peers.mixed);
    rep.phase(wl, "mixed_50_2t_hashes_in", &rows);
    kv
}
