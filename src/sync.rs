//! The one place where concurrent code gets its atomics, locks and threads.
//!
//! Normally these are `std`'s; under `cfg(loom)` they are loom's, so the
//! tree's protocol code is model-checked exactly as it runs in production
//! (see `loom-tests/`). crossbeam-epoch switches to loom by itself under
//! `--cfg crossbeam_loom`.
//!
//! `Arc` is always `std::sync::Arc`: reference counts of nodes and arrays are
//! not part of any protocol the models check (ownership, not ordering), and
//! loom's `Arc` would report the epoch collector's deferred garbage as leaks.

#[cfg(not(loom))]
pub use std::sync::atomic::{
    AtomicBool, AtomicI64, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};
#[cfg(not(loom))]
pub use std::sync::{Mutex, MutexGuard};
#[cfg(not(loom))]
pub use std::thread;

#[cfg(loom)]
pub use loom::sync::atomic::{
    AtomicBool, AtomicI64, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};
#[cfg(loom)]
pub use loom::sync::{Mutex, MutexGuard};
#[cfg(loom)]
pub use loom::thread;

pub use std::sync::Arc;

/// Locks `m`, ignoring poisoning: the tree never panics while holding a node
/// lock on purpose, and a poisoned lock protects no torn state here because
/// every change under it is published by one atomic swap.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

/// Locks `m` if it is free, without waiting (poisoning ignored, as in
/// [`lock`]); `None` if another thread holds it.
pub fn try_lock<T>(m: &Mutex<T>) -> Option<MutexGuard<'_, T>> {
    match m.try_lock() {
        Ok(g) => Some(g),
        // loom's mutex reports with std's error type too.
        Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => None,
    }
}

/// One step of a wait for another thread's short critical section.
///
/// Under loom this yields so the model checker can schedule the thread that
/// holds the lock; otherwise it is a CPU spin hint.
pub fn spin_wait() {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    std::hint::spin_loop();
}

/// A scheduling point for the model checker where the real code has none
/// (loom preempts only at its own operations): under loom it yields,
/// otherwise it does nothing.
#[inline(always)]
pub fn model_point() {
    #[cfg(loom)]
    loom::thread::yield_now();
}

/// Without loom: the same calls as loom's probe, doing nothing, so that
/// the tree calls them unconditionally.
#[cfg(not(loom))]
pub(crate) mod probe {
    /// See the loom twin.
    #[inline(always)]
    pub(crate) fn born(_addr: usize) {}
    /// See the loom twin.
    #[inline(always)]
    pub(crate) fn died(_addr: usize) {}
    /// See the loom twin.
    #[inline(always)]
    pub(crate) fn table_born(_addr: usize) {}
    /// See the loom twin.
    #[inline(always)]
    pub(crate) fn table_died(_addr: usize) {}
    /// See the loom twin.
    #[inline(always)]
    pub(crate) fn assert_table_live(_addr: usize) {}
    /// See the loom twin.
    #[inline(always)]
    pub(crate) fn assert_live(_addr: usize) {}
}

/// Under loom only: a registry of live key/value images and children
/// tables, so the epoch models (`replaced_image_outlives_its_reader`,
/// `two_inserts_below_a_table_that_grows`) can tell a reader that
/// dereferences a freed one without reading freed memory. Addresses are
/// registered when an image is boxed (a table allocated) and removed when it
/// is dropped (freed).
#[cfg(loom)]
pub mod probe {
    use std::collections::HashSet;
    use std::sync::Mutex;

    const IMAGE: u8 = 0;
    const TABLE: u8 = 1;

    static LIVE: Mutex<Option<HashSet<(u8, usize)>>> = Mutex::new(None);

    fn with<R>(f: impl FnOnce(&mut HashSet<(u8, usize)>) -> R) -> R {
        let mut g = match LIVE.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        f(g.get_or_insert_with(HashSet::new))
    }

    /// Records that an image now lives at `addr`.
    pub fn born(addr: usize) {
        with(|s| s.insert((IMAGE, addr)));
    }

    /// Records that the image at `addr` was freed.
    pub fn died(addr: usize) {
        with(|s| s.remove(&(IMAGE, addr)));
    }

    /// Records that a children table now lives at `addr`.
    pub fn table_born(addr: usize) {
        with(|s| s.insert((TABLE, addr)));
    }

    /// Records that the children table at `addr` was freed.
    pub fn table_died(addr: usize) {
        with(|s| s.remove(&(TABLE, addr)));
    }

    /// Panics if the children table at `addr` was freed.
    pub fn assert_table_live(addr: usize) {
        assert!(
            with(|s| s.contains(&(TABLE, addr))),
            "use after free: a reader still holds a children table that was freed"
        );
    }

    /// Panics if the image at `addr` was freed.
    pub fn assert_live(addr: usize) {
        assert!(
            with(|s| s.contains(&(IMAGE, addr))),
            "use after free: a reader still holds an image that was freed"
        );
    }
}
