//! [`KvEventPublisher`]: the handle that binds every device's sockets,
//! starts their tasks, hands out the sinks to install on caches, and reads
//! the counters, resolves block ids, flushes and shuts down.

use super::config::{device_endpoints, EventsError, KvEventsConfig};
use super::queue::{lock, DeviceQueue};
use super::shared::Shared;
use super::sink::EventSink;
use super::stats::SocketStats;
use super::tasks::{publish_loop, replay_loop, unix_now};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;
use zeromq::Socket;

/// Publishes a cache's residency changes as vLLM KV events, one PUB socket
/// per device. Install [`listener`](Self::listener) on the cache
/// ([`radixkv::RadixCacheBuilder::listener`]).
///
/// Each socket sends, first, a batch with `AllBlocksCleared` (a router
/// that kept state from an earlier run drops it), with a sequence number
/// taken from the wall clock (microseconds since the epoch), so that it is
/// above any earlier run's; then one batch per flush, numbered one more
/// each. Until the first change is sent the clearing is sent again every
/// 100 ms, and the first batch of changes starts with it; no change is
/// sent before [`KvEventsConfig::startup_hold`] has passed (they wait in
/// the queue). A subscriber that stayed connected across a restart, which
/// ZeroMQ reconnects only after its reconnect interval, thus still sees
/// the clearing before any other event of the new run.
///
/// The host tier's pages appear on every socket with medium `CPU`.
/// A cache that is dropped (a reset: an engine replacing its cache, or
/// shutting down) is cleared: `AllBlocksCleared` on every socket that only
/// it published on, and on a socket it shared with another cache (private
/// trees, one per device, whose host-tier pages are on every socket) a
/// `BlockRemoved` for each of its blocks, so the other cache's stay.
///
/// A full queue ([`KvEventsConfig::max_pending`]) drops events, counted in
/// [`SocketStats::dropped_events`], as vLLM's publisher does; the stores of
/// a dropped store's children and its removal cannot be chained and are
/// dropped too (counted). A router that sees drops must resynchronise.
#[derive(Debug)]
pub struct KvEventPublisher {
    shared: Arc<Shared>,
    endpoints: Vec<String>,
    replay_endpoints: Vec<String>,
    tasks: Vec<JoinHandle<()>>,
}

impl KvEventPublisher {
    /// Binds every device's sockets (inside a tokio runtime) and starts
    /// publishing. Errors: a malformed endpoint, a port in use.
    pub async fn start(
        cfg: KvEventsConfig,
        devices: usize,
        page_size: usize,
    ) -> Result<KvEventPublisher, EventsError> {
        if devices == 0 {
            return Err(EventsError::NoDevices);
        }
        let endpoints = device_endpoints(&cfg.endpoint, devices)?;
        let replay_endpoints = match &cfg.replay_endpoint {
            Some(r) => device_endpoints(r, devices)?,
            None => Vec::new(),
        };
        let mut pubs = Vec::with_capacity(devices);
        for ep in &endpoints {
            let mut s = zeromq::PubSocket::new();
            s.bind(ep).await.map_err(|source| EventsError::Bind {
                endpoint: ep.clone(),
                source,
            })?;
            pubs.push(s);
        }
        let mut routers = Vec::with_capacity(replay_endpoints.len());
        for ep in &replay_endpoints {
            let mut s = zeromq::RouterSocket::new();
            s.bind(ep).await.map_err(|source| EventsError::Bind {
                endpoint: ep.clone(),
                source,
            })?;
            routers.push(s);
        }
        let shared = Arc::new(Shared {
            queues: (0..devices).map(|_| DeviceQueue::default()).collect(),
            page_size,
            max_pending: cfg.max_pending.max(1),
            closing: AtomicBool::new(false),
            index: cfg.index_blocks.then(Default::default),
            next_tag: std::sync::atomic::AtomicU32::new(0),
        });
        let first_seq = unix_now().as_micros() as u64;
        let mut tasks = Vec::new();
        for (d, socket) in pubs.into_iter().enumerate() {
            tasks.push(tokio::spawn(publish_loop(
                Arc::clone(&shared),
                d,
                socket,
                cfg.clone(),
                first_seq,
            )));
        }
        for (d, socket) in routers.into_iter().enumerate() {
            tasks.push(tokio::spawn(replay_loop(Arc::clone(&shared), d, socket)));
        }
        Ok(KvEventPublisher {
            shared,
            endpoints,
            replay_endpoints,
            tasks,
        })
    }

    /// The listener to install on a cache whose devices are this
    /// publisher's devices (a shared tree).
    ///
    /// One sink per cache: what the publisher remembers per node is keyed
    /// by sink (node ids are unique within a cache only).
    pub fn listener(&self) -> Arc<EventSink> {
        self.sink(None)
    }

    /// The listener for a one-device cache that stands for device `d`
    /// (private trees, one per device): its events go on `d`'s socket.
    pub fn listener_for_device(&self, d: usize) -> Arc<EventSink> {
        self.sink(Some(d))
    }

    fn sink(&self, device: Option<usize>) -> Arc<EventSink> {
        Arc::new(EventSink {
            shared: Arc::clone(&self.shared),
            device,
            // Relaxed: tags only need to be distinct.
            tag: self.shared.next_tag.fetch_add(1, Ordering::Relaxed),
        })
    }

    /// The namespace and tokens of the longest prefix of `ids` (block ids
    /// as published, from the root) that some tier holds, as far as the
    /// events sent so far tell; `None` without
    /// [`KvEventsConfig::index_blocks`].
    pub fn resolve(&self, ids: &[u64]) -> Option<(Option<Arc<str>>, Vec<u32>)> {
        let index = lock(self.shared.index.as_ref()?);
        let mut tokens = Vec::new();
        let mut namespace = None;
        for (i, id) in ids.iter().enumerate() {
            let Some(b) = index.get(id) else { break };
            let parent = i.checked_sub(1).map(|p| ids[p]);
            if b.parent != parent || (i > 0 && b.namespace != namespace) {
                break;
            }
            namespace = b.namespace.clone();
            tokens.extend_from_slice(&b.tokens);
        }
        Some((namespace, tokens))
    }

    /// Each device's PUB endpoint.
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// Each device's replay endpoint (empty without replay).
    pub fn replay_endpoints(&self) -> &[String] {
        &self.replay_endpoints
    }

    /// Each device's counters.
    pub fn stats(&self) -> Vec<SocketStats> {
        self.shared
            .queues
            .iter()
            .map(|q| {
                // What is still queued, counted under the queue's lock; the
                // task adds a queue's counts to the counters under the same
                // lock as it takes the queue, so none is missed or counted
                // twice. Read in that order: `queued` after the lock, then
                // what was sent (Relaxed: statistics; the lock orders
                // `queued`, and a task's later batches only add to `events`
                // once its earlier ones are done, so `flush` cannot see a
                // batch as done before it is).
                let (pending, pending_dropped) = {
                    let p = lock(&q.pending);
                    (p.events, p.dropped)
                };
                let c = &q.counters;
                let queued = c.queued.load(Ordering::Relaxed) + pending;
                SocketStats {
                    batches: c.batches.load(Ordering::Relaxed),
                    events: c.events.load(Ordering::Relaxed),
                    dropped_events: c.dropped.load(Ordering::Relaxed) + pending_dropped,
                    replays: c.replays.load(Ordering::Relaxed),
                    last_seq: c.last_seq.load(Ordering::Relaxed),
                    queued,
                    remembered_nodes: c.remembered.load(Ordering::Relaxed),
                }
            })
            .collect()
    }

    /// Waits until every event queued so far has been sent (or dropped):
    /// call it once the cache is quiet, before reading replays.
    pub async fn flush(&self) {
        while self
            .stats()
            .iter()
            .any(|s| s.events + s.dropped_events < s.queued)
        {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Sends what is queued and stops (the sockets close); returns the
    /// final counters.
    pub async fn shutdown(mut self) -> Vec<SocketStats> {
        self.shared.closing.store(true, Ordering::SeqCst);
        for q in &self.shared.queues {
            q.notify.notify_one();
        }
        let devices = self.shared.queues.len();
        for t in self.tasks.drain(..devices) {
            let _ = t.await;
        }
        for t in self.tasks.drain(..) {
            t.abort();
        }
        self.stats()
    }
}

impl Drop for KvEventPublisher {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}
