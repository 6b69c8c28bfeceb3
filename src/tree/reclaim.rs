//! Where unlinked objects wait for their grace period, and who frees them.
//!
//! crossbeam-epoch runs deferred functions inside `pin()` on whichever thread
//! happens to collect: with plain `defer_destroy`, a scheduler matching a
//! prompt would free the nodes, images and arrays that the evictor just
//! unlinked, and its match latency would carry the evictor's work. Instead,
//! each structural change gathers what it unlinked into one [`Retired`]
//! batch and defers only a cheap hand-over: once the grace period has passed
//! the batch is pushed onto the tree's [`Reclaimer`] queue, and the evictor
//! (or an insert, once the queue is long) frees it.
//!
//! The queue uses `std`'s mutex and counter, not the `sync` shim: it only
//! moves ownership of objects whose grace period is over, and is part of no
//! protocol that the loom models check (the grace period itself is
//! crossbeam-epoch's, which loom does check).

use super::node::{Children, Image, NodePtr};
use crossbeam_epoch::{Guard, Shared};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Objects unlinked by one structural change.
#[derive(Default)]
pub(crate) struct Retired {
    images: Vec<*mut Image>,
    children: Vec<*mut Children>,
    nodes: Vec<NodePtr>,
    /// Set once the grace period has passed; until then dropping frees
    /// nothing (a panic mid-change leaks rather than frees too early).
    expired: bool,
}

// SAFETY: the pointers are owned boxes (from `Owned`) and tree references
// of nodes that no thread can reach any more; they are only dereferenced,
// to free them, after the grace period, by whichever thread holds the batch.
unsafe impl Send for Retired {}

impl Retired {
    /// An image that was just replaced.
    pub(crate) fn image(&mut self, old: Shared<'_, Image>) {
        if !old.is_null() {
            self.images.push(old.as_raw() as *mut Image);
        }
    }

    /// A children array that was just replaced.
    pub(crate) fn children(&mut self, old: Shared<'_, Children>) {
        if !old.is_null() {
            self.children.push(old.as_raw() as *mut Children);
        }
    }

    /// The tree's reference to a node that was just unlinked.
    pub(crate) fn node(&mut self, n: NodePtr) {
        self.nodes.push(n);
    }

    fn len(&self) -> usize {
        self.images.len() + self.children.len() + self.nodes.len()
    }
}

impl Drop for Retired {
    fn drop(&mut self) {
        if !self.expired {
            return;
        }
        for &p in &self.images {
            // SAFETY: `p` came from `Owned::new` (a `Box`), was unlinked
            // before retirement, and its grace period has passed.
            drop(unsafe { Box::from_raw(p) });
        }
        for &p in &self.children {
            // SAFETY: as for images.
            drop(unsafe { Box::from_raw(p) });
        }
        for n in self.nodes.drain(..) {
            // SAFETY: the node was unlinked once, its one tree reference
            // retired once, and the grace period has passed.
            unsafe { n.release() };
        }
    }
}

/// The tree's queue of batches whose grace period has passed.
#[derive(Default)]
pub(crate) struct Reclaimer {
    queue: Mutex<Vec<Retired>>,
    pending: AtomicUsize,
}

impl std::fmt::Debug for Reclaimer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reclaimer")
            .field("pending", &self.pending())
            .finish()
    }
}

impl Reclaimer {
    /// Hands `batch` over once every thread pinned now has unpinned.
    pub(crate) fn retire(self: &Arc<Self>, mut batch: Retired, guard: &Guard) {
        if batch.len() == 0 {
            return;
        }
        let me = Arc::clone(self);
        guard.defer(move || {
            batch.expired = true;
            // Relaxed: `pending` is a size hint for when to reclaim; the
            // queue's mutex orders the hand-over itself.
            me.pending.fetch_add(batch.len(), Ordering::Relaxed);
            let mut q = match me.queue.lock() {
                Ok(q) => q,
                Err(p) => p.into_inner(),
            };
            q.push(batch);
        });
    }

    /// Objects waiting to be freed.
    pub(crate) fn pending(&self) -> usize {
        self.pending.load(Ordering::Relaxed)
    }

    /// Frees every batch whose grace period has passed (outside the lock).
    pub(crate) fn reclaim(&self) {
        let batches = {
            let mut q = match self.queue.lock() {
                Ok(q) => q,
                Err(p) => p.into_inner(),
            };
            std::mem::take(&mut *q)
        };
        let n: usize = batches.iter().map(Retired::len).sum();
        self.pending.fetch_sub(n, Ordering::Relaxed);
        drop(batches);
    }
}
