//! Branch depths, for tlru (see `EvictionPolicy::Tlru`): every node knows
//! the deepest end depth its subtree has reached ([`Node::deepest`], never
//! lowered: a conversation's length, which stays what it was when its tail
//! is evicted), and [`Tree::start_of`] counts the tokens before its key on
//! its path (kept nowhere: a node's 4 spare bytes hold `deepest`, and a
//! field more would cost every node 8 bytes for a policy few caches use).
//!
//! A new node's `deepest` is its own end depth; while the tree tracks
//! depths, linking it raises its ancestors up to the first one that had
//! already reached that depth (whoever raised that one raises, or raised,
//! its ancestors too). A split's new prefix node takes the child's
//! `deepest`, and reads it again once the child's new image is published,
//! so a walk that raised the child and then climbed through its old image
//! (to the old parent, past the prefix) is not lost (the `Node` module's
//! atomics table); then the split raises the prefix's ancestors to the
//! prefix's depth, as a walk would (a walk that raised the child before
//! the split read it may climb to the prefix and stop there). Tracking is off unless the cache ranks
//! by tlru, whose bookkeeping it is: a conversation that keeps setting a
//! new depth raises its whole path on every turn.

use crate::sync::Ordering;
use crate::tree::node::Node;
use crate::tree::ops::walk::climb_to_root;
use crate::tree::state::Tree;
use crossbeam_epoch::Guard;

impl Tree {
    /// Whether linking a node raises its ancestors' `deepest`.
    pub(crate) fn tracks_depths(&self) -> bool {
        // Relaxed: a switch of policy is not ordered with the inserts
        // running through it (see `track_depths`).
        self.tracks_depths.load(Ordering::Relaxed)
    }

    /// Raises `deepest` on `parent` and its ancestors to at least `depth`
    /// (the end depth of a node just linked below `parent`), up to the
    /// first that had already reached it.
    pub(crate) fn raise_ancestors(&self, parent: &Node, depth: u32, guard: &Guard) {
        let mut n = parent;
        while !n.is_root && n.raise_deepest(depth) {
            let img = n.image_ref(guard);
            if img.parent.is_null() {
                return; // unlinked meanwhile: its old path is not the tree's
            }
            // SAFETY: `n` was reached under `guard`, so its image's parent
            // was linked during the guard's life and is not freed before it
            // (see `ParentPtr`).
            n = unsafe { &*img.parent.0 };
        }
    }

    /// The tokens on `n`'s path before its key, counted up its parent
    /// links (`None` once `n` or its path was unlinked). Exact under any split: a split
    /// moves tokens between a node and its new parent, and a climb reads
    /// either image of the child, the old one (whose parent holds them all)
    /// or the new one (whose parent, the prefix, holds the moved ones).
    pub(crate) fn start_of(&self, n: &Node) -> Option<u64> {
        let guard = crossbeam_epoch::pin();
        // A node seen linked after the guard was pinned was linked during
        // its life: it was reached under the guard, as the climb needs.
        if n.is_obsolete() {
            return None;
        }
        // The climb visits `n`'s own image first: the path less its key.
        let (mut path, mut own) = (0u64, None);
        climb_to_root(n, &guard, |_, img| {
            let len = img.key.len() as u64;
            own.get_or_insert(len);
            path += len;
            Some(())
        })?;
        Some(path - own.unwrap_or(0))
    }

    /// Starts raising ancestors on every link (a switch to tlru), and
    /// raises every node of the tree as it stands to its subtree's deepest
    /// end depth. A node linked while this runs, by an insert that read the
    /// switch as not made yet, may leave its ancestors unraised: depths are
    /// exact for every branch that grows after the switch.
    pub(crate) fn track_depths(&self, guard: &Guard) {
        // SeqCst, with the nodes loaded after it: the scan below sees every
        // node linked before the switch was seen.
        if self.tracks_depths.swap(true, Ordering::SeqCst) {
            return;
        }
        let nodes = self.nodes(guard);
        // Pre-order: a child comes after its parent, so going backwards
        // raises every node after all of its subtree.
        for &(n, parent) in nodes.iter().rev() {
            if let Some(p) = parent {
                nodes[p].0.raise_deepest(n.deepest.load(Ordering::SeqCst));
            }
        }
    }
}
