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
///
/// Ties (possible only with a wall clock) are broken by creation stamp,
/// then node id.
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
}

impl EvictionPolicy {
    /// Every policy, in documentation order.
    pub const ALL: [EvictionPolicy; 6] = [
        EvictionPolicy::Lru,
        EvictionPolicy::Lfu,
        EvictionPolicy::Fifo,
        EvictionPolicy::Mru,
        EvictionPolicy::Filo,
        EvictionPolicy::Priority,
    ];

    /// The policy's name as accepted by `FromStr`.
    pub fn name(self) -> &'static str {
        match self {
            EvictionPolicy::Lru => "lru",
            EvictionPolicy::Lfu => "lfu",
            EvictionPolicy::Fifo => "fifo",
            EvictionPolicy::Mru => "mru",
            EvictionPolicy::Filo => "filo",
            EvictionPolicy::Priority => "priority",
        }
    }

    /// Whether a waiting leaf's key can only grow (stamps, hit counts and
    /// priorities only increase), which makes lazily validated candidate
    /// heaps exact. Not so for mru and filo, which rank by a scan.
    pub(crate) fn keys_only_grow(self) -> bool {
        !matches!(self, EvictionPolicy::Mru | EvictionPolicy::Filo)
    }

    /// The eviction key of a (node, device) with these statistics.
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
        };
        EvictionKey(a, b, s.created, s.id)
    }
}

/// The statistics a policy ranks by.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LeafStats {
    pub(crate) last_access: u64,
    pub(crate) created: u64,
    pub(crate) hits: u64,
    pub(crate) priority: i64,
    pub(crate) id: u64,
}

/// A totally ordered eviction key (smallest evicted first).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct EvictionKey(u64, u64, u64, u64);

/// An unknown policy name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown eviction policy {0:?} (expected one of lru, lfu, fifo, mru, filo, priority)")]
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
