//! `radixkv` for Python: the core's API over PyO3 (an abi3 extension for
//! CPython ≥ 3.9), built into the wheel `radixkv` by maturin.
//!
//! | file | what it holds |
//! | --- | --- |
//! | `cache.rs` | `RadixCache` and `PagedCache`, every builder option and operation |
//! | `results.rs` | `Lease`, `NodeHandle`, `MatchResult`, `InsertResult`, `Evicted`, `Sizes` |
//! | `pages.rs` | `PageSpan`, `Request`, `PrefixCopy`, `CopyView`, `Evictor` |
//! | `ids.rs` | token ids and values from arrays, tensors and lists |
//! | `convert.rs` | tiers (`0`, `1`, …, `"host"`) and numpy results |
//! | `dp.rs` | `DpRouter`: a data-parallel dispatcher's ranks from their KV events, and the rank for a request |
//! | `events.rs` | the residency events queued for `take_events` |
//! | `gate.rs` | the test gate that parks a store inside an insert (feature `test-hooks`) |
//! | `errors.rs` | the core's errors as `radixkv.errors` exceptions; the panic guard every entry point runs in |
//! | `gil.rs` | the GIL released around an insert, and that step's negative control |
//! | `sglang/` | the tree under `radixkv.sglang`, SGLang's `--radix-cache-backend radixkv` |
//!
//! Every call that walks the tree releases the GIL. Every entry point is
//! declared with `#[py_methods]` or `#[py_function]` (never PyO3's bare
//! attributes), which run its body inside the panic guard: a Rust panic is
//! caught at the boundary and raised as a `RuntimeError`.
//!
//! The feature `test-hooks` adds the hooks the package's own tests use
//! (`_panic_inside`, `_panic_at_next_entry`, `_hold_next_store` and its
//! companions, `SglangTree._break_mirror`); the released wheel has none.

#![deny(clippy::undocumented_unsafe_blocks)]

mod cache;
mod convert;
mod dp;
mod errors;
mod events;
#[cfg(feature = "test-hooks")]
mod gate;
mod gil;
mod ids;
mod narrow;
mod pages;
mod results;
mod sglang;
mod tensor;

use pyo3::prelude::*;
use radixkv_py_macros::py_function;

/// The namespace of a request naming a LoRA adapter and a cache salt (the
/// core's rule: the salt alone, or `lora:<name>` with the salt after a
/// U+001F separator; `None` for neither).
#[py_function]
#[pyo3(signature = (lora_name=None, cache_salt=None))]
fn namespace_for(lora_name: Option<&str>, cache_salt: Option<&str>) -> Option<String> {
    radixkv::TokenKey::namespace_for(lora_name, cache_salt)
}

/// Test hook (feature `test-hooks`): panics inside Rust, so that a test
/// sees the boundary turn it into a `RuntimeError`.
#[cfg(feature = "test-hooks")]
#[py_function]
fn _panic_inside(message: &str) -> PyResult<()> {
    panic!("{message}")
}

/// Test hook (feature `test-hooks`): the next call of any entry point (on
/// any thread) panics inside its guard.
#[cfg(feature = "test-hooks")]
#[py_function]
fn _panic_at_next_entry() {
    errors::hooks::arm();
}

/// Whether `tokens` would be read without a copy (a read-only, C-contiguous
/// array of 32-bit unsigned ints; a writable one is copied).
#[py_function]
fn reads_without_copy(tokens: &Bound<'_, PyAny>) -> PyResult<bool> {
    Ok(ids::ids(tokens, "tokens")?.is_borrowed())
}

/// The extension module `radixkv._radixkv` (the package `radixkv`
/// re-exports it).
#[pymodule]
fn _radixkv(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // The module's initialisation runs inside the panic guard too.
    errors::guarded(|| {
        m.add_class::<cache::RadixCache>()?;
        m.add_class::<cache::PagedCache>()?;
        m.add_class::<results::Lease>()?;
        m.add_class::<results::NodeHandle>()?;
        m.add_class::<results::MatchResult>()?;
        m.add_class::<results::InsertResult>()?;
        m.add_class::<results::Evicted>()?;
        m.add_class::<results::Sizes>()?;
        m.add_class::<pages::PageSpan>()?;
        m.add_class::<pages::Request>()?;
        m.add_class::<pages::PrefixCopy>()?;
        m.add_class::<pages::CopyView>()?;
        m.add_class::<pages::Evictor>()?;
        m.add_class::<dp::DpRouter>()?;
        m.add_class::<sglang::SglangTree>()?;
        m.add_class::<sglang::SglangNode>()?;
        m.add_function(wrap_pyfunction!(namespace_for, m)?)?;
        m.add_function(wrap_pyfunction!(reads_without_copy, m)?)?;
        m.add_function(wrap_pyfunction!(gil::gil_release_tokens, m)?)?;
        m.add_function(wrap_pyfunction!(gil::set_gil_release_tokens, m)?)?;
        #[cfg(feature = "test-hooks")]
        {
            gil::read_negative_control();
            m.add_function(wrap_pyfunction!(_panic_inside, m)?)?;
            m.add_function(wrap_pyfunction!(_panic_at_next_entry, m)?)?;
        }
        m.add("HOST", convert::HOST)?;
        m.add("MAX_PAGE_SIZE", radixkv::cache::MAX_PAGE_SIZE)?;
        m.add("MAX_DEVICES", radixkv::cache::MAX_DEVICES)?;
        Ok(())
    })
}
