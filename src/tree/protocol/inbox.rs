//! The leaf inbox: per tier, the nodes that may have become eviction
//! candidates (leaves) since the evictor last looked, pushed lock-free by
//! inserts and drained by the evictor into its candidate heap (or dropped
//! while the policy ranks by a scan). It is always kept, so that a switch
//! of policy at run time never races an insert over whether its leaf is
//! noted (model `policy_switch_vs_insert`).

use crate::sync::Arc;
use crate::tree::node::Node;

/// A node that may have become a leaf on a tier, with its last access
/// there as it was when it was noted (it was just linked or made resident
/// then, so reading it cost nothing): enough for the candidate heap to file
/// it under a lower bound of its key without visiting the node (see
/// `EvictionPolicy::lower_bound`). The heap re-validates each entry against
/// the node when it is popped, and the policies that use the heap only
/// ever rank a node later as time passes (`EvictionPolicy::keys_only_grow`),
/// so a key that is low only means an early, re-checked pop.
#[derive(Debug)]
pub(crate) struct LeafNote {
    /// The node.
    pub(crate) node: Arc<Node>,
    /// Its last access on the tier.
    pub(crate) last_access: u64,
}

/// A tier's inbox of notes: lock-free (crossbeam's `SegQueue`) normally;
/// under loom a shim mutex, because loom cannot see the queue's own
/// synchronization (the queue only moves ownership of the notes).
#[derive(Debug, Default)]
pub(crate) struct LeafInbox {
    #[cfg(not(loom))]
    q: crossbeam_queue::SegQueue<LeafNote>,
    #[cfg(loom)]
    q: crate::sync::Mutex<Vec<LeafNote>>,
}

impl LeafInbox {
    /// Adds a note.
    pub(crate) fn push(&self, n: LeafNote) {
        #[cfg(not(loom))]
        self.q.push(n);
        #[cfg(loom)]
        crate::sync::lock(&self.q).push(n);
    }

    /// Takes a note, if any.
    pub(crate) fn pop(&self) -> Option<LeafNote> {
        #[cfg(not(loom))]
        return self.q.pop();
        #[cfg(loom)]
        return crate::sync::lock(&self.q).pop();
    }

    /// Notes waiting (a hint: pushes may come meanwhile).
    pub(crate) fn len(&self) -> usize {
        #[cfg(not(loom))]
        return self.q.len();
        #[cfg(loom)]
        return crate::sync::lock(&self.q).len();
    }
}
