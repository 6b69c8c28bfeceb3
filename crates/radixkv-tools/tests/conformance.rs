//! Every shipped SGLang vector reproduced exactly by the runner's code.

use radixkv::EvictionPolicy;
use radixkv_tools::conformance::Runner;
use serde_json::Value;
use std::path::Path;

fn replay(trace: &Path) -> Vec<Value> {
    let name = trace.file_stem().unwrap().to_str().unwrap();
    let mut parts = name.split('_');
    let ps: usize = parts.next().unwrap()[2..].parse().unwrap();
    let policy: EvictionPolicy = parts.next().unwrap().parse().unwrap();
    let mut runner = Runner::new(ps, policy).unwrap();
    std::fs::read_to_string(trace)
        .unwrap()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| runner.apply(l))
        .collect()
}

#[test]
fn every_shipped_vector_is_reproduced() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/conformance");
    let mut traces: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let n = p.file_name().unwrap().to_str().unwrap();
            n.ends_with(".jsonl") && !n.ends_with(".expected.jsonl")
        })
        .collect();
    traces.sort();
    assert!(
        traces.len() >= 20,
        "expected the 20 shipped vectors, found {}",
        traces.len()
    );
    let mut lines = 0;
    for trace in &traces {
        let expected_path = trace.with_extension("expected.jsonl");
        let expected: Vec<Value> = std::fs::read_to_string(&expected_path)
            .unwrap()
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let got = replay(trace);
        assert_eq!(got.len(), expected.len(), "{}: line count", trace.display());
        for (g, e) in got.iter().zip(&expected) {
            for (k, v) in e.as_object().unwrap() {
                assert_eq!(
                    g.get(k),
                    Some(v),
                    "{}: op {} field {k}: got {g}, want {e}",
                    trace.display(),
                    e["i"]
                );
            }
            lines += 1;
        }
    }
    assert!(lines > 3000);
}

#[test]
fn bad_lines_are_reported_and_the_run_continues() {
    let mut r = Runner::new(2, EvictionPolicy::Lru).unwrap();
    let out: Vec<Value> = [
        r#"{"op":"insert","key":[1,2,3],"value":[1,2,3]}"#,
        r#"{"op":"insert","key":[1,2],"value":[1]}"#,
        r#"not json"#,
        r#"{"op":"frobnicate"}"#,
        r#"{"op":"insert","key":[1,2],"value":[5,6]}"#,
        r#"{"op":"match","key":[1,2,3]}"#,
        r#"{"op":"lock","match":0}"#,
        r#"{"op":"unlock","match":5}"#,
        r#"{"op":"lock","match":5}"#,
        r#"{"op":"evict","tokens":10}"#,
        r#"{"op":"unlock","match":5}"#,
        r#"{"op":"evict","tokens":10}"#,
        r#"{"op":"lock","match":5}"#,
        r#"{"op":"match","key":[-1]}"#,
        r#"{"op":"reset"}"#,
    ]
    .iter()
    .map(|l| r.apply(l))
    .collect();
    let err = |i: usize| out[i].get("error").and_then(Value::as_str).unwrap_or("");
    assert!(
        err(0).contains("not a multiple of the page size"),
        "{}",
        out[0]
    );
    assert!(err(1).contains("1 values for 2 tokens"), "{}", out[1]);
    assert!(err(2).contains("invalid JSON"), "{}", out[2]);
    assert!(out[2].get("op").is_none());
    assert!(err(3).contains("frobnicate"), "{}", out[3]);
    assert_eq!(out[3]["op"], "frobnicate");
    assert_eq!(out[4]["prefix_len"], 0);
    assert_eq!(out[5]["value"], serde_json::json!([5, 6]));
    assert!(
        err(6).contains("op 0 is not a successful match"),
        "{}",
        out[6]
    );
    assert!(
        err(7).contains("no outstanding lock of match 5"),
        "{}",
        out[7]
    );
    assert!(out[8].get("error").is_none());
    assert_eq!(out[8]["protected"], 2);
    assert_eq!(out[9]["evicted"], 0, "the locked node must survive");
    assert!(out[10].get("error").is_none());
    assert_eq!(out[11]["evicted"], 2);
    assert!(err(12).contains("left the tree"), "{}", out[12]);
    assert!(err(13).contains("bad op"), "{}", out[13]);
    assert_eq!(out[14]["nodes"], 0);
    assert_eq!(
        out.iter()
            .map(|o| o["i"].as_u64().unwrap())
            .collect::<Vec<_>>(),
        (0..15).collect::<Vec<_>>()
    );
}
