//! [`AppState`]: what every handler shares (the engine, the caches, the
//! settings, the counters).

use crate::codec;
use crate::config::ServerConfig;
use crate::metrics;
use crate::metrics::{HttpStats, ServerStats};
use radixkv::{DeviceId, PagedCache};
use radixkv_engine::Engine;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::Semaphore;

/// What the handlers share.
#[derive(Debug)]
pub(crate) struct AppState {
    /// The engine, shared by every handler without a lock (`Engine` is
    /// `Sync`: its calls send messages to the schedulers and read atomics).
    pub(crate) engine: Engine,
    /// Each device's cache and its id there, for scans outside the lock.
    pub(crate) caches: Vec<(Arc<PagedCache>, DeviceId)>,
    pub(crate) cfg: ServerConfig,
    /// `cfg.connections.max_connections`, kept below the open-file limit.
    pub(crate) connection_cap: usize,
    pub(crate) admission: Arc<Semaphore>,
    pub(crate) stats: ServerStats,
    pub(crate) draining: AtomicBool,
    pub(crate) started: Instant,
    /// Unix seconds at start (`/v1/models`' `created`).
    pub(crate) started_unix: u64,
    /// The KV-event publisher, if the cache publishes (its counters go to
    /// /metrics).
    pub(crate) kv_events: std::sync::OnceLock<Arc<radixkv_events::KvEventPublisher>>,
    /// The model's text interface (the byte codec unless set).
    pub(crate) codec: std::sync::OnceLock<Arc<dyn codec::TextCodec>>,
}

impl AppState {
    /// How text becomes tokens and back.
    pub(crate) fn codec(&self) -> &dyn codec::TextCodec {
        match self.codec.get() {
            Some(c) => c.as_ref(),
            None => &codec::ByteCodec,
        }
    }

    pub(crate) fn engine(&self) -> &Engine {
        &self.engine
    }

    /// `/stats`, computed on a blocking thread.
    pub(crate) fn stats(&self) -> metrics::Stats {
        let m = self.engine().metrics();
        let host = self.engine().host_tier();
        let devices = metrics::device_stats(m, &self.caches);
        let mut s = metrics::stats(devices, host, self.http_stats(), || self.engine().audit());
        if let Some(why) = self.engine().failure() {
            s.audit_ok = false;
            s.audit_error = Some(format!("the engine failed: {why}"));
            s.engine_failure = Some(why.to_string());
        }
        s
    }

    /// `/metrics`, computed on a blocking thread.
    pub(crate) fn prometheus(&self) -> Result<String, std::fmt::Error> {
        let (m, host, latencies) = {
            let engine = self.engine();
            (
                engine.metrics(),
                engine.host_tier(),
                engine.latency_histograms(),
            )
        };
        let devices = metrics::device_stats(m, &self.caches);
        let events = self.kv_events.get().map(|p| p.stats());
        metrics::prometheus(devices, host, latencies, self.http_stats(), events)
    }

    pub(crate) fn in_flight(&self) -> usize {
        self.cfg
            .max_queue
            .saturating_sub(self.admission.available_permits())
    }

    pub(crate) fn http_stats(&self) -> HttpStats {
        HttpStats {
            in_flight: self.in_flight(),
            max_queue: self.cfg.max_queue,
            // Relaxed: statistics.
            rejected_busy: self.stats.rejected_busy.load(Ordering::Relaxed),
            disconnects: self.stats.disconnects.load(Ordering::Relaxed),
            responses: self.stats.responses(),
            uptime_s: self.started.elapsed().as_secs_f64(),
            draining: self.draining.load(Ordering::Relaxed),
            open_connections: self.stats.open_connections.load(Ordering::Relaxed),
            max_connections: self.connection_cap,
            shed_connections: self.stats.shed_connections.load(Ordering::Relaxed),
            send_timeouts: self.stats.send_timeouts.load(Ordering::Relaxed),
        }
    }
}
