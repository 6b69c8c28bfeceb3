//! The prefix cache: match, pin, insert and evict token prefixes, per device.
//!
//! See [`RadixCache`] for the operations and their concurrency guarantees.

#[cfg(not(loom))]
mod evictor;
mod policy;
mod request;

#[cfg(not(loom))]
pub use evictor::{Evictor, EvictorStats};
pub use policy::{EvictionPolicy, UnknownPolicy};
pub use request::Request;

use crate::alloc::{AllocError, PageAllocator, PageSpan};
use crate::device::DeviceId;
use crate::sync::{Arc, AtomicU64, Ordering};
use crate::tree::node::{arc_of, Node};
use crate::tree::residency::PinRefused;
use crate::tree::{clock::Clock, is_candidate, is_leaf_on, End, Tree};
use crossbeam_utils::CachePadded;
use policy::LeafStats;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::ops::Range;

/// A key: token ids plus an optional namespace (SGLang's `extra_key`: a
/// LoRA id, cache salt or tenant). Keys in different namespaces never share
/// cached prefixes; namespace `None` and `Some("")` are different.
///
/// ```
/// use radixkv::TokenKey;
/// let k = TokenKey::new(&[1, 2, 3]).with_namespace("tenant-a");
/// assert_eq!(k.tokens(), &[1, 2, 3]);
/// assert_eq!(k.namespace(), Some("tenant-a"));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TokenKey<'a> {
    tokens: &'a [u32],
    namespace: Option<&'a str>,
}

impl<'a> TokenKey<'a> {
    /// A key in the default namespace (`None`).
    pub fn new(tokens: &'a [u32]) -> Self {
        TokenKey {
            tokens,
            namespace: None,
        }
    }

    /// The same tokens in namespace `ns`.
    pub fn with_namespace(self, ns: &'a str) -> Self {
        TokenKey {
            namespace: Some(ns),
            ..self
        }
    }

    /// The same tokens in namespace `ns` (which may be `None`).
    pub fn in_namespace(self, ns: Option<&'a str>) -> Self {
        TokenKey {
            namespace: ns,
            ..self
        }
    }

    /// The token ids.
    pub fn tokens(&self) -> &'a [u32] {
        self.tokens
    }

    /// The namespace.
    pub fn namespace(&self) -> Option<&'a str> {
        self.namespace
    }
}

impl<'a> From<&'a [u32]> for TokenKey<'a> {
    fn from(tokens: &'a [u32]) -> Self {
        TokenKey::new(tokens)
    }
}

/// Where access and creation stamps come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ClockKind {
    /// A counter per device: stamps never tie (what SGLang's conformance
    /// vectors assume). One relaxed `fetch_add` on the device's own counter
    /// per operation.
    #[default]
    Logical,
    /// Monotonic nanoseconds; ties are broken by creation stamp, then node id.
    #[cfg(not(loom))]
    Monotonic,
}

/// Errors of cache operations. Every error leaves the cache unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CacheError {
    /// An insert key whose length is not a multiple of the page size.
    #[error("key of {len} tokens is not a multiple of the page size {page_size}")]
    Unaligned {
        /// Key length in tokens.
        len: usize,
        /// The cache's page size.
        page_size: usize,
    },
    /// An insert whose values do not match its tokens one to one.
    #[error("{values} values for {tokens} tokens")]
    LengthMismatch {
        /// Key length in tokens.
        tokens: usize,
        /// Number of values given.
        values: usize,
    },
    /// A device outside `0..devices`.
    #[error("{device} does not exist (the cache has {devices} devices)")]
    UnknownDevice {
        /// The device asked for.
        device: DeviceId,
        /// How many devices the cache has.
        devices: usize,
    },
    /// A handle whose node left the tree on its device (evicted, possibly
    /// re-inserted since).
    #[error("stale handle: the matched node left the tree on {0}")]
    StaleHandle(DeviceId),
    /// A handle made by another cache.
    #[error("the handle belongs to another cache")]
    ForeignHandle,
    /// 2^32 - 1 leases on one node and device.
    #[error("too many leases on one node")]
    PinOverflow,
    /// A builder setting out of range.
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// An unknown eviction policy name.
    #[error(transparent)]
    UnknownPolicy(#[from] UnknownPolicy),
    /// The device's allocator could not serve the request.
    #[error(transparent)]
    Alloc(#[from] AllocError),
    /// A page operation on a cache built without allocators
    /// (`RadixCacheBuilder::pages_per_device`).
    #[error("this cache has no page allocators (external-value mode)")]
    NoAllocator,
    /// A plain-values insert on a cache that owns its pages: use
    /// `insert_pages`.
    #[error("this cache owns its pages: insert a PageSpan with insert_pages")]
    ValuesOwnedByCache,
    /// A span of another device or another cache's allocator.
    #[error("the span belongs to another device or cache")]
    ForeignSpan,
}

/// Builds a [`RadixCache`]; every option has a default.
///
/// ```
/// use radixkv::{RadixCache, EvictionPolicy};
/// let cache = RadixCache::builder()
///     .page_size(16)                       // default 1
///     .devices(4)                          // default 1
///     .eviction_policy(EvictionPolicy::Lru) // default lru
///     .build()
///     .unwrap();
/// assert_eq!(cache.page_size(), 16);
/// assert!(RadixCache::builder().page_size(0).build().is_err());
/// ```
#[derive(Clone, Debug)]
pub struct RadixCacheBuilder {
    page_size: usize,
    devices: usize,
    policy: EvictionPolicy,
    clock: ClockKind,
    pages_per_device: Option<usize>,
    watermarks: Option<(usize, usize)>,
    replica_aware: bool,
}

/// The largest supported page size in tokens.
pub const MAX_PAGE_SIZE: usize = 1 << 16;
/// The largest supported number of devices.
pub const MAX_DEVICES: usize = 1024;

impl Default for RadixCacheBuilder {
    fn default() -> Self {
        RadixCacheBuilder {
            page_size: 1,
            devices: 1,
            policy: EvictionPolicy::Lru,
            clock: ClockKind::Logical,
            pages_per_device: None,
            watermarks: None,
            replica_aware: false,
        }
    }
}

impl RadixCacheBuilder {
    /// Tokens per page (default 1; `1..=MAX_PAGE_SIZE`). Keys are matched
    /// and stored in whole pages.
    pub fn page_size(mut self, n: usize) -> Self {
        self.page_size = n;
        self
    }

    /// Number of devices (default 1; `1..=MAX_DEVICES`).
    pub fn devices(mut self, n: usize) -> Self {
        self.devices = n;
        self
    }

    /// Eviction order (default [`EvictionPolicy::Lru`]).
    pub fn eviction_policy(mut self, p: EvictionPolicy) -> Self {
        self.policy = p;
        self
    }

    /// Stamp source (default [`ClockKind::Logical`]).
    pub fn clock(mut self, c: ClockKind) -> Self {
        self.clock = c;
        self
    }

    /// Gives every device a page allocator of `pages` pages (page 0
    /// reserved) of `page_size` slots, and makes the cache own its pages:
    /// requests allocate [`PageSpan`]s, [`RadixCache::insert_pages`] hands
    /// them to the tree (returning duplicates to the allocator) and eviction
    /// returns pages to the allocator. Default: none (external-value mode,
    /// where values are whatever the caller inserts).
    pub fn pages_per_device(mut self, pages: usize) -> Self {
        self.pages_per_device = Some(pages);
        self
    }

    /// Low and high watermarks in free pages per device (with
    /// [`pages_per_device`](Self::pages_per_device)): when an allocation
    /// takes a device below `low`, the background evictor
    /// ([`RadixCache::start_evictor`]) evicts until `high` pages are free.
    /// Default: none. Suggested: about 2 % and 5 % of the pages.
    pub fn watermarks(mut self, low: usize, high: usize) -> Self {
        self.watermarks = Some((low, high));
        self
    }

    /// Replica-aware eviction (default off): among the next few candidates
    /// in policy order (up to 8), evict first a leaf whose tokens are also
    /// resident on another device, so that the fleet keeps one copy of a
    /// prefix longer than it keeps a second. Needs a policy ranked by a
    /// candidate heap (every policy but mru and filo; with those it has no
    /// effect) and matters only with two or more devices.
    ///
    /// ```
    /// use radixkv::{DeviceId, RadixCache, TokenKey};
    /// let c = RadixCache::builder().devices(2).replica_aware(true).build().unwrap();
    /// c.insert(TokenKey::new(&[1, 1]), DeviceId(0), &[1, 2], 0).unwrap(); // older
    /// c.insert(TokenKey::new(&[2, 2]), DeviceId(0), &[3, 4], 0).unwrap();
    /// c.insert(TokenKey::new(&[2, 2]), DeviceId(1), &[3, 4], 0).unwrap(); // a replica
    /// // lru alone would evict [1, 1]; its only copy is kept instead:
    /// assert_eq!(c.evict(DeviceId(0), 2).unwrap().values, vec![3, 4]);
    /// ```
    pub fn replica_aware(mut self, on: bool) -> Self {
        self.replica_aware = on;
        self
    }

    /// Validates the settings and builds the cache.
    pub fn build(self) -> Result<RadixCache, CacheError> {
        if self.page_size == 0 || self.page_size > MAX_PAGE_SIZE {
            return Err(CacheError::InvalidConfig(format!(
                "page size {} is outside 1..={MAX_PAGE_SIZE}",
                self.page_size
            )));
        }
        if self.devices == 0 || self.devices > MAX_DEVICES {
            return Err(CacheError::InvalidConfig(format!(
                "{} devices is outside 1..={MAX_DEVICES}",
                self.devices
            )));
        }
        let clock = match self.clock {
            ClockKind::Logical => Clock::logical(self.devices),
            #[cfg(not(loom))]
            ClockKind::Monotonic => Clock::monotonic(),
        };
        // Relaxed suffices: cache ids only need to be unique. A plain std
        // atomic (not the shim's) because it is a process-wide static, not
        // part of any protocol.
        static NEXT_CACHE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let (signal_tx, signal_rx) = std::sync::mpsc::channel::<usize>();
        let listener: Option<crate::alloc::WatermarkListener> =
            match (self.watermarks, self.pages_per_device) {
                (None, _) => None,
                (Some(_), None) => {
                    return Err(CacheError::InvalidConfig(
                        "watermarks need pages_per_device".into(),
                    ))
                }
                (Some((low, high)), Some(pages)) => {
                    if low >= high || high >= pages {
                        return Err(CacheError::InvalidConfig(format!(
                            "watermarks need low < high < pages ({low}, {high}, {pages})"
                        )));
                    }
                    let tx = std::sync::Mutex::new(signal_tx);
                    Some(Arc::new(move |d: DeviceId, _free: usize| {
                        if let Ok(tx) = tx.lock() {
                            let _ = tx.send(d.index());
                        }
                    }))
                }
            };
        let low = self.watermarks.map_or(0, |w| w.0);
        let allocators = match self.pages_per_device {
            None => Vec::new(),
            Some(pages) => (0..self.devices)
                .map(|d| {
                    PageAllocator::with_watermark(
                        DeviceId(d as u32),
                        pages,
                        self.page_size,
                        low,
                        listener.clone(),
                    )
                })
                .collect::<Result<Vec<_>, _>>()?,
        };
        Ok(RadixCache {
            watermarks: self.watermarks,
            evictor_signal: std::sync::Mutex::new(Some(signal_rx)),
            allocators,
            id: NEXT_CACHE.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            tree: Tree::new(
                self.page_size,
                self.devices,
                clock,
                self.policy.keys_only_grow(),
            ),
            candidates: (0..self.devices)
                .map(|_| crate::sync::Mutex::new(Candidates::default()))
                .collect(),
            policy: self.policy,
            replica_aware: self.replica_aware,
            leases: (0..self.devices)
                .map(|_| CachePadded::new(AtomicU64::new(0)))
                .collect(),
        })
    }
}

/// A pin on a matched prefix on one device: while it lives, the prefix's
/// values stay resident on that device, unchanged (I3). Dropping it
/// releases the pin. A lease on an empty match protects nothing.
#[derive(Debug)]
pub struct Lease {
    node: Option<Arc<Node>>,
    device: usize,
    counters: Arc<[CachePadded<AtomicU64>]>,
}

impl Lease {
    fn new(
        node: Option<Arc<Node>>,
        device: usize,
        counters: &Arc<[CachePadded<AtomicU64>]>,
    ) -> Self {
        if node.is_some() {
            counters[device].fetch_add(1, Ordering::SeqCst);
        }
        Lease {
            node,
            device,
            counters: Arc::clone(counters),
        }
    }

    /// The device the lease holds pages on.
    pub fn device(&self) -> DeviceId {
        DeviceId(self.device as u32)
    }

    /// Whether the lease protects nothing (the match was empty).
    pub fn is_empty(&self) -> bool {
        self.node.is_none()
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(n) = self.node.take() {
            // The node cannot have been freed: this lease holds an `Arc` to
            // it, and while pinned it cannot be unlinked. After the
            // decrement it may be evicted at once; nothing here touches it.
            n.dev(self.device).residency.unpin();
            self.counters[self.device].fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// A reference to the end node of a match that outlives the match: it can be
/// pinned later with [`RadixCache::pin`], which fails with
/// [`CacheError::StaleHandle`] if the node left the tree on that device in
/// between (generation-checked).
#[derive(Clone, Debug)]
pub struct NodeHandle {
    cache: u64,
    node: Option<Arc<Node>>,
    device: usize,
    generation: u64,
}

impl NodeHandle {
    /// Whether the match ended at the root (matched nothing).
    pub fn is_root(&self) -> bool {
        self.node.is_none()
    }

    /// The device of the match.
    pub fn device(&self) -> DeviceId {
        DeviceId(self.device as u32)
    }
}

/// The result of a match on one device.
#[derive(Debug)]
pub struct MatchResult {
    /// Tokens of the key resident on the asked device (a multiple of the
    /// page size).
    pub len: usize,
    /// The values of those tokens; filled only by [`RadixCache::match_and_pin`].
    pub values: Vec<u32>,
    /// The pin, for [`RadixCache::match_and_pin`].
    pub lease: Option<Lease>,
    /// The end node, to pin later.
    pub handle: NodeHandle,
    /// The longest prefix resident on any device…
    pub any_len: usize,
    /// …and the device holding it (the asked device when it ties).
    pub any_device: Option<DeviceId>,
}

/// What an insert did with the caller's values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InsertResult {
    /// Leading tokens that were already cached on the device (SGLang's
    /// return value). The caller's values for `0..prefix_len` are duplicates.
    pub prefix_len: usize,
    /// Ranges of the caller's values the cache now owns. Without concurrent
    /// writers on the same prefix this is `prefix_len..len` (or nothing).
    pub adopted: Vec<Range<usize>>,
    len: usize,
}

impl InsertResult {
    /// The result of an insert of `len` tokens in which the tree adopted
    /// `adopted`: `prefix_len` is where the first adopted range starts.
    pub(crate) fn from_adopted(adopted: Vec<Range<usize>>, len: usize) -> Self {
        InsertResult {
            prefix_len: adopted.first().map_or(len, |r| r.start),
            adopted,
            len,
        }
    }

    /// Ranges of the caller's values that the cache did **not** take (the
    /// caller frees them): `0..prefix_len`, plus, when another scheduler
    /// inserted the same new prefix at the same moment, the ranges it won.
    pub fn duplicates(&self) -> Vec<Range<usize>> {
        let mut out = Vec::new();
        let mut at = 0;
        let mut adopted = self.adopted.clone();
        adopted.sort_by_key(|r| r.start);
        for r in adopted {
            if r.start > at {
                out.push(at..r.start);
            }
            at = r.end;
        }
        if at < self.len {
            out.push(at..self.len);
        }
        out
    }
}

/// What an eviction freed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Evicted {
    /// Tokens evicted (whole leaves, so possibly more than asked).
    pub tokens: usize,
    /// Leaves evicted.
    pub leaves: usize,
    /// Their values, in eviction order (external-value mode; empty when the
    /// cache owns its pages, which it has already returned).
    pub values: Vec<u32>,
    /// Pages returned to the device's allocator (when the cache owns its
    /// pages).
    pub pages: usize,
    /// Candidates the call looked at: newly inserted leaves taken in, heap
    /// entries popped, or, for the policies that rank by a scan (mru,
    /// filo), every leaf of the device. A measure of the call's work.
    pub examined: usize,
}

/// Cached token counts on one device.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sizes {
    /// Tokens that eviction may take now.
    pub evictable: usize,
    /// Tokens on a pinned node's path.
    pub protected: usize,
    /// All tokens resident on the device.
    pub total: usize,
    /// Nodes resident on the device.
    pub nodes: usize,
}

/// A node in a candidate heap, ordered by address (only to break exact key
/// ties between two entries of the same node).
#[derive(Debug)]
struct ByAddr(Arc<Node>);

impl PartialEq for ByAddr {
    fn eq(&self, o: &Self) -> bool {
        Arc::ptr_eq(&self.0, &o.0)
    }
}
impl Eq for ByAddr {}
impl PartialOrd for ByAddr {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for ByAddr {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        Arc::as_ptr(&self.0).cmp(&Arc::as_ptr(&o.0))
    }
}

/// The evictor's per-device candidates: a heap of (key when pushed, node)
/// and the pinned leaves met on the last pass.
///
/// Lazy validation is exact for policies whose keys only grow while a node
/// waits (lru, lfu, fifo, priority): a popped entry whose key grew is pushed
/// back with its current key, so the first entry popped with an unchanged
/// key is the true minimum. Entries of nodes that stopped being leaves are
/// dropped; every transition into leafhood pushes again (an insert's new or
/// adopted node through the tree's lock-free inbox, a parent whose last
/// resident child was evicted here), so no candidate is ever missing.
///
/// For sieve the heap holds the hand's order instead (see
/// [`EvictionPolicy`]): keys are (round, creation stamp, stamp the visited
/// bit is judged against), which only the evictor changes, and `hand` is
/// the position of the last leaf evicted.
///
/// The same lock keeps the device's eviction metrics.
#[derive(Debug, Default)]
struct Candidates {
    heap: BinaryHeap<Reverse<(policy::EvictionKey, ByAddr)>>,
    aside: Vec<Arc<Node>>,
    /// Sieve: (round, creation stamp) of the last leaf evicted.
    hand: (u64, u64),
    metrics: crate::metrics::EvictionRecorder,
}

/// Replica-aware eviction looks at this many candidates in policy order
/// and takes the first one also resident on another device.
const REPLICA_WINDOW: usize = 8;

/// A concurrent radix-tree prefix cache over token ids, with per-device
/// residency. `Send + Sync`: share it with `Arc` between one scheduler
/// thread per device and an evictor.
///
/// | operation | locks | writes |
/// | --- | --- | --- |
/// | [`peek`](Self::peek) | none | nothing |
/// | [`match_prefix`](Self::match_prefix) | none, unless it splits the node it ends in (then that node and its parent) | stamps, hit counts |
/// | [`match_and_pin`](Self::match_and_pin) | as `match_prefix`; the pin is one CAS | + a pin |
/// | [`insert`](Self::insert) | the node it changes and its parent, one change at a time | nodes, residency |
/// | [`evict`](Self::evict) | each evicted node and its parent | residency, unlinks |
///
/// Single-device behaviour is SGLang 0.5.9's `RadixCache`.
///
/// ```
/// use radixkv::{RadixCache, TokenKey, DeviceId};
/// let cache = RadixCache::builder().devices(2).build().unwrap();
/// let gpu0 = DeviceId(0);
/// let r = cache.insert(TokenKey::new(&[1, 2, 3, 4]), gpu0, &[10, 11, 12, 13], 0).unwrap();
/// assert_eq!(r.prefix_len, 0);
///
/// // Another request sharing the first three tokens:
/// let m = cache.match_and_pin(TokenKey::new(&[1, 2, 3, 9]), gpu0).unwrap();
/// assert_eq!((m.len, m.values.as_slice()), (3, &[10, 11, 12][..]));
/// // Routing: what every device holds, without side effects.
/// assert_eq!(cache.peek(TokenKey::new(&[1, 2, 3, 4])), vec![4, 0]);
///
/// // A pinned prefix cannot be evicted:
/// let ev = cache.evict(gpu0, 100).unwrap();
/// assert_eq!(ev.values, vec![13]);
/// drop(m.lease);
/// assert_eq!(cache.evict(gpu0, 100).unwrap().tokens, 3);
/// cache.audit();
/// ```
#[derive(Debug)]
pub struct RadixCache {
    allocators: Vec<Arc<PageAllocator>>,
    #[cfg_attr(loom, allow(dead_code))] // read only by the evictor, absent under loom
    watermarks: Option<(usize, usize)>,
    /// The allocators' low-watermark signal, until an evictor takes it. A
    /// std mutex (not the shim's): touched once, by `start_evictor`.
    #[cfg_attr(loom, allow(dead_code))] // read only by the evictor, absent under loom
    evictor_signal: std::sync::Mutex<Option<std::sync::mpsc::Receiver<usize>>>,
    /// Per device, the evictor's candidate heap (lru, lfu, fifo, priority).
    candidates: Box<[crate::sync::Mutex<Candidates>]>,
    id: u64,
    tree: Tree,
    policy: EvictionPolicy,
    replica_aware: bool,
    leases: Arc<[CachePadded<AtomicU64>]>,
}

impl RadixCache {
    /// A builder with every option at its default.
    pub fn builder() -> RadixCacheBuilder {
        RadixCacheBuilder::default()
    }

    /// Tokens per page.
    pub fn page_size(&self) -> usize {
        self.tree.page_size()
    }

    /// Number of devices.
    pub fn devices(&self) -> usize {
        self.tree.devices()
    }

    /// The eviction policy.
    pub fn eviction_policy(&self) -> EvictionPolicy {
        self.policy
    }

    fn device(&self, d: DeviceId) -> Result<usize, CacheError> {
        if d.index() < self.devices() {
            Ok(d.index())
        } else {
            Err(CacheError::UnknownDevice {
                device: d,
                devices: self.devices(),
            })
        }
    }

    /// Resident prefix length of `key` on every device (index = device).
    /// Takes no lock and writes nothing: for routing.
    pub fn peek(&self, key: TokenKey<'_>) -> Vec<usize> {
        let guard = crossbeam_epoch::pin();
        self.tree.peek(key.namespace, key.tokens, &guard)
    }

    /// The longest prefix of `key` resident on `device` (whole pages),
    /// without a pin: `values` stays empty and the `handle` can be pinned
    /// later. Splits the node the match ends inside, as SGLang does.
    pub fn match_prefix(
        &self,
        key: TokenKey<'_>,
        device: DeviceId,
    ) -> Result<MatchResult, CacheError> {
        let d = self.device(device)?;
        let guard = crossbeam_epoch::pin();
        let stamp = self.tree.tick(d);
        let w = self
            .tree
            .match_on(key.namespace, key.tokens, d, stamp, &guard);
        Ok(self.result(&w, d, Vec::new(), None))
    }

    fn result(
        &self,
        w: &crate::tree::MatchWalk<'_>,
        d: usize,
        values: Vec<u32>,
        lease: Option<Lease>,
    ) -> MatchResult {
        let node = match w.end {
            End::Root => None,
            End::Node(n) => Some(arc_of(n)),
        };
        MatchResult {
            len: w.len,
            values,
            lease,
            handle: NodeHandle {
                cache: self.id,
                node,
                device: d,
                generation: w.generation,
            },
            any_len: w.any_len,
            any_device: w.any_device.map(|e| DeviceId(e as u32)),
        }
    }

    /// Like [`match_prefix`](Self::match_prefix), and pins the match: the
    /// returned `values` are read after the pin succeeded, so they stay
    /// valid while `lease` lives.
    pub fn match_and_pin(
        &self,
        key: TokenKey<'_>,
        device: DeviceId,
    ) -> Result<MatchResult, CacheError> {
        let d = self.device(device)?;
        let stamp = self.tree.tick(d);
        loop {
            let guard = crossbeam_epoch::pin();
            let w = self
                .tree
                .match_on(key.namespace, key.tokens, d, stamp, &guard);
            let End::Node(n) = w.end else {
                let lease = Lease::new(None, d, &self.leases);
                return Ok(self.result(&w, d, Vec::new(), Some(lease)));
            };
            // The protecting step of race 8: values are read only after a
            // generation-checked pin succeeded. The negative control reads
            // them first and pins whatever residency is there then.
            #[cfg(radixkv_negative = "pin_then_read")]
            let (early, gen) = (self.tree.path_values(n, d, w.len, &guard), None);
            #[cfg(not(radixkv_negative = "pin_then_read"))]
            let gen = Some(w.generation);
            match n.dev(d).residency.try_pin(gen) {
                Ok(_) => {
                    let lease = Lease::new(Some(arc_of(n)), d, &self.leases);
                    #[cfg(radixkv_negative = "pin_then_read")]
                    let values = early;
                    #[cfg(not(radixkv_negative = "pin_then_read"))]
                    let values = self.tree.path_values(n, d, w.len, &guard);
                    match values {
                        Some(v) => return Ok(self.result(&w, d, v, Some(lease))),
                        None => continue,
                    }
                }
                Err(PinRefused::Overflow) => return Err(CacheError::PinOverflow),
                Err(_) => continue,
            }
        }
    }

    /// Pins the end node of an earlier match. Fails with
    /// [`CacheError::StaleHandle`] if that node left the tree on the
    /// handle's device since the match. A handle of an empty match gives an
    /// empty lease.
    pub fn pin(&self, handle: &NodeHandle) -> Result<Lease, CacheError> {
        if handle.cache != self.id {
            return Err(CacheError::ForeignHandle);
        }
        let d = handle.device;
        let Some(n) = &handle.node else {
            return Ok(Lease::new(None, d, &self.leases));
        };
        match n.dev(d).residency.try_pin(Some(handle.generation)) {
            Ok(_) => Ok(Lease::new(Some(Arc::clone(n)), d, &self.leases)),
            Err(PinRefused::Overflow) => Err(CacheError::PinOverflow),
            Err(_) => Err(CacheError::StaleHandle(handle.device())),
        }
    }

    /// Caches `key` on `device` with one value per token (KV slot indices
    /// chosen by the caller). Returns how many leading tokens were already
    /// cached there; the caller's values for those are duplicates (see
    /// [`InsertResult::duplicates`]). Existing values are never replaced.
    ///
    /// Errors (cache unchanged): a key that is not page-aligned, a values
    /// length that differs from the key's, an unknown device. An empty key
    /// returns `prefix_len` 0.
    pub fn insert(
        &self,
        key: TokenKey<'_>,
        device: DeviceId,
        values: &[u32],
        priority: i64,
    ) -> Result<InsertResult, CacheError> {
        let d = self.device(device)?;
        if !self.allocators.is_empty() {
            return Err(CacheError::ValuesOwnedByCache);
        }
        self.insert_values(key, d, values, priority)
    }

    fn insert_values(
        &self,
        key: TokenKey<'_>,
        d: usize,
        values: &[u32],
        priority: i64,
    ) -> Result<InsertResult, CacheError> {
        let len = key.tokens.len();
        if !len.is_multiple_of(self.page_size()) {
            return Err(CacheError::Unaligned {
                len,
                page_size: self.page_size(),
            });
        }
        if values.len() != len {
            return Err(CacheError::LengthMismatch {
                tokens: len,
                values: values.len(),
            });
        }
        if len == 0 {
            return Ok(InsertResult::from_adopted(Vec::new(), 0));
        }
        let guard = crossbeam_epoch::pin();
        let w = self.tree.insert(
            key.namespace,
            key.tokens,
            values,
            d,
            priority,
            false,
            &guard,
        );
        Ok(InsertResult::from_adopted(w.adopted, len))
    }

    /// Evicts whole unpinned leaves of `device` in policy order until at
    /// least `tokens` tokens are freed or nothing evictable is left, and
    /// returns their values. A parent whose last resident child goes
    /// becomes a candidate in turn. A node left with no residency on any
    /// device and no children leaves the tree.
    pub fn evict(&self, device: DeviceId, tokens: usize) -> Result<Evicted, CacheError> {
        let d = self.device(device)?;
        let mut out = Evicted::default();
        if tokens == 0 {
            return Ok(out);
        }
        let start = std::time::Instant::now();
        // The evictor frees what earlier changes unlinked (see
        // `tree::reclaim`), so that matching threads never do.
        self.tree.reclaim();
        let guard = crossbeam_epoch::pin();
        if self.tree.tracks_leaves() {
            let mut c = crate::sync::lock(&self.candidates[d]);
            self.evict_tracked(&mut c, d, tokens, &mut out, &guard);
            c.metrics
                .record_evict(out.leaves, out.tokens, out.pages, start.elapsed());
            return Ok(out);
        }
        let mut nodes: Vec<&Node> = self.tree.leaves(d, &guard);
        out.examined = nodes.len();
        let mut heap: BinaryHeap<_> = nodes
            .iter()
            .enumerate()
            .map(|(i, n)| Reverse((self.key_of(n, d), i)))
            .collect();
        while out.tokens < tokens {
            let Some(Reverse((_, i))) = heap.pop() else {
                break;
            };
            let Some(ev) = self.tree.evict_leaf(nodes[i], d, &guard) else {
                continue;
            };
            self.account(&ev.values, d, &mut out);
            if is_leaf_on(ev.parent, d) {
                // Relaxed: as in `evict_tracked` (one evictor per device).
                let hits = ev.parent.dev(d).hits.load(Ordering::Relaxed);
                ev.parent.dev(d).hits_base.store(hits, Ordering::Relaxed);
            }
            if is_candidate(ev.parent, d) {
                heap.push(Reverse((self.key_of(ev.parent, d), nodes.len())));
                nodes.push(ev.parent);
            }
        }
        crate::sync::lock(&self.candidates[d]).metrics.record_evict(
            out.leaves,
            out.tokens,
            out.pages,
            start.elapsed(),
        );
        Ok(out)
    }

    /// What eviction did on `device` since the cache was built: calls,
    /// leaves, tokens and pages evicted, the latency histogram of `evict`
    /// calls, and the background evictor's wake-ups and time below the low
    /// watermark. Waits for an eviction in progress on that device.
    ///
    /// ```
    /// use radixkv::{DeviceId, RadixCache, TokenKey};
    /// let c = RadixCache::builder().build().unwrap();
    /// c.insert(TokenKey::new(&[1, 2, 3]), DeviceId(0), &[4, 5, 6], 0).unwrap();
    /// c.evict(DeviceId(0), 1).unwrap();
    /// let m = c.eviction_metrics(DeviceId(0)).unwrap();
    /// assert_eq!((m.evict_calls, m.evicted_leaves, m.evicted_tokens), (1, 1, 3));
    /// assert_eq!(m.latency.count, 1);
    /// ```
    pub fn eviction_metrics(
        &self,
        device: DeviceId,
    ) -> Result<crate::metrics::EvictionMetrics, CacheError> {
        let d = self.device(device)?;
        Ok(crate::sync::lock(&self.candidates[d]).metrics.metrics())
    }

    /// The background evictor's observations of device `d`.
    #[cfg(not(loom))]
    pub(crate) fn record_evictor(&self, d: usize, wakeup: bool, below_low: std::time::Duration) {
        let mut c = crate::sync::lock(&self.candidates[d]);
        if wakeup {
            c.metrics.record_wakeup();
        }
        c.metrics.add_time_below_low(below_low);
    }

    /// The page allocator of `device`, when the cache owns its pages.
    pub fn allocator(&self, device: DeviceId) -> Option<&Arc<PageAllocator>> {
        self.allocators.get(device.index())
    }

    /// Allocates pages for `tokens` tokens on `device`. When the device is
    /// short, evicts exactly the shortfall (whole unpinned leaves, in policy
    /// order) and retries once; if that still cannot be met (everything
    /// pinned, or another request took the pages), the error says how many
    /// pages were missing.
    pub fn alloc(&self, device: DeviceId, tokens: usize) -> Result<PageSpan, CacheError> {
        let d = self.device(device)?;
        let a = self.allocators.get(d).ok_or(CacheError::NoAllocator)?;
        match a.alloc(tokens) {
            Err(AllocError::OutOfPages { missing, .. }) => {
                self.evict(device, missing * self.page_size())?;
                Ok(a.alloc(tokens)?)
            }
            r => Ok(r?),
        }
    }

    /// Caches `key` on the span's device with the span's pages (one page per
    /// `page_size` tokens, in order): pages for tokens already cached there
    /// go back to the allocator, the rest now belong to the tree. `key` must
    /// cover exactly the span's slots. On an error the span is dropped, so
    /// its pages go back to the allocator: nothing is lost.
    ///
    /// ```
    /// use radixkv::{DeviceId, RadixCache, TokenKey};
    /// let cache = RadixCache::builder().page_size(2).pages_per_device(64).build().unwrap();
    /// let a = cache.allocator(DeviceId(0)).unwrap().clone();
    /// let span = cache.alloc(DeviceId(0), 4).unwrap();
    /// cache.insert_pages(TokenKey::new(&[1, 2, 3, 4]), span, 0).unwrap();
    /// let dup = cache.alloc(DeviceId(0), 4).unwrap();
    /// let r = cache.insert_pages(TokenKey::new(&[1, 2, 3, 4]), dup, 0).unwrap();
    /// assert_eq!(r.prefix_len, 4); // both pages were duplicates...
    /// assert_eq!(a.free_pages(), 63 - 2); // ...and went back
    /// cache.evict(DeviceId(0), 4).unwrap();
    /// assert_eq!(a.free_pages(), 63);
    /// cache.audit(); // I2: free + tree + requests = pool - 1
    /// ```
    pub fn insert_pages(
        &self,
        key: TokenKey<'_>,
        span: PageSpan,
        priority: i64,
    ) -> Result<InsertResult, CacheError> {
        // The general chunk insert with no borrowed prefix and no pin.
        self.insert_chunk_pinned(key, span.device(), &[], span, priority, false)
            .map(|(r, _, _)| r)
    }

    /// Frees the nodes, images and arrays that earlier changes unlinked
    /// and whose epoch grace period has passed. [`evict`](Self::evict) does
    /// this first, and inserts do it once a few thousand objects wait, so
    /// that matching threads never pay for freeing memory; an application
    /// that neither evicts nor inserts for a while may call it from any
    /// thread to return that memory sooner.
    pub fn reclaim(&self) {
        self.tree.reclaim();
    }

    /// Adds one evicted leaf's values to `out`; with page ownership, returns
    /// its pages to the allocator instead of reporting the values.
    fn account(&self, values: &crate::tree::node::Values, d: usize, out: &mut Evicted) {
        let before = out.values.len();
        values.append_to(&mut out.values, self.page_size());
        out.tokens += out.values.len() - before;
        out.leaves += 1;
        if let Some(a) = self.allocators.get(d) {
            let ps = self.page_size();
            let pages: Vec<u32> = out.values[before..]
                .iter()
                .step_by(ps)
                .map(|&slot| slot / ps as u32)
                .collect();
            out.pages += pages.len();
            a.give_back(&pages);
            out.values.truncate(before);
        }
    }

    /// Eviction from the device's candidate heap: O(evicted · log leaves)
    /// plus the leaves inserted since the last call.
    fn evict_tracked(
        &self,
        c: &mut Candidates,
        d: usize,
        tokens: usize,
        out: &mut Evicted,
        guard: &crossbeam_epoch::Guard,
    ) {
        // New leaves and the pinned ones set aside earlier, heapified in bulk.
        let mut fresh = Vec::new();
        {
            let mut add = |n: Arc<Node>| {
                if is_leaf_on(&n, d) {
                    fresh.push(Reverse((self.entry_key(c.hand, &n, d), ByAddr(n))));
                }
            };
            self.tree.drain_leaves(d, &mut add);
            std::mem::take(&mut c.aside).into_iter().for_each(&mut add);
        }
        out.examined += fresh.len();
        c.heap.extend(fresh);
        let replicas = self.replica_aware && self.devices() > 1;
        while out.tokens < tokens {
            let Some(first) = self.next_candidate(c, d, out) else {
                break;
            };
            let (stored, n) = if replicas && !self.replicated(&first.1, d) {
                // Look a few candidates further for one with a replica; the
                // others go back unchanged (they were just validated).
                let mut window = vec![first];
                while window.len() < REPLICA_WINDOW {
                    let Some(next) = self.next_candidate(c, d, out) else {
                        break;
                    };
                    let found = self.replicated(&next.1, d);
                    window.push(next);
                    if found {
                        break;
                    }
                }
                let pick = if self.replicated(&window[window.len() - 1].1, d) {
                    window.len() - 1
                } else {
                    0
                };
                let chosen = window.swap_remove(pick);
                for (k, n) in window {
                    c.heap.push(Reverse((k, ByAddr(n))));
                }
                chosen
            } else {
                first
            };
            // `n` was seen linked (not obsolete) under `guard` just above.
            let Some(ev) = self.tree.evict_leaf(&n, d, guard) else {
                c.aside.push(n); // lost a race with a pin or a new child
                continue;
            };
            if self.policy == EvictionPolicy::Sieve {
                let (round, order, _) = stored.sieve_parts();
                c.hand = (round, order);
            }
            self.account(&ev.values, d, out);
            if is_leaf_on(ev.parent, d) {
                let p = arc_of(ev.parent);
                // Relaxed: written and read by this device's evictor, under
                // the candidates lock.
                let hits = p.dev(d).hits.load(Ordering::Relaxed);
                p.dev(d).hits_base.store(hits, Ordering::Relaxed);
                let mut k = self.entry_key(c.hand, &p, d);
                if self.policy == EvictionPolicy::Sieve {
                    // Its hits so far were passes through to the children
                    // just evicted: it joins right at the hand (the next
                    // candidate, like its coldest descendants) with its
                    // visited bit clear.
                    let last = p.dev(d).last_access.load(Ordering::Relaxed);
                    k = policy::EvictionKey::sieve(c.hand.0, c.hand.1, last, p.id);
                }
                c.heap.push(Reverse((k, ByAddr(p))));
            }
        }
    }

    /// The next valid candidate of the heap in policy order: a leaf on `d`,
    /// unpinned, whose key is current. Stale entries are dropped, pinned
    /// leaves set aside, grown keys pushed back; for sieve, a leaf hit since
    /// the hand last passed it gets its second chance here.
    fn next_candidate(
        &self,
        c: &mut Candidates,
        d: usize,
        out: &mut Evicted,
    ) -> Option<(policy::EvictionKey, Arc<Node>)> {
        loop {
            let Reverse((stored, ByAddr(n))) = c.heap.pop()?;
            out.examined += 1;
            if !is_leaf_on(&n, d) {
                continue; // stale: evicted, unlinked or no longer a leaf
            }
            if n.dev(d).residency.load().pins() > 0 {
                c.aside.push(n); // a candidate again once unpinned
                continue;
            }
            if self.policy == EvictionPolicy::Sieve {
                // An entry of a node evicted and cached again meanwhile is
                // older than its new one: harmless, it only offers the node
                // to the hand once more.
                let (round, order, seen) = stored.sieve_parts();
                let last = n.dev(d).last_access.load(Ordering::Relaxed);
                if last > seen {
                    // Visited: clear the bit, wait for the next round.
                    let k = policy::EvictionKey::sieve(round + 1, order, last, n.id);
                    c.heap.push(Reverse((k, ByAddr(n))));
                    continue;
                }
                return Some((stored, n));
            }
            let now = self.key_of(&n, d);
            if now != stored {
                c.heap.push(Reverse((now, ByAddr(n))));
                continue;
            }
            return Some((stored, n));
        }
    }

    /// Whether `n`'s tokens are also resident on a device other than `d`.
    fn replicated(&self, n: &Node, d: usize) -> bool {
        (0..self.devices()).any(|e| e != d && n.dev(e).residency.load().resident())
    }

    /// The heap key of a leaf joining the candidates: its policy key, or for
    /// sieve its place relative to the hand (this round if the hand has not
    /// passed its creation stamp yet, otherwise the next).
    fn entry_key(&self, hand: (u64, u64), n: &Node, d: usize) -> policy::EvictionKey {
        let k = self.key_of(n, d);
        if self.policy != EvictionPolicy::Sieve {
            return k;
        }
        let (_, created, seen) = k.sieve_parts();
        let round = if created > hand.1 { hand.0 } else { hand.0 + 1 };
        policy::EvictionKey::sieve(round, created, seen, n.id)
    }

    fn key_of(&self, n: &Node, d: usize) -> policy::EvictionKey {
        let s = &n.dev(d);
        self.policy.key(&LeafStats {
            last_access: s.last_access.load(Ordering::Relaxed),
            created: s.created.load(Ordering::Relaxed),
            hits: s.hits.load(Ordering::Relaxed),
            hits_base: s.hits_base.load(Ordering::Relaxed),
            priority: n.priority.load(Ordering::Relaxed),
            id: n.id,
        })
    }

    /// Token counts on `device` by a scan of the tree: exact whenever no
    /// operation is in flight.
    pub fn sizes(&self, device: DeviceId) -> Result<Sizes, CacheError> {
        let d = self.device(device)?;
        let guard = crossbeam_epoch::pin();
        let s = self.tree.scan(d, &guard);
        Ok(Sizes {
            evictable: s.total - s.protected,
            protected: s.protected,
            total: s.total,
            nodes: s.nodes,
        })
    }

    /// Non-root nodes in the tree, over all devices.
    pub fn node_count(&self) -> u64 {
        self.tree.node_count()
    }

    /// Checks the invariants I1 (prefix-closed residency), I4 (shape), I5
    /// (namespace isolation), I6 (live leases = pin counts) and the cache's
    /// own counters. Meaningful only when no operation is in flight.
    pub fn check(&self) -> Result<(), String> {
        let guard = crossbeam_epoch::pin();
        self.tree.check(&guard)?;
        for d in 0..self.devices() {
            let pins = self.tree.scan(d, &guard).pins;
            let leases = self.leases[d].load(Ordering::SeqCst);
            if pins != leases {
                return Err(format!(
                    "I6: device {d} has {leases} live leases but {pins} pins"
                ));
            }
            if let Some(a) = self.allocators.get(d) {
                self.check_pages(d, a, &guard)?;
            }
        }
        Ok(())
    }

    /// I2: free + tree-owned + request-owned = pool size - 1, no page owned
    /// twice.
    fn check_pages(
        &self,
        d: usize,
        a: &PageAllocator,
        guard: &crossbeam_epoch::Guard,
    ) -> Result<(), String> {
        let ps = self.page_size();
        let mut tree_pages = std::collections::HashSet::new();
        for slot in self.tree.values_on(d, guard).into_iter().step_by(ps) {
            if !(slot as usize).is_multiple_of(ps) {
                return Err(format!("I2: device {d}: slot {slot} does not start a page"));
            }
            let page = slot / ps as u32;
            if !tree_pages.insert(page) {
                return Err(format!(
                    "I2: device {d}: page {page} is owned twice by the tree"
                ));
            }
            if a.is_free(page) {
                return Err(format!(
                    "I2: device {d}: page {page} is both free and in the tree"
                ));
            }
        }
        let (free, spans) = (a.free_pages(), a.pages_in_spans());
        if free + tree_pages.len() + spans != a.num_pages() - 1 {
            return Err(format!(
                "I2: device {d}: {free} free + {} in the tree + {spans} in requests != {} pages",
                tree_pages.len(),
                a.num_pages() - 1
            ));
        }
        if a.double_frees() != 0 {
            return Err(format!("I2: device {d}: {} double frees", a.double_frees()));
        }
        Ok(())
    }

    /// Like [`check`](Self::check), panicking with the violation.
    pub fn audit(&self) {
        if let Err(e) = self.check() {
            panic!("radixkv audit failed: {e}");
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn audit_catches_a_double_free_and_a_lost_page() {
        let c = RadixCache::builder()
            .page_size(2)
            .pages_per_device(32)
            .build()
            .unwrap();
        let span = c.alloc(DeviceId(0), 4).unwrap();
        let pages = span.pages().to_vec();
        c.insert_pages(TokenKey::new(&[1, 2, 3, 4]), span, 0)
            .unwrap();
        c.audit();
        // A page of the tree freed behind its back: it is now both free and
        // in the tree, and freeing it again counts as a double free.
        let a = c.allocator(DeviceId(0)).unwrap();
        a.give_back(&pages[..1]);
        let e = c.check().unwrap_err();
        assert!(e.contains("both free and in the tree"), "{e}");
        a.give_back(&pages[..1]);
        assert_eq!(a.double_frees(), 1);
        // A page taken from the pool and never accounted for.
        let c = RadixCache::builder()
            .page_size(2)
            .pages_per_device(32)
            .build()
            .unwrap();
        let a = c.allocator(DeviceId(0)).unwrap();
        let span = a.alloc(2).unwrap();
        let _lost = span.into_owned_pages();
        let e = c.check().unwrap_err();
        assert!(e.contains("I2"), "{e}");
    }
}
