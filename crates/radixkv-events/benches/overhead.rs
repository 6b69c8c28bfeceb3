//! What publishing KV events costs the cache's insert and evict paths:
//! the same operation streams with no listener and with a running
//! [`KvEventPublisher`]'s sink (block ids, event building, queueing; the
//! sockets' tasks run on a tokio thread meanwhile), in one process,
//! alternating rounds, medians. Reported as ratios (events on ÷ off);
//! absolute figures vary with the machine.
//!
//! `cargo bench -p radixkv-events --bench overhead -- [--quick]`
//!
//! Workload (W1 of the latency bench, shuffled arrival): 64 prompts of
//! 1,000 tokens, each with requests adding a unique 200-token suffix
//! (300 per prompt; 40 with `--quick`), page size 16, on 4 devices
//! (requests spread round-robin); then the cache evicts 10 % of each
//! device's tokens.

use radixkv::{DeviceId, RadixCache, TokenKey};
use radixkv_events::{KvEventPublisher, KvEventsConfig};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use std::sync::Arc;
use std::time::{Duration, Instant};

const PAGE: usize = 16;
const DEVICES: usize = 4;

fn workload(per_prompt: usize) -> Vec<Vec<u32>> {
    let mut rng = StdRng::seed_from_u64(1);
    let mut out = Vec::new();
    for _ in 0..64 {
        let prompt: Vec<u32> = (0..1_000).map(|_| rng.random_range(0..128_000)).collect();
        for _ in 0..per_prompt {
            let mut k = prompt.clone();
            k.extend((0..200).map(|_| rng.random_range(0..128_000u32)));
            k.truncate(k.len() / PAGE * PAGE);
            out.push(k);
        }
    }
    out.shuffle(&mut rng);
    out
}

struct Round {
    insert: Duration,
    evict: Duration,
}

fn round(
    keys: &[Vec<u32>],
    listener: Option<Arc<radixkv_events::EventSink>>,
    settle: &dyn Fn(),
) -> Round {
    let mut b = RadixCache::builder().page_size(PAGE).devices(DEVICES);
    if let Some(l) = listener {
        b = b.listener(l);
    }
    let cache = b.build().expect("a valid cache");
    let t = Instant::now();
    for (i, k) in keys.iter().enumerate() {
        let d = DeviceId((i % DEVICES) as u32);
        cache
            .insert(TokenKey::new(k), d, k, 0)
            .expect("an aligned key");
    }
    let insert = t.elapsed();
    // The insert phase's events are sent before the evict phase is timed,
    // so that each phase bears its own publishing only.
    settle();
    let t = Instant::now();
    for d in 0..DEVICES {
        let d = DeviceId(d as u32);
        let resident = cache.resident_tokens(d).expect("a device");
        cache.evict(d, resident / 10).expect("a device");
    }
    let evict = t.elapsed();
    settle();
    Round { insert, evict }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let keys = workload(if quick { 40 } else { 300 });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        l.local_addr().expect("an address").port()
    };
    let mut cfg = KvEventsConfig::new(format!("tcp://127.0.0.1:{}", port.min(65_000)));
    cfg.max_pending = 10_000_000; // nothing dropped: the whole cost measured
    let publisher = rt
        .block_on(KvEventPublisher::start(cfg, DEVICES, PAGE))
        .expect("the publisher binds");
    let rounds = if quick { 3 } else { 7 };
    let (mut ins, mut ev) = (Vec::new(), Vec::new());
    let (mut ins_off, mut ev_off) = (Vec::new(), Vec::new());
    // Warm-up, then alternate off / on.
    let settle = || rt.block_on(publisher.flush());
    let none = || {};
    let _ = round(&keys, None, &none);
    for _ in 0..rounds {
        let off = round(&keys, None, &none);
        let on = round(&keys, Some(publisher.listener()), &settle);
        ins.push(on.insert.as_secs_f64() / off.insert.as_secs_f64());
        ev.push(on.evict.as_secs_f64() / off.evict.as_secs_f64());
        ins_off.push(keys.len() as f64 / off.insert.as_secs_f64());
        ev_off.push(off.evict.as_secs_f64() * 1e3);
    }
    let sent: u64 = publisher.stats().iter().map(|s| s.events).sum();
    println!(
        "KV-event overhead, W1 shuffled, {} inserts of 1,200 tokens on {DEVICES} devices, page {PAGE}, {rounds} rounds",
        keys.len()
    );
    println!(
        "  insert: events on / off time = {:.3} (off: {:.0} inserts/s)",
        median(ins),
        median(ins_off)
    );
    println!(
        "  evict 10 %: events on / off time = {:.3} (off: {:.1} ms)",
        median(ev),
        median(ev_off)
    );
    println!("  events published: {sent}");
    rt.block_on(publisher.shutdown());
}
