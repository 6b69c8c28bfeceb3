//! Why a request ends without finishing, as a typed
//! [`RequestError`]: a model backend's failure, a cancel, a stop. Each
//! request is awaited before the next step, so every assertion holds
//! whatever the threads' interleaving.

use radixkv::DeviceId;
use radixkv_engine::sched::batch::{BackendError, Batch, ModelBackend, StepOutput};
use radixkv_engine::simulator::{CostModel, SimulatedBackend};
use radixkv_engine::{Completion, Engine, EngineConfig, EngineRequest, RequestError};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The simulator, failing every pass once `broken` is set.
struct Breakable {
    inner: SimulatedBackend,
    broken: AtomicBool,
}

impl ModelBackend for Breakable {
    fn step(&self, device: DeviceId, batch: &Batch) -> Result<StepOutput, BackendError> {
        // SeqCst: set by the test thread before it submits; read here.
        if self.broken.load(Ordering::SeqCst) {
            return Err(BackendError {
                device,
                reason: "the device fell off the bus".into(),
            });
        }
        self.inner.step(device, batch)
    }

    fn describe(&self) -> String {
        format!("breakable {}", self.inner.describe())
    }
}

fn engine() -> (Engine, Arc<Breakable>) {
    let backend = Arc::new(Breakable {
        inner: SimulatedBackend::new(CostModel::default(), 2000.0),
        broken: AtomicBool::new(false),
    });
    let e = Engine::start(
        EngineConfig {
            devices: 1,
            page_size: 4,
            pages_per_device: 256,
            ..EngineConfig::default()
        },
        Arc::clone(&backend) as Arc<dyn ModelBackend>,
    )
    .unwrap();
    (e, backend)
}

fn next(e: &Engine) -> Completion {
    e.completions()
        .recv_timeout(Duration::from_secs(60))
        .expect("a completion within a minute")
}

#[test]
fn a_backend_failure_is_typed_and_the_engine_stays_sound() {
    let (e, backend) = engine();
    e.submit(EngineRequest::new((0..64).collect::<Vec<u32>>(), 4))
        .unwrap();
    let ok = next(&e);
    assert_eq!(ok.error, None);

    backend.broken.store(true, Ordering::SeqCst);
    e.submit(EngineRequest::new((100..164).collect::<Vec<u32>>(), 4))
        .unwrap();
    let failed = next(&e);
    let want = RequestError::Backend(BackendError {
        device: DeviceId(0),
        reason: "the device fell off the bus".into(),
    });
    assert_eq!(failed.error, Some(want));
    let err = failed.error.unwrap();
    assert!(!err.is_shutdown_or_cancel());
    assert!(err.to_string().contains("fell off the bus"), "{err}");
    // The failed request's pages and pins are back.
    e.audit().unwrap();

    // A repaired backend serves again, and the first prompt is still cached.
    backend.broken.store(false, Ordering::SeqCst);
    e.submit(EngineRequest::new((0..64).collect::<Vec<u32>>(), 4))
        .unwrap();
    let again = next(&e);
    assert_eq!(again.error, None);
    assert!(again.tokens.cached_tokens > 0, "{again:?}");
    e.audit().unwrap();
    e.shutdown();
}

#[test]
fn stop_and_cancel_are_not_server_failures() {
    assert!(RequestError::Stopped.is_shutdown_or_cancel());
    assert!(RequestError::Cancelled.is_shutdown_or_cancel());
    assert_eq!(RequestError::Stopped.to_string(), "stopped");
    let cache = RequestError::from(radixkv::cache::CacheError::ForeignHandle);
    assert!(!cache.is_shutdown_or_cancel());
}

/// The simulator, panicking in every pass.
struct Panicking(SimulatedBackend);

impl ModelBackend for Panicking {
    fn step(&self, _device: DeviceId, _batch: &Batch) -> Result<StepOutput, BackendError> {
        panic!("a bug in the model");
    }

    fn describe(&self) -> String {
        format!("panicking {}", self.0.describe())
    }
}

#[test]
fn a_panicking_scheduler_fails_the_engine_and_its_requests_end() {
    let e = Engine::start(
        EngineConfig {
            devices: 1,
            page_size: 4,
            pages_per_device: 64,
            ..EngineConfig::default()
        },
        Arc::new(Panicking(SimulatedBackend::new(CostModel::default(), 0.0))),
    )
    .unwrap();
    assert_eq!(e.failure(), None);
    let events = e
        .submit_streaming(EngineRequest::new(vec![1u32, 2, 3, 4, 5], 4))
        .unwrap()
        .1;
    // The scheduler died with the request: its stream ends without `Done`.
    assert_eq!(
        events.recv_timeout(Duration::from_secs(60)),
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected)
    );
    // The failure is recorded as the thread unwinds; wait for it.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while e.failure().is_none() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let why = e
        .failure()
        .expect("the engine is marked failed")
        .to_string();
    assert!(
        why.contains("device 0") && why.contains("a bug in the model"),
        "{why}"
    );
    match e.submit(EngineRequest::new(vec![1u32, 2, 3], 1)) {
        Err(radixkv_engine::EngineError::Failed(w)) => assert_eq!(w, why),
        other => panic!("{other:?}"),
    }
    e.shutdown();
}

#[test]
fn ending_generation_early_completes_without_error_and_caches_the_output() {
    let e = Engine::start(
        EngineConfig {
            devices: 1,
            page_size: 4,
            pages_per_device: 4096,
            ..EngineConfig::default()
        },
        // A token every few milliseconds: the request is mid-generation
        // when it is ended.
        Arc::new(SimulatedBackend::new(CostModel::default(), 1.0)),
    )
    .unwrap();
    let prompt: Vec<u32> = (0..64).collect();
    let (id, events) = e
        .submit_streaming(EngineRequest::new(prompt.clone(), 4000))
        .unwrap();
    for _ in 0..3 {
        match events.recv_timeout(Duration::from_secs(60)).unwrap() {
            radixkv_engine::StreamEvent::Token(_) => {}
            other => panic!("{other:?}"),
        }
    }
    e.end_generation(id);
    let mut tokens = 3usize;
    let done = loop {
        match events.recv_timeout(Duration::from_secs(60)).unwrap() {
            radixkv_engine::StreamEvent::Token(_) => tokens += 1,
            radixkv_engine::StreamEvent::Done(c) => break c,
        }
    };
    assert_eq!(done.error, None);
    assert_eq!(done.output_tokens, tokens, "every token sent is counted");
    assert!(tokens < 4000, "it ended early: {tokens}");
    e.audit().unwrap();
    // The prompt and the output but the last token are in the tree.
    e.submit(EngineRequest::new(prompt, 1)).unwrap();
    let again = next(&e);
    assert_eq!(again.tokens.cached_tokens, 60, "the prompt's whole pages");
    e.end_generation(id); // finished: ignored
    e.audit().unwrap();
    e.shutdown();
}
