//! The engine end to end on the simulated backend: routing, hit rates,
//! chunked prefill, retraction, rejection and stopping.

use radixkv_engine::router::{RouterConfig, RouterKind};
use radixkv_engine::sched::scheduler::Completion;
use radixkv_engine::simulator::{CostModel, SimulatedBackend};
use radixkv_engine::tiers::{CopyPolicy, TierConfig};
use radixkv_engine::{Engine, EngineConfig, EngineError, EngineRequest, RequestError};
use radixkv_tools::replay::{replay, ReplayConfig};
use radixkv_tools::trace::gsp;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

fn fast() -> Arc<SimulatedBackend> {
    Arc::new(SimulatedBackend::new(CostModel::default(), 2000.0))
}

fn collect(e: &Engine, n: usize) -> Vec<Completion> {
    (0..n)
        .map(|_| {
            e.completions()
                .recv_timeout(Duration::from_secs(60))
                .expect("a completion within a minute")
        })
        .collect()
}

fn audit(e: &Engine) {
    for d in 0..e.config().devices {
        let (c, _) = e.cache(d).unwrap();
        c.audit();
    }
}

/// No copies between devices: each device reuses only its own cache.
fn no_copies() -> TierConfig {
    TierConfig {
        copy: CopyPolicy::None,
        ..TierConfig::default()
    }
}

fn replay_cfg(kind: RouterKind, devices: usize) -> ReplayConfig {
    ReplayConfig {
        engine: EngineConfig {
            devices,
            pages_per_device: 4096,
            router: RouterConfig {
                kind,
                ..RouterConfig::default()
            },
            tiers: no_copies(),
            ..EngineConfig::default()
        },
        speedup: 50.0,
        // One request at a time: every request sees the cache as all
        // earlier ones left it, on any machine and under any load.
        max_concurrency: Some(1),
        ..ReplayConfig::default()
    }
}

#[test]
fn cache_aware_routing_reaches_the_infinite_cache_hit_rate_and_private_does_not() {
    let w = gsp(16, 8, 512, 32, 8, 7);
    let stop = AtomicBool::new(false);
    let ca = replay(&w, &replay_cfg(RouterKind::CacheAware, 4), &stop).unwrap();
    let pr = replay(&w, &replay_cfg(RouterKind::Private, 4), &stop).unwrap();
    assert_eq!((ca.finished, pr.finished), (128, 128));
    let inf = ca.infinite_cache_hit_rate;
    // 7 of 8 prompts per group reuse 512 of 544 tokens.
    assert!((inf - 7.0 * 512.0 / (8.0 * 544.0)).abs() < 1e-9);
    // One request at a time, each finds its group's prompt on the device
    // that computed it: exactly the ceiling.
    assert!(
        (ca.hit_rate - inf).abs() < 1e-9,
        "cache-aware {} vs {inf}",
        ca.hit_rate
    );
    // Private round-robin spreads each group over the 4 trees: the first
    // request of a group on each device misses, the later ones hit:
    let mut seen = std::collections::HashSet::new();
    let hits: usize = w
        .requests
        .iter()
        .enumerate()
        .filter(|&(i, _)| !seen.insert((i % 4, w.tokens(i)[..512].to_vec())))
        .count();
    let best_private = hits as f64 * 512.0 / (128.0 * 544.0);
    assert!(
        (pr.hit_rate - best_private).abs() < 1e-9,
        "private {} vs {best_private}",
        pr.hit_rate
    );
    assert!(ca.hit_rate > pr.hit_rate + 0.2);
    // Per device, under the engine's device ids (private trees included).
    for s in [&ca, &pr] {
        assert_eq!(s.hit_rate_per_device.len(), 4);
        assert!(
            s.hit_rate_per_device.iter().all(|&h| h > 0.0),
            "{:?}",
            s.hit_rate_per_device
        );
    }
    assert!(ca.prefill_tokens_computed < pr.prefill_tokens_computed);
}

#[test]
fn a_burst_sharing_a_new_prefix_lands_on_one_device() {
    // All requests arrive at once, before anything is cached: only the
    // router's pending index can keep a group together (without copies
    // between devices; with them the router balances load instead, see
    // tests/tiers.rs).
    let e = Engine::start(
        EngineConfig {
            devices: 4,
            pages_per_device: 2048,
            tiers: no_copies(),
            ..EngineConfig::default()
        },
        fast(),
    )
    .unwrap();
    let w = gsp(4, 6, 256, 16, 4, 3);
    for i in 0..w.requests.len() {
        e.submit(EngineRequest::new(w.tokens(i), 4)).unwrap();
    }
    let done = collect(&e, w.requests.len());
    let mut by_group = std::collections::HashMap::new();
    for i in 0..w.requests.len() {
        by_group
            .entry(w.tokens(i)[..256].to_vec())
            .or_insert_with(Vec::new);
    }
    let device_of: std::collections::HashMap<u64, usize> =
        done.iter().map(|c| (c.id, c.device.index())).collect();
    for i in 0..w.requests.len() {
        by_group
            .get_mut(&w.tokens(i)[..256])
            .unwrap()
            .push(device_of[&(i as u64)]);
    }
    for (_, devs) in by_group {
        assert!(
            devs.iter().all(|&d| d == devs[0]),
            "a group split over {devs:?}"
        );
    }
    audit(&e);
    e.shutdown();
}

#[test]
fn long_prompts_are_prefilled_in_chunks() {
    let mut cfg = EngineConfig {
        devices: 1,
        pages_per_device: 4096,
        ..EngineConfig::default()
    };
    cfg.scheduler.chunked_prefill_size = 4096;
    let e = Engine::start(cfg, fast()).unwrap();
    let prompt: Vec<u32> = (0..20_000).collect();
    e.submit(EngineRequest::new(prompt.clone(), 2)).unwrap();
    let c = collect(&e, 1).remove(0);
    assert_eq!(
        (c.error, c.output_tokens, c.tokens.cached_tokens),
        (None, 2, 0)
    );
    // The same prompt again: everything but the last page is cached.
    e.submit(EngineRequest::new(prompt, 2)).unwrap();
    let c = collect(&e, 1).remove(0);
    assert_eq!(c.tokens.cached_tokens, 19_984);
    audit(&e);
    let report = e.shutdown();
    let s = &report.devices[0].scheduler;
    assert_eq!(
        s.prefill_passes,
        5 + 1,
        "5 chunks of ≤ 4096, then one short prefill"
    );
    assert_eq!(s.prefill_tokens, 20_000 + 16);
}

#[test]
fn running_out_of_pages_mid_decode_retracts_and_everything_still_finishes() {
    let mut cfg = EngineConfig {
        devices: 1,
        pages_per_device: 48, // 752 tokens
        ..EngineConfig::default()
    };
    cfg.scheduler.init_new_token_ratio = 0.05;
    cfg.scheduler.min_new_token_ratio = 0.05;
    let e = Engine::start(cfg, fast()).unwrap();
    for k in 0..8u32 {
        let prompt: Vec<u32> = (0..64).map(|t| k * 1000 + t).collect();
        e.submit(EngineRequest::new(prompt, 300)).unwrap();
    }
    let done = collect(&e, 8);
    assert!(done
        .iter()
        .all(|c| c.error.is_none() && c.output_tokens == 300));
    audit(&e);
    let report = e.shutdown();
    assert!(
        report.devices[0].scheduler.retractions > 0,
        "the pool was too small for all"
    );
    assert!(done.iter().any(|c| c.retractions > 0));
}

#[test]
fn impossible_requests_are_rejected_and_stop_ends_everything() {
    let e = Engine::start(
        EngineConfig {
            devices: 2,
            pages_per_device: 64,
            ..EngineConfig::default()
        },
        Arc::new(SimulatedBackend::new(CostModel::default(), 1.0)),
    )
    .unwrap();
    let huge: Vec<u32> = (0..2000).collect();
    assert!(matches!(
        e.submit(EngineRequest::new(huge, 1)),
        Err(EngineError::Rejected(_))
    ));
    assert!(matches!(
        e.submit(EngineRequest::new(Vec::<u32>::new(), 1)),
        Err(EngineError::Rejected(_))
    ));
    assert!(matches!(
        e.submit(EngineRequest::new(vec![1, 2, 3], 0)),
        Err(EngineError::Rejected(_))
    ));
    // Slow requests (real-time simulator), then stop: all complete, with
    // an error, promptly.
    for k in 0..6u32 {
        e.submit(EngineRequest::new(vec![k; 100], 500)).unwrap();
    }
    std::thread::sleep(Duration::from_millis(100));
    e.stop();
    let done = collect(&e, 6);
    assert!(done.iter().all(|c| c.error == Some(RequestError::Stopped)));
    assert!(matches!(
        e.submit(EngineRequest::new(vec![1, 2], 1)),
        Err(EngineError::Stopped)
    ));
    audit(&e);
}

#[test]
fn the_engine_can_be_shared_between_threads() {
    fn shared<T: Send + Sync>() {}
    shared::<Engine>();
}

#[test]
fn bad_engine_configuration_is_an_error() {
    for cfg in [
        EngineConfig {
            devices: 0,
            ..EngineConfig::default()
        },
        EngineConfig {
            pages_per_device: 1,
            ..EngineConfig::default()
        },
        EngineConfig {
            page_size: 0,
            ..EngineConfig::default()
        },
    ] {
        assert!(Engine::start(cfg, fast()).is_err());
    }
}

#[test]
fn streaming_delivers_every_token_then_done_and_cancel_releases_everything() {
    use radixkv_engine::sched::scheduler::StreamEvent;
    let e = Engine::start(
        EngineConfig {
            devices: 2,
            pages_per_device: 256,
            ..EngineConfig::default()
        },
        fast(),
    )
    .unwrap();
    let (id, rx) = e
        .submit_streaming(EngineRequest::new(vec![5; 40], 6))
        .unwrap();
    let events: Vec<StreamEvent> = rx.iter().collect();
    assert_eq!(events.len(), 7);
    assert!(events[..6]
        .iter()
        .all(|ev| matches!(ev, StreamEvent::Token(_))));
    match &events[6] {
        StreamEvent::Done(c) => assert_eq!((c.id, c.output_tokens, c.error.clone()), (id, 6, None)),
        other => panic!("{other:?}"),
    }
    // A streaming completion does not also go to the shared channel.
    assert!(e.completions().try_recv().is_err());

    // A long request, cancelled while it runs: it ends with "cancelled",
    // and its pages and pins are gone (the audit checks both).
    let slow = Engine::start(
        EngineConfig {
            devices: 1,
            pages_per_device: 256,
            ..EngineConfig::default()
        },
        Arc::new(SimulatedBackend::new(CostModel::default(), 1.0)),
    )
    .unwrap();
    let (id, rx) = slow
        .submit_streaming(EngineRequest::new(vec![9; 100], 2000))
        .unwrap();
    assert!(matches!(
        rx.recv_timeout(Duration::from_secs(60)),
        Ok(StreamEvent::Token(_))
    ));
    slow.cancel(id);
    let done = rx
        .iter()
        .find_map(|ev| match ev {
            StreamEvent::Done(c) => Some(c),
            StreamEvent::Token(_) => None,
        })
        .unwrap();
    assert_eq!(done.error, Some(RequestError::Cancelled));
    slow.audit().unwrap();
    let m = slow.metrics();
    assert_eq!((m[0].failed, m[0].outstanding), (1, 0));
    assert_eq!(
        m[0].pages_used, 6,
        "only the prompt's 6 full pages stay cached"
    );
    let m = e.metrics();
    assert_eq!(m.iter().map(|d| d.finished).sum::<u64>(), 1);
    assert!(m
        .iter()
        .any(|d| d.match_latency.count == 1 && d.insert_latency.count >= 1));
}

/// The simulator, panicking in every pass on device 1.
struct PanicsOnDeviceOne(SimulatedBackend);

impl radixkv_engine::sched::batch::ModelBackend for PanicsOnDeviceOne {
    fn step(
        &self,
        device: radixkv::DeviceId,
        batch: &radixkv_engine::sched::batch::Batch,
    ) -> Result<radixkv_engine::sched::batch::StepOutput, radixkv_engine::sched::batch::BackendError>
    {
        assert_ne!(device.index(), 1, "a bug in the model on device 1");
        self.0.step(device, batch)
    }

    fn describe(&self) -> String {
        format!("{} panicking on device 1", self.0.describe())
    }
}

/// A replay whose scheduler thread dies ends with the engine's failure
/// instead of waiting forever for what that thread held, whether it is
/// draining or held back by its concurrency cap.
#[test]
fn a_replay_ends_with_the_failure_of_a_scheduler_thread() {
    for cap in [None, Some(2)] {
        let mut cfg = replay_cfg(RouterKind::RoundRobin, 2);
        cfg.max_concurrency = cap;
        let backend = Arc::new(PanicsOnDeviceOne(SimulatedBackend::new(
            CostModel::default(),
            50.0,
        )));
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let w = gsp(4, 4, 64, 8, 2, 3);
            let stop = AtomicBool::new(false);
            let _ = tx.send(radixkv_tools::replay::replay_on(&w, &cfg, backend, &stop));
        });
        match rx.recv_timeout(Duration::from_secs(120)) {
            Ok(Err(EngineError::Failed(why))) => {
                assert!(
                    why.contains("device 1") && why.contains("a bug in the model"),
                    "cap {cap:?}: {why}"
                )
            }
            Ok(other) => panic!("cap {cap:?}: {:?}", other.map(|s| s.finished)),
            Err(_) => panic!("cap {cap:?}: the replay still waits after two minutes"),
        }
    }
}

/// Every request submitted without a stream completes on
/// `Engine::completions()`, those of a scheduler thread that died included:
/// with `RequestError::SchedulerFailed`, not never. Afterwards the engine
/// refuses new requests with the failure.
#[test]
fn a_dead_schedulers_requests_complete_with_its_failure() {
    let cfg = EngineConfig {
        devices: 2,
        pages_per_device: 256,
        router: RouterConfig {
            kind: RouterKind::RoundRobin,
            ..RouterConfig::default()
        },
        ..EngineConfig::default()
    };
    let backend = Arc::new(PanicsOnDeviceOne(SimulatedBackend::new(
        CostModel::default(),
        1000.0,
    )));
    let engine = Engine::start(cfg, backend).unwrap();
    let mut ids = std::collections::HashSet::new();
    for i in 0..8u32 {
        match engine.submit(EngineRequest::new(vec![i + 1, 2, 3, 4], 4)) {
            Ok(id) => {
                ids.insert(id);
            }
            // Submitted after device 1's thread died: refused at once.
            Err(EngineError::Failed(why)) => assert!(why.contains("device 1"), "{why}"),
            Err(e) => panic!("{e}"),
        }
    }
    let (mut ok, mut failed) = (0, 0);
    while !ids.is_empty() {
        let c = engine
            .completions()
            .recv_timeout(Duration::from_secs(60))
            .expect("a request of the dead scheduler never completed");
        assert!(ids.remove(&c.id), "completion {} twice or unknown", c.id);
        match &c.error {
            None => ok += 1,
            Some(RequestError::SchedulerFailed(why)) => {
                assert_eq!(c.device.index(), 1);
                assert!(why.contains("a bug in the model"), "{why}");
                failed += 1;
            }
            Some(e) => panic!("{e}"),
        }
    }
    assert!(ok >= 1 && failed >= 1, "{ok} finished, {failed} failed");
    assert!(matches!(
        engine.submit(EngineRequest::new(vec![9], 1)),
        Err(EngineError::Failed(_))
    ));
}

/// `replay_on` refuses a speedup that is not a positive number, as
/// `replay` does, instead of panicking on it.
#[test]
fn replay_on_refuses_a_bad_speedup() {
    for speedup in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        let mut cfg = replay_cfg(RouterKind::RoundRobin, 1);
        cfg.speedup = speedup;
        let r = radixkv_tools::replay::replay_on(
            &gsp(1, 1, 8, 8, 1, 1),
            &cfg,
            fast(),
            &AtomicBool::new(false),
        );
        assert!(
            matches!(r, Err(EngineError::InvalidConfig(_))),
            "{speedup}: {:?}",
            r.map(|s| s.finished)
        );
    }
}
