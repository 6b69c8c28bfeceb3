//! The tree's shape as SGLang sees it, kept beside the core's tree from its
//! residency events: per node its parent, length, lock count and place
//! among its siblings, so that the backend answers SGLang's questions the
//! way SGLang's own `RadixCache` does, in O(1) or O(depth):
//!
//! * `evictable_size` / `protected_size`: counters, moved along a path by
//!   each lock and unlock (a node is protected while any lock below or on
//!   it is held);
//! * `dfs_weight_order`: children in the order they joined their parent (a
//!   new leaf joins last; the upper part of a split takes the split node's
//!   place; an evicted node leaves);
//! * KV events: each node's page digests (SGLang's block-hash chain), for
//!   its `BlockStored` and later its `BlockRemoved`.
//!
//! The core calls the listener inside its locked sections, in an order per
//! node that the events module documents (a store before anything else of
//! the node, a split before the new prefix node's events, a child's
//! removal before its parent's), so the mirror always finds the parent of
//! a store and the node of a split or removal.
//!
//! The locks SGLang takes live here too: a node's lock count, the core pin
//! (`Lease`) behind each of its own locks, and the sizes change together,
//! under the mirror's one mutex ([`Shape::lock`], [`Shape::unlock`]).
//!
//! Nothing here panics or wraps: every counter changes by checked
//! arithmetic, chosen by the node's lock state. The first change that
//! would break an invariant (a store under an unknown parent, a locked
//! node evicted, a split past a node's end, a counter out of range) leaves
//! the counters as they were and marks the mirror broken; from then on
//! [`Shape::usable`] names that first inconsistency, and the backend
//! raises it from every call instead of answering with a wrong size.
//!
//! | file | what it holds |
//! | --- | --- |
//! | `mod.rs` | the shape's state and its plain queries; the listener |
//! | `namespace.rs` | SGLang's `(extra_key, cache_salt)` as the core's namespace string |
//! | `changes.rs` | stores, splits and removals from the core's events |
//! | `locks.rs` | locks, with their core pins, and the sizes they move |
//! | `views.rs` | the dfs-weight order, the outline and the audit |

mod changes;
mod locks;
mod namespace;
#[cfg(test)]
mod tests;
mod views;

pub(crate) use locks::LockRefused;
pub(crate) use namespace::Namespace;

use crate::sglang::hash::Digest;
use radixkv::events::{CacheListener, PageEvent, SplitEvent};
use radixkv::Lease;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

/// The id the mirror gives SGLang's single root (every namespace's root in
/// the core: SGLang hangs all namespaces off one root).
pub(crate) const ROOT: u64 = u64::MAX;

/// A raw KV event, in SGLang's terms but before its namespace seeding
/// (which reads SGLang's live LoRA table, in Python).
#[derive(Debug)]
pub(crate) enum RawEvent {
    /// A new leaf: its page hashes (first 8 digest bytes, big-endian,
    /// signed), its parent's last page hash (`None` below the root), its
    /// tokens.
    Stored {
        ns: Arc<Namespace>,
        parent: Option<i64>,
        hashes: Vec<i64>,
        tokens: Vec<u32>,
    },
    /// An evicted node's page hashes.
    Removed {
        ns: Arc<Namespace>,
        hashes: Vec<i64>,
    },
}

/// One node of the mirror.
#[derive(Debug)]
struct Node {
    parent: u64,
    /// Tokens (a multiple of the page size).
    len: usize,
    /// Locks on this node or below it.
    lock_ref: u64,
    /// Its key in the parent's `children`: the order it joined.
    slot: u64,
    /// By the order they joined.
    children: BTreeMap<u64, u64>,
    /// Its namespace (kept with events on).
    ns: Option<Arc<Namespace>>,
    /// The digest of each page (with events on), chained from the parent.
    digests: Vec<Digest>,
}

impl Node {
    fn new(parent: u64, len: usize, slot: u64) -> Node {
        Node {
            parent,
            len,
            lock_ref: 0,
            slot,
            children: BTreeMap::new(),
            ns: None,
            digests: Vec::new(),
        }
    }
}

/// The mirror's state (behind [`Mirror`]'s mutex).
#[derive(Debug)]
pub(crate) struct Shape {
    nodes: HashMap<u64, Node>,
    next_slot: u64,
    evictable: usize,
    protected: usize,
    page_size: usize,
    events: bool,
    namespaces: HashMap<Option<String>, Arc<Namespace>>,
    raw: Vec<RawEvent>,
    /// The core pins behind the locks, by node: one per lock taken on the
    /// node itself (not below it).
    leases: HashMap<u64, Vec<Lease>>,
    /// The first inconsistency (a store below an unknown parent, a locked
    /// node evicted, a counter out of range, …): every call raises it.
    broken: Option<String>,
}
impl Shape {
    fn node(&self, id: u64) -> Option<&Node> {
        self.nodes.get(&id)
    }

    /// Tokens that eviction may take: on no locked path.
    pub(crate) fn evictable(&self) -> usize {
        self.evictable
    }

    /// Nodes, the root not counted.
    pub(crate) fn node_count(&self) -> usize {
        self.nodes.len() - 1
    }

    /// Tokens on a locked path.
    pub(crate) fn protected(&self) -> usize {
        self.protected
    }

    /// `Ok` while the mirror is consistent; otherwise its first
    /// inconsistency.
    pub(crate) fn usable(&self) -> Result<(), String> {
        match &self.broken {
            None => Ok(()),
            Some(b) => Err(b.clone()),
        }
    }

    /// Marks the mirror broken (the first inconsistency is kept).
    fn corrupt(&mut self, what: impl FnOnce() -> String) {
        if self.broken.is_none() {
            self.broken = Some(what());
        }
    }

    /// The nodes root → `id` (`id` first), if every one is in the tree.
    fn path(&self, id: u64) -> Option<Vec<u64>> {
        let mut path = Vec::new();
        let mut cur = id;
        while cur != ROOT {
            path.push(cur);
            cur = self.nodes.get(&cur)?.parent;
            if path.len() > self.nodes.len() {
                return None;
            }
        }
        Some(path)
    }

    /// The lock count of `id` (`None` if it is not in the tree).
    pub(crate) fn lock_ref(&self, id: u64) -> Option<u64> {
        if id == ROOT {
            return Some(1);
        }
        self.node(id).map(|n| n.lock_ref)
    }

    /// The raw events since the last call.
    pub(crate) fn take_events(&mut self) -> Vec<RawEvent> {
        std::mem::take(&mut self.raw)
    }
}

/// The mirror, installed as the core cache's listener.
#[derive(Debug)]
pub(crate) struct Mirror(Mutex<Shape>);

impl Mirror {
    /// An empty tree of `page_size` tokens a page; with `events`, digests
    /// and raw events are kept.
    pub(crate) fn new(page_size: usize, events: bool) -> Mirror {
        let mut nodes = HashMap::new();
        nodes.insert(ROOT, Node::new(ROOT, 0, 0));
        Mirror(Mutex::new(Shape {
            nodes,
            next_slot: 1,
            evictable: 0,
            protected: 0,
            page_size,
            events,
            namespaces: HashMap::new(),
            raw: Vec::new(),
            leases: HashMap::new(),
            broken: None,
        }))
    }

    /// The state, locked (a panic elsewhere while it was held does not
    /// make it unreadable: no change here panics midway).
    pub(crate) fn shape(&self) -> MutexGuard<'_, Shape> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl CacheListener for Mirror {
    fn stored(&self, event: &PageEvent<'_>) {
        self.shape().stored(event);
    }

    fn removed(&self, event: &PageEvent<'_>) {
        self.shape().removed(event.node);
    }

    fn split(&self, event: &SplitEvent) {
        self.shape().split(event);
    }
}
