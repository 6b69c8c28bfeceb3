//! Namespaces at scale (`cargo bench --bench namespaces`): one 64-token
//! insert (page size 16) into each new namespace in turn, as a server with
//! a `cache_salt` per user or per request sees it.
//!
//! Reports, for 100,000 namespaces in one cache:
//! * the mean insert time into namespaces 1–2,000, 18,000–20,000 and
//!   98,000–100,000, and the ratios of the later windows to the first
//!   (target ≤ 2×: namespace lookup is expected O(1));
//! * after evicting everything: `peek` of a namespace never seen, without
//!   and with `reclaim()` (target ≤ 1 µs), at 20,000 and at 100,000
//!   namespaces;
//! * after evicting everything and `reclaim()`: live bytes above an empty
//!   cache (target within 64 KiB: empty namespace roots are reclaimed).
//!
//! `--quick` runs 20,000 namespaces only. Absolute times are this
//! machine's; the ratios are the claims.

#[path = "../tests/common/counting_alloc.rs"]
mod counting_alloc;

use counting_alloc::{flush_epoch, live, Counting};
use radixkv::{DeviceId, RadixCache, TokenKey};
use std::time::{Duration, Instant};

#[global_allocator]
static ALLOC: Counting = Counting;

const D0: DeviceId = DeviceId(0);

fn new_cache() -> RadixCache {
    RadixCache::builder().page_size(16).build().unwrap()
}

/// Median of `n` timed `peek`s of namespaces never seen.
fn peek_unseen(c: &RadixCache, n: usize) -> Duration {
    let key: Vec<u32> = (0..64).collect();
    let mut t: Vec<Duration> = (0..n)
        .map(|i| {
            let ns = format!("never-seen-{i}");
            let k = TokenKey::new(&key).with_namespace(&ns);
            let s = Instant::now();
            let r = c.peek(k);
            let d = s.elapsed();
            assert_eq!(r, vec![0]);
            d
        })
        .collect();
    t.sort_unstable();
    t[n / 2]
}

/// Inserts into `total` namespaces; returns the mean insert time of each
/// `(from, to)` window (1-based, inclusive).
fn fill(c: &RadixCache, total: usize, windows: &[(usize, usize)]) -> Vec<Duration> {
    let key: Vec<u32> = (0..64).collect();
    let values: Vec<u32> = (1000..1064).collect();
    let mut sums = vec![Duration::ZERO; windows.len()];
    for i in 1..=total {
        let ns = format!("tenant-{i}");
        let k = TokenKey::new(&key).with_namespace(&ns);
        let s = Instant::now();
        c.insert(k, D0, &values, 0).unwrap();
        let d = s.elapsed();
        for (w, &(from, to)) in windows.iter().enumerate() {
            if (from..=to).contains(&i) {
                sums[w] += d;
            }
        }
    }
    sums.iter()
        .zip(windows)
        .map(|(s, &(from, to))| *s / (to - from + 1) as u32)
        .collect()
}

fn run(total: usize, windows: &[(usize, usize)]) {
    flush_epoch();
    let before = live();
    let empty = new_cache();
    flush_epoch();
    let empty_bytes = live() - before;
    drop(empty);

    let c = new_cache();
    let means = fill(&c, total, windows);
    println!("{total} namespaces, one 64-token insert each (page size 16):");
    for (m, &(from, to)) in means.iter().zip(windows) {
        println!(
            "  insert into namespaces {from}-{to}: {:.2} us mean, {:.2}x the first window",
            m.as_secs_f64() * 1e6,
            m.as_secs_f64() / means[0].as_secs_f64()
        );
    }
    let base = live();
    c.evict(D0, usize::MAX).unwrap();
    assert_eq!(c.node_count(), 0);
    let without = peek_unseen(&c, 10_001);
    c.reclaim();
    let with = peek_unseen(&c, 10_001);
    let left = live() - before - empty_bytes;

    println!(
        "  after evicting everything: peek of an unseen namespace {:.0} ns without reclaim(), {:.0} ns with (median of 10,001)",
        without.as_secs_f64() * 1e9,
        with.as_secs_f64() * 1e9
    );
    println!(
        "  after evicting everything and reclaim(): {left} bytes above an empty cache (was {} with the tree full)",
        base - before - empty_bytes
    );
    drop(c);
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    // The large run first, in a fresh process: every window then takes its
    // memory from the system alike (a later run would reuse the freed
    // memory of an earlier one in its first windows only, and look faster
    // there).
    if !quick {
        run(100_000, &[(1, 2_000), (18_000, 20_000), (98_000, 100_000)]);
    }
    run(20_000, &[(1, 2_000), (18_000, 20_000)]);
}
