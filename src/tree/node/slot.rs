//! A node's per-tier slots: for each tier (a device, or the host tier) the
//! residency word of `protocol::residency` and that tier's stamps and
//! counts, one cache line per tier when there are several, allocated on
//! first use when there are many.
//!
//! | atomic | ordering | why |
//! | --- | --- | --- |
//! | `residency` | see `protocol::residency` | the pin/eviction word |
//! | `last_access`, `created`, `hits`, `hits_base` | Relaxed | advisory eviction keys and statistics: read stale or in quiescent state, carry no data; `fetch_max`/`fetch_add` keep them monotone under any interleaving |
//! | a sparse node's line pointers | Acquire loads, an AcqRel CAS from null | set once: the CAS publishes the line's initial contents to every later load; never changed or freed while the node lives |
//! | `resident_children` | SeqCst | changed only under the node's lock (its order against other writers is the lock's); read unlocked by `is_leaf_on` / `is_candidate` as a hint that eviction re-checks under the lock (`leaf_check`), so no edge depends on it: SeqCst is kept because an unlocked read is in the eviction protocol's argument, and weakening it was not measured to pay |

use crate::sync::{AtomicPtr, AtomicU32, AtomicU64, Ordering};
use crate::tree::protocol::residency::Residency;

/// The slot of one tier of a node: residency word and that tier's stamps.
#[derive(Debug)]
pub(crate) struct TierSlot {
    pub(crate) residency: Residency,
    /// Last access stamp on this tier (moves forward only: `fetch_max`).
    pub(crate) last_access: AtomicU64,
    /// Stamp of the moment this residency (or the node) was created.
    pub(crate) created: AtomicU64,
    /// Matches on this tier that consumed or ended on this node.
    pub(crate) hits: AtomicU64,
    /// `hits` when the node last became a leaf on this tier because its
    /// last resident child there was evicted: the hits since are the
    /// prefix's own (slru's promotion test). Written by that tier's
    /// evictor only.
    pub(crate) hits_base: AtomicU64,
    /// Children resident on this tier. Changed only under this node's lock.
    pub(crate) resident_children: AtomicU32,
}

impl TierSlot {
    /// A slot, resident (generation 1) or not.
    pub(crate) fn new(resident: bool) -> Self {
        TierSlot {
            residency: if resident {
                Residency::new_resident()
            } else {
                Residency::absent()
            },
            last_access: AtomicU64::new(0),
            created: AtomicU64::new(0),
            hits: AtomicU64::new(0),
            hits_base: AtomicU64::new(0),
            resident_children: AtomicU32::new(0),
        }
    }
}

/// Tiers up to which a node keeps a line per tier inline in one
/// allocation ([`Slots::Many`]); above, a pointer per tier
/// ([`Slots::Sparse`]).
pub(crate) const DENSE_TIERS: usize = 16;

/// A node's tier slots. With one tier the slot lives inside the node;
/// with a few, each sits on a 64-byte line of its own, so that schedulers
/// of different devices never write the same line on hot nodes; with many
/// (an index of every worker's ranks), a node is resident on few of them,
/// and a line per tier would be most of its memory (4 KiB at 64 tiers):
/// each tier's line is allocated the first time it is asked for.
#[derive(Debug)]
pub(crate) enum Slots {
    /// The single tier's slot.
    One(TierSlot),
    /// One line-aligned slot per tier.
    Many(Box<[SlotLine]>),
    /// A pointer per tier to its line, null until the line is first asked
    /// for by [`Slots::get`]; set once (a CAS from null) and freed with the
    /// node.
    Sparse(Box<[AtomicPtr<SlotLine>]>),
}

/// A tier slot aligned to a 64-byte cache line (its 48 bytes fill one).
/// Not `CachePadded`, which pads to 128 bytes on x86_64 against the
/// adjacent-line prefetcher: that doubled a multi-device node's size (512
/// bytes of slots at 4 devices, the largest part of a leaf) for a
/// second-order effect; the stamps a scheduler writes still never share a
/// line with another device's.
#[derive(Debug)]
#[repr(align(64))]
pub(crate) struct SlotLine(pub(crate) TierSlot);

// One line per slot, as the docs above say (loom's atomics are larger).
#[cfg(not(loom))]
const _: () = assert!(std::mem::size_of::<SlotLine>() == 64);

impl std::ops::Deref for SlotLine {
    type Target = TierSlot;
    fn deref(&self) -> &TierSlot {
        &self.0
    }
}

/// A fresh line, as a raw pointer owned by a [`Slots::Sparse`] entry.
fn new_line(resident: bool) -> *mut SlotLine {
    Box::into_raw(Box::new(SlotLine(TierSlot::new(resident))))
}

impl Slots {
    /// Slots for `tiers` tiers, resident where `resident(t)` says.
    pub(crate) fn new(tiers: usize, resident: impl Fn(usize) -> bool) -> Slots {
        if tiers == 1 {
            Slots::One(TierSlot::new(resident(0)))
        } else if tiers <= DENSE_TIERS {
            Slots::Many(
                (0..tiers)
                    .map(|t| SlotLine(TierSlot::new(resident(t))))
                    .collect(),
            )
        } else {
            Slots::Sparse(
                (0..tiers)
                    .map(|t| {
                        AtomicPtr::new(if resident(t) {
                            new_line(true)
                        } else {
                            std::ptr::null_mut()
                        })
                    })
                    .collect(),
            )
        }
    }

    /// The slot of tier `t` (for a sparse node, allocated absent if it
    /// never was).
    #[inline]
    pub(crate) fn get(&self, t: usize) -> &TierSlot {
        match self {
            Slots::One(s) => {
                debug_assert_eq!(t, 0);
                s
            }
            Slots::Many(v) => &v[t],
            Slots::Sparse(v) => {
                // Acquire: pairs with the installing CAS (Release), so the
                // line's initial contents are seen.
                let p = v[t].load(Ordering::Acquire);
                if p.is_null() {
                    install(&v[t])
                } else {
                    // SAFETY: a non-null entry points at a line allocated
                    // by `new_line`, freed only by `drop` (`&mut self`).
                    unsafe { &(*p).0 }
                }
            }
        }
    }

    /// The slot of tier `t` if it exists, without allocating one (a
    /// sparse node's tier never asked for is absent, with zero stamps).
    #[inline]
    pub(crate) fn peek(&self, t: usize) -> Option<&TierSlot> {
        match self {
            Slots::Sparse(v) => {
                // Acquire: as in `get`.
                let p = v[t].load(Ordering::Acquire);
                // SAFETY: as in `get`.
                (!p.is_null()).then(|| unsafe { &(*p).0 })
            }
            _ => Some(self.get(t)),
        }
    }

    /// Every tier's slot that exists, with its tier, in tier order (a
    /// sparse node's tiers never asked for are absent, with zero stamps).
    pub(crate) fn iter(&self) -> impl Iterator<Item = (usize, &TierSlot)> {
        let n = match self {
            Slots::One(_) => 1,
            Slots::Many(v) => v.len(),
            Slots::Sparse(v) => v.len(),
        };
        (0..n).filter_map(move |t| self.peek(t).map(|s| (t, s)))
    }
}

/// Installs an absent line in `entry` (null until now) and returns the
/// line there: ours, or another thread's that won the race.
#[cold]
fn install(entry: &AtomicPtr<SlotLine>) -> &TierSlot {
    let line = new_line(false);
    // AcqRel on success: Release publishes the line's contents to the
    // Acquire loads above; Acquire on failure: the winner's line is read.
    match entry.compare_exchange(
        std::ptr::null_mut(),
        line,
        Ordering::AcqRel,
        Ordering::Acquire,
    ) {
        // SAFETY: `line` is installed; freed only by `drop` (`&mut self`).
        Ok(_) => unsafe { &(*line).0 },
        Err(winner) => {
            // SAFETY: `line` was never shared (the CAS failed): ours to
            // free. `winner` is an installed line, as in `Slots::get`.
            unsafe {
                drop(Box::from_raw(line));
                &(*winner).0
            }
        }
    }
}

impl Drop for Slots {
    fn drop(&mut self) {
        if let Slots::Sparse(v) = self {
            for entry in v.iter() {
                // Acquire, as every load of it (`&mut self`: nothing can
                // race this one; loom's atomics have no `get_mut`).
                let p = entry.load(Ordering::Acquire);
                if !p.is_null() {
                    // SAFETY: installed by `new_line` or `install`, owned
                    // by this entry alone; `&mut self`: no reference to it
                    // remains.
                    drop(unsafe { Box::from_raw(p) });
                }
            }
        }
    }
}
