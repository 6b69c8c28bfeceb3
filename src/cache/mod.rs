//! The prefix cache: match, pin, insert and evict token prefixes, per tier.
//!
//! See [`RadixCache`] for the operations and their concurrency guarantees.
//!
//! | file | what it holds |
//! | --- | --- |
//! | `mod.rs` | [`RadixCache`] and what every kind of cache does: peek, match, pin, sizes, the eviction policy, the audit |
//! | `ownership.rs` | who owns the values: [`CallerValues`] or [`OwnedPages`] |
//! | `builder.rs` | [`RadixCacheBuilder`] |
//! | `values.rs` | inserting the caller's values ([`CallerValues`] caches) |
//! | `pages.rs` | pages, spans and watermarks ([`OwnedPages`] caches) |
//! | `request.rs` | the request lifecycle ([`Request`]) |
//! | `copy.rs` | copies between tiers ([`PrefixCopy`]) |
//! | `eviction.rs` | the eviction engine (candidate heaps, `evict`, write-back) |
//! | `evict_from.rs` | taking one block and what continues it out of a tier, by key or from a [`TreePlace`] |
//! | `policy.rs` | the eviction orders |
//! | `evictor.rs` | the background evictor thread |
//! | `types.rs` | the public keys, results, errors, leases, handles and places |
//!
//! The cache's own atomics (the tree's are in its protocol's docs):
//!
//! | atomic | ordering | why |
//! | --- | --- | --- |
//! | `policy` | SeqCst | stored under every tier's eviction lock, read under one (the lock orders them); a switch is rare |
//! | `leases` (per tier) | SeqCst | live leases, compared with the pins by the audit in quiescent state; no edge |
//! | `OwnedPages::levels` | SeqCst | the watermarks: two stores in the order that never shows low ≥ high to a reader between them (`set_watermarks`); rare |
//! | stamps, hits, `hits_base` read for eviction keys | Relaxed | advisory keys, re-read when a candidate is popped; carry no data |
//! | the evictor's stop flag and counters | Relaxed | polled; `join` orders the thread's end |

mod builder;
mod copy;
mod evict_from;
mod eviction;
#[cfg(not(loom))]
mod evictor;
mod ownership;
mod pages;
mod policy;
mod request;
mod types;
mod values;

pub use builder::{RadixCacheBuilder, MAX_DEVICES, MAX_PAGE_SIZE};
pub use copy::{PrefixCopy, RequestCopy, SlotRun};
#[cfg(not(loom))]
pub use evictor::{Evictor, EvictorStats};
pub use ownership::{CallerValues, OwnedPages, Ownership};
pub use policy::{EvictionPolicy, HitCounts, UnknownPolicy};
pub use request::Request;
pub use types::{
    CacheError, ClockKind, Evicted, EvictedFrom, InsertResult, Lease, MatchResult, NodeHandle,
    Sizes, TierLengths, TokenKey, TreePlace,
};

use crate::device::Tier;
use crate::sync::{Arc, AtomicU64, Ordering};
use crate::tree::node::{arc_of, Node};
use crate::tree::ops::walk::{End, MatchWalk};
use crate::tree::protocol::residency::PinRefused;
use crate::tree::state::Tree;
use crossbeam_utils::CachePadded;
use eviction::Candidates;

/// A cache that owns its pages ([`OwnedPages`]): what
/// `RadixCache::builder().pages_per_device(n).build()` returns.
///
/// ```
/// use radixkv::{DeviceId, PagedCache, RadixCache, TokenKey};
/// use std::sync::Arc;
/// let cache: Arc<PagedCache> =
///     Arc::new(RadixCache::builder().page_size(4).pages_per_device(32).build()?);
/// let mut r = cache.begin(TokenKey::new(&[1, 2, 3, 4, 5]), DeviceId(0))?;
/// r.reserve()?; // two pages for five tokens
/// r.finish()?; // the first page's four tokens cached, the second page back
/// assert_eq!(cache.resident_tokens(DeviceId(0))?, 4);
/// assert_eq!(cache.allocator(DeviceId(0))?.free_pages(), 31 - 1);
/// # Ok::<(), radixkv::CacheError>(())
/// ```
pub type PagedCache = RadixCache<OwnedPages>;

/// The index of `p` in [`EvictionPolicy::ALL`].
fn policy_index(p: EvictionPolicy) -> u64 {
    EvictionPolicy::ALL
        .iter()
        .position(|&q| q == p)
        .unwrap_or(0) as u64
}

/// A concurrent radix-tree prefix cache over token ids, with per-tier
/// residency. `Send + Sync`: share it with `Arc` between one scheduler
/// thread per device and an evictor. `P` says who owns the values:
/// [`CallerValues`] (the default: [`insert`](Self::insert) takes them) or
/// [`OwnedPages`] (a [`PagedCache`]: requests, spans and copies).
///
/// | operation | locks | writes |
/// | --- | --- | --- |
/// | [`peek`](Self::peek) | none | nothing |
/// | [`match_prefix`](Self::match_prefix) | none, unless it splits the node it ends in (then that node and its parent) | stamps, hit counts |
/// | [`match_and_pin`](Self::match_and_pin) | as `match_prefix`; the pin is one CAS | + a pin |
/// | [`insert`](Self::insert), [`insert_pages`](Self::insert_pages) | the node it changes and its parent, one change at a time | nodes, residency |
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
pub struct RadixCache<P: Ownership = CallerValues> {
    pages: P,
    /// Per tier, the evictor's candidate heap (every policy but mru and filo).
    candidates: Box<[crate::sync::Mutex<Candidates>]>,
    id: u64,
    tree: Tree,
    /// The eviction policy, as its index in [`EvictionPolicy::ALL`]
    /// (changed at run time by [`set_eviction_policy`](Self::set_eviction_policy)).
    policy: AtomicU64,
    replica_aware: bool,
    /// Inserts count hits ([`HitCounts::OnInsert`]).
    hits_on_insert: bool,
    /// See [`RadixCacheBuilder::slru_protected_threshold`].
    slru_threshold: Option<u64>,
    /// See [`RadixCacheBuilder::tlru_threshold`].
    tlru: policy::TlruBudget,
    leases: Arc<[CachePadded<AtomicU64>]>,
}

/// The engine and the server share one cache between threads.
const _: () = {
    const fn shared<T: Send + Sync>() {}
    shared::<RadixCache<CallerValues>>();
    shared::<RadixCache<OwnedPages>>();
};

impl RadixCache<CallerValues> {
    /// A builder with every option at its default.
    pub fn builder() -> RadixCacheBuilder<CallerValues> {
        RadixCacheBuilder::default()
    }
}

impl<P: Ownership> RadixCache<P> {
    /// Tokens per page.
    pub fn page_size(&self) -> usize {
        self.tree.page_size()
    }

    /// Number of devices (GPUs; the host tier is not counted).
    pub fn devices(&self) -> usize {
        self.tree.devices()
    }

    /// Whether the cache has a host tier
    /// ([`RadixCacheBuilder::host_pages`]), addressed as [`Tier::Host`].
    pub fn has_host_tier(&self) -> bool {
        self.tree.host().is_some()
    }

    /// Residency slots: the devices, then the host tier if there is one.
    pub(crate) fn tiers(&self) -> usize {
        self.tree.tiers()
    }

    /// The slot of `tier`, or why it does not exist here.
    pub(crate) fn slot(&self, tier: Tier) -> Result<usize, CacheError> {
        match tier {
            Tier::Device(d) if d.index() < self.devices() => Ok(d.index()),
            Tier::Device(d) => Err(CacheError::UnknownDevice {
                device: d,
                devices: self.devices(),
            }),
            Tier::Host => self.tree.host().ok_or(CacheError::NoHostTier),
        }
    }

    /// The public name of slot `t`.
    pub(crate) fn tier_of(&self, t: usize) -> Tier {
        self.tree.tier_of(t)
    }

    /// The eviction policy.
    pub fn eviction_policy(&self) -> EvictionPolicy {
        // SeqCst: read once per eviction call; changes are rare.
        EvictionPolicy::ALL[self.policy.load(Ordering::SeqCst) as usize % EvictionPolicy::ALL.len()]
    }

    /// Switches the eviction policy at run time, to any policy. Every
    /// tier's eviction lock is held for the switch, so no eviction runs
    /// half under one order and half under the other (one ranked by a scan
    /// that started before the switch finishes in its own order). The
    /// policies that rank leaves in a heap (lru, lfu, fifo, priority, slru,
    /// sieve, tlru) keep one per tier, fed by the note each insert leaves of a
    /// new leaf; mru and filo rank by a scan of the tree at each eviction
    /// instead (their keys can fall as well as rise, which a lazily
    /// revalidated heap cannot follow) and drop the notes. A switch into
    /// the heap kind scans each tier's leaves into a new heap; a switch out
    /// of it drops the heaps. A cache built with another policy and switched
    /// to tlru starts keeping branch depths then, from the tree as it stands
    /// (what a branch held before and lost is not known); an insert that
    /// runs through the switch may leave its ancestors' depths as they were.
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
        // Every tier's lock, in index order (evictions take one at a time).
        let mut held: Vec<_> = self
            .candidates
            .iter()
            .map(|c| crate::sync::lock(c))
            .collect();
        let guard = crossbeam_epoch::pin();
        if p == EvictionPolicy::Tlru {
            // Before the switch: the heap ranks by the depths this raises.
            self.tree.track_depths(&guard);
        }
        self.policy.store(policy_index(p), Ordering::SeqCst);
        for (t, c) in held.iter_mut().enumerate() {
            if p.keys_only_grow() && self.tree.notes_leaves() {
                self.switch_rescans(c, t, &guard);
            } else {
                c.clear();
            }
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
        let host = if self.has_host_tier() {
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

    /// The longest prefix of `key` resident on `tier` (whole pages),
    /// without a pin: `values` stays empty and the `handle` can be pinned
    /// later. Splits the node the match ends inside, as SGLang does.
    pub fn match_prefix(
        &self,
        key: TokenKey<'_>,
        tier: impl Into<Tier>,
    ) -> Result<MatchResult, CacheError> {
        let t = self.slot(tier.into())?;
        let guard = crossbeam_epoch::pin();
        let stamp = self.tree.tick(t);
        let w = self
            .tree
            .match_on(key.namespace, key.tokens, t, stamp, &guard);
        Ok(self.result(&w, t, Vec::new(), None))
    }

    fn result(
        &self,
        w: &MatchWalk<'_>,
        t: usize,
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
                tier: self.tier_of(t),
                slot: t,
                generation: w.generation,
                len: w.len,
            },
            any_len: w.any_len,
            any_device: w.any_device.map(|e| crate::DeviceId(e as u32)),
            host_len: w.host_len,
            hits: w.hits,
        }
    }

    /// A lease on `node`, pinned on slot `t` by the caller.
    pub(crate) fn lease(&self, node: Option<Arc<Node>>, t: usize) -> Lease {
        Lease::new(node, (self.tier_of(t), t), &self.leases)
    }

    /// Like [`match_prefix`](Self::match_prefix), and pins the match: the
    /// returned `values` are read after the pin succeeded, so they stay
    /// valid while `lease` lives.
    pub fn match_and_pin(
        &self,
        key: TokenKey<'_>,
        tier: impl Into<Tier>,
    ) -> Result<MatchResult, CacheError> {
        let t = self.slot(tier.into())?;
        let stamp = self.tree.tick(t);
        loop {
            let guard = crossbeam_epoch::pin();
            let w = self
                .tree
                .match_on(key.namespace, key.tokens, t, stamp, &guard);
            let End::Node(n) = w.end else {
                let lease = self.lease(None, t);
                return Ok(self.result(&w, t, Vec::new(), Some(lease)));
            };
            match self.pin_then_read(n, t, &w, &guard) {
                Ok((lease, Some(values))) => return Ok(self.result(&w, t, values, Some(lease))),
                // The path changed under the pin: the lease goes, walk again.
                Ok((_, None)) => continue,
                Err(PinRefused::Overflow) => return Err(CacheError::PinOverflow),
                Err(_) => continue,
            }
        }
    }

    /// Pins the end node of an earlier match. Fails with
    /// [`CacheError::StaleHandle`] if that node left the tree on the
    /// handle's tier since the match. A handle of an empty match gives an
    /// empty lease.
    pub fn pin(&self, handle: &NodeHandle) -> Result<Lease, CacheError> {
        if handle.cache != self.id {
            return Err(CacheError::ForeignHandle);
        }
        let t = handle.slot;
        let Some(n) = &handle.node else {
            return Ok(self.lease(None, t));
        };
        match n.slot(t).residency.try_pin(Some(handle.generation)) {
            Ok(_) => Ok(self.lease(Some(Arc::clone(n)), t)),
            Err(PinRefused::Overflow) => Err(CacheError::PinOverflow),
            Err(_) => Err(CacheError::StaleHandle(handle.tier())),
        }
    }

    /// Tokens resident on `tier`, from a counter (O(1), no scan): exact
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
    pub fn resident_tokens(&self, tier: impl Into<Tier>) -> Result<usize, CacheError> {
        let t = self.slot(tier.into())?;
        Ok(self.tree.resident_tokens(t) as usize)
    }

    /// Token counts on `tier` by a scan of the tree: exact whenever no
    /// operation is in flight.
    pub fn sizes(&self, tier: impl Into<Tier>) -> Result<Sizes, CacheError> {
        let t = self.slot(tier.into())?;
        let guard = crossbeam_epoch::pin();
        let s = self.tree.scan(t, &guard);
        Ok(Sizes {
            evictable: s.total - s.protected,
            protected: s.protected,
            total: s.total,
            nodes: s.nodes,
        })
    }

    /// Non-root nodes in the tree, over all tiers.
    pub fn node_count(&self) -> u64 {
        self.tree.node_count()
    }

    /// Checks the invariants I1 (prefix-closed residency), I4 (shape), I5
    /// (namespace isolation), I6 (live leases = pin counts), I2 (pages,
    /// when the cache owns them) and the cache's own counters. Meaningful
    /// only when no operation is in flight.
    pub fn check(&self) -> Result<(), String> {
        let guard = crossbeam_epoch::pin();
        self.tree.check(&guard)?;
        for t in 0..self.tiers() {
            let pins = self.tree.scan(t, &guard).pins;
            let leases = self.leases[t].load(Ordering::SeqCst);
            if pins != leases {
                return Err(format!(
                    "I6: {} has {leases} live leases but {pins} pins",
                    self.tier_of(t)
                ));
            }
            if let Some(a) = self.pages.allocator_of(t) {
                pages::check_pages(&self.tree, t, a, &guard)?;
            }
        }
        Ok(())
    }

    /// Like [`check`](Self::check), panicking with the violation.
    pub fn audit(&self) {
        if let Err(e) = self.check() {
            panic!("radixkv audit failed: {e}");
        }
    }

    /// The protecting step `pin_then_read` (model `residency_aba`): the
    /// values of a match are read only after a pin of the residency the walk
    /// saw (generation-checked) succeeded, so a residency evicted and made
    /// again meanwhile is never read. Returns the lease that holds the pin
    /// (taken with the pin, so no pin outlives a panic) and the values read
    /// under it (`None`: the path changed, walk again). Its control reads
    /// first, then pins whatever residency is there.
    fn pin_then_read(
        &self,
        n: &Node,
        t: usize,
        w: &MatchWalk<'_>,
        guard: &crossbeam_epoch::Guard,
    ) -> Result<(Lease, Option<Vec<u32>>), PinRefused> {
        if crate::negative::removed("pin_then_read") {
            let early = self.tree.path_values(n, t, w.len, guard);
            n.slot(t).residency.try_pin(None)?;
            // SAFETY: `n` is a tree node reached under `guard`, alive here.
            return Ok((self.lease(Some(unsafe { arc_of(n) }), t), early));
        }
        n.slot(t).residency.try_pin(Some(w.generation))?;
        // SAFETY: `n` is a tree node reached under `guard`, alive here.
        let lease = self.lease(Some(unsafe { arc_of(n) }), t);
        Ok((lease, self.tree.path_values(n, t, w.len, guard)))
    }

    /// The protecting step `switch_rescans` (model
    /// `policy_switch_vs_insert`): a switch into a heap-ranked policy drops
    /// the notes taken so far (a scan-ranked policy may have left
    /// thousands) only because a scan of the tier's leaves follows and
    /// finds their leaves (each was linked before its note, and its note
    /// before this drain). Its control drops them without the scan. The
    /// caller holds `c`'s lock.
    fn switch_rescans(&self, c: &mut Candidates, t: usize, guard: &crossbeam_epoch::Guard) {
        self.tree.drain_leaves(t, drop);
        if crate::negative::removed("switch_rescans") {
            c.clear();
            return;
        }
        self.rerank(c, t, guard);
    }
}
