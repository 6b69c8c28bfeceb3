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
pub use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, AtomicUsize, Ordering};
#[cfg(not(loom))]
pub use std::sync::{Mutex, MutexGuard};
#[cfg(not(loom))]
pub use std::thread;

#[cfg(loom)]
pub use loom::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, AtomicUsize, Ordering};
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
