//! The prefix cache: match, pin, insert and evict token prefixes, per device.
//!
//! See [`RadixCache`] for the operations and their concurrency guarantees.
//!
//! * this module: [`RadixCache`] itself, its builder, and matching,
//!   pinning, inserting, page allocation and the audit;
//! * `types`: the public keys, results and errors ([`TokenKey`],
//!   [`MatchResult`], [`InsertResult`], [`Evicted`], [`CacheError`],
//!   [`Lease`], ...), re-exported here;
//! * `eviction`: the eviction engine (per-device candidate heaps, `evict`,
//!   reclamation);
//! * `policy`: the eviction orders; `evictor`: the background thread;
//!   `request`: the request lifecycle; `copy`: copies between tiers (the
//!   host tier and the devices).

mod copy;
mod eviction;
#[cfg(not(loom))]
mod evictor;
mod policy;
mod request;
mod types;

pub use copy::{PrefixCopy, RequestCopy, SlotRun};
#[cfg(not(loom))]
pub use evictor::{Evictor, EvictorStats};
pub use policy::{EvictionPolicy, UnknownPolicy};
pub use request::Request;
pub use types::{
    CacheError, ClockKind, Evicted, InsertResult, Lease, MatchResult, NodeHandle, Sizes,
    TierLengths, TokenKey,
};

use crate::alloc::{AllocError, PageAllocator, PageSpan};
use crate::device::DeviceId;
use crate::sync::{Arc, AtomicU64, Ordering};
use crate::tree::node::arc_of;
use crate::tree::residency::PinRefused;
use crate::tree::{clock::Clock, End, Tree};
use crossbeam_utils::CachePadded;
use eviction::Candidates;

/// The index of `p` in [`EvictionPolicy::ALL`].
fn policy_index(p: EvictionPolicy) -> u64 {
    EvictionPolicy::ALL
        .iter()
        .position(|&q| q == p)
        .unwrap_or(0) as u64
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
    host_pages: Option<usize>,
    listener: Option<crate::events::Listener>,
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
            host_pages: None,
            listener: None,
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

    /// Adds a host tier of `pages` pages (default: none): one more
    /// residency slot per node, over host memory shared by every device's
    /// scheduler, so a prefix evicted from a GPU (or held by another one)
    /// can be loaded instead of recomputed. The tier is addressed by
    /// [`RadixCache::host`], the id one past the last device, which every
    /// per-device call accepts (insert, match and pin, evict, alloc,
    /// sizes); its residency is prefix-closed like a device's, and
    /// eviction ranks its leaves by the cache's policy. With
    /// [`pages_per_device`](Self::pages_per_device) the tier gets a page
    /// allocator of its own (page 0 reserved, so `pages` ≥ 2; the
    /// watermarks apply to it too); without, `pages` only has to be valid.
    /// See [`RadixCache::peek_tiers`] and [`MatchResult::host_len`].
    ///
    /// ```
    /// use radixkv::{DeviceId, RadixCache, TokenKey};
    /// let c = RadixCache::builder().devices(2).host_pages(64).build().unwrap();
    /// let host = c.host().unwrap();
    /// assert_eq!((c.devices(), host), (2, DeviceId(2)));
    /// c.insert(TokenKey::new(&[1, 2, 3]), host, &[7, 8, 9], 0).unwrap();
    /// c.insert(TokenKey::new(&[1, 2]), DeviceId(0), &[4, 5], 0).unwrap();
    /// let t = c.peek_tiers(TokenKey::new(&[1, 2, 3]));
    /// assert_eq!((t.devices, t.host), (vec![2, 0], 3));
    /// // A match on device 0 also tells how far the host can take it.
    /// let m = c.match_prefix(TokenKey::new(&[1, 2, 3]), DeviceId(0)).unwrap();
    /// assert_eq!((m.len, m.host_len), (2, 3));
    /// assert!(RadixCache::builder().pages_per_device(8).host_pages(1).build().is_err());
    /// ```
    pub fn host_pages(mut self, pages: usize) -> Self {
        self.host_pages = Some(pages);
        self
    }

    /// Tells `listener` about every page that becomes resident on a tier or
    /// leaves it (default none): see [`events`](crate::events) for what is
    /// reported, in which order, and what it costs.
    pub fn listener(mut self, listener: std::sync::Arc<dyn crate::events::CacheListener>) -> Self {
        self.listener = Some(crate::events::Listener(listener));
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
        if let Some(h) = self.host_pages {
            if h < 2 {
                return Err(CacheError::InvalidConfig(format!(
                    "a host tier of {h} pages holds no page (page 0 is reserved): give it at least 2"
                )));
            }
        }
        // Residency slots: one per device, then the host tier's.
        let tiers = self.devices + usize::from(self.host_pages.is_some());
        let clock = match self.clock {
            ClockKind::Logical => Clock::logical(tiers),
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
                    if let Some(h) = self.host_pages.filter(|&h| high >= h) {
                        return Err(CacheError::InvalidConfig(format!(
                            "watermarks need high < the host tier's pages ({high}, {h})"
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
            Some(pages) => (0..tiers)
                .map(|d| {
                    PageAllocator::with_watermark(
                        DeviceId(d as u32),
                        if d < self.devices {
                            pages
                        } else {
                            self.host_pages.unwrap_or(pages)
                        },
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
            tree: Tree::new(self.page_size, tiers, self.devices, clock, self.listener),
            candidates: (0..tiers)
                .map(|_| crate::sync::Mutex::new(Candidates::default()))
                .collect(),
            policy: AtomicU64::new(policy_index(self.policy)),
            levels: (
                AtomicU64::new(self.watermarks.map_or(0, |w| w.0 as u64)),
                AtomicU64::new(self.watermarks.map_or(0, |w| w.1 as u64)),
            ),
            replica_aware: self.replica_aware,
            leases: (0..tiers)
                .map(|_| CachePadded::new(AtomicU64::new(0)))
                .collect(),
        })
    }
}

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
    /// The eviction policy, as its index in [`EvictionPolicy::ALL`]
    /// (changed at run time by [`set_eviction_policy`](Self::set_eviction_policy)).
    policy: AtomicU64,
    /// The watermarks now (low, high), when built with watermarks (changed
    /// by [`set_watermarks`](Self::set_watermarks)); the evictor reads them
    /// on every pass.
    levels: (AtomicU64, AtomicU64),
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

    /// Number of devices (GPUs; the host tier is not counted).
    pub fn devices(&self) -> usize {
        self.tree.gpus()
    }

    /// The host tier's id, with [`RadixCacheBuilder::host_pages`]: the id
    /// one past the last device, accepted by every per-device call.
    pub fn host(&self) -> Option<DeviceId> {
        (self.tiers() > self.devices()).then(|| DeviceId(self.devices() as u32))
    }

    /// Residency slots: the devices, then the host tier if there is one.
    pub(crate) fn tiers(&self) -> usize {
        self.tree.devices()
    }

    /// The eviction policy.
    pub fn eviction_policy(&self) -> EvictionPolicy {
        // SeqCst: read once per eviction call; changes are rare.
        EvictionPolicy::ALL[self.policy.load(Ordering::SeqCst) as usize % EvictionPolicy::ALL.len()]
    }

    /// Switches the eviction policy at run time, to any policy. Every
    /// device's eviction lock is held for the switch, so no eviction runs
    /// half under one order and half under the other (one ranked by a scan
    /// that started before the switch finishes in its own order). The
    /// policies that rank leaves in a heap (lru, lfu, fifo, priority, slru,
    /// sieve) keep one per device, fed by the note each insert leaves of a
    /// new leaf;
    /// mru and filo rank by a scan of the tree at each eviction instead
    /// (their keys can fall as well as rise, which a lazily revalidated heap
    /// cannot follow) and drop the notes. A switch into the heap kind scans
    /// each device's leaves into a new heap; a switch out of it drops the
    /// heaps.
    ///
    /// ```
    /// use radixkv::{EvictionPolicy, RadixCache};
    /// let c = RadixCache::builder().build().unwrap();
    /// c.set_eviction_policy(EvictionPolicy::Lfu);
    /// assert_eq!(c.eviction_policy(), EvictionPolicy::Lfu);
    /// c.set_eviction_policy(EvictionPolicy::Mru);
    /// assert_eq!(c.eviction_policy(), EvictionPolicy::Mru);
    /// ```
    pub fn set_eviction_policy(&self, p: EvictionPolicy) {
        // Every device's lock, in index order (evictions take one at a time).
        let mut held: Vec<_> = self
            .candidates
            .iter()
            .map(|c| crate::sync::lock(c))
            .collect();
        self.policy.store(policy_index(p), Ordering::SeqCst);
        let guard = crossbeam_epoch::pin();
        for (d, c) in held.iter_mut().enumerate() {
            if p.keys_only_grow() {
                // The protecting step of model 23: the notes taken so far
                // are dropped (a scan-ranked policy may have left thousands)
                // only because the scan below finds their leaves: each was
                // linked before its note, and its note before this drain.
                // The control drops them without the scan.
                self.tree.drain_leaves(d, drop);
                #[cfg(not(radixkv_negative = "switch_without_scan"))]
                self.rerank(c, d, &guard);
                #[cfg(radixkv_negative = "switch_without_scan")]
                c.clear();
            } else {
                c.clear();
            }
        }
    }

    /// The watermarks now, in free pages per device (none without).
    pub fn watermarks(&self) -> Option<(usize, usize)> {
        self.watermarks.map(|_| {
            // SeqCst: read once per evictor pass.
            (
                self.levels.0.load(Ordering::SeqCst) as usize,
                self.levels.1.load(Ordering::SeqCst) as usize,
            )
        })
    }

    /// Moves the watermarks at run time (the cache must have been built
    /// with watermarks: its background evictor follows them from its next
    /// pass; the allocators signal at the new low level).
    ///
    /// ```
    /// use radixkv::RadixCache;
    /// let c = RadixCache::builder().pages_per_device(64).watermarks(4, 8).build().unwrap();
    /// c.set_watermarks(8, 16).unwrap();
    /// assert_eq!(c.watermarks(), Some((8, 16)));
    /// assert!(c.set_watermarks(16, 8).is_err());
    /// assert!(RadixCache::builder().build().unwrap().set_watermarks(1, 2).is_err());
    /// ```
    pub fn set_watermarks(&self, low: usize, high: usize) -> Result<(), CacheError> {
        if self.watermarks.is_none() {
            return Err(CacheError::InvalidConfig(
                "this cache was built without watermarks (no background evictor)".into(),
            ));
        }
        let smallest = self
            .allocators
            .iter()
            .map(|a| a.num_pages())
            .min()
            .unwrap_or(0);
        if low >= high || high >= smallest {
            return Err(CacheError::InvalidConfig(format!(
                "watermarks need low < high < pages ({low}, {high}, {smallest})"
            )));
        }
        // High first when rising, low first when falling: never low >= high
        // for a reader between the two stores.
        if low as u64 >= self.levels.1.load(Ordering::SeqCst) {
            self.levels.1.store(high as u64, Ordering::SeqCst);
            self.levels.0.store(low as u64, Ordering::SeqCst);
        } else {
            self.levels.0.store(low as u64, Ordering::SeqCst);
            self.levels.1.store(high as u64, Ordering::SeqCst);
        }
        for a in &self.allocators {
            a.set_low_watermark(low);
        }
        Ok(())
    }

    fn device(&self, d: DeviceId) -> Result<usize, CacheError> {
        if d.index() < self.tiers() {
            Ok(d.index())
        } else {
            Err(CacheError::UnknownDevice {
                device: d,
                devices: self.devices(),
            })
        }
    }

    /// Resident prefix length of `key` on every device (index = device;
    /// the host tier is not included: see [`peek_tiers`](Self::peek_tiers)).
    /// Takes no lock and writes nothing: for routing.
    pub fn peek(&self, key: TokenKey<'_>) -> Vec<usize> {
        let mut out = self.peek_all(key);
        out.truncate(self.devices());
        out
    }

    /// Resident prefix length of `key` on every device and on the host
    /// tier (0 without one), in one walk. Takes no lock and writes
    /// nothing: for routing with tiers (a device's own prefix, then what
    /// the host or another device can add to it).
    pub fn peek_tiers(&self, key: TokenKey<'_>) -> TierLengths {
        let mut devices = self.peek_all(key);
        let host = if self.host().is_some() {
            devices.pop().unwrap_or(0)
        } else {
            0
        };
        TierLengths { devices, host }
    }

    fn peek_all(&self, key: TokenKey<'_>) -> Vec<usize> {
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
            // SAFETY: `n` is a tree node reached under the walk's guard,
            // alive for this call.
            End::Node(n) => Some(unsafe { arc_of(n) }),
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
            host_len: w.host_len,
            hits: w.hits,
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
                    // SAFETY: `n` is a tree node reached under the walk's
                    // guard, alive for this call.
                    let lease = Lease::new(Some(unsafe { arc_of(n) }), d, &self.leases);
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

    /// Tokens resident on `device`, from a counter (O(1), no scan): exact
    /// whenever no operation is in flight, and never off by more than the
    /// changes in flight. [`sizes`](Self::sizes) scans the tree for the
    /// evictable and protected parts as well.
    ///
    /// ```
    /// use radixkv::{DeviceId, RadixCache, TokenKey};
    /// let c = RadixCache::builder().devices(2).build().unwrap();
    /// c.insert(TokenKey::new(&[1, 2, 3]), DeviceId(1), &[7, 8, 9], 0).unwrap();
    /// assert_eq!(c.resident_tokens(DeviceId(1)).unwrap(), 3);
    /// assert_eq!(c.resident_tokens(DeviceId(0)).unwrap(), 0);
    /// assert!(c.resident_tokens(DeviceId(2)).is_err());
    /// ```
    pub fn resident_tokens(&self, device: DeviceId) -> Result<usize, CacheError> {
        let d = self.device(device)?;
        Ok(self.tree.resident_tokens(d) as usize)
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
        for d in 0..self.tiers() {
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
