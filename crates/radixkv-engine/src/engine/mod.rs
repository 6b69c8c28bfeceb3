//! The engine proper: scheduler threads, the router and the shared cache,
//! with their configuration, requests, reports and live metrics (all
//! re-exported at the crate root).
//!
//! | file | what it holds |
//! | --- | --- |
//! | `config.rs` | [`EngineConfig`], [`CacheListeners`], [`EngineRequest`], [`EngineError`] |
//! | `report.rs` | [`EngineReport`], [`DeviceReport`], [`DeviceMetrics`], [`HostTierMetrics`], [`Latencies`], [`DeviceLatencies`] |
//! | `placement.rs` | the engine's caches, and which cache and device id each engine device has |
//! | `runtime.rs` | [`Engine`]: starting, submitting, live figures, stopping |

mod config;
mod placement;
mod report;
mod runtime;

pub use config::{CacheListeners, EngineConfig, EngineError, EngineRequest};
pub use report::{
    DeviceLatencies, DeviceMetrics, DeviceReport, EngineReport, HostTierMetrics, Latencies,
};
pub use runtime::Engine;
