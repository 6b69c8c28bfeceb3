//! Pins an insert holds while it walks: [`HeldPin`], released on drop
//! (replaced, discarded, or unwound by a panic mid-insert, so no pin
//! leaks: I6) unless handed on to the caller, who wraps it in a lease.
//! The pin itself is the CAS of `residency`; this is only its owner.

use crate::tree::node::Node;

/// A pin an insert holds on `(node, tier)`, covering `depth` tokens from
/// the root.
#[derive(Debug)]
pub(crate) struct HeldPin<'g> {
    node: &'g Node,
    tier: usize,
    depth: usize,
}

impl<'g> HeldPin<'g> {
    /// Owns a pin just taken on `(node, tier)`.
    ///
    /// # Safety
    /// The caller took a pin on `(node, tier)` (a successful `try_pin`)
    /// that nothing else will release: dropping this releases it.
    pub(crate) unsafe fn new(node: &'g Node, tier: usize, depth: usize) -> Self {
        HeldPin { node, tier, depth }
    }

    /// The node and depth, the pin handed on (no longer released here).
    pub(crate) fn hand_on(self) -> (&'g Node, usize) {
        let out = (self.node, self.depth);
        std::mem::forget(self);
        out
    }
}

impl Drop for HeldPin<'_> {
    fn drop(&mut self) {
        self.node.slot(self.tier).residency.unpin();
    }
}

/// Keeps the deeper of two pins in `kept`, releasing the other.
pub(crate) fn keep_deeper<'g>(kept: &mut Option<HeldPin<'g>>, w: HeldPin<'g>) {
    // The shallower of the two is released as it drops.
    match kept {
        Some(k) if k.depth >= w.depth => drop(w),
        _ => *kept = Some(w),
    }
}
