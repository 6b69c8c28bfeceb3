//! The namespace table: one root per namespace (`TokenKey`'s LoRA id,
//! cache salt or tenant), found in expected O(1) and reclaimed when its
//! last node leaves.
//!
//! ```text
//!  table ──► [ ∅ | e(ns="a") | ✝ | e(None) | ∅ | e(ns="b") | … ]   (2^k slots)
//!                    │                 │
//!                    ▼                 ▼
//!                  root              root ──► children …
//! ```
//!
//! An open-addressing hash table with linear probing over `2^k` slots, each
//! an atomic pointer to an immutable [`Entry`] (the namespace's hash, its
//! full name for the comparison, and its root), an empty slot (∅, null) or
//! a tombstone (✝, null tagged 1) where a namespace was removed.
//!
//! * **Readers** (`find`) load the table, then probe from the hash's slot
//!   until the name matches or an empty slot ends the run: no lock, no
//!   write, at most the table's size in steps and, at the load factor kept
//!   (at most one half, tombstones counted), about two on average.
//! * **Writers** (a namespace's first insert, a root's removal) serialize
//!   on one mutex. A new entry goes into the first empty or tombstone slot
//!   of its run with one store. When live entries and tombstones would
//!   pass half the slots, or live entries fall below an eighth of them,
//!   the writer builds a table of the right size (live entries only) and
//!   swaps it in: amortized O(1) per change. Entries are shared between
//!   the old and the new table; the old slot array is retired.
//! * **Removal** happens when an eviction unlinks the last child of a
//!   namespace root: under the root's lock (which every attach, adopt and
//!   split below it takes) the root is marked obsolete, so no later change
//!   can hang a node below it; then the root's entry becomes a tombstone
//!   and is retired (the loom model of a reclaimed root racing an insert
//!   into its namespace checks this). An insert that still found the
//!   obsolete root gets a conflict, walks again, and creates a fresh root
//!   (replacing the obsolete entry if its removal has not happened yet).
//!
//! Replaced slot arrays and removed entries are retired through the tree's
//! reclaimer (freed after the grace period by `evict` / `reclaim`, never
//! inside a reader).
//!
//! | atomic | ordering | why |
//! | --- | --- | --- |
//! | `table` (load, store) | SeqCst | a rebuilt slot array is written whole before it is published; readers load it (Acquire would carry that edge; kept SeqCst: namespaces change rarely and the load is one per walk, not measured to pay) |
//! | slot pointers (load, store, swap) | SeqCst | an entry is written whole before its slot points at it; readers load the slot |
//! | `Node::obsolete` of a root | SeqCst | see `protocol::lock` |

use crate::sync::{Arc, Mutex, Ordering};
use crate::tree::node::Node;
use crate::tree::protocol::reclaim::Retired;
use crossbeam_epoch::{Atomic, Guard, Owned, Shared};

/// The smallest table (slots).
const MIN_SLOTS: usize = 16;
/// The tag of a tombstone (a null pointer with this tag).
const TOMBSTONE: usize = 1;

/// One namespace: immutable once published.
#[derive(Debug)]
struct Entry {
    hash: u64,
    name: Option<Box<str>>,
    root: Arc<Node>,
}

/// A slot array.
#[derive(Debug)]
struct EntryTable {
    slots: Box<[Atomic<Entry>]>,
}

impl EntryTable {
    fn with_slots(n: usize) -> EntryTable {
        EntryTable {
            slots: (0..n).map(|_| Atomic::null()).collect(),
        }
    }

    fn mask(&self) -> usize {
        self.slots.len() - 1
    }
}

/// Counts the writers keep, under their mutex.
#[derive(Debug, Default)]
struct Counts {
    live: usize,
    tombstones: usize,
}

/// The namespace table of a tree.
#[derive(Debug)]
pub(crate) struct Namespaces {
    table: Atomic<EntryTable>,
    writer: Mutex<Counts>,
}

/// The hash a namespace is filed under (FNV-1a over its bytes; `None` is
/// distinct from every name, the empty one included).
fn hash_of(ns: Option<&str>) -> u64 {
    let Some(ns) = ns else {
        return 0x9e37_79b9_7f4a_7c15;
    };
    ns.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The key a namespace root carries: empty for the default namespace, and
/// for a named one its length + 1 then its bytes, four to a `u32`. Roots
/// match no tokens (readers start at their children), so the key only
/// tells a root's remover which entry to look up.
pub(crate) fn key_of(ns: Option<&str>) -> Vec<u32> {
    let Some(ns) = ns else {
        return Vec::new();
    };
    let b = ns.as_bytes();
    let mut k = Vec::with_capacity(1 + b.len().div_ceil(4));
    k.push(b.len() as u32 + 1);
    k.extend(b.chunks(4).map(|c| {
        let mut w = [0u8; 4];
        w[..c.len()].copy_from_slice(c);
        u32::from_le_bytes(w)
    }));
    k
}

/// The namespace a root's key names ([`key_of`]'s inverse).
pub(crate) fn name_of(key: &[u32]) -> Option<String> {
    let (&len, words) = key.split_first()?;
    let len = (len as usize).checked_sub(1)?;
    let bytes: Vec<u8> = words
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .take(len)
        .collect();
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

impl Default for Namespaces {
    fn default() -> Self {
        Namespaces {
            table: Atomic::new(EntryTable::with_slots(MIN_SLOTS)),
            writer: Mutex::new(Counts::default()),
        }
    }
}

impl Namespaces {
    fn table<'g>(&self, guard: &'g Guard) -> &'g EntryTable {
        // SAFETY: never null (set in `default`, only replaced by a store of
        // a new table under the writer mutex); replaced tables are retired
        // through the reclaimer, after the grace period of `guard`.
        unsafe { self.table.load(Ordering::SeqCst, guard).deref() }
    }

    /// The root of `ns`, if the namespace has one. No lock, no write.
    pub(crate) fn find<'g>(&self, ns: Option<&str>, guard: &'g Guard) -> Option<&'g Node> {
        Self::find_in(self.table(guard), ns, guard).map(|(_, e)| &*e.root)
    }

    /// The slot and entry of `ns` in `t`.
    fn find_in<'g>(
        t: &'g EntryTable,
        ns: Option<&str>,
        guard: &'g Guard,
    ) -> Option<(usize, &'g Entry)> {
        let h = hash_of(ns);
        let mask = t.mask();
        let mut i = (h as usize) & mask;
        for _ in 0..t.slots.len() {
            let p = t.slots[i].load(Ordering::SeqCst, guard);
            if p.is_null() {
                if p.tag() != TOMBSTONE {
                    return None; // an empty slot ends the run
                }
            } else {
                // SAFETY: non-null slot pointers are published entries,
                // retired (after they leave every table a reader can load)
                // through the reclaimer: alive while `guard` is.
                let e = unsafe { p.deref() };
                if e.hash == h && e.name.as_deref() == ns {
                    return Some((i, e));
                }
            }
            i = (i + 1) & mask;
        }
        None
    }

    /// The root of `ns`, creating it with `make` if the namespace has none
    /// (or only an obsolete one, whose entry is replaced). Takes the writer
    /// mutex only when it creates.
    pub(crate) fn get_or_create<'g>(
        &self,
        ns: Option<&str>,
        make: impl FnOnce() -> Node,
        guard: &'g Guard,
        retired: &mut Retired,
    ) -> &'g Node {
        if let Some(r) = self.find(ns, guard) {
            if !r.obsolete.load(Ordering::SeqCst) {
                return r;
            }
        }
        let mut counts = crate::sync::lock(&self.writer);
        let t = self.table(guard);
        let old = Self::find_in(t, ns, guard);
        if let Some((_, e)) = old {
            if !e.root.obsolete.load(Ordering::SeqCst) {
                return &e.root; // another writer created it meanwhile
            }
        }
        let entry = Owned::new(Entry {
            hash: hash_of(ns),
            name: ns.map(Box::from),
            root: Arc::new(make()),
        })
        .into_shared(guard);
        if let Some((slot, _)) = old {
            // An obsolete root whose removal has not happened yet: replace
            // it; its remover will find its root gone from the table.
            let prev = t.slots[slot].swap(entry, Ordering::SeqCst, guard);
            // SAFETY: the entry was published from an `Owned`, left the
            // table with this swap (under the writer mutex), and is retired
            // only here.
            unsafe { retired.owned(prev) };
        } else {
            let t = if (counts.live + counts.tombstones + 1) * 2 > t.slots.len() {
                let live = counts.live + 1;
                self.rebuild(&mut counts, live, guard, retired)
            } else {
                t
            };
            Self::place(t, entry, &mut counts, guard);
            counts.live += 1;
        }
        // SAFETY: just published; entries are retired only through the
        // reclaimer, after `guard`.
        &unsafe { entry.deref() }.root
    }

    /// Puts `entry` into the first empty or tombstone slot of its run.
    /// Called under the writer mutex, with room guaranteed.
    fn place<'g>(t: &EntryTable, entry: Shared<'g, Entry>, counts: &mut Counts, guard: &'g Guard) {
        // SAFETY: `entry` is a live, just-created entry.
        let h = unsafe { entry.deref() }.hash;
        let mask = t.mask();
        let mut i = (h as usize) & mask;
        loop {
            let p = t.slots[i].load(Ordering::SeqCst, guard);
            if p.is_null() {
                if p.tag() == TOMBSTONE {
                    counts.tombstones -= 1;
                }
                t.slots[i].store(entry, Ordering::SeqCst);
                return;
            }
            i = (i + 1) & mask;
        }
    }

    /// Builds a table sized for `live` entries (at most a quarter full),
    /// moves the live entries into it, publishes it and retires the old
    /// slot array. Under the writer mutex.
    fn rebuild<'g>(
        &self,
        counts: &mut Counts,
        live: usize,
        guard: &'g Guard,
        retired: &mut Retired,
    ) -> &'g EntryTable {
        let slots = (live * 4).next_power_of_two().max(MIN_SLOTS);
        let new = EntryTable::with_slots(slots);
        let old = self.table.load(Ordering::SeqCst, guard);
        // SAFETY: as in `table`.
        let old_t = unsafe { old.deref() };
        let mut moved = Counts::default();
        for s in old_t.slots.iter() {
            let p = s.load(Ordering::SeqCst, guard);
            if !p.is_null() {
                Self::place(&new, p, &mut moved, guard);
                moved.live += 1;
            }
        }
        *counts = moved;
        let new = Owned::new(new).into_shared(guard);
        self.table.store(new, Ordering::SeqCst);
        // SAFETY: the slot array was published from an `Owned`, replaced by
        // this store (under the writer mutex), and is retired only here.
        unsafe { retired.owned(old) };
        // SAFETY: just published; retired only through the reclaimer.
        unsafe { new.deref() }
    }

    /// Removes the entry whose root is `root` (if the table still holds
    /// it: a fresh root may have replaced it), leaving a tombstone, and
    /// retires the entry; shrinks the table when it has become mostly
    /// empty. Expected O(1): the namespace is read from the root's key
    /// ([`key_of`]). The caller has marked `root` obsolete under its lock.
    pub(crate) fn remove_root(&self, root: &Node, guard: &Guard, retired: &mut Retired) {
        let ns = name_of(&root.image_ref(guard).key);
        let ns = ns.as_deref();
        let mut counts = crate::sync::lock(&self.writer);
        let t = self.table(guard);
        let Some((slot, e)) = Self::find_in(t, ns, guard) else {
            return;
        };
        if !std::ptr::eq(&*e.root, root) {
            return; // replaced by a fresh root meanwhile
        }
        let p = t.slots[slot].swap(Shared::null().with_tag(TOMBSTONE), Ordering::SeqCst, guard);
        // SAFETY: the entry was published from an `Owned`, left the table
        // with this swap (under the writer mutex), and is retired only here.
        unsafe { retired.owned(p) };
        counts.live -= 1;
        counts.tombstones += 1;
        if counts.live * 8 < t.slots.len() && t.slots.len() > MIN_SLOTS {
            let live = counts.live;
            self.rebuild(&mut counts, live, guard, retired);
        }
    }

    /// Every namespace and its root.
    pub(crate) fn roots<'g>(&self, guard: &'g Guard) -> Vec<(Option<&'g str>, &'g Node)> {
        self.table(guard)
            .slots
            .iter()
            .filter_map(|s| {
                let p = s.load(Ordering::SeqCst, guard);
                // SAFETY: as in `find_in`.
                (!p.is_null()).then(|| unsafe { p.deref() })
            })
            .map(|e| (e.name.as_deref(), &*e.root))
            .collect()
    }

    /// Takes every root out, leaving an empty table (for the tree's drop).
    pub(crate) fn take_all(&mut self) -> Vec<Arc<Node>> {
        // SAFETY: `&mut self`: no reader or writer can reach the table.
        let guard = unsafe { crossbeam_epoch::unprotected() };
        let t = self.table.swap(
            Owned::new(EntryTable::with_slots(MIN_SLOTS)),
            Ordering::SeqCst,
            guard,
        );
        // SAFETY: exclusive access; `t` was the published table, now ours.
        let t = unsafe { t.into_owned() };
        let mut out = Vec::new();
        for s in t.slots.iter() {
            let p = s.load(Ordering::SeqCst, guard);
            if !p.is_null() {
                // SAFETY: exclusive access; each entry is in one slot of the
                // current table (older tables were retired and freed with the
                // tree's reclaimer, which frees slot arrays, not entries).
                out.push(unsafe { p.into_owned() }.into_box().root);
            }
        }
        out
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        drop(self.take_all());
        // SAFETY: exclusive access; the empty table `take_all` installed.
        let guard = unsafe { crossbeam_epoch::unprotected() };
        let t = self.table.swap(Shared::null(), Ordering::SeqCst, guard);
        if !t.is_null() {
            // SAFETY: exclusive access; the table is ours.
            drop(unsafe { t.into_owned() });
        }
    }
}
