//! The two ways an insert makes tokens resident on a tier: attaching a new
//! leaf below a resident parent (under the parent's lock), or adopting the
//! caller's values into an existing node that is not resident there
//! (under the node's and its parent's locks).
//!
//! The protecting steps here: [`attach_recheck`] (no second child with the
//! same first page), [`born_pinned`] (a pinned insert's leaf is never
//! evictable before its pin) and [`event_in_lock`] (the store is reported
//! before anyone can see the leaf). Adoption's re-check is `unlink_check`
//! (in `protocol::lock`).

use crate::sync::Ordering;
use crate::tree::node::NodeParts;
use crate::tree::node::{depth_u32, page_hash, Children, DeviceValues, ImageParts, Link, Node};
use crate::tree::node::{ParentPtr, Values};
use crate::tree::protocol::lock::{Expect, Locking, ParentLocked};
use crate::tree::protocol::pin::HeldPin;
use crate::tree::protocol::reclaim::Retired;
use crate::tree::state::{Conflict, StoreAt, Tree};
use crossbeam_epoch::Guard;

/// Whom a change is made for: the tier whose residency it adds, the
/// priority it raises nodes to, whether it pins what it makes resident (a
/// request's insert), and, when inserts count hits, from which end offset
/// on (`count_from`: a node whose key ends past it gets a hit, once per
/// insert).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Writer {
    pub(crate) tier: usize,
    pub(crate) priority: i64,
    pub(crate) pin: bool,
    pub(crate) count_from: Option<usize>,
}

/// A new leaf to attach below `parent`: the tokens `at` names, with
/// `values`.
#[derive(Debug)]
pub(crate) struct Attach<'a, 'g> {
    pub(crate) parent: &'g Node,
    pub(crate) at: StoreAt<'a>,
    pub(crate) values: &'a [u32],
    pub(crate) writer: Writer,
}

/// Values to adopt into `node` (a child of `parent` that is not resident
/// on the writer's tier), whose tokens `at` names.
#[derive(Debug)]
pub(crate) struct Adopt<'a, 'g> {
    pub(crate) parent: &'g Node,
    pub(crate) node: &'g Node,
    pub(crate) at: StoreAt<'a>,
    pub(crate) values: &'a [u32],
    pub(crate) writer: Writer,
}

impl Tree {
    /// Attaches the leaf `a` asks for; with a pin, returns it.
    pub(crate) fn attach_leaf<'g>(
        &self,
        a: Attach<'_, 'g>,
        guard: &'g Guard,
    ) -> Result<(&'g Node, Option<HeldPin<'g>>), Conflict> {
        let ps = self.page_size();
        let t = a.writer.tier;
        let tokens = a.at.tokens();
        let hash = page_hash(&tokens[..ps]);
        // The leaf is built before the parent's lock is taken (its key copy
        // and allocations are most of an attach), so that the locked section
        // is short: a writer waiting for it spins instead of sleeping. Until
        // it is published it is this thread's alone; on a conflict it is
        // dropped unpublished.
        let leaf = Node::new(NodeParts {
            id: self.new_id(t),
            is_root: false,
            tiers: self.tiers(),
            image: ImageParts {
                parent: ParentPtr::to(a.parent),
                key: tokens,
                values: DeviceValues::one(t, Values::new(a.values, ps)),
            },
            children: Children::default(),
            priority: a.writer.priority,
            deepest: depth_u32(a.at.path.len()),
        });
        leaf.slot(t)
            .last_access
            .store(self.tick(t), Ordering::Relaxed);
        leaf.slot(t).created.store(self.tick(t), Ordering::Relaxed);
        let depth = a.at.path.len();
        if a.writer.count_from.is_some_and(|from| depth > from) {
            // Relaxed: not published yet (the publication orders it).
            leaf.slot(t).hits.store(1, Ordering::Relaxed);
        }
        born_pinned(leaf, a.writer, depth, |leaf| {
            self.publish_leaf(&a, leaf, hash, guard)
        })
    }

    /// Links `leaf` below `a.parent` under the parent's lock, once the
    /// parent is still resident on the writer's tier (the inserter's half
    /// of what `leaf_check` protects, which has no control of its own: the
    /// model's control removes the evictor's half; for a namespace root,
    /// `root_obsolete_check`) and no other child starts with its page.
    fn publish_leaf<'g>(
        &self,
        a: &Attach<'_, 'g>,
        leaf: Node,
        hash: u64,
        guard: &'g Guard,
    ) -> Result<&'g Node, Conflict> {
        let t = a.writer.tier;
        let locked = ParentLocked::lock(a.parent, Some(t), Locking::Wait).map_err(|_| Conflict)?;
        if attach_recheck(a.parent, a.at.tokens(), hash, self.page_size(), guard) {
            return Err(Conflict);
        }
        crate::pause::at(crate::pause::Point::Attach);
        let (id, parent_id) = (leaf.id, a.parent.id);
        let leaf = event_in_lock(
            || self.report_stored(t, a.at, id, parent_id),
            || {
                let leaf = Link::new(leaf);
                let mut retired = Retired::default();
                locked.add_child(hash, leaf, guard, &mut retired);
                a.parent
                    .slot(t)
                    .resident_children
                    .fetch_add(1, Ordering::SeqCst);
                // The rest needs no lock.
                drop(locked);
                self.retire(retired, guard);
                self.count_tokens(t, a.at.tokens().len(), true);
                self.count_node(t, true);
                // SAFETY: just linked under `guard`.
                let leaf = unsafe { leaf.node_in(guard) };
                if self.tracks_depths() {
                    self.raise_ancestors(a.parent, depth_u32(a.at.path.len()), guard);
                }
                self.note_leaf(leaf, t);
                leaf
            },
        );
        Ok(leaf)
    }

    /// Makes `a.node` resident on the writer's tier with `a.values`; with a
    /// pin, returns it (taken under the node's lock: no eviction can come
    /// between).
    pub(crate) fn adopt<'g>(
        &self,
        a: Adopt<'_, 'g>,
        guard: &'g Guard,
    ) -> Result<Option<HeldPin<'g>>, Conflict> {
        let t = a.writer.tier;
        let locked = ParentLocked::lock(a.parent, Some(t), Locking::Wait)
            .and_then(|l| l.lock_child(a.node, Expect::Linked, Locking::Wait, guard))
            .map_err(|_| Conflict)?;
        let img = a.node.image_ref(guard);
        if !img.parent.is(a.parent) || img.key.len() != a.values.len() || img.values.is_present(t) {
            return Err(Conflict);
        }
        let values = img.values.with(t, Values::new(a.values, self.page_size()));
        crate::pause::at(crate::pause::Point::Adopt);
        let mut retired = Retired::default();
        locked.publish_child_image(
            ImageParts {
                parent: img.parent,
                key: &img.key,
                values,
            },
            guard,
            &mut retired,
        );
        self.retire(retired, guard);
        // Under both locks, before the node is resident (see crate::events).
        self.report_stored(t, a.at, a.node.id, a.parent.id);
        // Values are published before RESIDENT is set, so a pinned reader
        // always finds them.
        let slot = a.node.slot(t);
        slot.residency.make_resident();
        let pin = a.writer.pin.then(|| {
            // Under the node's lock: no eviction can come between, and a
            // node just made resident has room for a pin.
            let _ = slot.residency.try_pin(None);
            // SAFETY: the pin just taken, released only by this.
            unsafe { HeldPin::new(a.node, t, a.at.path.len()) }
        });
        slot.last_access.store(self.tick(t), Ordering::Relaxed);
        slot.created.store(self.tick(t), Ordering::Relaxed);
        a.node.raise_priority(a.writer.priority);
        a.parent
            .slot(t)
            .resident_children
            .fetch_add(1, Ordering::SeqCst);
        self.count_tokens(t, a.values.len(), true);
        self.note_leaf(a.node, t);
        Ok(pin)
    }
}

/// The protecting step `attach_recheck` (models
/// `two_inserts_of_one_new_prefix`, `two_inserts_below_a_table_that_grows`):
/// under the parent's lock, whether another insert attached a child with
/// the same first page meanwhile (then this one re-walks and finds it).
/// Its control never finds one.
fn attach_recheck(parent: &Node, tokens: &[u32], hash: u64, ps: usize, guard: &Guard) -> bool {
    if crate::negative::removed("attach_recheck") {
        return false;
    }
    parent
        .children_ref(guard)
        .with_hash(hash)
        .any(|c| c.image_ref(guard).key[..ps] == tokens[..ps])
}

/// The protecting step `born_pinned` (model `pinned_insert_vs_evict`): a
/// pinned insert's new leaf is pinned before `publish` links it, so there
/// is no moment in which it is evictable; returns the pin (with `pin`).
/// Its control pins the leaf only after it is published, and holds no pin
/// if the leaf was evicted in between.
fn born_pinned<'g>(
    leaf: Node,
    w: Writer,
    depth: usize,
    publish: impl FnOnce(Node) -> Result<&'g Node, Conflict>,
) -> Result<(&'g Node, Option<HeldPin<'g>>), Conflict> {
    let t = w.tier;
    if crate::negative::removed("born_pinned") {
        let n = publish(leaf)?;
        let held = w.pin && n.slot(t).residency.try_pin(None).is_ok();
        // SAFETY: the pin just taken, released only by this.
        return Ok((n, held.then(|| unsafe { HeldPin::new(n, t, depth) })));
    }
    if w.pin {
        let _ = leaf.slot(t).residency.try_pin(None);
    }
    let n = publish(leaf)?;
    // SAFETY: the leaf was born with the pin (above), released only by this.
    Ok((n, w.pin.then(|| unsafe { HeldPin::new(n, t, depth) })))
}

/// The protecting step `event_in_lock` (model `store_event_vs_evict`): the
/// store is reported to the listener (`report`) under the parent's lock,
/// before the leaf is published (`change`, which publishes and then
/// releases the lock), so nobody can evict (or extend) it before. Its
/// control reports once the attach is done, after the lock.
fn event_in_lock<R>(report: impl FnOnce(), change: impl FnOnce() -> R) -> R {
    if crate::negative::removed("event_in_lock") {
        let r = change();
        report();
        return r;
    }
    report();
    change()
}
