//! Children of a node: [`Children`], either a flat sorted array replaced
//! copy-on-write (up to `FLAT_MAX` entries, `flat.rs`) or, for a wide node
//! (a system prompt with thousands of continuations), an open-addressing
//! [`Table`] changed in place (`table.rs`); and [`page_hash`], the hash a
//! child is filed under.
//!
//! | file | what it holds |
//! | --- | --- |
//! | `mod.rs` | [`Children`], the choice between the two forms, [`page_hash`] |
//! | `flat.rs` | the sorted array: search and copy-on-write successors |
//! | `table.rs` | the wide node's table and its protecting steps (`table_tomb`, `table_retire`) |
//!
//! Generic over the child type `N`, so that nothing here names a node.

mod flat;
mod table;

use crate::tree::node::ptr::Link;
use flat::ChildEntry;
use table::{tag_of, Table, MIN_CAP};

/// Children arrays up to this size are one flat array; a node with more
/// has a [`Table`].
#[cfg(not(loom))]
const FLAT_MAX: usize = 64;
/// Under loom a table comes early, so that a model reaches one with a few
/// nodes (each slot is a pair of loom atomics, each access a scheduling
/// point).
#[cfg(loom)]
const FLAT_MAX: usize = 4;

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
/// slots). A node that became wide keeps a table (shrunk as children go)
/// until it has no child left.
///
/// Dropping children frees their own allocations only, never a node (the
/// tree releases its references to nodes itself).
#[derive(Debug)]
pub(crate) enum Children<N> {
    /// Up to `FLAT_MAX` entries, sorted by hash.
    Flat(Vec<ChildEntry<N>>),
    /// A wide node's table.
    Table(Table<N>),
}

impl<N> Default for Children<N> {
    fn default() -> Self {
        Children::Flat(Vec::new())
    }
}

/// The child at `addr`, a live entry of a table.
///
/// # Safety
/// As [`Link::node_unchecked`]: a live slot holds the address of a node
/// that was linked while the table was its parent's current one (stored
/// before its tag). The reader loaded the table while it was current,
/// under a guard that the returned borrow does not outlive (children are
/// read through `Node::children_ref(guard)`); a node is unlinked (its slot
/// tombstoned, in this table or a later one) before its tree reference is
/// retired, so its release waits for that guard even if the slot is read
/// after the unlink (a retired table keeps the address).
unsafe fn table_child<'a, N>(addr: usize) -> &'a N {
    // SAFETY: the caller's contract.
    unsafe { &*(addr as *const N) }
}

impl<N> Children<N> {
    /// One flat array of (page hash, child) entries.
    pub(crate) fn flat(entries: Vec<(u64, Link<N>)>) -> Children<N> {
        Children::Flat(entries)
    }

    /// Whether there are no children.
    pub(crate) fn is_empty(&self) -> bool {
        match self {
            Children::Flat(v) => v.is_empty(),
            Children::Table(t) => t.live() == 0,
        }
    }

    /// The children that may be filed under `hash` (usually one): every
    /// child whose page hash is `hash`, and in a table possibly others
    /// with the same tag. The caller compares each one's first page.
    ///
    /// A flat array's search starts where a uniformly distributed hash
    /// would be (page hashes are 64-bit mixes) and widens from there; a
    /// table's is one probe from the tag's home.
    pub(crate) fn with_hash(&self, hash: u64) -> impl Iterator<Item = &N> {
        let (flat, table): (&[ChildEntry<N>], Option<&Table<N>>) = match self {
            Children::Flat(v) => (flat::with_hash(v, hash), None),
            Children::Table(t) => (&[], Some(t)),
        };
        flat.iter()
            // SAFETY: the entries are this array's, and arrays are read only
            // through `children_ref(guard)`, whose borrow (and so this
            // iterator's) the guard outlives.
            .map(|(_, c)| unsafe { c.node_unchecked() })
            .chain(table.into_iter().flat_map(move |t| {
                t.probe(tag_of(hash))
                    .filter_map(|i| t.child_addr(i))
                    // SAFETY: a live entry of a table read as above.
                    .map(|a| unsafe { table_child::<N>(a) })
            }))
    }

    /// The addresses a lookup of `hash` ([`Children::with_hash`]) reads
    /// first: a table's home slot for the hash (its tag and its pointer),
    /// a flat array's start (for a hint: nothing is read here but the
    /// table's and the array's own fields).
    pub(crate) fn probe_addrs(&self, hash: u64) -> [*const u8; 2] {
        match self {
            Children::Flat(v) => [v.as_ptr().cast(), v.as_ptr().cast()],
            Children::Table(t) => t.home_addrs(tag_of(hash)),
        }
    }

    /// Every child (a flat array's in hash order).
    pub(crate) fn nodes(&self) -> impl DoubleEndedIterator<Item = &N> {
        let (flat, table): (&[ChildEntry<N>], Option<&Table<N>>) = match self {
            Children::Flat(v) => (v, None),
            Children::Table(t) => (&[], Some(t)),
        };
        let slots = table.map_or(0, Table::cap);
        flat.iter()
            // SAFETY: as in `with_hash`: the references live no longer than
            // this array's borrow, which its guard outlives.
            .map(|(_, c)| unsafe { c.node_unchecked() })
            .chain((0..slots).filter_map(move |i| {
                let a = table.and_then(|t| t.child_addr(i))?;
                // SAFETY: a live entry of a table read as in `with_hash`.
                Some(unsafe { table_child::<N>(a) })
            }))
    }

    /// Checks the filing of every child against `hash_of` (its page hash):
    /// a flat array sorted and filed under the hashes, a table's children
    /// each found by its own probe, its counts right. `id_of` names a child
    /// in the error.
    pub(crate) fn check(
        &self,
        hash_of: impl Fn(&N) -> u64,
        id_of: impl Fn(&N) -> u64,
    ) -> Result<(), String> {
        match self {
            Children::Flat(v) => {
                for (i, (h, c)) in v.iter().enumerate() {
                    // SAFETY: as in `with_hash`.
                    let n = unsafe { c.node_unchecked() };
                    if hash_of(n) != *h {
                        return Err(format!("node {} is filed under another page", id_of(n)));
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
                    used += usize::from(t.is_filled(i));
                    let Some(a) = t.child_addr(i) else {
                        continue;
                    };
                    live += 1;
                    // SAFETY: a live entry of a table read as in `with_hash`.
                    let n = unsafe { table_child::<N>(a) };
                    let h = hash_of(n);
                    if t.tag(i) != tag_of(h) || t.slot_of(h, a) != Some(i) {
                        return Err(format!("node {} is filed under another page", id_of(n)));
                    }
                }
                if live != t.live() || used != t.used() {
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
    /// (`protocol::lock`), with no child filed under that page yet.
    pub(crate) fn add(&self, hash: u64, child: Link<N>) -> Option<Children<N>> {
        match self {
            Children::Flat(v) if v.len() < FLAT_MAX => {
                Some(Children::Flat(flat::added(v, hash, child)))
            }
            Children::Flat(v) => {
                let entries = v.iter().map(|&(h, c)| (tag_of(h), c.addr()));
                let new = (tag_of(hash), child.addr());
                Some(Children::Table(Table::of(entries.chain([new]).collect())))
            }
            Children::Table(t) if t.has_room() => {
                t.place(tag_of(hash), child.addr());
                None
            }
            Children::Table(t) => {
                let mut entries = t.entries();
                entries.push((tag_of(hash), child.addr()));
                Some(Children::Table(Table::of(entries)))
            }
        }
    }

    /// Replaces the entry of `old` (filed under `hash`) by `new`, filed
    /// under the same page (a split's prefix node): in place in a table
    /// (`None`), otherwise the successor to publish. Only under the node's
    /// lock.
    pub(crate) fn replace(&self, hash: u64, old: &N, new: Link<N>) -> Option<Children<N>> {
        let old = old as *const N as usize;
        match self {
            Children::Flat(v) => Some(Children::Flat(flat::replaced(v, hash, old, new))),
            Children::Table(t) => {
                match t.slot_of(hash, old) {
                    Some(i) => t.replace_at(i, new.addr()),
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
    pub(crate) fn remove(&self, hash: u64, old: &N) -> Result<Option<Children<N>>, NotAChild> {
        let old = old as *const N as usize;
        match self {
            Children::Flat(v) => Ok(Some(Children::Flat(
                flat::removed(v, hash, old).ok_or(NotAChild)?,
            ))),
            Children::Table(t) => {
                let i = t.slot_of(hash, old).ok_or(NotAChild)?;
                let live = t.remove_at(i);
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

    /// Ends the life of children just replaced by a successor: `retire`
    /// hands them to the reclaimer (a table through its protecting step,
    /// `table_retire`).
    pub(crate) fn retire_replaced(&self, retire: impl FnOnce()) {
        match self {
            Children::Table(t) => table::table_retire(t, retire),
            Children::Flat(_) => retire(),
        }
    }

    /// Every child, for teardown.
    pub(crate) fn into_links(self) -> Vec<Link<N>> {
        match &self {
            Children::Flat(v) => v.iter().map(|&(_, c)| c).collect(),
            Children::Table(t) => t
                .entries()
                .into_iter()
                // SAFETY: a table holds the addresses of the links filed in
                // it, each still held by the tree (this is teardown).
                .map(|(_, p)| unsafe { Link::from_addr(p) })
                .collect(),
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// A child of the tests' own (the children know no node type).
    #[derive(Debug)]
    struct Leaf {
        id: u64,
    }

    /// A leaf the test built: it lives until the end of the test (the test
    /// never releases it while using it).
    fn node(n: &Link<Leaf>) -> &Leaf {
        // SAFETY: see above; no tree, no reclamation in these tests.
        unsafe { n.node_unchecked() }
    }

    fn leaf(id: u64) -> Link<Leaf> {
        Link::new(Leaf { id })
    }

    /// What publishing does, without readers: a successor replaces the
    /// current children at once.
    fn apply(c: &mut Children<Leaf>, next: Option<Children<Leaf>>) {
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
        let hash_of = |n: &Leaf| all.iter().find(|(_, m)| m.is(n)).unwrap().0;
        c.check(hash_of, |n| n.id).unwrap();
        for (h, n) in &all {
            assert!(
                c.with_hash(*h).any(|x| n.is(x)),
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
        let hash_of = |n: &Leaf| fresh.iter().find(|(_, m)| m.is(n)).unwrap().0;
        c.check(hash_of, |n| n.id).unwrap();
        for (h, f) in &fresh {
            assert!(c.with_hash(*h).any(|x| f.is(x)));
        }
        // Down to none: the table shrinks, then goes.
        for (h, f) in &fresh {
            let next = c.remove(*h, node(f)).expect("a child");
            apply(&mut c, next);
            if let Children::Table(t) = &c {
                assert!(t.live() * 5 >= t.cap() || t.cap() == MIN_CAP);
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
        let nodes: Vec<Link<Leaf>> = (0..80).map(leaf).collect();
        for (i, n) in nodes.iter().enumerate() {
            let next = c.add(hashes[i], *n);
            apply(&mut c, next);
        }
        let Children::Table(t) = &c else {
            panic!("80 children are a table")
        };
        let used = t.used();
        for (i, n) in nodes.iter().enumerate().step_by(3) {
            let next = c.remove(hashes[i], node(n)).expect("a child");
            assert!(next.is_none(), "removed in place");
        }
        if let Children::Table(t) = &c {
            assert_eq!(t.used(), used, "slots stay filled");
        }
        for (i, n) in nodes.iter().enumerate() {
            let found = c.with_hash(hashes[i]).any(|x| n.is(x));
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
                let at = t.slot_of(hashes[i], nodes[i].addr()).unwrap();
                let mut j = t.home(tag);
                let mut passed = false;
                while j != at {
                    passed |= t.is_tomb(j);
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
                        flat::partition_near(&v, g, |&h| h < target),
                        v.partition_point(|&h| h < target),
                        "n {n} target {target} guess {g}"
                    );
                    assert_eq!(
                        flat::partition_near(&v, g, |&h| h <= target),
                        v.partition_point(|&h| h <= target)
                    );
                }
            }
        }
        assert_eq!(flat::guess(5, (0, u64::MAX), 10), 0);
        assert_eq!(flat::guess(u64::MAX, (0, u64::MAX), 10), 9);
        assert_eq!(flat::guess(u64::MAX / 2, (0, u64::MAX), 10), 4);
    }

    #[test]
    fn page_hash_is_exact_at_page_size_one() {
        assert_eq!(page_hash(&[7]), 7);
        assert_ne!(page_hash(&[1, 2]), page_hash(&[2, 1]));
    }
}
