//! Nodes of the concurrent radix tree.
//!
//! A node's mutable parts are each one atomic word, so a reader that holds an
//! epoch guard always sees a consistent value of each:
//!
//! * `image`: an immutable [`Image`] (parent pointer, key tokens, and per
//!   device the values of those tokens), replaced copy-on-write whenever the
//!   node is split or a residency is added or removed. Key, values and
//!   parent therefore always agree with each other.
//! * `children`: the node's [`Children`]: a flat sorted array replaced
//!   copy-on-write when a child is attached, replaced by a split, or
//!   removed, or for a wide node a table changed in place (and rebuilt
//!   copy-on-write when it fills).
//! * per device, a [`Residency`] state word and the stamps of that device.
//!
//! Every replacement happens under the node's `lock` *and* its parent's lock
//! (parent first), so writers that change the same node serialize; readers
//! take no lock and validate instead (see the module docs of `tree`).
//!
//! The values codec is `values` and the children arrays are `children`;
//! this module holds the node itself, its image, and the pointers the tree
//! links nodes with.

pub(crate) use super::children::Children; // also named through `node` (by `reclaim`)
use super::children::NO_CHILDREN;
use super::reclaim::Retired;
use super::residency::Residency;
use super::values::{head_and_words, DeviceValues};
use crate::sync::{Arc, AtomicBool, AtomicI64, AtomicU32, AtomicU64, Mutex, MutexGuard, Ordering};
use crossbeam_epoch::{Atomic, Guard, Owned, Pointable, Pointer, Shared};
use std::alloc::Layout;

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

/// An immutable snapshot of a node's position, key and values, in one
/// allocation: a fixed [`ImageHead`], then the key's tokens. A node's key
/// used to live in an allocation of its own (an `Arc<[u32]>` shared by the
/// node's successive images); inline, it costs no reference count, no fat
/// pointer and no separate allocation, and a reader that loads the image
/// finds the tokens it compares next to it instead of behind one more
/// pointer. The price is a copy of the key whenever an image is replaced
/// (a residency added or removed, a split), which is rarer than the reads.
///
/// Reached through `Atomic<Image>` like any other epoch-managed object:
/// the [`Pointable`] implementation below turns the thin address crossbeam
/// keeps into a reference (the head holds the key's length).
#[repr(C)]
pub(crate) struct Image {
    head: ImageHead,
    /// The node's tokens (page-aligned, non-empty except for roots).
    pub(crate) key: [u32],
}

/// The fixed part of an [`Image`], at its start (offset 0: `repr(C)`).
#[derive(Debug)]
#[repr(C)]
pub(crate) struct ImageHead {
    /// The parent this image was published under.
    pub(crate) parent: ParentPtr,
    /// The values of the node's tokens on each device where it is resident.
    pub(crate) values: DeviceValues,
    /// The key's length in tokens (the metadata of the `key` tail).
    len: usize,
}

/// What a new image is made of; [`boxed`] copies the key into it.
#[derive(Debug)]
pub(crate) struct ImageParts<'k> {
    /// See [`ImageHead::parent`].
    pub(crate) parent: ParentPtr,
    /// The tokens, copied into the image.
    pub(crate) key: &'k [u32],
    /// See [`ImageHead::values`].
    pub(crate) values: DeviceValues,
}

/// An owned [`ImageParts`]: what `Owned::<Image>::init` takes
/// ([`Pointable::Init`]). The tree builds images through [`boxed`], which
/// borrows the key instead.
#[derive(Debug)]
pub(crate) struct ImageInit {
    pub(crate) parent: ParentPtr,
    pub(crate) key: Box<[u32]>,
    pub(crate) values: DeviceValues,
}

impl std::ops::Deref for Image {
    type Target = ImageHead;
    fn deref(&self) -> &ImageHead {
        &self.head
    }
}

impl std::fmt::Debug for Image {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Image")
            .field("parent", &self.head.parent)
            .field("key", &&self.key)
            .field("values", &self.head.values)
            .finish()
    }
}

#[cfg(loom)]
impl Drop for Image {
    fn drop(&mut self) {
        crate::sync::probe::died(self as *const Image as *const () as usize);
    }
}

impl Image {
    /// The allocation of an image with a key of `len` tokens, and the
    /// key's offset in it (`repr(C)`: see `values::head_and_words`).
    fn layout(len: usize) -> (Layout, usize) {
        head_and_words::<ImageHead>(len)
    }

    /// Allocates an image of `parts` and returns its address.
    fn write(parent: ParentPtr, key: &[u32], values: DeviceValues) -> usize {
        let (layout, offset) = Image::layout(key.len());
        // SAFETY: `layout` has a non-zero size (the head is not empty).
        let p = unsafe { std::alloc::alloc(layout) };
        if p.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        // SAFETY: `p` is a fresh allocation of `layout`, aligned for the
        // head (its alignment is the layout's) with `offset` the key's
        // place in it, `key.len()` `u32`s long (see `layout`); nothing else
        // can see it yet. The head's `len` is the key's length, so the
        // reference `fat` builds covers exactly what was written.
        unsafe {
            p.cast::<ImageHead>().write(ImageHead {
                parent,
                values,
                len: key.len(),
            });
            std::ptr::copy_nonoverlapping(key.as_ptr(), p.add(offset).cast::<u32>(), key.len());
            debug_assert_eq!(
                Layout::for_value(&*Image::fat(p as usize)),
                layout,
                "the computed layout is the type's"
            );
        }
        p as usize
    }

    /// The wide pointer to the image at thin address `ptr`.
    ///
    /// # Safety
    /// `ptr` came from [`Image::write`] and was not freed yet.
    unsafe fn fat(ptr: usize) -> *mut Image {
        // SAFETY: the caller's contract: the head was written at `ptr`.
        let len = unsafe { (*(ptr as *const ImageHead)).len };
        // A slice pointer of the key's length, cast to the struct whose
        // tail is that slice: the same address and metadata.
        std::ptr::slice_from_raw_parts_mut(ptr as *mut u32, len) as *mut Image
    }
}

// What crossbeam relies on (the trait is safe to implement, its methods
// are `unsafe fn`): `init` returns the address of an allocation aligned to `ALIGN`
// (the head's alignment is the layout's, `Image::layout`), holding a head
// and the key it describes; `deref`/`deref_mut` rebuild the reference from
// the head's length, and `drop` drops the head and frees the allocation
// with the layout it was made with. crossbeam calls these only on
// addresses `init` returned (or `from_usize` got from `Image::write`, the
// same allocation), as its contract says.
impl Pointable for Image {
    const ALIGN: usize = std::mem::align_of::<ImageHead>();
    type Init = ImageInit;

    unsafe fn init(init: ImageInit) -> usize {
        Image::write(init.parent, &init.key, init.values)
    }

    unsafe fn deref<'a>(ptr: usize) -> &'a Image {
        // SAFETY: crossbeam's contract (`ptr` is live, not mutably borrowed).
        unsafe { &*Image::fat(ptr) }
    }

    unsafe fn deref_mut<'a>(ptr: usize) -> &'a mut Image {
        // SAFETY: crossbeam's contract (`ptr` is live and not borrowed).
        unsafe { &mut *Image::fat(ptr) }
    }

    unsafe fn drop(ptr: usize) {
        // SAFETY: crossbeam's contract: `ptr` is live and nobody else can
        // reach it. The image is dropped in place (its head's values; the
        // key needs nothing), then its allocation freed with its layout.
        unsafe {
            let (layout, _) = Image::layout((*(ptr as *const ImageHead)).len);
            std::ptr::drop_in_place(Image::fat(ptr));
            std::alloc::dealloc(ptr as *mut u8, layout);
        }
    }
}

/// Boxes an image for publication (and, under loom, registers it).
pub(crate) fn boxed(parts: ImageParts<'_>) -> Owned<Image> {
    let addr = Image::write(parts.parent, parts.key, parts.values);
    #[cfg(loom)]
    crate::sync::probe::born(addr);
    // SAFETY: `addr` is a live image from `Image::write`, owned by no one
    // else: what `Owned` requires of it (see the `Pointable` impl).
    unsafe { Owned::from_usize(addr) }
}

/// The thin address of an image (what the loom probe and the reclaimer
/// keep).
pub(crate) fn image_addr(img: Shared<'_, Image>) -> usize {
    img.into_usize()
}

/// A linked node, as children arrays hold it: no reference count of its
/// own. The tree owns one strong reference per linked node, taken when the
/// node is linked ([`NodePtr::link`]) and released through the epoch when it
/// is unlinked ([`NodePtr::release`]), so copying an array copies plain
/// pointers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct NodePtr(pub(crate) *const Node);

// SAFETY: a `NodePtr` is an address of a `Node` (which is `Send + Sync`);
// dereferencing it is governed by the reclamation argument on `node`.
unsafe impl Send for NodePtr {}
// SAFETY: as above.
unsafe impl Sync for NodePtr {}

impl NodePtr {
    /// Allocates `node` and takes the tree's reference to it.
    pub(crate) fn link(node: Node) -> NodePtr {
        NodePtr(Arc::into_raw(Arc::new(node)))
    }

    /// The node, for as long as this pointer is borrowed.
    ///
    /// # Safety
    ///
    /// The pointer was read from a children array loaded under an epoch
    /// guard that outlives the returned reference (or the caller just
    /// linked it under such a guard), or the caller has exclusive access to
    /// the tree (teardown). Safe code reaches nodes through
    /// [`Children::nodes`] and `Children::with_hash`, whose references are
    /// bounded by the array's, itself bounded by its guard.
    pub(crate) unsafe fn node_unchecked(&self) -> &Node {
        // SAFETY: the caller's contract. A node in an array that was current
        // at load time was linked then; unlinking it releases the tree's
        // reference only through the reclaimer, after every guard that
        // could have seen it, so the node outlives the borrow.
        unsafe { &*self.0 }
    }

    /// The node, for as long as `guard` lives.
    ///
    /// # Safety
    ///
    /// The caller has just linked it under `guard` (or read it from an
    /// array loaded under `guard`).
    pub(crate) unsafe fn node_in(self, _guard: &Guard) -> &Node {
        // SAFETY: the caller's contract; the tree's reference is released
        // only after `guard` is dropped.
        unsafe { &*self.0 }
    }

    /// Releases the tree's reference. The caller has unlinked the node and
    /// calls this from a deferred function (or at teardown), so no reader
    /// can still reach the node through the tree.
    ///
    /// # Safety
    /// Called exactly once per [`link`](Self::link), after the node became
    /// unreachable from every array a reader could still hold.
    pub(crate) unsafe fn release(self) {
        // SAFETY: the caller's contract; the pointer came from `Arc::into_raw`.
        drop(unsafe { Arc::from_raw(self.0) });
    }
}

/// A new strong reference to a node (handles and leases hold one).
///
/// # Safety
///
/// `n` must be a node of a tree — allocated in an `Arc` (linked nodes
/// through `NodePtr::link`, roots in the namespace table) — that is linked,
/// or was reached under an epoch guard that is still alive, or is kept
/// alive by another strong reference: then that `Arc`'s strong count is at
/// least one for as long as `n` is borrowed.
pub(crate) unsafe fn arc_of(n: &Node) -> Arc<Node> {
    let p: *const Node = n;
    // SAFETY: by the caller's contract, `p` is the payload of a live `Arc`
    // whose strong count is at least one, so the count may be incremented
    // and the pointer turned back into an `Arc` (which owns that increment).
    unsafe {
        Arc::increment_strong_count(p);
        Arc::from_raw(p)
    }
}

/// The per-device slot of a node: residency word and that device's stamps.
#[derive(Debug)]
pub(crate) struct DevSlot {
    pub(crate) residency: Residency,
    /// Last access stamp on this device (moves forward only: `fetch_max`).
    pub(crate) last_access: AtomicU64,
    /// Stamp of the moment this residency (or the node) was created.
    pub(crate) created: AtomicU64,
    /// Matches on this device that consumed or ended on this node.
    pub(crate) hits: AtomicU64,
    /// `hits` when the node last became a leaf on this device because its
    /// last resident child there was evicted: the hits since are the
    /// prefix's own (slru's promotion test). Written by that device's
    /// evictor only.
    pub(crate) hits_base: AtomicU64,
    /// Children resident on this device. Changed only under this node's lock.
    pub(crate) resident_children: AtomicU32,
}

/// A node's device slots. With one device the slot lives inside the node;
/// with several, each sits on a 64-byte line of its own, so that schedulers
/// of different devices never write the same line on hot nodes.
#[derive(Debug)]
pub(crate) enum Slots {
    /// The single device's slot.
    One(DevSlot),
    /// One line-aligned slot per device.
    Many(Box<[SlotLine]>),
}

/// A device slot aligned to a 64-byte cache line (its 48 bytes fill one).
/// Not `CachePadded`, which pads to 128 bytes on x86_64 against the
/// adjacent-line prefetcher: that doubled a multi-device node's size (512
/// bytes of slots at 4 devices, the largest part of a leaf) for a
/// second-order effect; the stamps a scheduler writes still never share a
/// line with another device's.
#[derive(Debug)]
#[repr(align(64))]
pub(crate) struct SlotLine(pub(crate) DevSlot);

// One line per slot, as the docs above say (loom's atomics are larger).
#[cfg(not(loom))]
const _: () = assert!(std::mem::size_of::<SlotLine>() == 64);

impl std::ops::Deref for SlotLine {
    type Target = DevSlot;
    fn deref(&self) -> &DevSlot {
        &self.0
    }
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
            hits_base: AtomicU64::new(0),
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
    pub(crate) dev: Slots,
}

impl Node {
    pub(crate) fn new(
        id: u64,
        is_root: bool,
        devices: usize,
        image: ImageParts<'_>,
        children: Children,
        priority: i64,
    ) -> Self {
        let dev = if devices == 1 {
            Slots::One(DevSlot::new(image.values.is_present(0)))
        } else {
            Slots::Many(
                (0..devices)
                    .map(|e| SlotLine(DevSlot::new(image.values.is_present(e))))
                    .collect(),
            )
        };
        Node {
            id,
            is_root,
            lock: Mutex::new(()),
            obsolete: AtomicBool::new(false),
            image: Atomic::from(boxed(image)),
            children: if children.is_empty() {
                Atomic::null()
            } else {
                Atomic::new(children)
            },
            priority: AtomicI64::new(priority),
            dev,
        }
    }

    /// The slot of device `d`.
    #[inline]
    pub(crate) fn dev(&self, d: usize) -> &DevSlot {
        match &self.dev {
            Slots::One(s) => {
                debug_assert_eq!(d, 0);
                s
            }
            Slots::Many(v) => &v[d],
        }
    }

    /// Every device's slot, in device order.
    pub(crate) fn slots(&self) -> impl Iterator<Item = &DevSlot> {
        let (one, many): (Option<&DevSlot>, &[SlotLine]) = match &self.dev {
            Slots::One(s) => (Some(s), &[]),
            Slots::Many(v) => (None, v),
        };
        one.into_iter().chain(many.iter().map(|s| &**s))
    }

    /// The current image. Never null.
    pub(crate) fn image<'g>(&self, guard: &'g Guard) -> Shared<'g, Image> {
        let img = self.image.load(Ordering::SeqCst, guard);
        #[cfg(loom)]
        crate::sync::probe::assert_live(image_addr(img));
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

    /// Publishes a new image and retires the old one into `retired`. Only
    /// through [`Locked`], which holds this node's lock and its parent's.
    fn publish_image(&self, image: ImageParts<'_>, guard: &Guard, retired: &mut Retired) {
        let old = self.image.swap(boxed(image), Ordering::SeqCst, guard);
        // `old` is unreachable from now on; readers that loaded it hold
        // guards, and `retired` frees it only after they are all gone. This
        // deferral is the protecting step of race 7.
        #[cfg(not(radixkv_negative = "defer_destroy"))]
        retired.image(old);
        // SAFETY: deliberately unsound: the negative control of race 7 frees
        // the image at once, which the loom model must catch.
        #[cfg(radixkv_negative = "defer_destroy")]
        {
            let _ = &retired;
            drop(unsafe { old.into_owned() });
        }
    }

    /// Publishes new children and retires the old ones into `retired`.
    /// Only through [`Locked`], which holds this node's lock.
    fn publish_children(&self, children: Children, guard: &Guard, retired: &mut Retired) {
        let new = if children.is_empty() {
            Shared::null()
        } else {
            Owned::new(children).into_shared(guard)
        };
        let old = self.children.swap(new, Ordering::SeqCst, guard);
        // The old children (an array, or a table rebuilt into a new one)
        // are freed after the grace period of every reader that may still
        // hold them: model 14 checks it for tables.
        #[cfg(not(radixkv_negative = "table_retire"))]
        retired.children(old);
        // The negative control ends a replaced table's life at once instead:
        // it is marked freed for the loom probe and its slots clobbered (as a
        // reuse of its memory would), while a reader may still hold it. (Its
        // memory is leaked rather than freed, so that the model reports the
        // use instead of reading freed memory.)
        #[cfg(radixkv_negative = "table_retire")]
        {
            // SAFETY: `old` was this node's children, loaded under `guard`.
            match unsafe { old.as_ref() } {
                Some(Children::Table(t)) => t.clobber_as_freed(),
                _ => retired.children(old),
            }
        }
    }

    /// Applies a change to this node's children: in place (a table), or by
    /// publishing the successor it returns. Only through [`Locked`].
    fn change_children(
        &self,
        change: impl FnOnce(&Children) -> Option<Children>,
        guard: &Guard,
        retired: &mut Retired,
    ) {
        if let Some(next) = change(self.children_ref(guard)) {
            self.publish_children(next, guard, retired);
        }
    }

    /// Whether this node holds values on `d` (roots count as resident).
    pub(crate) fn resident(&self, d: usize) -> bool {
        self.is_root || self.dev(d).residency.load().resident()
    }

    /// Whether the node is resident on any device.
    pub(crate) fn resident_anywhere(&self) -> bool {
        self.slots().any(|s| s.residency.load().resident())
    }

    /// Raises the node's priority to at least `p` (SGLang keeps the maximum
    /// of the priorities inserted through a node). Writes only when `p` is
    /// higher: every insert passes through the root and the shared prompt
    /// nodes, and an unconditional read-modify-write there would take the
    /// line readers load the node's image and children from away from every
    /// other core on each insert.
    pub(crate) fn raise_priority(&self, p: i64) {
        // SeqCst, as the read-modify-write it short-cuts: the priority only
        // ever grows, so a load that already sees `p` or more means the
        // fetch_max would have changed nothing.
        if self.priority.load(Ordering::SeqCst) < p {
            self.priority.fetch_max(p, Ordering::SeqCst);
        }
    }

    /// Moves the access stamp of `d` forward to `stamp`.
    pub(crate) fn stamp(&self, d: usize, stamp: u64) {
        if !self.is_root {
            // Relaxed suffices: stamps are advisory eviction keys, read in
            // quiescent state or tolerated stale by eviction; fetch_max keeps
            // them monotone under any interleaving.
            self.dev(d).last_access.fetch_max(stamp, Ordering::Relaxed);
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

/// How a [`Locked`] takes its locks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Locking {
    /// Wait for them (writers among writers).
    Wait,
    /// Only if free now (a match never waits for a lock).
    Try,
}

/// What a [`Locked`] constructor found instead of a validated pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LockFailed {
    /// The tree changed under the caller (re-walk).
    Changed,
    /// With [`Locking::Try`]: another thread holds a lock.
    Busy,
}

/// What the child's state must still be, checked under both locks.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Expect<'g> {
    /// Linked (not obsolete) and still a child of the parent.
    Linked,
    /// As `Linked`, and its image is still exactly this one.
    Image(Shared<'g, Image>),
    /// Nothing (only a negative control asks for this).
    #[allow(dead_code)]
    Nothing,
}

fn take_lock(m: &Mutex<()>, locking: Locking) -> Option<MutexGuard<'_, ()>> {
    match locking {
        Locking::Wait => Some(crate::sync::lock(m)),
        Locking::Try => crate::sync::try_lock(m),
    }
}

/// The protocol step every structural change starts with: a parent and
/// (usually) one of its children, both locked (parent first: the ancestor
/// order of two nodes never flips, so this cannot deadlock), and checked
/// under those locks by the constructor: the parent not unlinked (and,
/// when asked, resident on a device), the child still linked below it (and,
/// when asked, with the very image the caller computed from). Images and
/// children arrays are published only through this guard, so no code can
/// publish without holding the locks or without having validated; the
/// locks go when it drops.
#[derive(Debug)]
pub(crate) struct Locked<'a> {
    parent: &'a Node,
    child: Option<&'a Node>,
    _parent_lock: Option<MutexGuard<'a, ()>>,
    _child_lock: Option<MutexGuard<'a, ()>>,
}

impl<'a> Locked<'a> {
    /// Locks `parent` and checks that it is not unlinked and, with
    /// `resident_on`, that it is resident on that device.
    pub(crate) fn parent(
        parent: &'a Node,
        resident_on: Option<usize>,
        locking: Locking,
    ) -> Result<Self, LockFailed> {
        let guard = take_lock(&parent.lock, locking).ok_or(LockFailed::Busy)?;
        // An obsolete parent was unlinked, or is a reclaimed namespace root:
        // nothing may hang below it. The namespace model's control lets a
        // reclaimed root pass (an obsolete root has no child, so only an
        // attach can get past this).
        #[cfg(not(radixkv_negative = "root_obsolete_check"))]
        let gone = parent.obsolete.load(Ordering::SeqCst);
        #[cfg(radixkv_negative = "root_obsolete_check")]
        let gone = parent.obsolete.load(Ordering::SeqCst) && !parent.is_root;
        if gone || resident_on.is_some_and(|d| !parent.resident(d)) {
            return Err(LockFailed::Changed);
        }
        Ok(Locked {
            parent,
            child: None,
            _parent_lock: Some(guard),
            _child_lock: None,
        })
    }

    /// Also locks `child` and checks `expect` under both locks.
    pub(crate) fn with_child(
        mut self,
        child: &'a Node,
        expect: Expect<'_>,
        locking: Locking,
        guard: &Guard,
    ) -> Result<Self, LockFailed> {
        let lock = take_lock(&child.lock, locking).ok_or(LockFailed::Busy)?;
        let ok = match expect {
            Expect::Nothing => true,
            Expect::Linked => {
                !child.obsolete.load(Ordering::SeqCst)
                    && std::ptr::eq(child.image_ref(guard).parent.0, self.parent)
            }
            Expect::Image(seen) => {
                !child.obsolete.load(Ordering::SeqCst) && child.image(guard) == seen
            }
        };
        if !ok {
            return Err(LockFailed::Changed);
        }
        self.child = Some(child);
        self._child_lock = Some(lock);
        Ok(self)
    }

    /// The parent of `child` (as its image names it) and `child`, both
    /// locked: re-reads the parent under its lock until a split no longer
    /// moves it; `None` if `child` is a root or was unlinked. With
    /// `lock_parent` false (a negative control only), the parent is not
    /// locked.
    pub(crate) fn parent_of(child: &'a Node, lock_parent: bool, guard: &'a Guard) -> Option<Self> {
        loop {
            let pp = child.image_ref(guard).parent;
            if pp.0.is_null() {
                return None;
            }
            // SAFETY: `child` was reached under `guard` (the caller's
            // contract); its image's parent was linked after the guard was
            // pinned (see `ParentPtr`), so it is allocated while `guard` is.
            let parent: &'a Node = unsafe { &*pp.0 };
            let pl = lock_parent.then(|| crate::sync::lock(&parent.lock));
            if child.image_ref(guard).parent != pp {
                continue; // split meanwhile: lock the new parent instead
            }
            let cl = crate::sync::lock(&child.lock);
            if child.obsolete.load(Ordering::SeqCst) {
                return None;
            }
            return Some(Locked {
                parent,
                child: Some(child),
                _parent_lock: pl,
                _child_lock: Some(cl),
            });
        }
    }

    /// The locked parent.
    pub(crate) fn parent_node(&self) -> &'a Node {
        self.parent
    }

    /// Publishes the child's new image (both locks held), retiring the old.
    pub(crate) fn publish_child_image(
        &self,
        image: ImageParts<'_>,
        guard: &Guard,
        retired: &mut Retired,
    ) {
        let Some(child) = self.child else {
            debug_assert!(false, "no child locked");
            return;
        };
        child.publish_image(image, guard, retired);
    }

    /// Files `child` under `hash` among the parent's children (its lock
    /// held): in place in a table, otherwise by publishing a new array
    /// and retiring the old. The caller checked, under this lock, that no
    /// child starts with that page.
    pub(crate) fn add_parent_child(
        &self,
        hash: u64,
        child: NodePtr,
        guard: &Guard,
        retired: &mut Retired,
    ) {
        self.parent
            .change_children(|c| c.add(hash, child), guard, retired);
    }

    /// Replaces the parent's child `old` (filed under `hash`) by `new`,
    /// which starts with the same page (a split's prefix node).
    pub(crate) fn replace_parent_child(
        &self,
        hash: u64,
        old: &Node,
        new: NodePtr,
        guard: &Guard,
        retired: &mut Retired,
    ) {
        self.parent
            .change_children(|c| c.replace(hash, old, new), guard, retired);
    }

    /// Removes the parent's child `old` (filed under `hash`); returns
    /// whether the parent has no child left, or `None` (nothing changed)
    /// if `old` is not among its children.
    pub(crate) fn remove_parent_child(
        &self,
        hash: u64,
        old: &Node,
        guard: &Guard,
        retired: &mut Retired,
    ) -> Option<bool> {
        let next = self.parent.children_ref(guard).remove(hash, old).ok()?;
        if let Some(next) = next {
            self.parent.publish_children(next, guard, retired);
        }
        Some(self.parent.children_ref(guard).is_empty())
    }

    /// Marks the child unlinked (both locks held).
    pub(crate) fn mark_child_obsolete(&self) {
        if let Some(c) = self.child {
            c.obsolete.store(true, Ordering::SeqCst);
        }
    }

    /// Marks the parent unlinked (its lock held): a reclaimed namespace root.
    pub(crate) fn mark_parent_obsolete(&self) {
        self.parent.obsolete.store(true, Ordering::SeqCst);
    }
}
