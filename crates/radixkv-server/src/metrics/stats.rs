//! The HTTP layer's own counters ([`ServerStats`]) and the figures of one
//! read of the engine, the trees and the HTTP layer ([`Stats`], served as
//! JSON by `GET /stats` and encoded by [`super::prometheus`]).

use radixkv::{DeviceId, PagedCache};
use radixkv_engine::{DeviceMetrics, HostTierMetrics};
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

/// What the HTTP layer counted since the server started.
#[derive(Debug, Default)]
pub struct ServerStats {
    /// Responses per HTTP status code.
    responses: Mutex<BTreeMap<u16, u64>>,
    /// Requests refused with 429.
    pub rejected_busy: AtomicU64,
    /// Requests cancelled because their client went away.
    pub disconnects: AtomicU64,
    /// Connections open now.
    pub open_connections: std::sync::atomic::AtomicUsize,
    /// Connections closed to make room under the connection cap, or
    /// refused at it.
    pub shed_connections: AtomicU64,
    /// Connections closed because a response waited on its client past the
    /// send timeout (their requests cancelled).
    pub send_timeouts: AtomicU64,
}

impl ServerStats {
    /// Zero counters.
    pub fn new() -> Self {
        Self::default()
    }

    /// Counts one response.
    pub fn response(&self, code: u16) {
        if let Ok(mut m) = self.responses.lock() {
            *m.entry(code).or_default() += 1;
        }
    }

    /// Responses per status code.
    pub fn responses(&self) -> BTreeMap<u16, u64> {
        self.responses.lock().map(|m| m.clone()).unwrap_or_default()
    }
}

/// One device in [`Stats`].
#[derive(Clone, Debug, Serialize)]
pub struct DeviceStats {
    /// The engine's live figures.
    #[serde(flatten)]
    pub metrics: DeviceMetrics,
    /// Tokens on a pinned path (held by running requests).
    pub pinned_tokens: usize,
    /// Tokens cached in the tree on this device.
    pub tree_tokens: usize,
}

/// The HTTP layer's figures in [`Stats`].
#[derive(Clone, Debug, Serialize)]
pub struct HttpStats {
    /// Requests admitted and not finished.
    pub in_flight: usize,
    /// The admission queue's capacity.
    pub max_queue: usize,
    /// Requests refused with 429.
    pub rejected_busy: u64,
    /// Requests cancelled because their client went away.
    pub disconnects: u64,
    /// Responses per status code.
    pub responses: BTreeMap<u16, u64>,
    /// Seconds since the server started.
    pub uptime_s: f64,
    /// Whether a graceful shutdown is under way.
    pub draining: bool,
    /// Connections open now.
    pub open_connections: usize,
    /// The cap on open connections in force.
    pub max_connections: usize,
    /// Connections closed to make room under the cap, or refused at it.
    pub shed_connections: u64,
    /// Connections closed because a response waited on its client past the
    /// send timeout.
    pub send_timeouts: u64,
}

/// `GET /stats`.
#[derive(Clone, Debug, Serialize)]
pub struct Stats {
    /// The engine is idle (nothing admitted, queued or running), no token
    /// is pinned and the caches pass their audit (invariants and page
    /// conservation: every used page is cached in the tree, none is held
    /// by a request).
    pub audit_ok: bool,
    /// Why `audit_ok` is false.
    pub audit_error: Option<String>,
    /// Why the engine serves no more, once a scheduler thread failed
    /// (then `/health` answers 503 and `audit_ok` is false).
    pub engine_failure: Option<String>,
    /// Requests queued or running in the engine, all devices.
    pub outstanding: usize,
    /// Pinned tokens, all devices.
    pub pinned_tokens: usize,
    /// Per device.
    pub devices: Vec<DeviceStats>,
    /// The host tier shared by the devices (absent without one).
    pub host_tier: Option<HostTierMetrics>,
    /// The HTTP layer.
    pub http: HttpStats,
}

/// The engine's figures per device plus pinned and cached tokens from a
/// scan of each device's tree (`caches[d]`: device `d`'s cache and its id
/// there).
pub fn device_stats(
    metrics: Vec<DeviceMetrics>,
    caches: &[(Arc<PagedCache>, DeviceId)],
) -> Vec<DeviceStats> {
    metrics
        .into_iter()
        .enumerate()
        .map(|(d, metrics)| {
            let sizes = caches
                .get(d)
                .and_then(|(cache, dev)| cache.sizes(*dev).ok())
                .unwrap_or_default();
            DeviceStats {
                metrics,
                pinned_tokens: sizes.protected,
                tree_tokens: sizes.total,
            }
        })
        .collect()
}

/// Builds [`Stats`]; runs `audit` (the engine's) only when nothing is in
/// flight.
pub fn stats(
    devices: Vec<DeviceStats>,
    host_tier: Option<HostTierMetrics>,
    http: HttpStats,
    audit: impl FnOnce() -> Result<(), String>,
) -> Stats {
    let outstanding: usize = devices.iter().map(|d| d.metrics.outstanding).sum();
    let pinned_tokens: usize = devices.iter().map(|d| d.pinned_tokens).sum();
    let audit_error = if http.in_flight > 0 || outstanding > 0 {
        Some(format!(
            "busy: {} requests in flight, {outstanding} outstanding in the engine (audit skipped)",
            http.in_flight
        ))
    } else if pinned_tokens > 0 {
        Some(format!("{pinned_tokens} tokens pinned while idle"))
    } else {
        audit().err()
    };
    Stats {
        audit_ok: audit_error.is_none(),
        audit_error,
        engine_failure: None,
        outstanding,
        pinned_tokens,
        devices,
        host_tier,
        http,
    }
}
