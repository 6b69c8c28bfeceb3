//! [`Tree`]: the state every operation shares — the namespace table of
//! roots, the per-tier clocks, counters and leaf inboxes, the reclaimer,
//! and the residency listener — and the small steps every operation
//! takes on it (ids, node counts, leaf notes, listener reports). The
//! operations themselves are in `ops/`.
//!
//! | atomic | ordering | why |
//! | --- | --- | --- |
//! | `TierCounters::ids` | Relaxed | ids only need to be unique, which any RMW on one word gives |
//! | `TierCounters::live`, `resident_tokens` | SeqCst | gauges, exact in quiescent state, read by the audit and `resident_tokens`; they order nothing else, and were not measured to pay at a weaker ordering (each is on its tier's own line) |

use crate::sync::{Arc, AtomicBool, AtomicU64, Ordering};
use crate::tree::clock::Clock;
use crate::tree::namespaces::{self, Namespaces};
use crate::tree::node::{arc_of, DeviceValues, Node, NodeImage, NodeLink, NodeParts};
use crate::tree::node::{Children, ImageParts, ParentPtr};
use crate::tree::protocol::inbox::{LeafInbox, LeafNote};
use crate::tree::protocol::reclaim::{Reclaimer, Retired};
use crossbeam_epoch::{Guard, Shared};
use crossbeam_utils::CachePadded;

/// A transaction found the tree changed under it; the caller re-walks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Conflict;

/// The tree.
#[derive(Debug)]
pub(crate) struct Tree {
    page_size: usize,
    /// Residency slots: the devices, then the host tier if any.
    tiers: usize,
    /// The devices among them (`tiers - 1` with a host tier).
    devices: usize,
    pub(crate) roots: Namespaces,
    clock: Clock,
    /// Per tier, on lines of their own: node ids and live-node counts.
    /// Shared counters were written by every insert, and on the same line
    /// as the fields above that every operation reads.
    counters: Box<[CachePadded<TierCounters>]>,
    resident_tokens: Box<[CachePadded<AtomicU64>]>,
    pub(crate) reclaimer: Arc<Reclaimer>,
    /// Per tier, nodes that may have become leaves (eviction candidates)
    /// since the evictor last looked (`protocol::inbox`).
    inbox: Box<[LeafInbox]>,
    /// Told about every residency change (crate::events), if installed.
    listener: Option<crate::events::Listener>,
    /// Whether a match counts a hit on every node it consumes or ends on
    /// (otherwise inserts count them: `Writer::count_from`).
    hits_on_match: bool,
    /// Whether changes note new leaves in the inboxes (off: eviction ranks
    /// by a scan, and nothing is noted).
    notes_leaves: bool,
    /// Whether linking a node raises its ancestors' `deepest` (tlru's
    /// bookkeeping: `ops::depth`). Only ever turned on.
    pub(crate) tracks_depths: AtomicBool,
}

/// Where a store happens, for the listener: the namespace and the path of
/// the changed node, whose pages start at `start`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct StoreAt<'a> {
    /// The namespace.
    pub(crate) ns: Option<&'a str>,
    /// Root → the end of the changed node.
    pub(crate) path: &'a [u32],
    /// Where the changed node's tokens start in `path`.
    pub(crate) start: usize,
}

impl<'a> StoreAt<'a> {
    /// The changed node's tokens.
    pub(crate) fn tokens(&self) -> &'a [u32] {
        &self.path[self.start..]
    }
}

/// One tier's share of the tree's counters.
#[derive(Debug, Default)]
struct TierCounters {
    /// Ids handed out by changes made for this tier (see `Tree::new_id`).
    ids: AtomicU64,
    /// Nodes linked minus nodes unlinked by changes made for this tier:
    /// wrapping, since a node linked for one tier may be unlinked for
    /// another; the sum over tiers is the live-node count.
    live: AtomicU64,
}

impl Tree {
    /// A tree of `tiers` residency slots, the first `devices` of them
    /// devices and the one after them, if any, the host tier.
    pub(crate) fn new(
        page_size: usize,
        (tiers, devices): (usize, usize),
        clock: Clock,
        listener: Option<crate::events::Listener>,
        (hits_on_match, notes_leaves): (bool, bool),
    ) -> Self {
        debug_assert!(devices <= tiers && tiers <= devices + 1);
        Tree {
            page_size,
            tiers,
            devices,
            roots: Namespaces::default(),
            clock,
            counters: (0..tiers)
                .map(|_| CachePadded::new(TierCounters::default()))
                .collect(),
            resident_tokens: (0..tiers)
                .map(|_| CachePadded::new(AtomicU64::new(0)))
                .collect(),
            reclaimer: Arc::new(Reclaimer::default()),
            inbox: (0..tiers).map(|_| LeafInbox::default()).collect(),
            listener,
            hits_on_match,
            notes_leaves,
            tracks_depths: AtomicBool::new(false),
        }
    }

    /// Whether changes note new leaves (see the field).
    pub(crate) fn notes_leaves(&self) -> bool {
        self.notes_leaves
    }

    /// Whether matches count hits (see the field).
    pub(crate) fn hits_on_match(&self) -> bool {
        self.hits_on_match
    }

    /// Tokens per page.
    pub(crate) fn page_size(&self) -> usize {
        self.page_size
    }

    /// Residency slots: the devices, then the host tier if any.
    pub(crate) fn tiers(&self) -> usize {
        self.tiers
    }

    /// The devices (GPUs) among the tiers.
    pub(crate) fn devices(&self) -> usize {
        self.devices
    }

    /// The host tier's slot, if there is one.
    pub(crate) fn host(&self) -> Option<usize> {
        (self.tiers > self.devices).then_some(self.devices)
    }

    /// A new stamp on tier `t`'s clock.
    pub(crate) fn tick(&self, t: usize) -> u64 {
        self.clock.tick(t)
    }

    /// A new node id, from tier `t`'s share: the `n`-th id of tier `t` is
    /// `n * tiers + t + 1`, so ids are unique across tiers and, per tier,
    /// increase in creation order (with one tier: 1, 2, 3, ...).
    pub(crate) fn new_id(&self, t: usize) -> u64 {
        // Relaxed suffices: ids only need uniqueness, which any RMW gives.
        let n = self.counters[t].ids.fetch_add(1, Ordering::Relaxed);
        n * self.tiers as u64 + t as u64 + 1
    }

    /// Counts a node linked (or, with `linked` false, unlinked) by a
    /// change made for tier `t`.
    pub(crate) fn count_node(&self, t: usize, linked: bool) {
        let live = &self.counters[t].live;
        if linked {
            live.fetch_add(1, Ordering::SeqCst);
        } else {
            live.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Adds `tokens` to (or, with `gained` false, takes them from) tier
    /// `t`'s resident-token gauge.
    pub(crate) fn count_tokens(&self, t: usize, tokens: usize, gained: bool) {
        let g = &self.resident_tokens[t];
        if gained {
            g.fetch_add(tokens as u64, Ordering::SeqCst);
        } else {
            g.fetch_sub(tokens as u64, Ordering::SeqCst);
        }
    }

    /// Records that `n` may now be a leaf on `t`.
    pub(crate) fn note_leaf(&self, n: &Node, t: usize) {
        if !self.notes_leaves {
            return;
        }
        // Relaxed: advisory ranking statistics (see `Node::stamp`); the
        // heap re-reads them from the node before it evicts.
        let note = LeafNote {
            // SAFETY: callers pass nodes they just linked or changed under
            // their guard: tree nodes, alive for this call.
            node: unsafe { arc_of(n) },
            last_access: n.slot(t).last_access.load(Ordering::Relaxed),
        };
        self.inbox[t].push(note);
    }

    /// How many nodes were noted on `t` since the last drain (a hint for
    /// sizing: more may be noted while it is read).
    pub(crate) fn noted_leaves(&self, t: usize) -> usize {
        self.inbox[t].len()
    }

    /// Hands every node noted since the last call to `f`.
    pub(crate) fn drain_leaves(&self, t: usize, mut f: impl FnMut(LeafNote)) {
        while let Some(n) = self.inbox[t].pop() {
            f(n);
        }
    }

    /// Hands what a change unlinked to the reclaimer.
    pub(crate) fn retire(&self, retired: Retired, guard: &Guard) {
        self.reclaimer.retire(retired, guard);
    }

    /// Frees unlinked objects whose grace period has passed, and starts the
    /// grace period of those still staged (the evictor calls this; see
    /// `protocol::reclaim`).
    pub(crate) fn reclaim(&self) {
        self.reclaimer.flush_staged();
        self.reclaimer.reclaim();
    }

    /// [`reclaim`](Self::reclaim), first letting the epoch advance so that
    /// recent retirements are handed over too (never waits for a reader).
    pub(crate) fn reclaim_all(&self) {
        self.reclaimer.reclaim_all();
    }

    /// Non-root nodes in the tree (exact in quiescent state).
    pub(crate) fn node_count(&self) -> u64 {
        self.counters
            .iter()
            .fold(0u64, |n, c| n.wrapping_add(c.live.load(Ordering::SeqCst)))
    }

    /// Tokens resident on `t` (exact in quiescent state).
    pub(crate) fn resident_tokens(&self, t: usize) -> u64 {
        self.resident_tokens[t].load(Ordering::SeqCst)
    }

    /// The root of namespace `ns`, if it has one.
    pub(crate) fn find_root<'g>(&self, ns: Option<&str>, guard: &'g Guard) -> Option<&'g Node> {
        self.roots.find(ns, guard)
    }

    /// The root of namespace `ns`, created if it has none.
    pub(crate) fn root_or_create<'g>(&self, ns: Option<&str>, guard: &'g Guard) -> &'g Node {
        let mut retired = Retired::default();
        let root = self.roots.get_or_create(
            ns,
            || {
                Node::new(NodeParts {
                    id: self.new_id(0),
                    is_root: true,
                    tiers: self.tiers,
                    image: ImageParts {
                        parent: ParentPtr::none(),
                        key: &namespaces::key_of(ns),
                        values: DeviceValues::none(),
                    },
                    children: Children::default(),
                    priority: 0,
                    deepest: 0,
                })
            },
            guard,
            &mut retired,
        );
        self.retire(retired, guard);
        root
    }

    /// Tells the listener that `node`'s pages left `t` (`parent` is its
    /// parent, locked with it). The path is built only if it asks.
    pub(crate) fn report_removed(&self, node: &Node, parent: &Node, t: usize, guard: &Guard) {
        let Some(l) = &self.listener else {
            return;
        };
        let climb = || self.path_of(node, guard);
        let e = crate::events::PageEvent::new(
            self.tier_of(t),
            (node.id, parent.id, parent.is_root),
            &node.image_ref(guard).key,
            crate::events::Locate::Climb(&climb),
        );
        l.0.removed(&e);
    }

    /// Tells the listener that `at`'s pages became resident on `t`. Called
    /// inside the locked section of the change, before the node is
    /// published (or while it is locked): see crate::events for the order
    /// this gives.
    pub(crate) fn report_stored(&self, t: usize, at: StoreAt<'_>, node: u64, parent: u64) {
        if let Some(l) = &self.listener {
            l.0.stored(&crate::events::PageEvent::new(
                self.tier_of(t),
                (node, parent, at.start == 0),
                at.tokens(),
                crate::events::Locate::Known {
                    namespace: at.ns,
                    path: at.path,
                },
            ));
        }
    }

    /// Tells the listener, for every tier holding `img` (the split node's
    /// image), that node `node`'s first `moved` tokens became node
    /// `prefix`. Called under the split's locks.
    pub(crate) fn report_split(&self, img: &NodeImage, node: u64, prefix: u64, moved: usize) {
        if let Some(l) = &self.listener {
            for (t, _) in img.values.iter() {
                l.0.split(&crate::events::SplitEvent {
                    tier: self.tier_of(t),
                    node,
                    prefix,
                    moved,
                });
            }
        }
    }

    /// The public name of tier slot `t`.
    pub(crate) fn tier_of(&self, t: usize) -> crate::Tier {
        if self.host() == Some(t) {
            crate::Tier::Host
        } else {
            crate::Tier::Device(crate::DeviceId(t as u32))
        }
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        // `&mut self`: no change can follow, so this is the listener's last call.
        if let Some(l) = &self.listener {
            l.0.cleared();
        }
        self.reclaimer.reclaim();
        // Tear down iteratively: a recursive drop of a deep chain would
        // overflow the stack. `&mut self`: no reader can traverse this tree
        // any more.
        let mut stack: Vec<NodeLink> = Vec::new();
        for root in self.roots.take_all() {
            stack.extend(detach_children(&root));
        }
        while let Some(n) = stack.pop() {
            // SAFETY: teardown with exclusive access (`&mut self`); `n` is
            // released only below, after its children are taken.
            let node = unsafe { n.node_unchecked() };
            stack.extend(detach_children(node));
            // SAFETY: each linked node appears in exactly one current array,
            // so this releases the tree's one reference exactly once; no
            // reader exists (`&mut self`). A handle or lease may keep the
            // node itself alive, without children.
            unsafe { n.release() };
        }
    }
}

/// Takes a node's children out during teardown.
fn detach_children(n: &Node) -> Vec<NodeLink> {
    // SAFETY: only called from `Tree::drop`, which has exclusive access to
    // the tree: no reader can be traversing it, and leases and handles never
    // read children arrays, so the old array is ours alone.
    let guard = unsafe { crossbeam_epoch::unprotected() };
    let old = n.children.swap(Shared::null(), Ordering::Relaxed, guard);
    if old.is_null() {
        return Vec::new();
    }
    // SAFETY: as above; checked non-null.
    unsafe { old.into_owned() }.into_box().into_links()
}
