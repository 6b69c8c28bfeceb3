//! The node of the concurrent radix tree, and what it is made of.
//!
//! | file | what it holds |
//! | --- | --- |
//! | `mod.rs` | [`Node`]: its lock, its unlinked flag, its image and children words, its priority, its branch's depth (`deepest`) and its tier slots |
//! | `image.rs` | [`Image`]: parent link, key and values per tier in one immutable allocation |
//! | `values.rs` | the values codec ([`Values`], [`DeviceValues`]) |
//! | `children/` | [`Children`]: a flat sorted array, or a table for a wide node |
//! | `slot.rs` | [`TierSlot`]: a tier's residency word, stamps and counts |
//! | `ptr.rs` | [`Link`] and [`ParentPtr`], the raw pointers nodes are linked with, and [`arc_of`] |
//!
//! A node's mutable parts are each one atomic word, so a reader that holds an
//! epoch guard always sees a consistent value of each:
//!
//! * `image`: an immutable [`Image`] (parent pointer, key tokens, and per
//!   tier the values of those tokens), replaced copy-on-write whenever the
//!   node is split or a residency is added or removed;
//! * `children`: the node's [`Children`]: a flat sorted array replaced
//!   copy-on-write when a child is attached, replaced by a split, or
//!   removed, or for a wide node a table changed in place (and rebuilt
//!   copy-on-write when it fills);
//! * per tier, a residency state word and the stamps of that tier.
//!
//! Images and children are published only through the lock guards of
//! `protocol::lock`, which hold this node's lock and its parent's; readers
//! take no lock and validate instead (the `tree` module docs).
//!
//! | atomic | ordering | why |
//! | --- | --- | --- |
//! | `image` (load) | SeqCst | pairs with the guard's publishing swap: a reader that loads an image sees the image's contents, written before it was published (Acquire would do; SeqCst is kept because the swap it pairs with is also a store→load edge against the residency word: a pin checks residency, then reads values through images) |
//! | `children` (load) | SeqCst | as `image`: the array's contents were written before the swap that published it |
//! | `obsolete` | SeqCst | set under the node's and its parent's locks; read under a lock by every validating guard (ordered by the lock), and unlocked by `is_leaf_on` as a hint that eviction re-checks |
//! | `priority` | SeqCst | a `fetch_max` short-cut by a load; read for eviction keys |
//! | `deepest` | SeqCst | raised by `fetch_max` (short-cut by a load) on every ancestor of a new node while depths are tracked, the walk reading the node's image after it; a split re-reads the child's by an RMW after publishing the child's image (see `ops::split`), so that a raise later in the child's order synchronizes with it and sees that image (AcqRel would do; SeqCst as the other words of the split) |

mod children;
mod image;
mod ptr;
mod slot;
mod values;

pub(crate) use children::{page_hash, Children, NotAChild};
pub(crate) use image::{boxed, image_addr, Image, ImageParts};
pub(crate) use ptr::{arc_of, Link, ParentPtr};
pub(crate) use slot::{Slots, TierSlot};
pub(crate) use values::{DeviceValues, Values};

use crate::sync::{AtomicBool, AtomicI64, AtomicU32, Mutex, Ordering};
use crate::tree::protocol::residency::ResidencyState;
use crossbeam_epoch::{Atomic, Guard, Shared};

/// A node's image.
pub(crate) type NodeImage = Image<Node>;
/// A node's children.
pub(crate) type NodeChildren = Children<Node>;
/// The tree's reference to a linked node.
pub(crate) type NodeLink = Link<Node>;

/// What a node without children points at.
static NO_CHILDREN: NodeChildren = Children::Flat(Vec::new());

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
    /// The current image; published only through `protocol::lock`.
    pub(crate) image: Atomic<NodeImage>,
    /// The current children (null: none); published only through
    /// `protocol::lock`.
    pub(crate) children: Atomic<NodeChildren>,
    /// SGLang's node priority (per node, not per tier).
    pub(crate) priority: AtomicI64,
    /// The deepest end depth (tokens from the namespace root) any node of
    /// this subtree has had since it was made, this node's own included;
    /// never lowered (tlru's conversation length, SGLang's
    /// `_tlru_history_len`). Ancestors are raised only while the tree
    /// tracks depths (`Tree::tracks_depths`); saturates at `u32::MAX`.
    pub(crate) deepest: AtomicU32,
    slots: Slots,
}

// Every node pays for a field: `deepest` sits in the four bytes the lock
// and the two flags leave before the next word (one more 4-byte field
// would cost 8). Checked where the lock's size is known (Linux's futex).
#[cfg(all(not(loom), target_os = "linux", target_pointer_width = "64"))]
const _: () = assert!(std::mem::size_of::<Node>() == 104);

/// A depth in tokens as a node keeps it (saturating: a path past 4 G
/// tokens only compares as the longest).
pub(crate) fn depth_u32(tokens: usize) -> u32 {
    u32::try_from(tokens).unwrap_or(u32::MAX)
}

/// What a new node is made of.
#[derive(Debug)]
pub(crate) struct NodeParts<'k> {
    /// Its id ([`Node::id`]).
    pub(crate) id: u64,
    /// Whether it is a namespace root.
    pub(crate) is_root: bool,
    /// Residency slots (tiers) of the tree.
    pub(crate) tiers: usize,
    /// Its first image; the tiers with values in it start resident.
    pub(crate) image: ImageParts<'k, Node>,
    /// Its first children.
    pub(crate) children: NodeChildren,
    /// Its priority.
    pub(crate) priority: i64,
    /// Its subtree's deepest end depth so far ([`Node::deepest`]): its own
    /// end depth for a new leaf.
    pub(crate) deepest: u32,
}

impl Node {
    /// A node, not linked yet.
    pub(crate) fn new(p: NodeParts<'_>) -> Self {
        let values = &p.image.values;
        let slots = Slots::new(p.tiers, |t| values.is_present(t));
        Node {
            id: p.id,
            is_root: p.is_root,
            lock: Mutex::new(()),
            obsolete: AtomicBool::new(false),
            image: Atomic::from(boxed(p.image)),
            children: if p.children.is_empty() {
                Atomic::null()
            } else {
                Atomic::new(p.children)
            },
            priority: AtomicI64::new(p.priority),
            deepest: AtomicU32::new(p.deepest),
            slots,
        }
    }

    /// The slot of tier `t`.
    #[inline]
    pub(crate) fn slot(&self, t: usize) -> &TierSlot {
        self.slots.get(t)
    }

    /// The slot of tier `t` if it exists, without allocating one (see
    /// [`Slots::peek`]): for reads that tell an absent tier apart.
    #[inline]
    pub(crate) fn slot_if_any(&self, t: usize) -> Option<&TierSlot> {
        self.slots.peek(t)
    }

    /// The residency state on `t`, without allocating a slot (absent
    /// where the node has none).
    #[inline]
    pub(crate) fn residency_on(&self, t: usize) -> ResidencyState {
        self.slot_if_any(t)
            .map_or(ResidencyState::ABSENT, |s| s.residency.load())
    }

    /// Every tier's slot that exists, with its tier, in tier order (see
    /// [`Slots::iter`]).
    pub(crate) fn slots(&self) -> impl Iterator<Item = (usize, &TierSlot)> {
        self.slots.iter()
    }

    /// The current image. Never null.
    pub(crate) fn image<'g>(&self, guard: &'g Guard) -> Shared<'g, NodeImage> {
        let img = self.image.load(Ordering::SeqCst, guard);
        crate::sync::probe::assert_live(image_addr(img));
        img
    }

    /// The current image as a reference.
    pub(crate) fn image_ref<'g>(&self, guard: &'g Guard) -> &'g NodeImage {
        // SAFETY: `image` is never null (set at construction, only ever
        // swapped for another non-null image) and a replaced image is
        // retired through the reclaimer (`defer_destroy`), so it lives
        // until `guard` is dropped.
        unsafe { self.image(guard).deref() }
    }

    /// The current children.
    pub(crate) fn children_ref<'g>(&self, guard: &'g Guard) -> &'g NodeChildren {
        let c = self.children.load(Ordering::SeqCst, guard);
        // SAFETY: replaced arrays and tables are retired through the
        // reclaimer (`table_retire`), so they live until `guard` is dropped.
        unsafe { c.as_ref() }.unwrap_or(&NO_CHILDREN)
    }

    /// Whether this node holds values on `t` (roots count as resident).
    pub(crate) fn resident(&self, t: usize) -> bool {
        self.is_root || self.residency_on(t).resident()
    }

    /// Whether the node is resident on any tier.
    pub(crate) fn resident_anywhere(&self) -> bool {
        self.slots().any(|(_, s)| s.residency.load().resident())
    }

    /// Whether the node was unlinked (or is a reclaimed namespace root).
    pub(crate) fn is_obsolete(&self) -> bool {
        self.obsolete.load(Ordering::SeqCst)
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

    /// Raises [`deepest`](Self::deepest) to at least `depth`; whether it
    /// was lower. Writes only when it was (as `raise_priority`: the nodes
    /// near the root are on every reader's path).
    pub(crate) fn raise_deepest(&self, depth: u32) -> bool {
        // SeqCst: see the module's table (the split's re-read).
        if self.deepest.load(Ordering::SeqCst) < depth {
            self.deepest.fetch_max(depth, Ordering::SeqCst);
            return true;
        }
        false
    }

    /// Moves the access stamp of `t` forward to `stamp`.
    pub(crate) fn stamp(&self, t: usize, stamp: u64) {
        if !self.is_root {
            // Relaxed suffices: stamps are advisory eviction keys, read in
            // quiescent state or tolerated stale by eviction; fetch_max keeps
            // them monotone under any interleaving.
            self.slot(t).last_access.fetch_max(stamp, Ordering::Relaxed);
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        // SAFETY: `drop` has exclusive access; no guard-holding reader can
        // still reach this node (its last `Arc` is gone, and readers only
        // reach nodes through arrays while the tree's reference lives).
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
