//! [`Block`]: what a source keeps of one block it holds, in seven words
//! (a map entry with its key in eight): every store probes these entries
//! and every removal reads one, so their size is the index's speed as
//! much as its memory. [`Places`]: the places in the tree its blocks
//! climb from, one per store, shared by the blocks it brought.

use crate::decode::{BlockHash, Medium};
use radixkv::TreePlace;

/// The bit of medium `m` in [`Block::media`].
pub(crate) fn bit(m: Medium) -> u8 {
    1 << (m as u8)
}

/// One block a source holds (or that leads to blocks it holds).
#[derive(Debug)]
pub(crate) struct Block {
    /// Its parent's hash, when it has one (`HAS_PARENT`).
    parent_hash: BlockHash,
    /// Its per-block hash ([`crate::local_hash`]): its key in the tree.
    pub(crate) local: u64,
    /// That hash's seed (its namespace's), which its children's share.
    pub(crate) seed: u64,
    /// Its first child, when it has one (`HAS_CHILD`): most blocks
    /// continue in one chain.
    child: BlockHash,
    /// Its other children. Boxed so that the field is one word (a `Vec`
    /// is three) in every block, most of which have none.
    #[allow(clippy::box_collection)]
    more: Option<Box<Vec<BlockHash>>>,
    /// Blocks from the root through it.
    pub(crate) depth: u32,
    /// Its slot in the source's [`Places`] ([`NO_PLACE`]: none): a place in
    /// the tree on its path (the end of the store that brought it, or the
    /// place above a block removed below it), from which a removal climbs
    /// instead of building the path from the root. Given up when no medium
    /// holds it.
    pub(crate) place: u32,
    /// The media holding it, a bit each ([`bit`]).
    pub(crate) media: u8,
    /// `HAS_PARENT`, `HAS_CHILD`.
    flags: u8,
}

const HAS_PARENT: u8 = 1;
const HAS_CHILD: u8 = 2;

#[cfg(target_pointer_width = "64")]
const _: () = assert!(std::mem::size_of::<Block>() == 56);

impl Block {
    /// A block below `parent` (`None`: a chain's first) with no children
    /// and no place yet.
    pub(crate) fn new(
        parent: Option<BlockHash>,
        local: u64,
        seed: u64,
        depth: u32,
        media: u8,
    ) -> Self {
        Block {
            parent_hash: parent.unwrap_or(BlockHash(0)),
            local,
            seed,
            child: BlockHash(0),
            more: None,
            depth,
            place: NO_PLACE,
            media,
            flags: if parent.is_some() { HAS_PARENT } else { 0 },
        }
    }

    /// Its parent.
    pub(crate) fn parent(&self) -> Option<BlockHash> {
        (self.flags & HAS_PARENT != 0).then_some(self.parent_hash)
    }

    /// Whether blocks were stored below it (and are still known).
    pub(crate) fn has_children(&self) -> bool {
        self.flags & HAS_CHILD != 0
    }

    /// Its children.
    pub(crate) fn children(&self) -> impl Iterator<Item = BlockHash> + '_ {
        let first = self.has_children().then_some(self.child);
        first
            .into_iter()
            .chain(self.more.iter().flat_map(|v| v.iter().copied()))
    }

    /// `h` was stored below it.
    pub(crate) fn add_child(&mut self, h: BlockHash) {
        if self.has_children() {
            self.more.get_or_insert_with(Box::default).push(h);
        } else {
            self.child = h;
            self.flags |= HAS_CHILD;
        }
    }

    /// `h` is no longer known below it (nothing if it was not).
    pub(crate) fn remove_child(&mut self, h: BlockHash) {
        if !self.has_children() {
            return;
        }
        if self.child == h {
            match self.more.as_mut().and_then(|v| v.pop()) {
                Some(next) => self.child = next,
                None => self.flags &= !HAS_CHILD,
            }
        } else if let Some(v) = self.more.as_mut() {
            if let Some(i) = v.iter().position(|&c| c == h) {
                v.swap_remove(i);
            }
        }
        if self.more.as_ref().is_some_and(|v| v.is_empty()) {
            self.more = None;
        }
    }
}

/// [`Block::place`] of a block with no place.
pub(crate) const NO_PLACE: u32 = u32::MAX;

/// The places a source's blocks climb from: a slot per place, counting
/// the blocks that name it; a slot no block names is free again.
#[derive(Debug, Default)]
pub(crate) struct Places {
    slots: Vec<Slot>,
    free: Vec<u32>,
}

#[derive(Debug)]
struct Slot {
    place: Option<TreePlace>,
    users: u32,
}

impl Places {
    /// A new slot, empty and named by no block yet (the place comes with
    /// [`set`](Self::set); one no block names goes with [`close`](Self::close)).
    pub(crate) fn open(&mut self) -> u32 {
        match self.free.pop() {
            Some(i) => i,
            None => {
                self.slots.push(Slot {
                    place: None,
                    users: 0,
                });
                u32::try_from(self.slots.len() - 1).unwrap_or(NO_PLACE)
            }
        }
    }

    /// Puts `place` in slot `i`.
    pub(crate) fn set(&mut self, i: u32, place: Option<TreePlace>) {
        if let Some(s) = self.slots.get_mut(i as usize) {
            s.place = place;
        }
    }

    /// The place of slot `i`.
    pub(crate) fn get(&self, i: u32) -> Option<&TreePlace> {
        self.slots.get(i as usize).and_then(|s| s.place.as_ref())
    }

    /// Frees slot `i` if no block names it.
    pub(crate) fn close(&mut self, i: u32) {
        if let Some(s) = self.slots.get_mut(i as usize) {
            if s.users == 0 && i != NO_PLACE {
                s.place = None;
                self.free.push(i);
            }
        }
    }

    /// Block `b` names slot `i` instead of the one it named.
    pub(crate) fn point(&mut self, b: &mut Block, i: u32) {
        if b.place == i {
            return;
        }
        self.leave(b);
        if let Some(s) = self.slots.get_mut(i as usize) {
            s.users += 1;
            b.place = i;
        }
    }

    /// Block `b` names no slot any more.
    pub(crate) fn leave(&mut self, b: &mut Block) {
        let i = std::mem::replace(&mut b.place, NO_PLACE);
        if let Some(s) = self.slots.get_mut(i as usize) {
            s.users -= 1;
            self.close(i);
        }
    }

    /// Slots in use (for tests).
    #[cfg(test)]
    fn in_use(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// Checks that each slot's count is the number of `blocks` naming it
    /// and that every slot no block names is free.
    pub(crate) fn check<'a>(&self, blocks: impl Iterator<Item = &'a Block>) -> Result<(), String> {
        let mut users = vec![0u32; self.slots.len()];
        for b in blocks {
            if b.place == NO_PLACE {
                continue;
            }
            match users.get_mut(b.place as usize) {
                Some(n) => *n += 1,
                None => {
                    return Err(format!(
                        "a block names slot {}, of {}",
                        b.place,
                        users.len()
                    ))
                }
            }
        }
        let mut free = vec![false; self.slots.len()];
        for &i in &self.free {
            match free.get_mut(i as usize) {
                Some(f) if !*f => *f = true,
                _ => return Err(format!("slot {i} is free twice, or is not a slot")),
            }
        }
        for (i, (s, n)) in self.slots.iter().zip(&users).enumerate() {
            if s.users != *n {
                return Err(format!("slot {i} counts {} users, {n} name it", s.users));
            }
            if (*n == 0) != free[i] {
                return Err(format!("slot {i}: {n} users, free {}", free[i]));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kids(b: &Block) -> Vec<u64> {
        let mut v: Vec<u64> = b.children().map(|h| h.0).collect();
        v.sort_unstable();
        v
    }

    #[test]
    fn children_come_and_go_in_any_order() {
        let mut b = Block::new(Some(BlockHash(0)), 1, 2, 3, 1);
        assert_eq!(b.parent(), Some(BlockHash(0)));
        assert!(!b.has_children());
        for h in [5, 6, 7] {
            b.add_child(BlockHash(h));
        }
        assert_eq!(kids(&b), [5, 6, 7]);
        b.remove_child(BlockHash(5)); // the inline one: another moves in
        assert_eq!(kids(&b), [6, 7]);
        b.remove_child(BlockHash(9)); // not a child
        b.remove_child(BlockHash(6));
        assert_eq!(kids(&b), [7]);
        assert!(b.more.is_none(), "an empty list is freed");
        b.remove_child(BlockHash(7));
        assert!(!b.has_children() && kids(&b).is_empty());
        b.add_child(BlockHash(8));
        assert_eq!(kids(&b), [8]);
        assert_eq!(Block::new(None, 1, 2, 1, 1).parent(), None);
    }

    #[test]
    fn a_slot_is_free_once_no_block_names_it() {
        let mut p = Places::default();
        let mut a = Block::new(None, 1, 0, 1, 1);
        let mut b = Block::new(None, 2, 0, 2, 1);
        let s = p.open();
        p.point(&mut a, s);
        p.point(&mut b, s);
        p.close(s); // named: stays
        assert_eq!(p.in_use(), 1);
        let t = p.open();
        p.point(&mut a, t);
        assert_eq!((a.place, b.place, p.in_use()), (t, s, 2));
        p.leave(&mut b);
        assert_eq!(p.in_use(), 1, "s is free once b leaves it");
        assert_eq!(p.open(), s, "and is the next opened");
        let u = p.open();
        p.close(u); // named by no block
        assert_eq!(p.in_use(), 2);
        p.leave(&mut a);
        p.leave(&mut a); // twice: nothing
        assert_eq!(p.in_use(), 1);
        // s, opened again, is named by no block and not closed.
        assert!(p.check([&a, &b].into_iter()).is_err());
        p.close(s);
        p.check([&a, &b].into_iter()).unwrap();
    }
}
