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
//! In a wheel built with the feature `test-hooks` and imported with
//! `RADIXKV_NEGATIVE_HOLD_GIL=1` in the environment (the GIL test's negative
//! control only: `scripts/python-package-check.sh` requires the test to fail
//! so), no call releases it. The released wheel has no such switch.
//!
//! Holding the GIL while inside the tree cannot deadlock: the tree's code
//! never takes the GIL, so a thread it waits for (a writer holding a
//! node's lock, with the GIL released) finishes without it.

use pyo3::prelude::*;
use radixkv_py_macros::py_function;
#[cfg(feature = "test-hooks")]
use std::sync::atomic::AtomicBool;
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
    if holds_always() || tokens < release_tokens() {
        return f();
    }
    py.detach(f)
}

/// The GIL test's negative control (feature `test-hooks`): set at import
/// from `RADIXKV_NEGATIVE_HOLD_GIL`.
#[cfg(feature = "test-hooks")]
static HOLD_ALWAYS: AtomicBool = AtomicBool::new(false);

/// Reads the negative control's switch (the module's initialisation, with
/// the feature `test-hooks`): `RADIXKV_NEGATIVE_HOLD_GIL=1` makes every call
/// keep the GIL.
#[cfg(feature = "test-hooks")]
pub(crate) fn read_negative_control() {
    let on = std::env::var_os("RADIXKV_NEGATIVE_HOLD_GIL").is_some_and(|v| v == "1");
    // Relaxed: a setting written once, at import, before any call can read
    // it (calls come after the import, through the GIL).
    HOLD_ALWAYS.store(on, Ordering::Relaxed);
}

/// Whether no call releases the GIL (the negative control; never in the
/// released wheel).
#[inline(always)]
fn holds_always() -> bool {
    #[cfg(feature = "test-hooks")]
    {
        // Relaxed: see `read_negative_control`.
        HOLD_ALWAYS.load(Ordering::Relaxed)
    }
    #[cfg(not(feature = "test-hooks"))]
    {
        false
    }
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
