//! `--kv-events`: the cache's residency changes as vLLM KV events over
//! ZeroMQ (`radixkv-events`), on `serve` and `replay`.

use radixkv_engine::{CacheListeners, EngineConfig};
use radixkv_events::{Encoding, KvEventPublisher, KvEventsConfig};
use std::sync::Arc;

/// The KV-event flags of `serve` and `replay`.
#[derive(clap::Args, Debug, Clone)]
pub struct KvEventArgs {
    /// Publish KV events (vLLM's format) on this ZeroMQ PUB endpoint,
    /// `tcp://HOST:PORT`: device 0 on PORT, device d on PORT + d; the host
    /// tier's pages on every device's socket with medium CPU. `serve` then
    /// answers POST /query_by_hash; `replay` takes no --compare,
    /// --compare-copy or --compare-write with it.
    #[arg(long, value_name = "ENDPOINT")]
    pub kv_events: Option<String>,
    /// Answer replay requests (ROUTER) here, device d on PORT + d, from a
    /// buffer of the last 10,000 batches (at most 64 MiB) per device.
    #[arg(long, value_name = "ENDPOINT", requires = "kv_events")]
    pub kv_events_replay: Option<String>,
    /// The topic frame of every message (default empty).
    #[arg(long, default_value = "", requires = "kv_events")]
    pub kv_events_topic: String,
    /// Event encoding: `map` (current vLLM) or `array` (older vLLM).
    #[arg(long, default_value = "map", requires = "kv_events")]
    pub kv_events_encoding: String,
    /// Seconds after the start during which changes wait while each socket
    /// repeats AllBlocksCleared every 100 ms (0 to 86,400): a subscriber
    /// that stayed connected across a restart reconnects within its
    /// reconnect interval (libzmq's default is 0.1 s) and sees the
    /// clearing before the new run's first store. 0 sends at once.
    #[arg(long, default_value_t = 1.0, value_parser = crate::ranges::seconds, requires = "kv_events")]
    pub kv_events_startup_hold_s: f64,
}

impl KvEventArgs {
    /// The publisher's configuration, if `--kv-events` was given.
    pub fn config(&self) -> Result<Option<KvEventsConfig>, String> {
        let Some(ep) = &self.kv_events else {
            return Ok(None);
        };
        let mut c = KvEventsConfig::new(ep.clone());
        c.replay_endpoint = self.kv_events_replay.clone();
        c.topic = self.kv_events_topic.clone();
        c.encoding = self.kv_events_encoding.parse::<Encoding>()?;
        c.startup_hold = std::time::Duration::from_secs_f64(self.kv_events_startup_hold_s);
        Ok(Some(c))
    }
}

/// Starts the publisher (inside a tokio runtime) for `cfg`'s devices and
/// page size and installs it as the engine's cache listener; prints where
/// it publishes. `index`: keep the block index (`/query_by_hash`).
pub async fn start(
    args: &KvEventArgs,
    cfg: &mut EngineConfig,
    index: bool,
) -> Result<Option<Arc<KvEventPublisher>>, Box<dyn std::error::Error>> {
    let Some(mut c) = args.config()? else {
        return Ok(None);
    };
    c.index_blocks = index;
    let p = Arc::new(KvEventPublisher::start(c, cfg.devices, cfg.page_size).await?);
    // The sinks, not the publisher: the caller keeps the only handle on it
    // (to shut it down).
    let shared = p.listener();
    let private: Vec<_> = (0..cfg.devices).map(|d| p.listener_for_device(d)).collect();
    cfg.listeners = Some(CacheListeners::new(move |device| {
        match device.and_then(|d| private.get(d)) {
            Some(sink) => Arc::clone(sink) as Arc<dyn radixkv::events::CacheListener>,
            None => Arc::clone(&shared) as Arc<dyn radixkv::events::CacheListener>,
        }
    }));
    eprintln!(
        "radixkv: KV events on {}{}",
        p.endpoints().join(", "),
        if p.replay_endpoints().is_empty() {
            String::new()
        } else {
            format!(" (replay on {})", p.replay_endpoints().join(", "))
        }
    );
    Ok(Some(p))
}
