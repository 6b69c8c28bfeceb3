//! The core's errors as Python exceptions (`radixkv.errors`: one family
//! under `CacheError`, each also a `ValueError`, `KeyError`, … as fits),
//! and a guard that turns a Rust panic into a plain `RuntimeError` at the
//! boundary.

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;
use radixkv::CacheError;

/// The class `radixkv.errors.<name>`, imported once per interpreter.
fn class<'py>(
    py: Python<'py>,
    cell: &'static PyOnceLock<Py<PyType>>,
    name: &str,
) -> PyResult<&'py Bound<'py, PyType>> {
    cell.import(py, "radixkv.errors", name)
}

/// An exception of class `radixkv.errors.<name>` with `message`.
fn raise(
    py: Python<'_>,
    cell: &'static PyOnceLock<Py<PyType>>,
    name: &str,
    message: String,
) -> PyErr {
    match class(py, cell, name) {
        Ok(ty) => PyErr::from_type(ty.clone(), message),
        Err(e) => e,
    }
}

macro_rules! classes {
    ($($id:ident = $name:literal),* $(,)?) => {
        $(static $id: PyOnceLock<Py<PyType>> = PyOnceLock::new();)*
    };
}

classes!(
    INVALID = "InvalidArgument",
    UNKNOWN_TIER = "UnknownTier",
    STALE = "StaleHandle",
    FOREIGN = "ForeignObject",
    OVERFLOW = "PinOverflow",
    OUT_OF_PAGES = "OutOfPages",
    CLOSED = "LeaseClosed",
    BASE = "CacheError",
);

/// The Python exception of a core error.
pub(crate) fn cache_error(py: Python<'_>, e: CacheError) -> PyErr {
    let message = e.to_string();
    match e {
        CacheError::Unaligned { .. }
        | CacheError::LengthMismatch { .. }
        | CacheError::InvalidConfig(_)
        | CacheError::UnknownPolicy(_)
        | CacheError::CopyToItself(_) => raise(py, &INVALID, "InvalidArgument", message),
        CacheError::UnknownDevice { .. } | CacheError::NoHostTier => {
            raise(py, &UNKNOWN_TIER, "UnknownTier", message)
        }
        CacheError::StaleHandle(_) => raise(py, &STALE, "StaleHandle", message),
        CacheError::ForeignHandle | CacheError::ForeignSpan => {
            raise(py, &FOREIGN, "ForeignObject", message)
        }
        CacheError::PinOverflow => raise(py, &OVERFLOW, "PinOverflow", message),
        CacheError::Alloc(radixkv::alloc::AllocError::OutOfPages { .. }) => {
            raise(py, &OUT_OF_PAGES, "OutOfPages", message)
        }
        CacheError::Alloc(_) => raise(py, &INVALID, "InvalidArgument", message),
        _ => raise(py, &BASE, "CacheError", message),
    }
}

/// `LeaseClosed` for `what` used after it was closed.
pub(crate) fn closed(py: Python<'_>, what: &str) -> PyErr {
    raise(
        py,
        &CLOSED,
        "LeaseClosed",
        format!("this {what} was closed (or another thread is using it)"),
    )
}

/// `InvalidArgument` with `message`.
pub(crate) fn invalid(py: Python<'_>, message: String) -> PyErr {
    raise(py, &INVALID, "InvalidArgument", message)
}

/// A `radixkv.errors.CacheError` with `message` (a failed audit).
pub(crate) fn failed(py: Python<'_>, message: String) -> PyErr {
    raise(py, &BASE, "CacheError", message)
}

/// Runs `f`, turning a Rust panic into a `RuntimeError` that says so (a
/// panic is a bug of radixkv's, never the caller's input): nothing unwinds
/// into the interpreter, and nothing raises PyO3's `PanicException` (a
/// `BaseException`, which SGLang's `except Exception` would not catch).
///
/// Every Python entry point runs inside it: `#[py_methods]` and
/// `#[py_function]` (the crate `radixkv-py-macros`) wrap each body.
pub(crate) fn guarded<T>(f: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    let run = || {
        #[cfg(feature = "test-hooks")]
        hooks::panic_if_armed();
        f()
    };
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)) {
        Ok(r) => r,
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".into());
            Err(PyRuntimeError::new_err(format!(
                "radixkv: internal error (a Rust panic, caught at the boundary): {what}"
            )))
        }
    }
}

/// The guard's test hook (feature `test-hooks`, never in the released
/// wheel): the next guarded entry point panics inside its guard.
#[cfg(feature = "test-hooks")]
pub(crate) mod hooks {
    use std::sync::atomic::{AtomicBool, Ordering};

    static ARMED: AtomicBool = AtomicBool::new(false);

    /// Arms the hook.
    pub(crate) fn arm() {
        // SeqCst: a test switch, read by whichever thread enters next.
        ARMED.store(true, Ordering::SeqCst);
    }

    /// Panics once after `arm`.
    pub(crate) fn panic_if_armed() {
        // SeqCst: as in `arm`; the swap disarms it for every other entry.
        if ARMED.swap(false, Ordering::SeqCst) {
            panic!("the test hook _panic_at_next_entry");
        }
    }
}
