//! A tree changed only by inserts and removals by key (`evict_from`, as an
//! index fed by KV events changes it; never `evict` or `reclaim`) keeps a
//! steady footprint: what the removals unlink is freed by the removals
//! themselves, and with `candidate_heap(false)` no inserts' leaf notes pile
//! up waiting for an eviction that never comes. The control, the same
//! churn with the candidate heap on, grows with every round (each note
//! keeps its node, and the node's tokens, alive after it is unlinked): the
//! measurement sees the pile-up when there is one. The tree has 20 tiers,
//! so its nodes' tier slots are allocated on first use, and dropping it
//! must give them back (within 64 KiB). A counting global
//! allocator measures live bytes; this file holds one test so no other
//! test allocates concurrently.

use radixkv::{DeviceId, RadixCache, TokenKey};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

#[path = "common/counting_alloc.rs"]
mod counting_alloc;
use counting_alloc::{flush_epoch, live, Counting};

#[global_allocator]
static ALLOC: Counting = Counting;

const PAGE: usize = 16;
/// Above 16 tiers: a node's tier slots are allocated on first use
/// (`Slots::Sparse`), and dropping the tree must free them.
const TIERS: usize = 20;
const PATHS: usize = 48;
const PAGES: usize = 8;

/// Live bytes above `base` after each of `rounds` rounds of churn (per
/// round and tier, one path inserted and one page of another removed
/// with everything below it), and after the tree is dropped.
fn churn(candidate_heap: bool, rounds: usize) -> (Vec<isize>, isize) {
    let mut after = Vec::with_capacity(rounds);
    flush_epoch();
    let base = live();
    let cache = RadixCache::builder()
        .page_size(PAGE)
        .devices(TIERS)
        .candidate_heap(candidate_heap)
        .build()
        .unwrap();
    // Paths sharing prefixes: each of the first 12 pages, then its own.
    let mut rng = StdRng::seed_from_u64(7);
    let paths: Vec<Vec<u32>> = (0..PATHS)
        .map(|p| {
            (0..PAGES * PAGE)
                .map(|i| {
                    let page = i / PAGE;
                    let owner = if page < 2 { p % 12 } else { p };
                    (owner * 1000 + page * PAGE + i % PAGE) as u32
                })
                .collect()
        })
        .collect();
    for _ in 0..rounds {
        for t in 0..TIERS {
            let d = DeviceId(t as u32);
            let p = &paths[rng.random_range(0..PATHS)];
            let values: Vec<u32> = (0..p.len() as u32).collect();
            cache.insert(TokenKey::new(p), d, &values, 0).unwrap();
            let q = &paths[rng.random_range(0..PATHS)];
            let pages = rng.random_range(1..=PAGES);
            cache
                .evict_from(TokenKey::new(&q[..pages * PAGE]), d)
                .unwrap();
        }
        after.push(live() - base);
    }
    cache.check().unwrap();
    drop(cache);
    flush_epoch();
    (after, live() - base)
}

#[test]
fn a_tree_changed_by_key_keeps_a_steady_footprint() {
    const ROUNDS: usize = 6000;
    // Steady state: the tree holds at most the 48 paths on 20 tiers; the
    // garbage waiting for its grace period is bounded by the reclaimer's
    // staging. The footprint late in the run is the footprint early on.
    // Warm up lazily allocated statics (the epoch collector, thread
    // locals) so that they do not count as the tree's.
    churn(false, 50);
    churn(true, 50);
    let (by_key, dropped) = churn(false, ROUNDS);
    assert!(
        dropped < 64 << 10,
        "{dropped} bytes stayed allocated after the tree was dropped"
    );
    let early = *by_key[500..1000].iter().max().unwrap();
    let late = *by_key[ROUNDS - 500..].iter().max().unwrap();
    assert!(
        late <= early + early / 2 + (64 << 10),
        "changed by key, the footprint grew from {early} to {late} bytes"
    );
    // The control: the notes of the candidate heap pile up.
    let (noted, _) = churn(true, ROUNDS);
    let early_noted = *noted[500..1000].iter().max().unwrap();
    let late_noted = *noted[ROUNDS - 500..].iter().max().unwrap();
    assert!(
        late_noted > 2 * early_noted,
        "the control did not grow ({early_noted} to {late_noted} bytes): the test measures nothing"
    );
    eprintln!(
        "by key: {early} -> {late} bytes, {dropped} after the drop; with the candidate heap: \
         {early_noted} -> {late_noted}"
    );
}
