//! Turns `RADIXKV_NEGATIVE=<step>` into `--cfg radixkv_negative="<step>"`,
//! in loom builds only: the negative controls of `loom-tests/negative.sh`
//! remove one protecting step each. Each step is one function of the core
//! named after it, which holds the step's one control cfg
//! (`scripts/check-core-structure.sh` checks it). Passing the cfg this way (rather than
//! through RUSTFLAGS) rebuilds only this crate, not every dependency.

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

/// Controls of ordinary (not loom) tests: `tests/parked_writer.rs`.
const PLAIN_STEPS: &[&str] = &["reader_never_waits"];

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=RADIXKV_NEGATIVE");
    let values: Vec<String> = STEPS.iter().map(|s| format!("\"{s}\"")).collect();
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
    if std::env::var_os("CARGO_CFG_LOOM").is_none() && !PLAIN_STEPS.contains(&step.as_str()) {
        panic!("RADIXKV_NEGATIVE is only for loom builds (RUSTFLAGS=\"--cfg loom --cfg crossbeam_loom\")");
    }
    if !STEPS.contains(&step.as_str()) {
        panic!("unknown RADIXKV_NEGATIVE step {step:?}; known: {STEPS:?}");
    }
    println!("cargo:rustc-cfg=radixkv_negative=\"{step}\"");
}
