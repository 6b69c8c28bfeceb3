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

use super::reclaim::Retired;
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

/// The values of a node's tokens on one device, in one 16-byte handle.
///
/// The first word of the array says how the rest is stored; the smallest
/// of three encodings is chosen when the values are stored:
///
/// * verbatim: one `u32` per token;
/// * page bases (page size > 1, every page a contiguous run of slots, as a
///   paged allocator hands out): one `u32` per page;
/// * runs: `(first, length)` pairs of contiguous values, e.g. one pair for
///   a request whose slots were allocated together.
#[derive(Clone, Debug)]
pub(crate) struct Values(Arc<[u32]>);

const VERBATIM: u32 = 0;
const PAGE_BASES: u32 = 1;
const RUNS: u32 = 2;

impl Values {
    /// Values for `v` (whole pages of `ps` tokens).
    pub(crate) fn new(v: &[u32], ps: usize) -> Values {
        let mut runs: Vec<u32> = Vec::new();
        for &x in v {
            match runs.len() {
                n if n >= 2 && runs[n - 2].checked_add(runs[n - 1]) == Some(x) => runs[n - 1] += 1,
                _ => runs.extend([x, 1]),
            }
        }
        let pages_ok = ps > 1
            && v.chunks(ps).all(|c| {
                c.iter()
                    .enumerate()
                    .all(|(j, &x)| c[0].checked_add(j as u32) == Some(x))
            });
        let pages = if pages_ok { v.len() / ps } else { usize::MAX };
        let data: Vec<u32> = if runs.len() < v.len().min(pages) {
            std::iter::once(RUNS).chain(runs).collect()
        } else if pages < v.len() {
            std::iter::once(PAGE_BASES)
                .chain(v.chunks(ps).map(|c| c[0]))
                .collect()
        } else {
            std::iter::once(VERBATIM).chain(v.iter().copied()).collect()
        };
        Values(Arc::from(data))
    }

    fn kind(&self) -> u32 {
        self.0[0]
    }

    fn body(&self) -> &[u32] {
        &self.0[1..]
    }

    /// How many tokens these values cover.
    pub(crate) fn tokens(&self, ps: usize) -> usize {
        match self.kind() {
            PAGE_BASES => self.body().len() * ps,
            RUNS => self.body().chunks(2).map(|r| r[1] as usize).sum(),
            _ => self.body().len(),
        }
    }

    /// The values of tokens `from..to` (multiples of `ps`).
    pub(crate) fn slice(&self, from: usize, to: usize, ps: usize) -> Values {
        let body = self.body();
        let data: Vec<u32> = match self.kind() {
            PAGE_BASES => std::iter::once(PAGE_BASES)
                .chain(body[from / ps..to / ps].iter().copied())
                .collect(),
            RUNS => {
                let mut out = vec![RUNS];
                let mut at = 0;
                for r in body.chunks(2) {
                    let (first, len) = (r[0] as usize, r[1] as usize);
                    let (lo, hi) = (from.max(at), to.min(at + len));
                    if lo < hi {
                        out.extend([(first + lo - at) as u32, (hi - lo) as u32]);
                    }
                    at += len;
                }
                out
            }
            _ => std::iter::once(VERBATIM)
                .chain(body[from..to].iter().copied())
                .collect(),
        };
        Values(Arc::from(data))
    }

    /// Appends one value per token to `out`.
    pub(crate) fn append_to(&self, out: &mut Vec<u32>, ps: usize) {
        let body = self.body();
        match self.kind() {
            PAGE_BASES => {
                out.reserve(body.len() * ps);
                for &b in body {
                    out.extend(b..b + ps as u32);
                }
            }
            RUNS => {
                for r in body.chunks_exact(2) {
                    out.extend(r[0]..r[0] + r[1]);
                }
            }
            _ => out.extend_from_slice(body),
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

    /// The node.
    pub(crate) fn node(&self) -> &Node {
        // SAFETY: a `NodePtr` is read from a children array loaded under an
        // epoch guard (the borrow of `self` lives no longer than that
        // array), or was just linked by the caller. A node in an array that
        // was current at load time was linked then; unlinking it releases
        // the tree's reference only through `Guard::defer`, i.e. after every
        // guard that could have seen it, so the node outlives the borrow.
        unsafe { &*self.0 }
    }

    /// The node, for as long as `guard` lives. The caller has just linked
    /// it (or read it from an array loaded under `guard`).
    pub(crate) fn node_in(self, _guard: &Guard) -> &Node {
        // SAFETY: as in `node`: the tree's reference is released only after
        // `guard` is dropped.
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

/// A new strong reference to a node that is linked, or was reached under a
/// guard that is still alive (handles and leases hold one).
pub(crate) fn arc_of(n: &Node) -> Arc<Node> {
    let p: *const Node = n;
    // SAFETY: every node lives in an `Arc` (linked nodes through
    // `NodePtr::link`, roots in the namespace table) whose strong count is
    // at least one while `n` can be borrowed (see `NodePtr::node`), so the
    // count may be incremented and the pointer turned back into an `Arc`.
    unsafe {
        Arc::increment_strong_count(p);
        Arc::from_raw(p)
    }
}

/// One child entry: the hash of the child's first page, and the child.
pub(crate) type ChildEntry = (u64, NodePtr);

/// Children arrays up to this size are one flat array.
const FLAT_MAX: usize = 64;
/// Chunks of a wide node's array split when they grow past this.
const CHUNK_MAX: usize = 64;

/// An immutable array of children sorted by [`page_hash`], replaced
/// copy-on-write. A node without children holds no array at all; up to
/// `FLAT_MAX` children are one flat array (16 bytes each); wider nodes (a
/// system prompt with thousands of continuations) keep sorted chunks of at
/// most `CHUNK_MAX`, shared between versions, so adding or removing a child
/// copies one chunk and the chunk index rather than the whole array.
#[derive(Debug)]
pub(crate) enum Children {
    /// Up to `FLAT_MAX` entries.
    Flat(Vec<ChildEntry>),
    /// Non-empty sorted chunks; every hash of chunk i is <= every hash of
    /// chunk i + 1.
    /// The second vector holds each chunk's first hash, contiguous, so a
    /// lookup touches one chunk only.
    Chunked(Vec<Arc<[ChildEntry]>>, Vec<u64>),
}

impl Default for Children {
    fn default() -> Self {
        Children::Flat(Vec::new())
    }
}

/// What a node without children points at.
pub(crate) static NO_CHILDREN: Children = Children::Flat(Vec::new());

impl Children {
    /// One flat array.
    pub(crate) fn flat(entries: Vec<ChildEntry>) -> Children {
        Children::Flat(entries)
    }

    /// Whether there are no children.
    pub(crate) fn is_empty(&self) -> bool {
        match self {
            Children::Flat(v) => v.is_empty(),
            Children::Chunked(c, _) => c.is_empty(),
        }
    }

    /// Every entry, in hash order.
    pub(crate) fn iter(&self) -> impl DoubleEndedIterator<Item = &ChildEntry> {
        let (flat, chunks): (&[ChildEntry], &[Arc<[ChildEntry]>]) = match self {
            Children::Flat(v) => (v, &[]),
            Children::Chunked(c, _) => (&[], c),
        };
        flat.iter().chain(chunks.iter().flat_map(|c| c.iter()))
    }

    /// The children filed under `hash` (usually one), in order.
    pub(crate) fn with_hash(&self, hash: u64) -> impl Iterator<Item = &Node> {
        let (flat, chunks): (&[ChildEntry], &[Arc<[ChildEntry]>]) = match self {
            Children::Flat(v) => (v, &[]),
            Children::Chunked(c, firsts) => {
                // The first chunk that can hold `hash`: the one before the
                // first chunk starting above it, or an earlier one that ends
                // with it (equal hashes may straddle a boundary).
                let mut at = firsts.partition_point(|&f| f <= hash).saturating_sub(1);
                while at > 0 && firsts[at] == hash {
                    at -= 1;
                }
                (&[], &c[at..])
            }
        };
        let lo = flat.partition_point(|(h, _)| *h < hash);
        flat[lo..]
            .iter()
            .chain(chunks.iter().flat_map(move |ch| {
                let lo = ch.partition_point(|(h, _)| *h < hash);
                ch[lo..].iter()
            }))
            .skip_while(move |(h, _)| *h < hash)
            .take_while(move |(h, _)| *h == hash)
            .map(|(_, c)| c.node())
    }

    /// Chunked children from non-empty sorted chunks.
    fn chunked(chunks: Vec<Arc<[ChildEntry]>>) -> Children {
        let firsts = chunks.iter().map(|ch| ch[0].0).collect();
        Children::Chunked(chunks, firsts)
    }

    /// A copy with `child` added under `hash`.
    pub(crate) fn with_added(&self, hash: u64, child: NodePtr) -> Children {
        match self {
            Children::Flat(v) => {
                let mut entries = Vec::with_capacity(v.len() + 1);
                let at = v.partition_point(|(h, _)| *h <= hash);
                entries.extend_from_slice(&v[..at]);
                entries.push((hash, child));
                entries.extend_from_slice(&v[at..]);
                if entries.len() <= FLAT_MAX {
                    Children::Flat(entries)
                } else {
                    Children::chunked(entries.chunks(CHUNK_MAX / 2).map(Arc::from).collect())
                }
            }
            Children::Chunked(chunks, firsts) => {
                let c = firsts.partition_point(|&f| f <= hash).saturating_sub(1);
                let old = &chunks[c];
                let at = old.partition_point(|(h, _)| *h <= hash);
                let mut grown = Vec::with_capacity(old.len() + 1);
                grown.extend_from_slice(&old[..at]);
                grown.push((hash, child));
                grown.extend_from_slice(&old[at..]);
                let mut out = Vec::with_capacity(chunks.len() + 1);
                out.extend_from_slice(&chunks[..c]);
                if grown.len() > CHUNK_MAX {
                    let half = grown.len() / 2;
                    out.push(Arc::from(&grown[..half]));
                    out.push(Arc::from(&grown[half..]));
                } else {
                    out.push(Arc::from(grown));
                }
                out.extend_from_slice(&chunks[c + 1..]);
                Children::chunked(out)
            }
        }
    }

    /// A copy in which the entry of `old` (filed under `hash`) is replaced by
    /// `new`, or, with `new` = `None`, removed.
    pub(crate) fn with_changed(&self, hash: u64, old: &Node, new: Option<NodePtr>) -> Children {
        let change = |v: &[ChildEntry]| -> Vec<ChildEntry> {
            let mut out = Vec::with_capacity(v.len());
            for &(h, c) in v {
                if h == hash && std::ptr::eq(c.0, old) {
                    if let Some(n) = new {
                        out.push((h, n));
                    }
                } else {
                    out.push((h, c));
                }
            }
            out
        };
        match self {
            Children::Flat(v) => Children::Flat(change(v)),
            Children::Chunked(chunks, _) => {
                let mut out: Vec<Arc<[ChildEntry]>> = Vec::with_capacity(chunks.len());
                for ch in chunks {
                    let touches = ch.first().is_some_and(|e| e.0 <= hash)
                        && ch.last().is_some_and(|e| e.0 >= hash)
                        && ch.iter().any(|(h, c)| *h == hash && std::ptr::eq(c.0, old));
                    if touches {
                        let v = change(ch);
                        if !v.is_empty() {
                            out.push(Arc::from(v));
                        }
                    } else {
                        out.push(Arc::clone(ch));
                    }
                }
                Children::chunked(out)
            }
        }
    }

    /// All entries, for teardown.
    pub(crate) fn into_entries(self) -> Vec<ChildEntry> {
        match self {
            Children::Flat(v) => v,
            Children::Chunked(c, _) => c.iter().flat_map(|ch| ch.iter().copied()).collect(),
        }
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
/// with several, each sits on its own cache line, so that schedulers of
/// different devices never share a line on hot nodes.
#[derive(Debug)]
pub(crate) enum Slots {
    /// The single device's slot.
    One(DevSlot),
    /// One padded slot per device.
    Many(Box<[CachePadded<DevSlot>]>),
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
        image: Image,
        children: Children,
        priority: i64,
    ) -> Self {
        let dev = match &*image.values {
            [one] => Slots::One(DevSlot::new(one.is_some())),
            many => Slots::Many(
                many.iter()
                    .map(|v| CachePadded::new(DevSlot::new(v.is_some())))
                    .collect(),
            ),
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
        let (one, many): (Option<&DevSlot>, &[CachePadded<DevSlot>]) = match &self.dev {
            Slots::One(s) => (Some(s), &[]),
            Slots::Many(v) => (None, v),
        };
        one.into_iter().chain(many.iter().map(|s| &**s))
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

    /// Publishes a new image and retires the old one into `retired`.
    /// Caller holds this node's lock and its parent's.
    pub(crate) fn publish_image(&self, image: Image, guard: &Guard, retired: &mut Retired) {
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

    /// Publishes new children and retires the old array into `retired`.
    /// Caller holds this node's lock.
    pub(crate) fn publish_children(
        &self,
        children: Children,
        guard: &Guard,
        retired: &mut Retired,
    ) {
        let new = if children.is_empty() {
            Shared::null()
        } else {
            Owned::new(children).into_shared(guard)
        };
        retired.children(self.children.swap(new, Ordering::SeqCst, guard));
    }

    /// Whether this node holds values on `d` (roots count as resident).
    pub(crate) fn resident(&self, d: usize) -> bool {
        self.is_root || self.dev(d).residency.load().resident()
    }

    /// Whether the node is resident on any device.
    pub(crate) fn resident_anywhere(&self) -> bool {
        self.slots().any(|s| s.residency.load().resident())
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

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn values_pick_the_smallest_encoding_and_expand_exactly() {
        let expand = |v: &Values, ps| {
            let mut out = Vec::new();
            v.append_to(&mut out, ps);
            out
        };
        // Two scattered pages: page bases.
        let pages = [32, 33, 34, 35, 8, 9, 10, 11];
        let v = Values::new(&pages, 4);
        assert_eq!((v.kind(), v.body().len()), (PAGE_BASES, 2));
        assert_eq!(expand(&v.slice(4, 8, 4), 4), [8, 9, 10, 11]);
        // One contiguous run (any page size): one pair.
        let run: Vec<u32> = (100..300).collect();
        let v = Values::new(&run, 1);
        assert_eq!((v.kind(), v.body()), (RUNS, &[100, 200][..]));
        assert_eq!(v.tokens(1), 200);
        assert_eq!(
            expand(&v.slice(50, 60, 1), 1),
            (150..160).collect::<Vec<_>>()
        );
        let two = [5, 6, 7, 1, 2, 3, 4, 9];
        let v = Values::new(&two, 1);
        assert_eq!(v.kind(), RUNS);
        assert_eq!(expand(&v.slice(2, 7, 1), 1), [7, 1, 2, 3, 4]);
        assert_eq!(expand(&v, 1), two);
        // Scattered: verbatim.
        let scattered = [1, 7, 3, 4];
        let v = Values::new(&scattered, 2);
        assert_eq!(v.kind(), VERBATIM);
        assert_eq!(v.tokens(2), 4);
        assert_eq!(expand(&v, 2), scattered);
        // u32::MAX cannot start a run of two.
        assert_eq!(Values::new(&[u32::MAX, 0], 2).kind(), VERBATIM);
    }

    fn leaf(id: u64) -> NodePtr {
        NodePtr::link(Node::new(
            id,
            false,
            Image {
                parent: ParentPtr(std::ptr::null()),
                key: Arc::from(&[1u32][..]),
                values: vec![None].into_boxed_slice(),
            },
            Children::default(),
            0,
        ))
    }

    #[test]
    fn wide_children_stay_sorted_and_findable() {
        let mut c = Children::default();
        let mut all = Vec::new();
        // 600 entries with colliding hashes every 7th, in scrambled order.
        for i in 0..600u64 {
            let h = (i * 7919) % 613 / 7 * 7;
            let n = leaf(i);
            c = c.with_added(h, n);
            all.push((h, n));
        }
        assert!(matches!(c, Children::Chunked(..)));
        let hashes: Vec<u64> = c.iter().map(|e| e.0).collect();
        assert!(hashes.windows(2).all(|w| w[0] <= w[1]), "sorted by hash");
        assert_eq!(hashes.len(), 600);
        for (h, n) in &all {
            assert!(
                c.with_hash(*h).any(|x| std::ptr::eq(x, n.0)),
                "entry {} under {h}",
                n.node().id
            );
            assert!(c
                .with_hash(*h)
                .all(|x| all.iter().any(|(h2, y)| h2 == h && std::ptr::eq(x, y.0))));
        }
        // Remove every other entry, replace the rest.
        let mut fresh = Vec::new();
        for (i, (h, n)) in all.iter().enumerate() {
            c = if i % 2 == 0 {
                c.with_changed(*h, n.node(), None)
            } else {
                let f = leaf(10_000 + i as u64);
                fresh.push(f);
                c.with_changed(*h, n.node(), Some(f))
            };
        }
        assert_eq!(c.iter().count(), 300);
        assert!(c.iter().all(|(_, n)| n.node().id >= 10_000));
        let hashes: Vec<u64> = c.iter().map(|e| e.0).collect();
        assert!(hashes.windows(2).all(|w| w[0] <= w[1]));
        for (i, (h, _)) in all.iter().enumerate().filter(|(i, _)| i % 2 == 1) {
            assert!(c.with_hash(*h).any(|x| x.id == 10_000 + i as u64));
        }
        for (_, n) in all {
            // SAFETY: linked once above, released once, not used after.
            unsafe { n.release() };
        }
        for n in fresh {
            // SAFETY: as above.
            unsafe { n.release() };
        }
    }

    #[test]
    fn page_hash_is_exact_at_page_size_one() {
        assert_eq!(page_hash(&[7]), 7);
        assert_ne!(page_hash(&[1, 2]), page_hash(&[2, 1]));
    }
}
