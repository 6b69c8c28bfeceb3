//! The pause points of the tree's structural changes without feature
//! `testing` (or under loom): calls that do nothing, so that the tree calls
//! them unconditionally (`pause.rs` is the real module).

/// Where a writer could be parked (see `pause.rs`).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Point {
    Split,
    Attach,
    Adopt,
    Evict,
    Unlink,
    Located,
    Gathered,
}

/// Does nothing.
#[inline(always)]
pub(crate) fn at(_point: Point) {}

/// Does nothing.
#[inline(always)]
pub(crate) fn climbed() {}
