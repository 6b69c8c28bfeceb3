//! Negative controls: whether one protecting step of the concurrency
//! protocol is removed (see the `tree::protocol` module docs, "Protecting
//! steps and their controls"). Each step is one function named after it
//! that asks [`removed`] with its own name, and nowhere else
//! (`scripts/check-core-structure.sh` holds the core to that).
//!
//! * A normal build removes nothing: [`removed`] is a constant `false` that
//!   the compiler folds away.
//! * A loom build (`--cfg loom`) removes the step named by the environment
//!   variable `RADIXKV_NEGATIVE_STEP` when the model runs, so that one build
//!   serves every control of `loom-tests/negative.sh`.
//! * A plain build with `RADIXKV_NEGATIVE=reader_never_waits` (turned into
//!   `--cfg radixkv_negative` by `build.rs`) removes that step, for the
//!   control of `tests/parked_writer.rs`: a plain build carries no run-time
//!   switch on its read path.

/// The environment variable naming the step a loom build removes (unset or
/// empty: none).
#[cfg(loom)]
pub(crate) const LOOM_STEP_VAR: &str = "RADIXKV_NEGATIVE_STEP";

/// Whether the protecting step `step` is removed (a loom build: named by
/// [`LOOM_STEP_VAR`]; read at every call, which keeps a static cache, and
/// so shared state outside the `sync` shim, out of the loom models).
#[cfg(loom)]
pub(crate) fn removed(step: &'static str) -> bool {
    std::env::var_os(LOOM_STEP_VAR).is_some_and(|v| v == step)
}

/// Whether the protecting step `step` is removed (a plain build: only
/// `reader_never_waits`, and only when built for its control).
#[cfg(not(loom))]
#[inline(always)]
pub(crate) fn removed(step: &'static str) -> bool {
    cfg!(radixkv_negative = "reader_never_waits") && step == "reader_never_waits"
}
