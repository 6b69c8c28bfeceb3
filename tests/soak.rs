//! Soak parity: writers, readers, a pinner and an evictor on 3 devices for a
//! bounded time. At quiescent points (every thread parked at a barrier) the
//! invariants are audited and every resident (key, device) is checked
//! against the record of the inserts and evictions that succeeded. Values
//! are unique per insert and never reused, so a stale or foreign value in a
//! match is caught.
//!
//! `RADIXKV_SOAK_SECS` sets the duration (default 10).

use radixkv::{DeviceId, Lease, RadixCache, TokenKey};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

const DEVICES: usize = 3;
const WORKERS: usize = 6;

#[path = "common/fingerprint.rs"]
mod fingerprint;
use fingerprint::fingerprints;

struct Soak {
    cache: RadixCache,
    /// Per device: value -> fingerprint of the token path that owns it.
    record: Vec<Mutex<HashMap<u32, u64>>>,
    keys: Mutex<HashSet<Vec<u32>>>,
    next_value: AtomicU32,
    pause: AtomicBool,
    stop: AtomicBool,
    ops: AtomicU64,
}

impl Soak {
    fn key(&self, rng: &mut StdRng, prompts: &[Vec<u32>]) -> Vec<u32> {
        let base = &prompts[rng.random_range(0..prompts.len())];
        let mut k = base[..rng.random_range(0..=base.len())].to_vec();
        for _ in 0..rng.random_range(0..10) {
            k.push(rng.random_range(500..504));
        }
        k.truncate(k.len() / 2 * 2);
        k
    }

    fn insert(&self, rng: &mut StdRng, prompts: &[Vec<u32>]) {
        let key = self.key(rng, prompts);
        let d = rng.random_range(0..DEVICES);
        let n = key.len() as u32;
        let first = self.next_value.fetch_add(n, Ordering::Relaxed);
        let values: Vec<u32> = (first..first + n).collect();
        let fps = fingerprints(&key);
        // Registered before the insert, so an eviction racing with it finds them.
        {
            let mut rec = self.record[d].lock().unwrap();
            for (j, &v) in values.iter().enumerate() {
                rec.insert(v, fps[j]);
            }
        }
        let r = self
            .cache
            .insert(TokenKey::new(&key), DeviceId(d as u32), &values, 0)
            .unwrap();
        let mut rec = self.record[d].lock().unwrap();
        for dup in r.duplicates() {
            for v in &values[dup] {
                rec.remove(v);
            }
        }
        drop(rec);
        self.keys.lock().unwrap().insert(key);
    }

    fn read(&self, rng: &mut StdRng, prompts: &[Vec<u32>]) -> Option<Lease> {
        let key = self.key(rng, prompts);
        let d = rng.random_range(0..DEVICES);
        let m = self
            .cache
            .match_and_pin(TokenKey::new(&key), DeviceId(d as u32))
            .unwrap();
        assert_eq!(m.values.len(), m.len);
        let distinct: HashSet<_> = m.values.iter().collect();
        assert_eq!(distinct.len(), m.len, "a match returned a value twice");
        m.lease
    }

    fn evict(&self, rng: &mut StdRng) {
        let d = rng.random_range(0..DEVICES);
        let ev = self
            .cache
            .evict(DeviceId(d as u32), rng.random_range(1..40))
            .unwrap();
        let mut rec = self.record[d].lock().unwrap();
        for v in ev.values {
            assert!(
                rec.remove(&v).is_some(),
                "evicted value {v} on device {d} was never adopted"
            );
        }
    }

    /// Runs with every worker parked.
    fn check(&self) -> usize {
        self.cache.audit();
        let mut checks = 0;
        for d in 0..DEVICES {
            let total = self.cache.sizes(DeviceId(d as u32)).unwrap().total;
            let rec = self.record[d].lock().unwrap();
            assert_eq!(
                total,
                rec.len(),
                "device {d}: resident tokens differ from the record"
            );
        }
        let keys: Vec<Vec<u32>> = self.keys.lock().unwrap().iter().cloned().collect();
        for key in keys {
            let fps = fingerprints(&key);
            let lens = self.cache.peek(TokenKey::new(&key));
            for (d, &peeked) in lens.iter().enumerate() {
                let m = self
                    .cache
                    .match_and_pin(TokenKey::new(&key), DeviceId(d as u32))
                    .unwrap();
                assert_eq!(m.len, peeked, "peek and match disagree on device {d}");
                let rec = self.record[d].lock().unwrap();
                for (j, v) in m.values.iter().enumerate() {
                    assert_eq!(
                        rec.get(v),
                        Some(&fps[j]),
                        "device {d}: token {j} of {key:?} holds value {v}, which belongs elsewhere"
                    );
                }
                checks += 1;
            }
        }
        checks
    }
}

#[test]
fn soak_parity() {
    let secs: u64 = std::env::var("RADIXKV_SOAK_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let mut rng = StdRng::seed_from_u64(42);
    let prompts: Vec<Vec<u32>> = (0..16)
        .map(|_| {
            (0..rng.random_range(2..40))
                .map(|_| rng.random_range(1..30))
                .collect()
        })
        .collect();
    let prompts = Arc::new(prompts);
    let soak = Arc::new(Soak {
        cache: RadixCache::builder()
            .devices(DEVICES)
            .page_size(2)
            .build()
            .unwrap(),
        record: (0..DEVICES).map(|_| Mutex::new(HashMap::new())).collect(),
        keys: Mutex::new(HashSet::new()),
        next_value: AtomicU32::new(1),
        pause: AtomicBool::new(false),
        stop: AtomicBool::new(false),
        ops: AtomicU64::new(0),
    });
    // Parked: workers + coordinator; resumed: the same.
    let parked = Arc::new(Barrier::new(WORKERS + 1));
    let resumed = Arc::new(Barrier::new(WORKERS + 1));
    let workers: Vec<_> = (0..WORKERS)
        .map(|w| {
            let (soak, prompts) = (Arc::clone(&soak), Arc::clone(&prompts));
            let (parked, resumed) = (Arc::clone(&parked), Arc::clone(&resumed));
            std::thread::spawn(move || {
                let mut rng = StdRng::seed_from_u64(1000 + w as u64);
                let mut held: Vec<Lease> = Vec::new();
                loop {
                    if soak.pause.load(Ordering::SeqCst) {
                        parked.wait();
                        resumed.wait();
                        if soak.stop.load(Ordering::SeqCst) {
                            return;
                        }
                    }
                    match w {
                        // Writers.
                        0 | 1 => soak.insert(&mut rng, &prompts),
                        // Readers (pin and release at once).
                        2 | 3 => drop(soak.read(&mut rng, &prompts)),
                        // The pinner holds leases across quiescent points.
                        4 => {
                            if let Some(l) = soak.read(&mut rng, &prompts) {
                                held.push(l);
                            }
                            if held.len() > 16 {
                                held.swap_remove(rng.random_range(0..held.len()));
                            }
                        }
                        // The evictor.
                        _ => soak.evict(&mut rng),
                    }
                    soak.ops.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    let start = Instant::now();
    let (mut rounds, mut checks) = (0, 0);
    loop {
        std::thread::sleep(Duration::from_millis(250));
        let done = start.elapsed() >= Duration::from_secs(secs);
        soak.pause.store(true, Ordering::SeqCst);
        parked.wait();
        checks += soak.check();
        rounds += 1;
        soak.pause.store(false, Ordering::SeqCst);
        soak.stop.store(done, Ordering::SeqCst);
        resumed.wait();
        if done {
            break;
        }
    }
    for w in workers {
        w.join().unwrap();
    }
    soak.cache.audit();
    let ops = soak.ops.load(Ordering::Relaxed);
    eprintln!("soak: {secs} s, {ops} ops, {rounds} quiescent points, {checks} (key, device) checks passed");
    assert!(ops > 1000 && rounds >= 2);
}
