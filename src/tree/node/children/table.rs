//! A wide node's children: an open-addressing hash table (linear probing)
//! changed in place under the node's lock and read without one. Adding or
//! removing a child writes one slot: no array is copied, allocated or
//! retired, whatever the node's fan-out (a copy-on-write array of 1,000
//! children cost an insert two allocations, a copy and two retirements,
//! and an eviction as much again).
//!
//! ```text
//!  tags: [ 0 | t5 | t5 | 0 | t2 | t9 | 0 | … ]    0 = never filled
//!  ptrs: [ · | n5 | ✝  | · | n2 | n9 | · | … ]    ✝ = removed (TOMB)
//!               └── probe for t5 starts at home(t5), stops at the first 0
//! ```
//!
//! The protocol (all accesses are atomic, so a reader racing a writer
//! reads each word whole):
//! * Slot `i` is a tag (`tags[i]`: [`NEVER`], or the child's [`tag_of`])
//!   and a pointer (`ptrs[i]`: the child's address, or [`TOMB`]).
//! * A slot is filled once: its pointer is stored, then its tag. A reader
//!   loads the tag, then the pointer, so a reader that sees a tag also sees
//!   that pointer or a later one.
//! * A filled slot is never emptied, and its tag never changes: a removal
//!   stores [`TOMB`] in its pointer ([`table_tomb`]); a split stores the
//!   new prefix node, which starts with the same page, so the same tag
//!   fits it. A reader stops at the first never-filled slot of its probe;
//!   since no slot goes back to never-filled, it misses only children
//!   added after it looked at that slot (a lookup is linearizable at that
//!   moment).
//! * Writers never let the filled slots (live and removed) pass three
//!   quarters of the capacity: before that, and when live children fall
//!   below a fifth of it (unless it has `MIN_CAP` slots already), the
//!   writer builds a new table of the live children and publishes it
//!   copy-on-write, like a flat array; the old table is never written
//!   again and is freed after the grace period of every reader that could
//!   hold it ([`table_retire`]).
//! * Equal tags are resolved by the reader, which compares the child's
//!   first page (as equal hashes are in a flat array).
//!
//! | atomic | ordering | why |
//! | --- | --- | --- |
//! | `ptrs[i]` store, then `tags[i]` store (fill) | SeqCst | the pointer→tag publication: a reader that loads the tag must see the pointer (Release/Acquire would carry it; SeqCst is kept: not measured to pay, the table is on the wide-node paths only) |
//! | `tags[i]`, `ptrs[i]` loads (probe) | SeqCst | the other side of that edge |
//! | `ptrs[i]` store (tombstone, split) | SeqCst | a removal or a split in place: ordered for readers by the pointer word alone |
//! | `live`, `used` | SeqCst | written under the node's lock only, read by the writer that holds it and by the audit; no reader depends on them |

use crate::sync::{AtomicU32, AtomicUsize, Ordering};
use std::marker::PhantomData;

/// The smallest table.
pub(super) const MIN_CAP: usize = 8;
/// What a slot's tag is before the slot is first filled.
const NEVER: u32 = 0;
/// What a slot's pointer becomes when its child is removed (never a
/// node's address: nodes are aligned to 8 bytes).
const TOMB: usize = 1;

/// A child's tag in a [`Table`]: 32 bits of a multiplicative mix of its page
/// hash (page hashes at page size 1 are token ids: small, consecutive
/// numbers), with the low bit set so that no tag is [`NEVER`].
pub(super) fn tag_of(hash: u64) -> u32 {
    ((hash.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) as u32) | 1
}

/// A wide node's children (see the module docs): the addresses of nodes
/// of type `N`.
pub(crate) struct Table<N> {
    tags: Box<[AtomicU32]>,
    ptrs: Box<[AtomicUsize]>,
    /// Children in the table. Written under the node's lock only.
    live: AtomicUsize,
    /// Slots ever filled (live and removed). Written under the node's lock
    /// only.
    used: AtomicUsize,
    /// The type of the nodes whose addresses the slots hold.
    nodes: PhantomData<fn() -> N>,
}

impl<N> std::fmt::Debug for Table<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Table")
            .field("capacity", &self.cap())
            .field("live", &self.live())
            .field("used", &self.used())
            .finish()
    }
}

impl<N> Drop for Table<N> {
    fn drop(&mut self) {
        // The loom probe of freed tables (a no-op without loom).
        crate::sync::probe::table_died(self.addr());
    }
}

impl<N> Table<N> {
    /// An empty table of `cap` slots.
    fn with_capacity(cap: usize) -> Table<N> {
        let t = Table {
            tags: (0..cap).map(|_| AtomicU32::new(NEVER)).collect(),
            ptrs: (0..cap).map(|_| AtomicUsize::new(0)).collect(),
            live: AtomicUsize::new(0),
            used: AtomicUsize::new(0),
            nodes: PhantomData,
        };
        crate::sync::probe::table_born(t.addr());
        t
    }

    /// A table of `entries` (tag, address), filling about half of it (so
    /// that it takes as many again before its next rebuild: measured, a
    /// rebuild every quarter of growth put the rebuilds in the insert's
    /// p99).
    pub(super) fn of(entries: Vec<(u32, usize)>) -> Table<N> {
        let t = Table::with_capacity((entries.len() * 2 + 1).max(MIN_CAP));
        for (tag, p) in entries {
            t.place(tag, p);
        }
        t
    }

    /// The table's identity for the loom probe.
    fn addr(&self) -> usize {
        self.tags.as_ptr() as usize
    }

    /// Slots.
    pub(super) fn cap(&self) -> usize {
        self.tags.len()
    }

    /// Children in the table.
    pub(super) fn live(&self) -> usize {
        self.live.load(Ordering::SeqCst)
    }

    /// Slots ever filled.
    pub(super) fn used(&self) -> usize {
        self.used.load(Ordering::SeqCst)
    }

    /// The most slots that may ever be filled (three quarters).
    pub(super) fn max_used(&self) -> usize {
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
    pub(super) fn home(&self, tag: u32) -> usize {
        ((u64::from(tag) * self.cap() as u64) >> 32) as usize
    }

    /// The addresses of the tag and the pointer of `tag`'s home slot.
    pub(super) fn home_addrs(&self, tag: u32) -> [*const u8; 2] {
        let i = self.home(tag);
        [
            (&self.tags[i] as *const AtomicU32).cast(),
            (&self.ptrs[i] as *const AtomicUsize).cast(),
        ]
    }

    /// The tag in slot `i`.
    pub(super) fn tag(&self, i: usize) -> u32 {
        self.tags[i].load(Ordering::SeqCst)
    }

    /// Whether slot `i` is a removed child's.
    #[cfg(test)]
    pub(super) fn is_tomb(&self, i: usize) -> bool {
        self.ptrs[i].load(Ordering::SeqCst) == TOMB
    }

    /// Whether slot `i` was ever filled.
    pub(super) fn is_filled(&self, i: usize) -> bool {
        self.tag(i) != NEVER
    }

    /// The slots holding `tag` (filled with it, live or removed), in probe
    /// order from its home, up to the first never-filled slot.
    pub(super) fn probe(&self, tag: u32) -> impl Iterator<Item = usize> + '_ {
        let mut i = self.home(tag);
        let mut left = self.cap();
        std::iter::from_fn(move || {
            while left > 0 {
                left -= 1;
                let t = self.tags[i].load(Ordering::SeqCst);
                // After the load (under loom a scheduling point: another
                // thread may have freed the table meanwhile).
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

    /// The address of the child in slot `i`, if live.
    pub(super) fn child_addr(&self, i: usize) -> Option<usize> {
        let p = self.ptrs[i].load(Ordering::SeqCst);
        crate::sync::probe::assert_table_live(self.addr());
        (p > TOMB).then_some(p)
    }

    /// Files `p` under `tag` in the first never-filled slot of its probe.
    /// The caller is the only writer and has checked there is room.
    pub(super) fn place(&self, tag: u32, p: usize) {
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

    /// Whether one more child fits before the table must be rebuilt.
    pub(super) fn has_room(&self) -> bool {
        self.used() < self.max_used()
    }

    /// The slot of the child at `addr` (filed under `hash`), if it is there.
    pub(super) fn slot_of(&self, hash: u64, addr: usize) -> Option<usize> {
        self.probe(tag_of(hash))
            .find(|&i| self.ptrs[i].load(Ordering::SeqCst) == addr)
    }

    /// Puts the child at `addr` into slot `i` in place of the one there (a
    /// split's prefix node, filed under the same page).
    pub(super) fn replace_at(&self, i: usize, addr: usize) {
        self.ptrs[i].store(addr, Ordering::SeqCst);
    }

    /// Removes the child in slot `i`; returns the children left.
    pub(super) fn remove_at(&self, i: usize) -> usize {
        table_tomb(self, i);
        self.live.fetch_sub(1, Ordering::SeqCst) - 1
    }

    /// The live entries, as (tag, address), with room for one more.
    pub(super) fn entries(&self) -> Vec<(u32, usize)> {
        let mut live = Vec::with_capacity(self.live() + 1);
        live.extend((0..self.cap()).filter_map(|i| {
            let p = self.ptrs[i].load(Ordering::SeqCst);
            (p > TOMB).then(|| (self.tags[i].load(Ordering::SeqCst), p))
        }));
        live
    }
}

/// The protecting step `table_tomb` (model `table_removal_vs_reader_behind_it`):
/// a removed child's slot stays filled (a tombstone pointer, its tag
/// kept), so a probe for a child filed behind it goes on past it. Its
/// control empties the slot instead.
fn table_tomb<N>(t: &Table<N>, i: usize) {
    t.ptrs[i].store(TOMB, Ordering::SeqCst);
    if crate::negative::removed("table_tomb") {
        t.tags[i].store(NEVER, Ordering::SeqCst);
    }
}

/// The protecting step `table_retire` (model
/// `two_inserts_below_a_table_that_grows`): a table replaced by a rebuild is
/// freed only after the grace period of every reader that may still hold
/// it (`retire` hands it to the reclaimer). Its control ends a replaced
/// table's life at once instead: it is marked freed for the loom probe and
/// its tags clobbered, as a reuse of its memory would, while a reader may
/// still hold it (its memory is leaked rather than freed, so that the model
/// reports the use instead of reading freed memory).
pub(super) fn table_retire<N>(old: &Table<N>, retire: impl FnOnce()) {
    if crate::negative::removed("table_retire") {
        crate::sync::probe::table_died(old.addr());
        for t in old.tags.iter() {
            t.store(NEVER, Ordering::SeqCst);
        }
        return;
    }
    retire();
}
