//! Stress: several threads match, pin, unpin, insert, evict and evict a
//! block with what continues it (`evict_from`, by key or from the place of
//! an earlier insert) on 2–4 devices at once; then
//! the invariants are audited and every value is accounted for.
//!
//! Values (stand-ins for KV slots) are recycled through a per-device free
//! list, so a value evicted while a reader still used it would soon belong to
//! another token. A shared ownership table records, per device and value,
//! the fingerprint of the token path that owns it; each pinned reader checks
//! its values against that table when it pins and again when it releases.
//!
//! `RADIXKV_STRESS_OPS` sets the ops per thread (default 25,000; 4 threads).

use radixkv::{DeviceId, Lease, RadixCache, TokenKey};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

const FREE: u64 = 0;

struct Device {
    free: Mutex<Vec<u32>>,
    owner: Vec<AtomicU64>,
}

struct World {
    cache: RadixCache,
    devices: Vec<Device>,
    pool: usize,
    checks: AtomicUsize,
}

#[path = "common/fingerprint.rs"]
mod fingerprint;
use fingerprint::fingerprints;

impl World {
    fn new(devices: usize, page_size: usize, pool: usize) -> Self {
        World {
            cache: RadixCache::builder()
                .devices(devices)
                .page_size(page_size)
                .build()
                .unwrap(),
            devices: (0..devices)
                .map(|_| Device {
                    free: Mutex::new((0..pool as u32).collect()),
                    owner: (0..pool).map(|_| AtomicU64::new(FREE)).collect(),
                })
                .collect(),
            pool,
            checks: AtomicUsize::new(0),
        }
    }

    fn check_owned(&self, d: usize, key: &[u32], values: &[u32], when: &str) {
        let fps = fingerprints(key);
        for (j, &v) in values.iter().enumerate() {
            let owner = self.devices[d].owner[v as usize].load(Ordering::SeqCst);
            assert_eq!(
                owner, fps[j],
                "{when}: value {v} of token {j} on device {d} is not owned by that token any more"
            );
        }
        self.checks.fetch_add(1, Ordering::Relaxed);
    }

    fn release(&self, d: usize, values: &[u32]) {
        for &v in values {
            let prev = self.devices[d].owner[v as usize].swap(FREE, Ordering::SeqCst);
            assert_ne!(prev, FREE, "value {v} on device {d} freed twice");
        }
        self.devices[d]
            .free
            .lock()
            .unwrap()
            .extend_from_slice(values);
    }

    fn alloc(&self, d: usize, n: usize) -> Option<Vec<u32>> {
        for attempt in 0..2 {
            {
                let mut free = self.devices[d].free.lock().unwrap();
                if free.len() >= n {
                    let at = free.len() - n;
                    return Some(free.split_off(at));
                }
            }
            if attempt == 0 {
                let ev = self.cache.evict(DeviceId(d as u32), n).unwrap();
                self.release(d, &ev.values);
            }
        }
        None
    }
}

struct Held {
    lease: Lease,
    d: usize,
    key: Vec<u32>,
    values: Vec<u32>,
}

fn worker(w: &World, seed: u64, ops: usize, prompts: &[Vec<u32>], fanout: u32) {
    let mut rng = StdRng::seed_from_u64(seed);
    let ps = w.cache.page_size();
    let nd = w.devices.len();
    let mut held: Vec<Held> = Vec::new();
    let mut handles = Vec::new();
    let mut places = Vec::new();
    for _ in 0..ops {
        let d = rng.random_range(0..nd);
        let base = &prompts[rng.random_range(0..prompts.len())];
        let cut = rng.random_range(0..=base.len());
        let mut key = base[..cut].to_vec();
        for _ in 0..rng.random_range(0..12) {
            key.push(rng.random_range(1000..1000 + fanout));
        }
        key.truncate(key.len() / ps * ps);
        let k = TokenKey::new(&key);
        match rng.random_range(0..100) {
            0..40 => {
                let m = w.cache.match_and_pin(k, DeviceId(d as u32)).unwrap();
                assert_eq!(m.values.len(), m.len);
                w.check_owned(d, &key, &m.values, "at pin");
                let lease = m.lease.unwrap();
                held.push(Held {
                    lease,
                    d,
                    key: key[..m.len].to_vec(),
                    values: m.values,
                });
            }
            40..48 => {
                let m = w.cache.match_prefix(k, DeviceId(d as u32)).unwrap();
                handles.push(m.handle);
                if handles.len() > 8 {
                    handles.remove(0);
                }
            }
            48..52 => {
                if let Some(h) = handles.pop() {
                    if let Ok(lease) = w.cache.pin(&h) {
                        drop(lease);
                    }
                }
            }
            52..85 => {
                if let Some(values) = w.alloc(d, key.len()) {
                    let fps = fingerprints(&key);
                    for (j, &v) in values.iter().enumerate() {
                        let prev = w.devices[d].owner[v as usize].swap(fps[j], Ordering::SeqCst);
                        assert_eq!(prev, FREE, "allocated value {v} was still owned");
                    }
                    let (r, place) = w
                        .cache
                        .insert_placed(k, DeviceId(d as u32), &values, 0)
                        .unwrap();
                    places.extend(place.map(|p| (p, key.clone())));
                    if places.len() > 8 {
                        places.remove(0);
                    }
                    for dup in r.duplicates() {
                        w.release(d, &values[dup]);
                    }
                }
            }
            85..94 => {
                let ev = w
                    .cache
                    .evict(DeviceId(d as u32), rng.random_range(1..64))
                    .unwrap();
                w.release(d, &ev.values);
            }
            94..97 => {
                // A block and what continues it, taken out of one tier
                // (a router's index applying a removal).
                let ev = match places.pop() {
                    // From a place, climbing while others split and evict
                    // around it (a place gone takes nothing).
                    Some((p, key)) if rng.random_bool(0.5) => {
                        let end = rng.random_range(1..=p.len() / ps) * ps;
                        let page = &key[end - ps..end];
                        let e = w
                            .cache
                            .evict_from_place(&p, end, page, DeviceId(d as u32))
                            .unwrap()
                            .unwrap_or_default();
                        places.extend(e.above.map(|a| (a, key[..end - ps].to_vec())));
                        e.evicted
                    }
                    _ => w.cache.evict_from(k, DeviceId(d as u32)).unwrap(),
                };
                w.release(d, &ev.values);
            }
            _ => {
                let lens = w.cache.peek(k);
                assert!(lens.iter().all(|&l| l <= key.len() && l % ps == 0));
            }
        }
        // Release leases in random order, re-checking their values.
        while held.len() > 4 || (!held.is_empty() && rng.random_bool(0.3)) {
            let h = held.swap_remove(rng.random_range(0..held.len()));
            w.check_owned(h.d, &h.key, &h.values, "at release");
            drop(h.lease);
        }
    }
    for h in held {
        w.check_owned(h.d, &h.key, &h.values, "at release");
    }
}

/// `fanout`: distinct tokens after a prompt; large values make wide nodes
/// (chunked children arrays).
fn run(devices: usize, page_size: usize, threads: usize, ops: usize, seed: u64, fanout: u32) {
    let w = Arc::new(World::new(devices, page_size, 3_000));
    let mut rng = StdRng::seed_from_u64(seed);
    let prompts: Vec<Vec<u32>> = (0..12)
        .map(|_| {
            let len = rng.random_range(4..48);
            (0..len).map(|_| rng.random_range(1..40)).collect()
        })
        .collect();
    let prompts = Arc::new(prompts);
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let w = Arc::clone(&w);
            let prompts = Arc::clone(&prompts);
            std::thread::spawn(move || worker(&w, seed * 100 + t as u64, ops, &prompts, fanout))
        })
        .collect();
    for h in handles {
        h.join().expect("worker panicked");
    }
    w.cache.audit();
    // Every value is either free or in the tree, exactly once.
    for d in 0..devices {
        let all = w.cache.evict(DeviceId(d as u32), usize::MAX).unwrap();
        let free = w.devices[d].free.lock().unwrap();
        let mut seen = HashSet::new();
        for &v in free.iter().chain(&all.values) {
            assert!(seen.insert(v), "value {v} of device {d} has two owners");
        }
        assert_eq!(seen.len(), w.pool, "device {d}: values lost");
    }
    assert_eq!(w.cache.node_count(), 0);
    w.cache.audit();
    eprintln!(
        "stress: {devices} devices, page size {page_size}, {threads} threads x {ops} ops, {} ownership checks passed",
        w.checks.load(Ordering::Relaxed)
    );
}

fn ops() -> usize {
    std::env::var("RADIXKV_STRESS_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(25_000)
}

#[test]
fn stress_three_devices_page_size_one() {
    run(3, 1, 4, ops(), 7, 4);
}

#[test]
fn stress_four_devices_page_size_four() {
    run(4, 4, 4, ops() / 2, 11, 4);
}

#[test]
fn stress_two_devices_high_contention() {
    run(2, 2, 6, ops() / 2, 13, 4);
}

#[test]
fn stress_wide_nodes() {
    run(2, 1, 4, ops() / 2, 17, 400);
}
