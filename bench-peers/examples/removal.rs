//! Removal alone, for profiling: a W1-shaped tree (64 prompts × 1,000
//! tokens, 1,000 requests each with a unique 200-token suffix, page 16,
//! request `i` on device `i mod 4`, shuffled arrival, LRU) built afresh
//! each round, then 10 % of every device evicted, as in the bench's
//! `remove_10pct` phase but without the peers and the other phases around
//! it. Prints the medians of the rounds' insert and removal times.
//!
//! ```bash
//! cargo run --release --manifest-path bench-peers/Cargo.toml --target-dir target/peers \
//!     --example removal -- 8
//! perf record -e cpu-clock --call-graph dwarf target/peers/release/examples/removal 8
//! ```

use radixkv::{DeviceId, EvictionPolicy, RadixCache, TokenKey};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use std::time::{Duration, Instant};

const GROUPS: usize = 64;
const PER_GROUP: usize = 1000;
const PROMPT: usize = 1000;
const SUFFIX: usize = 200;
const PAGE: usize = 16;
const DEVICES: usize = 4;

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(8)
        .max(1);
    let mut rng = StdRng::seed_from_u64(7);
    let mut requests: Vec<Vec<u32>> = Vec::with_capacity(GROUPS * PER_GROUP);
    for _ in 0..GROUPS {
        let prompt: Vec<u32> = (0..PROMPT).map(|_| rng.random_range(0..128_000)).collect();
        for _ in 0..PER_GROUP {
            let mut t = prompt.clone();
            t.extend((0..SUFFIX).map(|_| rng.random_range(0..128_000)));
            t.truncate(t.len() / PAGE * PAGE);
            requests.push(t);
        }
    }
    requests.shuffle(&mut rng);
    let (mut inserts, mut removals) = (Vec::new(), Vec::new());
    let mut base = 0u32;
    let mut values = Vec::new();
    for _ in 0..rounds {
        let cache = RadixCache::builder()
            .page_size(PAGE)
            .devices(DEVICES)
            .eviction_policy(EvictionPolicy::Lru)
            .build()
            .expect("cache");
        let t = Instant::now();
        for (i, r) in requests.iter().enumerate() {
            // Page-run values, as a fresh allocator hands out.
            values.clear();
            values.extend(base..base + r.len() as u32);
            base = base.wrapping_add(r.len() as u32);
            cache
                .insert(TokenKey::new(r), DeviceId((i % DEVICES) as u32), &values, 0)
                .expect("insert");
        }
        inserts.push(t.elapsed().as_secs_f64() * 1e3);
        let totals: Vec<usize> = (0..DEVICES)
            .map(|d| cache.resident_tokens(DeviceId(d as u32)).expect("device"))
            .collect();
        std::thread::sleep(Duration::from_millis(20));
        let t = Instant::now();
        for (d, total) in totals.iter().enumerate() {
            cache.evict(DeviceId(d as u32), total / 10).expect("evict");
        }
        removals.push(t.elapsed().as_secs_f64() * 1e3);
    }
    println!(
        "{rounds} rounds: insert all {:.1} ms, remove 10 % {:.1} ms (medians; removal min {:.1})",
        median(&mut inserts),
        median(&mut removals),
        removals[0]
    );
}
