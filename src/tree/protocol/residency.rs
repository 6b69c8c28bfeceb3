//! The per-(node, tier) state word: pin count, `RESIDENT` bit and a
//! residency generation, in one atomic.
//!
//! ```text
//!  63                 33   32   31                0
//! +---------------------+----------+----------------+
//! |     generation      | RESIDENT |   pin count    |
//! +---------------------+----------+----------------+
//! ```
//!
//! * A pin is a CAS increment that succeeds only while `RESIDENT` is set (and,
//!   for a generation-checked pin, only while the generation is the one the
//!   caller saw). It never takes a lock.
//! * Eviction clears `RESIDENT` with a CAS that expects zero pins; it runs
//!   under the node's write lock, so it is also serialized with every other
//!   residency change, but against pinners only the CAS decides: either the
//!   pin lands first (eviction fails) or the eviction does (the pin fails).
//! * Becoming resident bumps the generation, so a reader that saw an earlier
//!   residency can tell it from the new one (model `residency_aba`).
//!
//! The generation has 31 bits and wraps (explicitly, leaving the pin count
//! and `RESIDENT` untouched: a unit test shows it). A wrap can only matter
//! to a reader that read generation `g` in its match walk and then, before
//! its pin CAS, saw the same (node, tier) evicted and made resident
//! again exactly 2³¹ times, so that the generation is `g` once more. Each
//! such cycle is an eviction and an insert of that node under its and its
//! parent's write locks plus an allocation, well over 100 ns, so the
//! reader would have to stall between two of its own steps (a few hundred
//! nanoseconds apart) for more than 2³¹ × 100 ns ≈ 3.6 minutes while other
//! threads did nothing but cycle that one node: not a case that occurs.
//!
//! | operation | ordering | the edge it carries |
//! | --- | --- | --- |
//! | `try_pin` CAS (and its first load) | SeqCst | the pin is the linearization point against eviction: a pinner CASes the word, then reads values through images; an eviction CASes it, then publishes an image without them. Both RMWs on one word are totally ordered, and the pinner's reads must come after whatever residency its CAS saw made resident (`make_resident` → pin: a release/acquire pair would carry it) |
//! | `try_evict` CAS | SeqCst | the other side of that race (`evict_pin_check`) |
//! | `make_resident` CAS | SeqCst | publishes the residency after its values' image (image swap → CAS → a pinner's CAS → its image loads) |
//! | `unpin` `fetch_sub` | SeqCst | one RMW (`unpin_rmw`), so a pin or an eviction CAS racing it is never lost; releases the pinner's reads before an eviction can claim the word |
//! | `load` (hints, the audit) | SeqCst | readers that decide nothing alone (`is_leaf_on`, sizes); every decision is a CAS |
//!
//! On x86-64 each of these compiles to the same instruction at AcqRel or
//! Acquire (an RMW is a locked instruction either way, a load a plain
//! load), so weakening would buy nothing there, and loom, which treats
//! SeqCst as AcqRel, could not tell a store→load edge lost: they stay
//! SeqCst.

use crate::sync::{AtomicU64, Ordering};

const PIN_MASK: u64 = 0xFFFF_FFFF;
const RESIDENT: u64 = 1 << 32;
const GEN_SHIFT: u32 = 33;
/// The generation field, after the shift: 31 bits.
const GEN_MASK: u64 = (1 << (64 - GEN_SHIFT)) - 1;

/// A decoded snapshot of a state word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ResidencyState(u64);

impl ResidencyState {
    /// The state of a residency that never existed (what
    /// [`Residency::absent`] holds).
    pub(crate) const ABSENT: ResidencyState = ResidencyState(0);

    /// Whether the node holds values on this device.
    pub(crate) fn resident(self) -> bool {
        self.0 & RESIDENT != 0
    }
    /// Live pins (leases) on this (node, tier).
    pub(crate) fn pins(self) -> u64 {
        self.0 & PIN_MASK
    }
    /// How many times this (node, tier) has become resident.
    pub(crate) fn generation(self) -> u64 {
        self.0 >> GEN_SHIFT
    }
}

/// Why a pin was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PinRefused {
    /// Not resident on this device (evicted, or never was).
    NotResident,
    /// Resident, but not the residency the caller saw (evicted and re-made).
    Stale,
    /// 2^32 - 1 pins already.
    Overflow,
}

/// The atomic state word of one (node, tier).
#[derive(Debug)]
pub(crate) struct Residency(AtomicU64);

impl Residency {
    /// A state word for a residency that does not exist yet.
    pub(crate) fn absent() -> Self {
        Residency(AtomicU64::new(0))
    }

    /// A state word for a node created resident (generation 1, no pins).
    pub(crate) fn new_resident() -> Self {
        Residency(AtomicU64::new(RESIDENT | (1 << GEN_SHIFT)))
    }

    /// The current state.
    pub(crate) fn load(&self) -> ResidencyState {
        ResidencyState(self.0.load(Ordering::SeqCst))
    }

    /// Adds a pin if resident (and, with `generation`, if still that
    /// residency). Lock-free.
    pub(crate) fn try_pin(&self, generation: Option<u64>) -> Result<ResidencyState, PinRefused> {
        let mut cur = self.0.load(Ordering::SeqCst);
        loop {
            let s = ResidencyState(cur);
            // Never pin a residency that eviction has claimed, nor (`residency_aba`) a
            // residency other than the one the caller saw.
            if !s.resident() {
                return Err(PinRefused::NotResident);
            }
            if let Some(g) = generation {
                if g != s.generation() {
                    return Err(PinRefused::Stale);
                }
            }
            if s.pins() == PIN_MASK {
                return Err(PinRefused::Overflow);
            }
            match self
                .0
                .compare_exchange(cur, cur + 1, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => return Ok(ResidencyState(cur + 1)),
                Err(actual) => cur = actual,
            }
        }
    }

    /// Releases one pin. The caller must own one (a `Lease`).
    pub(crate) fn unpin(&self) {
        self.unpin_rmw();
    }

    /// The protecting step `unpin_rmw` (model `lease_drop_vs_pin_and_evict`):
    /// a pin is released with one atomic read-modify-write, so a concurrent
    /// pin or eviction CAS on the same word is never lost. Its control
    /// releases with a load and a store instead.
    fn unpin_rmw(&self) {
        if crate::negative::removed("unpin_rmw") {
            let cur = self.0.load(Ordering::SeqCst);
            self.0.store(cur.wrapping_sub(1), Ordering::SeqCst);
            return;
        }
        let prev = self.0.fetch_sub(1, Ordering::SeqCst);
        debug_assert!(prev & PIN_MASK > 0, "unpin without a pin");
    }

    /// Claims the residency for eviction: `RESIDENT` with zero pins becomes
    /// absent, keeping the generation. Fails if pinned or not resident.
    /// Called under the node's write lock.
    pub(crate) fn try_evict(&self) -> Result<(), ResidencyState> {
        let cur = self.0.load(Ordering::SeqCst);
        let s = ResidencyState(cur);
        if !evict_pin_check(s) {
            return Err(s);
        }
        self.0
            .compare_exchange(cur, cur & !RESIDENT, Ordering::SeqCst, Ordering::SeqCst)
            .map(|_| ())
            .map_err(ResidencyState)
    }

    /// Makes an absent residency resident, bumping the generation. Called
    /// under the node's write lock, with the values already published.
    pub(crate) fn make_resident(&self) {
        let mut cur = self.0.load(Ordering::SeqCst);
        loop {
            debug_assert!(cur & RESIDENT == 0, "make_resident on a resident state");
            // The generation wraps within its 31 bits (see the module docs).
            let generation = (ResidencyState(cur).generation() + 1) & GEN_MASK;
            let next = (generation << GEN_SHIFT) | RESIDENT | (cur & PIN_MASK);
            match self
                .0
                .compare_exchange(cur, next, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => return,
                Err(actual) => cur = actual,
            }
        }
    }
}

/// The protecting step `evict_pin_check` (models `match_vs_evict` and
/// `pin_vs_evictor_candidates`): only a resident state with no pin may be
/// claimed for eviction, and the claim is a CAS from exactly that state,
/// so a pin and an eviction of the same residency never both succeed. Its
/// control lets a pinned residency be claimed.
fn evict_pin_check(s: ResidencyState) -> bool {
    if crate::negative::removed("evict_pin_check") {
        return s.resident();
    }
    s.resident() && s.pins() == 0
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn pin_requires_residency_and_generation() {
        let r = Residency::absent();
        assert_eq!(r.try_pin(None), Err(PinRefused::NotResident));
        r.make_resident();
        let g = r.load().generation();
        assert_eq!(g, 1);
        assert!(r.try_pin(Some(g)).is_ok());
        assert_eq!(r.try_pin(Some(g + 1)), Err(PinRefused::Stale));
        assert!(
            r.try_evict().is_err(),
            "pinned residency must not be evicted"
        );
        r.unpin();
        assert!(r.try_evict().is_ok());
        assert!(!r.load().resident());
        assert_eq!(r.try_pin(Some(g)), Err(PinRefused::NotResident));
        r.make_resident();
        assert_eq!(r.load().generation(), 2);
        assert_eq!(r.try_pin(Some(g)), Err(PinRefused::Stale));
    }

    /// The generation wraps from 2³¹ − 1 to 0 without touching the pin
    /// count or the `RESIDENT` bit, and pins keep working across the wrap.
    #[test]
    fn generation_wraps_without_touching_pins() {
        let top = GEN_MASK;
        // Absent after its 2³¹ − 1st residency.
        let r = Residency(AtomicU64::new(top << GEN_SHIFT));
        assert_eq!(r.load().generation(), top);
        r.make_resident();
        let s = r.load();
        assert_eq!(s.generation(), 0, "wrapped");
        assert!(s.resident());
        assert_eq!(s.pins(), 0);
        for _ in 0..3 {
            assert!(r.try_pin(Some(0)).is_ok());
        }
        assert_eq!(r.try_pin(Some(top)), Err(PinRefused::Stale));
        let s = r.load();
        assert_eq!((s.pins(), s.generation(), s.resident()), (3, 0, true));
        assert!(r.try_evict().is_err(), "pinned");
        for _ in 0..3 {
            r.unpin();
        }
        assert!(r.try_evict().is_ok());
        r.make_resident();
        assert_eq!(r.load().generation(), 1);
    }
}
