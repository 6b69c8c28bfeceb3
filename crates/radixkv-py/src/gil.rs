//! The step the GIL test (`tests/test_core.py`) relies on, as one function
//! with its negative control: an insert walks the tree with the GIL
//! released. Built with the feature `negative-hold-gil` (the control only:
//! `scripts/python-package-check.sh` builds it and requires the test to
//! fail), the insert keeps the GIL.

use pyo3::prelude::*;

/// Runs `f` (a walk of the tree) with the GIL released.
pub(crate) fn released<T: Send>(py: Python<'_>, f: impl FnOnce() -> T + Send) -> T {
    if cfg!(feature = "negative-hold-gil") {
        return f();
    }
    py.detach(f)
}
