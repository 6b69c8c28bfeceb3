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

use crate::sglang::hash::{chain, salt_seed, Digest};
use radixkv::events::{CacheListener, PageEvent, SplitEvent};
use radixkv::Lease;
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
    /// An unlock of a node that holds no lock of its own (its count is
    /// only its descendants').
    NotLocked,
    /// The mirror is broken: the first inconsistency.
    Broken(String),
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

    /// Whether `id` can take a lock now: `Gone` if it is not in the tree.
    /// Checked before the core pin is taken, so that a refused lock leaves
    /// no pin behind.
    pub(crate) fn lockable(&self, id: u64) -> Result<(), LockRefused> {
        self.usable().map_err(LockRefused::Broken)?;
        if id != ROOT && !self.nodes.contains_key(&id) {
            return Err(LockRefused::Gone);
        }
        Ok(())
    }

    /// Locks the path root → `id` with `lease` (the core pin behind the
    /// lock, kept until the matching [`unlock`](Self::unlock)): the change
    /// of the evictable size (≤ 0). The root takes no lock (its lease is
    /// empty and dropped).
    pub(crate) fn lock(&mut self, id: u64, lease: Lease) -> Result<i64, LockRefused> {
        self.lockable(id)?;
        if id == ROOT {
            return Ok(0);
        }
        let Some(path) = self.path(id) else {
            self.corrupt(|| format!("lock of node {id}: its path to the root is broken"));
            return Err(LockRefused::Broken(self.usable().err().unwrap_or_default()));
        };
        // Checked first, applied after: a refused lock changes nothing.
        let mut moved = 0usize;
        for &n in &path {
            let node = &self.nodes[&n];
            if node.lock_ref == u64::MAX {
                return Err(
                    self.refuse(format!("lock of node {id}: node {n} holds 2^64 - 1 locks"))
                );
            }
            if node.lock_ref == 0 {
                moved = match moved.checked_add(node.len) {
                    Some(m) => m,
                    None => {
                        return Err(self.refuse(format!(
                            "lock of node {id}: its path holds over 2^64 tokens"
                        )))
                    }
                };
            }
        }
        let (Some(evictable), Some(protected), Ok(delta)) = (
            self.evictable.checked_sub(moved),
            self.protected.checked_add(moved),
            i64::try_from(moved),
        ) else {
            return Err(self.refuse(format!(
                "lock of node {id}: {moved} tokens to protect, but evictable {} protected {}",
                self.evictable, self.protected
            )));
        };
        for n in &path {
            if let Some(node) = self.nodes.get_mut(n) {
                node.lock_ref += 1;
            }
        }
        (self.evictable, self.protected) = (evictable, protected);
        self.leases.entry(id).or_default().push(lease);
        Ok(-delta)
    }

    /// Releases one lock of `id` (root → `id`): the change of the evictable
    /// size (≥ 0) and the lock's lease, for the caller to drop (the core
    /// unpin) before it lets the mirror go.
    pub(crate) fn unlock(&mut self, id: u64) -> Result<(i64, Option<Lease>), LockRefused> {
        self.usable().map_err(LockRefused::Broken)?;
        if id == ROOT {
            return Ok((0, None));
        }
        if !self.nodes.contains_key(&id) {
            return Err(LockRefused::Gone);
        }
        if self.leases.get(&id).is_none_or(Vec::is_empty) {
            return Err(LockRefused::NotLocked);
        }
        let Some(path) = self.path(id) else {
            self.corrupt(|| format!("unlock of node {id}: its path to the root is broken"));
            return Err(LockRefused::Broken(self.usable().err().unwrap_or_default()));
        };
        let mut moved = 0usize;
        for &n in &path {
            let node = &self.nodes[&n];
            match node.lock_ref {
                0 => {
                    return Err(self.refuse(format!(
                        "unlock of node {id}: node {n} on its path holds no lock"
                    )))
                }
                1 => {
                    moved = match moved.checked_add(node.len) {
                        Some(m) => m,
                        None => {
                            return Err(self.refuse(format!(
                                "unlock of node {id}: its path holds over 2^64 tokens"
                            )))
                        }
                    };
                }
                _ => {}
            }
        }
        let (Some(evictable), Some(protected), Ok(delta)) = (
            self.evictable.checked_add(moved),
            self.protected.checked_sub(moved),
            i64::try_from(moved),
        ) else {
            return Err(self.refuse(format!(
                "unlock of node {id}: {moved} tokens to release, but evictable {} protected {}",
                self.evictable, self.protected
            )));
        };
        for n in &path {
            if let Some(node) = self.nodes.get_mut(n) {
                node.lock_ref -= 1;
            }
        }
        (self.evictable, self.protected) = (evictable, protected);
        let lease = self.leases.get_mut(&id).and_then(Vec::pop);
        if self.leases.get(&id).is_some_and(Vec::is_empty) {
            self.leases.remove(&id);
        }
        Ok((delta, lease))
    }

    /// Marks the mirror broken with `what` and returns the refusal.
    fn refuse(&mut self, what: String) -> LockRefused {
        self.corrupt(|| what);
        LockRefused::Broken(self.usable().err().unwrap_or_default())
    }

    /// Test hook: breaks the mirror with `what`.
    #[cfg(feature = "test-hooks")]
    pub(crate) fn break_with(&mut self, what: String) {
        self.corrupt(|| what);
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
            let own = self.leases.get(&id).map_or(0, Vec::len) as u64;
            if n.lock_ref - below != own {
                return Some(format!(
                    "node {id}: {} locks of its own, {own} pins behind them",
                    n.lock_ref - below
                ));
            }
        }
        if let Some(id) = self.leases.keys().find(|id| !self.nodes.contains_key(id)) {
            return Some(format!("pins held for node {id}, which is not in the tree"));
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

    fn namespace_of(&mut self, ns: Option<String>) -> Arc<Namespace> {
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

    /// A store event (the namespace is read only for a path's first node).
    fn stored(&mut self, e: &PageEvent<'_>) {
        let parent = if e.at_root { ROOT } else { e.parent };
        self.store(e.node, parent, e.pages(), || {
            e.location()
                .and_then(|l| l.namespace.map(|n| n.into_owned()))
        });
    }

    /// Node `node_id` of `pages` became resident below `parent` (`ROOT`
    /// for a namespace root); `namespace` gives the core's namespace.
    fn store(
        &mut self,
        node_id: u64,
        parent: u64,
        pages: &[u32],
        namespace: impl FnOnce() -> Option<String>,
    ) {
        if self.broken.is_some() {
            return;
        }
        let len = pages.len();
        if self.nodes.contains_key(&node_id) {
            return self.corrupt(|| format!("node {node_id}: stored twice"));
        }
        if !self.nodes.contains_key(&parent) {
            return self.corrupt(|| format!("node {node_id}: stored below unknown node {parent}"));
        }
        let (Some(evictable), Some(next_slot)) = (
            self.evictable.checked_add(len),
            self.next_slot.checked_add(1),
        ) else {
            return self.corrupt(|| format!("node {node_id}: the evictable size overflows"));
        };
        let slot = self.next_slot;
        let mut node = Node::new(parent, len, slot);
        if self.events {
            let ns = match self.nodes.get(&parent) {
                Some(p) if parent != ROOT => p.ns.clone(),
                _ => None,
            };
            let ns = match ns {
                Some(ns) => ns,
                None => self.namespace_of(namespace()),
            };
            let prior = match self.nodes.get(&parent) {
                Some(p) if parent != ROOT => p.digests.last().copied(),
                _ => ns.cache_salt.as_deref().map(salt_seed),
            };
            node.digests = chain(prior.as_ref(), pages, self.page_size);
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
                tokens: pages.to_vec(),
            });
            node.ns = Some(ns);
        }
        if let Some(p) = self.nodes.get_mut(&parent) {
            p.children.insert(slot, node_id);
        }
        (self.evictable, self.next_slot) = (evictable, next_slot);
        self.nodes.insert(node_id, node);
    }

    fn split(&mut self, e: &SplitEvent) {
        if self.broken.is_some() {
            return;
        }
        let ps = self.page_size.max(1);
        let Some(n) = self.nodes.get(&e.node) else {
            return self.corrupt(|| format!("split of unknown node {}", e.node));
        };
        if e.moved == 0 || e.moved >= n.len || !e.moved.is_multiple_of(ps) {
            let len = n.len;
            return self.corrupt(|| {
                format!(
                    "split of node {} ({len} tokens) after {} tokens",
                    e.node, e.moved
                )
            });
        }
        if self.nodes.contains_key(&e.prefix) {
            return self.corrupt(|| format!("split of node {}: node {} exists", e.node, e.prefix));
        }
        let Some(next_slot) = self.next_slot.checked_add(1) else {
            return self.corrupt(|| "the node slots ran out".into());
        };
        let slot = self.next_slot;
        let Some(n) = self.nodes.get_mut(&e.node) else {
            return;
        };
        let pages = e.moved / ps;
        let upper_digests: Vec<Digest> = n.digests.drain(..pages.min(n.digests.len())).collect();
        let mut upper = Node::new(n.parent, e.moved, n.slot);
        upper.lock_ref = n.lock_ref;
        upper.ns = n.ns.clone();
        upper.digests = upper_digests;
        // Checked above: `moved < len`. The total, and so both sizes, stay.
        n.len -= e.moved;
        n.parent = e.prefix;
        n.slot = slot;
        self.next_slot = next_slot;
        upper.children.insert(slot, e.node);
        if let Some(p) = self.nodes.get_mut(&upper.parent) {
            p.children.insert(upper.slot, e.prefix);
        }
        self.nodes.insert(e.prefix, upper);
    }

    /// Node `node` left the tree (evicted).
    fn removed(&mut self, node: u64) {
        if self.broken.is_some() {
            return;
        }
        let Some(n) = self.nodes.remove(&node) else {
            return self.corrupt(|| format!("removal of unknown node {}", node));
        };
        if let Some(p) = self.nodes.get_mut(&n.parent) {
            p.children.remove(&n.slot);
        }
        // The size the node was counted in.
        let (counter, other) = if n.lock_ref == 0 {
            (self.evictable.checked_sub(n.len), self.protected)
        } else {
            (self.protected.checked_sub(n.len), self.evictable)
        };
        match counter {
            Some(left) if n.lock_ref == 0 => (self.evictable, self.protected) = (left, other),
            Some(left) => (self.evictable, self.protected) = (other, left),
            None => {
                let what = format!(
                    "node {} ({} tokens) evicted, but only {} evictable and {} protected",
                    node, n.len, self.evictable, self.protected
                );
                return self.corrupt(|| what);
            }
        }
        if n.lock_ref != 0 || !n.children.is_empty() {
            return self.corrupt(|| {
                format!(
                    "node {} evicted with {} locks and {} children",
                    node,
                    n.lock_ref,
                    n.children.len()
                )
            });
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

#[cfg(test)]
mod tests {
    use super::*;
    use radixkv::{DeviceId, RadixCache, TokenKey};

    fn empty(page_size: usize) -> Shape {
        Mirror::new(page_size, false)
            .0
            .into_inner()
            .unwrap_or_else(|p| p.into_inner())
    }

    fn split(node: u64, prefix: u64, moved: usize) -> SplitEvent {
        SplitEvent {
            tier: DeviceId(0).into(),
            node,
            prefix,
            moved,
        }
    }

    #[test]
    fn a_locked_node_evicted_breaks_the_mirror_and_wraps_no_counter() {
        let mut s = empty(1);
        s.store(1, ROOT, &[1, 2, 3], || None);
        // Counted as a lock counts it, without the core pin behind it.
        s.nodes.get_mut(&1).unwrap().lock_ref = 1;
        (s.evictable, s.protected) = (0, 3);
        s.removed(1);
        let why = s.usable().unwrap_err();
        assert!(why.contains("node 1 evicted with 1 locks"), "{why}");
        assert_eq!(
            (s.evictable, s.protected),
            (0, 0),
            "taken from the size it was counted in"
        );
        // Every later change is ignored, and the first cause stays.
        s.store(2, ROOT, &[4], || None);
        s.removed(7);
        assert_eq!(s.usable().unwrap_err(), why);
        assert_eq!(s.lockable(1), Err(LockRefused::Broken(why.clone())));
        assert_eq!(s.unlock(1).map(|(d, _)| d), Err(LockRefused::Broken(why)));
    }

    #[test]
    fn a_split_past_the_node_breaks_the_mirror_and_wraps_no_length() {
        let mut s = empty(2);
        s.store(1, ROOT, &[1, 2, 3, 4], || None);
        s.split(&split(1, 2, 6));
        let why = s.usable().unwrap_err();
        assert!(
            why.contains("split of node 1 (4 tokens) after 6 tokens"),
            "{why}"
        );
        assert_eq!(s.nodes[&1].len, 4);
        assert_eq!(s.evictable, 4);

        let mut s = empty(2);
        s.store(1, ROOT, &[1, 2, 3, 4], || None);
        s.split(&split(1, 2, 1));
        assert!(
            s.usable().unwrap_err().contains("after 1 tokens"),
            "not a page"
        );
        let mut s = empty(2);
        s.split(&split(9, 2, 2));
        assert!(s.usable().unwrap_err().contains("split of unknown node 9"));
    }

    #[test]
    fn a_store_below_an_unknown_parent_or_twice_breaks_the_mirror() {
        let mut s = empty(1);
        s.store(1, 5, &[1], || None);
        assert!(s.usable().unwrap_err().contains("below unknown node 5"));
        let mut s = empty(1);
        s.store(1, ROOT, &[1], || None);
        s.store(1, ROOT, &[1], || None);
        assert!(s.usable().unwrap_err().contains("stored twice"));
        assert_eq!(s.evictable, 1);
    }

    #[test]
    fn a_removal_past_the_evictable_size_breaks_the_mirror() {
        let mut s = empty(1);
        s.store(1, ROOT, &[1, 2], || None);
        s.evictable = 1;
        s.removed(1);
        assert!(s.usable().unwrap_err().contains("only 1 evictable"));
        assert_eq!(s.evictable, 1);
    }

    #[test]
    fn a_lock_its_pin_and_the_sizes_move_together() {
        let mirror = Arc::new(Mirror::new(1, false));
        let cache = RadixCache::builder()
            .devices(1)
            .listener(Arc::clone(&mirror) as Arc<dyn CacheListener>)
            .build()
            .unwrap();
        let dev = DeviceId(0);
        cache
            .insert(TokenKey::new(&[1, 2, 3]), dev, &[7, 8, 9], 0)
            .unwrap();
        cache
            .insert(TokenKey::new(&[1, 2, 4]), dev, &[7, 8, 5], 0)
            .unwrap();
        let m = cache.match_prefix(TokenKey::new(&[1, 2, 3]), dev).unwrap();
        let id = m.handle.id().unwrap();
        let mut s = mirror.shape();
        assert_eq!((s.evictable, s.protected), (4, 0));
        assert_eq!(s.lock(id, cache.pin(&m.handle).unwrap()), Ok(-3));
        assert_eq!(s.lock(id, cache.pin(&m.handle).unwrap()), Ok(0));
        assert_eq!((s.evictable, s.protected), (1, 3));
        assert_eq!(s.check(4), None);
        assert_eq!(s.leases[&id].len(), 2);
        drop(s);
        // Pinned: the core keeps the path; only the other leaf goes.
        assert_eq!(cache.evict(dev, 10).unwrap().tokens, 1);
        let mut s = mirror.shape();
        let (delta, lease) = s.unlock(id).unwrap();
        assert_eq!((delta, lease.is_some()), (0, true));
        drop(lease);
        let (delta, lease) = s.unlock(id).unwrap();
        assert_eq!((delta, lease.is_some()), (3, true));
        drop(lease);
        assert_eq!(s.unlock(id).map(|(d, _)| d), Err(LockRefused::NotLocked));
        assert_eq!(s.check(3), None);
        drop(s);
        assert_eq!(cache.evict(dev, 10).unwrap().tokens, 3);
        let s = mirror.shape();
        assert_eq!(s.usable(), Ok(()));
        assert_eq!((s.evictable, s.protected, s.node_count()), (0, 0, 0));
        assert_eq!(s.lockable(id), Err(LockRefused::Gone));
    }

    #[test]
    fn a_lock_with_no_pin_behind_it_fails_the_check() {
        let mut s = empty(1);
        s.store(1, ROOT, &[1], || None);
        s.nodes.get_mut(&1).unwrap().lock_ref = 1;
        (s.evictable, s.protected) = (0, 1);
        let why = s.check(1).unwrap();
        assert!(why.contains("1 locks of its own, 0 pins"), "{why}");
    }

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
