//! The insert walk: down a namespace's key, splitting the node the key
//! leaves inside, adopting the caller's values into nodes not resident on
//! the writer's tier, and attaching a leaf for the rest (`attach.rs`);
//! with a pin, pinning hand over hand as it goes.

use crate::sync::{spin_wait, Ordering};
use crate::tree::node::Node;
use crate::tree::ops::attach::{Adopt, Attach, Writer};
use crate::tree::ops::split::Split;
use crate::tree::ops::walk::Step;
use crate::tree::prefetch::prefetch;
use crate::tree::protocol::lock::Locking;
use crate::tree::protocol::pin::{keep_deeper, HeldPin};
use crate::tree::state::{Conflict, StoreAt, Tree};
use crossbeam_epoch::Guard;
use std::ops::Range;

/// Inserts free retired objects themselves once this many are waiting
/// (normally the evictor does, so that matches never pay for it)...
const RECLAIM_AT: usize = 1024;
/// ...a small share each (`Reclaimer::reclaim_some`): an insert retires
/// about one object (its parent's old children array, when flat), so
/// freeing twice that per insert drains the backlog, and spreads the work
/// evenly: no insert pays for thousands (a millisecond outlier) or even for
/// dozens (a step in the insert's p99).
const RECLAIM_STEP: usize = 4;

/// An insert to make: `tokens` in namespace `ns`, with one value each, for
/// `writer`.
#[derive(Debug)]
pub(crate) struct Insert<'a> {
    pub(crate) ns: Option<&'a str>,
    pub(crate) tokens: &'a [u32],
    pub(crate) values: &'a [u32],
    pub(crate) writer: Writer,
}

/// What an insert did.
#[derive(Debug)]
pub(crate) struct InsertWalk<'g> {
    /// Ranges of the caller's values that the tree now owns.
    pub(crate) adopted: Vec<Range<usize>>,
    /// With a pin: the deepest node of the key the insert holds a pin on
    /// (for the caller's lease), and the tokens root → it covers.
    pub(crate) pinned: Option<(&'g Node, usize)>,
    /// The node whose key ends where the inserted key ends (`None` for an
    /// empty key, or a walk that stopped early: part of what it adopted was
    /// evicted meanwhile).
    pub(crate) end: Option<&'g Node>,
}

/// Appends `r`, merging it into the last range when they touch.
fn push_range(v: &mut Vec<Range<usize>>, r: Range<usize>) {
    match v.last_mut() {
        Some(last) if last.end == r.start => last.end = r.end,
        _ => v.push(r),
    }
}

/// Whether `r` overlaps a range of `adopted`.
fn overlaps(adopted: &[Range<usize>], r: Range<usize>) -> bool {
    adopted.iter().any(|a| a.start < r.end && r.start < a.end)
}

impl Tree {
    /// Inserts `a.tokens` with `a.values` on the writer's tier. Returns the
    /// ranges of the values the tree adopted; the rest are duplicates the
    /// caller keeps.
    ///
    /// With a pin, the walk pins hand over hand: every node it passes,
    /// adopts or creates is pinned on the tier in the same step (inside the
    /// locked section for nodes it makes resident), and the previous pin is
    /// released only after the next is held, so nothing the insert adopted
    /// can be evicted before the caller holds the final pin. A walk that
    /// restarts keeps its deepest pin until the new walk is done.
    pub(crate) fn insert<'g>(&self, a: Insert<'_>, guard: &'g Guard) -> InsertWalk<'g> {
        let Insert {
            ns,
            tokens,
            values,
            writer,
        } = a;
        let t = writer.tier;
        let mut adopted: Vec<Range<usize>> = Vec::new();
        let len = tokens.len();
        prefetch(tokens);
        let stamp = self.tick(t);
        // The backlog is looked at by one insert in four per tier (the
        // counter is written by hand-overs on any thread: reading it on
        // every insert would often be a miss), which then frees four
        // inserts' share.
        if stamp.is_multiple_of(4) && self.reclaimer.pending() > RECLAIM_AT {
            self.reclaimer.reclaim_some(4 * RECLAIM_STEP);
        }
        // With hits counted on inserts: the end offset up to which nodes
        // have had this insert's hit (a pass that restarts walks the same
        // path again and counts no node twice; a node split meanwhile took
        // its counted hits with it).
        let mut counted_to = writer.count_from;
        // Pins: `walk` is this pass's deepest pin, `kept` a pin kept across a
        // restart (protecting the path adopted so far) until the end. Both
        // are `HeldPin`s: replaced, dropped or unwound (a panic mid-insert),
        // a pin is released; only the one handed on at the end survives.
        let mut walk: Option<HeldPin<'g>> = None;
        let mut kept: Option<HeldPin<'g>> = None;
        let mut end = None;
        if len == 0 {
            // Nothing to cache: no namespace root is created for it.
            return InsertWalk {
                adopted,
                pinned: None,
                end: None,
            };
        }
        'restart: loop {
            let root = self.root_or_create(ns, guard);
            root.raise_priority(writer.priority);
            let mut cur = root;
            let mut pos = 0;
            while pos < len {
                match self.step(cur, &tokens[pos..], guard) {
                    Step::None => {
                        if overlaps(&adopted, pos..len) {
                            // Part of what we adopted was evicted meanwhile;
                            // its values are no longer ours to hand out.
                            break 'restart;
                        }
                        let leaf = Attach {
                            parent: cur,
                            at: StoreAt {
                                ns,
                                path: tokens,
                                start: pos,
                            },
                            values: &values[pos..],
                            writer,
                        };
                        match self.attach_leaf(leaf, guard) {
                            Ok((leaf, pin)) => {
                                end = Some(leaf);
                                push_range(&mut adopted, pos..len);
                                if let Some(p) = pin {
                                    // The old pin is released as it is replaced.
                                    walk = Some(p);
                                }
                                break 'restart;
                            }
                            Err(Conflict) => {
                                spin_wait();
                                // As every restart: the deepest pin so far
                                // protects what was adopted until the new
                                // walk holds its own.
                                if let Some(w) = walk.take() {
                                    keep_deeper(&mut kept, w);
                                }
                                continue 'restart;
                            }
                        }
                    }
                    Step::Found(child, img, k) => {
                        child.stamp(t, stamp);
                        // SAFETY: loaded under `guard`, retired through the
                        // reclaimer.
                        let node = if k < unsafe { img.deref() }.key.len() {
                            let s = Split {
                                parent: cur,
                                child,
                                seen: img,
                                at: k,
                                tier: Some(t),
                                priority: Some(writer.priority),
                                locking: Locking::Wait,
                            };
                            match self.split(s, guard) {
                                Ok(p) => p,
                                Err(_) => {
                                    spin_wait();
                                    continue;
                                }
                            }
                        } else {
                            child.raise_priority(writer.priority);
                            child
                        };
                        if !node.resident(t) {
                            if overlaps(&adopted, pos..pos + k) {
                                break 'restart;
                            }
                            let adopt = Adopt {
                                parent: cur,
                                node,
                                at: StoreAt {
                                    ns,
                                    path: &tokens[..pos + k],
                                    start: pos,
                                },
                                values: &values[pos..pos + k],
                                writer,
                            };
                            match self.adopt(adopt, guard) {
                                Ok(pin) => {
                                    push_range(&mut adopted, pos..pos + k);
                                    if let Some(p) = pin {
                                        walk = Some(p);
                                    }
                                }
                                Err(Conflict) => {
                                    spin_wait();
                                    if let Some(w) = walk.take() {
                                        keep_deeper(&mut kept, w);
                                    }
                                    continue 'restart;
                                }
                            }
                        } else if writer.pin {
                            if node.slot(t).residency.try_pin(None).is_err() {
                                // Evicted since we looked: walk again.
                                spin_wait();
                                if let Some(w) = walk.take() {
                                    keep_deeper(&mut kept, w);
                                }
                                continue 'restart;
                            }
                            // SAFETY: the pin just taken, released only by this.
                            walk = Some(unsafe { HeldPin::new(node, t, pos + k) });
                        }
                        if counted_to.is_some_and(|done| pos + k > done) {
                            // Relaxed: a statistic (see the slot's docs).
                            node.slot(t).hits.fetch_add(1, Ordering::Relaxed);
                            counted_to = Some(pos + k);
                        }
                        pos += k;
                        cur = node;
                    }
                }
            }
            // The walk reached the key's end at `cur` (a node, not the
            // root: the key is not empty).
            end = Some(cur);
            break;
        }
        // The kept pin protected the path while we walked again; the walk's
        // own pin (deeper or equal) now does, and the kept one is released
        // as it drops here.
        let pinned = walk.or(kept).map(HeldPin::hand_on);
        InsertWalk {
            adopted,
            pinned,
            end,
        }
    }
}
