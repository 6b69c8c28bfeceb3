//! The torture run behind `radixkv stress`: scheduler threads run request
//! lifecycles at random on a cache that owns its pages, with pools small
//! enough that eviction runs all the time, then the invariants are audited
//! and every page is accounted for.

use radixkv::{CacheError, DeviceId, RadixCache, TokenKey};
use radixkv_engine::rng::SplitMix64;
use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Settings of a torture run.
#[derive(Clone, Debug)]
pub struct TortureConfig {
    /// Devices (each with its own pool).
    pub devices: usize,
    /// Pages per device (page 0 reserved).
    pub pages: usize,
    /// Tokens per page.
    pub page_size: usize,
    /// Scheduler threads.
    pub threads: usize,
    /// How long to run.
    pub duration: Duration,
    /// PRNG seed.
    pub seed: u64,
}

/// What a torture run did and found.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct TortureReport {
    /// Requests started.
    pub ops: u64,
    /// Successful page allocations (`reserve` calls that allocated).
    pub allocs: u64,
    /// Pages evicted (by the caller or the cache's allocation fallback):
    /// pages the tree adopted from requests minus pages still cached.
    pub evicted_pages: u64,
    /// Whether `RadixCache::check` passed at the end.
    pub audit_ok: bool,
    /// Pages neither free, nor in the tree, nor held by a request.
    pub leaked_pages: u64,
    /// Frees of pages that were already free.
    pub double_frees: u64,
    /// The longest `begin` (match and pin) took, in microseconds.
    pub max_pin_wait_us: u64,
    /// The audit's message when it failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub audit_error: Option<String>,
}

impl TortureReport {
    /// Whether the run found nothing wrong.
    pub fn ok(&self) -> bool {
        self.audit_ok && self.leaked_pages == 0 && self.double_frees == 0
    }
}

/// The run's draws: [`SplitMix64`] (the workspace's one generator), in
/// `u64`s.
struct Rng(SplitMix64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(SplitMix64::new(seed))
    }
    /// A value in `0..n` (0 when `n` is 0).
    fn below(&mut self, n: u64) -> u64 {
        self.0.below(n as usize) as u64
    }
}

/// Runs the torture test.
pub fn run(cfg: &TortureConfig) -> Result<TortureReport, CacheError> {
    let cache = Arc::new(
        RadixCache::builder()
            .devices(cfg.devices)
            .page_size(cfg.page_size)
            .pages_per_device(cfg.pages)
            .build()?,
    );
    let ops = AtomicU64::new(0);
    let allocs = AtomicU64::new(0);
    // Tokens the tree adopted from requests; whatever of them is no longer
    // cached at the end was evicted, by whichever path (the caller, the
    // cache's own allocation fallback).
    let adopted = AtomicU64::new(0);
    let max_wait = AtomicU64::new(0);
    let deadline = Instant::now() + cfg.duration;
    // Shared prompts make prefixes collide across threads and devices.
    let mut rng = Rng::new(cfg.seed);
    let ps = cfg.page_size as u64;
    let prompts: Vec<Vec<u32>> = (0..16)
        .map(|_| {
            (0..(ps * (1 + rng.below(12))))
                .map(|_| rng.below(5000) as u32)
                .collect()
        })
        .collect();
    std::thread::scope(|s| -> Result<(), CacheError> {
        let handles: Vec<_> = (0..cfg.threads)
            .map(|t| {
                let (cache, prompts) = (&cache, &prompts);
                let (ops, allocs, adopted, max_wait) = (&ops, &allocs, &adopted, &max_wait);
                let took = |r: radixkv::InsertResult| {
                    let n: usize = r.adopted.iter().map(|a| a.len()).sum();
                    adopted.fetch_add(n as u64, Ordering::Relaxed);
                };
                s.spawn(move || -> Result<(), CacheError> {
                    let mut rng = Rng::new(cfg.seed.wrapping_mul(31).wrapping_add(t as u64 * 7919));
                    while Instant::now() < deadline {
                        let d = DeviceId(((t as u64 + rng.below(2)) % cfg.devices as u64) as u32);
                        let mut key = prompts[rng.below(prompts.len() as u64) as usize].clone();
                        key.extend(
                            (0..1 + rng.below(3 * ps)).map(|_| 10_000 + rng.below(64) as u32),
                        );
                        let t0 = Instant::now();
                        let mut r = cache.begin(TokenKey::new(&key), d)?;
                        max_wait.fetch_max(t0.elapsed().as_micros() as u64, Ordering::Relaxed);
                        ops.fetch_add(1, Ordering::Relaxed);
                        let need = key.len() - r.cached_len();
                        if r.reserve().is_err() {
                            // Out of pages: evict the shortfall, retry once.
                            cache.evict(d, need)?;
                            if r.reserve().is_err() {
                                continue; // abort: dropping returns everything
                            }
                        }
                        allocs.fetch_add(1, Ordering::Relaxed);
                        match rng.below(10) {
                            0 => r.abort(),
                            1..=4 => {
                                took(r.commit_chunk(key.len() / 2)?);
                                // Decoding goes on: a few more tokens.
                                r.extend(&[1, 2, 3][..1 + rng.below(3) as usize]);
                                if r.reserve().is_err() {
                                    cache.evict(d, 3)?;
                                    let _ = r.reserve();
                                }
                                took(r.finish()?);
                            }
                            _ => took(r.finish()?),
                        }
                        if rng.below(20) == 0 {
                            cache.evict(d, rng.below(4 * ps) as usize + 1)?;
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        for h in handles {
            h.join()
                .map_err(|_| CacheError::InvalidConfig("a scheduler thread panicked".into()))??;
        }
        Ok(())
    })?;
    let audit = cache.check();
    let mut leaked = 0u64;
    let mut double_frees = 0u64;
    let mut cached_tokens = 0u64;
    for d in 0..cfg.devices {
        let dev = DeviceId(d as u32);
        let a = cache.allocator(dev)?;
        let total = cache.sizes(dev)?.total;
        cached_tokens += total as u64;
        let in_tree = total / cfg.page_size;
        let accounted = a.free_pages() + in_tree + a.pages_in_spans();
        leaked += (cfg.pages - 1).saturating_sub(accounted) as u64;
        double_frees += a.double_frees();
    }
    Ok(TortureReport {
        ops: ops.load(Ordering::Relaxed),
        allocs: allocs.load(Ordering::Relaxed),
        evicted_pages: adopted
            .load(Ordering::Relaxed)
            .saturating_sub(cached_tokens)
            / cfg.page_size as u64,
        audit_ok: audit.is_ok(),
        leaked_pages: leaked,
        double_frees,
        max_pin_wait_us: max_wait.load(Ordering::Relaxed),
        audit_error: audit.err(),
    })
}
