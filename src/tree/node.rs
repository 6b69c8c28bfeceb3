//! Nodes of the concurrent radix tree.
//!
//! A node's mutable parts are each one atomic word, so a reader that holds an
//! epoch guard always sees a consistent value of each:
//!
//! * `image`: an immutable [`Image`] (parent pointer, key tokens, and per
//!   device the values of those tokens), replaced copy-on-write whenever the
//!   node is split or a residency is added or removed. Key, values and
//!   parent therefore always agree with each other.
//! * `children`: an immutable sorted [`Children`] array, replaced
//!   copy-on-write when a child is attached, replaced by a split, or removed.
//! * per device, a [`Residency`] state word and the stamps of that device.
//!
//! Every replacement happens under the node's `lock` *and* its parent's lock
//! (parent first), so writers that change the same node serialize; readers
//! take no lock and validate instead (see the module docs of `tree`).

use super::residency::Residency;
use crate::sync::{Arc, AtomicBool, AtomicI64, AtomicU32, AtomicU64, Mutex, Ordering};
use crossbeam_epoch::{Atomic, Guard, Owned, Shared};
use crossbeam_utils::CachePadded;

/// A raw parent pointer. Null for a namespace root.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ParentPtr(pub(crate) *const Node);

// SAFETY: the pointer is only dereferenced while an epoch guard is held and
// the child was linked at some moment during that guard's life; the parent
// is then linked at that moment too and its memory is only released through
// a deferred destruction of the array that owned it (tree module docs,
// "Reclamation"), so it outlives the guard. The pointee is `Sync`.
unsafe impl Send for ParentPtr {}
// SAFETY: as above; `ParentPtr` is an immutable address.
unsafe impl Sync for ParentPtr {}

/// An immutable snapshot of a node's position, key and values.
#[derive(Debug)]
pub(crate) struct Image {
    /// The parent this image was published under.
    pub(crate) parent: ParentPtr,
    /// The node's tokens (page-aligned, non-empty except for roots).
    pub(crate) key: Arc<[u32]>,
    /// Per device: the values of the node's tokens, when resident there.
    pub(crate) values: Box<[Option<Arc<[u32]>>]>,
}

#[cfg(loom)]
impl Drop for Image {
    fn drop(&mut self) {
        crate::sync::probe::died(self as *const Image as usize);
    }
}

/// Boxes an image for publication (and, under loom, registers it).
pub(crate) fn boxed(image: Image) -> Owned<Image> {
    let owned = Owned::new(image);
    #[cfg(loom)]
    crate::sync::probe::born(&*owned as *const Image as usize);
    owned
}

/// One child entry: the child's first page and the child.
pub(crate) type ChildEntry = (Arc<[u32]>, Arc<Node>);

/// An immutable, sorted-by-first-page array of children.
#[derive(Debug, Default)]
pub(crate) struct Children {
    pub(crate) entries: Vec<ChildEntry>,
}

impl Children {
    /// The child whose first page is `page`.
    pub(crate) fn find(&self, page: &[u32]) -> Option<&Arc<Node>> {
        self.entries
            .binary_search_by(|(k, _)| (**k).cmp(page))
            .ok()
            .map(|i| &self.entries[i].1)
    }

    /// A copy with `(page, child)` inserted or replacing the entry for `page`.
    pub(crate) fn with(&self, page: Arc<[u32]>, child: Arc<Node>) -> Children {
        let mut entries = self.entries.clone();
        match entries.binary_search_by(|(k, _)| (**k).cmp(&page)) {
            Ok(i) => entries[i] = (page, child),
            Err(i) => entries.insert(i, (page, child)),
        }
        Children { entries }
    }

    /// A copy without the entry for `page`.
    pub(crate) fn without(&self, page: &[u32]) -> Children {
        let mut entries = self.entries.clone();
        if let Ok(i) = entries.binary_search_by(|(k, _)| (**k).cmp(page)) {
            entries.remove(i);
        }
        Children { entries }
    }
}

/// The per-device slot of a node: residency word and that device's stamps.
/// Cache-padded so that schedulers of different devices never share a line
/// on hot nodes.
#[derive(Debug)]
pub(crate) struct DevSlot {
    pub(crate) residency: Residency,
    /// Last access stamp on this device (moves forward only: `fetch_max`).
    pub(crate) last_access: AtomicU64,
    /// Stamp of the moment this residency (or the node) was created.
    pub(crate) created: AtomicU64,
    /// Matches on this device that consumed or ended on this node.
    pub(crate) hits: AtomicU64,
    /// Children resident on this device. Changed only under this node's lock.
    pub(crate) resident_children: AtomicU32,
}

impl DevSlot {
    pub(crate) fn new(resident: bool) -> Self {
        DevSlot {
            residency: if resident {
                Residency::new_resident()
            } else {
                Residency::absent()
            },
            last_access: AtomicU64::new(0),
            created: AtomicU64::new(0),
            hits: AtomicU64::new(0),
            resident_children: AtomicU32::new(0),
        }
    }
}

/// A node of the tree.
#[derive(Debug)]
pub(crate) struct Node {
    /// Unique within the tree; a last tie-breaker and a debugging aid.
    pub(crate) id: u64,
    /// Namespace roots are never stamped, pinned or evicted.
    pub(crate) is_root: bool,
    /// The write lock. Taken parent first, then child.
    pub(crate) lock: Mutex<()>,
    /// Set (under the parent's and this node's lock) when unlinked.
    pub(crate) obsolete: AtomicBool,
    pub(crate) image: Atomic<Image>,
    pub(crate) children: Atomic<Children>,
    /// SGLang's node priority (per node, not per device).
    pub(crate) priority: AtomicI64,
    pub(crate) dev: Box<[CachePadded<DevSlot>]>,
}

impl Node {
    pub(crate) fn new(
        id: u64,
        is_root: bool,
        image: Image,
        children: Children,
        priority: i64,
    ) -> Self {
        let dev = image
            .values
            .iter()
            .map(|v| CachePadded::new(DevSlot::new(v.is_some())))
            .collect();
        Node {
            id,
            is_root,
            lock: Mutex::new(()),
            obsolete: AtomicBool::new(false),
            image: Atomic::from(boxed(image)),
            children: Atomic::new(children),
            priority: AtomicI64::new(priority),
            dev,
        }
    }

    /// The current image. Never null.
    pub(crate) fn image<'g>(&self, guard: &'g Guard) -> Shared<'g, Image> {
        let img = self.image.load(Ordering::SeqCst, guard);
        #[cfg(loom)]
        crate::sync::probe::assert_live(img.as_raw() as usize);
        img
    }

    /// The current image as a reference.
    pub(crate) fn image_ref<'g>(&self, guard: &'g Guard) -> &'g Image {
        // SAFETY: `image` is never null (set at construction, only ever
        // swapped for another non-null image) and a loaded image is retired
        // with `defer_destroy`, so it lives until `guard` is dropped.
        unsafe { self.image(guard).deref() }
    }

    /// The current children.
    pub(crate) fn children_ref<'g>(&self, guard: &'g Guard) -> &'g Children {
        // SAFETY: as for `image_ref`: never null, retired with `defer_destroy`.
        unsafe { self.children.load(Ordering::SeqCst, guard).deref() }
    }

    /// Publishes a new image and retires the old one. Caller holds this
    /// node's lock and its parent's.
    pub(crate) fn publish_image(&self, image: Image, guard: &Guard) {
        let old = self.image.swap(boxed(image), Ordering::SeqCst, guard);
        // SAFETY: `old` was just unlinked from the only place that published
        // it, so no new reader can load it; readers that already did hold a
        // guard, and destruction is deferred until they are all gone. This
        // deferral is the protecting step of race 7.
        #[cfg(not(radixkv_negative = "defer_destroy"))]
        unsafe {
            guard.defer_destroy(old)
        };
        // SAFETY: deliberately unsound: the negative control of race 7 frees
        // the image at once, which the loom model must catch.
        #[cfg(radixkv_negative = "defer_destroy")]
        drop(unsafe { old.into_owned() });
    }

    /// Publishes new children and retires the old array. Caller holds this
    /// node's lock.
    pub(crate) fn publish_children(&self, children: Children, guard: &Guard) {
        let old = self
            .children
            .swap(Owned::new(children), Ordering::SeqCst, guard);
        // SAFETY: as in `publish_image`.
        unsafe { guard.defer_destroy(old) };
    }

    /// Whether this node holds values on `d` (roots count as resident).
    pub(crate) fn resident(&self, d: usize) -> bool {
        self.is_root || self.dev[d].residency.load().resident()
    }

    /// Whether the node is resident on any device.
    pub(crate) fn resident_anywhere(&self) -> bool {
        self.dev.iter().any(|s| s.residency.load().resident())
    }

    /// Moves the access stamp of `d` forward to `stamp`.
    pub(crate) fn stamp(&self, d: usize, stamp: u64) {
        if !self.is_root {
            // Relaxed suffices: stamps are advisory eviction keys, read in
            // quiescent state or tolerated stale by eviction; fetch_max keeps
            // them monotone under any interleaving.
            self.dev[d].last_access.fetch_max(stamp, Ordering::Relaxed);
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        // SAFETY: `drop` has exclusive access; no guard-holding reader can
        // still reach this node (its last `Arc` is gone, and readers only
        // reach nodes through arrays that hold an `Arc`).
        unsafe {
            let guard = crossbeam_epoch::unprotected();
            let img = self.image.load(Ordering::Relaxed, guard);
            if !img.is_null() {
                drop(img.into_owned());
            }
            let ch = self.children.load(Ordering::Relaxed, guard);
            if !ch.is_null() {
                drop(ch.into_owned());
            }
        }
    }
}
