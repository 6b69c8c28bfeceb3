//! I7 reclamation: build, churn and drop large trees repeatedly and show
//! that allocated bytes return to the baseline, so unlinked nodes, replaced
//! images and children arrays really are freed (no `Arc` cycles, no leaked
//! epoch garbage), both in a live cache (after evicting everything and
//! `reclaim()`, within 64 KiB of an empty cache) and after dropping it. A
//! counting global allocator measures live bytes; this file holds one test
//! so no other test allocates concurrently.

use radixkv::{DeviceId, RadixCache, TokenKey};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

#[path = "common/counting_alloc.rs"]
mod counting_alloc;
use counting_alloc::{flush_epoch, live, Counting};

#[global_allocator]
static ALLOC: Counting = Counting;

fn new_cache() -> RadixCache {
    RadixCache::builder()
        .devices(2)
        .page_size(1)
        .build()
        .unwrap()
}

/// Live bytes of an empty cache like the rounds' (measured, not assumed).
fn empty_cache_bytes() -> isize {
    flush_epoch();
    let before = live();
    let cache = new_cache();
    flush_epoch();
    let size = live() - before;
    drop(cache);
    size
}

/// Live bytes of an empty cache built like `c` (page size 16, one device).
fn empty_cache_bytes_like(_c: &RadixCache) -> isize {
    flush_epoch();
    let before = live();
    let e = RadixCache::builder().page_size(16).build().unwrap();
    flush_epoch();
    let size = live() - before;
    drop(e);
    size
}

/// What one round measured, in bytes above the baseline.
struct Round {
    /// The peak while the tree was in use.
    peak: isize,
    /// The live cache after evicting everything on both devices and
    /// `reclaim()`, less an empty cache's bytes.
    live_after_evict: isize,
}

/// Builds a tree with splits on two devices, churns it (pins, evictions,
/// re-inserts), evicts everything and reclaims, then drops it.
fn round(seed: u64, base: isize, empty: isize) -> Round {
    let mut rng = StdRng::seed_from_u64(seed);
    let cache = new_cache();
    let prompts: Vec<Vec<u32>> = (0..64)
        .map(|_| {
            (0..rng.random_range(20..200))
                .map(|_| rng.random_range(0..1000))
                .collect()
        })
        .collect();
    let mut next = 0u32;
    let mut peak = 0;
    for i in 0..6_000 {
        let p = &prompts[rng.random_range(0..prompts.len())];
        let mut key = p[..rng.random_range(1..=p.len())].to_vec();
        key.extend((0..rng.random_range(0..50)).map(|_| rng.random_range(0..1000u32)));
        let d = DeviceId(rng.random_range(0..2));
        let values: Vec<u32> = (next..next + key.len() as u32).collect();
        next += key.len() as u32;
        cache.insert(TokenKey::new(&key), d, &values, 0).unwrap();
        let m = cache
            .match_and_pin(TokenKey::new(&key[..key.len() / 2]), d)
            .unwrap();
        if i % 10 == 0 {
            cache.evict(d, 200).unwrap();
        }
        drop(m);
        if i % 100 == 99 {
            peak = peak.max(live() - base);
        }
    }
    cache.audit();
    for d in 0..2 {
        cache.evict(DeviceId(d), usize::MAX).unwrap();
    }
    assert_eq!(cache.node_count(), 0, "everything evicted");
    // reclaim() alone, no test-side epoch flushing.
    cache.reclaim();
    let live_after_evict = live() - base - empty;

    cache.audit();
    drop(cache);
    Round {
        peak,
        live_after_evict,
    }
}

#[test]
fn dropped_trees_return_memory_to_baseline() {
    // Warm up lazily allocated statics (epoch collector, thread locals).
    round(1, 0, 0);
    flush_epoch();
    let empty = empty_cache_bytes();
    flush_epoch();
    let base = live();
    let mut after = Vec::new();
    for r in 0..5 {
        let Round {
            peak,
            live_after_evict,
        } = round(100 + r, base, empty);
        flush_epoch();
        let left = live() - base;
        eprintln!(
            "round {r}: peak {peak} bytes above baseline, {live_after_evict} above an empty \
             cache ({empty} bytes) after evicting everything and reclaim(), {left} after drop"
        );
        assert!(
            peak > 1_000_000,
            "the tree should have held real memory (peak {peak})"
        );
        assert!(
            live_after_evict < 64 * 1024,
            "round {r}: a live cache holds {live_after_evict} bytes more than an empty one \
             after evicting everything and reclaim()"
        );
        after.push(left);
    }
    // Many namespaces (a cache salt per user): one 64-token insert into
    // each of 5,000 namespaces, then everything evicted and reclaim(): the
    // empty roots and the namespace table's grown slots are given back.
    flush_epoch();
    let before = live();
    let c = RadixCache::builder().page_size(16).build().unwrap();
    let key: Vec<u32> = (0..64).collect();
    for i in 0..5_000 {
        let ns = format!("tenant-{i}");
        c.insert(
            TokenKey::new(&key).with_namespace(&ns),
            DeviceId(0),
            &key,
            0,
        )
        .unwrap();
    }
    let full = live() - before;
    c.evict(DeviceId(0), usize::MAX).unwrap();
    assert_eq!(c.node_count(), 0);
    c.reclaim();
    let left = live() - before - empty_cache_bytes_like(&c);
    eprintln!(
        "5,000 namespaces: {full} bytes full, {left} above an empty cache after evict + reclaim()"
    );
    assert!(full > 1_000_000, "the namespaces held real memory ({full})");
    assert!(
        left < 64 * 1024,
        "{left} bytes more than an empty cache after evicting 5,000 namespaces and reclaim()"
    );
    c.audit();
    drop(c);

    // A wide node (a system prompt with 3,000 continuations: its children
    // array is chunked, and every insert and eviction replaces one chunk):
    // every chunk is freed, whether evicted and reclaimed or dropped with
    // the tree.
    for evict_first in [true, false] {
        flush_epoch();
        let before = live();
        let c = RadixCache::builder().page_size(16).build().unwrap();
        let mut rng = StdRng::seed_from_u64(7);
        let prompt: Vec<u32> = (0..64).collect();
        for i in 0..3_000u32 {
            let mut key = prompt.clone();
            key.extend((0..32).map(|_| rng.random_range(0..100_000u32)));
            c.insert(TokenKey::new(&key), DeviceId(0), &key, 0).unwrap();
            if i % 7 == 0 {
                c.evict(DeviceId(0), 32).unwrap();
            }
        }
        c.audit();
        let full = live() - before;
        if evict_first {
            c.evict(DeviceId(0), usize::MAX).unwrap();
            assert_eq!(c.node_count(), 0);
            c.reclaim();
            let left = live() - before - empty_cache_bytes_like(&c);
            eprintln!(
                "wide node: {full} bytes full, {left} above an empty cache after evict + reclaim()"
            );
            assert!(
                left < 64 * 1024,
                "{left} bytes more than an empty cache after evicting a wide node and reclaim()"
            );
        }
        drop(c);
        flush_epoch();
        let left = live() - before;
        eprintln!("wide node: {left} bytes left after drop (evicted first: {evict_first})");
        assert!(full > 1_000_000, "the wide node held real memory ({full})");
        assert!(
            left < 64 * 1024,
            "{left} bytes still allocated after dropping a tree with a wide node"
        );
    }
    for (r, left) in after.iter().enumerate() {
        assert!(
            *left < 64 * 1024,
            "round {r}: {left} bytes still allocated after dropping the tree"
        );
    }
}
