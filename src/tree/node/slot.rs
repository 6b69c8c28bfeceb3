//! A node's per-tier slots: for each tier (a device, or the host tier) the
//! residency word of `protocol::residency` and that tier's stamps and
//! counts, one cache line per tier when there are several.
//!
//! | atomic | ordering | why |
//! | --- | --- | --- |
//! | `residency` | see `protocol::residency` | the pin/eviction word |
//! | `last_access`, `created`, `hits`, `hits_base` | Relaxed | advisory eviction keys and statistics: read stale or in quiescent state, carry no data; `fetch_max`/`fetch_add` keep them monotone under any interleaving |
//! | `resident_children` | SeqCst | changed only under the node's lock (its order against other writers is the lock's); read unlocked by `is_leaf_on` / `is_candidate` as a hint that eviction re-checks under the lock (`leaf_check`), so no edge depends on it: SeqCst is kept because an unlocked read is in the eviction protocol's argument, and weakening it was not measured to pay |

use crate::sync::{AtomicU32, AtomicU64};
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

/// A node's tier slots. With one tier the slot lives inside the node;
/// with several, each sits on a 64-byte line of its own, so that schedulers
/// of different devices never write the same line on hot nodes.
#[derive(Debug)]
pub(crate) enum Slots {
    /// The single tier's slot.
    One(TierSlot),
    /// One line-aligned slot per tier.
    Many(Box<[SlotLine]>),
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

impl Slots {
    /// Slots for `tiers` tiers, resident where `resident(t)` says.
    pub(crate) fn new(tiers: usize, resident: impl Fn(usize) -> bool) -> Slots {
        if tiers == 1 {
            Slots::One(TierSlot::new(resident(0)))
        } else {
            Slots::Many(
                (0..tiers)
                    .map(|t| SlotLine(TierSlot::new(resident(t))))
                    .collect(),
            )
        }
    }

    /// The slot of tier `t`.
    #[inline]
    pub(crate) fn get(&self, t: usize) -> &TierSlot {
        match self {
            Slots::One(s) => {
                debug_assert_eq!(t, 0);
                s
            }
            Slots::Many(v) => &v[t],
        }
    }

    /// Every tier's slot, in tier order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &TierSlot> {
        let (one, many): (Option<&TierSlot>, &[SlotLine]) = match self {
            Slots::One(s) => (Some(s), &[]),
            Slots::Many(v) => (None, v),
        };
        one.into_iter().chain(many.iter().map(|s| &**s))
    }
}
