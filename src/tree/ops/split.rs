//! Splitting a node: a new node takes the node's first tokens, between it
//! and its parent; the old node object keeps the rest, so handles and pins
//! on it keep meaning the end of the same path.
//!
//! ```text
//!  parent ──► child [1 2 3 4]      parent ──► prefix [1 2] ──► child [3 4]
//! ```
//!
//! Under both locks (`PairLocked`): the prefix node is built whole, the
//! child's new image (parent = the prefix) is published, then the parent's
//! children name the prefix instead of the child. A reader between the two
//! publications climbs from the child to the prefix (`reader_parent_check`).
//! The protecting steps here: [`split_moves_no_pin`] and
//! [`split_event_in_lock`]; the split's re-check is `split_recheck` (in
//! `protocol::lock`).

use crate::sync::Ordering;
use crate::tree::node::NodeParts;
use crate::tree::node::ParentPtr;
use crate::tree::node::{page_hash, Children, ImageParts, Link, Node, NodeImage};
use crate::tree::ops::evict::is_leaf_on;
use crate::tree::protocol::lock::{Expect, LockFailed, Locking, ParentLocked};
use crate::tree::protocol::reclaim::Retired;
use crate::tree::state::Tree;
use crossbeam_epoch::{Guard, Shared};

/// A split to make: `child` of `parent`, whose image the caller saw as
/// `seen`, cut after `at` tokens.
#[derive(Debug)]
pub(crate) struct Split<'g> {
    pub(crate) parent: &'g Node,
    pub(crate) child: &'g Node,
    pub(crate) seen: Shared<'g, NodeImage>,
    /// Tokens that move to the new prefix node (whole pages, fewer than
    /// the child has).
    pub(crate) at: usize,
    /// The tier the split is made for: its stamps on the new node are
    /// fresh ticks, and its id comes from that tier's share (tier 0's
    /// without one).
    pub(crate) tier: Option<usize>,
    /// A priority the new node takes at least (an insert's).
    pub(crate) priority: Option<i64>,
    /// Whether to wait for the two locks (an insert) or only take them if
    /// free (a match).
    pub(crate) locking: Locking,
}

impl Tree {
    /// Makes the split `s`; returns the new prefix node.
    pub(crate) fn split<'g>(&self, s: Split<'g>, guard: &'g Guard) -> Result<&'g Node, LockFailed> {
        let ps = self.page_size();
        let locked = ParentLocked::lock(s.parent, None, s.locking)?.lock_child(
            s.child,
            Expect::Image(s.seen),
            s.locking,
            guard,
        )?;
        // SAFETY: loaded under `guard`, retired through the reclaimer.
        let img = unsafe { s.seen.deref() };
        let k = s.at;
        if !img.parent.is(s.parent) || k == 0 || k >= img.key.len() {
            return Err(LockFailed::Changed);
        }
        let prefix = self.prefix_node(&s, img, k);
        split_moves_no_pin(&prefix, s.child);
        let (child_id, prefix_id) = (s.child.id, prefix.id);
        let prefix = split_event_in_lock(
            || self.report_split(img, child_id, prefix_id, k),
            || {
                let prefix = Link::new(prefix);
                let mut retired = Retired::default();
                locked.publish_child_image(
                    ImageParts {
                        parent: ParentPtr(prefix.as_ptr()),
                        key: &img.key[k..],
                        values: img.values.map(|v| v.slice(k, img.key.len(), ps)),
                    },
                    guard,
                    &mut retired,
                );
                // The child's `deepest` again, now that its image names the
                // prefix: a walk raising it from below either climbs
                // through the new image (and raises the prefix itself) or
                // raised it before this load (`ops::depth`). Whoever raises
                // a node raises its ancestors too: a walk that finds the
                // prefix raised here stops there.
                // SAFETY: allocated just above; the tree's reference is
                // held by `prefix` until it is filed below, under `guard`.
                split_rereads_deepest(self, unsafe { prefix.node_in(guard) }, &s, guard);
                // A writer parked here (the test-only pause point) holds
                // both locks with the child's new image published and the
                // parent's children not yet: readers must still finish
                // (they climb, see `reader_parent_check`).
                crate::pause::at(crate::pause::Point::Split);
                locked.replace_child(page_hash(&img.key[..ps]), prefix, guard, &mut retired);
                drop(locked);
                self.count_node(s.tier.unwrap_or(0), true);
                self.retire(retired, guard);
                if self.tracks_depths() {
                    // Its key starts later on its path now, which can only
                    // lower its tlru key: filed again, the candidate heap
                    // sees it (see `EvictionPolicy::keys_only_grow`).
                    for (t, _) in s.child.slots() {
                        if is_leaf_on(s.child, t) {
                            self.note_leaf(s.child, t);
                        }
                    }
                }
                prefix
            },
        );
        // SAFETY: just linked under `guard`.
        Ok(unsafe { prefix.node_in(guard) })
    }

    /// The new node of split `s` of the child whose image is `img`: its
    /// first `k` tokens and their values, the child's stamps and counts,
    /// and the child (with the rest) as its one child.
    fn prefix_node(&self, s: &Split<'_>, img: &NodeImage, k: usize) -> Node {
        let ps = self.page_size();
        let rest = &img.key[k..];
        let prefix = Node::new(NodeParts {
            id: self.new_id(s.tier.unwrap_or(0)),
            is_root: false,
            tiers: self.tiers(),
            image: ImageParts {
                parent: ParentPtr::to(s.parent),
                key: &img.key[..k],
                values: img.values.map(|v| v.slice(0, k, ps)),
            },
            // SAFETY: the child is linked (checked under both locks), and
            // this link replaces its entry in the parent's children: the
            // tree's one reference moves below the prefix node.
            children: Children::flat(vec![(page_hash(&rest[..ps]), unsafe {
                Link::to_linked(s.child)
            })]),
            priority: s.child.priority.load(Ordering::SeqCst),
            deepest: s.child.deepest.load(Ordering::SeqCst),
        });
        // The child's tiers that have a slot (a sparse node's others are
        // absent with zero stamps, as the prefix's are).
        for (t, c) in s.child.slots() {
            let slot = prefix.slot(t);
            // Relaxed: the new node is not yet published; the publication
            // (a SeqCst swap) orders these stores before any reader.
            slot.last_access
                .store(c.last_access.load(Ordering::Relaxed), Ordering::Relaxed);
            slot.created
                .store(c.created.load(Ordering::Relaxed), Ordering::Relaxed);
            slot.hits
                .store(c.hits.load(Ordering::Relaxed), Ordering::Relaxed);
            slot.hits_base
                .store(c.hits_base.load(Ordering::Relaxed), Ordering::Relaxed);
            if img.values.is_present(t) {
                slot.resident_children.store(1, Ordering::Relaxed);
            }
        }
        if let Some(t) = s.tier {
            let slot = prefix.slot(t);
            slot.last_access.store(self.tick(t), Ordering::Relaxed);
            slot.created.store(self.tick(t), Ordering::Relaxed);
        }
        if let Some(p) = s.priority {
            prefix.raise_priority(p);
        }
        prefix
    }
}

/// The protecting step `split_moves_no_pin` (model `split_vs_pin_counts`):
/// pins stay on the node object they were taken on, which keeps its path
/// as the suffix, so a split moves no pin and cannot double- or un-count a
/// pin taken concurrently. The protection is an omission by design, so
/// there is nothing to take out: its control does what the design avoids
/// and copies the child's pin counts into the new prefix node, as SGLang
/// copies `lock_ref`.
fn split_moves_no_pin(prefix: &Node, child: &Node) {
    if crate::negative::removed("split_moves_no_pin") {
        for (t, c) in child.slots() {
            let slot = prefix.slot(t);
            for _ in 0..c.residency.load().pins() {
                let _ = slot.residency.try_pin(None);
            }
        }
    }
}

/// The protecting step `split_rereads_deepest` (model
/// `split_vs_deepening_insert`): once the child's image names `prefix`, the
/// child's `deepest` is read again into the prefix (a raise that climbed
/// through the child's old image passed the prefix by); then its
/// ancestors are raised to it (`split_raises_ancestors`). Its control
/// leaves the prefix with the depth it was built with.
fn split_rereads_deepest(tree: &Tree, prefix: &Node, s: &Split<'_>, guard: &Guard) {
    if crate::negative::removed("split_rereads_deepest") {
        return;
    }
    // Without tracking no walk raises anything: the depth the prefix was
    // built with stands, and the RMW below (a write to the child's line on
    // every split of every cache) is spared.
    if !tree.tracks_depths() {
        return;
    }
    // A read-modify-write that changes nothing, not a load: an RMW reads
    // the latest value, so either it reads a raise of the child (made by
    // an RMW too), or that raise comes after it in the child's order, reads
    // from it and so sees the image published before it (release, then
    // acquire). A load would need the two sides' store-then-load orders to
    // be one total order.
    let deepest = s.child.deepest.fetch_max(0, Ordering::SeqCst);
    prefix.raise_deepest(deepest);
    split_raises_ancestors(tree, prefix, s.parent, guard);
}

/// The protecting step `split_raises_ancestors` (model
/// `split_vs_deepening_insert`): the prefix's ancestors are raised to its
/// depth, as a raising walk would, whether the prefix got it when it was
/// built or from the re-read: a walk that raised the child before the
/// split read it climbs to the prefix and stops there, finding it raised.
/// Its control raises the prefix alone. Called while depths are tracked.
fn split_raises_ancestors(tree: &Tree, prefix: &Node, parent: &Node, guard: &Guard) {
    if crate::negative::removed("split_raises_ancestors") {
        return;
    }
    tree.raise_ancestors(parent, prefix.deepest.load(Ordering::SeqCst), guard);
}

/// The protecting step `split_event_in_lock` (model `split_event_vs_evict`):
/// the split is reported to the listener (`report`) under both locks,
/// before the prefix node is published (`change`, which publishes and
/// then releases the locks), for every tier that holds the child. Its
/// control reports after the locks are gone.
fn split_event_in_lock<R>(report: impl FnOnce(), change: impl FnOnce() -> R) -> R {
    if crate::negative::removed("split_event_in_lock") {
        let r = change();
        // Any thread may run between the release and the report (under
        // loom a scheduling point: nothing else here is one).
        crate::sync::thread::yield_now();
        report();
        return r;
    }
    report();
    change()
}
