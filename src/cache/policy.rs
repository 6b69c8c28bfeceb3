//! Eviction policies: which unpinned leaf goes first.

use std::fmt;
use std::str::FromStr;

/// The order in which unpinned leaves are evicted (smallest key first).
///
/// | policy | key |
/// | --- | --- |
/// | `lru` | last access stamp |
/// | `lfu` | (hit count, last access) — hits are real: every match that consumes or ends on a node counts |
/// | `fifo` | creation stamp |
/// | `mru` | − last access |
/// | `filo` | − creation stamp |
/// | `priority` | (priority, last access) |
/// | `slru` | (segment, last access): probation (not hit since it became a leaf) before protected |
/// | `sieve` | (hand round, creation stamp), with one second chance per round for a leaf hit since the hand last passed it |
/// | `tlru` | (inside the budget, last access): leaves whose tokens lie past their conversation's budget first |
///
/// Ties (possible only with a wall clock) are broken by creation stamp,
/// then node id. The first six are SGLang's (its conformance vectors pin
/// their behaviour), and so are `slru` (SGLang 0.5.23's with
/// [`slru_protected_threshold`](crate::RadixCacheBuilder::slru_protected_threshold))
/// and `tlru`; `slru` and `sieve` are scan-resistant: a burst of
/// one-off requests cannot flush prefixes that are being reused.
///
/// **How the scan-resistant policies map onto a tree.** Only leaves can
/// be evicted, and a node's statistics belong to the node (a split copies
/// them to both halves), so both policies rank leaves, never whole
/// requests:
///
/// * `slru` — segmented LRU by hit count. A node enters the probation
///   segment when it is cached; a match that consumes or ends on it (a
///   later request reusing it) promotes it to the protected segment.
///   Probation leaves go first, in LRU order; protected leaves go, in LRU
///   order, only when no probation leaf is left. A node that becomes a
///   leaf again because its children were evicted re-enters probation:
///   its hits so far were passes through to those children (a finished
///   conversation's history is hit by every turn, then never again), and
///   only hits after that promote it. There is no size limit on the
///   protected segment (a limit would demote leaves while they wait, which
///   the lazily validated candidate heap cannot follow; re-entering
///   probation happens as the node is pushed afresh, which it can).
/// * `sieve` — SIEVE (Zhang et al., NSDI '24) over leaves: the queue is
///   creation order, the hand walks from the oldest leaf to the newest,
///   and a leaf hit since the hand last passed it gets its bit cleared
///   and waits for the next round instead of being evicted. A node that
///   becomes a leaf because its last child was evicted joins right at the
///   hand, with its visited bit clear: its hits so far were passes through
///   to the children just evicted, which say nothing about the prefix
///   alone, and it is as cold as they were (a dead conversation's history
///   goes up the chain, as under fifo). Other leaves joining (new ones, or
///   pinned ones set aside) take their creation position: in the current
///   round if the hand has not passed it yet, otherwise in the next. Not modelled by
///   `reference::SequentialCache` (feature `testing`) (the hand is
///   the evictor's state): the differential tests cover the other eight.
/// * `tlru` — Tail-optimized LRU (Zhang et al., arXiv:2510.15152), as
///   SGLang 0.5.23's `TLRUStrategy` ranks it. A conversation whose history
///   is `L` tokens and whose next prompt adds about `Q`
///   ([`tlru_next_prompt_estimate`](crate::RadixCacheBuilder::tlru_next_prompt_estimate))
///   only needs `L + Q − T` of them cached for its next prefill to fit the
///   budget of `T` tokens
///   ([`tlru_threshold`](crate::RadixCacheBuilder::tlru_threshold)); a
///   leaf whose tokens all lie past that (the tokens before it on its path
///   cover the budget) goes first, in LRU order, then the rest in LRU
///   order. `L` is the deepest end depth the leaf's branch has reached
///   since it was cached, not what is left of it: a conversation trimmed
///   to its budget stays there instead of being walked down to nothing.
///   With both at 0 (SGLang's defaults) no leaf is past its budget, and
///   the order is LRU's.
///
/// ```
/// use radixkv::EvictionPolicy;
/// let p: EvictionPolicy = "lru".parse().unwrap();
/// assert_eq!(p, EvictionPolicy::Lru);
/// assert!("nope".parse::<EvictionPolicy>().is_err());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum EvictionPolicy {
    /// Least recently used.
    #[default]
    Lru,
    /// Least frequently used, then least recently used.
    Lfu,
    /// Oldest created first.
    Fifo,
    /// Most recently used.
    Mru,
    /// Newest created first.
    Filo,
    /// Lowest priority first, then least recently used.
    Priority,
    /// Segmented LRU: leaves never hit since they were cached, then the rest, each in LRU order.
    Slru,
    /// SIEVE over leaves in creation order: a leaf hit since the hand last passed gets one more round.
    Sieve,
    /// Tail-optimized LRU: leaves past their conversation's budget, then the rest, each in LRU order.
    Tlru,
}

impl EvictionPolicy {
    /// Every policy, in documentation order.
    pub const ALL: [EvictionPolicy; 9] = [
        EvictionPolicy::Lru,
        EvictionPolicy::Lfu,
        EvictionPolicy::Fifo,
        EvictionPolicy::Mru,
        EvictionPolicy::Filo,
        EvictionPolicy::Priority,
        EvictionPolicy::Slru,
        EvictionPolicy::Sieve,
        EvictionPolicy::Tlru,
    ];

    /// Whether the eviction order is a function of each leaf's own
    /// statistics (every policy but `sieve`, whose order also depends on
    /// the evictor's hand), so that
    /// `reference::SequentialCache` (feature `testing`) reproduces it
    /// exactly.
    pub fn is_stateless(self) -> bool {
        self != EvictionPolicy::Sieve
    }

    /// The policy's name as accepted by `FromStr`.
    pub fn name(self) -> &'static str {
        match self {
            EvictionPolicy::Lru => "lru",
            EvictionPolicy::Lfu => "lfu",
            EvictionPolicy::Fifo => "fifo",
            EvictionPolicy::Mru => "mru",
            EvictionPolicy::Filo => "filo",
            EvictionPolicy::Priority => "priority",
            EvictionPolicy::Slru => "slru",
            EvictionPolicy::Sieve => "sieve",
            EvictionPolicy::Tlru => "tlru",
        }
    }

    /// Whether a waiting leaf's key can only grow (stamps, hit counts and
    /// priorities only increase), which makes lazily validated candidate
    /// heaps exact. Not so for mru and filo, which rank by a scan. (For
    /// sieve, the heap holds the hand's order, which only the evictor
    /// changes. For tlru, a branch growing deeper only raises a key; a
    /// split lowers the key of the node whose first tokens it moves out,
    /// and files that node again as a new leaf is filed: its new entry's
    /// bound is exact.)
    pub(crate) fn keys_only_grow(self) -> bool {
        !matches!(self, EvictionPolicy::Mru | EvictionPolicy::Filo)
    }

    /// The eviction key of a (node, device) with these statistics. For
    /// sieve, the key of a leaf joining the queue in round 0 with its visited
    /// bit judged from its creation; the evictor places it by its hand.
    /// A key no greater than the key of any leaf whose last access (on the
    /// device) was at least `last_access`, for the policies whose keys only
    /// grow (`None` for Sieve, whose heap key depends on the hand, and for
    /// Mru and Filo, which do not use the heap). Every component of a key is
    /// a non-decreasing function of the statistics, and this sets what is
    /// unknown to its least value (for Priority, the least priority: a leaf
    /// of higher priority is popped early, re-ranked and pushed back): the
    /// candidate heap can file a new leaf under it and validate when the
    /// entry is popped.
    pub(crate) fn lower_bound(self, last_access: u64) -> Option<EvictionKey> {
        let (a, b) = match self {
            // Fifo: a leaf's `created` is stamped after its `last_access`
            // when it is linked or made resident.
            EvictionPolicy::Lru | EvictionPolicy::Fifo => (last_access, 0),
            // Lfu, Slru and (with the least priority, encoded as 0)
            // Priority rank by a count or class first, then last access.
            EvictionPolicy::Lfu
            | EvictionPolicy::Slru
            | EvictionPolicy::Priority
            | EvictionPolicy::Tlru => (0, last_access),
            EvictionPolicy::Mru | EvictionPolicy::Filo | EvictionPolicy::Sieve => return None,
        };
        Some(EvictionKey(a, b, 0, 0))
    }

    pub(crate) fn key(self, s: &LeafStats) -> EvictionKey {
        // Order-preserving u64 encodings: `!x` reverses an order ("-x"), and
        // flipping the sign bit maps i64 onto u64 monotonically.
        let prio = (s.priority as u64) ^ (1 << 63);
        let (a, b) = match self {
            EvictionPolicy::Lru => (s.last_access, 0),
            EvictionPolicy::Lfu => (s.hits, s.last_access),
            EvictionPolicy::Fifo => (s.created, 0),
            EvictionPolicy::Mru => (!s.last_access, 0),
            EvictionPolicy::Filo => (!s.created, 0),
            EvictionPolicy::Priority => (prio, s.last_access),
            EvictionPolicy::Slru => match s.slru_threshold {
                Some(n) => (u64::from(s.hits >= n), s.last_access),
                None => (u64::from(s.hits > s.hits_base), s.last_access),
            },
            EvictionPolicy::Sieve => return EvictionKey(0, s.created, s.created, s.id),
            EvictionPolicy::Tlru => (u64::from(!s.tlru.past_budget(s)), s.last_access),
        };
        EvictionKey(a, b, s.created, s.id)
    }
}

/// When a node's hit count (what lfu and slru rank by) grows.
///
/// ```
/// use radixkv::{DeviceId, HitCounts, RadixCache, TokenKey};
/// let c = RadixCache::builder().hit_counts(HitCounts::OnInsert).build().unwrap();
/// c.insert(TokenKey::new(&[1, 2]), DeviceId(0), &[5, 6], 0).unwrap();
/// // A match counts nothing: the one hit is the insert's.
/// assert_eq!(c.match_prefix(TokenKey::new(&[1, 2]), DeviceId(0)).unwrap().hits, 1);
/// assert_eq!(c.match_prefix(TokenKey::new(&[1, 2]), DeviceId(0)).unwrap().hits, 1);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum HitCounts {
    /// Every match that consumes or ends on a node counts a hit on it
    /// (radixkv's rule, the default; SGLang 0.5.9 counted no hits, so its
    /// conformance vectors leave lfu out).
    #[default]
    OnMatch,
    /// Every insert that passes or creates a node whose key ends past the
    /// tokens the same request inserted before counts a hit on it, once
    /// (SGLang 0.5.23: [`RadixCache::insert_counting`](crate::RadixCache::insert_counting)
    /// says how far; [`RadixCache::insert`](crate::RadixCache::insert) counts
    /// every node). Matches count nothing.
    OnInsert,
}

/// The statistics a policy ranks by.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LeafStats {
    pub(crate) last_access: u64,
    pub(crate) created: u64,
    pub(crate) hits: u64,
    /// `hits` when the node last became a leaf by eviction of its children.
    pub(crate) hits_base: u64,
    /// Slru's rule: `None`, a hit since the node last became a leaf
    /// protects it; `Some(n)`, `n` hits in all do (SGLang 0.5.23's
    /// `protected_threshold`).
    pub(crate) slru_threshold: Option<u64>,
    pub(crate) priority: i64,
    pub(crate) id: u64,
    /// Tokens before the node's key on its path.
    pub(crate) start: u64,
    /// The deepest end depth its branch has reached.
    pub(crate) deepest: u64,
    /// Tlru's budget.
    pub(crate) tlru: TlruBudget,
}

/// Tlru's settings, in tokens: the prefill budget `T`
/// ([`threshold`](Self::threshold)) and the expected length of a
/// conversation's next prompt `Q`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct TlruBudget {
    /// `T`: tokens a next prefill may recompute.
    pub(crate) threshold: u64,
    /// `Q`: tokens the next prompt is expected to add.
    pub(crate) next_prompt_estimate: u64,
}

impl TlruBudget {
    /// Whether all of a leaf's tokens lie past its conversation's budget:
    /// the tokens before it cover `max(L + Q − T, 0)`, `L` its branch's
    /// deepest end depth (SGLang's `TLRUStrategy.get_priority`).
    pub(crate) fn past_budget(self, s: &LeafStats) -> bool {
        let needed = s
            .deepest
            .saturating_add(self.next_prompt_estimate)
            .saturating_sub(self.threshold);
        s.start >= needed
    }
}

/// A totally ordered eviction key (smallest evicted first).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct EvictionKey(u64, u64, u64, u64);

impl EvictionKey {
    /// Sieve: (round, position in the queue: a creation stamp), the stamp
    /// the leaf's visited bit is judged against, and the node id.
    pub(crate) fn sieve(round: u64, order: u64, seen: u64, id: u64) -> Self {
        EvictionKey(round, order, seen, id)
    }

    /// The node id the key ends with (its last tie-breaker).
    pub(crate) fn id(&self) -> u64 {
        self.3
    }

    /// Sieve: the key's (round, position, seen stamp).
    pub(crate) fn sieve_parts(&self) -> (u64, u64, u64) {
        (self.0, self.1, self.2)
    }
}

/// An unknown policy name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown eviction policy {0:?} (expected one of lru, lfu, fifo, mru, filo, priority, slru, sieve, tlru)"
)]
pub struct UnknownPolicy(pub String);

impl FromStr for EvictionPolicy {
    type Err = UnknownPolicy;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        EvictionPolicy::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| UnknownPolicy(s.to_string()))
    }
}

impl fmt::Display for EvictionPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
