//! The publisher: a [`CacheListener`] that queues each device's events and
//! tokio tasks that send them, in batches, on one ZeroMQ PUB socket per
//! device (and answer replays on an optional ROUTER socket per device).

use crate::wire::{self, BatchEncoder, Encoding, EventRef, Medium};
use bytes::Bytes;
use radixkv::events::{CacheListener, PageEvent};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use zeromq::{Socket, SocketRecv, SocketSend, ZmqMessage};

/// What the publisher is told to do; [`KvEventsConfig::new`] fills in
/// vLLM's defaults.
#[derive(Clone, Debug, PartialEq)]
pub struct KvEventsConfig {
    /// Device 0's PUB endpoint, `tcp://HOST:PORT`; device `d` binds
    /// `PORT + d` (vLLM's convention for data-parallel ranks).
    pub endpoint: String,
    /// Device 0's replay (ROUTER) endpoint, likewise `PORT + d`; none by
    /// default.
    pub replay_endpoint: Option<String>,
    /// The topic frame of every message (default empty, as vLLM's).
    pub topic: String,
    /// How events are encoded (default [`Encoding::Map`]).
    pub encoding: Encoding,
    /// Batches kept per device for replays (default 10,000, as vLLM); kept
    /// only with a replay endpoint.
    pub replay_buffer: usize,
    /// Bytes of payload kept per device for replays, at most (default
    /// 64 MiB): the oldest batches go first when either bound is reached,
    /// so a burst of large batches cannot hold gigabytes.
    pub replay_bytes: usize,
    /// Events queued per device before new ones are dropped and counted
    /// (default 100,000; the PUB socket's own high-water mark is 100,000
    /// messages per subscriber, beyond which it drops as libzmq does).
    pub max_pending: usize,
    /// How long a batch waits for more events after its first (default
    /// 1 ms): the bound on batching's share of an event's latency.
    pub max_delay: Duration,
    /// Keep an index from every published block id to its page (parent id,
    /// tokens, namespace) while some tier holds it, for
    /// [`KvEventPublisher::resolve`] (`/query_by_hash`); about 60 bytes
    /// plus 4 per token per block (default off).
    pub index_blocks: bool,
}

impl KvEventsConfig {
    /// A configuration publishing on `endpoint` with every other setting
    /// at its default.
    pub fn new(endpoint: impl Into<String>) -> Self {
        KvEventsConfig {
            endpoint: endpoint.into(),
            replay_endpoint: None,
            topic: String::new(),
            encoding: Encoding::Map,
            replay_buffer: 10_000,
            replay_bytes: 64 << 20,
            max_pending: 100_000,
            max_delay: Duration::from_millis(1),
            index_blocks: false,
        }
    }
}

/// Why the publisher could not start.
#[derive(Debug, thiserror::Error)]
pub enum EventsError {
    /// The endpoint is not `tcp://HOST:PORT`, or a device's port is past 65,535.
    #[error("bad KV-events endpoint {endpoint:?}: {why}")]
    Endpoint {
        /// What was given.
        endpoint: String,
        /// What is wrong with it.
        why: String,
    },
    /// A socket could not bind (the port is in use, the host is not local…).
    #[error("cannot bind the KV-events socket {endpoint}: {source}")]
    Bind {
        /// The endpoint of the device's socket.
        endpoint: String,
        /// ZeroMQ's error.
        source: zeromq::ZmqError,
    },
    /// Publishing for no device.
    #[error("the KV-event publisher needs at least one device")]
    NoDevices,
}

/// `tcp://HOST:PORT` → (HOST, PORT).
fn parse_endpoint(endpoint: &str) -> Result<(String, u16), EventsError> {
    let bad = |why: &str| EventsError::Endpoint {
        endpoint: endpoint.to_owned(),
        why: why.to_owned(),
    };
    let rest = endpoint
        .strip_prefix("tcp://")
        .ok_or_else(|| bad("only tcp://HOST:PORT is supported"))?;
    let (host, port) = rest
        .rsplit_once(':')
        .ok_or_else(|| bad("no :PORT after the host"))?;
    if host.is_empty() {
        return Err(bad("no host (use tcp://0.0.0.0:PORT to listen everywhere)"));
    }
    let host = if host == "*" { "0.0.0.0" } else { host };
    let port: u16 = port
        .parse()
        .map_err(|_| bad("the port is not a number in 1..=65535"))?;
    if port == 0 {
        return Err(bad("port 0: give a fixed port, subscribers must know it"));
    }
    Ok((host.to_owned(), port))
}

/// The endpoints of `devices` devices from device 0's.
pub fn device_endpoints(endpoint: &str, devices: usize) -> Result<Vec<String>, EventsError> {
    let (host, port) = parse_endpoint(endpoint)?;
    (0..devices)
        .map(|d| {
            let p = u32::from(port) + d as u32;
            if p > 65_535 {
                return Err(EventsError::Endpoint {
                    endpoint: endpoint.to_owned(),
                    why: format!("device {d} would need port {p}"),
                });
            }
            Ok(format!("tcp://{host}:{p}"))
        })
        .collect()
}

/// Counters of one device's socket.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SocketStats {
    /// Batches sent.
    pub batches: u64,
    /// Events sent.
    pub events: u64,
    /// Events dropped because the queue held [`KvEventsConfig::max_pending`].
    pub dropped_events: u64,
    /// Replay requests answered.
    pub replays: u64,
    /// The last sequence number sent.
    pub last_seq: u64,
    /// Events handed to the queue (sent, dropped or still queued).
    pub queued: u64,
}

#[derive(Debug, Default)]
struct Counters {
    batches: AtomicU64,
    events: AtomicU64,
    dropped: AtomicU64,
    replays: AtomicU64,
    last_seq: AtomicU64,
    queued: AtomicU64,
}

/// One queued change: its tokens or ids at `Changes::tokens[at..at + len]`
/// or `Changes::ids[at..at + len]`, as `kind` says.
#[derive(Clone, Debug)]
struct Head {
    stored: bool,
    host: bool,
    namespace: Option<Arc<str>>,
    /// The sink-tagged node id (stores: its ids are remembered).
    node: (u32, u64),
    kind: HeadKind,
    at: usize,
    len: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum HeadKind {
    /// The path from the root (tokens), the node's pages from `start`.
    Path { start: usize },
    /// The node's own pages (tokens), chained from `before` (its parent's
    /// last block id; `None`: the parent is a namespace root).
    Own { before: Option<u64> },
    /// The block ids of the node's pages.
    Ids,
}

/// A device's queued changes, as the listener leaves them: paths copied
/// into one flat buffer (hashed into block ids by the socket's task, off
/// the cache's locked section), or a removal's ids. The task swaps the
/// whole queue for an empty one of the same capacity and hands that back
/// after sending, so in a steady state queueing allocates and frees
/// nothing (a free on another thread than the allocation's, per event,
/// cost more than the insert it reported).
#[derive(Debug, Default)]
struct Changes {
    heads: Vec<Head>,
    tokens: Vec<u32>,
    ids: Vec<u64>,
}

/// What a change carries into the queue.
enum Carry<'a> {
    /// The path from the root, the node's pages from `start`.
    Path(&'a [u32], usize),
    /// The node's own pages, chained from its parent's last id (`None`: at
    /// a namespace root).
    Own(&'a [u32], Option<u64>),
    /// The block ids of the node's pages.
    Ids(&'a [u64]),
}

impl Changes {
    fn clear(&mut self) {
        self.heads.clear();
        self.tokens.clear();
        self.ids.clear();
    }

    fn push(
        &mut self,
        (stored, host): (bool, bool),
        namespace: Option<&str>,
        node: (u32, u64),
        carry: &Carry<'_>,
    ) {
        // The namespace of the previous change, shared if it is the same.
        let namespace = match (namespace, self.heads.last()) {
            (None, _) => None,
            (
                Some(n),
                Some(Head {
                    namespace: Some(last),
                    ..
                }),
            ) if **last == *n => Some(Arc::clone(last)),
            (Some(n), _) => Some(Arc::from(n)),
        };
        let (kind, at, len) = match *carry {
            Carry::Path(tokens, start) => {
                let at = self.tokens.len();
                self.tokens.extend_from_slice(tokens);
                (HeadKind::Path { start }, at, tokens.len())
            }
            Carry::Own(tokens, before) => {
                let at = self.tokens.len();
                self.tokens.extend_from_slice(tokens);
                (HeadKind::Own { before }, at, tokens.len())
            }
            Carry::Ids(ids) => {
                let at = self.ids.len();
                self.ids.extend_from_slice(ids);
                (HeadKind::Ids, at, ids.len())
            }
        };
        self.heads.push(Head {
            stored,
            host,
            namespace,
            node,
            kind,
            at,
            len,
        });
    }
}

/// Per node, the block ids of its pages, remembered when its store is
/// sent, so that its removal needs neither its path nor its tokens (an
/// evicted leaf's key is cold: reading and hashing it cost more than the
/// eviction). A node's pages only ever lose their first part (a split moves
/// it to a new node, the parent): a removal takes the last ids, and hands
/// the rest to the parent's entry. The map is bounded (a full shard is
/// cleared); a miss reads the path once. Keyed by (sink, node id): node ids
/// are unique within one cache only.
#[derive(Debug)]
struct NodeIds {
    shards: Box<[Mutex<NodeIdMap>]>,
}

/// (sink, node id) → the block ids of the node's pages.
type NodeIdMap = std::collections::HashMap<(u32, u64), Box<[u64]>>;

const ID_SHARDS: usize = 16;
/// Nodes per shard before it is cleared (16 × 16,384 nodes).
const ID_SHARD_CAP: usize = 1 << 14;

impl NodeIds {
    fn new() -> Self {
        NodeIds {
            shards: (0..ID_SHARDS)
                .map(|_| Mutex::new(Default::default()))
                .collect(),
        }
    }

    fn shard(&self, node: (u32, u64)) -> MutexGuard<'_, NodeIdMap> {
        lock(&self.shards[(node.1 as usize) % ID_SHARDS])
    }

    /// The last block id of `node`, if known.
    fn last_of(&self, node: (u32, u64)) -> Option<u64> {
        self.shard(node)
            .get(&node)
            .and_then(|ids| ids.last().copied())
    }

    fn put(&self, node: (u32, u64), ids: &[u64]) {
        let mut s = self.shard(node);
        if s.len() >= ID_SHARD_CAP {
            s.clear();
        }
        s.insert(node, ids.into());
    }

    /// The ids of `node`'s last `pages` pages, into `out`; what precedes
    /// them goes to `parent` (split off from the node). False if unknown.
    fn take(&self, node: (u32, u64), parent: (u32, u64), pages: usize, out: &mut Vec<u64>) -> bool {
        let rest = {
            let s = self.shard(node);
            let Some(ids) = s.get(&node) else {
                return false;
            };
            if ids.len() < pages {
                return false;
            }
            let cut = ids.len() - pages;
            out.clear();
            out.extend_from_slice(&ids[cut..]);
            (cut > 0).then(|| ids[..cut].to_vec())
        };
        if let Some(rest) = rest {
            let mut p = self.shard(parent);
            if !p.contains_key(&parent) && p.len() < ID_SHARD_CAP {
                p.insert(parent, rest.into());
            }
        }
        true
    }
}

/// One device's queue and replay buffer.
#[derive(Debug, Default)]
struct DeviceQueue {
    pending: Mutex<Changes>,
    notify: Notify,
    /// The batches kept for replays, and their payloads' bytes.
    replay: Mutex<(VecDeque<(u64, Bytes)>, usize)>,
    counters: Counters,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding one of these locks leaves plain vectors
    // behind, still usable.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A published block, while some socket's tier holds it.
#[derive(Debug)]
struct IndexedBlock {
    parent: Option<u64>,
    tokens: Box<[u32]>,
    namespace: Option<Arc<str>>,
    /// Stores minus removals, over every socket (a host-tier block counts
    /// once per socket, as it is published).
    refs: u32,
}

#[derive(Debug)]
struct Shared {
    queues: Vec<DeviceQueue>,
    node_ids: NodeIds,
    /// The next sink's tag.
    next_tag: std::sync::atomic::AtomicU32,
    index: Option<Mutex<std::collections::HashMap<u64, IndexedBlock>>>,
    page_size: usize,
    max_pending: usize,
    closing: AtomicBool,
}

impl Shared {
    fn push(
        &self,
        device: usize,
        kind: (bool, bool),
        namespace: Option<&str>,
        node: (u32, u64),
        carry: &Carry<'_>,
    ) {
        let Some(q) = self.queues.get(device) else {
            return;
        };
        // Relaxed: a statistic (flush compares it once the cache is quiet).
        q.counters.queued.fetch_add(1, Ordering::Relaxed);
        let mut p = lock(&q.pending);
        if p.heads.len() >= self.max_pending {
            // Relaxed: a statistic.
            q.counters.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let first = p.heads.is_empty();
        p.push(kind, namespace, node, carry);
        drop(p);
        // One wake-up per batch: the task, once woken, waits max_delay and
        // then takes everything queued by then; a push onto a non-empty
        // queue is already covered (a wake-up of a parked runtime thread
        // is a system call, several times an insert's cost).
        if first {
            q.notify.notify_one();
        }
    }

    /// Appends `h`'s event to `b`, and keeps the block index and the
    /// node's ids (`ids`: a reused buffer).
    fn encode(&self, b: &mut BatchEncoder, h: &Head, q: &Changes, ids: &mut Vec<u64>) {
        let ps = self.page_size;
        let (ids, parent, pages): (&[u64], Option<u64>, &[u32]) = match h.kind {
            HeadKind::Ids => (&q.ids[h.at..h.at + h.len], None, &[]),
            HeadKind::Path { start } => {
                let path = &q.tokens[h.at..h.at + h.len];
                wire::block_ids_into(h.namespace.as_deref(), path, ps, ids);
                let first = (start / ps).min(ids.len());
                let parent = first.checked_sub(1).map(|p| ids[p]);
                (&ids[first..], parent, &path[start.min(path.len())..])
            }
            HeadKind::Own { before } => {
                let pages = &q.tokens[h.at..h.at + h.len];
                wire::chain_ids_into(before, h.namespace.as_deref(), pages, ps, ids);
                (&ids[..], before, pages)
            }
        };
        if h.stored {
            self.node_ids.put(h.node, ids);
        }
        let medium = if h.host { Medium::Cpu } else { Medium::Gpu };
        if let Some(index) = &self.index {
            let mut index = lock(index);
            for (i, &id) in ids.iter().enumerate() {
                if h.stored {
                    index
                        .entry(id)
                        .or_insert_with(|| IndexedBlock {
                            parent: if i == 0 { parent } else { Some(ids[i - 1]) },
                            tokens: pages[i * ps..(i + 1) * ps].into(),
                            namespace: h.namespace.clone(),
                            refs: 0,
                        })
                        .refs += 1;
                } else if let Some(b) = index.get_mut(&id) {
                    b.refs -= 1;
                    if b.refs == 0 {
                        index.remove(&id);
                    }
                }
            }
        }
        if h.stored {
            let (lora_name, cache_salt) = h
                .namespace
                .as_deref()
                .map_or((None, None), wire::namespace_parts);
            b.push(EventRef::BlockStored {
                parent_block_hash: parent,
                block_hashes: ids,
                token_ids: pages,
                block_size: ps,
                medium,
                lora_name,
                cache_salt,
            });
        } else {
            b.push(EventRef::BlockRemoved {
                block_hashes: ids,
                medium,
            });
        }
    }

    fn report(&self, e: &PageEvent<'_>, stored: bool, sink: Option<usize>, tag: u32) {
        let node = (tag, e.node);
        let kind = (stored, e.host);
        // A removal of a node whose ids were sent with its store: the ids.
        thread_local! {
            static IDS: std::cell::RefCell<Vec<u64>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        if !stored {
            let pages = e.pages().len() / self.page_size.max(1);
            let done = IDS.with(|b| {
                let Ok(mut b) = b.try_borrow_mut() else {
                    return false;
                };
                if !self.node_ids.take(node, (tag, e.parent), pages, &mut b) {
                    return false;
                }
                self.fan_out(e, sink, kind, None, node, &Carry::Ids(&b));
                true
            });
            if done {
                return;
            }
        }
        // A store (its path is the insert's own key, at hand), or a removal
        // not seen stored: the path, hashed by the task; a store whose
        // parent's ids are known (or at a root): its own pages only.
        let Some(loc) = e.location() else {
            return; // a chain cut under the cache's locks: cannot happen
        };
        let before = if !stored {
            None
        } else if e.at_root {
            Some(None)
        } else {
            self.node_ids.last_of((tag, e.parent)).map(Some)
        };
        let carry = match before {
            Some(b) => Carry::Own(e.pages(), b),
            None => Carry::Path(&loc.path, loc.path.len() - e.pages().len()),
        };
        self.fan_out(e, sink, kind, loc.namespace.as_deref(), node, &carry);
    }

    fn fan_out(
        &self,
        e: &PageEvent<'_>,
        sink: Option<usize>,
        kind: (bool, bool),
        namespace: Option<&str>,
        node: (u32, u64),
        carry: &Carry<'_>,
    ) {
        if e.host {
            // The host tier is shared: every device can load its pages, so
            // every device's socket reports them (medium CPU).
            for d in 0..self.queues.len() {
                self.push(d, kind, namespace, node, carry);
            }
        } else {
            self.push(
                sink.unwrap_or(e.device.index()),
                kind,
                namespace,
                node,
                carry,
            );
        }
    }
}

/// The [`CacheListener`] of a [`KvEventPublisher`]: converts residency
/// changes into KV events on the right device's queue.
#[derive(Debug, Clone)]
pub struct EventSink {
    shared: Arc<Shared>,
    /// For a cache with one device that stands for engine device `d`
    /// (private trees): every device event goes to `d`'s socket.
    device: Option<usize>,
    /// This sink's own tag: node ids are unique within one cache only, so
    /// what the publisher remembers per node is keyed by sink too (one
    /// sink per cache).
    tag: u32,
}

impl CacheListener for EventSink {
    fn stored(&self, e: &PageEvent<'_>) {
        self.shared.report(e, true, self.device, self.tag);
    }
    fn removed(&self, e: &PageEvent<'_>) {
        self.shared.report(e, false, self.device, self.tag);
    }
}

/// Publishes a cache's residency changes as vLLM KV events, one PUB socket
/// per device. Install [`listener`](Self::listener) on the cache
/// ([`radixkv::RadixCacheBuilder::listener`]).
///
/// Each socket sends, first, a batch with `AllBlocksCleared` (a router
/// that kept state from an earlier run drops it), with a sequence number
/// taken from the wall clock (microseconds since the epoch), so that it is
/// above any earlier run's; then one batch per flush, numbered one more
/// each. The host tier's pages appear on every socket with medium `CPU`.
#[derive(Debug)]
pub struct KvEventPublisher {
    shared: Arc<Shared>,
    endpoints: Vec<String>,
    replay_endpoints: Vec<String>,
    tasks: Vec<JoinHandle<()>>,
}

fn frames(parts: Vec<Bytes>) -> ZmqMessage {
    // Never empty: every caller passes at least two frames.
    ZmqMessage::try_from(parts).unwrap_or_else(|_| ZmqMessage::from(Bytes::new()))
}

fn unix_now() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
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
            node_ids: NodeIds::new(),
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
                let c = &q.counters;
                // Relaxed: statistics.
                SocketStats {
                    batches: c.batches.load(Ordering::Relaxed),
                    events: c.events.load(Ordering::Relaxed),
                    dropped_events: c.dropped.load(Ordering::Relaxed),
                    replays: c.replays.load(Ordering::Relaxed),
                    last_seq: c.last_seq.load(Ordering::Relaxed),
                    queued: c.queued.load(Ordering::Relaxed),
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

async fn publish_loop(
    shared: Arc<Shared>,
    d: usize,
    mut socket: zeromq::PubSocket,
    cfg: KvEventsConfig,
    first_seq: u64,
) {
    let q = &shared.queues[d];
    let topic = Bytes::from(cfg.topic.clone().into_bytes());
    let mut seq = first_seq;
    let keep_replays = cfg.replay_endpoint.is_some() && cfg.replay_buffer > 0;
    // Counts `events` sent as `seq` and returns its three frames.
    let send = |payload: Vec<u8>, events: usize, seq: u64| {
        let payload = Bytes::from(payload);
        if keep_replays {
            let mut replay = lock(&q.replay);
            let (buf, bytes) = &mut *replay;
            *bytes += payload.len();
            buf.push_back((seq, payload.clone()));
            while buf.len() > cfg.replay_buffer.max(1)
                || (*bytes > cfg.replay_bytes && buf.len() > 1)
            {
                if let Some((_, old)) = buf.pop_front() {
                    *bytes -= old.len();
                }
            }
        }
        // Relaxed: statistics.
        q.counters.batches.fetch_add(1, Ordering::Relaxed);
        q.counters
            .events
            .fetch_add(events as u64, Ordering::Relaxed);
        q.counters.last_seq.store(seq, Ordering::Relaxed);
        frames(vec![
            topic.clone(),
            Bytes::copy_from_slice(&seq.to_be_bytes()),
            payload,
        ])
    };
    let rank = Some(d as u32);
    // The first event counts as queued, as every later one (flush compares).
    // Relaxed: a statistic.
    q.counters.queued.fetch_add(1, Ordering::Relaxed);
    let mut b = BatchEncoder::new(unix_now().as_secs_f64(), 1, cfg.encoding);
    b.push(EventRef::AllBlocksCleared);
    let first = send(b.finish(rank), 1, seq);
    let _ = socket.send(first).await;
    let mut spare = Changes::default();
    let mut ids = Vec::new();
    loop {
        q.notify.notified().await;
        if !shared.closing.load(Ordering::SeqCst) {
            // Let a burst gather into one batch, for at most max_delay.
            tokio::time::sleep(cfg.max_delay).await;
        }
        std::mem::swap(&mut *lock(&q.pending), &mut spare);
        let n = spare.heads.len();
        if n > 0 {
            // Room for the new tokens (at most 5 bytes each) and ids (9).
            let bytes = 64 + n * 96 + spare.ids.len() * 9 + {
                let new: usize = spare
                    .heads
                    .iter()
                    .map(|h| match h.kind {
                        HeadKind::Path { start } => h.len - start,
                        HeadKind::Own { .. } => h.len,
                        HeadKind::Ids => 0,
                    })
                    .sum();
                new * 6
            };
            let mut b =
                BatchEncoder::with_capacity(unix_now().as_secs_f64(), n, cfg.encoding, bytes);
            for h in &spare.heads {
                shared.encode(&mut b, h, &spare, &mut ids);
            }
            spare.clear();
            seq += 1;
            let msg = send(b.finish(rank), n, seq);
            // PUB never blocks on a slow subscriber: it drops past the
            // high-water mark.
            let _ = socket.send(msg).await;
        }
        if shared.closing.load(Ordering::SeqCst) {
            return;
        }
    }
}

/// Answers `[identity, "", start_seq]` with every buffered batch from
/// `start_seq` on, `[identity, "", seq, payload]` each, then the end marker
/// `[identity, "", -1, ""]` (vLLM's replay protocol).
async fn replay_loop(shared: Arc<Shared>, d: usize, mut socket: zeromq::RouterSocket) {
    let q = &shared.queues[d];
    loop {
        let Ok(msg) = socket.recv().await else {
            return;
        };
        let parts = msg.into_vec();
        let (Some(identity), Some(last)) = (parts.first().cloned(), parts.last()) else {
            continue;
        };
        let Ok(start) = <[u8; 8]>::try_from(last.as_ref()) else {
            continue; // not a replay request
        };
        let start = u64::from_be_bytes(start);
        let batches: Vec<(u64, Bytes)> = lock(&q.replay)
            .0
            .iter()
            .filter(|(s, _)| *s >= start)
            .cloned()
            .collect();
        // Relaxed: a statistic.
        q.counters.replays.fetch_add(1, Ordering::Relaxed);
        for (s, payload) in batches {
            let m = frames(vec![
                identity.clone(),
                Bytes::new(),
                Bytes::copy_from_slice(&s.to_be_bytes()),
                payload,
            ]);
            if socket.send(m).await.is_err() {
                break;
            }
        }
        let end = frames(vec![
            identity,
            Bytes::new(),
            Bytes::copy_from_slice(&(-1i64).to_be_bytes()),
            Bytes::new(),
        ]);
        let _ = socket.send(end).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_parse_and_step_by_device() {
        assert_eq!(
            device_endpoints("tcp://127.0.0.1:5557", 2).unwrap(),
            ["tcp://127.0.0.1:5557", "tcp://127.0.0.1:5558"]
        );
        assert_eq!(
            device_endpoints("tcp://*:5557", 1).unwrap(),
            ["tcp://0.0.0.0:5557"]
        );
        for bad in [
            "127.0.0.1:5557",
            "tcp://127.0.0.1",
            "tcp://:5557",
            "tcp://h:port",
            "tcp://h:0",
            "ipc:///tmp/x",
        ] {
            assert!(
                matches!(device_endpoints(bad, 1), Err(EventsError::Endpoint { .. })),
                "{bad}"
            );
        }
        let e = device_endpoints("tcp://h:65535", 2)
            .unwrap_err()
            .to_string();
        assert!(e.contains("device 1 would need port 65536"), "{e}");
    }
}
