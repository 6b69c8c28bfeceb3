//! Evicting one leaf from one tier: its residency there goes (the state
//! word's CAS decides against pins), and a node left resident nowhere, with
//! no children, is unlinked; a namespace whose last node leaves loses its
//! root. Which leaves to take, in which order, is the cache's eviction
//! engine; this is the one structural change it asks for. A subtree's
//! residency on a tier ([`Tree::evict_subtree`]) goes as its leaves, one by
//! one, deepest first.
//!
//! The protecting steps here: [`leaf_check`]; under the locks of
//! `PairLocked::of_child` (`parent_lock`), and the state word's
//! `evict_pin_check`.

use crate::sync::Ordering;
use crate::tree::node::{page_hash, ImageParts, Node, Values};
use crate::tree::protocol::lock::PairLocked;
use crate::tree::protocol::reclaim::Retired;
use crate::tree::state::Tree;
use crossbeam_epoch::Guard;

/// A leaf evicted from one tier: its values there, and its parent.
#[derive(Debug)]
pub(crate) struct EvictedLeaf<'g> {
    pub(crate) values: Values,
    pub(crate) parent: &'g Node,
}

/// Whether `n` is a leaf resident on `t`, pinned or not (a hint: eviction
/// re-checks under the locks).
pub(crate) fn is_leaf_on(n: &Node, t: usize) -> bool {
    !n.is_root
        && !n.is_obsolete()
        && n.residency_on(t).resident()
        && n.slot(t).resident_children.load(Ordering::SeqCst) == 0
}

/// Whether `n` is an unpinned leaf resident on `t` (a hint, as
/// [`is_leaf_on`]).
pub(crate) fn is_candidate(n: &Node, t: usize) -> bool {
    let st = n.residency_on(t);
    !n.is_root
        && st.resident()
        && st.pins() == 0
        && n.slot(t).resident_children.load(Ordering::SeqCst) == 0
}

/// The protecting step `leaf_check` (model
/// `insert_below_a_leaf_being_evicted`, the evictor's side): only a leaf on
/// `t`, re-checked under the node's lock (which every attach or adoption of
/// a child there takes as the child's parent), may lose its residency
/// there. Its control skips the check.
fn leaf_check(node: &Node, t: usize) -> bool {
    if crate::negative::removed("leaf_check") {
        return true;
    }
    node.slot(t).resident_children.load(Ordering::SeqCst) == 0
}

impl Tree {
    /// Evicts `node`'s residency on `t` if it is an unpinned leaf there;
    /// unlinks the node if that was its last residency and it has no
    /// children. `node` must have been reached under `guard`.
    pub(crate) fn evict_leaf<'g>(
        &self,
        node: &'g Node,
        t: usize,
        guard: &'g Guard,
    ) -> Option<EvictedLeaf<'g>> {
        if node.is_root {
            return None;
        }
        let locked = PairLocked::of_child(node, guard)?;
        let parent = locked.parent().node();
        if !leaf_check(node, t) {
            return None;
        }
        node.slot(t).residency.try_evict().ok()?;
        crate::pause::at(crate::pause::Point::Evict);
        let img = node.image_ref(guard);
        let Some(values) = img.values.get(t).cloned() else {
            debug_assert!(false, "RESIDENT without values");
            return None;
        };
        // Under the node's and its parent's locks (see crate::events): the
        // path is read before anything changes.
        self.report_removed(node, parent, t, guard);
        // Under the node's lock, the image's values and the tiers' RESIDENT
        // bits agree (both change only under it, values published first): no
        // values on another tier means resident nowhere else, without
        // reading every tier's slot (a line each).
        let resident_elsewhere = img.values.iter().any(|(e, _)| e != t);
        let hash = page_hash(&img.key[..self.page_size()]);
        let mut retired = Retired::default();
        let unlink = !resident_elsewhere && node.children_ref(guard).is_empty();
        // A node that leaves the tree keeps its last image: no new one is
        // built for it (an allocation and a copy of its key per evicted
        // leaf, a fifth of an eviction). Its residency on `t` is already
        // gone from the state word (`try_evict` above), which is what pins
        // go by, and values are read only after a pin (`pin_then_read`); a
        // `peek` that reached the node before it leaves may still count it,
        // as it would had it read the image a moment earlier.
        if !unlink {
            locked.publish_child_image(
                ImageParts {
                    parent: img.parent,
                    key: &img.key,
                    values: img.values.without(t),
                },
                guard,
                &mut retired,
            );
        }
        parent
            .slot(t)
            .resident_children
            .fetch_sub(1, Ordering::SeqCst);
        self.count_tokens(t, img.key.len(), false);
        debug_assert_eq!(resident_elsewhere, node.resident_anywhere());
        if unlink {
            locked.mark_child_unlinked();
            crate::pause::at(crate::pause::Point::Unlink);
            let Ok(parent_empty) = locked.remove_child(hash, guard, &mut retired) else {
                // Not among its parent's children: the locks and the
                // parent check above rule it out. Were it so, the node is
                // left alone (a leak) rather than released while it may be
                // filed somewhere.
                debug_assert!(false, "an evicted leaf missing from its parent");
                self.retire(retired, guard);
                return Some(EvictedLeaf { values, parent });
            };
            // The tree's one reference goes once no reader can hold the
            // node: it is unreachable from the current children now.
            // SAFETY: the node was linked (`Link::new` took the tree's
            // reference) and is unlinked now, once, under both locks; the
            // reference is handed to the reclaimer only here, and released
            // after the grace period of every reader that could reach it.
            unsafe { retired.strong(node as *const Node) };
            self.count_node(t, false);
            if parent.is_root && parent_empty {
                // The namespace's last node left: reclaim its root. Marked
                // obsolete under its lock (held), so no attach, adopt or
                // split below it can succeed from now on; then its table
                // entry goes (the namespaces module docs).
                locked.parent().mark_unlinked();
                self.roots.remove_root(parent, guard, &mut retired);
            }
        }
        self.retire(retired, guard);
        Some(EvictedLeaf { values, parent })
    }

    /// Evicts `top` and every node below it from `t`, deepest first (each
    /// a leaf on `t` when its turn comes, so residency stays prefix-closed
    /// throughout); nodes below `top` that are not resident on `t` hold
    /// nothing resident there (I1) and are not visited. Nodes that other
    /// writers put into the subtree meanwhile (a split's new upper part, a
    /// child attached on `t`) are taken too, by passes until one takes
    /// nothing (what stays is pinned). Returns the evicted leaves. `top`
    /// must have been reached under `guard`.
    pub(crate) fn evict_subtree<'g>(
        &self,
        top: &'g Node,
        t: usize,
        guard: &'g Guard,
    ) -> Vec<EvictedLeaf<'g>> {
        let mut evicted = Vec::new();
        // A writer on another tier that splits a gathered node while the
        // pass runs puts a new node between it and its parent, holding
        // this tier's residency (copied); the pass then takes the lower
        // node, finds the parent no leaf and keeps it. So the subtree is
        // gathered again while `top` stays resident and a pass took
        // something; a pass that takes nothing (what is left is pinned)
        // ends it.
        while !top.is_root && top.resident(t) {
            // Pre-order: every node after its ancestors; taken in reverse,
            // every node comes after its descendants.
            let mut order = Vec::new();
            let mut stack = vec![top];
            while let Some(n) = stack.pop() {
                order.push(n);
                stack.extend(n.children_ref(guard).nodes().filter(|c| c.resident(t)));
            }
            crate::pause::at(crate::pause::Point::Gathered);
            let before = evicted.len();
            evicted.extend(
                order
                    .into_iter()
                    .rev()
                    .filter_map(|n| self.evict_leaf(n, t, guard)),
            );
            if evicted.len() == before {
                break;
            }
        }
        evicted
    }
}
