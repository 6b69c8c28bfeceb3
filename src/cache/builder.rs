//! [`RadixCacheBuilder`]: every option of a cache, with its default, checked
//! at [`build`](RadixCacheBuilder::build). Its type parameter is the kind
//! of ownership the cache will have: [`pages_per_device`](RadixCacheBuilder::pages_per_device)
//! turns a builder of a [`CallerValues`] cache into one of an
//! [`OwnedPages`] cache, and only the latter takes watermarks.

use super::eviction::Candidates;
use super::ownership::{CallerValues, OwnedPages, Ownership};
use super::policy::TlruBudget;
use super::{policy_index, CacheError, ClockKind, EvictionPolicy, HitCounts, RadixCache};
use crate::alloc::{PageAllocator, WatermarkListener};
use crate::device::{DeviceId, Tier};
use crate::sync::{Arc, AtomicU64};
use crate::tree::clock::Clock;
use crate::tree::state::Tree;
use crossbeam_utils::CachePadded;
use std::marker::PhantomData;

/// The largest supported page size in tokens.
pub const MAX_PAGE_SIZE: usize = 1 << 16;
/// The largest supported number of devices.
pub const MAX_DEVICES: usize = 1024;

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
#[derive(Debug)]
pub struct RadixCacheBuilder<P: Ownership = CallerValues> {
    page_size: usize,
    devices: usize,
    policy: EvictionPolicy,
    clock: ClockKind,
    pages_per_device: usize,
    watermarks: Option<(usize, usize)>,
    replica_aware: bool,
    host_pages: Option<usize>,
    listener: Option<crate::events::Listener>,
    hit_counts: HitCounts,
    slru_threshold: Option<u64>,
    tlru: TlruBudget,
    candidate_heap: bool,
    kind: PhantomData<fn() -> P>,
}

impl<P: Ownership> Clone for RadixCacheBuilder<P> {
    fn clone(&self) -> Self {
        RadixCacheBuilder {
            listener: self.listener.clone(),
            kind: PhantomData,
            ..*self
        }
    }
}

impl Default for RadixCacheBuilder<CallerValues> {
    fn default() -> Self {
        RadixCacheBuilder {
            page_size: 1,
            devices: 1,
            policy: EvictionPolicy::Lru,
            clock: ClockKind::Logical,
            pages_per_device: 0,
            watermarks: None,
            replica_aware: false,
            host_pages: None,
            listener: None,
            hit_counts: HitCounts::OnMatch,
            slru_threshold: None,
            tlru: TlruBudget::default(),
            candidate_heap: true,
            kind: PhantomData,
        }
    }
}

impl<P: Ownership> RadixCacheBuilder<P> {
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

    /// Whether eviction keeps a candidate heap per tier (default on): every
    /// insert notes the leaves it makes, and an eviction pops them in
    /// policy order. Off, nothing is noted and every eviction ranks the
    /// tier's leaves by a scan instead (as mru and filo always do). For a
    /// tree that is seldom evicted by the policy and mostly changed by key
    /// ([`RadixCache::evict_from`](super::RadixCache::evict_from): an index
    /// fed by removal events), whose notes would otherwise pile up until
    /// the next eviction, each keeping its node (and the node's tokens)
    /// alive after it is unlinked.
    ///
    /// ```
    /// use radixkv::{DeviceId, RadixCache, TokenKey};
    /// let c = RadixCache::builder().candidate_heap(false).build().unwrap();
    /// c.insert(TokenKey::new(&[1, 2]), DeviceId(0), &[5, 6], 0).unwrap(); // older
    /// c.insert(TokenKey::new(&[3, 4]), DeviceId(0), &[7, 8], 0).unwrap();
    /// // The same lru order, found by a scan:
    /// assert_eq!(c.evict(DeviceId(0), 2).unwrap().values, vec![5, 6]);
    /// ```
    pub fn candidate_heap(mut self, on: bool) -> Self {
        self.candidate_heap = on;
        self
    }

    /// Adds a host tier of `pages` pages (default: none): one more
    /// residency slot per node, over host memory shared by every device's
    /// scheduler, so a prefix evicted from a GPU (or held by another one)
    /// can be loaded instead of recomputed. The tier is [`Tier::Host`],
    /// which every per-tier call accepts (insert, match and pin, evict,
    /// alloc, sizes); its residency is prefix-closed like a device's, and
    /// eviction ranks its leaves by the cache's policy. When the cache owns
    /// its pages the tier gets a page allocator of its own (page 0
    /// reserved, so `pages` ≥ 2; the watermarks apply to it too); otherwise
    /// `pages` only has to be valid. See
    /// [`RadixCache::peek_tiers`](super::RadixCache::peek_tiers) and
    /// [`MatchResult::host_len`](super::MatchResult::host_len).
    ///
    /// ```
    /// use radixkv::{DeviceId, RadixCache, Tier, TokenKey};
    /// let c = RadixCache::builder().devices(2).host_pages(64).build().unwrap();
    /// assert!(c.has_host_tier());
    /// c.insert(TokenKey::new(&[1, 2, 3]), Tier::Host, &[7, 8, 9], 0).unwrap();
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

    /// When hit counts grow (default [`HitCounts::OnMatch`], radixkv's
    /// rule; [`HitCounts::OnInsert`] is SGLang 0.5.23's): what lfu and slru
    /// rank by.
    pub fn hit_counts(mut self, h: HitCounts) -> Self {
        self.hit_counts = h;
        self
    }

    /// Slru's protected segment by a threshold (default none): with `n`, a
    /// leaf with at least `n` hits in all is protected (SGLang 0.5.23's
    /// `protected_threshold`, 2 there by default); without, a leaf hit
    /// since it last became a leaf is (radixkv's segment rule, see
    /// [`EvictionPolicy`]).
    ///
    /// ```
    /// use radixkv::{EvictionPolicy, RadixCache};
    /// let c = RadixCache::builder()
    ///     .eviction_policy(EvictionPolicy::Slru)
    ///     .slru_protected_threshold(2)
    ///     .build();
    /// assert!(c.is_ok());
    /// assert!(RadixCache::builder().slru_protected_threshold(0).build().is_err());
    /// ```
    pub fn slru_protected_threshold(mut self, n: u64) -> Self {
        self.slru_threshold = Some(n);
        self
    }

    /// Tlru's prefill budget `T` in tokens (default 0; `threshold` in
    /// SGLang's `--radix-eviction-policy-config`, in tokens too): the tokens
    /// a conversation's next prefill may recompute. See [`EvictionPolicy`]
    /// for the order.
    ///
    /// ```
    /// use radixkv::{DeviceId, EvictionPolicy, RadixCache, TokenKey};
    /// let c = RadixCache::builder()
    ///     .eviction_policy(EvictionPolicy::Tlru)
    ///     .tlru_threshold(4)
    ///     .build()?;
    /// let d = DeviceId(0);
    /// // An older conversation of 8 tokens in one node: all within its budget.
    /// c.insert(TokenKey::new(&[20; 8]), d, &[30; 8], 0)?;
    /// // A newer one that grew to 8 tokens: its last 4 lie past its budget.
    /// c.insert(TokenKey::new(&[1, 2, 3, 4]), d, &[10, 11, 12, 13], 0)?;
    /// c.insert(TokenKey::new(&[1, 2, 3, 4, 5, 6, 7, 8]), d, &[10, 11, 12, 13, 14, 15, 16, 17], 0)?;
    /// // LRU would take the older conversation; tlru trims the newer one's tail.
    /// assert_eq!(c.evict(d, 1)?.values, vec![14, 15, 16, 17]);
    /// // Trimmed to its budget, it now goes in LRU order, after the older one.
    /// assert_eq!(c.evict(d, 1)?.values, vec![30; 8]);
    /// # Ok::<(), radixkv::CacheError>(())
    /// ```
    pub fn tlru_threshold(mut self, tokens: u64) -> Self {
        self.tlru.threshold = tokens;
        self
    }

    /// Tlru's estimate `Q` of the tokens a conversation's next prompt adds
    /// (default 0; `next_prompt_estimate` in SGLang's
    /// `--radix-eviction-policy-config`). A leaf is past
    /// its conversation's budget when the tokens before it cover
    /// `L + Q − T`: with `Q` at `T` or more, none is, and tlru ranks as lru.
    ///
    /// ```
    /// use radixkv::{EvictionPolicy, RadixCache};
    /// let c = RadixCache::builder()
    ///     .eviction_policy(EvictionPolicy::Tlru)
    ///     .tlru_threshold(2048)
    ///     .tlru_next_prompt_estimate(512)
    ///     .build();
    /// assert!(c.is_ok());
    /// ```
    pub fn tlru_next_prompt_estimate(mut self, tokens: u64) -> Self {
        self.tlru.next_prompt_estimate = tokens;
        self
    }

    /// Tells `listener` about every page that becomes resident on a tier or
    /// leaves it (default none): see [`events`](crate::events) for what is
    /// reported, in which order, and what it costs.
    pub fn listener(mut self, listener: std::sync::Arc<dyn crate::events::CacheListener>) -> Self {
        self.listener = Some(crate::events::Listener(listener));
        self
    }

    /// The same settings for a cache of ownership `Q`.
    fn kind<Q: Ownership>(self) -> RadixCacheBuilder<Q> {
        RadixCacheBuilder {
            page_size: self.page_size,
            devices: self.devices,
            policy: self.policy,
            clock: self.clock,
            pages_per_device: self.pages_per_device,
            watermarks: self.watermarks,
            replica_aware: self.replica_aware,
            host_pages: self.host_pages,
            listener: self.listener,
            hit_counts: self.hit_counts,
            slru_threshold: self.slru_threshold,
            tlru: self.tlru,
            candidate_heap: self.candidate_heap,
            kind: PhantomData,
        }
    }

    /// The checks every cache's settings pass, and its tree and eviction
    /// state; `pages` makes the ownership from the tier count.
    fn build_with(
        self,
        pages: impl FnOnce(&Self, usize) -> Result<P, CacheError>,
    ) -> Result<RadixCache<P>, CacheError> {
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
        if self.slru_threshold == Some(0) {
            return Err(CacheError::InvalidConfig(
                "an slru protected threshold of 0 protects every leaf: give it at least 1".into(),
            ));
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
        let pages = pages(&self, tiers)?;
        // Relaxed suffices: cache ids only need to be unique. A plain std
        // atomic (not the shim's) because it is a process-wide static, not
        // part of any protocol.
        static NEXT_CACHE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let cache = RadixCache {
            pages,
            id: NEXT_CACHE.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            tree: Tree::new(
                self.page_size,
                (tiers, self.devices),
                clock,
                self.listener,
                (self.hit_counts == HitCounts::OnMatch, self.candidate_heap),
            ),
            candidates: (0..tiers)
                .map(|_| crate::sync::Mutex::new(Candidates::default()))
                .collect(),
            policy: AtomicU64::new(policy_index(self.policy)),
            replica_aware: self.replica_aware,
            hits_on_insert: self.hit_counts == HitCounts::OnInsert,
            slru_threshold: self.slru_threshold,
            tlru: self.tlru,
            leases: (0..tiers)
                .map(|_| CachePadded::new(AtomicU64::new(0)))
                .collect(),
        };
        if self.policy == EvictionPolicy::Tlru {
            // Tlru's bookkeeping, from the first insert on.
            cache.tree.track_depths(&crossbeam_epoch::pin());
        }
        Ok(cache)
    }
}

impl RadixCacheBuilder<CallerValues> {
    /// Gives every device a page allocator of `pages` pages (page 0
    /// reserved) of `page_size` slots, and makes the cache own its pages:
    /// the builder now builds a [`PagedCache`](super::PagedCache), whose
    /// requests allocate [`PageSpan`](crate::alloc::PageSpan)s,
    /// [`insert_pages`](super::RadixCache::insert_pages) hands them to the
    /// tree (returning duplicates to the allocator) and eviction returns
    /// pages to the allocator. Without it (the default) values are whatever
    /// the caller inserts.
    pub fn pages_per_device(mut self, pages: usize) -> RadixCacheBuilder<OwnedPages> {
        self.pages_per_device = pages;
        self.kind()
    }

    /// Validates the settings and builds the cache.
    pub fn build(self) -> Result<RadixCache<CallerValues>, CacheError> {
        self.build_with(|_, _| Ok(CallerValues::default()))
    }
}

impl RadixCacheBuilder<OwnedPages> {
    /// Low and high watermarks in free pages per tier: when an allocation
    /// takes a tier below `low`, the background evictor
    /// ([`RadixCache::start_evictor`](super::RadixCache::start_evictor))
    /// evicts until `high` pages are free. Default: none. Suggested: about
    /// 2 % and 5 % of the pages.
    pub fn watermarks(mut self, low: usize, high: usize) -> Self {
        self.watermarks = Some((low, high));
        self
    }

    /// Validates the settings and builds the cache.
    pub fn build(self) -> Result<RadixCache<OwnedPages>, CacheError> {
        self.build_with(|b, tiers| b.owned_pages(tiers))
    }

    /// The allocators (one per tier), the watermarks and their signal.
    fn owned_pages(&self, tiers: usize) -> Result<OwnedPages, CacheError> {
        let pages = self.pages_per_device;
        let (signal_tx, signal_rx) = std::sync::mpsc::channel::<usize>();
        let listener: Option<WatermarkListener> = match self.watermarks {
            None => None,
            Some((low, high)) => {
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
                let devices = self.devices;
                let tx = std::sync::Mutex::new(signal_tx);
                Some(Arc::new(move |t: Tier, _free: usize| {
                    let slot = t.device().map_or(devices, DeviceId::index);
                    if let Ok(tx) = tx.lock() {
                        let _ = tx.send(slot);
                    }
                }))
            }
        };
        let low = self.watermarks.map_or(0, |w| w.0);
        let allocators = (0..tiers)
            .map(|t| {
                let (tier, n) = if t < self.devices {
                    (Tier::Device(DeviceId(t as u32)), pages)
                } else {
                    (Tier::Host, self.host_pages.unwrap_or(pages))
                };
                PageAllocator::with_watermark(tier, n, self.page_size, low, listener.clone())
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(OwnedPages {
            allocators: allocators.into_boxed_slice(),
            watermarks: self.watermarks,
            levels: (
                AtomicU64::new(self.watermarks.map_or(0, |w| w.0 as u64)),
                AtomicU64::new(self.watermarks.map_or(0, |w| w.1 as u64)),
            ),
            evictor_signal: std::sync::Mutex::new(Some(signal_rx)),
        })
    }
}
