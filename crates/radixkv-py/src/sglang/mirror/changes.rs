//! The core's residency events applied to the shape: a store, a split, a
//! removal; each checked first, so that a change that would break an
//! invariant marks the shape broken instead of wrapping a counter.

use super::{Namespace, Node, RawEvent, Shape, ROOT};
use crate::sglang::hash::{chain, salt_seed, Digest};
use radixkv::events::{PageEvent, SplitEvent};
use std::sync::Arc;

impl Shape {
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
    pub(super) fn stored(&mut self, e: &PageEvent<'_>) {
        let parent = if e.at_root { ROOT } else { e.parent };
        self.store(e.node, parent, e.pages(), || {
            e.location()
                .and_then(|l| l.namespace.map(|n| n.into_owned()))
        });
    }

    /// Node `node_id` of `pages` became resident below `parent` (`ROOT`
    /// for a namespace root); `namespace` gives the core's namespace.
    pub(super) fn store(
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

    pub(super) fn split(&mut self, e: &SplitEvent) {
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
    pub(super) fn removed(&mut self, node: u64) {
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
