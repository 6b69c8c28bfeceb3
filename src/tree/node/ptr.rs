//! The two raw pointers the tree links nodes with, generic over the node
//! type so that the containers holding them (images, children) name no
//! node: [`Link`], the tree's one strong reference to a linked node, as a
//! children array or table holds it; and [`ParentPtr`], a parent link in
//! an image. Plus [`arc_of`], a new strong reference to a node reached
//! through either.

use crate::sync::Arc;

/// A linked node, as children arrays hold it: no reference count of its
/// own. The tree owns one strong reference per linked node, taken when the
/// node is linked ([`Link::new`]) and given up when it is unlinked (to the
/// reclaimer, which releases it after the grace period), so copying an
/// array copies plain pointers.
pub(crate) struct Link<N>(*const N);

impl<N> Clone for Link<N> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<N> Copy for Link<N> {}
impl<N> PartialEq for Link<N> {
    fn eq(&self, o: &Self) -> bool {
        std::ptr::eq(self.0, o.0)
    }
}
impl<N> Eq for Link<N> {}
impl<N> std::fmt::Debug for Link<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Link({:p})", self.0)
    }
}

// SAFETY: a `Link` is an address of a node (which is `Send + Sync`);
// dereferencing it is governed by the reclamation argument of the tree
// (the `protocol` module docs).
unsafe impl<N: Send + Sync> Send for Link<N> {}
// SAFETY: as above.
unsafe impl<N: Send + Sync> Sync for Link<N> {}

impl<N> Link<N> {
    /// Allocates `node` and takes the tree's reference to it.
    pub(crate) fn new(node: N) -> Link<N> {
        Link(Arc::into_raw(Arc::new(node)))
    }

    /// The link of `n`, a node linked already: the tree's reference moves
    /// with it (a split files the child below its new prefix node).
    ///
    /// # Safety
    /// `n` is linked (the tree holds its reference, from [`new`](Self::new)),
    /// and the link is filed in place of its current one, so that the
    /// reference is still held once.
    pub(crate) unsafe fn to_linked(n: &N) -> Link<N> {
        Link(n)
    }

    /// The pointer (for a parent link to the node).
    pub(crate) fn as_ptr(self) -> *const N {
        self.0
    }

    /// The address (for tables that store it, and to compare).
    pub(crate) fn addr(self) -> usize {
        self.0 as usize
    }

    /// The link of the node at `addr` (a table's stored address).
    ///
    /// # Safety
    /// `addr` is the address of a [`Link`] of this node type, taken with
    /// [`addr`](Self::addr) from a link the tree still holds.
    pub(crate) unsafe fn from_addr(addr: usize) -> Link<N> {
        Link(addr as *const N)
    }

    /// Whether this links `n`.
    #[cfg(test)]
    pub(crate) fn is(self, n: &N) -> bool {
        std::ptr::eq(self.0, n)
    }

    /// The node, for as long as this pointer is borrowed.
    ///
    /// # Safety
    ///
    /// The pointer was read from a children array loaded under an epoch
    /// guard that outlives the returned reference (or the caller just
    /// linked it under such a guard), or the caller has exclusive access to
    /// the tree (teardown). Safe code reaches nodes through the children's
    /// iterators, whose references are bounded by the array's, itself
    /// bounded by its guard.
    pub(crate) unsafe fn node_unchecked(&self) -> &N {
        // SAFETY: the caller's contract. A node in an array that was current
        // at load time was linked then; unlinking it releases the tree's
        // reference only through the reclaimer, after every guard that
        // could have seen it, so the node outlives the borrow.
        unsafe { &*self.0 }
    }

    /// The node, for as long as `guard` lives.
    ///
    /// # Safety
    /// The caller has just linked it under `guard` (or read it from an
    /// array loaded under `guard`).
    pub(crate) unsafe fn node_in(self, _guard: &crossbeam_epoch::Guard) -> &N {
        // SAFETY: the caller's contract; the tree's reference is released
        // only through the reclaimer, after `guard` is dropped.
        unsafe { &*self.0 }
    }

    /// Releases the tree's reference at once (teardown).
    ///
    /// # Safety
    /// Called exactly once per [`new`](Self::new), and no reader can still
    /// reach the node through the tree.
    pub(crate) unsafe fn release(self) {
        // SAFETY: the caller's contract; the pointer came from `Arc::into_raw`.
        drop(unsafe { Arc::from_raw(self.0) });
    }
}

/// A raw parent pointer, as an image holds it. Null for a namespace root.
pub(crate) struct ParentPtr<N>(pub(crate) *const N);

impl<N> Clone for ParentPtr<N> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<N> Copy for ParentPtr<N> {}
impl<N> PartialEq for ParentPtr<N> {
    fn eq(&self, o: &Self) -> bool {
        std::ptr::eq(self.0, o.0)
    }
}
impl<N> Eq for ParentPtr<N> {}
impl<N> std::fmt::Debug for ParentPtr<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ParentPtr({:p})", self.0)
    }
}

// SAFETY: the pointer is only dereferenced while an epoch guard is held and
// the child was linked at some moment during that guard's life; the parent
// is then linked at that moment too and its memory is only released through
// the reclaimer after that guard (the `protocol` module docs), so it
// outlives the guard. The pointee is `Sync`.
unsafe impl<N: Sync> Send for ParentPtr<N> {}
// SAFETY: as above; `ParentPtr` is an immutable address.
unsafe impl<N: Sync> Sync for ParentPtr<N> {}

impl<N> ParentPtr<N> {
    /// The parent link to `n`.
    pub(crate) fn to(n: &N) -> Self {
        ParentPtr(n)
    }

    /// No parent (a namespace root).
    pub(crate) fn none() -> Self {
        ParentPtr(std::ptr::null())
    }

    /// Whether there is no parent.
    pub(crate) fn is_null(self) -> bool {
        self.0.is_null()
    }

    /// Whether this points at `n`.
    pub(crate) fn is(self, n: &N) -> bool {
        std::ptr::eq(self.0, n)
    }
}

/// A new strong reference to a node (handles, leases and candidate heaps
/// hold one).
///
/// # Safety
///
/// `n` must be a node of a tree — allocated in an `Arc` (linked nodes
/// through `Link::new`, roots in the namespace table) — that is linked,
/// or was reached under an epoch guard that is still alive, or is kept
/// alive by another strong reference: then that `Arc`'s strong count is at
/// least one for as long as `n` is borrowed.
pub(crate) unsafe fn arc_of<N>(n: &N) -> Arc<N> {
    let p: *const N = n;
    // SAFETY: by the caller's contract, `p` is the payload of a live `Arc`
    // whose strong count is at least one, so the count may be incremented
    // and the pointer turned back into an `Arc` (which owns that increment).
    unsafe {
        Arc::increment_strong_count(p);
        Arc::from_raw(p)
    }
}
