//! `radixkv hitrate`: rows for every (policy, capacity) plus Belady's bound,
//! the Mooncake and agentic readers, the chat generator, `--pages`, and
//! errors.

#[path = "common/cli.rs"]
mod cli;

use radixkv::hitrate::{self, Prompt, Trace};
use radixkv::EvictionPolicy;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A fresh temporary directory, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let d = std::env::temp_dir().join(format!("radixkv-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        TempDir(d)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn radixkv(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_radixkv"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn hitrate_command_reports_policies_and_the_bound() {
    let dir = TempDir::new("hitrate");
    let json = dir.0.join("rows.json");
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
fn mooncake_reader_expands_blocks_and_rejects_bad_lines() {
    let dir = TempDir::new("mooncake");
    let f = dir.0.join("t.jsonl");
    std::fs::write(
        &f,
        "{\"timestamp\": 5, \"input_length\": 600, \"output_length\": 1, \"hash_ids\": [0, 1]}\n\
         {\"timestamp\": 1, \"input_length\": 512, \"output_length\": 1, \"hash_ids\": [0]}\n",
    )
    .unwrap();
    let t = hitrate::read_mooncake(&f).unwrap();
    assert_eq!(t.requests.len(), 2);
    assert_eq!(t.input_len(0), 512, "sorted by timestamp");
    assert_eq!(t.input_len(1), 600, "the last block is partial");
    assert_eq!(t.tokens(1)[512], 512, "block 1 starts at 1 x 512");
    // The same through the format detection, compressed.
    let z = dir.0.join("t.jsonl.zst");
    zstd_file(&f, &z);
    let tz = hitrate::read_trace(&z, 1, 1.0).unwrap();
    assert_eq!(tz.tokens(1), t.tokens(1));
    std::fs::write(&f, "{\"timestamp\": \"x\"}\n").unwrap();
    let e = hitrate::read_mooncake(&f).unwrap_err().to_string();
    assert!(e.contains(":1:"), "{e}");
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

/// Compresses `from` into `to` with ruzstd.
fn zstd_file(from: &Path, to: &Path) {
    let data = std::fs::read(from).unwrap();
    let z = ruzstd::encoding::compress_to_vec(
        data.as_slice(),
        ruzstd::encoding::CompressionLevel::Fastest,
    );
    assert_eq!(&z[..4], &[0x28, 0xb5, 0x2f, 0xfd]);
    std::fs::write(to, z).unwrap();
}

/// Two conversations with blocks of 4 tokens. A: a request of 2 blocks + 2
/// tail tokens at 0 s; a sub-agent that returned at 5 s after 3 s (so it
/// began at 2 s) with requests at +0 s and +1 s; a request of 3 blocks + 1
/// at 6 s. B: the same local ids 1, 2 as A, at 0 s.
const AGENTIC: &str = r#"{"id":"a","block_size":4,"hash_id_scope":"local","tool_tokens":1,"system_tokens":1,"requests":[{"t":0.0,"type":"n","in":10,"out":3,"hash_ids":[1,2],"api_time":1.0,"think_time":0.0},{"t":5.0,"type":"subagent","duration_ms":3000,"status":"completed","requests":[{"t":0.0,"type":"n","in":8,"out":1,"hash_ids":[7,8]},{"t":1.0,"type":"n","in":13,"out":1,"hash_ids":[7,8,9]}]},{"t":6.0,"type":"s","in":13,"out":2,"hash_ids":[1,2,3]}]}
{"id":"b","block_size":4,"hash_id_scope":"local","requests":[{"t":0.0,"type":"n","in":9,"out":1,"hash_ids":[1,2]}]}
"#;

fn tail(t: &Trace, i: usize) -> Vec<u32> {
    let whole = match t.requests[i].prompt {
        Prompt::Blocks { blocks, .. } => blocks as usize * t.blocks.block_size(),
        Prompt::Tokens(_) => panic!("agentic requests are blocks"),
    };
    t.tokens(i)[whole..].to_vec()
}

#[test]
fn agentic_reader_flattens_subagents_scopes_ids_and_keeps_tails_unique() {
    let dir = TempDir::new("agentic");
    let plain = dir.0.join("conv.jsonl");
    std::fs::write(&plain, AGENTIC).unwrap();
    let z = dir.0.join("conv.jsonl.zst");
    zstd_file(&plain, &z);
    // A mean gap of 0: every conversation starts at 0.
    let t = hitrate::read_agentic_with_gap(&plain, 7, 0.0).unwrap();
    assert_eq!(t.name, "conv");
    assert_eq!(t.blocks.block_size(), 4);
    // Sub-agent flattened; ordered by time, ties in file order.
    let times: Vec<f64> = t.requests.iter().map(|r| r.time).collect();
    assert_eq!(times, vec![0.0, 0.0, 2000.0, 3000.0, 6000.0]);
    let lens: Vec<usize> = (0..5).map(|i| t.input_len(i)).collect();
    assert_eq!(lens, vec![10, 9, 8, 13, 13], "a0, b0, sub0, sub1, a2");
    let tok: Vec<Vec<u32>> = (0..5).map(|i| t.tokens(i)).collect();
    // Within a conversation, shared ids share tokens: a2 extends a0's two
    // blocks, sub1 extends sub0.
    assert_eq!(tok[4][..8], tok[0][..8]);
    assert_eq!(tok[3][..8], tok[2][..8]);
    assert_ne!(tok[4][8..12], tok[0][8..10], "a2's third block is new");
    // Local scope: B's ids 1, 2 are not A's.
    let a: HashSet<u32> = [0, 2, 3, 4].iter().flat_map(|&i| tok[i].clone()).collect();
    assert!(
        tok[1].iter().all(|x| !a.contains(x)),
        "B shares tokens with A"
    );
    // Tails: in - blocks x 4 tokens, each unique in the whole trace.
    let tails: Vec<Vec<u32>> = (0..5).map(|i| tail(&t, i)).collect();
    assert_eq!(
        tails.iter().map(Vec::len).collect::<Vec<_>>(),
        vec![2, 1, 0, 1, 1]
    );
    let mut count = std::collections::HashMap::new();
    for x in tok.iter().flatten() {
        *count.entry(*x).or_insert(0) += 1;
    }
    for x in tails.iter().flatten() {
        assert_eq!(count[x], 1, "tail token {x} repeats");
    }
    // The compressed file reads the same, and the format is detected.
    let tz = hitrate::read_trace(&z, 7, 0.0).unwrap();
    assert_eq!(tz.requests.len(), 5);
    for i in 0..5 {
        assert_eq!(tz.tokens(i), t.tokens(i));
        assert_eq!(tz.requests[i].time, t.requests[i].time);
    }
    // Infinite capacity, pages of 4: a2 reuses a0's 8 tokens and sub1
    // reuses sub0's 8; nothing else is shared.
    let rows = hitrate::evaluate(&t, &[EvictionPolicy::Lru], &[10.0], 4).unwrap();
    let want = 16.0 / 53.0;
    for r in &rows {
        assert!((r.hit_rate_tokens - want).abs() < 1e-9, "{r:?} vs {want}");
    }
}

#[test]
fn agentic_conversations_start_as_a_seeded_poisson_process() {
    let dir = TempDir::new("poisson");
    let f = dir.0.join("many.jsonl");
    // 400 conversations, each a request at 0 s and one at 0.5 s.
    let line = r#"{"id":"x","block_size":4,"requests":[{"t":0.0,"type":"n","in":5,"out":1,"hash_ids":[1]},{"t":0.5,"type":"n","in":9,"out":1,"hash_ids":[1,2]}]}"#;
    let n = 400;
    std::fs::write(&f, format!("{line}\n").repeat(n)).unwrap();
    let t = hitrate::read_agentic_with_gap(&f, 3, 2.0).unwrap();
    assert_eq!(t.requests.len(), 2 * n);
    assert!(
        t.requests.windows(2).all(|w| w[0].time <= w[1].time),
        "not ordered by time"
    );
    // Starts are the 5-token requests (1 block + 1 tail).
    let starts: Vec<f64> = (0..t.requests.len())
        .filter(|&i| t.input_len(i) == 5)
        .map(|i| t.requests[i].time)
        .collect();
    assert_eq!(starts.len(), n);
    assert_eq!(starts[0], 0.0, "the first conversation starts at 0");
    let gaps: Vec<f64> = starts.windows(2).map(|w| (w[1] - w[0]) / 1000.0).collect();
    let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
    assert!((mean - 2.0).abs() < 0.3, "mean gap {mean} s, want 2 s");
    // Exponential: about e^-1 of the gaps exceed the mean.
    let above = gaps.iter().filter(|&&g| g > 2.0).count() as f64 / gaps.len() as f64;
    assert!(
        (above - (-1f64).exp()).abs() < 0.08,
        "{above} above the mean"
    );
    // Every conversation's second request comes 500 ms after its first:
    // its tokens extend exactly one start's block.
    for i in 0..t.requests.len() {
        if t.input_len(i) == 9 {
            let first = t.tokens(i)[..4].to_vec();
            let j = (0..t.requests.len())
                .find(|&j| t.input_len(j) == 5 && t.tokens(j)[..4] == first)
                .unwrap();
            assert!((t.requests[i].time - t.requests[j].time - 500.0).abs() < 1e-6);
        }
    }
    // Seeded: the same seed gives the same times, another seed others.
    let again = hitrate::read_agentic_with_gap(&f, 3, 2.0).unwrap();
    let other = hitrate::read_agentic_with_gap(&f, 4, 2.0).unwrap();
    let times = |t: &Trace| t.requests.iter().map(|r| r.time).collect::<Vec<_>>();
    assert_eq!(times(&t), times(&again));
    assert_ne!(times(&t), times(&other));
    // The default is a mean gap of 1 s.
    let d = hitrate::read_agentic(&f, 3).unwrap();
    let last = d.requests.last().unwrap().time / 1000.0;
    assert!((last / n as f64 - 1.0).abs() < 0.2, "{last} s for {n}");
}

#[test]
fn agentic_reader_rejects_bad_input_with_line_numbers() {
    let dir = TempDir::new("agentic-bad");
    let f = dir.0.join("bad.jsonl");
    let good = AGENTIC.lines().next().unwrap();
    let cases = [
        (format!("{good}\n{{\"id\": 1\n"), ":2:"),
        (
            format!("{good}\n\n{{\"block_size\":4,\"requests\":[{{\"t\":0,\"type\":\"n\",\"in\":7,\"hash_ids\":[1,2]}}]}}\n"),
            ":3:",
        ),
        (
            "{\"block_size\":4,\"requests\":[{\"t\":0,\"type\":\"subagent\"}]}\n".to_string(),
            "no requests",
        ),
        (
            "{\"block_size\":0,\"requests\":[]}\n".to_string(),
            "block_size",
        ),
        (
            format!("{good}\n{}\n", good.replace("\"block_size\":4", "\"block_size\":8")),
            "differs",
        ),
    ];
    for (text, want) in cases {
        std::fs::write(&f, &text).unwrap();
        let e = hitrate::read_agentic(&f, 1).unwrap_err().to_string();
        assert!(e.contains(want), "{e} lacks {want}");
    }
    // Neither format.
    std::fs::write(&f, "{\"x\": 1}\n").unwrap();
    let e = hitrate::read_trace(&f, 1, 1.0).unwrap_err().to_string();
    assert!(e.contains(":1:") && e.contains("neither"), "{e}");
    // A truncated zstd stream is an error, not a panic.
    let plain = dir.0.join("ok.jsonl");
    std::fs::write(&plain, AGENTIC.repeat(50)).unwrap();
    let z = dir.0.join("ok.jsonl.zst");
    zstd_file(&plain, &z);
    let bytes = std::fs::read(&z).unwrap();
    std::fs::write(&z, &bytes[..bytes.len() / 2]).unwrap();
    assert!(hitrate::read_trace(&z, 1, 1.0).is_err());
}

#[test]
fn chat_infinite_capacity_hit_rate_is_the_reused_history() {
    // 2 conversations x 3 turns, system 4, user 2, assistant 3, page 1:
    // prompts are 6, 11, 16 tokens; turn 1 of the second conversation
    // reuses the system prompt (4), turns 2 and 3 the previous prompt
    // (6, 11): (4 + 2 x (6 + 11)) / (2 x 33) = 38 / 66.
    let t = hitrate::chat(2, 3, 4, 2, 3, 9);
    assert_eq!(t.requests.len(), 6);
    // Distinct: system + per conversation 3 user messages and the 2
    // replies that reach a prompt.
    assert_eq!(t.distinct_tokens(1), 4 + 2 * (3 * 2 + 2 * 3));
    let want = 38.0 / 66.0;
    let rows = hitrate::evaluate(&t, &EvictionPolicy::ALL, &[1.0], 1).unwrap();
    assert_eq!(rows.len(), EvictionPolicy::ALL.len() + 1);
    for r in &rows {
        assert!((r.hit_rate_tokens - want).abs() < 1e-9, "{r:?} vs {want}");
        assert_eq!(r.evicted_tokens, 0, "{r:?}");
    }
    // Pages of 4: reuse rounds down to whole pages: 4, then 4 and 8.
    let rows = hitrate::evaluate(&t, &[EvictionPolicy::Lru], &[2.0], 4).unwrap();
    assert!((rows[0].hit_rate_tokens - (4.0 + 2.0 * 12.0) / 66.0).abs() < 1e-9);
    // Conversations interleave (seeded) and keep their order.
    let order = |seed| {
        let t = hitrate::chat(8, 4, 4, 2, 3, seed);
        (0..t.requests.len())
            .map(|i| t.input_len(i))
            .collect::<Vec<_>>()
    };
    assert_eq!(order(5), order(5));
    assert_ne!(order(5), order(6));
    assert_ne!(
        order(5),
        [6, 11, 16, 21].repeat(8),
        "conversations do not interleave"
    );
}

#[test]
fn pages_option_sizes_the_pool_and_bad_options_are_errors() {
    let dir = TempDir::new("pages");
    let f = dir.0.join("conv.jsonl");
    std::fs::write(&f, AGENTIC).unwrap();
    let json = dir.0.join("rows.json");
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
    for (args, want) in [
        (&["--capacity", "0.5", "--pages", "3"][..], "not both"),
        (&["--pages", "0"][..], "at least 1"),
        (&["--page-size", "0"][..], "at least 1"),
        (&["--gap-s=-1"][..], "--gap-s"),
        (&["--gap-s", "NaN"][..], "--gap-s"),
        (&["--capacity", "0"][..], "positive"),
        (&["--policy", "nope"][..], ""),
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
