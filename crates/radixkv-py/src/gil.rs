//! When a call gives the GIL up while it walks the tree.
//!
//! Releasing the GIL costs a hand-off: with another Python thread waiting
//! for it, taking it back goes through the OS, which costs more than a
//! short walk. So a call whose key is shorter than the threshold
//! ([`release_tokens`], set by `radixkv.set_gil_release_tokens`) walks
//! with the GIL held; a longer one releases it, so that it runs beside
//! other Python threads. The default is measured (BENCHMARKS.md, "Under
//! SGLang 0.5.23"). Calls whose work does not follow a key (evictions,
//! audits, page copies) always release it.
//!
//! Built with the feature `negative-hold-gil` (the GIL test's negative
//! control only: `scripts/python-package-check.sh` builds it and requires
//! the test to fail), no call releases it.
//!
//! Holding the GIL while inside the tree cannot deadlock: the tree's code
//! never takes the GIL, so a thread it waits for (a writer holding a
//! node's lock, with the GIL released) finishes without it.

use pyo3::prelude::*;
use radixkv_py_macros::py_function;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Keys of at least this many tokens release the GIL by default.
pub(crate) const DEFAULT_RELEASE_TOKENS: usize = 131_072;

static RELEASE_TOKENS: AtomicUsize = AtomicUsize::new(DEFAULT_RELEASE_TOKENS);

/// The threshold now. Relaxed: a setting read on its own; nothing is
/// published through it.
pub(crate) fn release_tokens() -> usize {
    RELEASE_TOKENS.load(Ordering::Relaxed)
}

/// Runs `f` (the walk of a key of `tokens` tokens), with the GIL released
/// if the key is at least the threshold long.
pub(crate) fn walk<T: Send>(py: Python<'_>, tokens: usize, f: impl FnOnce() -> T + Send) -> T {
    if cfg!(feature = "negative-hold-gil") || tokens < release_tokens() {
        return f();
    }
    py.detach(f)
}

/// The key length (in tokens) from which a call that walks the tree with a
/// key releases the GIL while it walks (default 131,072).
#[py_function]
pub(crate) fn gil_release_tokens() -> usize {
    release_tokens()
}

/// Sets [`gil_release_tokens`] for the process: 0 releases the GIL on every
/// call; a huge value never does (SGLang calls its cache from one
/// scheduler thread, where a release is a cost with nothing to gain).
#[py_function]
pub(crate) fn set_gil_release_tokens(tokens: usize) {
    RELEASE_TOKENS.store(tokens, Ordering::Relaxed);
}
