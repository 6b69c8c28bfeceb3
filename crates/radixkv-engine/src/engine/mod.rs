//! The engine proper: scheduler threads, the router and the shared cache,
//! with their configuration, requests, reports and live metrics (all
//! re-exported at the crate root).
//!
//! | file | what it holds |
//! | --- | --- |
//! | `config.rs` | [`EngineConfig`], [`CacheListeners`], [`EngineRequest`], [`EngineError`] |
//! | `report.rs` | [`EngineReport`], [`DeviceReport`], [`DeviceMetrics`], [`HostTierMetrics`], [`Latencies`], [`DeviceLatencies`] |
//! | `runtime.rs` | [`Engine`]: starting, submitting, live figures, stopping |

mod config;
mod report;
mod runtime;

pub use config::{CacheListeners, EngineConfig, EngineError, EngineRequest};
pub use report::{
    DeviceLatencies, DeviceMetrics, DeviceReport, EngineReport, HostTierMetrics, Latencies,
};
pub use runtime::Engine;
