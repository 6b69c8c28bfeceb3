//! The default tiny-model replay (`radixkv replay --model tiny`): every
//! request whose prefix came from the cache is verified against a dense
//! recomputation, at page sizes 1 and 16, with evictions.
#![cfg(feature = "candle")]

use radixkv_engine::EngineConfig;
use radixkv_models::backend::PoolKind;
use radixkv_models::tiny::{default_pages_per_device, TinyConfig};
use radixkv_tools::replay::{replay, tiny_default_workload, ReplayConfig, ReplayModel};
use std::sync::atomic::AtomicBool;

fn tiny_replay(page_size: usize) -> ReplayConfig {
    ReplayConfig {
        engine: EngineConfig {
            devices: 2,
            page_size,
            pages_per_device: default_pages_per_device(page_size),
            ..EngineConfig::default()
        },
        model: ReplayModel::Tiny {
            model: TinyConfig::default(),
            pool: PoolKind::Host,
            verify: true,
        },
        ..ReplayConfig::default()
    }
}

#[test]
fn the_default_tiny_replay_verifies_with_evictions() {
    let w = tiny_default_workload(42);
    assert!(w.requests.len() >= 200);
    for ps in [1usize, 16] {
        let s = replay(&w, &tiny_replay(ps), &AtomicBool::new(false)).unwrap();
        let evicted: u64 = s.evicted_tokens_per_device.iter().sum();
        assert_eq!(s.finished, w.requests.len(), "page size {ps}: {s:?}");
        assert!(s.devices >= 2);
        assert!(evicted > 0, "page size {ps}: no eviction");
        assert!(s.reuse_rate > 0.2, "page size {ps}: reuse {}", s.reuse_rate);
        assert!(s.verified_requests >= w.requests.len() as u64);
        assert_eq!(s.mismatches, 0, "page size {ps}");
        let v: serde_json::Value = serde_json::to_value(&s).unwrap();
        assert_eq!(v["mismatches"], 0);
        assert!(v["verified_requests"].as_u64().unwrap() >= 256);
        let text = radixkv_tools::replay::format_summaries(&[s]);
        assert!(text.contains("verified requests") && text.contains("mismatches"));
        eprintln!("page size {ps}:\n{text}");
    }
}
