//! The tiny transformer backend: prefix reuse through the real cache is
//! exact. For prompts sharing prefixes (one device and several, page sizes
//! 1 and 16, after evictions and re-inserts) the logits of every computed
//! position, with the prefix's K/V read from the slots the cache handed
//! out, match a dense recomputation without any pool within 1e-4; a
//! corrupted pool slot is caught (negative controls); the default
//! `replay --model tiny --verify` workload evicts and verifies with no
//! mismatch. With feature `cuda` the same proof runs with the pools in GPU
//! memory (`scripts/gpu-check.sh`), and is skipped without a driver.

mod common;

use radixkv::{DeviceId, PagedCache, RadixCache, Tier, TokenKey};
use radixkv_engine::router::RouterKind;
use radixkv_engine::sched::batch::{Batch, DecodeWork, ModelBackend, PrefillWork, WorkData};
use radixkv_engine::tiers::{CopyPolicy, TierConfig, WritePolicy};
use radixkv_engine::{Engine, EngineConfig, EngineRequest};
use radixkv_models::backend::{
    argmax, Comparison, Logits, ModelError, PagedSeq, PoolConfig, PoolKind,
};
use radixkv_models::kvpool::{HostKvPool, Kv, KvPool};
use radixkv_models::tiny::{TinyBackend, TinyConfig, TinyModel, LOGIT_TOLERANCE, TOLERANCE};
use std::sync::Arc;

/// The tiny model's comparison of one row with the reference's.
fn compare_rows(got: &[f32], want: &[f32]) -> Comparison {
    radixkv_models::backend::compare_rows(got, want, TOLERANCE)
}

fn tiny(pools: PoolConfig) -> Result<TinyBackend, ModelError> {
    TinyBackend::new(TinyModel::new(TinyConfig::default())?, pools)
}

/// Deterministic token ids spread over the whole id space (below 2³¹).
fn ids(seed: u64, n: usize) -> Vec<u32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 33) as u32
        })
        .collect()
}

/// `groups` system prompts of `system` tokens, each followed by `per`
/// different questions of `question` tokens.
fn shared_prompts(groups: u64, per: u64, system: usize, question: usize) -> Vec<Vec<u32>> {
    let mut v = Vec::new();
    for g in 0..groups {
        let sys = ids(1000 + g, system);
        for q in 0..per {
            let mut p = sys.clone();
            p.extend(ids(50_000 + g * 100 + q, question));
            v.push(p);
        }
    }
    v
}

/// Compares the paged logits `got` with the dense reference of `tokens`.
fn check(model: &TinyModel, tokens: &[u32], got: &Logits) -> Comparison {
    let end = got.start + got.rows();
    let dense = model.forward_dense(&tokens[..end]).unwrap();
    let mut c = Comparison::default();
    for pos in got.start..end {
        c.merge(&compare_rows(
            got.position(pos).unwrap(),
            dense.position(pos).unwrap(),
        ));
    }
    c
}

/// What one request through the lifecycle reused and computed.
#[derive(Default, Debug)]
struct Ran {
    cached: usize,
    cmp: Comparison,
}

/// One request through the cache's lifecycle, as the scheduler runs it:
/// begin (match and pin), reserve, a prefill pass over the uncached
/// suffix, commit, then `out - 1` decode steps of one slot each feeding
/// back the argmax, then finish (the last sampled token has no K/V and is
/// not appended). Every computed position is compared with the dense
/// reference.
fn run_request(
    cache: &Arc<PagedCache>,
    dev: DeviceId,
    model: &TinyModel,
    pool: &mut dyn KvPool,
    prompt: &[u32],
    out: usize,
) -> Ran {
    let mut r = cache.begin(TokenKey::new(prompt), dev).unwrap();
    let cached = r.cached_len();
    r.reserve().unwrap();
    let slots = r.slots();
    let seq = PagedSeq {
        tokens: prompt,
        slots: &slots,
        start: cached,
    };
    let lg = model.forward_paged(pool, &[seq], true).unwrap().remove(0);
    assert_eq!((lg.start, lg.rows()), (cached, prompt.len() - cached));
    let mut cmp = check(model, prompt, &lg);
    r.commit_chunk(prompt.len()).unwrap();
    let mut tok = argmax(lg.last().unwrap()).unwrap().0;
    for _ in 1..out {
        r.extend(&[tok]);
        r.reserve().unwrap();
        let tokens = r.tokens().to_vec();
        let slots = r.slots();
        let seq = PagedSeq {
            tokens: &tokens,
            slots: &slots,
            start: tokens.len() - 1,
        };
        let lg = model.forward_paged(pool, &[seq], true).unwrap().remove(0);
        cmp.merge(&check(model, &tokens, &lg));
        tok = argmax(lg.last().unwrap()).unwrap().0;
    }
    r.finish().unwrap();
    Ran { cached, cmp }
}

fn cache(devices: usize, page_size: usize, pages: usize) -> Arc<PagedCache> {
    Arc::new(
        RadixCache::builder()
            .devices(devices)
            .page_size(page_size)
            .pages_per_device(pages)
            .build()
            .unwrap(),
    )
}

#[test]
fn the_dense_reference_is_seeded_and_causal() {
    let m = TinyModel::new(TinyConfig::default()).unwrap();
    let t = ids(1, 12);
    let a = m.forward_dense(&t).unwrap();
    assert_eq!((a.start, a.rows(), a.vocab), (0, 12, 1024));
    assert_eq!(
        a,
        TinyModel::new(TinyConfig::default())
            .unwrap()
            .forward_dense(&t)
            .unwrap()
    );
    let other = TinyModel::new(TinyConfig {
        seed: 8,
        ..TinyConfig::default()
    })
    .unwrap();
    assert_ne!(a, other.forward_dense(&t).unwrap());
    // Causal: a prefix's logits do not depend on what follows.
    let p = m.forward_dense(&t[..5]).unwrap();
    for pos in 0..5 {
        assert!(compare_rows(p.position(pos).unwrap(), a.position(pos).unwrap()).ok());
    }
    // Ids map into the vocabulary by `id % vocab`.
    assert_eq!(m.vocab_index(1024 * 5 + 3), 3);
    let mut shifted = t.clone();
    shifted[3] = shifted[3] % 1024 + 1024 * 77;
    assert_eq!(m.forward_dense(&shifted).unwrap(), a);
    // Not a constant function.
    assert_ne!(a.position(0), a.position(1));
}

#[test]
fn reuse_through_the_cache_matches_dense_page_sizes_1_and_16() {
    let m = TinyModel::new(TinyConfig::default()).unwrap();
    for ps in [1usize, 16] {
        let c = cache(1, ps, 4096 / ps + 1);
        let mut pool =
            HostKvPool::new(m.pool_layout(c.allocator(DeviceId(0)).unwrap().num_pages() * ps));
        let mut total = Comparison::default();
        let mut reused = 0;
        for p in shared_prompts(3, 4, 40, 9) {
            let r = run_request(&c, DeviceId(0), &m, &mut pool, &p, 4);
            reused += r.cached;
            total.merge(&r.cmp);
        }
        // Each group's later prompts reuse the system prompt (whole pages).
        assert!(
            reused >= 3 * 3 * (40 / ps * ps),
            "page size {ps}: reused {reused}"
        );
        assert!(total.ok(), "page size {ps}: {total:?}");
        assert!(total.max_abs_diff <= LOGIT_TOLERANCE);
        assert!(total.argmax_checked > 0, "{total:?}");
        c.audit();
    }
}

#[test]
fn reuse_matches_dense_after_evictions_and_re_inserts() {
    let m = TinyModel::new(TinyConfig::default()).unwrap();
    for ps in [1usize, 16] {
        // 96 tokens per device: the three groups' prefixes (48 tokens
        // each) do not fit together.
        let pages = 96 / ps + 1;
        let c = cache(1, ps, pages);
        let mut pool = HostKvPool::new(m.pool_layout(pages * ps));
        let prompts = shared_prompts(3, 3, 48, 7);
        let mut total = Comparison::default();
        let mut reused_per_round = Vec::new();
        for round in 0..3 {
            let mut reused = 0;
            for p in &prompts {
                let r = run_request(&c, DeviceId(0), &m, &mut pool, p, 3);
                reused += r.cached;
                total.merge(&r.cmp);
            }
            reused_per_round.push(reused);
            if round == 0 {
                // Everything cached goes: the next round inserts it again.
                let e = c.evict(DeviceId(0), usize::MAX).unwrap();
                assert!(e.tokens > 0);
            }
        }
        let ev = c.eviction_metrics(DeviceId(0)).unwrap();
        // Evictions to make room (alloc's), besides the explicit one.
        assert!(
            ev.evicted_tokens > 0 && ev.evict_calls > 1,
            "page size {ps}: {ev:?}"
        );
        assert!(
            reused_per_round.iter().all(|&r| r > 0),
            "{reused_per_round:?}"
        );
        assert!(total.ok(), "page size {ps}: {total:?}");
        c.audit();
    }
}

#[test]
fn reuse_matches_dense_on_several_devices() {
    let m = TinyModel::new(TinyConfig::default()).unwrap();
    for ps in [1usize, 16] {
        let devices = 3;
        let pages = 1024 / ps + 1;
        let c = cache(devices, ps, pages);
        let mut pools: Vec<HostKvPool> = (0..devices)
            .map(|_| HostKvPool::new(m.pool_layout(pages * ps)))
            .collect();
        let mut total = Comparison::default();
        let mut reused = vec![0; devices];
        for (i, p) in shared_prompts(2, 6, 33, 5).iter().enumerate() {
            let d = i % devices;
            let r = run_request(&c, DeviceId(d as u32), &m, &mut pools[d], p, 2);
            reused[d] += r.cached;
            total.merge(&r.cmp);
        }
        // Each device reuses what it cached itself (its own slots).
        assert!(reused.iter().all(|&r| r > 0), "page size {ps}: {reused:?}");
        assert!(total.ok(), "page size {ps}: {total:?}");
        c.audit();
    }
}

#[test]
fn a_corrupted_pool_slot_is_detected() {
    // Negative control: the comparison can fail. One K row of a cached
    // prefix position is overwritten; the request reusing it mismatches.
    let m = TinyModel::new(TinyConfig::default()).unwrap();
    for ps in [1usize, 16] {
        let c = cache(1, ps, 512 / ps + 1);
        let mut pool = HostKvPool::new(m.pool_layout((512 / ps + 1) * ps));
        let prompts = shared_prompts(1, 2, 32, 6);
        assert!(run_request(&c, DeviceId(0), &m, &mut pool, &prompts[0], 2)
            .cmp
            .ok());
        let cached = c
            .match_and_pin(TokenKey::new(&prompts[1]), DeviceId(0))
            .unwrap();
        assert!(cached.len >= 16);
        let slot = cached.values[10];
        drop(cached); // the pin
        let row = vec![0.5f32; m.config().hidden()];
        pool.write_rows(1, Kv::K, &[slot], &row).unwrap();
        let r = run_request(&c, DeviceId(0), &m, &mut pool, &prompts[1], 2);
        assert!(r.cached >= 16);
        assert!(
            !r.cmp.ok(),
            "page size {ps}: corruption not detected: {:?}",
            r.cmp
        );
        assert!(r.cmp.max_abs_diff > LOGIT_TOLERANCE);
    }
}

fn engine_cfg(devices: usize, page_size: usize, pool_tokens: usize) -> EngineConfig {
    EngineConfig {
        devices,
        page_size,
        pages_per_device: pool_tokens / page_size + 1,
        ..EngineConfig::default()
    }
}

fn tiny_backend(cfg: &EngineConfig, verify: bool) -> Arc<TinyBackend> {
    Arc::new(
        tiny(PoolConfig {
            verify,
            ..PoolConfig::for_engine(cfg)
        })
        .unwrap(),
    )
}

/// Submits `prompts` in waves (each wave completes before the next), and
/// returns the prompt tokens the cache served.
/// Starts an engine with `backend`, runs `waves` of the grouped prompts
/// (6 groups × 4 of a 64-token prefix + 10 tokens) with 3 output tokens,
/// shuts it down; returns (cached tokens, evicted tokens).
fn run_grouped_waves(
    cfg: EngineConfig,
    backend: Arc<TinyBackend>,
    waves: impl Fn(&[Vec<u32>]) -> Vec<Vec<Vec<u32>>>,
) -> (usize, u64) {
    let engine = Engine::start(cfg, backend).unwrap();
    let prompts = shared_prompts(6, 4, 64, 10);
    let cached = run_engine(&engine, &waves(&prompts), 3);
    (cached, common::evicted_tokens(&engine.shutdown()))
}

fn run_engine(engine: &Engine, waves: &[Vec<Vec<u32>>], out: usize) -> usize {
    common::run_waves(engine, waves, out)
        .iter()
        .map(|t| t.cached_tokens as usize)
        .sum()
}

#[test]
fn the_engine_reuses_prefixes_exactly_on_several_devices_with_evictions() {
    for ps in [1usize, 16] {
        // Pools of 256 tokens on each of 2 devices: 6 groups of 64-token
        // prefixes do not fit, so prefixes are evicted and come back.
        let cfg = engine_cfg(2, ps, 256);
        let backend = tiny_backend(&cfg, true);
        let (cached, evicted) = run_grouped_waves(cfg, backend.clone(), |p| {
            vec![
                p[..12].to_vec(),
                p[12..].to_vec(),
                p[..12].to_vec(), // evicted by now: inserted again
                p.to_vec(),
            ]
        });
        let s = backend.stats();
        assert!(cached > 0, "page size {ps}: no reuse");
        assert!(evicted > 0, "page size {ps}: no eviction");
        assert!(s.reused_positions > 0);
        assert_eq!(s.stale_reads, 0, "page size {ps}: {s:?}");
        assert!(s.verified_requests >= 60, "page size {ps}: {s:?}");
        assert_eq!(s.mismatches, 0, "page size {ps}: {s:?}");
        assert!(s.comparison.positions >= s.computed_positions);
        assert!(s.comparison.max_abs_diff <= LOGIT_TOLERANCE);
        assert!(s.decode_passes > 0 && s.prefill_passes > 0);
        let v = backend.verification().unwrap();
        assert_eq!((v.verified, v.mismatches), (s.verified_requests, 0));
    }
}

#[test]
fn the_engine_verification_catches_a_corrupted_slot() {
    // Negative control through the engine: corrupt a slot of a cached
    // prefix between waves; the backend's own verification counts it.
    let cfg = engine_cfg(1, 16, 1024);
    let backend = tiny_backend(&cfg, true);
    let engine = Engine::start(cfg, backend.clone()).unwrap();
    let prompts = shared_prompts(1, 3, 48, 8);
    run_engine(&engine, &[vec![prompts[0].clone()]], 2);
    let (cache, dev) = engine.cache(0).unwrap();
    let m = cache
        .match_and_pin(TokenKey::new(&prompts[1]), dev)
        .unwrap();
    assert!(m.len >= 32);
    let slot = m.values[20];
    drop(m); // the pin
    backend
        .with_pool(DeviceId(0), |p| {
            p.write_rows(0, Kv::V, &[slot], &vec![3.0; 128]).unwrap()
        })
        .unwrap();
    run_engine(&engine, &[prompts[1..].to_vec()], 2);
    engine.shutdown();
    let v = backend.verification().unwrap();
    assert_eq!(v.verified, 3);
    assert_eq!(
        v.mismatches, 2,
        "both later requests read the corrupted row"
    );
    assert!(backend.stats().comparison.max_abs_diff > LOGIT_TOLERANCE);
}

/// Copies (issue 16): KV copied from another device's pool, or loaded from
/// the host pool, gives the dense logits, at page sizes 1 and 16; and a
/// corrupted copied slot is caught (negative control). Requests go one
/// after the other, round-robin, so which device copies what is fixed.
#[test]
fn copied_and_host_loaded_kv_match_dense_and_a_corrupted_copy_is_caught() {
    copies_match_dense_and_a_corrupted_copy_is_caught("host pools", &|cfg| tiny_backend(cfg, true));
}

/// The copy proof for pools built by `make` (host pools, or GPU pools in
/// the `cuda` module): at page sizes 1 and 16, a prefix copied from
/// another device's pool or loaded from the host tier gives the dense
/// logits, and one corrupted copied slot makes exactly the request that
/// reads it mismatch.
fn copies_match_dense_and_a_corrupted_copy_is_caught(
    label: &str,
    make: &dyn Fn(&EngineConfig) -> Arc<TinyBackend>,
) {
    for ps in [1usize, 16] {
        for (copy, devices) in [(CopyPolicy::Peer, 2usize), (CopyPolicy::Host, 3)] {
            let mut cfg = engine_cfg(devices, ps, 1024);
            cfg.router.kind = RouterKind::RoundRobin;
            cfg.tiers = TierConfig {
                host_pages: Some(2048 / ps + 1),
                copy,
                write: WritePolicy::WriteThrough,
                load_back_threshold: 1,
                ..TierConfig::default()
            };
            let backend = make(&cfg);
            let engine = Engine::start(cfg, backend.clone()).unwrap();
            let prompts = shared_prompts(1, 4, 48, 8);
            let what = format!("{label}, page size {ps}, {copy}");
            // A on device 0 computes the prefix; B on device 1 copies it
            // (peer) or loads it (host, written through by A).
            run_engine(&engine, &[vec![prompts[0].clone()]], 2);
            run_engine(&engine, &[vec![prompts[1].clone()]], 2);
            let m = &engine.metrics()[1];
            let moved = m.tokens.copied.peer_copied_tokens + m.tokens.copied.host_loaded_tokens;
            assert!(moved >= 48 / ps as u64 * ps as u64, "{what}: {m:?}");
            let s = backend.stats();
            assert!(s.copied_positions >= moved, "{what}: {s:?}");
            assert_eq!((s.mismatches, s.stale_reads), (0, 0), "{what}: {s:?}");
            // Corrupt one copied slot: on device 1 (what it copied), or on
            // the host (what the next load reads).
            let (cache, _) = engine.cache(0).unwrap();
            let tier = match copy {
                CopyPolicy::Peer => Tier::Device(DeviceId(1)),
                _ => Tier::Host,
            };
            let held = cache
                .match_and_pin(TokenKey::new(&prompts[1][..48]), tier)
                .unwrap();
            assert!(held.len >= 32, "{what}");
            let slot = held.values[20];
            drop(held);
            backend
                .with_pool(tier, |p| {
                    p.write_rows(0, Kv::V, &[slot], &vec![3.0; 128]).unwrap()
                })
                .unwrap();
            // Peer: C on device 0 hits its own copy, D on device 1 reads the
            // corrupted one. Host: C on device 2 loads the corrupted slot.
            let rest = match copy {
                CopyPolicy::Peer => vec![prompts[2].clone(), prompts[3].clone()],
                _ => vec![prompts[2].clone()],
            };
            for p in rest {
                run_engine(&engine, &[vec![p]], 2);
            }
            engine.shutdown();
            let v = backend.verification().unwrap();
            println!("{what}: {v:?}");
            assert_eq!(
                v.mismatches, 1,
                "{what}: the request reading the corrupted copy"
            );
        }
    }
}

#[test]
fn the_model_samples_argmax_and_the_workload_wins() {
    // Without fixed outputs the model's argmax is the output; a request's
    // first output is the argmax of the prompt's last position.
    let cfg = engine_cfg(1, 4, 256);
    let backend = tiny_backend(&cfg, false);
    let engine = Engine::start(cfg, backend.clone()).unwrap();
    let prompt = ids(3, 20);
    let (_, rx) = engine
        .submit_streaming(EngineRequest::new(prompt.clone(), 3))
        .unwrap();
    let toks: Vec<u32> = rx
        .iter()
        .filter_map(|e| match e {
            radixkv_engine::sched::scheduler::StreamEvent::Token(t) => Some(t),
            _ => None,
        })
        .collect();
    let m = backend.model();
    let mut ctx = prompt.clone();
    for &t in &toks {
        let d = m.forward_dense(&ctx).unwrap();
        assert_eq!(argmax(d.last().unwrap()).unwrap().0, t);
        ctx.push(t);
    }
    assert_eq!(toks.len(), 3);
    // Teacher forcing: fixed outputs are what the request produces.
    let mut req = EngineRequest::new(ids(4, 20), 3);
    req.output_tokens = Some(vec![7u32 | 0x8000_0000, 8, 9].into());
    let (_, rx) = engine.submit_streaming(req).unwrap();
    let toks: Vec<u32> = rx
        .iter()
        .filter_map(|e| match e {
            radixkv_engine::sched::scheduler::StreamEvent::Token(t) => Some(t),
            _ => None,
        })
        .collect();
    assert_eq!(toks, vec![7 | 0x8000_0000, 8, 9]);
    engine.shutdown();
    assert_eq!(backend.verification(), None);
    assert_eq!(backend.stats().stale_reads, 0);
}

#[test]
fn bad_inputs_are_typed_errors() {
    assert!(matches!(
        TinyModel::new(TinyConfig {
            head_dim: 3,
            ..TinyConfig::default()
        }),
        Err(ModelError::InvalidConfig(_))
    ));
    let m = TinyModel::new(TinyConfig::default()).unwrap();
    assert!(matches!(m.forward_dense(&[]), Err(ModelError::Input(_))));
    let mut pool = HostKvPool::new(m.pool_layout(8));
    let t = [1, 2, 3];
    for (slots, start) in [
        (&[1u32, 2][..], 0),
        (&[1, 2, 3][..], 3),
        (&[1, 2, 99][..], 0),
    ] {
        let r = m.forward_paged(
            &mut pool,
            &[PagedSeq {
                tokens: &t,
                slots,
                start,
            }],
            false,
        );
        assert!(
            matches!(r, Err(ModelError::Input(_) | ModelError::Pool(_))),
            "{r:?}"
        );
    }
    let mut wrong = HostKvPool::new(radixkv_models::kvpool::KvLayout {
        layers: 1,
        slots: 8,
        row: 128,
    });
    let seq = PagedSeq {
        tokens: &t,
        slots: &[1, 2, 3],
        start: 0,
    };
    assert!(matches!(
        m.forward_paged(&mut wrong, &[seq], false),
        Err(ModelError::InvalidConfig(_))
    ));

    let cfg = engine_cfg(1, 4, 64);
    let b = tiny_backend(&cfg, false);
    assert!(b.wants_data());
    let no_data = Batch {
        prefill: vec![PrefillWork {
            request: 1,
            new_tokens: 2,
            context_tokens: 0,
            samples: true,
            data: None,
        }],
        ..Batch::default()
    };
    assert!(b.step(DeviceId(0), &no_data).is_err());
    let bad = Batch {
        prefill: vec![],
        decode: vec![DecodeWork {
            request: 1,
            context_tokens: 2,
            data: Some(WorkData {
                tokens: vec![1, 2],
                slots: vec![4],
                ..WorkData::default()
            }),
        }],
        ..Batch::default()
    };
    let e = b.step(DeviceId(0), &bad).unwrap_err();
    assert!(e.reason.contains("slots"), "{e}");
    let ok = Batch {
        prefill: vec![PrefillWork {
            request: 1,
            new_tokens: 2,
            context_tokens: 0,
            samples: true,
            data: Some(WorkData {
                tokens: vec![1, 2],
                slots: vec![4, 5],
                ..WorkData::default()
            }),
        }],
        ..Batch::default()
    };
    assert!(b.step(DeviceId(7), &ok).is_err(), "unknown device");
    let out = b.step(DeviceId(0), &ok).unwrap();
    assert_eq!(out.next_tokens.len(), 1);
    assert!(out.next_tokens[0].1 < 1024);
    assert!(matches!(
        tiny(PoolConfig {
            devices: 0,
            ..PoolConfig::for_engine(&cfg)
        }),
        Err(ModelError::InvalidConfig(_))
    ));
    assert!("tpu".parse::<PoolKind>().is_err());
}

#[test]
fn a_cuda_pool_is_an_error_not_a_panic_without_a_gpu() {
    let cfg = engine_cfg(2, 16, 256);
    let r = tiny(PoolConfig {
        pool: "cuda".parse().unwrap(),
        ..PoolConfig::for_engine(&cfg)
    });
    let cuda = cfg!(feature = "cuda");
    match r {
        Err(ModelError::CudaNotBuilt) if !cuda => {}
        Err(ModelError::Pool(radixkv_models::kvpool::KvPoolError::NoCudaDriver)) if cuda => {}
        Ok(_) if cuda => {} // a machine with a GPU
        Ok(_) => panic!("a GPU pool without feature cuda"),
        Err(e) => panic!("unexpected: {e}"),
    }
}

/// The reuse proof with the pools in GPU memory: ignored by default (it
/// needs a CUDA driver and fails without one); `scripts/gpu-check.sh` runs
/// it.
#[cfg(feature = "cuda")]
mod cuda {
    use super::*;
    use radixkv_models::kvpool::{CudaKvPool, KvPoolError};

    fn gpu_backend(cfg: &EngineConfig) -> Arc<TinyBackend> {
        match tiny(PoolConfig {
            verify: true,
            pool: PoolKind::Cuda,
            ..PoolConfig::for_engine(cfg)
        }) {
            Ok(b) => Arc::new(b),
            Err(e) => panic!("this GPU check needs a working CUDA driver: {e}"),
        }
    }

    /// Without a driver, a GPU backend is the typed pool error, not a panic.
    #[test]
    fn cuda_backend_without_a_driver_is_a_typed_error() {
        let cfg = engine_cfg(1, 16, 64);
        let r = tiny(PoolConfig {
            pool: PoolKind::Cuda,
            ..PoolConfig::for_engine(&cfg)
        });
        match r {
            Ok(_) | Err(ModelError::Pool(KvPoolError::NoCudaDriver)) => {}
            Err(e) => panic!("a GPU backend is Ok or NoCudaDriver, not {e}"),
        }
    }

    #[test]
    #[ignore = "needs a CUDA driver: scripts/gpu-check.sh runs it"]
    fn cuda_tiny_reuse_matches_dense_with_gpu_pools() {
        let m = TinyModel::new(TinyConfig::default()).unwrap();
        for ps in [1usize, 16] {
            // Lifecycle with a GPU pool, evictions included.
            let pages = 96 / ps + 1;
            let c = cache(1, ps, pages);
            let mut pool = match CudaKvPool::new(0, m.pool_layout(pages * ps)) {
                Ok(p) => p,
                Err(e) => panic!("this GPU check needs a working CUDA driver: {e}"),
            };
            let mut total = Comparison::default();
            let mut reused = 0;
            for round in 0..2 {
                for p in &shared_prompts(3, 3, 48, 7) {
                    let r = run_request(&c, DeviceId(0), &m, &mut pool, p, 3);
                    reused += r.cached;
                    total.merge(&r.cmp);
                }
                if round == 0 {
                    c.evict(DeviceId(0), usize::MAX).unwrap();
                }
            }
            assert!(reused > 0 && total.ok(), "page size {ps}: {total:?}");
            println!("GPU pool, page size {ps}: {total:?}");

            // The engine on two devices with GPU pools.
            let cfg = engine_cfg(2, ps, 256);
            let backend = gpu_backend(&cfg);
            let (cached, evicted) = run_grouped_waves(cfg, backend.clone(), |p| {
                vec![p[..12].to_vec(), p[12..].to_vec(), p.to_vec()]
            });
            let s = backend.stats();
            println!(
                "GPU pools, engine, page size {ps}: cached {cached}, evicted {evicted}, {s:?}"
            );
            assert!(cached > 0 && evicted > 0);
            assert!(s.verified_requests >= 48);
            assert_eq!((s.mismatches, s.stale_reads), (0, 0));
        }
    }

    /// Copies (issue 16) with GPU pools: KV copied between two devices'
    /// GPU pools (GPU to GPU) or loaded from the host tier, which is then
    /// a pinned pool (host writes GPU to pinned, loads pinned to GPU),
    /// gives the dense logits at page sizes 1 and 16; a corrupted copied
    /// slot is caught (negative control).
    #[test]
    #[ignore = "needs a CUDA driver: scripts/gpu-check.sh runs it"]
    fn cuda_copied_and_host_loaded_kv_match_dense_with_gpu_pools() {
        use radixkv_models::kvpool::PinnedKvPool;
        super::copies_match_dense_and_a_corrupted_copy_is_caught("GPU pools", &|cfg| {
            let backend = gpu_backend(cfg);
            let pinned = backend
                .with_pool(Tier::Host, |p| p.as_any().is::<PinnedKvPool>())
                .unwrap();
            assert!(pinned, "the host tier of GPU pools is pinned");
            backend
        });
    }
}

/// A request's last output token never gets K/V (it is never fed back), so
/// it must not be cached. Found by this backend: the scheduler used to
/// append it to the request before `Request::finish`, which caches every
/// token with a slot; when the last token completed a page the request
/// already held, its never-written slot was cached, and a later prompt
/// quoting the output (a chat's next turn) read stale K/V.
#[test]
fn the_last_output_token_is_not_cached_without_its_kv() {
    let cfg = engine_cfg(1, 16, 512);
    let backend = tiny_backend(&cfg, true);
    let engine = Engine::start(cfg, backend.clone()).unwrap();
    let prompt = ids(9, 30);
    let reply = [11u32, 12];
    // 30 prompt + 2 output tokens = 32: the last one completes page 2.
    let mut first = EngineRequest::new(prompt.clone(), 2);
    first.output_tokens = Some(reply.to_vec().into());
    engine.submit(first).unwrap();
    assert!(engine.completions().recv().unwrap().error.is_none());
    let mut next = prompt.clone();
    next.extend(reply);
    next.extend(ids(10, 8));
    engine.submit(EngineRequest::new(next, 1)).unwrap();
    let c = engine.completions().recv().unwrap();
    engine.shutdown();
    let s = backend.stats();
    assert_eq!(
        c.tokens.cached_tokens, 16,
        "only what has K/V may be reused: {s:?}"
    );
    assert_eq!((s.stale_reads, s.mismatches), (0, 0), "{s:?}");
}
