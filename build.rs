//! The protecting steps of the core's concurrency protocol ([`STEPS`]), and
//! `RADIXKV_NEGATIVE=reader_never_waits` turned into `--cfg
//! radixkv_negative="reader_never_waits"` in a plain build, for the control of
//! `tests/parked_writer.rs`. Each step is one function of the core named
//! after it, which asks `negative::removed` with its name once
//! (`scripts/check-core-structure.sh` checks it against this list). A loom
//! build chooses the step it removes at run time (`RADIXKV_NEGATIVE_STEP`,
//! `src/negative.rs`), so that `loom-tests/negative.sh` builds once for
//! every control. Passing the cfg this way (rather than through RUSTFLAGS)
//! rebuilds only this crate, not every dependency.

/// Every protecting step of the core (each removed by one negative control).
const STEPS: &[&str] = &[
    "evict_pin_check",
    "leaf_check",
    "split_moves_no_pin",
    "reader_parent_check",
    "attach_recheck",
    "unlink_check",
    "defer_destroy",
    "pin_then_read",
    "split_recheck",
    "unpin_rmw",
    "parent_lock",
    "born_pinned",
    "claim_cas",
    "root_obsolete_check",
    "reader_never_waits",
    "table_retire",
    "table_tomb",
    "copy_source_pin",
    "copy_frees_dups",
    "event_in_lock",
    "split_event_in_lock",
    "switch_rescans",
    "split_rereads_deepest",
    "split_raises_ancestors",
];

/// Steps a plain (not loom) build can be built without:
/// `tests/parked_writer.rs`'s control.
const PLAIN_STEPS: &[&str] = &["reader_never_waits"];

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=RADIXKV_NEGATIVE");
    let values: Vec<String> = PLAIN_STEPS.iter().map(|s| format!("\"{s}\"")).collect();
    println!(
        "cargo::rustc-check-cfg=cfg(radixkv_negative, values({}))",
        values.join(", ")
    );
    let Ok(step) = std::env::var("RADIXKV_NEGATIVE") else {
        return;
    };
    if step.is_empty() {
        return;
    }
    if std::env::var_os("CARGO_CFG_LOOM").is_some() {
        panic!("a loom build removes a step chosen at run time: RADIXKV_NEGATIVE_STEP={step} (RADIXKV_NEGATIVE is for plain builds)");
    }
    if !PLAIN_STEPS.contains(&step.as_str()) {
        panic!("RADIXKV_NEGATIVE={step:?}: a plain build can remove only {PLAIN_STEPS:?}; the other steps ({STEPS:?}) are removed in loom builds, at run time (RADIXKV_NEGATIVE_STEP)");
    }
    println!("cargo:rustc-cfg=radixkv_negative=\"{step}\"");
}
