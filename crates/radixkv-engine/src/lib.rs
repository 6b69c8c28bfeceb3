//! # radixkv-engine
//!
//! The multi-device serving runtime over the [`radixkv`] core: one scheduler thread per device, all
//! sharing one [`RadixCache`](radixkv::RadixCache) (or, for the `private` baseline, one tree per
//! device), a router in front, and a model backend behind: the simulator here, or a model of the
//! crate `radixkv-models` (KV pools, paged models, the tiny transformer, GGUF llamas), which
//! implements [`ModelBackend`](sched::batch::ModelBackend). The runtime imports no model.
//!
//! ```
//! use radixkv_engine::{Engine, EngineConfig, EngineRequest};
//! use radixkv_engine::simulator::{CostModel, SimulatedBackend};
//! use std::sync::Arc;
//! let backend = Arc::new(SimulatedBackend::new(CostModel::default(), 1000.0));
//! let cfg = EngineConfig { devices: 2, pages_per_device: 256, ..EngineConfig::default() };
//! let engine = Engine::start(cfg, backend)?;
//! let system: Vec<u32> = (0..64).collect();
//! for q in 0..4u32 {
//!     let mut prompt = system.clone();
//!     prompt.extend([1000 + q; 16]);
//!     engine.submit(EngineRequest::new(prompt, 8))?;
//! }
//! let done: Vec<_> = (0..4).map(|_| engine.completions().recv().unwrap()).collect();
//! assert!(done.iter().all(|c| c.error.is_none() && c.output_tokens == 8));
//! let report = engine.shutdown();
//! assert_eq!(report.devices.len(), 2);
//! # Ok::<(), radixkv_engine::EngineError>(())
//! ```
//!
//! ## Modules
//!
//! | module | what it is |
//! | --- | --- |
//! | crate root | [`Engine`]: scheduler threads on one shared [`RadixCache`](radixkv::RadixCache), the router, reports and live metrics |
//! | [`router`] | which device a request goes to (cache-aware, round-robin, least-loaded, private) |
//! | [`sched`] | per-device scheduling: waiting-queue policies, the scheduler loop, the model interface |
//! | [`simulator`] | the default model backend: a cost-model simulator |
//! | [`tiers`] | the host tier, copy and write policies, and the copy-or-recompute cost model |
//! | [`rng`] | the one seeded generator of workloads, policies and weights |
//!
//! The tools that drive the engine (traces and their generators, `replay`,
//! `hitrate`, the conformance runner, the torture run) are the crate
//! `radixkv-tools`, so the serving runtime carries none of them.

mod accounting;
mod engine;
pub mod rng;
pub mod router;
pub mod sched;
pub mod simulator;
pub mod tiers;

pub use accounting::{CopiedIn, PromptTokens};
pub use engine::{
    CacheListeners, DeviceLatencies, DeviceMetrics, DeviceReport, Engine, EngineConfig,
    EngineError, EngineReport, EngineRequest, HostTierMetrics, Latencies,
};
pub use sched::scheduler::{Completion, RequestError, StreamEvent};
