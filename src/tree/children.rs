//! Children of a node: [`Children`], either a flat sorted array replaced
//! copy-on-write (up to `FLAT_MAX` entries) or, for a wide node (a system
//! prompt with thousands of continuations), an open-addressing [`Table`]
//! changed in place; and [`page_hash`], the hash a child is filed under.

use super::node::{Node, NodePtr};
use crate::sync::{AtomicU32, AtomicUsize, Ordering};

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

/// Where `hash` would sit among `n` sorted hashes spread evenly over
/// `lo..=hi`.
fn guess(hash: u64, (lo, hi): (u64, u64), n: usize) -> usize {
    if n == 0 || hash <= lo {
        return 0;
    }
    let span = u128::from(hi - lo) + 1;
    (u128::from(hash - lo) * n as u128 / span) as usize
}

/// `s.partition_point(p)` (`p` true on a prefix of `s`), searched outward
/// from `guess`: a few probes when the guess is close, O(log n) anyway.
fn partition_near<T>(s: &[T], guess: usize, p: impl Fn(&T) -> bool) -> usize {
    let n = s.len();
    if n == 0 {
        return 0;
    }
    let g = guess.min(n - 1);
    let (lo, hi) = if p(&s[g]) {
        // The answer is in (g, n]: gallop right.
        let (mut lo, mut step) = (g + 1, 1);
        let hi = loop {
            let probe = g + step;
            if probe >= n {
                break n;
            }
            if !p(&s[probe]) {
                break probe;
            }
            lo = probe + 1;
            step *= 2;
        };
        (lo, hi)
    } else {
        // The answer is in [0, g]: gallop left.
        let (mut hi, mut step) = (g, 1);
        let lo = loop {
            if step > g {
                break 0;
            }
            let probe = g - step;
            if p(&s[probe]) {
                break probe + 1;
            }
            hi = probe;
            step *= 2;
        };
        (lo, hi)
    };
    lo + s[lo..hi].partition_point(&p)
}

/// One entry of a flat array: the hash of the child's first page, and the
/// child.
pub(crate) type ChildEntry = (u64, NodePtr);

/// Children arrays up to this size are one flat array; a node with more
/// has a [`Table`].
#[cfg(not(loom))]
const FLAT_MAX: usize = 64;
/// Under loom a table comes early, so that a model reaches one with a few
/// nodes (each slot is a pair of loom atomics, each access a scheduling
/// point).
#[cfg(loom)]
const FLAT_MAX: usize = 4;
/// The smallest table.
const MIN_CAP: usize = 8;

/// What a slot's tag is before the slot is first filled.
const NEVER: u32 = 0;
/// What a slot's pointer becomes when its child is removed (never a
/// node's address: nodes are aligned to 8 bytes).
const TOMB: usize = 1;

/// A child's tag in a [`Table`]: 32 bits of a multiplicative mix of its page
/// hash (page hashes at page size 1 are token ids: small, consecutive
/// numbers), with the low bit set so that no tag is [`NEVER`].
fn tag_of(hash: u64) -> u32 {
    ((hash.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) as u32) | 1
}

/// A wide node's children: an open-addressing hash table (linear probing)
/// changed in place under the node's lock and read without one. Adding or
/// removing a child writes one slot: no array is copied, allocated or
/// retired, whatever the node's fan-out (a copy-on-write array of 1,000
/// children cost an insert two allocations, a copy and two retirements,
/// and an eviction as much again).
///
/// The protocol (all accesses are atomic, so a reader racing a writer
/// reads each word whole):
/// * Slot `i` is a tag (`tags[i]`: [`NEVER`], or the child's [`tag_of`])
///   and a pointer (`ptrs[i]`: the child's address, or [`TOMB`]).
/// * A slot is filled once: its pointer is stored, then its tag. A reader
///   loads the tag, then the pointer, so a reader that sees a tag also sees
///   that pointer or a later one.
/// * A filled slot is never emptied, and its tag never changes: a removal
///   stores [`TOMB`] in its pointer; a split stores the new prefix node,
///   which starts with the same page, so the same tag fits it. A reader
///   stops at the first never-filled slot of its probe; since no slot
///   goes back to never-filled, it misses only children added after it
///   looked at that slot (a lookup is linearizable at that moment).
/// * Writers never let the filled slots (live and removed) pass three
///   quarters of the capacity: before that, and when live children fall
///   below a fifth of it (unless it has `MIN_CAP` slots already), the
///   writer builds a new table of the live
///   children and publishes it copy-on-write, like a flat array; the old
///   table is never written again and is freed after the grace period of
///   every reader that could hold it (loom model 14 checks it).
/// * Equal tags are resolved by the reader, which compares the child's
///   first page (as equal hashes are in a flat array).
pub(crate) struct Table {
    tags: Box<[AtomicU32]>,
    ptrs: Box<[AtomicUsize]>,
    /// Children in the table. Written under the node's lock only.
    live: AtomicUsize,
    /// Slots ever filled (live and removed). Written under the node's lock
    /// only.
    used: AtomicUsize,
}

impl std::fmt::Debug for Table {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Table")
            .field("capacity", &self.cap())
            .field("live", &self.live.load(Ordering::SeqCst))
            .field("used", &self.used.load(Ordering::SeqCst))
            .finish()
    }
}

#[cfg(loom)]
impl Drop for Table {
    fn drop(&mut self) {
        crate::sync::probe::table_died(self.addr());
    }
}

impl Table {
    /// An empty table of `cap` slots.
    fn with_capacity(cap: usize) -> Table {
        let t = Table {
            tags: (0..cap).map(|_| AtomicU32::new(NEVER)).collect(),
            ptrs: (0..cap).map(|_| AtomicUsize::new(0)).collect(),
            live: AtomicUsize::new(0),
            used: AtomicUsize::new(0),
        };
        #[cfg(loom)]
        crate::sync::probe::table_born(t.addr());
        t
    }

    /// A table of `entries` (tag, address), filling about half of it (so
    /// that it takes as many again before its next rebuild: measured, a
    /// rebuild every quarter of growth put the rebuilds in the insert's
    /// p99).
    fn of(entries: Vec<(u32, usize)>) -> Table {
        let t = Table::with_capacity((entries.len() * 2 + 1).max(MIN_CAP));
        for (tag, p) in entries {
            t.place(tag, p);
        }
        t
    }

    /// The table's identity for the loom probe.
    #[cfg(loom)]
    fn addr(&self) -> usize {
        self.tags.as_ptr() as usize
    }

    fn cap(&self) -> usize {
        self.tags.len()
    }

    /// The most slots that may ever be filled (three quarters).
    fn max_used(&self) -> usize {
        self.cap() * 3 / 4
    }

    /// The slot after `i`, wrapping around.
    fn after(&self, i: usize) -> usize {
        if i + 1 == self.cap() {
            0
        } else {
            i + 1
        }
    }

    /// Where `tag`'s probe starts.
    fn home(&self, tag: u32) -> usize {
        ((u64::from(tag) * self.cap() as u64) >> 32) as usize
    }

    /// The slots holding `tag` (filled with it, live or removed), in probe
    /// order from its home, up to the first never-filled slot.
    fn probe(&self, tag: u32) -> impl Iterator<Item = usize> + '_ {
        let mut i = self.home(tag);
        let mut left = self.cap();
        std::iter::from_fn(move || {
            while left > 0 {
                left -= 1;
                let t = self.tags[i].load(Ordering::SeqCst);
                // Under loom, after the load (a scheduling point: another
                // thread may have freed the table meanwhile).
                #[cfg(loom)]
                crate::sync::probe::assert_table_live(self.addr());
                if t == NEVER {
                    left = 0;
                    return None;
                }
                let at = i;
                i = self.after(i);
                if t == tag {
                    return Some(at);
                }
            }
            None
        })
    }

    /// The child in slot `i`, if live.
    fn child(&self, i: usize) -> Option<&Node> {
        let p = self.ptrs[i].load(Ordering::SeqCst);
        #[cfg(loom)]
        crate::sync::probe::assert_table_live(self.addr());
        // SAFETY: a live slot holds the address of a node that was linked
        // while this table was its parent's current one (stored before its
        // tag, see the protocol). The reader loaded this table while it
        // was current, under a guard that `&self` does not outlive (tables
        // are read through `children_ref(guard)`); a node is unlinked (its
        // slot tombstoned, in this table or a later one) before its tree
        // reference is retired, so its release waits for that guard even
        // if the slot is read after the unlink (a retired table keeps the
        // address).
        (p > TOMB).then(|| unsafe { &*(p as *const Node) })
    }

    /// Files `p` under `tag` in the first never-filled slot of its probe.
    /// The caller is the only writer and has checked there is room.
    fn place(&self, tag: u32, p: usize) {
        let mut i = self.home(tag);
        for _ in 0..self.cap() {
            if self.tags[i].load(Ordering::SeqCst) == NEVER {
                // The pointer first, then the tag (see the protocol).
                self.ptrs[i].store(p, Ordering::SeqCst);
                self.tags[i].store(tag, Ordering::SeqCst);
                self.used.fetch_add(1, Ordering::SeqCst);
                self.live.fetch_add(1, Ordering::SeqCst);
                return;
            }
            i = self.after(i);
        }
        debug_assert!(false, "a full table");
    }

    /// The negative control of model 14: marks the table freed for the
    /// loom probe and clobbers its tags (as a reuse of its memory would),
    /// so that a reader's loads conflict with it and loom orders them after.
    #[cfg(all(loom, radixkv_negative = "table_retire"))]
    pub(crate) fn clobber_as_freed(&self) {
        crate::sync::probe::table_died(self.addr());
        for t in self.tags.iter() {
            t.store(NEVER, Ordering::SeqCst);
        }
    }

    /// Whether one more child fits before the table must be rebuilt.
    fn has_room(&self) -> bool {
        self.used.load(Ordering::SeqCst) < self.max_used()
    }

    /// The slot of `old` (filed under `hash`), if it is there.
    fn slot_of(&self, hash: u64, old: &Node) -> Option<usize> {
        let addr = old as *const Node as usize;
        self.probe(tag_of(hash))
            .find(|&i| self.ptrs[i].load(Ordering::SeqCst) == addr)
    }

    /// The live entries, as (tag, address), with room for one more.
    fn entries(&self) -> Vec<(u32, usize)> {
        let mut live = Vec::with_capacity(self.live.load(Ordering::SeqCst) + 1);
        live.extend((0..self.cap()).filter_map(|i| {
            let p = self.ptrs[i].load(Ordering::SeqCst);
            (p > TOMB).then(|| (self.tags[i].load(Ordering::SeqCst), p))
        }));
        live
    }
}

/// A removal found no such child (see [`Children::remove`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NotAChild;

/// The children of a node, replaced copy-on-write when flat and changed
/// in place when a [`Table`]. A node without children holds no array at
/// all; up to `FLAT_MAX` children are one flat array sorted by
/// [`page_hash`] (16 bytes each); wider nodes have a table (12 bytes a
/// slot; a rebuild leaves a little over half the slots free, so few
/// inserts pay for one; at most three quarters are ever used, and a table
/// whose live children fall below a fifth of it shrinks, down to `MIN_CAP`
/// slots).
/// A node that became wide keeps a table (shrunk as children go) until it
/// has no child left.
///
/// Dropping children frees their own allocations only, never a node (the
/// tree releases its references to nodes itself).
#[derive(Debug)]
pub(crate) enum Children {
    /// Up to `FLAT_MAX` entries, sorted by hash.
    Flat(Vec<ChildEntry>),
    /// A wide node's table.
    Table(Table),
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
            Children::Table(t) => t.live.load(Ordering::SeqCst) == 0,
        }
    }

    /// The children that may be filed under `hash` (usually one): every
    /// child whose page hash is `hash`, and in a table possibly others
    /// with the same tag. The caller compares each one's first page.
    ///
    /// A flat array's search starts where a uniformly distributed hash
    /// would be (page hashes are 64-bit mixes) and widens from there; a
    /// table's is one probe from the tag's home.
    pub(crate) fn with_hash(&self, hash: u64) -> impl Iterator<Item = &Node> {
        let (flat, table): (&[ChildEntry], Option<&Table>) = match self {
            Children::Flat(v) => (v, None),
            Children::Table(t) => (&[], Some(t)),
        };
        let lo = partition_near(flat, guess(hash, (0, u64::MAX), flat.len()), |(h, _)| {
            *h < hash
        });
        flat[lo..]
            .iter()
            .take_while(move |(h, _)| *h == hash)
            // SAFETY: the entries are this array's, and arrays are read only
            // through `children_ref(guard)`, whose borrow (and so this
            // iterator's) the guard outlives.
            .map(|(_, c)| unsafe { c.node_unchecked() })
            .chain(
                table
                    .into_iter()
                    .flat_map(move |t| t.probe(tag_of(hash)).filter_map(|i| t.child(i))),
            )
    }

    /// Every child (a flat array's in hash order).
    pub(crate) fn nodes(&self) -> impl DoubleEndedIterator<Item = &Node> {
        let (flat, table): (&[ChildEntry], Option<&Table>) = match self {
            Children::Flat(v) => (v, None),
            Children::Table(t) => (&[], Some(t)),
        };
        #[cfg(loom)]
        if let Some(t) = table {
            crate::sync::probe::assert_table_live(t.addr());
        }
        let slots = table.map_or(0, Table::cap);
        flat.iter()
            // SAFETY: as in `with_hash`: the references live no longer than
            // this array's borrow, which its guard outlives.
            .map(|(_, c)| unsafe { c.node_unchecked() })
            .chain((0..slots).filter_map(move |i| table.and_then(|t| t.child(i))))
    }

    /// Checks the filing of every child against `hash_of` (its page hash):
    /// a flat array sorted and filed under the hashes, a table's children
    /// each found by its own probe, its counts right.
    pub(crate) fn check(&self, hash_of: impl Fn(&Node) -> u64) -> Result<(), String> {
        match self {
            Children::Flat(v) => {
                for (i, (h, c)) in v.iter().enumerate() {
                    // SAFETY: as in `with_hash`.
                    let n = unsafe { c.node_unchecked() };
                    if hash_of(n) != *h {
                        return Err(format!("node {} is filed under another page", n.id));
                    }
                    if i > 0 && v[i - 1].0 > *h {
                        return Err("children are not sorted by page hash".into());
                    }
                }
            }
            Children::Table(t) => {
                let mut live = 0;
                let mut used = 0;
                for i in 0..t.cap() {
                    let tag = t.tags[i].load(Ordering::SeqCst);
                    used += usize::from(tag != NEVER);
                    let Some(n) = t.child(i) else {
                        continue;
                    };
                    live += 1;
                    let h = hash_of(n);
                    if tag != tag_of(h) || t.slot_of(h, n) != Some(i) {
                        return Err(format!("node {} is filed under another page", n.id));
                    }
                }
                if live != t.live.load(Ordering::SeqCst) || used != t.used.load(Ordering::SeqCst) {
                    return Err(format!(
                        "a table counts wrong: {t:?}, {live} live, {used} used"
                    ));
                }
                if used > t.max_used() {
                    return Err(format!("a table is too full: {t:?}"));
                }
            }
        }
        Ok(())
    }

    /// Adds `child` under `hash`: in place in a table with room (`None`),
    /// otherwise the successor to publish. Only under the node's lock
    /// ([`super::node::Locked`]), with no child filed under that page yet.
    pub(super) fn add(&self, hash: u64, child: NodePtr) -> Option<Children> {
        match self {
            Children::Flat(v) if v.len() < FLAT_MAX => {
                let mut entries = Vec::with_capacity(v.len() + 1);
                let at = v.partition_point(|(h, _)| *h <= hash);
                entries.extend_from_slice(&v[..at]);
                entries.push((hash, child));
                entries.extend_from_slice(&v[at..]);
                Some(Children::Flat(entries))
            }
            Children::Flat(v) => {
                let entries = v.iter().map(|&(h, c)| (tag_of(h), c.0 as usize));
                let new = (tag_of(hash), child.0 as usize);
                Some(Children::Table(Table::of(entries.chain([new]).collect())))
            }
            Children::Table(t) if t.has_room() => {
                t.place(tag_of(hash), child.0 as usize);
                None
            }
            Children::Table(t) => {
                let mut entries = t.entries();
                entries.push((tag_of(hash), child.0 as usize));
                Some(Children::Table(Table::of(entries)))
            }
        }
    }

    /// Replaces the entry of `old` (filed under `hash`) by `new`, filed
    /// under the same page (a split's prefix node): in place in a table
    /// (`None`), otherwise the successor to publish. Only under the node's
    /// lock.
    pub(super) fn replace(&self, hash: u64, old: &Node, new: NodePtr) -> Option<Children> {
        match self {
            Children::Flat(v) => Some(Children::Flat(
                v.iter()
                    .map(|&(h, c)| {
                        if h == hash && std::ptr::eq(c.0, old) {
                            (h, new)
                        } else {
                            (h, c)
                        }
                    })
                    .collect(),
            )),
            Children::Table(t) => {
                match t.slot_of(hash, old) {
                    Some(i) => t.ptrs[i].store(new.0 as usize, Ordering::SeqCst),
                    None => debug_assert!(false, "replacing a child that is not there"),
                }
                None
            }
        }
    }

    /// Removes the entry of `old` (filed under `hash`): in place in a table
    /// (`Ok(None)`), otherwise the successor to publish (empty when `old`
    /// was the last child, or a smaller table); `Err` if `old` is not
    /// there. Only under the node's lock.
    pub(super) fn remove(&self, hash: u64, old: &Node) -> Result<Option<Children>, NotAChild> {
        match self {
            Children::Flat(v) => {
                let at = v
                    .iter()
                    .position(|&(h, c)| h == hash && std::ptr::eq(c.0, old))
                    .ok_or(NotAChild)?;
                let mut rest = v.clone();
                rest.remove(at);
                Ok(Some(Children::Flat(rest)))
            }
            Children::Table(t) => {
                let i = t.slot_of(hash, old).ok_or(NotAChild)?;
                // The protecting step of model 24: the slot stays filled (a
                // tombstone), so probes for children filed behind it go on.
                t.ptrs[i].store(TOMB, Ordering::SeqCst);
                // The control empties it instead.
                #[cfg(radixkv_negative = "table_tomb")]
                t.tags[i].store(NEVER, Ordering::SeqCst);
                let live = t.live.fetch_sub(1, Ordering::SeqCst) - 1;
                Ok(if live == 0 {
                    Some(Children::default())
                } else if live * 5 < t.cap() && t.cap() > MIN_CAP {
                    Some(Children::Table(Table::of(t.entries())))
                } else {
                    None
                })
            }
        }
    }

    /// Every child, for teardown.
    pub(crate) fn into_nodes(self) -> Vec<NodePtr> {
        match &self {
            Children::Flat(v) => v.iter().map(|&(_, c)| c).collect(),
            Children::Table(t) => t
                .entries()
                .into_iter()
                .map(|(_, p)| NodePtr(p as *const Node))
                .collect(),
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// A node of the test's own: the leaves it builds live until the end
    /// of the test (it never releases them while using them).
    fn node(n: &NodePtr) -> &Node {
        // SAFETY: see above; no tree, no reclamation in these tests.
        unsafe { n.node_unchecked() }
    }
    use crate::tree::node::{ImageParts, ParentPtr};
    use crate::tree::values::DeviceValues;

    fn leaf(id: u64) -> NodePtr {
        NodePtr::link(Node::new(
            id,
            false,
            1,
            ImageParts {
                parent: ParentPtr(std::ptr::null()),
                key: &[1],
                values: DeviceValues::none(),
            },
            Children::default(),
            0,
        ))
    }

    /// What publishing does, without readers: a successor replaces the
    /// current children at once.
    fn apply(c: &mut Children, next: Option<Children>) {
        if let Some(n) = next {
            *c = n;
        }
    }

    #[test]
    fn wide_children_stay_findable_through_adds_replacements_and_removals() {
        let mut c = Children::default();
        let mut all = Vec::new();
        // 600 entries with colliding hashes every 7th, in scrambled order.
        for i in 0..600u64 {
            let h = (i * 7919) % 613 / 7 * 7;
            let n = leaf(i);
            let next = c.add(h, n);
            apply(&mut c, next);
            all.push((h, n));
        }
        assert!(matches!(c, Children::Table(..)));
        assert_eq!(c.nodes().count(), 600);
        let hash_of = |n: &Node| all.iter().find(|(_, m)| std::ptr::eq(m.0, n)).unwrap().0;
        c.check(hash_of).unwrap();
        for (h, n) in &all {
            assert!(
                c.with_hash(*h).any(|x| std::ptr::eq(x, n.0)),
                "entry {} under {h}",
                node(n).id
            );
        }
        // Remove every other entry, replace the rest.
        let mut fresh = Vec::new();
        for (i, (h, n)) in all.iter().enumerate() {
            let next = if i % 2 == 0 {
                c.remove(*h, node(n)).expect("a child")
            } else {
                let f = leaf(10_000 + i as u64);
                fresh.push((*h, f));
                c.replace(*h, node(n), f)
            };
            apply(&mut c, next);
        }
        assert_eq!(c.nodes().count(), 300);
        assert!(c.nodes().all(|n| n.id >= 10_000));
        let hash_of = |n: &Node| fresh.iter().find(|(_, m)| std::ptr::eq(m.0, n)).unwrap().0;
        c.check(hash_of).unwrap();
        for (h, f) in &fresh {
            assert!(c.with_hash(*h).any(|x| std::ptr::eq(x, f.0)));
        }
        // Down to none: the table shrinks, then goes.
        for (h, f) in &fresh {
            let next = c.remove(*h, node(f)).expect("a child");
            apply(&mut c, next);
            if let Children::Table(t) = &c {
                assert!(t.live.load(Ordering::SeqCst) * 5 >= t.cap() || t.cap() == MIN_CAP);
            }
        }
        assert!(c.is_empty());
        assert!(matches!(c, Children::Flat(ref v) if v.is_empty()));
        let (h, f) = fresh[0];
        assert_eq!(c.remove(h, node(&f)).err(), Some(NotAChild), "gone already");
        for (_, n) in all.into_iter().chain(fresh) {
            // SAFETY: linked once above, released once, not used after.
            unsafe { n.release() };
        }
    }

    #[test]
    fn a_removed_slot_keeps_later_entries_of_its_probe_findable() {
        // Random hashes (runs of occupied slots form), every third removed:
        // a removal in the middle of a run must not end later probes there.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let hashes: Vec<u64> = (0..80)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x
            })
            .collect();
        let mut c = Children::default();
        let nodes: Vec<NodePtr> = (0..80).map(leaf).collect();
        for (i, n) in nodes.iter().enumerate() {
            let next = c.add(hashes[i], *n);
            apply(&mut c, next);
        }
        let Children::Table(t) = &c else {
            panic!("80 children are a table")
        };
        let used = t.used.load(Ordering::SeqCst);
        for (i, n) in nodes.iter().enumerate().step_by(3) {
            let next = c.remove(hashes[i], node(n)).expect("a child");
            assert!(next.is_none(), "removed in place");
        }
        if let Children::Table(t) = &c {
            assert_eq!(t.used.load(Ordering::SeqCst), used, "slots stay filled");
        }
        for (i, n) in nodes.iter().enumerate() {
            let found = c.with_hash(hashes[i]).any(|x| std::ptr::eq(x, n.0));
            assert_eq!(found, i % 3 != 0, "entry {i}");
        }
        // The case the test is about occurs: a live entry whose probe
        // passes a removed slot.
        let Children::Table(t) = &c else {
            panic!("still a table")
        };
        let behind_a_removal = (0..80usize)
            .filter(|i| i % 3 != 0)
            .filter(|&i| {
                let tag = tag_of(hashes[i]);
                let at = t.slot_of(hashes[i], node(&nodes[i])).unwrap();
                let mut j = t.home(tag);
                let mut passed = false;
                while j != at {
                    passed |= t.ptrs[j].load(Ordering::SeqCst) == TOMB;
                    j = (j + 1) % t.cap();
                }
                passed
            })
            .count();
        assert!(behind_a_removal > 0);
        for n in nodes {
            // SAFETY: linked once above, released once, not used after.
            unsafe { n.release() };
        }
    }

    #[test]
    fn partition_near_agrees_with_partition_point_from_any_guess() {
        let mut x = 0x1234_5678_9abc_def0u64;
        for n in [0usize, 1, 2, 3, 7, 64, 100] {
            let mut v: Vec<u64> = (0..n)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x % 50
                })
                .collect();
            v.sort_unstable();
            for target in 0..52u64 {
                for g in [0, 1, n / 2, n.saturating_sub(1), n, n + 5] {
                    assert_eq!(
                        partition_near(&v, g, |&h| h < target),
                        v.partition_point(|&h| h < target),
                        "n {n} target {target} guess {g}"
                    );
                    assert_eq!(
                        partition_near(&v, g, |&h| h <= target),
                        v.partition_point(|&h| h <= target)
                    );
                }
            }
        }
        assert_eq!(guess(5, (0, u64::MAX), 10), 0);
        assert_eq!(guess(u64::MAX, (0, u64::MAX), 10), 9);
        assert_eq!(guess(u64::MAX / 2, (0, u64::MAX), 10), 4);
    }

    #[test]
    fn page_hash_is_exact_at_page_size_one() {
        assert_eq!(page_hash(&[7]), 7);
        assert_ne!(page_hash(&[1, 2]), page_hash(&[2, 1]));
    }
}
