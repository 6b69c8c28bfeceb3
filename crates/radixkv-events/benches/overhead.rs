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
//! device's tokens, four times in a row.
//!
//! Each phase is measured twice: wall time, and the CPU time of the thread
//! that inserts or evicts (what the cache's caller pays; wall time also
//! counts the times the scheduler ran the sockets' task on the caller's
//! core, which a 2-core machine does now and then). The task's own CPU
//! time per event is reported too: it runs on another core. Both kinds of
//! round pause the same way before each phase, and pairs of rounds run
//! off-on, then on-off. `--rounds N` (default 16; 4 with `--quick`),
//! `--verbose` prints every round.

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

/// Wall and caller-thread CPU time of one phase.
#[derive(Clone, Copy)]
struct Phase {
    wall: Duration,
    cpu: Duration,
}

struct Round {
    insert: Phase,
    evict: Phase,
    /// The process's CPU time over the round beyond the calling thread's:
    /// the sockets' task (and the runtime), all phases and pauses.
    others_cpu: Duration,
}

/// The CPU time of the calling thread, or of the whole process.
fn cpu_time(clock: libc::clockid_t) -> Duration {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid, writable timespec for the call's duration;
    // both clocks exist on Linux, and a failure leaves `t` zero.
    unsafe { libc::clock_gettime(clock, &mut t) };
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

fn thread_cpu() -> Duration {
    cpu_time(libc::CLOCK_THREAD_CPUTIME_ID)
}

fn process_cpu() -> Duration {
    cpu_time(libc::CLOCK_PROCESS_CPUTIME_ID)
}

fn timed(f: impl FnOnce()) -> Phase {
    let (t, c) = (Instant::now(), thread_cpu());
    f();
    Phase {
        wall: t.elapsed(),
        cpu: thread_cpu() - c,
    }
}

fn round(
    (keys, values): (&[Vec<u32>], &[Vec<u32>]),
    listener: Option<Arc<radixkv_events::EventSink>>,
    settle: &dyn Fn(),
) -> Round {
    let (p0, t0) = (process_cpu(), thread_cpu());
    let mut b = RadixCache::builder().page_size(PAGE).devices(DEVICES);
    if let Some(l) = listener {
        b = b.listener(l);
    }
    let cache = b.build().expect("a valid cache");
    settle();
    let insert = timed(|| {
        for (i, (k, v)) in keys.iter().zip(values).enumerate() {
            let d = DeviceId((i % DEVICES) as u32);
            cache
                .insert(TokenKey::new(k), d, v, 0)
                .expect("an aligned key");
        }
    });
    // The insert phase's events are sent before the evict phase is timed,
    // so that each phase bears its own publishing only; both kinds of round
    // pause the same way before each phase (a phase that starts on a core
    // that just idled runs slower at first, whichever kind it is).
    settle();
    // Four times in a row, 10 % of what each device then holds (a third of
    // the tree in all): one 10 % eviction takes a few milliseconds, too
    // short for a ratio to stand out of this machine's noise.
    let evict = timed(|| {
        for _ in 0..4 {
            for d in 0..DEVICES {
                let d = DeviceId(d as u32);
                let resident = cache.resident_tokens(d).expect("a device");
                cache.evict(d, resident / 10).expect("a device");
            }
        }
    });
    settle();
    let others_cpu = (process_cpu() - p0).saturating_sub(thread_cpu() - t0);
    Round {
        insert,
        evict,
        others_cpu,
    }
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
    let args: Vec<String> = std::env::args().collect();
    let verbose = args.iter().any(|a| a == "--verbose");
    let rounds = args
        .iter()
        .position(|a| a == "--rounds")
        .and_then(|i| args.get(i + 1))
        .and_then(|r| r.parse().ok())
        .unwrap_or(if quick { 4 } else { 16 });
    // Each request's slots as a paged allocator hands them out (one run of
    // whole pages), built once.
    let mut next = 0u32;
    let values: Vec<Vec<u32>> = keys
        .iter()
        .map(|k| {
            let base = next;
            next += k.len() as u32;
            (base..next).collect()
        })
        .collect();
    let kv = (&keys[..], &values[..]);
    let pause = || std::thread::sleep(Duration::from_millis(10));
    let settle = || {
        pause();
        rt.block_on(publisher.flush());
    };
    let ratio = |on: Duration, off: Duration| on.as_secs_f64() / off.as_secs_f64();
    // [insert wall, insert cpu, evict wall, evict cpu] ratios; the off
    // figures for scale; the task's CPU per event.
    let mut r: [Vec<f64>; 4] = Default::default();
    let (mut ins_off, mut ev_off, mut task_us) = (Vec::new(), Vec::new(), Vec::new());
    let _ = round(kv, None, &pause); // warm-up
    for i in 0..rounds {
        let sent = publisher.stats().iter().map(|s| s.events).sum::<u64>();
        // Off then on, then on then off (ABBA): whatever the second round of
        // a pair gains or loses from the first cancels out over pairs.
        let (off, on) = if i % 2 == 1 {
            let on = round(kv, Some(publisher.listener()), &settle);
            (round(kv, None, &pause), on)
        } else {
            let off = round(kv, None, &pause);
            (off, round(kv, Some(publisher.listener()), &settle))
        };
        let events = publisher.stats().iter().map(|s| s.events).sum::<u64>() - sent;
        r[0].push(ratio(on.insert.wall, off.insert.wall));
        r[1].push(ratio(on.insert.cpu, off.insert.cpu));
        r[2].push(ratio(on.evict.wall, off.evict.wall));
        r[3].push(ratio(on.evict.cpu, off.evict.cpu));
        ins_off.push(keys.len() as f64 / off.insert.wall.as_secs_f64());
        ev_off.push(off.evict.wall.as_secs_f64() * 1e3);
        let task = on.others_cpu.saturating_sub(off.others_cpu);
        task_us.push(task.as_secs_f64() * 1e6 / events.max(1) as f64);
        if verbose {
            eprintln!(
                "round: insert {:.3} (cpu {:.3}), evict {:.3} (cpu {:.3}; {:.2} against {:.2} ms)",
                r[0].last().unwrap(),
                r[1].last().unwrap(),
                r[2].last().unwrap(),
                r[3].last().unwrap(),
                on.evict.wall.as_secs_f64() * 1e3,
                off.evict.wall.as_secs_f64() * 1e3
            );
        }
    }
    let [iw, ic, ew, ec] = r.map(median);
    let sent: u64 = publisher.stats().iter().map(|s| s.events).sum();
    println!(
        "KV-event overhead, W1 shuffled, {} inserts of 1,200 tokens on {DEVICES} devices, page {PAGE}, {rounds} rounds (medians)",
        keys.len()
    );
    println!(
        "  insert: events on / off time = {iw:.3}, caller's CPU {ic:.3} (off: {:.0} inserts/s)",
        median(ins_off)
    );
    println!(
        "  evict 4 × 10 %: events on / off time = {ew:.3}, caller's CPU {ec:.3} (off: {:.1} ms)",
        median(ev_off)
    );
    println!(
        "  the sockets' task: {:.2} µs of CPU per event, on another core",
        median(task_us)
    );
    println!("  events published: {sent}");
    rt.block_on(publisher.shutdown());
}
