//! The concurrent radix tree: nodes, per-device residency, splits, and
//! epoch-based reclamation. The public face is [`crate::cache::RadixCache`];
//! this module holds the protocol.
//!
//! # Shape
//!
//! ```text
//!  namespace table ──► root(ns=None) ──► [1 2 3] ──► [4 5]   (resident d0,d1)
//!                  └─► root(ns="s")  └─► [9]     └─► [6 7]   (resident d0)
//! ```
//!
//! One root per namespace (different namespaces share no node). A node's key
//! is a page-aligned run of tokens; children are keyed by their first page.
//! Per device, a node either holds the values of all its tokens or none
//! (residency), and residency is prefix-closed per device (I1).
//!
//! # Readers (`peek`, `match` without a split)
//!
//! Readers hold an epoch guard and take no lock. From a node `cur` they load
//! `cur.children`, find the child by page, and load the child's [`node::Image`]
//! (parent, key and values in one immutable object). If the image's parent is
//! not `cur`, a split has just put a new node between them (and may not
//! have published `cur`'s new children yet): the reader climbs the parent
//! links to the node now hanging below `cur` and goes on from there, never
//! waiting for the splitter (race 4, [`climb_to`]). Values are only read
//! *after* a pin on the end node succeeded, walking the images up to the
//! root (race 8). A match that must split takes the two locks only if they
//! are free ([`Locking::Try`]); otherwise it reports the prefix it has.
//!
//! # Writers
//!
//! Each structural change is a short transaction under the write locks of
//! the node it changes and its parent (parent first, so no deadlock: a
//! split only ever inserts nodes *between* a parent and a child, so the
//! ancestor order of any two nodes never flips). The transaction re-checks
//! what it relied on (image unchanged, parent still the parent, nodes not
//! unlinked, parent resident) and reports a conflict otherwise; the caller
//! re-walks. Locking and those checks are one guard type,
//! [`node::Locked`]: its constructors take the locks and validate, and
//! images and children arrays can be published only through it. Pins an
//! insert holds are [`HeldPin`]s, released on drop (a panic included). Residency is added with the parent's lock held and only when
//! the parent is resident on that device; it is removed only when no child
//! is resident on that device, a count changed only under the node's lock
//! (race 2, race 6); splits and evictions of a node take the same two
//! locks (race 9). Pins are lock-free CASes on the state word that eviction
//! CASes too (race 1; see [`residency`]).
//!
//! # Reclamation
//!
//! The tree holds one strong reference (`Arc`) to each linked node, named
//! by its parent's children (arrays and tables hold plain addresses);
//! parent links are raw pointers. An unlinked node's reference, replaced
//! images, arrays and tables are retired through the epoch (`reclaim`), so
//! a reader that reached a node under its guard keeps that node (and,
//! transitively, its parent at that moment) alive until the guard drops
//! (race 7). Handles and leases
//! hold an `Arc` to their node but never follow its parent pointer unless a
//! pin proves the node is still linked.

mod audit;
pub(crate) mod children;
pub(crate) mod clock;
pub(crate) mod namespaces;
pub(crate) mod node;
pub(crate) mod reclaim;
pub(crate) mod residency;
pub(crate) mod values;

use crate::sync::{spin_wait, Arc, AtomicU64, Ordering};
use clock::Clock;
use crossbeam_epoch::{Guard, Shared};

/// A node that may have become a leaf on a device, with its last access
/// there as it was when it was noted (it was just linked or made resident
/// then, so reading it cost nothing): enough for the candidate heap to file
/// it under a lower bound of its key without visiting the node (see
/// `EvictionPolicy::lower_bound`). The heap
/// re-validates each entry against the node when it is popped, and the
/// policies that use the heap only ever rank a node later as time passes
/// (`EvictionPolicy::keys_only_grow`), so a key that is low only means an
/// early, re-checked pop.
#[derive(Debug)]
pub(crate) struct LeafNote {
    /// The node.
    pub(crate) node: Arc<Node>,
    /// Its last access on the device.
    pub(crate) last_access: u64,
}

/// A per-device inbox of nodes that may have become leaves: lock-free
/// (crossbeam's `SegQueue`) normally; under loom a shim mutex, because loom
/// cannot see the queue's own synchronization (as with arc-swap, BUILD.md).
#[derive(Debug, Default)]
pub(crate) struct LeafInbox {
    #[cfg(not(loom))]
    q: crossbeam_queue::SegQueue<LeafNote>,
    #[cfg(loom)]
    q: crate::sync::Mutex<Vec<LeafNote>>,
}

impl LeafInbox {
    fn push(&self, n: LeafNote) {
        #[cfg(not(loom))]
        self.q.push(n);
        #[cfg(loom)]
        crate::sync::lock(&self.q).push(n);
    }

    fn pop(&self) -> Option<LeafNote> {
        #[cfg(not(loom))]
        return self.q.pop();
        #[cfg(loom)]
        return crate::sync::lock(&self.q).pop();
    }

    /// Notes waiting (a hint: pushes may come meanwhile).
    fn len(&self) -> usize {
        #[cfg(not(loom))]
        return self.q.len();
        #[cfg(loom)]
        return crate::sync::lock(&self.q).len();
    }
}
use children::{page_hash, Children};
use crossbeam_utils::CachePadded;
use node::{Expect, Image, ImageParts, LockFailed, Locked, Locking, Node, NodePtr, ParentPtr};
use reclaim::{Reclaimer, Retired};
use std::ops::Range;
use values::{DeviceValues, Values};

/// Inserts free retired objects themselves once this many are waiting
/// (normally the evictor does, so that matches never pay for it)...
const RECLAIM_AT: usize = 1024;
/// ...a small share each ([`Reclaimer::reclaim_some`]): an insert retires
/// about one object (its parent's old children array, when flat), so
/// freeing twice that per insert drains the backlog, and spreads the work
/// evenly: no insert pays for thousands (a millisecond outlier) or even for
/// dozens (a step in the insert's p99).
const RECLAIM_STEP: usize = 4;

/// A transaction found the tree changed under it; the caller re-walks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Conflict;

/// The end node of a walk.
#[derive(Clone, Copy, Debug)]
pub(crate) enum End<'g> {
    /// The namespace root (nothing matched).
    Root,
    /// A node.
    Node(&'g Node),
}

/// What a match walk found.
#[derive(Debug)]
pub(crate) struct MatchWalk<'g> {
    pub(crate) end: End<'g>,
    /// Tokens resident on the asked device.
    pub(crate) len: usize,
    /// Residency generation of `end` on the asked device, as seen.
    pub(crate) generation: u64,
    /// Longest prefix resident on any device, and that device.
    pub(crate) any_len: usize,
    pub(crate) any_device: Option<usize>,
    /// Longest prefix resident on the host tier (0 without one).
    pub(crate) host_len: usize,
    /// Hits on the asked device of the node the match ended on, this one
    /// included (0 for an empty match).
    pub(crate) hits: u64,
}

/// What an insert did.
#[derive(Debug)]
pub(crate) struct InsertWalk<'g> {
    /// Ranges of the caller's values that the tree now owns.
    pub(crate) adopted: Vec<Range<usize>>,
    /// With `pin`: the deepest node of the key the insert holds a pin on
    /// (for the caller's lease), and the tokens root → it covers.
    pub(crate) pinned: Option<(&'g Node, usize)>,
}

/// A leaf evicted from one device.
#[derive(Debug)]
pub(crate) struct EvictedLeaf<'g> {
    pub(crate) values: Values,
    pub(crate) parent: &'g Node,
}

/// Per-device figures from a scan.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Scan {
    pub(crate) total: usize,
    pub(crate) protected: usize,
    pub(crate) nodes: usize,
    pub(crate) pins: u64,
}

enum Step<'g> {
    None,
    Found(&'g Node, Shared<'g, Image>, usize),
}

/// Splits can put nodes between a parent `cur` and a `child` a reader
/// found in `cur`'s children array (an array loaded before the split
/// published its successor). From `child`, follows image parent links up
/// to the node whose parent is `cur`, and returns it with its image: the
/// node a fresh read of `cur`'s children would have found. Each hop goes
/// one node closer to `cur`, and the nodes between were cut from `child`'s
/// key (every node holds at least one page), so the climb takes at most
/// as many hops as `child` had pages when the reader's array was current:
/// bounded, and never a wait for another thread.
///
/// Memory: every node on the way was linked at some moment after the
/// caller's guard was pinned (it was `child`'s or a climbed node's parent
/// in an image loaded under the guard, and a node is only unlinked after
/// its children are), so it is retired, if at all, after that pin, and
/// stays allocated while the guard lives.
///
/// `None` only if the links never reach `cur` (which the split protocol
/// rules out; a caller then treats the page as not found).
fn climb_to<'g>(
    cur: &Node,
    child: &'g Node,
    img: Shared<'g, Image>,
    guard: &'g Guard,
) -> Option<(&'g Node, Shared<'g, Image>)> {
    let (mut n, mut img) = (child, img);
    // A generous bound that the protocol never reaches (see above).
    for _ in 0..(1usize << 26) {
        // SAFETY: images are never null and are retired with defer_destroy;
        // `img` was loaded under `guard`.
        let parent = unsafe { img.deref() }.parent.0;
        if std::ptr::eq(parent, cur) {
            return Some((n, img));
        }
        if parent.is_null() {
            return None;
        }
        // SAFETY: `parent` was the parent in an image loaded under `guard`,
        // so it was linked after the guard was pinned and is not freed
        // before the guard drops (see above).
        n = unsafe { &*parent };
        img = n.image(guard);
        #[cfg(all(feature = "testing", not(loom)))]
        crate::pause::climbed();
    }
    debug_assert!(false, "a parent chain that never reaches the parent");
    None
}

/// Calls `visit` on the images of `end` and of its ancestors below the
/// root, `end`'s first, read under `guard` (from which `end` was reached),
/// and returns the root they lead to. `None` if `visit` says so, or if a
/// parent link is null before a root (a chain cut by an unlink).
fn climb_to_root<'g>(
    end: &'g Node,
    guard: &'g Guard,
    mut visit: impl FnMut(&'g Image) -> Option<()>,
) -> Option<&'g Node> {
    let mut n = end;
    while !n.is_root {
        let img = n.image_ref(guard);
        visit(img)?;
        if img.parent.0.is_null() {
            return None;
        }
        // SAFETY: `n` was reached under `guard`, so its image's parent was
        // linked during the guard's life and is not freed before it (see
        // `ParentPtr`).
        n = unsafe { &*img.parent.0 };
    }
    Some(n)
}

/// Asks the CPU to start loading `tokens` (a key about to be walked) into
/// the cache, so that reading it overlaps the walk's own chain of misses on
/// the tree instead of following it: a query's key usually comes from
/// memory the cache has not seen (a new request), and reading it once is
/// most of what a match costs (the peer bench's `floor-read-tokens`).
#[inline]
fn prefetch(tokens: &[u32]) {
    for line in tokens.chunks(16) {
        prefetch_line(line.as_ptr().cast());
    }
}

/// Asks the CPU to start loading the cache line at `p` (a hint: nothing
/// is read that the program sees; a no-op off x86-64 and under loom).
#[inline]
fn prefetch_line(p: *const u8) {
    #[cfg(all(target_arch = "x86_64", not(loom)))]
    // SAFETY: `_mm_prefetch` is a hint: it reads nothing the program sees
    // and never faults, whatever the address. SSE is part of the x86-64
    // baseline, so the instruction exists.
    unsafe {
        std::arch::x86_64::_mm_prefetch(p.cast::<i8>(), std::arch::x86_64::_MM_HINT_T0)
    };
    #[cfg(not(all(target_arch = "x86_64", not(loom))))]
    let _ = p;
}

/// Asks the CPU to start loading what validating and evicting the leaf `n`
/// on `d` reads first (a hint, for a candidate that is about to be taken):
/// the node's two lines and, with `deep`, its slot for `d` and the first
/// two lines of its image (the head, and the first page of the key that
/// files it in its parent). `deep` reads the node itself (the slot array's
/// and the image's addresses), so it is meant for a node whose lines were
/// asked for earlier. A no-op under loom, where the reads would add
/// scheduling points to the models for no behaviour.
#[inline]
pub(crate) fn prefetch_node(n: &Node, d: usize, deep: bool, guard: &Guard) {
    #[cfg(not(loom))]
    {
        let at = (n as *const Node).cast::<u8>();
        prefetch_line(at);
        prefetch_line(at.wrapping_add(64));
        if deep {
            prefetch_line((n.dev(d) as *const node::DevSlot).cast());
            // Relaxed: only the address is used, as a hint; a stale one
            // prefetches a line nobody reads, which is harmless.
            let img = node::image_addr(n.image.load(std::sync::atomic::Ordering::Relaxed, guard))
                as *const u8;
            prefetch_line(img);
            prefetch_line(img.wrapping_add(64));
        }
    }
    #[cfg(loom)]
    let _ = (n, d, deep, guard);
}

/// The tree.
#[derive(Debug)]
pub(crate) struct Tree {
    page_size: usize,
    /// Residency slots: the devices, then the host tier if any.
    devices: usize,
    /// The devices among them (`devices - 1` with a host tier).
    gpus: usize,
    roots: namespaces::Namespaces,
    clock: Clock,
    /// Per device, on lines of their own: node ids and live-node counts.
    /// Shared counters were written by every insert, and on the same line
    /// as the fields above that every operation reads (see `DevCounters`).
    counters: Box<[CachePadded<DevCounters>]>,
    resident_tokens: Box<[CachePadded<AtomicU64>]>,
    reclaimer: Arc<Reclaimer>,
    /// Per device, nodes that may have become leaves (eviction candidates)
    /// since the evictor last looked: pushed lock-free by inserts, drained
    /// by the evictor (into its heap, or dropped while the policy ranks by
    /// a scan). Always kept, so that a switch of policy at run time never
    /// races an insert over whether its leaf is noted.
    inbox: Box<[LeafInbox]>,
    /// Told about every residency change (crate::events), if installed.
    listener: Option<crate::events::Listener>,
}

/// Where a store happens, for the listener: the namespace and the path of
/// the changed node, whose pages start at `start`.
#[derive(Clone, Copy)]
struct StoreAt<'a> {
    ns: Option<&'a str>,
    path: &'a [u32],
    start: usize,
}

/// One device's share of the tree's counters.
#[derive(Debug, Default)]
struct DevCounters {
    /// Ids handed out by changes made for this device (see `Tree::new_id`).
    ids: AtomicU64,
    /// Nodes linked minus nodes unlinked by changes made for this device:
    /// wrapping, since a node linked for one device may be unlinked for
    /// another; the sum over devices is the live-node count.
    live: AtomicU64,
}

/// Length of the common prefix of `a` and `b` in whole pages.
pub(crate) fn common_prefix(a: &[u32], b: &[u32], page_size: usize) -> usize {
    const CHUNK: usize = 16;
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    // The usual answer (the whole overlap matches: a key that runs through
    // this node) costs one memcmp; only a mismatch is then located.
    if a == b {
        return n - n % page_size;
    }
    let mut i = 0;
    // Whole chunks compare as one memcmp.
    while i + CHUNK <= n && a[i..i + CHUNK] == b[i..i + CHUNK] {
        i += CHUNK;
    }
    while i < n && a[i] == b[i] {
        i += 1;
    }
    i - i % page_size
}

impl Tree {
    pub(crate) fn new(
        page_size: usize,
        devices: usize,
        gpus: usize,
        clock: Clock,
        listener: Option<crate::events::Listener>,
    ) -> Self {
        debug_assert!(gpus <= devices && devices <= gpus + 1);
        Tree {
            page_size,
            devices,
            gpus,
            roots: namespaces::Namespaces::default(),
            clock,
            counters: (0..devices)
                .map(|_| CachePadded::new(DevCounters::default()))
                .collect(),
            resident_tokens: (0..devices)
                .map(|_| CachePadded::new(AtomicU64::new(0)))
                .collect(),
            reclaimer: Arc::new(Reclaimer::default()),
            inbox: (0..devices).map(|_| LeafInbox::default()).collect(),
            listener,
        }
    }

    /// Tells `l` that `node`'s pages left `d` (`parent` is its parent,
    /// locked with it). The path is built only if the listener asks.
    fn report_removed(
        &self,
        l: &crate::events::Listener,
        node: &Node,
        parent: &Node,
        d: usize,
        guard: &Guard,
    ) {
        let climb = || self.path_of(node, guard);
        let e = crate::events::PageEvent::new(
            (crate::DeviceId(d as u32), self.host() == Some(d)),
            (node.id, parent.id, parent.is_root),
            &node.image_ref(guard).key,
            crate::events::Locate::Climb(&climb),
        );
        l.0.removed(&e);
    }

    /// Tells the listener that `at`'s pages became resident on `d`. Called
    /// inside the locked section of the change, before the node is
    /// published (or while it is locked): see crate::events for the order
    /// this gives.
    fn report_stored(&self, d: usize, at: StoreAt<'_>, node: u64, parent: u64) {
        if let Some(l) = &self.listener {
            l.0.stored(&crate::events::PageEvent::new(
                (crate::DeviceId(d as u32), self.host() == Some(d)),
                (node, parent, at.start == 0),
                &at.path[at.start..],
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
    fn report_split(&self, img: &Image, node: u64, prefix: u64, moved: usize) {
        if let Some(l) = &self.listener {
            for (e, _) in img.values.iter() {
                l.0.split(&crate::events::SplitEvent {
                    device: crate::DeviceId(e as u32),
                    host: self.host() == Some(e),
                    node,
                    prefix,
                    moved,
                });
            }
        }
    }

    pub(crate) fn page_size(&self) -> usize {
        self.page_size
    }

    pub(crate) fn devices(&self) -> usize {
        self.devices
    }

    pub(crate) fn gpus(&self) -> usize {
        self.gpus
    }

    /// The host tier's slot, if there is one.
    fn host(&self) -> Option<usize> {
        (self.devices > self.gpus).then_some(self.gpus)
    }

    pub(crate) fn tick(&self, d: usize) -> u64 {
        self.clock.tick(d)
    }

    /// A new node id, from device `d`'s share: the `n`-th id of device `d`
    /// is `n * devices + d + 1`, so ids are unique across devices and, per
    /// device, increase in creation order (with one device: 1, 2, 3, ...).
    fn new_id(&self, d: usize) -> u64 {
        // Relaxed suffices: ids only need uniqueness, which any RMW gives.
        let n = self.counters[d].ids.fetch_add(1, Ordering::Relaxed);
        n * self.devices as u64 + d as u64 + 1
    }

    fn count_node(&self, d: usize, linked: bool) {
        let live = &self.counters[d].live;
        if linked {
            live.fetch_add(1, Ordering::SeqCst);
        } else {
            live.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Records that `n` may now be a leaf on `d`.
    fn note_leaf(&self, n: &Node, d: usize) {
        let s = n.dev(d);
        // Relaxed: advisory ranking statistics (see `Node::stamp`); the
        // heap re-reads them from the node before it evicts.
        let note = LeafNote {
            // SAFETY: callers pass nodes they just linked or changed under
            // their guard: tree nodes, alive for this call.
            node: unsafe { node::arc_of(n) },
            last_access: s.last_access.load(Ordering::Relaxed),
        };
        self.inbox[d].push(note);
    }

    /// How many nodes were noted on `d` since the last drain (a hint for
    /// sizing: more may be noted while it is read).
    pub(crate) fn noted_leaves(&self, d: usize) -> usize {
        self.inbox[d].len()
    }

    /// Hands every node noted since the last call to `f`.
    pub(crate) fn drain_leaves(&self, d: usize, mut f: impl FnMut(LeafNote)) {
        while let Some(n) = self.inbox[d].pop() {
            f(n);
        }
    }

    /// Frees unlinked objects whose grace period has passed, and starts the
    /// grace period of those still staged (the evictor calls this; see
    /// [`reclaim`]).
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

    /// Tokens resident on `d` (exact in quiescent state).
    pub(crate) fn resident_tokens(&self, d: usize) -> u64 {
        self.resident_tokens[d].load(Ordering::SeqCst)
    }

    fn find_root<'g>(&self, ns: Option<&str>, guard: &'g Guard) -> Option<&'g Node> {
        self.roots.find(ns, guard)
    }

    fn root_or_create<'g>(&self, ns: Option<&str>, guard: &'g Guard) -> &'g Node {
        let mut retired = Retired::default();
        let root = self.roots.get_or_create(
            ns,
            || {
                Node::new(
                    self.new_id(0),
                    true,
                    self.devices,
                    ImageParts {
                        parent: ParentPtr(std::ptr::null()),
                        key: &namespaces::key_of(ns),
                        values: DeviceValues::none(),
                    },
                    Children::default(),
                    0,
                )
            },
            guard,
            &mut retired,
        );
        self.reclaimer.retire(retired, guard);
        root
    }

    fn step<'g>(&self, cur: &Node, rest: &[u32], guard: &'g Guard) -> Step<'g> {
        let ps = self.page_size;
        let page = &rest[..ps];
        for child in cur.children_ref(guard).with_hash(page_hash(page)) {
            let img = child.image(guard);
            if let Some(step) = self.step_into(cur, child, img, rest, guard) {
                return step;
            }
        }
        Step::None
    }

    /// Checks one candidate child of `cur` for `rest`; `None` if its first
    /// page is another one (a hash collision).
    fn step_into<'g>(
        &self,
        cur: &Node,
        child: &'g Node,
        img: Shared<'g, Image>,
        rest: &[u32],
        guard: &'g Guard,
    ) -> Option<Step<'g>> {
        // The protecting step of race 4: a child whose image names another
        // parent was just split (a node now sits between `cur` and it, and
        // `cur`'s new children may not be published yet: the splitter holds
        // `cur`'s lock). The reader never waits for that publication: it
        // climbs the child's parent links to the node that now hangs below
        // `cur` (the split's new prefix node, fully built before the child's
        // image named it) and compares against that node's key instead of
        // the child's shortened one.
        #[cfg(not(any(
            radixkv_negative = "reader_parent_check",
            radixkv_negative = "reader_waits"
        )))]
        let (child, img) = match climb_to(cur, child, img, guard) {
            Some(found) => found,
            None => return Some(Step::None),
        };
        // The control of the parked-writer test: the reader of old waited
        // for the splitter to publish `cur`'s children, then read again.
        #[cfg(radixkv_negative = "reader_waits")]
        // SAFETY: as below.
        if !std::ptr::eq(unsafe { img.deref() }.parent.0, cur) {
            let seen = cur.children.load(Ordering::SeqCst, guard);
            while cur.children.load(Ordering::SeqCst, guard) == seen {
                crate::sync::spin_wait();
            }
            return Some(self.step(cur, rest, guard));
        }
        // SAFETY: images are never null and are retired with defer_destroy;
        // `img` was loaded under `guard`.
        let r = unsafe { img.deref() };
        // Candidates share the hash (or, in a table, a 32-bit tag) of the
        // first page; the page itself decides.
        let ps = self.page_size;
        if r.key.get(..ps) != Some(&rest[..ps]) {
            return None;
        }
        Some(Step::Found(child, img, common_prefix(&r.key, rest, ps)))
    }

    /// The device to report for the any-device answer at `node` (devices
    /// only, not the host tier).
    fn best_device(&self, node: &Node, preferred: usize) -> Option<usize> {
        if preferred < self.gpus && node.resident(preferred) {
            return Some(preferred);
        }
        (0..self.gpus).find(|&e| node.resident(e))
    }

    /// Lengths resident on every device for `tokens`; writes nothing.
    pub(crate) fn peek(&self, ns: Option<&str>, tokens: &[u32], guard: &Guard) -> Vec<usize> {
        let mut out = vec![0; self.devices];
        let tokens = &tokens[..tokens.len() - tokens.len() % self.page_size];
        prefetch(tokens);
        let Some(mut cur) = self.find_root(ns, guard) else {
            return out;
        };
        let mut pos = 0;
        while pos < tokens.len() {
            let (child, img, k) = match self.step(cur, &tokens[pos..], guard) {
                Step::None => break,
                Step::Found(c, i, k) => (c, i, k),
            };
            // A reader may be preempted between loading an image and
            // reading it; loom preempts only at atomic operations, so the
            // model gets a scheduling point here (race 7: a replaced image
            // must outlive the reader that loaded it).
            #[cfg(loom)]
            {
                crate::sync::thread::yield_now();
                crate::sync::probe::assert_live(node::image_addr(img));
            }
            // SAFETY: loaded under `guard`, retired with defer_destroy.
            let r = unsafe { img.deref() };
            let mut any = false;
            // Prefix-closed residency: a device counts here only if it
            // covered everything before. Residency as the image has it (the
            // devices with values, published with it, walked in one line,
            // rather than one state word per device, each on a line of its
            // own): it agrees with the state words whenever no change of
            // this node is in flight, and during one it is either side of
            // the change, which a routing answer may be. A leaf that left
            // the tree keeps its last image: a reader that reached it
            // before it left counts it, as had it read a moment earlier.
            for (e, _) in r.values.iter() {
                if let Some(o) = out.get_mut(e) {
                    if *o == pos {
                        *o = pos + k;
                        any = true;
                    }
                }
            }
            if !any || k < r.key.len() {
                break;
            }
            pos += k;
            cur = child;
        }
        out
    }

    /// The longest prefix of `tokens` resident on `d`, splitting the node
    /// it ends inside (SGLang), stamping `d`'s slots with `stamp` and
    /// counting hits; also the longest prefix resident on any device.
    pub(crate) fn match_on<'g>(
        &self,
        ns: Option<&str>,
        tokens: &[u32],
        d: usize,
        stamp: u64,
        guard: &'g Guard,
    ) -> MatchWalk<'g> {
        let tokens = &tokens[..tokens.len() - tokens.len() % self.page_size];
        let mut w = MatchWalk {
            end: End::Root,
            len: 0,
            generation: 0,
            any_len: 0,
            any_device: None,
            host_len: 0,
            hits: 0,
        };
        let Some(mut cur) = self.find_root(ns, guard) else {
            return w;
        };
        let mut pos = 0;
        let mut on_d = true;
        let host = self.host();
        let mut on_host = host.is_some();
        while pos < tokens.len() {
            let (mut child, img, k) = match self.step(cur, &tokens[pos..], guard) {
                Step::None => break,
                Step::Found(c, i, k) => (c, i, k),
            };
            // SAFETY: loaded under `guard`, retired with defer_destroy.
            let full = k == unsafe { img.deref() }.key.len();
            if on_d && child.resident(d) {
                child.stamp(d, stamp);
                let mut split = true;
                if !full {
                    // A match never waits for a lock: it splits only if
                    // both locks are free now. Otherwise its answer on `d`
                    // ends at `cur`, the longest prefix it can report
                    // without splitting.
                    match self.split(cur, child, img, k, Some(d), None, Locking::Try, guard) {
                        Ok(p) => child = p,
                        Err(LockFailed::Busy) => split = false,
                        Err(LockFailed::Changed) => continue,
                    }
                }
                let st = child.dev(d).residency.load();
                if split && st.resident() {
                    // Relaxed suffices: hit counts are statistics for
                    // eviction keys, read in quiescent state or tolerated
                    // stale.
                    w.hits = child.dev(d).hits.fetch_add(1, Ordering::Relaxed) + 1;
                    w.end = End::Node(child);
                    w.len = pos + k;
                    w.generation = st.generation();
                } else {
                    on_d = false;
                }
            } else {
                on_d = false;
            }
            // The host tier, prefix-closed like a device: its prefix goes
            // on while every node so far is resident there.
            on_host = on_host && host.is_some_and(|h| child.resident(h));
            if on_host {
                w.host_len = pos + k;
            }
            match self.best_device(child, d) {
                Some(e) => {
                    w.any_len = pos + k;
                    w.any_device = Some(e);
                }
                None if on_host => {}
                None => break,
            }
            if !full {
                break;
            }
            pos += k;
            cur = child;
        }
        if w.any_device.is_none() && w.len > 0 && d < self.gpus {
            w.any_device = Some(d);
            w.any_len = w.len;
        }
        w
    }

    /// The namespace and tokens of root → `node`, read from the images
    /// under `guard` (a snapshot: a concurrent split changes no tokens of
    /// the path, only where they are cut). `None` for a root, or a node
    /// whose parent chain was cut meanwhile (unlinked).
    pub(crate) fn path_of(&self, node: &Node, guard: &Guard) -> Option<(Option<String>, Vec<u32>)> {
        if node.is_root {
            return None;
        }
        let mut segs: Vec<&[u32]> = Vec::new();
        let root = climb_to_root(node, guard, |img| {
            segs.push(&img.key);
            Some(())
        })?;
        let ns = namespaces::name_of(&root.image_ref(guard).key);
        let mut tokens = Vec::with_capacity(segs.iter().map(|s| s.len()).sum());
        for s in segs.iter().rev() {
            tokens.extend_from_slice(s);
        }
        Some((ns, tokens))
    }

    /// Reads the values of root → `end` on `d`. Only sound to rely on while
    /// `end` is pinned on `d`. Returns `None` if the path does not add up to
    /// `len` tokens (the caller then re-walks).
    pub(crate) fn path_values(
        &self,
        end: &Node,
        d: usize,
        len: usize,
        guard: &Guard,
    ) -> Option<Vec<u32>> {
        // `end` is pinned on `d` (caller's contract), so it and its
        // ancestors are resident on `d` and linked during `guard`.
        let mut segs = Vec::new();
        let mut total = 0;
        climb_to_root(end, guard, |img| {
            let v = img.values.get(d)?;
            total += v.tokens(self.page_size);
            segs.push(v);
            Some(())
        })?;
        if total != len {
            return None;
        }
        let mut out = Vec::with_capacity(total);
        for s in segs.iter().rev() {
            s.append_to(&mut out, self.page_size);
        }
        Some(out)
    }

    /// Inserts `tokens` with `values` on `d`. Returns the ranges of `values`
    /// the tree adopted; the rest are duplicates the caller keeps.
    ///
    /// With `pin`, the walk pins hand over hand: every node it passes,
    /// adopts or creates is pinned on `d` in the same step (inside the
    /// locked section for nodes it makes resident), and the previous pin is
    /// released only after the next is held, so nothing the insert adopted
    /// can be evicted before the caller holds the final pin. A walk that
    /// restarts keeps its deepest pin until the new walk is done.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn insert<'g>(
        &self,
        ns: Option<&str>,
        tokens: &[u32],
        values: &[u32],
        d: usize,
        priority: i64,
        pin: bool,
        guard: &'g Guard,
    ) -> InsertWalk<'g> {
        let mut adopted: Vec<Range<usize>> = Vec::new();
        let len = tokens.len();
        prefetch(tokens);
        let stamp = self.tick(d);
        // The backlog is looked at by one insert in four per device (the
        // counter is written by hand-overs on any thread: reading it on
        // every insert would often be a miss), which then frees four
        // inserts' share.
        if stamp.is_multiple_of(4) && self.reclaimer.pending() > RECLAIM_AT {
            self.reclaimer.reclaim_some(4 * RECLAIM_STEP);
        }
        let overlaps = |adopted: &[Range<usize>], r: Range<usize>| {
            adopted.iter().any(|a| a.start < r.end && r.start < a.end)
        };
        // Pins: `walk` is this pass's deepest pin, `kept` a pin kept across a
        // restart (protecting the path adopted so far) until the end. Both
        // are `HeldPin`s: replaced, dropped or unwound (a panic mid-insert),
        // a pin is released; only the one handed on at the end survives.
        let mut walk: Option<HeldPin<'g>> = None;
        let mut kept: Option<HeldPin<'g>> = None;
        let take = |walk: &mut Option<HeldPin<'g>>, n: &'g Node, depth: usize| {
            // The old pin, if any, is released as it is replaced.
            *walk = Some(HeldPin::new(n, d, depth));
        };
        if len == 0 {
            // Nothing to cache: no namespace root is created for it.
            return InsertWalk {
                adopted,
                pinned: None,
            };
        }
        'restart: loop {
            let root = self.root_or_create(ns, guard);
            root.raise_priority(priority);
            let mut cur = root;
            let mut pos = 0;
            while pos < len {
                let rest = &tokens[pos..];
                match self.step(cur, rest, guard) {
                    Step::None => {
                        if overlaps(&adopted, pos..len) {
                            // Part of what we adopted was evicted meanwhile;
                            // its values are no longer ours to hand out.
                            break 'restart;
                        }
                        let at = StoreAt {
                            ns,
                            path: tokens,
                            start: pos,
                        };
                        match self.attach_leaf(cur, d, at, &values[pos..], priority, pin, guard) {
                            Ok(leaf) => {
                                push_range(&mut adopted, pos..len);
                                #[cfg(radixkv_negative = "born_pinned")]
                                if pin && leaf.dev(d).residency.try_pin(None).is_err() {
                                    break 'restart;
                                }
                                if pin {
                                    take(&mut walk, leaf, len);
                                }
                                break 'restart;
                            }
                            Err(Conflict) => {
                                spin_wait();
                                continue 'restart;
                            }
                        }
                    }
                    Step::Found(child, img, k) => {
                        child.stamp(d, stamp);
                        // SAFETY: loaded under `guard`, retired with defer_destroy.
                        let node = if k < unsafe { img.deref() }.key.len() {
                            let locking = Locking::Wait;
                            match self.split(
                                cur,
                                child,
                                img,
                                k,
                                Some(d),
                                Some(priority),
                                locking,
                                guard,
                            ) {
                                Ok(p) => p,
                                Err(_) => {
                                    spin_wait();
                                    continue;
                                }
                            }
                        } else {
                            child.raise_priority(priority);
                            child
                        };
                        if !node.resident(d) {
                            if overlaps(&adopted, pos..pos + k) {
                                break 'restart;
                            }
                            let at = StoreAt {
                                ns,
                                path: &tokens[..pos + k],
                                start: pos,
                            };
                            if self
                                .adopt(
                                    cur,
                                    node,
                                    d,
                                    at,
                                    &values[pos..pos + k],
                                    priority,
                                    pin,
                                    guard,
                                )
                                .is_err()
                            {
                                spin_wait();
                                if let Some(w) = walk.take() {
                                    keep_deeper(&mut kept, w);
                                }
                                continue 'restart;
                            }
                            push_range(&mut adopted, pos..pos + k);
                        } else if pin && node.dev(d).residency.try_pin(None).is_err() {
                            // Evicted since we looked: walk again.
                            spin_wait();
                            if let Some(w) = walk.take() {
                                keep_deeper(&mut kept, w);
                            }
                            continue 'restart;
                        }
                        if pin {
                            take(&mut walk, node, pos + k);
                        }
                        pos += k;
                        cur = node;
                    }
                }
            }
            break;
        }
        // The kept pin protected the path while we walked again; the walk's
        // own pin (deeper or equal) now does, and the kept one is released
        // as it drops here.
        let pinned = walk.or(kept).map(HeldPin::hand_on);
        InsertWalk { adopted, pinned }
    }

    /// Splits `child` (whose image was `seen`) after `k` tokens: a new node
    /// takes the first `k` tokens and the old node object keeps the rest, so
    /// handles to it keep meaning the end of the same path.
    #[allow(clippy::too_many_arguments)]
    fn split<'g>(
        &self,
        parent: &'g Node,
        child: &'g Node,
        seen: Shared<'g, Image>,
        k: usize,
        fresh: Option<usize>,
        priority: Option<i64>,
        locking: Locking,
        guard: &'g Guard,
    ) -> Result<&'g Node, LockFailed> {
        let ps = self.page_size;
        // The protecting step of race 9: split only the image the caller
        // computed from, of a node still linked; eviction changes both
        // under the same two locks.
        #[cfg(not(radixkv_negative = "split_recheck"))]
        let expect = Expect::Image(seen);
        #[cfg(radixkv_negative = "split_recheck")]
        let expect = Expect::Nothing;
        let locked =
            Locked::parent(parent, None, locking)?.with_child(child, expect, locking, guard)?;
        // SAFETY: loaded under `guard`, retired with defer_destroy.
        let img = unsafe { seen.deref() };
        if !std::ptr::eq(img.parent.0, parent) || k == 0 || k >= img.key.len() {
            return Err(LockFailed::Changed);
        }
        let len = img.key.len();
        let pvals = img.values.map(|v| v.slice(0, k, ps));
        let svals = img.values.map(|v| v.slice(k, len, ps));
        let skey = &img.key[k..];
        let prefix = Node::new(
            self.new_id(fresh.unwrap_or(0)),
            false,
            self.devices,
            ImageParts {
                parent: ParentPtr(parent),
                key: &img.key[..k],
                values: pvals,
            },
            Children::flat(vec![(page_hash(&skey[..ps]), NodePtr(child))]),
            child.priority.load(Ordering::SeqCst),
        );
        for (e, slot) in prefix.slots().enumerate() {
            let c = &child.dev(e);
            // Relaxed: the new node is not yet published; the publication
            // below (SeqCst swap) orders these stores before any reader.
            slot.last_access
                .store(c.last_access.load(Ordering::Relaxed), Ordering::Relaxed);
            slot.created
                .store(c.created.load(Ordering::Relaxed), Ordering::Relaxed);
            slot.hits
                .store(c.hits.load(Ordering::Relaxed), Ordering::Relaxed);
            slot.hits_base
                .store(c.hits_base.load(Ordering::Relaxed), Ordering::Relaxed);
            if img.values.is_present(e) {
                slot.resident_children.store(1, Ordering::Relaxed);
            }
        }
        if let Some(d) = fresh {
            prefix
                .dev(d)
                .last_access
                .store(self.tick(d), Ordering::Relaxed);
            prefix.dev(d).created.store(self.tick(d), Ordering::Relaxed);
        }
        if let Some(p) = priority {
            prefix.raise_priority(p);
        }
        // Pins stay on the node object they were taken on, which keeps its
        // path as the suffix: a split copies no pin (race 3). The control
        // copies them into the new prefix, as SGLang copies lock_ref.
        #[cfg(radixkv_negative = "split_copies_pins")]
        for (e, slot) in prefix.slots().enumerate() {
            for _ in 0..child.dev(e).residency.load().pins() {
                let _ = slot.residency.try_pin(None);
            }
        }
        // The protecting step of model 22: under both locks, before the
        // prefix node is published (see crate::events), for every tier
        // that holds the child. The control reports it after the locks.
        #[cfg(not(radixkv_negative = "split_event_in_lock"))]
        self.report_split(img, child.id, prefix.id, k);
        #[cfg(radixkv_negative = "split_event_in_lock")]
        let prefix_id = prefix.id;
        let prefix = NodePtr::link(prefix);
        let mut retired = Retired::default();
        locked.publish_child_image(
            ImageParts {
                parent: ParentPtr(prefix.0),
                key: skey,
                values: svals,
            },
            guard,
            &mut retired,
        );
        // A writer parked here (the test-only pause point) holds both locks
        // with the child's new image published and the parent's children
        // not yet: readers must still finish (they climb, see `climb_to`).
        #[cfg(all(feature = "testing", not(loom)))]
        crate::pause::at(crate::pause::Point::Split);
        let hash = page_hash(&img.key[..ps]);
        locked.replace_parent_child(hash, child, prefix, guard, &mut retired);
        self.count_node(fresh.unwrap_or(0), true);
        self.reclaimer.retire(retired, guard);
        #[cfg(radixkv_negative = "split_event_in_lock")]
        {
            drop(locked);
            // Any thread may run between the release and the report (under
            // loom a scheduling point: nothing else here is one).
            crate::sync::thread::yield_now();
            self.report_split(img, child.id, prefix_id, k);
        }
        // SAFETY: just linked under `guard`.
        Ok(unsafe { prefix.node_in(guard) })
    }

    #[allow(clippy::too_many_arguments)]
    fn attach_leaf<'g>(
        &self,
        parent: &Node,
        d: usize,
        at: StoreAt<'_>,
        values: &[u32],
        priority: i64,
        pin: bool,
        guard: &'g Guard,
    ) -> Result<&'g Node, Conflict> {
        let ps = self.page_size;
        let tokens = &at.path[at.start..];
        let hash = page_hash(&tokens[..ps]);
        // The leaf is built before the parent's lock is taken (its key copy
        // and allocations are most of an attach), so that the locked section
        // is short: a writer waiting for it spins instead of sleeping. Until
        // it is published below it is this thread's alone; on a conflict it
        // is dropped unpublished.
        let leaf = Node::new(
            self.new_id(d),
            false,
            self.devices,
            ImageParts {
                parent: ParentPtr(parent),
                key: tokens,
                values: DeviceValues::one(d, Values::new(values, ps)),
            },
            Children::default(),
            priority,
        );
        leaf.dev(d)
            .last_access
            .store(self.tick(d), Ordering::Relaxed);
        leaf.dev(d).created.store(self.tick(d), Ordering::Relaxed);
        // The protecting step of the pinned-insert model: born pinned, so
        // there is no moment in which the new leaf is evictable. The control
        // pins it only after it is published.
        #[cfg(not(radixkv_negative = "born_pinned"))]
        if pin {
            let _ = leaf.dev(d).residency.try_pin(None);
        }
        // The protecting step of race 2 (inserter side): attach only below a
        // parent that is still resident on `d`, under the parent's lock. For
        // a namespace root, the same check refuses a root that was reclaimed
        // (the namespace model; its control skips it for roots).
        let locked = Locked::parent(parent, Some(d), Locking::Wait).map_err(|_| Conflict)?;
        // The protecting step of race 5: under the parent's lock, re-check
        // that nobody attached this first page meanwhile.
        #[cfg(not(radixkv_negative = "attach_recheck"))]
        if parent
            .children_ref(guard)
            .with_hash(hash)
            .any(|c| c.image_ref(guard).key[..ps] == tokens[..ps])
        {
            return Err(Conflict);
        }
        #[cfg(all(feature = "testing", not(loom)))]
        crate::pause::at(crate::pause::Point::Attach);
        // The protecting step of model 21: the store is reported before the
        // leaf is published, under the parent's lock, so nobody can evict
        // (or extend) it before. The control reports it once the attach is
        // done, after the lock.
        #[cfg(not(radixkv_negative = "event_in_lock"))]
        self.report_stored(d, at, leaf.id, parent.id);
        let leaf = NodePtr::link(leaf);
        let mut retired = Retired::default();
        locked.add_parent_child(hash, leaf, guard, &mut retired);
        parent
            .dev(d)
            .resident_children
            .fetch_add(1, Ordering::SeqCst);
        // The rest needs no lock.
        drop(locked);
        self.reclaimer.retire(retired, guard);
        self.resident_tokens[d].fetch_add(tokens.len() as u64, Ordering::SeqCst);
        self.count_node(d, true);
        // SAFETY: just linked under `guard`.
        let leaf = unsafe { leaf.node_in(guard) };
        self.note_leaf(leaf, d);
        #[cfg(radixkv_negative = "event_in_lock")]
        self.report_stored(d, at, leaf.id, parent.id);
        Ok(leaf)
    }

    #[allow(clippy::too_many_arguments)]
    fn adopt(
        &self,
        parent: &Node,
        node: &Node,
        d: usize,
        at: StoreAt<'_>,
        values: &[u32],
        priority: i64,
        pin: bool,
        guard: &Guard,
    ) -> Result<(), Conflict> {
        // The protecting step of race 6: never make an unlinked node
        // resident (its values would be lost with it): `Expect::Linked`
        // checks it under both locks.
        #[cfg(not(radixkv_negative = "unlink_check"))]
        let expect = Expect::Linked;
        #[cfg(radixkv_negative = "unlink_check")]
        let expect = Expect::Nothing;
        let locked = Locked::parent(parent, Some(d), Locking::Wait)
            .and_then(|l| l.with_child(node, expect, Locking::Wait, guard))
            .map_err(|_| Conflict)?;
        let img = node.image_ref(guard);
        if !std::ptr::eq(img.parent.0, parent)
            || img.key.len() != values.len()
            || img.values.is_present(d)
        {
            return Err(Conflict);
        }
        let vals = img.values.with(d, Values::new(values, self.page_size));
        #[cfg(all(feature = "testing", not(loom)))]
        crate::pause::at(crate::pause::Point::Adopt);
        let mut retired = Retired::default();
        locked.publish_child_image(
            ImageParts {
                parent: img.parent,
                key: &img.key,
                values: vals,
            },
            guard,
            &mut retired,
        );
        self.reclaimer.retire(retired, guard);
        // Under both locks, before the node is resident (see crate::events).
        self.report_stored(d, at, node.id, parent.id);
        // Values are published before RESIDENT is set, so a pinned reader
        // always finds them.
        node.dev(d).residency.make_resident();
        if pin {
            // Under the node's lock: no eviction can come between.
            let _ = node.dev(d).residency.try_pin(None);
        }
        node.dev(d)
            .last_access
            .store(self.tick(d), Ordering::Relaxed);
        node.dev(d).created.store(self.tick(d), Ordering::Relaxed);
        node.raise_priority(priority);
        parent
            .dev(d)
            .resident_children
            .fetch_add(1, Ordering::SeqCst);
        self.resident_tokens[d].fetch_add(values.len() as u64, Ordering::SeqCst);
        self.note_leaf(node, d);
        Ok(())
    }

    /// Evicts `node`'s residency on `d` if it is an unpinned leaf on `d`;
    /// unlinks the node if that was its last residency and it has no
    /// children. `node` must have been reached under `guard`.
    pub(crate) fn evict_leaf<'g>(
        &self,
        node: &'g Node,
        d: usize,
        guard: &'g Guard,
    ) -> Option<EvictedLeaf<'g>> {
        if node.is_root {
            return None;
        }
        // The protecting step of the shared-parent model: the parent's
        // children array and counts change only under its lock.
        let lock_parent = cfg!(not(radixkv_negative = "parent_lock"));
        let locked = Locked::parent_of(node, lock_parent, guard)?;
        let parent = locked.parent_node();
        let pp = ParentPtr(parent);
        // The protecting step of race 2 (evictor side): only a leaf on
        // `d`, re-checked under the node's lock, may lose residency.
        #[cfg(not(radixkv_negative = "leaf_check"))]
        if node.dev(d).resident_children.load(Ordering::SeqCst) != 0 {
            return None;
        }
        node.dev(d).residency.try_evict().ok()?;
        #[cfg(all(feature = "testing", not(loom)))]
        crate::pause::at(crate::pause::Point::Evict);
        let img = node.image_ref(guard);
        let Some(values) = img.values.get(d).cloned() else {
            debug_assert!(false, "RESIDENT without values");
            return None;
        };
        // Under the node's and its parent's locks (see crate::events): the
        // path is read before anything changes.
        if let Some(l) = &self.listener {
            self.report_removed(l, node, parent, d, guard);
        }
        // Under the node's lock, the image's values and the devices' RESIDENT
        // bits agree (both change only under it, values published first): no
        // values on another device means resident nowhere else, without
        // reading every device's slot (a line each).
        let resident_elsewhere = img.values.iter().any(|(e, _)| e != d);
        let key = &img.key;
        let key_len = key.len();
        let hash = page_hash(&key[..self.page_size]);
        let mut retired = Retired::default();
        let unlink = !resident_elsewhere && node.children_ref(guard).is_empty();
        // A node that leaves the tree keeps its last image: no new one is
        // built for it (an allocation and a copy of its key per evicted
        // leaf, a fifth of an eviction). Its residency on `d` is already
        // gone from the state word (`try_evict` above), which is what pins
        // go by, and values are read only after a pin (race 8); a `peek`
        // that reached the node before it leaves may still count it, as it
        // would had it read the image a moment earlier.
        if !unlink {
            locked.publish_child_image(
                ImageParts {
                    parent: pp,
                    key,
                    values: img.values.without(d),
                },
                guard,
                &mut retired,
            );
        }
        parent
            .dev(d)
            .resident_children
            .fetch_sub(1, Ordering::SeqCst);
        self.resident_tokens[d].fetch_sub(key_len as u64, Ordering::SeqCst);
        debug_assert_eq!(resident_elsewhere, node.resident_anywhere());
        if unlink {
            locked.mark_child_obsolete();
            #[cfg(all(feature = "testing", not(loom)))]
            crate::pause::at(crate::pause::Point::Unlink);
            let Some(parent_empty) = locked.remove_parent_child(hash, node, guard, &mut retired)
            else {
                // Not among its parent's children: the locks and the
                // parent check above rule it out. Were it so, the node is
                // left alone (a leak) rather than released while it may be
                // filed somewhere.
                debug_assert!(false, "an evicted leaf missing from its parent");
                self.reclaimer.retire(retired, guard);
                return Some(EvictedLeaf { values, parent });
            };
            // The tree's one reference goes once no reader can hold the
            // node: it is unreachable from the current children now.
            retired.node(NodePtr(node));
            self.count_node(d, false);
            if parent.is_root && parent_empty {
                // The namespace's last node left: reclaim its root. Marked
                // obsolete under its lock (held), so no attach, adopt or
                // split below it can succeed from now on; then its table
                // entry goes (namespaces module docs).
                locked.mark_parent_obsolete();
                self.roots.remove_root(parent, guard, &mut retired);
            }
        }
        self.reclaimer.retire(retired, guard);
        Some(EvictedLeaf { values, parent })
    }

    /// Every non-root node in pre-order, with the index of its parent in the
    /// list (`None` for children of a root).
    pub(crate) fn nodes<'g>(&self, guard: &'g Guard) -> Vec<(&'g Node, Option<usize>)> {
        let mut out = Vec::new();
        let mut stack: Vec<(&'g Node, Option<usize>)> = Vec::new();
        for (_, root) in self.roots.roots(guard) {
            for c in root.children_ref(guard).nodes().rev() {
                stack.push((c, None));
            }
        }
        while let Some((n, p)) = stack.pop() {
            let i = out.len();
            out.push((n, p));
            for c in n.children_ref(guard).nodes().rev() {
                stack.push((c, Some(i)));
            }
        }
        out
    }

    /// Unpinned leaves on `d` (eviction candidates), in one pass that
    /// does not descend below nodes not resident on `d` (I1: nothing below
    /// them is resident there either).
    pub(crate) fn leaves<'g>(&self, d: usize, guard: &'g Guard) -> Vec<&'g Node> {
        let mut out = Vec::new();
        let mut stack: Vec<&'g Node> = self
            .roots
            .roots(guard)
            .into_iter()
            .map(|(_, r)| r)
            .collect();
        while let Some(n) = stack.pop() {
            if is_candidate(n, d) {
                out.push(n);
                continue;
            }
            for c in n.children_ref(guard).nodes() {
                if c.resident(d) {
                    stack.push(c);
                }
            }
        }
        out
    }

    /// Every value resident on `d`, node by node (in whole pages).
    pub(crate) fn values_on(&self, d: usize, guard: &Guard) -> Vec<u32> {
        let mut out = Vec::new();
        for (n, _) in self.nodes(guard) {
            if let Some(v) = n.image_ref(guard).values.get(d) {
                v.append_to(&mut out, self.page_size);
            }
        }
        out
    }

    /// Sizes on `d` by a scan (exact in quiescent state).
    pub(crate) fn scan(&self, d: usize, guard: &Guard) -> Scan {
        let nodes = self.nodes(guard);
        let mut pinned_below = vec![false; nodes.len()];
        let mut s = Scan::default();
        for i in (0..nodes.len()).rev() {
            let (n, p) = nodes[i];
            let st = n.dev(d).residency.load();
            if !st.resident() {
                continue;
            }
            let len = n.image_ref(guard).key.len();
            s.total += len;
            s.nodes += 1;
            s.pins += st.pins();
            if st.pins() > 0 || pinned_below[i] {
                s.protected += len;
                if let Some(p) = p {
                    pinned_below[p] = true;
                }
            }
        }
        s
    }
}

/// Keeps the deeper of two pins in `kept`, releasing the other.
fn keep_deeper<'g>(kept: &mut Option<HeldPin<'g>>, w: HeldPin<'g>) {
    // The shallower of the two is released as it drops.
    match kept {
        Some(k) if k.depth >= w.depth => drop(w),
        _ => *kept = Some(w),
    }
}

/// A pin an insert holds on `(node, d)`, covering `depth` tokens from the
/// root: released when dropped (replaced, discarded, or unwound by a panic
/// mid-insert, so no pin leaks: I6), unless handed on to the caller, who
/// wraps it in a `Lease`.
#[derive(Debug)]
pub(crate) struct HeldPin<'g> {
    node: &'g Node,
    d: usize,
    depth: usize,
}

impl<'g> HeldPin<'g> {
    /// Owns a pin just taken on `(node, d)`.
    fn new(node: &'g Node, d: usize, depth: usize) -> Self {
        HeldPin { node, d, depth }
    }

    /// The node and depth, the pin handed on (no longer released here).
    fn hand_on(self) -> (&'g Node, usize) {
        let out = (self.node, self.depth);
        std::mem::forget(self);
        out
    }
}

impl Drop for HeldPin<'_> {
    fn drop(&mut self) {
        self.node.dev(self.d).residency.unpin();
    }
}

/// Appends `r`, merging it into the last range when they touch.
fn push_range(v: &mut Vec<Range<usize>>, r: Range<usize>) {
    match v.last_mut() {
        Some(last) if last.end == r.start => last.end = r.end,
        _ => v.push(r),
    }
}

/// Whether `n` is a leaf resident on `d`, pinned or not.
pub(crate) fn is_leaf_on(n: &Node, d: usize) -> bool {
    !n.is_root
        && !n.obsolete.load(Ordering::SeqCst)
        && n.dev(d).residency.load().resident()
        && n.dev(d).resident_children.load(Ordering::SeqCst) == 0
}

/// Whether `n` is an unpinned leaf resident on `d`.
pub(crate) fn is_candidate(n: &Node, d: usize) -> bool {
    let st = n.dev(d).residency.load();
    !n.is_root
        && st.resident()
        && st.pins() == 0
        && n.dev(d).resident_children.load(Ordering::SeqCst) == 0
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
        let mut stack: Vec<NodePtr> = Vec::new();
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
fn detach_children(n: &Node) -> Vec<NodePtr> {
    // SAFETY: only called from `Tree::drop`, which has exclusive access to
    // the tree: no reader can be traversing it, and leases and handles never
    // read children arrays, so the old array is ours alone.
    let guard = unsafe { crossbeam_epoch::unprotected() };
    let old = n.children.swap(Shared::null(), Ordering::Relaxed, guard);
    if old.is_null() {
        return Vec::new();
    }
    // SAFETY: as above; checked non-null.
    unsafe { old.into_owned() }.into_box().into_nodes()
}
