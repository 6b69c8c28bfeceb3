//! Climbs from a place in the tree (a node kept by a caller, whose key
//! ends a known number of tokens from its root) instead of walking down
//! from the root: to the node that starts at a page (to take it out), or
//! to the key of the path up to a page (to insert below it).

use crate::tree::node::Node;
use crate::tree::ops::split::Split;
use crate::tree::ops::walk::climb_to_root;
use crate::tree::protocol::lock::Locking;
use crate::tree::state::Tree;
use crossbeam_epoch::Guard;

impl Tree {
    /// [`node_starting_at`](Self::node_starting_at) found from below: the
    /// node holding the page that starts `start` tokens from the root on
    /// the path root → `place`, whose key ends `len` tokens from the root,
    /// split (if it starts before) so that it starts there. Climbs from
    /// `place` instead of walking down from the root: as many images as
    /// there are nodes between. With it, as there, the node above it that
    /// ends at `start`. `None` if `place` has left the tree, its path does
    /// not reach back to `start`, or the page there is not `page`
    /// (`start + page ≤ len` is the caller's to keep).
    pub(crate) fn node_starting_above<'g>(
        &self,
        place: &'g Node,
        len: usize,
        start: usize,
        page: &[u32],
        guard: &'g Guard,
    ) -> Option<(&'g Node, &'g Node)> {
        'climb: loop {
            // Linked now, under `guard`: its parents as its images name
            // them are not freed before `guard` ends (the climb below
            // relies on it, as `climb_to_root` does).
            if place.is_root || place.is_obsolete() {
                return None;
            }
            let mut child = place;
            let mut end = len;
            loop {
                let seen = child.image(guard);
                // SAFETY: loaded under `guard`, retired through the reclaimer.
                let img = unsafe { seen.deref() };
                let from = end.checked_sub(img.key.len())?;
                if img.parent.is_null() {
                    return None; // cut from the tree meanwhile
                }
                // SAFETY: `child` is `place` (linked during `guard`, checked
                // above) or reached from it by parent links read under
                // `guard`, so this parent was linked during `guard` and is
                // not freed before it ends (see `ParentPtr`).
                let parent: &'g Node = unsafe { &*img.parent.0 };
                if from <= start {
                    if img.key.get(start - from..start - from + page.len()) != Some(page) {
                        return None; // not the page the caller means
                    }
                    if from == start {
                        // The parent this image names ends where it starts.
                        return Some((child, parent));
                    }
                    let s = Split {
                        parent,
                        child,
                        seen,
                        at: start - from,
                        tier: None,
                        priority: None,
                        locking: Locking::Wait,
                    };
                    match self.split(s, guard) {
                        // The node object keeps the lower part: it starts
                        // at `start` now, below the new upper part.
                        Ok(upper) => return Some((child, upper)),
                        Err(_) => continue 'climb,
                    }
                }
                if parent.is_root {
                    return None; // `start` lies beyond the path's tokens
                }
                child = parent;
                end = from;
            }
        }
    }

    /// The key from the namespace's root to `end` tokens from it, on the
    /// path root → `place` (whose key ends `len` tokens from the root),
    /// read from the images climbing from `place` (appended to `out`),
    /// with the node that holds the page ending at `end`. `None` (and
    /// `out` as it was) if `place` has left the tree, its path does not
    /// reach back to `end`, or the page ending there is not `page`. The
    /// images read are a snapshot: a concurrent split changes no token of
    /// the path, only where it is cut.
    pub(crate) fn path_to<'g>(
        &self,
        place: &'g Node,
        len: usize,
        end: usize,
        page: &[u32],
        guard: &'g Guard,
        out: &mut Vec<u32>,
    ) -> Option<&'g Node> {
        // As in `node_starting_above`: linked now, so reached under
        // `guard` as the climb needs.
        if place.is_root || place.is_obsolete() || end < page.len() {
            return None;
        }
        let mut segs: Vec<&'g [u32]> = Vec::new();
        let mut holder = None;
        let mut to = len;
        climb_to_root(place, guard, |node, img| {
            let from = to.checked_sub(img.key.len())?;
            if from < end {
                // `node` holds tokens up to `end`: its part of the path.
                if holder.is_none() {
                    let at = end - from;
                    if at < page.len() || img.key.get(at - page.len()..at) != Some(page) {
                        return None; // not the page the caller means
                    }
                    holder = Some(node);
                }
                segs.push(&img.key[..end.min(to) - from]);
            }
            to = from;
            Some(())
        })?;
        if to != 0 {
            return None; // `len` is not where `place` ends
        }
        out.reserve(end);
        for s in segs.iter().rev() {
            out.extend_from_slice(s);
        }
        holder
    }
}
