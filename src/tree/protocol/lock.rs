//! The lock guards every structural change goes through, as typestate:
//!
//! ```text
//!  ParentLocked::lock(parent)            a parent, locked and checked
//!     │  .add_child(..)                  attach a new leaf below it
//!     │  .mark_unlinked()                a namespace root that is reclaimed
//!     └─ .lock_child(child, expect) ──►  PairLocked: parent and child,
//!  PairLocked::of_child(child) ───────►    both locked and checked
//!        .publish_child_image(..)        adopt, split, evict
//!        .replace_child(..) / .remove_child(..) / .mark_child_unlinked()
//!        .parent()                       the ParentLocked inside
//! ```
//!
//! Locks are taken parent first, then child: a split only ever inserts a
//! node *between* a parent and a child, so the ancestor order of any two
//! nodes never flips and no two writers wait for each other in a circle.
//! Each constructor takes its locks and validates under them what the
//! caller relied on; images and children are published only through these
//! guards, so no code can publish without holding the locks or without
//! having validated, and the locks go when the guard drops.
//!
//! The checks are the protecting steps of their models, one named function
//! each: [`root_obsolete_check`], [`unlink_check`], [`split_recheck`],
//! [`parent_lock`], and, for what is published, [`defer_destroy`].
//!
//! | atomic | ordering | why |
//! | --- | --- | --- |
//! | `Node::image` swap (publish) | SeqCst | the image's contents are written before it is published, and a reader loads it (the node docs); a pin's generation check reads the residency word and then values through images, a store→load edge across two locations, so it stays SeqCst |
//! | `Node::children` swap (publish) | SeqCst | as `image`: an array's contents before its publication |
//! | `Node::obsolete` store (unlink) | SeqCst | under both locks; every validating guard reads it under a lock |

use crate::sync::{lock, try_lock, Mutex, MutexGuard, Ordering};
use crate::tree::node::{boxed, Node, NodeChildren, NodeImage, NodeLink};
use crate::tree::node::{ImageParts, NotAChild};
use crate::tree::protocol::reclaim::Retired;
use crossbeam_epoch::{Guard, Owned, Shared};

/// How a guard takes its locks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Locking {
    /// Wait for them (writers among writers).
    Wait,
    /// Only if free now (a match never waits for a lock).
    Try,
}

/// What a guard's constructor found instead of a validated lock.
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
    /// Linked (not unlinked) and still a child of the parent
    /// ([`unlink_check`]).
    Linked,
    /// Linked, with exactly this image ([`split_recheck`]).
    Image(Shared<'g, NodeImage>),
}

fn take(m: &Mutex<()>, locking: Locking) -> Option<MutexGuard<'_, ()>> {
    match locking {
        Locking::Wait => Some(lock(m)),
        Locking::Try => try_lock(m),
    }
}

/// A parent, locked, and checked under its lock: not unlinked (nor a
/// reclaimed namespace root) and, when asked, resident on a tier.
#[derive(Debug)]
pub(crate) struct ParentLocked<'a> {
    parent: &'a Node,
    _lock: MutexGuard<'a, ()>,
}

impl<'a> ParentLocked<'a> {
    /// Locks `parent` and checks that it is not unlinked and, with
    /// `resident_on`, that it is resident on that tier.
    pub(crate) fn lock(
        parent: &'a Node,
        resident_on: Option<usize>,
        locking: Locking,
    ) -> Result<Self, LockFailed> {
        let held = take(&parent.lock, locking).ok_or(LockFailed::Busy)?;
        if root_obsolete_check(parent) || resident_on.is_some_and(|t| !parent.resident(t)) {
            return Err(LockFailed::Changed);
        }
        Ok(ParentLocked {
            parent,
            _lock: held,
        })
    }

    /// The locked parent.
    pub(crate) fn node(&self) -> &'a Node {
        self.parent
    }

    /// Also locks `child` and checks `expect` under both locks.
    pub(crate) fn lock_child(
        self,
        child: &'a Node,
        expect: Expect<'_>,
        locking: Locking,
        guard: &Guard,
    ) -> Result<PairLocked<'a>, LockFailed> {
        let held = take(&child.lock, locking).ok_or(LockFailed::Busy)?;
        let ok = match expect {
            Expect::Linked => unlink_check(self.parent, child, guard),
            Expect::Image(seen) => split_recheck(child, seen, guard),
        };
        if !ok {
            return Err(LockFailed::Changed);
        }
        Ok(PairLocked {
            parent: self,
            child,
            _lock: held,
        })
    }

    /// Files `child` under `hash` among the parent's children: in place in
    /// a table, otherwise by publishing a new array and retiring the old.
    /// The caller checked, under this lock, that no child starts with that
    /// page.
    pub(crate) fn add_child(
        &self,
        hash: u64,
        child: NodeLink,
        guard: &Guard,
        retired: &mut Retired,
    ) {
        if let Some(next) = self.parent.children_ref(guard).add(hash, child) {
            publish_children(self.parent, next, guard, retired);
        }
    }

    /// Marks the parent unlinked (a reclaimed namespace root, its lock
    /// held): nothing can be attached, adopted or split below it any more.
    pub(crate) fn mark_unlinked(&self) {
        self.parent.obsolete.store(true, Ordering::SeqCst);
    }
}

/// A parent and one of its children, both locked (parent first) and
/// checked under those locks.
#[derive(Debug)]
pub(crate) struct PairLocked<'a> {
    parent: ParentLocked<'a>,
    child: &'a Node,
    _lock: MutexGuard<'a, ()>,
}

impl<'a> PairLocked<'a> {
    /// The parent of `child` (as its image names it) and `child`, both
    /// locked, for an eviction: re-reads the parent under its lock until a
    /// split no longer moves it; `None` if `child` is a root or was
    /// unlinked. The parent needs no check of its own: a node is unlinked
    /// (and a namespace root reclaimed) only once it has no child, so the
    /// parent of a linked child is linked.
    pub(crate) fn of_child(child: &'a Node, guard: &'a Guard) -> Option<Self> {
        loop {
            let pp = child.image_ref(guard).parent;
            if pp.is_null() {
                return None;
            }
            // SAFETY: `child` was reached under `guard` (the caller's
            // contract); its image's parent was linked after the guard was
            // pinned (see `ParentPtr`), so it is allocated while `guard` is.
            let parent: &'a Node = unsafe { &*pp.0 };
            let parent_held = parent_lock(parent);
            if child.image_ref(guard).parent != pp {
                continue; // split meanwhile: lock the new parent instead
            }
            let held = lock(&child.lock);
            if child.is_obsolete() {
                return None;
            }
            return Some(PairLocked {
                parent: ParentLocked {
                    parent,
                    _lock: parent_held,
                },
                child,
                _lock: held,
            });
        }
    }

    /// The locked parent.
    pub(crate) fn parent(&self) -> &ParentLocked<'a> {
        &self.parent
    }

    /// Publishes the child's new image, retiring the old.
    pub(crate) fn publish_child_image(
        &self,
        image: ImageParts<'_, Node>,
        guard: &Guard,
        retired: &mut Retired,
    ) {
        let old = self.child.image.swap(boxed(image), Ordering::SeqCst, guard);
        defer_destroy(old, retired);
    }

    /// Replaces the child, filed under `hash`, by `new` among the parent's
    /// children: a split's prefix node, which starts with the same page.
    pub(crate) fn replace_child(
        &self,
        hash: u64,
        new: NodeLink,
        guard: &Guard,
        retired: &mut Retired,
    ) {
        let parent = self.parent.parent;
        if let Some(next) = parent.children_ref(guard).replace(hash, self.child, new) {
            publish_children(parent, next, guard, retired);
        }
    }

    /// Removes the child, filed under `hash`, from the parent's children;
    /// returns whether the parent has no child left, or `NotAChild`
    /// (nothing changed) if it is not among them.
    pub(crate) fn remove_child(
        &self,
        hash: u64,
        guard: &Guard,
        retired: &mut Retired,
    ) -> Result<bool, NotAChild> {
        let parent = self.parent.parent;
        if let Some(next) = parent.children_ref(guard).remove(hash, self.child)? {
            publish_children(parent, next, guard, retired);
        }
        Ok(parent.children_ref(guard).is_empty())
    }

    /// Marks the child unlinked.
    pub(crate) fn mark_child_unlinked(&self) {
        self.child.obsolete.store(true, Ordering::SeqCst);
    }
}

/// Publishes `children` as `node`'s, retiring the old ones (the caller
/// holds `node`'s lock through a guard).
fn publish_children(node: &Node, children: NodeChildren, guard: &Guard, retired: &mut Retired) {
    let new = if children.is_empty() {
        Shared::null()
    } else {
        Owned::new(children).into_shared(guard)
    };
    let old = node.children.swap(new, Ordering::SeqCst, guard);
    // SAFETY: `old` was `node`'s children, loaded under `guard`: alive
    // until the guard drops (retired through the reclaimer at the earliest).
    if let Some(c) = unsafe { old.as_ref() } {
        // SAFETY: `old` was published from an `Owned` (above, or by an
        // earlier call), is unreachable since the swap, made under `node`'s
        // lock, and only this swap retires it.
        c.retire_replaced(|| unsafe { retired.owned(old) });
    }
}

/// The protecting step `root_obsolete_check` (model
/// `namespace_root_reclaimed_vs_insert`): whether `parent` is gone for a
/// change below it, read under its lock. An obsolete parent was unlinked,
/// or is a reclaimed namespace root: nothing may hang below it. Its control
/// lets a reclaimed root pass (an obsolete root has no child, so only an
/// attach can get past this).
fn root_obsolete_check(parent: &Node) -> bool {
    if crate::negative::removed("root_obsolete_check") {
        return parent.is_obsolete() && !parent.is_root;
    }
    parent.is_obsolete()
}

/// The protecting step `unlink_check` (model `unlink_vs_adopting_insert`):
/// a node is made resident only if it is still linked below the parent
/// the caller found it under, checked under both locks (an unlinked node's
/// values would be lost with it). Its control skips the check.
fn unlink_check(parent: &Node, child: &Node, guard: &Guard) -> bool {
    if crate::negative::removed("unlink_check") {
        return true;
    }
    !child.is_obsolete() && child.image_ref(guard).parent.is(parent)
}

/// The protecting step `split_recheck` (model `split_vs_evict`): a split
/// changes only the image the caller computed from, of a node still
/// linked, checked under both locks (eviction changes both under the same
/// two). Its control skips the check.
fn split_recheck(child: &Node, seen: Shared<'_, NodeImage>, guard: &Guard) -> bool {
    if crate::negative::removed("split_recheck") {
        return true;
    }
    !child.is_obsolete() && child.image(guard) == seen
}

/// The protecting step `parent_lock` (model `two_tiers_evict_below_one_parent`):
/// an eviction takes its leaf's parent's lock, as every change of a
/// node's children array and per-tier child counts does. Its control takes
/// a lock of its own that nobody else takes (a fresh mutex, leaked: loom
/// builds only), so the parent is changed unlocked.
fn parent_lock(parent: &Node) -> MutexGuard<'_, ()> {
    if crate::negative::removed("parent_lock") {
        return lock(Box::leak(Box::new(Mutex::new(()))));
    }
    lock(&parent.lock)
}

/// The protecting step `defer_destroy` (model
/// `replaced_image_outlives_its_reader`): a replaced image is unreachable
/// from now on, but readers that loaded it hold guards, so it is retired
/// and freed only after they are all gone. Its control frees it at once,
/// which the loom probe of live images reports.
fn defer_destroy(old: Shared<'_, NodeImage>, retired: &mut Retired) {
    if crate::negative::removed("defer_destroy") {
        // SAFETY: deliberately unsound, in the negative control only (loom
        // builds): the image is freed while a reader may hold it, which the
        // model must catch before the reader reads it.
        drop(unsafe { old.into_owned() });
        return;
    }
    // SAFETY: `old` was published from an `Owned` (`boxed`), is
    // unreachable since the swap, made under the node's lock, and only
    // this swap retires it.
    unsafe { retired.owned(old) };
}
