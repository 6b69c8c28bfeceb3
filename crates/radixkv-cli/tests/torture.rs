//! The torture run (`radixkv stress`) in short form: small pools, constant
//! eviction, then audit and page accounting.

#[path = "common/cli.rs"]
mod cli;

use radixkv_tools::torture::{run, TortureConfig};
use std::time::Duration;

#[test]
fn short_torture_run_finds_nothing_wrong() {
    let r = run(&TortureConfig {
        devices: 3,
        pages: 128,
        page_size: 4,
        threads: 4,
        duration: Duration::from_millis(1500),
        seed: 9,
    })
    .unwrap();
    assert!(r.ok(), "{r:?}");
    assert!(r.ops > 1000, "{r:?}");
    assert!(
        r.evicted_pages > 100,
        "the pools must be under pressure: {r:?}"
    );
}

#[test]
fn stress_command_prints_the_report_and_exits_zero() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let json = dir.join("report.json");
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_radixkv"));
    cmd.args([
        "stress",
        "--devices",
        "2",
        "--pages",
        "64",
        "--page-size",
        "4",
    ])
    .args(["--threads", "2", "--seconds", "0.5", "--json"])
    .arg(&json);
    let report = cli::run_for_json(&mut cmd, &json);
    for key in [
        "ops",
        "allocs",
        "evicted_pages",
        "audit_ok",
        "leaked_pages",
        "double_frees",
        "max_pin_wait_us",
    ] {
        assert!(report.get(key).is_some(), "missing {key}");
    }
    assert_eq!(report["audit_ok"], true);
    let bad = std::process::Command::new(env!("CARGO_BIN_EXE_radixkv"))
        .args(["stress", "--pages", "1", "--seconds", "0"])
        .output()
        .unwrap();
    assert!(!bad.status.success(), "an impossible pool is an error");
    assert!(String::from_utf8_lossy(&bad.stderr).contains("invalid"));
}
