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

/// The values of a node's tokens on one device.
///
/// Stored verbatim (one `u32` per token), or, at page size > 1 when every
/// page's values are a contiguous run (what a paged allocator hands out),
/// as one base value per page: 4 bytes per page instead of per token.
#[derive(Clone, Debug)]
pub(crate) struct Values {
    data: Arc<[u32]>,
    paged: bool,
}

impl Values {
    /// Values for `v` (whole pages of `ps` tokens).
    pub(crate) fn new(v: &[u32], ps: usize) -> Values {
        let runs = ps > 1
            && v.chunks(ps).all(|c| {
                c.iter()
                    .enumerate()
                    .all(|(j, &x)| c[0].checked_add(j as u32) == Some(x))
            });
        if runs {
            Values {
                data: v.chunks(ps).map(|c| c[0]).collect(),
                paged: true,
            }
        } else {
            Values {
                data: Arc::from(v),
                paged: false,
            }
        }
    }

    /// How many tokens these values cover.
    pub(crate) fn tokens(&self, ps: usize) -> usize {
        if self.paged {
            self.data.len() * ps
        } else {
            self.data.len()
        }
    }

    /// The values of tokens `from..to` (multiples of `ps`).
    pub(crate) fn slice(&self, from: usize, to: usize, ps: usize) -> Values {
        let data = if self.paged {
            Arc::from(&self.data[from / ps..to / ps])
        } else {
            Arc::from(&self.data[from..to])
        };
        Values {
            data,
            paged: self.paged,
        }
    }

    /// Appends one value per token to `out`.
    pub(crate) fn append_to(&self, out: &mut Vec<u32>, ps: usize) {
        if self.paged {
            out.extend(
                self.data
                    .iter()
                    .flat_map(|&b| (0..ps as u32).map(move |j| b + j)),
            );
        } else {
            out.extend_from_slice(&self.data);
        }
    }
}

/// An immutable snapshot of a node's position, key and values.
#[derive(Debug)]
pub(crate) struct Image {
    /// The parent this image was published under.
    pub(crate) parent: ParentPtr,
    /// The node's tokens (page-aligned, non-empty except for roots).
    pub(crate) key: Arc<[u32]>,
    /// Per device: the values of the node's tokens, when resident there.
    pub(crate) values: Box<[Option<Values>]>,
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

/// The hash a child is filed under: its first token at page size 1, a
/// 64-bit mix of its first page otherwise. Equal hashes are resolved by
/// comparing the child's key.
pub(crate) fn page_hash(page: &[u32]) -> u64 {
    if let [t] = page {
        return u64::from(*t);
    }
    page.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &t| {
        (h.rotate_left(5) ^ u64::from(t)).wrapping_mul(0x517c_c1b7_2722_0a95)
    })
}

/// One child entry: the hash of the child's first page, and the child.
pub(crate) type ChildEntry = (u64, Arc<Node>);

/// An immutable array of children sorted by [`page_hash`]. 16 bytes per
/// child; a node without children holds no array at all.
#[derive(Debug, Default)]
pub(crate) struct Children {
    pub(crate) entries: Vec<ChildEntry>,
}

/// What a node without children points at.
pub(crate) static NO_CHILDREN: Children = Children {
    entries: Vec::new(),
};

impl Children {
    /// The entries filed under `hash`.
    pub(crate) fn with_hash(&self, hash: u64) -> &[ChildEntry] {
        let lo = self.entries.partition_point(|(h, _)| *h < hash);
        let hi = lo + self.entries[lo..].partition_point(|(h, _)| *h == hash);
        &self.entries[lo..hi]
    }

    /// A copy with `child` added under `hash`.
    pub(crate) fn with_added(&self, hash: u64, child: Arc<Node>) -> Children {
        let mut entries = Vec::with_capacity(self.entries.len() + 1);
        let at = self.entries.partition_point(|(h, _)| *h <= hash);
        entries.extend_from_slice(&self.entries[..at]);
        entries.push((hash, child));
        entries.extend_from_slice(&self.entries[at..]);
        Children { entries }
    }

    /// A copy with the entry of `old` pointing at `new` (same first page).
    pub(crate) fn with_replaced(&self, old: &Node, new: Arc<Node>) -> Children {
        let mut entries = self.entries.clone();
        if let Some(e) = entries.iter_mut().find(|(_, c)| std::ptr::eq(&**c, old)) {
            e.1 = new;
        }
        Children { entries }
    }

    /// A copy without `node`.
    pub(crate) fn without(&self, node: &Node) -> Children {
        let mut entries = self.entries.clone();
        entries.retain(|(_, c)| !std::ptr::eq(&**c, node));
        Children { entries }
    }
}

/// The per-device slot of a node: residency word and that device's stamps.
/// One cache line each, so that schedulers of different devices never
/// share a line on hot nodes.
#[derive(Debug)]
#[repr(align(64))]
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
    pub(crate) dev: Box<[DevSlot]>,
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
            .map(|v| DevSlot::new(v.is_some()))
            .collect();
        Node {
            id,
            is_root,
            lock: Mutex::new(()),
            obsolete: AtomicBool::new(false),
            image: Atomic::from(boxed(image)),
            children: if children.entries.is_empty() {
                Atomic::null()
            } else {
                Atomic::new(children)
            },
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
        let c = self.children.load(Ordering::SeqCst, guard);
        // SAFETY: non-null arrays are retired with `defer_destroy`, so they
        // live until `guard` is dropped.
        unsafe { c.as_ref() }.unwrap_or(&NO_CHILDREN)
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
        let new = if children.entries.is_empty() {
            Shared::null()
        } else {
            Owned::new(children).into_shared(guard)
        };
        let old = self.children.swap(new, Ordering::SeqCst, guard);
        if !old.is_null() {
            // SAFETY: as in `publish_image`.
            unsafe { guard.defer_destroy(old) };
        }
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

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn values_store_page_runs_and_expand_exactly() {
        let runs = [32, 33, 34, 35, 8, 9, 10, 11];
        let v = Values::new(&runs, 4);
        assert!(v.paged && v.data.len() == 2, "two pages, one base each");
        let mut out = Vec::new();
        v.slice(4, 8, 4).append_to(&mut out, 4);
        v.slice(0, 4, 4).append_to(&mut out, 4);
        assert_eq!(out, [8, 9, 10, 11, 32, 33, 34, 35]);
        let scattered = [1, 7, 3, 4];
        let v = Values::new(&scattered, 2);
        assert!(!v.paged);
        assert_eq!(v.tokens(2), 4);
        let mut out = Vec::new();
        v.append_to(&mut out, 2);
        assert_eq!(out, scattered);
        // u32::MAX cannot start a run of two.
        assert!(!Values::new(&[u32::MAX, 0], 2).paged);
    }

    #[test]
    fn page_hash_is_exact_at_page_size_one() {
        assert_eq!(page_hash(&[7]), 7);
        assert_ne!(page_hash(&[1, 2]), page_hash(&[2, 1]));
    }
}
