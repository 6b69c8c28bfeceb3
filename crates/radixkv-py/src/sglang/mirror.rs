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

use crate::sglang::hash::{chain, salt_seed, Digest};
use radixkv::events::{CacheListener, PageEvent, SplitEvent};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

/// The id the mirror gives SGLang's single root (every namespace's root in
/// the core: SGLang hangs all namespaces off one root).
pub(crate) const ROOT: u64 = u64::MAX;

/// A namespace as SGLang names it: `(extra_key, cache_salt)`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Namespace {
    pub(crate) extra_key: Option<String>,
    pub(crate) cache_salt: Option<String>,
}

impl Namespace {
    /// The core's namespace string for SGLang's pair: `None` for
    /// `(None, None)`, otherwise each part length-prefixed (`-` for none,
    /// `+<bytes>:<text>`), so that distinct pairs never share a string
    /// (`""` and `None` differ, as they do in SGLang).
    pub(crate) fn encode(extra_key: Option<&str>, cache_salt: Option<&str>) -> Option<String> {
        if extra_key.is_none() && cache_salt.is_none() {
            return None;
        }
        let mut s = String::with_capacity(
            8 + extra_key.map_or(0, str::len) + cache_salt.map_or(0, str::len),
        );
        for part in [extra_key, cache_salt] {
            match part {
                None => s.push('-'),
                Some(p) => {
                    s.push('+');
                    s.push_str(&p.len().to_string());
                    s.push(':');
                    s.push_str(p);
                }
            }
        }
        Some(s)
    }

    /// The pair an [`encode`](Self::encode)d string names (`None` for a
    /// string it did not make).
    pub(crate) fn decode(ns: Option<&str>) -> Option<Namespace> {
        let Some(mut rest) = ns else {
            return Some(Namespace {
                extra_key: None,
                cache_salt: None,
            });
        };
        let mut parts = [None, None];
        for part in &mut parts {
            if let Some(r) = rest.strip_prefix('-') {
                rest = r;
                continue;
            }
            let r = rest.strip_prefix('+')?;
            let (len, r) = r.split_once(':')?;
            let len: usize = len.parse().ok()?;
            let text = r.get(..len)?;
            *part = Some(text.to_string());
            rest = &r[len..];
        }
        if !rest.is_empty() {
            return None;
        }
        let [extra_key, cache_salt] = parts;
        Some(Namespace {
            extra_key,
            cache_salt,
        })
    }
}

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

/// Why a lock or unlock was refused.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum LockRefused {
    /// The node is not in the tree (evicted).
    Gone,
    /// An unlock of a node that holds no lock.
    NotLocked,
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
    /// Set when an event broke an invariant (a store below an unknown
    /// parent, …): `audit` reports it.
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

    /// Locks the path root → `id`: the change of the evictable size (≤ 0).
    pub(crate) fn lock(&mut self, id: u64) -> Result<i64, LockRefused> {
        if id == ROOT {
            return Ok(0);
        }
        if !self.nodes.contains_key(&id) {
            return Err(LockRefused::Gone);
        }
        let mut delta = 0i64;
        let mut cur = id;
        while cur != ROOT {
            let n = self.nodes.get_mut(&cur).ok_or(LockRefused::Gone)?;
            if n.lock_ref == 0 {
                self.evictable -= n.len;
                self.protected += n.len;
                delta -= n.len as i64;
            }
            n.lock_ref += 1;
            cur = n.parent;
        }
        Ok(delta)
    }

    /// Unlocks the path root → `id`: the change of the evictable size (≥ 0).
    pub(crate) fn unlock(&mut self, id: u64) -> Result<i64, LockRefused> {
        if id == ROOT {
            return Ok(0);
        }
        match self.nodes.get(&id) {
            None => return Err(LockRefused::Gone),
            Some(n) if n.lock_ref == 0 => return Err(LockRefused::NotLocked),
            Some(_) => {}
        }
        let mut delta = 0i64;
        let mut cur = id;
        while cur != ROOT {
            let n = self.nodes.get_mut(&cur).ok_or(LockRefused::Gone)?;
            n.lock_ref -= 1;
            if n.lock_ref == 0 {
                self.protected -= n.len;
                self.evictable += n.len;
                delta += n.len as i64;
            }
            cur = n.parent;
        }
        Ok(delta)
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

    /// SGLang's dfs-weight order of requests whose match ended at `ends`
    /// (node ids; `ROOT` for none): indices into `ends`. A node's weight is
    /// its requests and its subtree's; from the root, children are visited
    /// heaviest first (ties in the order they joined), and a node's own
    /// requests follow its subtrees. Requests at the root, and any whose
    /// node left the tree, come last in queue order.
    pub(crate) fn dfs_weight_order(&self, ends: &[u64]) -> Vec<usize> {
        let mut own: HashMap<u64, Vec<usize>> = HashMap::new();
        let mut tail = Vec::new();
        for (i, &id) in ends.iter().enumerate() {
            if id != ROOT && self.nodes.contains_key(&id) {
                own.entry(id).or_default().push(i);
            } else {
                tail.push(i);
            }
        }
        // Weights: each request counts on its node and every ancestor.
        let mut weight: HashMap<u64, usize> = HashMap::new();
        for (&id, reqs) in &own {
            let mut cur = id;
            while cur != ROOT {
                *weight.entry(cur).or_default() += reqs.len();
                cur = self.nodes.get(&cur).map_or(ROOT, |n| n.parent);
            }
        }
        let mut order = Vec::with_capacity(ends.len());
        // Post-order over weighted nodes only (a zero-weight subtree holds
        // no request): (node, children visited).
        let mut stack: Vec<(u64, bool)> = vec![(ROOT, false)];
        while let Some((id, visited)) = stack.pop() {
            if visited {
                if let Some(reqs) = own.get(&id) {
                    order.extend_from_slice(reqs);
                }
                continue;
            }
            stack.push((id, true));
            let Some(n) = self.nodes.get(&id) else {
                continue;
            };
            let mut kids: Vec<(usize, u64)> = n
                .children
                .values()
                .filter_map(|c| weight.get(c).map(|&w| (w, *c)))
                .collect();
            // Stable: equal weights keep the order they joined.
            kids.sort_by_key(|k| std::cmp::Reverse(k.0));
            for &(_, c) in kids.iter().rev() {
                stack.push((c, false));
            }
        }
        order.extend(tail);
        order
    }

    /// The tree depth-first, children in the order they joined: (depth,
    /// tokens, lock count) per node (SGLang's `pretty_print`).
    pub(crate) fn outline(&self) -> Vec<(usize, usize, u64)> {
        let mut out = Vec::new();
        let mut stack = vec![(ROOT, 0usize)];
        while let Some((id, depth)) = stack.pop() {
            let Some(n) = self.nodes.get(&id) else {
                continue;
            };
            if id != ROOT {
                out.push((depth, n.len, n.lock_ref));
            }
            for &c in n.children.values().rev() {
                stack.push((c, depth + 1));
            }
        }
        out
    }

    /// Checks the mirror against itself and against `resident` (the
    /// tokens the core holds): the first violation, if any.
    pub(crate) fn check(&self, resident: usize) -> Option<String> {
        if let Some(b) = &self.broken {
            return Some(b.clone());
        }
        let mut total = 0;
        let (mut evictable, mut protected) = (0, 0);
        for (&id, n) in &self.nodes {
            if id == ROOT {
                continue;
            }
            total += n.len;
            if n.lock_ref == 0 {
                evictable += n.len;
            } else {
                protected += n.len;
            }
            let Some(p) = self.nodes.get(&n.parent) else {
                return Some(format!("node {id}: parent {} is not in the tree", n.parent));
            };
            if p.children.get(&n.slot) != Some(&id) {
                return Some(format!("node {id}: not among its parent's children"));
            }
            let below: u64 = n
                .children
                .values()
                .filter_map(|c| self.nodes.get(c))
                .map(|c| c.lock_ref)
                .sum();
            if n.lock_ref < below {
                return Some(format!(
                    "node {id}: {} locks, its children {below}",
                    n.lock_ref
                ));
            }
        }
        if (evictable, protected) != (self.evictable, self.protected) {
            return Some(format!(
                "sizes: evictable {} protected {} counted, {evictable} and {protected} in the tree",
                self.evictable, self.protected
            ));
        }
        if total != resident {
            return Some(format!(
                "the mirror holds {total} tokens, the cache {resident}"
            ));
        }
        None
    }

    fn namespace_of(&mut self, e: &PageEvent<'_>) -> Arc<Namespace> {
        let ns = e
            .location()
            .and_then(|l| l.namespace.map(|n| n.into_owned()));
        if let Some(n) = self.namespaces.get(&ns) {
            return Arc::clone(n);
        }
        let decoded = Namespace::decode(ns.as_deref()).unwrap_or_else(|| {
            self.broken
                .get_or_insert_with(|| format!("namespace {ns:?} is not one the backend made"));
            Namespace {
                extra_key: None,
                cache_salt: None,
            }
        });
        let n = Arc::new(decoded);
        self.namespaces.insert(ns, Arc::clone(&n));
        n
    }

    fn stored(&mut self, e: &PageEvent<'_>) {
        let parent = if e.at_root { ROOT } else { e.parent };
        let len = e.pages().len();
        let slot = self.next_slot;
        self.next_slot += 1;
        let mut node = Node::new(parent, len, slot);
        if self.events {
            let ns = match self.nodes.get(&parent) {
                Some(p) if parent != ROOT => p.ns.clone(),
                _ => None,
            };
            let ns = ns.unwrap_or_else(|| self.namespace_of(e));
            let prior = match self.nodes.get(&parent) {
                Some(p) if parent != ROOT => p.digests.last().copied(),
                _ => ns.cache_salt.as_deref().map(salt_seed),
            };
            node.digests = chain(prior.as_ref(), e.pages(), self.page_size);
            self.raw.push(RawEvent::Stored {
                ns: Arc::clone(&ns),
                parent: match self.nodes.get(&parent) {
                    Some(p) if parent != ROOT => {
                        p.digests.last().map(crate::sglang::hash::block_hash)
                    }
                    _ => None,
                },
                hashes: node
                    .digests
                    .iter()
                    .map(crate::sglang::hash::block_hash)
                    .collect(),
                tokens: e.pages().to_vec(),
            });
            node.ns = Some(ns);
        }
        match self.nodes.get_mut(&parent) {
            Some(p) => {
                p.children.insert(slot, e.node);
            }
            None => {
                self.broken.get_or_insert_with(|| {
                    format!("node {}: stored below unknown node {parent}", e.node)
                });
            }
        }
        self.evictable += len;
        self.nodes.insert(e.node, node);
    }

    fn split(&mut self, e: &SplitEvent) {
        let Some(n) = self.nodes.get_mut(&e.node) else {
            self.broken
                .get_or_insert_with(|| format!("split of unknown node {}", e.node));
            return;
        };
        let pages = e.moved / self.page_size.max(1);
        let upper_digests: Vec<Digest> = n.digests.drain(..pages.min(n.digests.len())).collect();
        let mut upper = Node::new(n.parent, e.moved, n.slot);
        upper.lock_ref = n.lock_ref;
        upper.ns = n.ns.clone();
        upper.digests = upper_digests;
        n.len -= e.moved;
        n.parent = e.prefix;
        n.slot = self.next_slot;
        self.next_slot += 1;
        upper.children.insert(n.slot, e.node);
        if let Some(p) = self.nodes.get_mut(&upper.parent) {
            p.children.insert(upper.slot, e.prefix);
        }
        self.nodes.insert(e.prefix, upper);
    }

    fn removed(&mut self, e: &PageEvent<'_>) {
        let Some(n) = self.nodes.remove(&e.node) else {
            self.broken
                .get_or_insert_with(|| format!("removal of unknown node {}", e.node));
            return;
        };
        if n.lock_ref != 0 || !n.children.is_empty() {
            self.broken.get_or_insert_with(|| {
                format!(
                    "node {} evicted with {} locks and {} children",
                    e.node,
                    n.lock_ref,
                    n.children.len()
                )
            });
        }
        self.evictable -= n.len;
        if let Some(p) = self.nodes.get_mut(&n.parent) {
            p.children.remove(&n.slot);
        }
        if self.events {
            if let Some(ns) = n.ns {
                self.raw.push(RawEvent::Removed {
                    ns,
                    hashes: n
                        .digests
                        .iter()
                        .map(crate::sglang::hash::block_hash)
                        .collect(),
                });
            }
        }
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
            broken: None,
        }))
    }

    /// The state, locked (a panic elsewhere while it was held does not
    /// make it unreadable: every change completes before it can panic).
    pub(crate) fn shape(&self) -> MutexGuard<'_, Shape> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl CacheListener for Mirror {
    fn stored(&self, event: &PageEvent<'_>) {
        self.shape().stored(event);
    }

    fn removed(&self, event: &PageEvent<'_>) {
        self.shape().removed(event);
    }

    fn split(&self, event: &SplitEvent) {
        self.shape().split(event);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaces_encode_injectively_and_decode_back() {
        let pairs = [
            (None, None),
            (Some(""), None),
            (None, Some("")),
            (Some("a"), Some("bc")),
            (Some("ab"), Some("c")),
            (Some("+1:x"), None),
            (Some("é-"), Some("-")),
        ];
        let mut seen = std::collections::HashSet::new();
        for (e, s) in pairs {
            let ns = Namespace::encode(e, s);
            assert!(seen.insert(ns.clone()), "{e:?} {s:?} collides");
            let back = Namespace::decode(ns.as_deref()).unwrap();
            assert_eq!(
                (back.extra_key.as_deref(), back.cache_salt.as_deref()),
                (e, s)
            );
        }
        assert_eq!(Namespace::decode(Some("lora:x")), None);
        assert_eq!(Namespace::decode(Some("+5:ab")), None);
    }
}
