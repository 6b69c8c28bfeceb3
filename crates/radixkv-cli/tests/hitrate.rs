//! `radixkv hitrate`: rows for every (policy, capacity) plus Belady's bound,
//! `--pages`, and errors. The readers and generators it shares with
//! `replay` are tested in `radixkv-tools/tests/trace.rs`.

#[path = "common/cli.rs"]
mod cli;

use std::process::{Command, Output};

/// The agentic fixture of the engine's trace tests.
const AGENTIC: &str = include_str!("../../radixkv-tools/tests/fixtures/agentic.jsonl");

fn radixkv(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_radixkv"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn hitrate_command_reports_policies_and_the_bound() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("rows.json");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_radixkv"));
    cmd.args([
        "hitrate",
        "--trace",
        "gsp",
        "--capacity",
        "0.1,0.5",
        "--policy",
        "lru,fifo,priority",
    ])
    .arg("--json")
    .arg(&json);
    let rows: Vec<serde_json::Value> =
        serde_json::from_value(cli::run_for_json(&mut cmd, &json)).unwrap();
    assert_eq!(rows.len(), 2 * 4, "3 policies and belady per capacity");
    for cap in [0.1, 0.5] {
        let at: Vec<_> = rows.iter().filter(|r| r["capacity"] == cap).collect();
        let bound = at.iter().find(|r| r["policy"] == "belady").unwrap()["hit_rate_tokens"]
            .as_f64()
            .unwrap();
        for r in &at {
            let h = r["hit_rate_tokens"].as_f64().unwrap();
            assert!((0.0..=1.0).contains(&h));
            assert!(h <= bound + 1e-9, "{r} above the bound {bound}");
        }
    }
    let bad = radixkv(&["hitrate", "--trace", "/nonexistent.jsonl"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("cannot read"));
}

#[test]
fn pages_option_sizes_the_pool_and_bad_options_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("conv.jsonl");
    std::fs::write(&f, AGENTIC).unwrap();
    let json = dir.path().join("rows.json");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_radixkv"));
    cmd.args([
        "hitrate",
        "--trace",
        f.to_str().unwrap(),
        "--pages",
        "2,100",
        "--page-size",
        "4",
        "--policy",
        "lru",
        "--seed",
        "3",
        "--json",
        json.to_str().unwrap(),
    ]);
    let rows: Vec<serde_json::Value> =
        serde_json::from_value(cli::run_for_json(&mut cmd, &json)).unwrap();
    assert_eq!(rows.len(), 2 * 2, "lru and belady per pool size");
    // Distinct pages of 4 (tails are under a page each): A's blocks 1, 2,
    // 3, the sub-agent's 7, 8, 9 and B's two.
    let distinct = 8.0 * 4.0;
    for (r, pages) in rows.iter().zip([2, 2, 100, 100]) {
        assert_eq!(r["pages"], pages);
        let cap = r["capacity"].as_f64().unwrap();
        assert!((cap - pages as f64 * 4.0 / distinct).abs() < 1e-9, "{r}");
    }
    let big = rows
        .iter()
        .find(|r| r["pages"] == 100 && r["policy"] == "lru");
    assert!((big.unwrap()["hit_rate_tokens"].as_f64().unwrap() - 16.0 / 53.0).abs() < 1e-9);
    // chat through the CLI, sized in pages.
    let out = radixkv(&[
        "hitrate", "--trace", "chat", "--pages", "64", "--policy", "lru",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("chat-64x8"));
    // --max-requests keeps the first N requests of a trace.
    let out = radixkv(&[
        "hitrate",
        "--trace",
        f.to_str().unwrap(),
        "--max-requests",
        "1",
        "--policy",
        "lru",
        "--pages",
        "8",
        "--page-size",
        "4",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("(1 requests"),
        "{text}"
    );
    for (args, want) in [
        (&["--capacity", "0.5", "--pages", "3"][..], "not both"),
        (&["--pages", "0"][..], "at least 1"),
        (&["--page-size", "0"][..], "at least 1"),
        (&["--gap-s=-1"][..], "--gap-s"),
        (&["--gap-s", "NaN"][..], "--gap-s"),
        (&["--capacity", "0"][..], "positive"),
        (&["--policy", "nope"][..], ""),
        (
            &["--policy", "tlru", "--tlru-threshold", "512"][..],
            "--tlru-threshold (512) must be above --tlru-next-prompt-estimate (512)",
        ),
    ] {
        let mut a = vec!["hitrate", "--trace", f.to_str().unwrap()];
        a.extend_from_slice(args);
        let out = radixkv(&a);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}
