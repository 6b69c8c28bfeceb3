//! `radixkv hitrate`: rows for every (policy, capacity) plus Belady's bound,
//! the Mooncake reader, and errors.

use radixkv::hitrate;
use std::path::Path;

#[test]
fn hitrate_command_reports_policies_and_the_bound() {
    let dir = std::env::temp_dir().join(format!("radixkv-hitrate-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("rows.json");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_radixkv"))
        .args([
            "hitrate",
            "--trace",
            "gsp",
            "--capacity",
            "0.1,0.5",
            "--policy",
            "lru,fifo,priority",
        ])
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<serde_json::Value> =
        serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
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
    let bad = std::process::Command::new(env!("CARGO_BIN_EXE_radixkv"))
        .args(["hitrate", "--trace", "/nonexistent.jsonl"])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("cannot read"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn mooncake_reader_expands_blocks_and_rejects_bad_lines() {
    let dir = std::env::temp_dir().join(format!("radixkv-mooncake-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join("t.jsonl");
    std::fs::write(
        &f,
        "{\"timestamp\": 5, \"input_length\": 600, \"output_length\": 1, \"hash_ids\": [0, 1]}\n\
         {\"timestamp\": 1, \"input_length\": 512, \"output_length\": 1, \"hash_ids\": [0]}\n",
    )
    .unwrap();
    let t = hitrate::read_mooncake(&f).unwrap();
    assert_eq!(t.requests.len(), 2);
    assert_eq!(t.requests[0].tokens.len(), 512, "sorted by timestamp");
    assert_eq!(t.requests[1].tokens.len(), 600, "the last block is partial");
    assert_eq!(t.requests[1].tokens[512], 512, "block 1 starts at 1 x 512");
    std::fs::write(&f, "{\"timestamp\": \"x\"}\n").unwrap();
    let e = hitrate::read_mooncake(&f).unwrap_err().to_string();
    assert!(e.contains(":1:"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
    // The shipped compressed traces, where present (../shared/workloads).
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/workloads/mooncake_synthetic_trace.jsonl.zst");
    if shipped.exists() {
        let t = hitrate::read_mooncake(&shipped).unwrap();
        assert_eq!(t.requests.len(), 3993);
    } else {
        eprintln!(
            "{} not present: compressed-trace check skipped",
            shipped.display()
        );
    }
}
