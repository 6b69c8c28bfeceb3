//! The publisher: a [`CacheListener`] that queues each device's events and
//! tokio tasks that send them, in batches, on one ZeroMQ PUB socket per
//! device (and answer replays on an optional ROUTER socket per device).
//!
//! What the cache's thread does per change is one short locked push: a
//! 32-byte head, and for a store the node's own pages. Block ids are
//! computed by the device's socket task, which remembers each resident
//! node's ids: a store is chained from its parent's last id, a removal
//! names the ids remembered for its node, and a split (reported by the
//! cache, see [`radixkv::events`]) divides them. That memory is bounded by
//! what the tiers hold (about 60 bytes per node plus 8 per page;
//! [`SocketStats::remembered_nodes`]) and goes with the cache.

use crate::wire::{self, BatchEncoder, Encoding, EventRef, Medium};
use bytes::Bytes;
use radixkv::events::{CacheListener, PageEvent, SplitEvent};
use radixkv::{Tier, TokenKey};
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
    /// Events not sent: the queue held [`KvEventsConfig::max_pending`]
    /// (or, after such a drop, a removal of the dropped node or a store of
    /// its child, whose block ids cannot be known).
    pub dropped_events: u64,
    /// Replay requests answered.
    pub replays: u64,
    /// The last sequence number sent.
    pub last_seq: u64,
    /// Events handed to the queue (sent, dropped or still queued).
    pub queued: u64,
    /// Nodes whose block ids the socket's task remembers (for their
    /// children's stores and their removals): about 60 bytes plus 8 per
    /// page each, bounded by what the device (and the host tier) holds.
    pub remembered_nodes: u64,
}

#[derive(Debug, Default)]
struct Counters {
    batches: AtomicU64,
    events: AtomicU64,
    dropped: AtomicU64,
    replays: AtomicU64,
    last_seq: AtomicU64,
    queued: AtomicU64,
    remembered: AtomicU64,
}

/// One queued change, in 32 bytes (two to a cache line: the cache's thread
/// writes one per change into lines the socket's task read last, and each
/// new line costs a transfer from the other core). A store's own pages
/// follow the previous stores' in `Changes::tokens`.
#[derive(Clone, Copy, Debug)]
struct Head {
    node: u64,
    /// A store's parent (unless `at_root`), a split's prefix node.
    other: u64,
    /// A store's tokens, a split's moved tokens.
    len: u32,
    /// The sink's tag: node ids are unique within one cache only.
    tag: u32,
    /// 1 + the index of the namespace in `Changes::namespaces`; 0: none.
    namespace: u32,
    kind: Kind,
    host: bool,
    at_root: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Stored,
    Removed,
    Split,
    Cleared,
    Forget,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    /// The node's pages became resident, chained from `parent`'s last
    /// block id (`None`: the parent is a namespace root).
    Stored { parent: Option<u64> },
    /// The node's pages left the tier.
    Removed,
    /// The node's first `moved` tokens became node `prefix`: what is
    /// remembered of the node is divided (no event).
    Split { prefix: u64, moved: u32 },
    /// The sink's cache was dropped: `AllBlocksCleared` if it is the only
    /// one this socket has published for, else a removal of each of its
    /// nodes; its nodes are forgotten.
    Cleared,
    /// The sink is gone: its nodes are forgotten (no event).
    Forget,
}

impl Kind {
    /// Whether subscribers see it (counted as queued, sent or dropped).
    fn is_event(self) -> bool {
        matches!(self, Kind::Stored | Kind::Removed | Kind::Cleared)
    }
}

impl Op {
    fn kind(self) -> Kind {
        match self {
            Op::Stored { .. } => Kind::Stored,
            Op::Removed => Kind::Removed,
            Op::Split { .. } => Kind::Split,
            Op::Cleared => Kind::Cleared,
            Op::Forget => Kind::Forget,
        }
    }
}

impl Head {
    fn op(&self) -> Op {
        match self.kind {
            Kind::Stored => Op::Stored {
                parent: (!self.at_root).then_some(self.other),
            },
            Kind::Removed => Op::Removed,
            Kind::Split => Op::Split {
                prefix: self.other,
                moved: self.len,
            },
            Kind::Cleared => Op::Cleared,
            Kind::Forget => Op::Forget,
        }
    }
}

/// A device's queued changes, as the listener leaves them: a head per
/// change and a store's own pages copied into one flat buffer (hashed into
/// block ids by the socket's task, off the cache's locked section). The
/// task swaps the whole queue for an empty one of the same capacity and
/// hands that back after sending, so in a steady state queueing allocates
/// and frees nothing (a free on another thread than the allocation's, per
/// event, cost more than the insert it reported).
#[derive(Debug, Default)]
struct Changes {
    heads: Vec<Head>,
    tokens: Vec<u32>,
    /// Events handed to this queue, and those of them dropped.
    events: u64,
    dropped: u64,
    /// The namespaces the heads name (a run of changes in one namespace
    /// shares one entry).
    namespaces: Vec<Arc<str>>,
}

impl Changes {
    /// Asks the CPU for the lines the next change will write, with intent
    /// to write: its head, and as many tokens as this change had (and a
    /// line more; 4 KiB at most). The socket's task read those lines last,
    /// on another core, and a write to a line another core holds has to
    /// fetch it first; the lock's release after the write then waits for
    /// that. Fetched now, they arrive while the cache does the rest of this
    /// insert and the next (measured: the insert ratio went from 1.09–1.10
    /// to 1.05–1.06 in the overhead bench).
    fn prepare_next(&self, tokens: usize) {
        if self.heads.len() < self.heads.capacity() {
            prefetch_for_write(self.heads.as_ptr_range().end.cast());
        }
        let free = self.tokens.capacity() - self.tokens.len();
        let end = self.tokens.as_ptr_range().end;
        // 16 tokens to a 64-byte line.
        for at in (0..free.min(tokens + 16).min(1024)).step_by(16) {
            prefetch_for_write(end.wrapping_add(at).cast());
        }
    }

    fn clear(&mut self) {
        self.heads.clear();
        self.tokens.clear();
        self.namespaces.clear();
        self.events = 0;
        self.dropped = 0;
    }

    /// Queues a change (a store's `pages` are under 2^32 tokens: the
    /// caller checks).
    fn push(
        &mut self,
        op: Op,
        (host, tag, node): (bool, u32, u64),
        namespace: Option<&str>,
        pages: &[u32],
    ) {
        let namespace = match namespace {
            None => 0,
            Some(n) => {
                if self.namespaces.last().is_none_or(|last| **last != *n) {
                    self.namespaces.push(Arc::from(n));
                }
                self.namespaces.len() as u32
            }
        };
        let kind = op.kind();
        let (other, len, at_root) = match op {
            Op::Stored { parent } => (parent.unwrap_or(0), pages.len() as u32, parent.is_none()),
            Op::Split { prefix, moved } => (prefix, moved, false),
            Op::Removed | Op::Cleared | Op::Forget => (0, 0, false),
        };
        if kind == Kind::Stored {
            self.tokens.extend_from_slice(pages);
        }
        self.heads.push(Head {
            node,
            other,
            len,
            tag,
            namespace,
            kind,
            host,
            at_root,
        });
    }

    fn namespace(&self, h: &Head) -> Option<&Arc<str>> {
        (h.namespace as usize)
            .checked_sub(1)
            .and_then(|i| self.namespaces.get(i))
    }
}

/// Asks the CPU to fetch the cache line at `p` for writing (a hint: a
/// no-op off x86-64).
#[inline]
fn prefetch_for_write(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `_mm_prefetch` is a hint: it reads and writes nothing the
    // program sees and never faults, whatever the address. SSE is part of
    // the x86-64 baseline, so the instruction exists (a CPU without
    // PREFETCHW runs the ET0 hint as a plain prefetch).
    unsafe {
        std::arch::x86_64::_mm_prefetch(p.cast::<i8>(), std::arch::x86_64::_MM_HINT_ET0)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// What one device's socket task remembers: per sink and tier, the block
/// ids of every node it has published as resident and not yet as removed.
/// A store is chained from its parent's last id and a removal names the
/// node's ids, so neither needs the node's path, and the cache's thread
/// does no lookup at all: the events reach the task in the cache's order
/// (a parent's store before its children's, a split between a node's
/// store and its removal; see `radixkv::events`), so the parent and the
/// node are always here. Bounded by what the tier holds: a removal takes
/// the node's entry, and a sink's cache going away forgets its nodes.
#[derive(Debug, Default)]
struct Remembered {
    /// (sink tag, its nodes): one sink per cache, a few at most.
    sinks: Vec<(u32, NodeIdMap)>,
}

/// (host tier?, node id) → the block ids of the node's pages.
type NodeIdMap = std::collections::HashMap<(bool, u64), Box<[u64]>, foldhash::fast::RandomState>;

impl Remembered {
    fn of(&mut self, tag: u32) -> &mut NodeIdMap {
        let i = match self.sinks.iter().position(|(t, _)| *t == tag) {
            Some(i) => i,
            None => {
                self.sinks.push((tag, NodeIdMap::default()));
                self.sinks.len() - 1
            }
        };
        &mut self.sinks[i].1
    }

    fn forget(&mut self, tag: u32) {
        self.sinks.retain(|(t, _)| *t != tag);
    }

    /// What is remembered of `tag`'s nodes, forgotten here.
    fn take(&mut self, tag: u32) -> NodeIdMap {
        match self.sinks.iter().position(|(t, _)| *t == tag) {
            Some(i) => self.sinks.swap_remove(i).1,
            None => NodeIdMap::default(),
        }
    }

    fn nodes(&self) -> usize {
        self.sinks.iter().map(|(_, m)| m.len()).sum()
    }
}

/// One device's queue and replay buffer.
#[derive(Debug, Default)]
struct DeviceQueue {
    pending: Mutex<Changes>,
    /// Whether the task waits for `notify` (it ticks on its own otherwise).
    parked: AtomicBool,
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
    /// The next sink's tag.
    next_tag: std::sync::atomic::AtomicU32,
    index: Option<Mutex<std::collections::HashMap<u64, IndexedBlock>>>,
    page_size: usize,
    max_pending: usize,
    closing: AtomicBool,
}

impl Shared {
    /// Queues a change on `device`'s queue. An event past
    /// [`KvEventsConfig::max_pending`] is dropped and counted; a split or
    /// a forget never is (what the task remembers must follow the tree).
    fn push(
        &self,
        device: usize,
        op: Op,
        who: (bool, u32, u64),
        namespace: Option<&str>,
        pages: &[u32],
    ) {
        let Some(q) = self.queues.get(device) else {
            return;
        };
        let event = op.kind().is_event();
        // Counted under the queue's lock, with no atomic of their own (an
        // atomic read-modify-write per event waits for the event's writes
        // to leave the core): the task adds them to the socket's counters
        // when it takes the queue.
        let mut p = lock(&q.pending);
        p.events += u64::from(event);
        // A node of 2^32 tokens or more (16 GiB of token ids) is not
        // published; nothing below it can be chained, so its children's
        // stores are dropped too, counted.
        if event && (p.heads.len() >= self.max_pending || u32::try_from(pages.len()).is_err()) {
            p.dropped += 1;
            return;
        }
        let first = p.heads.is_empty();
        p.push(op, who, namespace, pages);
        p.prepare_next(pages.len());
        drop(p);
        // The task ticks every max_delay while changes come, and parks only
        // after a run of empty ticks: only then does a change wake it (a
        // wake-up of a parked runtime thread is a system call, several
        // times an insert's cost). SeqCst: with the task's SeqCst store of
        // `parked` before it looks at the queue once more under the lock,
        // either that look sees this change or this load sees `parked`.
        if first && q.parked.load(Ordering::SeqCst) {
            q.notify.notify_one();
        }
    }

    /// Queues a change of `host`'s tier or `device` (`sink`: the device a
    /// one-device cache stands for). The host tier is shared: every
    /// device can load its pages, so every device's socket reports them
    /// (medium CPU).
    fn fan_out(
        &self,
        tier: Tier,
        sink: Option<usize>,
        op: Op,
        who: (u32, u64),
        namespace: Option<&str>,
        pages: &[u32],
    ) {
        let who = (tier.is_host(), who.0, who.1);
        match tier {
            Tier::Host => {
                for d in 0..self.queues.len() {
                    self.push(d, op, who, namespace, pages);
                }
            }
            Tier::Device(device) => {
                self.push(sink.unwrap_or(device.index()), op, who, namespace, pages)
            }
        }
    }

    /// Appends `h`'s events to `b` and keeps what the task remembers
    /// (`mem`) and the block index (`ids`: a reused buffer); returns how
    /// many events it wrote. None for a split or a forget, or for an event
    /// whose node (or parent) the task does not know because its store was
    /// dropped at a full queue (counted as dropped by the caller); several
    /// for a cleared cache that shared this socket with another.
    fn encode(
        &self,
        b: &mut BatchEncoder,
        (h, pages): (&Head, &[u32]),
        q: &Changes,
        mem: &mut Remembered,
        ids: &mut Vec<u64>,
    ) -> usize {
        let ps = self.page_size.max(1);
        let namespace = q.namespace(h);
        match h.op() {
            Op::Forget => {
                mem.forget(h.tag);
                0
            }
            Op::Cleared => {
                let alone = mem.sinks.iter().all(|(t, m)| *t == h.tag || m.is_empty());
                let nodes = mem.take(h.tag);
                for ids in nodes.values() {
                    self.index_removed(ids);
                }
                if alone {
                    b.push(EventRef::AllBlocksCleared);
                    return 1;
                }
                for ((host, _), ids) in &nodes {
                    b.push(EventRef::BlockRemoved {
                        block_hashes: ids,
                        medium: medium(*host),
                    });
                }
                nodes.len()
            }
            Op::Split { prefix, moved } => {
                let nodes = mem.of(h.tag);
                if let Some(all) = nodes.get_mut(&(h.host, h.node)) {
                    let cut = moved as usize / ps;
                    if cut > 0 && cut < all.len() {
                        let first: Box<[u64]> = all[..cut].into();
                        *all = all[cut..].into();
                        nodes.insert((h.host, prefix), first);
                    }
                }
                0
            }
            Op::Stored { parent } => {
                let nodes = mem.of(h.tag);
                let before = match parent {
                    None => None,
                    Some(p) => match nodes.get(&(h.host, p)).and_then(|i| i.last()) {
                        Some(&id) => Some(id),
                        None => return 0,
                    },
                };
                wire::chain_ids_into(before, namespace.map(|n| &**n), pages, ps, ids);
                nodes.insert((h.host, h.node), ids.as_slice().into());
                if let Some(index) = &self.index {
                    let mut index = lock(index);
                    for (i, &id) in ids.iter().enumerate() {
                        index
                            .entry(id)
                            .or_insert_with(|| IndexedBlock {
                                parent: if i == 0 { before } else { Some(ids[i - 1]) },
                                tokens: pages[i * ps..(i + 1) * ps].into(),
                                namespace: namespace.cloned(),
                                refs: 0,
                            })
                            .refs += 1;
                    }
                }
                let (lora_name, cache_salt) =
                    namespace.map_or((None, None), |n| TokenKey::namespace_parts(n));
                b.push(EventRef::BlockStored {
                    parent_block_hash: before,
                    block_hashes: ids,
                    token_ids: pages,
                    block_size: ps,
                    medium: medium(h.host),
                    lora_name,
                    cache_salt,
                });
                1
            }
            Op::Removed => {
                let Some(known) = mem.of(h.tag).remove(&(h.host, h.node)) else {
                    return 0;
                };
                self.index_removed(&known);
                b.push(EventRef::BlockRemoved {
                    block_hashes: &known,
                    medium: medium(h.host),
                });
                1
            }
        }
    }

    /// Takes a removal of blocks `ids` into the block index.
    fn index_removed(&self, ids: &[u64]) {
        if let Some(index) = &self.index {
            let mut index = lock(index);
            for id in ids {
                if let Some(b) = index.get_mut(id) {
                    b.refs -= 1;
                    if b.refs == 0 {
                        index.remove(id);
                    }
                }
            }
        }
    }
}

/// The medium of a tier's events.
fn medium(host: bool) -> Medium {
    if host {
        Medium::Cpu
    } else {
        Medium::Gpu
    }
}

/// The [`CacheListener`] of a [`KvEventPublisher`]: converts residency
/// changes into KV events on the right device's queue. When the cache it
/// is installed on is dropped, its blocks are cleared on every socket (see
/// [`KvEventPublisher`]) and the publisher forgets its nodes.
#[derive(Debug)]
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
        // A store's location is the insert's own key: no climb.
        let loc = e.location();
        let namespace = loc.as_ref().and_then(|l| l.namespace.as_deref());
        let parent = (!e.at_root).then_some(e.parent);
        self.shared.fan_out(
            e.tier,
            self.device,
            Op::Stored { parent },
            (self.tag, e.node),
            namespace,
            e.pages(),
        );
    }

    fn removed(&self, e: &PageEvent<'_>) {
        // The node's ids are remembered by the task: nothing to read.
        self.shared.fan_out(
            e.tier,
            self.device,
            Op::Removed,
            (self.tag, e.node),
            None,
            &[],
        );
    }

    fn cleared(&self) {
        // Every socket: the host tier's pages are on all of them.
        self.every_queue(Op::Cleared);
    }

    fn split(&self, e: &SplitEvent) {
        self.shared.fan_out(
            e.tier,
            self.device,
            Op::Split {
                prefix: e.prefix,
                // A node's tokens fit (see `push`); a larger split moves
                // nothing of what is remembered.
                moved: u32::try_from(e.moved).unwrap_or(0),
            },
            (self.tag, e.node),
            None,
            &[],
        );
    }
}

impl EventSink {
    /// Every device queue, in order.
    fn every_queue(&self, op: Op) {
        for d in 0..self.shared.queues.len() {
            self.shared.push(d, op, (false, self.tag, 0), None, &[]);
        }
    }
}

impl Drop for EventSink {
    fn drop(&mut self) {
        // A sink whose cache was never built or was cleared already: what
        // is left of it (nothing, usually) is forgotten.
        self.every_queue(Op::Forget);
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
    let mut b = BatchEncoder::new(unix_now().as_secs_f64(), cfg.encoding);
    b.push(EventRef::AllBlocksCleared);
    let first = send(b.finish(rank), 1, seq);
    let _ = socket.send(first).await;
    let mut spare = Changes::default();
    let mut ids = Vec::new();
    let mut mem = Remembered::default();
    let mut idle = 0;
    loop {
        let closing = shared.closing.load(Ordering::SeqCst);
        if !closing {
            // Let a burst gather into one batch, for at most max_delay.
            tokio::time::sleep(cfg.max_delay).await;
        }
        {
            let mut p = lock(&q.pending);
            std::mem::swap(&mut *p, &mut spare);
            // Under the lock (see `stats`). Relaxed: statistics, ordered by
            // the lock.
            q.counters.queued.fetch_add(spare.events, Ordering::Relaxed);
            q.counters
                .dropped
                .fetch_add(spare.dropped, Ordering::Relaxed);
        }
        if spare.heads.is_empty() {
            if closing {
                return;
            }
            idle += 1;
            if idle >= IDLE_TICKS {
                // Park: say so, then look once more (see `Shared::push`). A
                // wake-up that comes before the wait is kept by `Notify`.
                q.parked.store(true, Ordering::SeqCst);
                if lock(&q.pending).heads.is_empty() {
                    q.notify.notified().await;
                }
                q.parked.store(false, Ordering::SeqCst);
                idle = 0;
            }
            continue;
        }
        idle = 0;
        // Event heads queued (those dropped at the push have none).
        let n = (spare.events - spare.dropped) as usize;
        // Room for the tokens (at most 5 bytes each) and the ids (9 each,
        // one per page).
        let pages = spare.tokens.len() / shared.page_size.max(1);
        let bytes = 64 + n * 96 + spare.tokens.len() * 5 + pages * 9;
        let mut b = BatchEncoder::with_capacity(unix_now().as_secs_f64(), cfg.encoding, bytes);
        // Events written, event heads that wrote none, and events beyond
        // one per head (a cleared cache's removals, counted as queued).
        let (mut sent, mut lost, mut extra, mut at) = (0, 0, 0, 0);
        for h in &spare.heads {
            // A store's pages follow the previous stores'.
            let pages = if h.kind == Kind::Stored {
                at += h.len as usize;
                &spare.tokens[at - h.len as usize..at]
            } else {
                &[]
            };
            let written = shared.encode(&mut b, (h, pages), &spare, &mut mem, &mut ids);
            if h.kind.is_event() {
                lost += usize::from(written == 0);
                extra += written.saturating_sub(1);
            }
            sent += written;
        }
        spare.clear();
        // Relaxed: statistics (`queued` first, so that `flush` never sees
        // more sent than queued).
        q.counters.queued.fetch_add(extra as u64, Ordering::Relaxed);
        q.counters.dropped.fetch_add(lost as u64, Ordering::Relaxed);
        q.counters
            .remembered
            .store(mem.nodes() as u64, Ordering::Relaxed);
        if sent > 0 {
            seq += 1;
            let msg = send(b.finish(rank), sent, seq);
            // PUB never blocks on a slow subscriber: it drops past the
            // high-water mark.
            let _ = socket.send(msg).await;
        }
        if closing {
            return;
        }
    }
}

/// Empty ticks (of `max_delay` each) before a socket's task parks.
const IDLE_TICKS: u32 = 16;

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
