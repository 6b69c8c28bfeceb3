//! What the engine-level tests (tests/tiny.rs, tests/gguf.rs,
//! tests/llama_cpp.rs) share: running waves of prompts through a started
//! engine, reading a shut-down engine's evictions, finding SmolLM2's
//! GGUF, and candle-transformers' llama over it (`candle_llama`).
#![allow(dead_code)] // each test binary uses its own part of this

#[cfg(feature = "gguf")]
pub mod candle_llama;

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

/// SmolLM2-135M-Instruct's GGUF: `RADIXKV_SMOLLM2`, else where
/// `scripts/fetch-smollm2.sh` caches it (`$RADIXKV_CACHE`, default
/// `~/.cache/radixkv`). A file that cannot be opened fails the test and
/// says how to get it.
#[cfg(feature = "gguf")]
pub fn smollm2() -> radixkv_models::gguf::GgufFile {
    use std::path::PathBuf;
    let path = std::env::var_os("RADIXKV_SMOLLM2")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME")
                .map(PathBuf::from)
                .unwrap_or_default();
            let cache = std::env::var_os("RADIXKV_CACHE")
                .map(PathBuf::from)
                .unwrap_or_else(|| home.join(".cache/radixkv"));
            cache.join("smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
        });
    radixkv_models::gguf::GgufFile::open(&path).unwrap_or_else(|e| {
        panic!("{e}: run `bash scripts/fetch-smollm2.sh` (or set RADIXKV_SMOLLM2)")
    })
}
