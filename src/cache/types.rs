//! The public value types of the cache API: keys ([`TokenKey`]), the clock
//! choice ([`ClockKind`]), errors ([`CacheError`]), pins, handles and
//! places ([`Lease`], [`NodeHandle`], [`TreePlace`]) and what operations return
//! ([`MatchResult`], [`InsertResult`], [`Evicted`], [`EvictedFrom`], [`Sizes`]). They are
//! re-exported from [`crate::cache`]; the operations that make them are on
//! [`RadixCache`](super::RadixCache).

use super::policy::UnknownPolicy;
use crate::alloc::AllocError;
use crate::device::{DeviceId, Tier};
use crate::sync::{Arc, AtomicU64, Ordering};
use crate::tree::node::Node;
use crossbeam_utils::CachePadded;
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
    pub(super) tokens: &'a [u32],
    pub(super) namespace: Option<&'a str>,
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

/// The tag that starts the namespace of a LoRA adapter
/// ([`TokenKey::namespace_for`]).
const LORA_TAG: &str = "lora:";
/// Separates a LoRA name from a salt inside a namespace.
const SALT_SEP: char = '\u{1f}';

impl TokenKey<'_> {
    /// The namespace of a request that names a LoRA adapter and a cache
    /// salt (`None` for neither, or both empty): the salt alone, or
    /// `lora:<name>` with the salt after a U+001F separator. Requests share
    /// cached prefixes only within one namespace, so a salt isolates a
    /// tenant and an adapter never reuses another's KV.
    /// [`namespace_parts`](Self::namespace_parts) splits a namespace back
    /// (exactly, unless the salt itself starts with `lora:` or holds a
    /// U+001F). The KV events and the server name namespaces by this rule.
    ///
    /// ```
    /// use radixkv::TokenKey;
    /// assert_eq!(TokenKey::namespace_for(None, None), None);
    /// assert_eq!(TokenKey::namespace_for(None, Some("t1")).as_deref(), Some("t1"));
    /// let ns = TokenKey::namespace_for(Some("math"), Some("t1")).unwrap();
    /// assert_eq!(TokenKey::namespace_parts(&ns), (Some("math"), Some("t1")));
    /// let key = TokenKey::new(&[1, 2]).in_namespace(Some(&ns));
    /// assert_eq!(key.namespace(), Some("lora:math\u{1f}t1"));
    /// ```
    pub fn namespace_for(lora_name: Option<&str>, cache_salt: Option<&str>) -> Option<String> {
        let lora_name = lora_name.filter(|l| !l.is_empty());
        let cache_salt = cache_salt.filter(|s| !s.is_empty());
        match (lora_name, cache_salt) {
            (None, None) => None,
            (None, Some(s)) => Some(s.to_owned()),
            (Some(l), None) => Some(format!("{LORA_TAG}{l}")),
            (Some(l), Some(s)) => Some(format!("{LORA_TAG}{l}{SALT_SEP}{s}")),
        }
    }

    /// A namespace's LoRA name and cache salt (see
    /// [`namespace_for`](Self::namespace_for)): a namespace that starts
    /// with `lora:` names an adapter, with the salt after the first U+001F;
    /// any other is a salt.
    pub fn namespace_parts(ns: &str) -> (Option<&str>, Option<&str>) {
        match ns.strip_prefix(LORA_TAG) {
            None => (None, Some(ns).filter(|s| !s.is_empty())),
            Some(rest) => match rest.split_once(SALT_SEP) {
                Some((l, s)) => (Some(l), Some(s)),
                None => (Some(rest), None),
            },
        }
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
#[non_exhaustive]
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
    /// A handle whose node left the tree on its tier (evicted, possibly
    /// re-inserted since).
    #[error("stale handle: the matched node left the tree on {0}")]
    StaleHandle(Tier),
    /// A handle made by another cache.
    #[error("the handle belongs to another cache")]
    ForeignHandle,
    /// 2^32 - 1 leases on one node and tier.
    #[error("too many leases on one node")]
    PinOverflow,
    /// A builder setting out of range.
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// An unknown eviction policy name.
    #[error(transparent)]
    UnknownPolicy(#[from] UnknownPolicy),
    /// The tier's allocator could not serve the request.
    #[error(transparent)]
    Alloc(#[from] AllocError),
    /// A span of another cache's allocator.
    #[error("the span belongs to another cache")]
    ForeignSpan,
    /// [`Tier::Host`] on a cache built without a host tier
    /// ([`RadixCacheBuilder::host_pages`](super::RadixCacheBuilder::host_pages)).
    #[error("the cache has no host tier")]
    NoHostTier,
    /// A copy whose source and destination are the same tier.
    #[error("a copy from {0} to itself")]
    CopyToItself(Tier),
}

/// A pin on a matched prefix on one tier: while it lives, the prefix's
/// values stay resident on that tier, unchanged (I3). Dropping it
/// releases the pin. A lease on an empty match protects nothing.
#[derive(Debug)]
pub struct Lease {
    node: Option<Arc<Node>>,
    tier: Tier,
    /// The tier's residency slot.
    slot: usize,
    counters: Arc<[CachePadded<AtomicU64>]>,
}

impl Lease {
    /// A lease on `node` (already pinned on `(tier, slot)` by the caller),
    /// counted in `counters` while it lives.
    pub(super) fn new(
        node: Option<Arc<Node>>,
        (tier, slot): (Tier, usize),
        counters: &Arc<[CachePadded<AtomicU64>]>,
    ) -> Self {
        if node.is_some() {
            counters[slot].fetch_add(1, Ordering::SeqCst);
        }
        Lease {
            node,
            tier,
            slot,
            counters: Arc::clone(counters),
        }
    }

    /// The tier the lease holds pages on.
    pub fn tier(&self) -> Tier {
        self.tier
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
            n.slot(self.slot).residency.unpin();
            self.counters[self.slot].fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// A reference to the end node of a match that outlives the match: it can be
/// pinned later with [`RadixCache::pin`](super::RadixCache::pin), which fails with
/// [`CacheError::StaleHandle`] if the node left the tree on that tier in
/// between (generation-checked).
#[derive(Clone, Debug)]
pub struct NodeHandle {
    pub(super) cache: u64,
    pub(super) node: Option<Arc<Node>>,
    pub(super) tier: Tier,
    /// The tier's residency slot.
    pub(super) slot: usize,
    pub(super) generation: u64,
    /// Tokens root → the node.
    pub(super) len: usize,
}

impl NodeHandle {
    /// Whether the match ended at the root (matched nothing).
    pub fn is_root(&self) -> bool {
        self.node.is_none()
    }

    /// The tier of the match.
    pub fn tier(&self) -> Tier {
        self.tier
    }

    /// The id of the end node (`None` at the root): unique for the cache's
    /// life, the id [`events`](crate::events) name it by. A split of the
    /// node moves its first pages to a new node and keeps this id on the
    /// rest, so the handle names the same end position after it.
    pub fn id(&self) -> Option<u64> {
        self.node.as_ref().map(|n| n.id)
    }

    /// Tokens from the root through the end node (the match's length).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the handle names the root (as [`is_root`](Self::is_root)).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// A place in the tree: the end of a node's key, `len` tokens from its
/// namespace's root, kept to reach that path again without walking down
/// from the root ([`RadixCache::insert_placed`](super::RadixCache::insert_placed)
/// gives one, [`RadixCache::evict_from_place`](super::RadixCache::evict_from_place)
/// takes it). The place stays as the node is split (its object keeps the
/// pages that end there) and is gone once the node leaves the tree (no
/// tier holds it any more); holding it keeps the node's memory, not its
/// residency. Two words, so that a caller can keep one per block: a cache
/// gives places for paths of up to `u32::MAX` tokens, and only while it is
/// one of the first `u32::MAX` caches made in the process (the id its
/// places are checked against).
#[derive(Clone, Debug)]
pub struct TreePlace {
    pub(super) node: Arc<Node>,
    pub(super) len: u32,
    pub(super) cache: u32,
}

impl TreePlace {
    /// Tokens from the namespace's root to the place.
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// Whether the place is at a root (never: a place ends a node's key,
    /// which is not empty; for the convention of `len`).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// The result of a match on one tier.
#[non_exhaustive]
#[derive(Debug)]
pub struct MatchResult {
    /// Tokens of the key resident on the asked tier (a multiple of the
    /// page size).
    pub len: usize,
    /// The values of those tokens; filled only by
    /// [`RadixCache::match_and_pin`](super::RadixCache::match_and_pin).
    pub values: Vec<u32>,
    /// The pin, for [`RadixCache::match_and_pin`](super::RadixCache::match_and_pin).
    pub lease: Option<Lease>,
    /// The end node, to pin later.
    pub handle: NodeHandle,
    /// The longest prefix resident on any device…
    pub any_len: usize,
    /// …and the device holding it (the asked device when it ties). Devices
    /// only: the host tier is [`host_len`](Self::host_len).
    pub any_device: Option<DeviceId>,
    /// Tokens of the key resident on the host tier (0 without one): the
    /// part beyond `len` can be loaded from the host instead of
    /// recomputed.
    pub host_len: usize,
    /// Matches on the asked device that consumed or ended on the node this
    /// one ended on, this one included (0 for an empty match): the hit
    /// count a selective write-through policy compares with its threshold.
    pub hits: u64,
}

/// Resident prefix lengths of one key on every tier
/// ([`RadixCache::peek_tiers`](super::RadixCache::peek_tiers)).
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TierLengths {
    /// Per device (index = device), as [`RadixCache::peek`](super::RadixCache::peek).
    pub devices: Vec<usize>,
    /// On the host tier; 0 without one.
    pub host: usize,
}

/// What an insert did with the caller's values.
#[non_exhaustive]
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
#[non_exhaustive]
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
    /// Tokens copied to the host tier before their eviction
    /// ([`RadixCache::evict_with_write_back`](super::RadixCache::evict_with_write_back)),
    /// ancestors included.
    pub written_back: usize,
    /// Where each evicted leaf's values end in [`values`](Self::values),
    /// in eviction order (external-value mode; empty when the cache owns
    /// its pages): leaf `i` holds `values[leaf_ends[i - 1]..leaf_ends[i]]`.
    pub leaf_ends: Vec<usize>,
    /// Candidates the call looked at: newly inserted leaves taken in, heap
    /// entries popped, or, for the policies that rank by a scan (mru,
    /// filo), every leaf of the device. A measure of the call's work.
    pub examined: usize,
}

/// What [`RadixCache::evict_from_place`](super::RadixCache::evict_from_place)
/// and [`RadixCache::evict_from_with_place`](super::RadixCache::evict_from_with_place)
/// did: the eviction, and the place where the path above the evicted page
/// now ends (what a caller keeps for the block above it, to take that one
/// out later the same way).
#[non_exhaustive]
#[derive(Debug, Clone, Default)]
pub struct EvictedFrom {
    /// What went.
    pub evicted: Evicted,
    /// The place that ends where the evicted page started; `None` when the
    /// page was the path's first, or the tree did not hold it.
    pub above: Option<TreePlace>,
}

/// Cached token counts on one device.
#[non_exhaustive]
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
