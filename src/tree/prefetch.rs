//! Hints to the CPU: start loading what a walk or an eviction reads next,
//! so that its chain of cache misses overlaps instead of adding up. Nothing
//! here changes what the program reads; under loom every hint is a no-op
//! (the reads would add scheduling points to the models for no behaviour).

use crate::tree::node::Node;
use crossbeam_epoch::Guard;

/// Asks the CPU to start loading `tokens` (a key about to be walked) into
/// the cache, so that reading it overlaps the walk's own chain of misses on
/// the tree instead of following it: a query's key usually comes from
/// memory the cache has not seen (a new request), and reading it once is
/// most of what a match costs (the peer bench's `floor-read-tokens`).
#[inline]
pub(crate) fn prefetch(tokens: &[u32]) {
    for line in tokens.chunks(16) {
        prefetch_line(line.as_ptr().cast());
    }
}

/// Asks the CPU to start loading the cache line at `p` (a hint: nothing
/// is read that the program sees; a no-op off x86-64 and under loom).
#[inline]
pub(crate) fn prefetch_line(p: *const u8) {
    #[cfg(all(target_arch = "x86_64", not(loom)))]
    // SAFETY: `_mm_prefetch` is a hint: it reads nothing the program sees
    // and never faults, whatever the address. SSE is part of the x86-64
    // baseline, so the instruction exists.
    unsafe {
        std::arch::x86_64::_mm_prefetch(p.cast::<i8>(), std::arch::x86_64::_MM_HINT_T0)
    };
    #[cfg(not(all(target_arch = "x86_64", not(loom))))]
    let _ = p;
}

/// Asks the CPU to start loading the node `n`'s two lines (a hint, for a
/// node a walk reaches next).
#[inline]
pub(crate) fn prefetch_node_lines(n: &Node) {
    let at = (n as *const Node).cast::<u8>();
    prefetch_line(at);
    prefetch_line(at.wrapping_add(64));
}

/// Asks the CPU to start loading the first `lines` lines of `n`'s image
/// (its 40-byte head, then its key: 16 lines hold the head and the first
/// 246 tokens; lines past a shorter image are loaded for nothing, which is
/// harmless). Reads `n`'s image pointer, so it is meant for a node whose
/// lines were asked for earlier.
#[inline]
pub(crate) fn prefetch_image(n: &Node, lines: usize, guard: &Guard) {
    #[cfg(not(loom))]
    {
        // Relaxed: only the address is used, as a hint; a stale one
        // prefetches lines nobody reads, which is harmless.
        let img = crate::tree::node::image_addr(
            n.image.load(std::sync::atomic::Ordering::Relaxed, guard),
        ) as *const u8;
        for line in 0..lines {
            prefetch_line(img.wrapping_add(64 * line));
        }
    }
    #[cfg(loom)]
    let _ = (n, lines, guard);
}

/// Asks the CPU to start loading what validating and evicting the leaf `n`
/// on tier `t` reads first (a hint, for a candidate that is about to be
/// taken): the node's two lines and, with `deep`, its slot for `t` and the
/// first two lines of its image (the head, and the first page of the key
/// that files it in its parent). `deep` reads the node itself (the slot
/// array's and the image's addresses), so it is meant for a node whose
/// lines were asked for earlier.
#[inline]
pub(crate) fn prefetch_node(n: &Node, t: usize, deep: bool, guard: &Guard) {
    #[cfg(not(loom))]
    {
        prefetch_node_lines(n);
        if deep {
            prefetch_line((n.slot(t) as *const crate::tree::node::TierSlot).cast());
            prefetch_image(n, 2, guard);
        }
    }
    #[cfg(loom)]
    let _ = (n, t, deep, guard);
}
