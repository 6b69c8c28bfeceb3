//! radixkv's router index (`radixkv_index::KvIndex`, the tree `radixkv
//! index` serves), fed the blocks CRTC gets as the KV events an engine
//! publishes: one `BlockStored` per request from the root (its sequence
//! hashes, its tokens), one `BlockRemoved` per evicted run. Its queries
//! take Dynamo's local block hashes, precomputed, as `crtc-pre` and
//! `smg-pre` do: the same radixkv tree as the `radixkv` rows, keyed by
//! two hash words a block instead of 16 tokens. `&self` throughout: the
//! 2-thread phases call it from both threads, no lock around it.

use crate::measure::{hist, timed, Figures, Report};
use crate::mixed::mixed_index;
use crate::setup::{queries_on, settle_allocator};
use crate::workload::{Request, Workload};
use radixkv_index::decode::{BlockHash, Event, Medium, Stored};
use radixkv_index::{KvIndex, Source};
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

    let mut h = hist();
    let t = Instant::now();
    for &i in picks {
        let r = &w.stored[i];
        timed(&mut h, || {
            std::hint::black_box(query(&kv, &r.content));
        });
    }
    let mut rows = vec![("radixkv-index", Figures::of(&h, picks.len(), t.elapsed()))];
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

/// One source (worker) per device, rank 0.
fn source(device: usize) -> Source {
    Source {
        worker: device as u64,
        rank: 0,
    }
}

/// The store event of `r` (built before the clock starts, as a router
/// gets it decoded).
pub(crate) fn stored(r: &Request, page: usize) -> Event {
    Event::Stored(Stored {
        hashes: r.seq.iter().map(|&h| BlockHash(h)).collect(),
        parent: None,
        tokens: r.tokens.clone(),
        block_size: page,
        medium: Medium::Gpu,
        lora_name: None,
        cache_salt: None,
    })
}

/// The index of `devices` sources.
pub(crate) fn new(devices: usize, page: usize) -> KvIndex {
    KvIndex::new(page, devices).expect("radixkv index")
}

/// Applies `event` from `device`'s source; every event must apply.
pub(crate) fn apply(kv: &KvIndex, device: usize, event: &Event) {
    let (_, errors) = kv.apply(source(device), std::slice::from_ref(event));
    assert!(
        errors.is_empty(),
        "radixkv index refused an event: {errors:?}"
    );
}

/// The removal event of the blocks with sequence hashes `keys`.
pub(crate) fn removed(keys: &[u64]) -> Event {
    Event::Removed {
        hashes: keys.iter().map(|&h| BlockHash(h)).collect(),
        medium: Medium::Gpu,
    }
}

/// Blocks of `contents`' longest prefix each device holds.
pub(crate) fn per_device(kv: &KvIndex, contents: &[u64], devices: usize) -> Vec<usize> {
    let mut per = vec![0; devices];
    for s in kv.scores_by_hash(contents) {
        per[s.source.worker as usize] = s.tokens / kv.block_size();
    }
    per
}

/// The query as a router runs it: the scores only.
pub(crate) fn query(kv: &KvIndex, contents: &[u64]) -> usize {
    kv.scores_by_hash(contents).len()
}
