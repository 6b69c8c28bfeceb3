//! What the engine-level tests (tests/tiny.rs, tests/gguf.rs) share:
//! running waves of prompts through a started engine, and reading a
//! shut-down engine's evictions.
#![allow(dead_code)] // each test binary uses its own part of this

use radixkv_engine::{Engine, EngineReport, EngineRequest, PromptTokens};

/// Submits each wave of prompts (`out` output tokens each) and waits for
/// every completion of a wave before submitting the next; returns the
/// prompt tokens' accounting of every completion, in arrival order. A
/// completion with an error fails the test.
pub fn run_waves(engine: &Engine, waves: &[Vec<Vec<u32>>], out: usize) -> Vec<PromptTokens> {
    let mut done = Vec::new();
    for wave in waves {
        for p in wave {
            engine.submit(EngineRequest::new(p.clone(), out)).unwrap();
        }
        for _ in wave {
            let c = engine.completions().recv().unwrap();
            assert!(c.error.is_none(), "{c:?}");
            done.push(c.tokens);
        }
    }
    done
}

/// Tokens evicted over all the report's devices.
pub fn evicted_tokens(report: &EngineReport) -> u64 {
    report
        .devices
        .iter()
        .map(|d| d.eviction.evicted_tokens)
        .sum()
}
