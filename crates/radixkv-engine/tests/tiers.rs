//! Tiers in the engine (issue 16): peer copies, host loads, write policies,
//! waiting for a prefix another device computes, the copy-or-recompute
//! decision both ways, and bad tier settings. Requests are submitted one
//! after the other (each completes before the next is sent), so every
//! assertion holds whatever the threads' interleaving.

use radixkv::{DeviceId, RadixCache, TokenKey};
use radixkv_engine::router::{PendingIndex, RouterConfig, RouterKind};
use radixkv_engine::sched::policy::{PolicyConfig, SchedulePolicy};
use radixkv_engine::sched::scheduler::{
    Completion, Inbox, Job, Scheduler, SchedulerConfig, SchedulerEvents,
};
use radixkv_engine::simulator::{CostModel, SimulatedBackend};
use radixkv_engine::tiers::{CopyPolicy, CopySource, Link, ModelShape, TierConfig, WritePolicy};
use radixkv_engine::{Engine, EngineConfig, EngineError, EngineRequest};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

fn backend() -> Arc<SimulatedBackend> {
    Arc::new(SimulatedBackend::new(CostModel::default(), 2000.0))
}

fn engine(devices: usize, pages: usize, router: RouterKind, tiers: TierConfig) -> Engine {
    Engine::start(
        EngineConfig {
            devices,
            page_size: 16,
            pages_per_device: pages,
            router: RouterConfig {
                kind: router,
                ..RouterConfig::default()
            },
            tiers,
            ..EngineConfig::default()
        },
        backend(),
    )
    .unwrap()
}

/// Submits `tokens` and waits for its completion.
fn run(e: &Engine, tokens: Vec<u32>) -> Completion {
    e.submit(EngineRequest::new(tokens, 4)).unwrap();
    let c = e
        .completions()
        .recv_timeout(Duration::from_secs(60))
        .expect("a completion within a minute");
    assert!(c.error.is_none(), "{:?}", c.error);
    c
}

fn prompt(system: u32, question: u32) -> Vec<u32> {
    let mut p: Vec<u32> = (0..512).map(|i| system * 10_000 + i).collect();
    p.extend((0..32).map(|i| 1_000_000 + question * 100 + i));
    p
}

fn audit(e: &Engine) {
    e.audit().unwrap();
}

#[test]
fn round_robin_copies_a_prefix_another_device_computed() {
    let e = engine(2, 1024, RouterKind::RoundRobin, TierConfig::default());
    let a = run(&e, prompt(1, 1));
    assert_eq!(
        (a.device.index(), a.tokens.copied.peer_copied_tokens),
        (0, 0)
    );
    let b = run(&e, prompt(1, 2));
    assert_eq!(b.device.index(), 1);
    assert_eq!(
        (b.tokens.cached_tokens, b.tokens.copied.peer_copied_tokens),
        (0, 512),
        "copied, not recomputed"
    );
    assert_eq!(
        b.tokens.copied.bytes,
        512 * ModelShape::LLAMA3_8B.bytes_per_token()
    );
    assert!(b.tokens.copied.time > Duration::ZERO);
    // Now device 1 holds it too: its next request hits locally.
    let _ = run(&e, prompt(2, 1)); // device 0
    let d = run(&e, prompt(1, 3)); // device 1
    assert_eq!(
        (d.tokens.cached_tokens, d.tokens.copied.peer_copied_tokens),
        (512, 0)
    );
    audit(&e);
    let m = e.metrics();
    assert_eq!(m[1].tokens.copied.peer_copied_tokens, 512);
    assert_eq!(
        m.iter().map(|d| d.tokens.prompt_tokens).sum::<u64>(),
        m.iter()
            .map(|d| d.tokens.cached_tokens
                + d.tokens.copied.host_loaded_tokens
                + d.tokens.copied.peer_copied_tokens
                + d.tokens.recomputed_tokens())
            .sum::<u64>()
    );
    e.shutdown();
}

#[test]
fn without_copies_the_other_device_recomputes() {
    let tiers = TierConfig {
        copy: CopyPolicy::None,
        ..TierConfig::default()
    };
    let e = engine(2, 1024, RouterKind::RoundRobin, tiers);
    let _ = run(&e, prompt(1, 1));
    let b = run(&e, prompt(1, 2));
    assert_eq!(
        (
            b.tokens.cached_tokens,
            b.tokens.copied.peer_copied_tokens,
            b.tokens.copied.host_loaded_tokens
        ),
        (0, 0, 0)
    );
    e.shutdown();
}

#[test]
fn write_back_keeps_an_evicted_prefix_loadable_from_the_host() {
    // One device whose pool holds two requests: the third evicts the first
    // prompt, which write-back sends to the host first.
    let tiers = TierConfig {
        host_pages: Some(1024),
        write: WritePolicy::WriteBack,
        ..TierConfig::default()
    };
    let e = engine(1, 80, RouterKind::RoundRobin, tiers);
    let _ = run(&e, prompt(1, 1));
    let _ = run(&e, prompt(2, 1));
    let _ = run(&e, prompt(3, 1));
    let _ = run(&e, prompt(4, 1));
    let back = run(&e, prompt(1, 2));
    assert!(
        back.tokens.copied.host_loaded_tokens >= 512 - back.tokens.cached_tokens
            && back.tokens.copied.host_loaded_tokens > 0,
        "{back:?}"
    );
    audit(&e);
    let report = e.shutdown();
    assert!(report.devices[0].scheduler.host_written_tokens >= 512);
}

#[test]
fn write_through_serves_another_device_from_the_host() {
    let tiers = TierConfig {
        host_pages: Some(1024),
        copy: CopyPolicy::Host,
        write: WritePolicy::WriteThrough,
        ..TierConfig::default()
    };
    let e = engine(2, 1024, RouterKind::RoundRobin, tiers);
    let _ = run(&e, prompt(1, 1)); // device 0, written through to the host
    let b = run(&e, prompt(1, 2)); // device 1: host only (no peer copies)
    assert_eq!(
        (
            b.device.index(),
            b.tokens.copied.host_loaded_tokens,
            b.tokens.copied.peer_copied_tokens
        ),
        (1, 512, 0)
    );
    audit(&e);
    let report = e.shutdown();
    assert!(report.devices[0].scheduler.host_written_tokens >= 512);
}

#[test]
fn write_through_selective_waits_for_the_second_hit() {
    let tiers = TierConfig {
        host_pages: Some(1024),
        copy: CopyPolicy::Host,
        write: WritePolicy::WriteThroughSelective,
        ..TierConfig::default()
    };
    // fcfs: the lpm queue policy's own matches would count as hits too.
    let engine = |tiers: TierConfig| {
        let mut cfg = EngineConfig {
            devices: 1,
            page_size: 16,
            pages_per_device: 1024,
            tiers,
            ..EngineConfig::default()
        };
        cfg.scheduler.policy.policy = "fcfs".parse().unwrap();
        Engine::start(cfg, backend()).unwrap()
    };
    let e = engine(tiers.clone());
    let _ = run(&e, prompt(1, 1));
    let _ = run(&e, prompt(1, 2)); // the first hit of its prefix
    let report = e.shutdown();
    assert_eq!(report.devices[0].scheduler.host_written_tokens, 0);
    let e = engine(tiers);
    for q in 1..=3 {
        let _ = run(&e, prompt(1, q));
    }
    audit(&e);
    let report = e.shutdown();
    assert_eq!(
        report.devices[0].scheduler.host_written_tokens, 512,
        "hit twice: written"
    );
}

#[test]
fn the_copy_or_recompute_decision_goes_both_ways() {
    let fast = TierConfig::default();
    // 512 tokens of Llama-3-8B over NVLink: 0.15 ms, against the default
    // cost model's 512 · 50 µs of prefill: copy.
    let compute = CostModel::default().prefill_cost(512, 0);
    assert!(fast.worth_copying(CopySource::Host, 512, Some(compute)));
    // A slow link and a huge model: copying loses, recompute.
    let slow = TierConfig {
        shape: ModelShape::LLAMA3_70B,
        host_link: Link {
            gb_per_s: 0.5,
            latency: Duration::from_millis(1),
        },
        ..TierConfig::default()
    };
    assert!(!slow.worth_copying(CopySource::Host, 512, Some(compute)));
    // Below the load-back threshold: recompute whatever the link.
    assert!(!fast.worth_copying(CopySource::Host, 8, Some(Duration::from_secs(1))));
    // And the engine follows it: with the slow link nothing is loaded.
    let tiers = TierConfig {
        host_pages: Some(1024),
        copy: CopyPolicy::Host,
        write: WritePolicy::WriteThrough,
        ..slow
    };
    let e = engine(2, 1024, RouterKind::RoundRobin, tiers);
    let _ = run(&e, prompt(1, 1));
    let b = run(&e, prompt(1, 2));
    assert_eq!(
        (b.device.index(), b.tokens.copied.host_loaded_tokens),
        (1, 0),
        "recomputed"
    );
    e.shutdown();
}

#[test]
fn bad_tier_settings_are_clear_errors() {
    let bad = [
        TierConfig {
            host_pages: Some(1),
            ..TierConfig::default()
        },
        TierConfig {
            copy: CopyPolicy::Host,
            ..TierConfig::default()
        },
        TierConfig {
            peer_link: Link {
                gb_per_s: 0.0,
                latency: Duration::ZERO,
            },
            ..TierConfig::default()
        },
        TierConfig {
            shape: ModelShape {
                layers: 0,
                ..ModelShape::LLAMA3_8B
            },
            ..TierConfig::default()
        },
    ];
    for tiers in bad {
        let r = Engine::start(
            EngineConfig {
                devices: 2,
                pages_per_device: 64,
                tiers: tiers.clone(),
                ..EngineConfig::default()
            },
            backend(),
        );
        assert!(matches!(r, Err(EngineError::InvalidConfig(_))), "{tiers:?}");
    }
    assert!("nvlink".parse::<CopyPolicy>().is_err());
    assert!("sometimes".parse::<WritePolicy>().is_err());
    assert_eq!(
        "write_through_selective".parse::<WritePolicy>().unwrap(),
        WritePolicy::WriteThroughSelective
    );
}

/// The scheduler's events for one device, with the registry of prompts it
/// is computing (as the engine keeps it when peer copies are on), or
/// without it (`tracked: false`: the scheduler cannot tell).
struct OneDevice {
    computing: PendingIndex,
    tracked: bool,
}

impl SchedulerEvents for OneDevice {
    fn prompt_settled(&self, _: &Job, _: DeviceId) {}
    fn completed(&self, _: &Job, _: Completion) {}
    fn computing(&self, key: TokenKey<'_>, device: DeviceId) {
        self.computing
            .add(key.tokens(), key.namespace(), device.index());
    }
    fn computed(&self, key: TokenKey<'_>, device: DeviceId) {
        self.computing
            .remove(key.tokens(), key.namespace(), device.index());
    }
    fn computing_now(&self, key: TokenKey<'_>) -> Vec<usize> {
        if !self.tracked {
            return Vec::new();
        }
        self.computing.longest(key.tokens(), key.namespace())
    }
}

/// Two requests sharing a 512-token prefix reach one device's queue
/// together (both are in its inbox before it runs: one thread, no
/// interleaving). The first pass admits the first; the second waits for
/// that pass and then hits the prefix instead of computing it in the same
/// pass a second time (on GSP's all-at-once arrival this was most of the
/// prompt tokens computed beyond the distinct ones). Without the registry
/// it is computed twice.
#[test]
fn a_prefix_computed_in_this_pass_is_waited_for_not_computed_twice() {
    let prefill_tokens = |tracked: bool| {
        let cache = Arc::new(
            RadixCache::builder()
                .devices(1)
                .page_size(16)
                .pages_per_device(1024)
                .build()
                .unwrap(),
        );
        let events = Arc::new(OneDevice {
            computing: PendingIndex::new(1, 16),
            tracked,
        });
        // First come, first served: `lpm`'s own in-batch rule would defer
        // the second request anyway (but it falls back to this order when
        // more than 128 requests wait, as they do on GSP).
        let cfg = SchedulerConfig {
            policy: PolicyConfig::new(SchedulePolicy::Fcfs),
            ..SchedulerConfig::default()
        };
        let sched = Scheduler::new(cfg, cache, DeviceId(0), backend(), events)
            .with_tiers(TierConfig::default());
        let (tx, rx) = std::sync::mpsc::channel();
        for (id, q) in [(0u64, 1u32), (1, 2)] {
            let tokens: Arc<[u32]> = prompt(7, q).into();
            tx.send(Inbox::Job(Job {
                id,
                tokens,
                namespace: None,
                priority: 0,
                output_len: 2,
                output_tokens: None,
                sampling: Default::default(),
                arrival: std::time::Instant::now(),
                stream: None,
            }))
            .unwrap();
        }
        drop(tx);
        // On a thread of its own, so that a hang fails the test.
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let stats = sched.run(rx, &AtomicBool::new(false));
            let _ = done_tx.send((stats.prefill_tokens, stats.waits_for_self));
        });
        done_rx
            .recv_timeout(Duration::from_secs(60))
            .expect("the scheduler finishes both requests within a minute")
    };
    // 544 + 32 (the second hits 512 of its 544) against 2 · 544.
    assert_eq!(prefill_tokens(true), (544 + 32, 1));
    assert_eq!(prefill_tokens(false), (2 * 544, 0));
}
