//! `radixkv replay`: the summary's keys, interruption, workloads and the
//! command line's errors.

#[path = "common/cli.rs"]
mod cli;

use radixkv_engine::EngineConfig;
use radixkv_tools::replay::{format_summaries, replay, ReplayConfig};
use radixkv_tools::trace::{chat, gsp, tree_of_thought, ChatShape, TreeShape};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};

fn cfg(devices: usize, speedup: f64) -> ReplayConfig {
    ReplayConfig {
        engine: EngineConfig {
            devices,
            pages_per_device: 8192,
            ..EngineConfig::default()
        },
        speedup,
        ..ReplayConfig::default()
    }
}

#[test]
fn the_json_summary_has_the_stable_keys() {
    let w = gsp(4, 4, 128, 16, 4, 9);
    let s = replay(&w, &cfg(2, 500.0), &AtomicBool::new(false)).unwrap();
    let v: serde_json::Value = serde_json::to_value(&s).unwrap();
    for key in [
        "requests",
        "hit_rate",
        "hit_rate_per_device",
        "prefill_tokens_saved",
        "ttft_p50_ms",
        "ttft_p99_ms",
        "e2e_p99_ms",
        "throughput_tok_s",
        "router",
        "devices",
        "prompt_tokens",
        "tokens_device_hit",
        "tokens_host_loaded",
        "tokens_peer_copied",
        "tokens_recomputed",
        "reuse_rate",
        "copy_bytes",
        "copy_time_s",
        "max_concurrency",
        "not_sent",
    ] {
        assert!(v.get(key).is_some(), "missing {key}");
    }
    // Every prompt token is in exactly one of the four.
    assert_eq!(
        s.tokens_device_hit + s.tokens_host_loaded + s.tokens_peer_copied + s.tokens_recomputed,
        s.prompt_tokens
    );
    assert_eq!(v["requests"], 16);
    assert_eq!(v["hit_rate_per_device"].as_array().unwrap().len(), 2);
    assert_eq!(v["router"], "cache-aware");
    assert!(s.ttft_p50_ms > 0.0 && s.ttft_p50_ms <= s.e2e_p99_ms);
    assert_eq!(s.prompt_tokens, 16 * 144);
    assert_eq!(s.output_tokens, 16 * 4);
    assert!(format_summaries(&[s.clone(), s]).contains("token hit rate"));
}

#[test]
fn an_interrupt_ends_the_replay_with_a_partial_summary() {
    // Slow (real-time) simulation of long outputs; interrupt after 300 ms:
    // with everything sent at once (the interrupt comes while the replay
    // collects), and with at most 2 outstanding (it comes while the replay
    // waits to send the third).
    let w = gsp(8, 8, 512, 32, 2000, 2);
    for max_concurrency in [None, Some(2)] {
        let stop = AtomicBool::new(false);
        let t = std::time::Instant::now();
        let s = std::thread::scope(|sc| {
            sc.spawn(|| {
                std::thread::sleep(std::time::Duration::from_millis(300));
                stop.store(true, Ordering::Relaxed);
            });
            let c = ReplayConfig {
                max_concurrency,
                ..cfg(2, 1.0)
            };
            replay(&w, &c, &stop).unwrap()
        });
        assert!(t.elapsed() < std::time::Duration::from_secs(60));
        assert!(s.interrupted);
        assert_eq!(
            s.finished + s.failed + s.rejected + s.not_sent,
            64,
            "every request accounted for"
        );
        // The requests in flight when the interrupt came were stopped: an
        // output of 2,000 tokens in real time takes longer than the test.
        assert!(s.failed > 0, "{max_concurrency:?}: {s:?}");
        if max_concurrency.is_some() {
            assert_eq!((s.failed, s.not_sent), (2, 62));
        }
    }
}

#[test]
fn chat_and_tree_of_thought_replays_reuse_their_history() {
    let stop = AtomicBool::new(false);
    for w in [
        chat(
            &ChatShape {
                conversations: 8,
                turns: 4,
                system: 256,
                user: 64,
                assistant: 32,
                gap_ms: 50.0,
                think_ms: 2_000.0,
            },
            3,
        ),
        tree_of_thought(
            &TreeShape {
                problems: 4,
                question: 256,
                branching: 2,
                depth: 3,
                step: 64,
                output: 16,
                gap_ms: 500.0,
                level_ms: 1_000.0,
            },
            3,
        ),
    ] {
        // One request at a time: each turn or branch comes after the one
        // it extends has finished, however loaded the machine is.
        let one_at_a_time = ReplayConfig {
            max_concurrency: Some(1),
            ..cfg(2, 200.0)
        };
        let s = replay(&w, &one_at_a_time, &stop).unwrap();
        assert_eq!(s.finished, w.requests.len(), "{}", w.name);
        // Reused (device hits and copies between the two devices): at
        // least 90 % of the ceiling, which counts every token of the
        // history, where the engine caches the whole pages of a finished
        // request's prompt and output but its last token; never above it.
        assert!(
            s.reuse_rate > 0.9 * s.infinite_cache_hit_rate
                && s.reuse_rate <= s.infinite_cache_hit_rate + 1e-9
                && s.hit_rate <= s.reuse_rate,
            "{}: {} (hits {}) of {}",
            w.name,
            s.reuse_rate,
            s.hit_rate,
            s.infinite_cache_hit_rate
        );
        // And the same figures again: one request at a time, nothing
        // depends on how the threads ran.
        let again = replay(&w, &one_at_a_time, &stop).unwrap();
        assert_eq!(
            (
                again.tokens_device_hit,
                again.tokens_peer_copied,
                again.tokens_recomputed
            ),
            (
                s.tokens_device_hit,
                s.tokens_peer_copied,
                s.tokens_recomputed
            ),
            "{}",
            w.name
        );
    }
}

#[test]
fn the_command_line_names_bad_inputs() {
    let bin = env!("CARGO_BIN_EXE_radixkv");
    let out = Command::new(bin)
        .args([
            "replay",
            "--workload",
            "/nonexistent/trace.jsonl",
            "--quiet",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent/trace.jsonl"), "{err}");

    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let bad = dir.join("bad.jsonl");
    std::fs::write(&bad, "{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [1]}\nnot json\n").unwrap();
    let out = Command::new(bin)
        .args(["replay", "--quiet", "--workload"])
        .arg(&bad)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bad.jsonl") && err.contains('2'),
        "file and line: {err}"
    );

    // Tier options: each a clear error at start, naming what is wrong.
    for (args, says) in [
        (&["replay", "--host-pages", "1"][..], "host tier"),
        (
            &["replay", "--host-pages", "0", "--copy", "host"][..],
            "host tier",
        ),
        (&["replay", "--copy", "sideways"][..], "copy policy"),
        (&["replay", "--write-policy", "never"][..], "write policy"),
        (
            &[
                "replay",
                "--model-shape",
                "layers=0,kv-heads=8,head-dim=128,dtype=bf16",
            ][..],
            "zero layers",
        ),
        (&["replay", "--model-shape", "gpt-9"][..], "model shape"),
        (&["replay", "--host-gbps", "0"][..], "bandwidth"),
        (&["replay", "--peer-gbps=-1"][..], "bandwidth"),
        (&["replay", "--max-concurrency", "0"][..], "max-concurrency"),
        (
            &[
                "replay",
                "--eviction",
                "tlru",
                "--tlru-next-prompt-estimate",
                "4096",
            ][..],
            "--tlru-threshold (4096) must be above",
        ),
    ] {
        let out = Command::new(bin)
            .args(args)
            .arg("--quiet")
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }

    for args in [
        &["replay", "--router", "nope"][..],
        &["replay", "--schedule-policy", "nope"][..],
        &[
            "replay",
            "--speedup",
            "0",
            "--gsp-groups",
            "1",
            "--gsp-prompts",
            "1",
        ][..],
    ] {
        let out = Command::new(bin).args(args).output().unwrap();
        assert!(!out.status.success(), "{args:?}");
        assert!(!out.stderr.is_empty());
    }
}

#[test]
fn the_command_line_compares_copy_policies() {
    let bin = env!("CARGO_BIN_EXE_radixkv");
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("tiers.json");
    let run = Command::new(bin)
        .args([
            "replay",
            "--quiet",
            "--router",
            "round-robin",
            "--gsp-groups",
            "2",
            "--gsp-prompts",
            "4",
            "--gsp-system",
            "256",
            "--output-len",
            "4",
            "--speedup",
            "500",
            "--max-concurrency",
            "1",
            "--compare-copy",
            "none,all",
            "--json",
        ])
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let runs = v.as_array().unwrap();
    assert_eq!(runs.len(), 2);
    assert_eq!(
        (
            runs[0]["copy_policy"].as_str(),
            runs[1]["copy_policy"].as_str()
        ),
        (Some("none"), Some("all"))
    );
    // Without copies the reuse is the device hits exactly; copies only add.
    assert_eq!(runs[0]["reuse_rate"], runs[0]["hit_rate"]);
    assert_eq!(runs[0]["tokens_peer_copied"], 0);
    // One request at a time: with copies, every prompt after its group's
    // first reuses the group's prompt from wherever it is (the ceiling);
    // without, only where round-robin put a prompt of its group before.
    let ceiling = runs[1]["infinite_cache_hit_rate"].as_f64().unwrap();
    let reuse = |r: &serde_json::Value| r["reuse_rate"].as_f64().unwrap();
    assert!((reuse(&runs[1]) - ceiling).abs() < 1e-9, "{runs:?}");
    assert!(reuse(&runs[0]) < reuse(&runs[1]), "{runs:?}");
    let bad = Command::new(bin)
        .args(["replay", "--quiet", "--compare-copy", "none,sideways"])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("copy policy"));
}

#[test]
fn the_command_line_replays_and_compares() {
    let bin = env!("CARGO_BIN_EXE_radixkv");
    let tmp = tempfile::tempdir().unwrap();
    let json = tmp.path().join("compare.json");
    let mut cmd = Command::new(bin);
    cmd.args([
        "replay",
        "--quiet",
        "--gsp-groups",
        "8",
        "--gsp-prompts",
        "4",
        "--gsp-system",
        "256",
        "--gsp-question",
        "16",
        "--output-len",
        "4",
        "--speedup",
        "200",
        "--max-concurrency",
        "1",
        "--compare",
        "cache-aware,private",
        "--json",
    ])
    .arg(&json);
    let v = cli::run_for_json(&mut cmd, &json);
    let runs = v.as_array().unwrap();
    assert_eq!(runs.len(), 2);
    assert_eq!(
        (runs[0]["router"].as_str(), runs[1]["router"].as_str()),
        (Some("cache-aware"), Some("private"))
    );
    // One request at a time: cache-aware finds every group's prompt where
    // it was computed (the ceiling); private trees miss it on each device
    // a group first lands on.
    let (ca, pr) = (
        runs[0]["hit_rate"].as_f64().unwrap(),
        runs[1]["hit_rate"].as_f64().unwrap(),
    );
    let ceiling = runs[0]["infinite_cache_hit_rate"].as_f64().unwrap();
    assert!((ca - ceiling).abs() < 1e-9, "{runs:?}");
    assert!(pr < ca, "{runs:?}");
    assert_eq!(runs[0]["max_concurrency"], 1);
}

/// The binary with `--model tiny`: verification on, bad pool names and
/// `--verify` without the tiny model refused.
#[test]
fn the_command_line_runs_the_tiny_model() {
    let bin = env!("CARGO_BIN_EXE_radixkv");
    let run = |args: &[&str]| {
        std::process::Command::new(bin)
            .args(["replay", "--quiet", "--model", "tiny"])
            .args(args)
            .output()
            .unwrap()
    };
    let out = run(&[
        "--verify",
        "--gsp-groups",
        "3",
        "--gsp-prompts",
        "3",
        "--gsp-system",
        "32",
        "--gsp-question",
        "8",
        "--output-len",
        "2",
        "--devices",
        "2",
        "--page-size",
        "4",
        "--pages-per-device",
        "20",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("verified requests") && text.contains("mismatches"),
        "{text}"
    );
    let out = run(&["--kv-pool", "tpu"]);
    assert!(!out.status.success());
    let out = std::process::Command::new(bin)
        .args(["replay", "--quiet", "--verify"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--model tiny"));
    if !cfg!(feature = "cuda") {
        let out = run(&["--kv-pool", "cuda", "--gsp-groups", "1"]);
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("features cuda") && !err.contains("panicked"),
            "{err}"
        );
    }
}

#[test]
fn kv_event_endpoints_that_cannot_work_are_clear_errors_at_start() {
    let bin = env!("CARGO_BIN_EXE_radixkv");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let in_use = format!("tcp://127.0.0.1:{port}");
    for (args, want) in [
        (vec!["--kv-events", "tcp://127.0.0.1"], "no :PORT"),
        (
            vec!["--kv-events", "localhost:5557"],
            "only tcp://HOST:PORT",
        ),
        (
            vec!["--kv-events", in_use.as_str()],
            "cannot bind the KV-events socket",
        ),
        (
            vec!["--kv-events", "tcp://127.0.0.1:65535", "--devices", "2"],
            "device 1 would need port 65536",
        ),
        (
            vec![
                "--kv-events",
                "tcp://127.0.0.1:5999",
                "--kv-events-encoding",
                "yaml",
            ],
            "unknown KV-event encoding",
        ),
        (
            vec!["--kv-events", "tcp://127.0.0.1:5999", "--compare"],
            "one run",
        ),
    ] {
        for cmd in ["replay", "serve"] {
            if cmd == "serve" && args.contains(&"--compare") {
                continue;
            }
            let mut full = match cmd {
                "replay" => vec![
                    "replay",
                    "--quiet",
                    "--gsp-groups",
                    "1",
                    "--gsp-prompts",
                    "1",
                ],
                _ => vec!["serve", "--port", "0"],
            };
            full.extend(args.iter().copied());
            let out = std::process::Command::new(bin)
                .args(&full)
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{full:?}: {err}");
            assert!(err.contains(want), "{full:?}: {err:?} lacks {want:?}");
            assert!(!err.contains("panicked"), "{full:?}: {err}");
        }
    }
}
