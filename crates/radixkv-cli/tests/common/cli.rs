//! Runs the `radixkv` binary for a test and reads the JSON it wrote.

use std::path::Path;
use std::process::Command;

/// Runs `cmd`, which writes JSON to `json`; asserts that it succeeded
/// (showing its stderr if not) and returns the parsed file.
pub fn run_for_json(cmd: &mut Command, json: &Path) -> serde_json::Value {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&std::fs::read(json).unwrap()).unwrap()
}
