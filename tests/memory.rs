//! I7 reclamation: build, churn and drop large trees repeatedly and show
//! that allocated bytes return to the baseline, so unlinked nodes, replaced
//! images and children arrays really are freed (no `Arc` cycles, no leaked
//! epoch garbage). A counting global allocator measures live bytes; this
//! file holds one test so no other test allocates concurrently.

use radixkv::{DeviceId, RadixCache, TokenKey};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

#[path = "common/counting_alloc.rs"]
mod counting_alloc;
use counting_alloc::{flush_epoch, live, Counting};

#[global_allocator]
static ALLOC: Counting = Counting;

/// Builds a tree with splits on two devices, churns it (pins, evictions,
/// re-inserts) and drops it. Returns the peak of live bytes above `base`.
fn round(seed: u64, base: isize) -> isize {
    let mut rng = StdRng::seed_from_u64(seed);
    let cache = RadixCache::builder()
        .devices(2)
        .page_size(1)
        .build()
        .unwrap();
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
    drop(cache);
    peak
}

#[test]
fn dropped_trees_return_memory_to_baseline() {
    // Warm up lazily allocated statics (epoch collector, thread locals).
    round(1, 0);
    flush_epoch();
    let base = live();
    let mut after = Vec::new();
    for r in 0..5 {
        let peak = round(100 + r, base);
        flush_epoch();
        let left = live() - base;
        eprintln!("round {r}: peak {peak} bytes above baseline, {left} after drop");
        assert!(
            peak > 1_000_000,
            "the tree should have held real memory (peak {peak})"
        );
        after.push(left);
    }
    for (r, left) in after.iter().enumerate() {
        assert!(
            *left < 64 * 1024,
            "round {r}: {left} bytes still allocated after dropping the tree"
        );
    }
}
