//! SmolLM2-135M-Instruct from its GGUF: the tokenizer and chat template its
//! metadata describes, the dense reference answering a question, and the
//! reuse proof on a real model: the paged model, its K/V in the engine's
//! pools at the cache's slots, gives the dense reference's logits within
//! 1e-2 for every request whose prefix came from the cache (a device hit,
//! a host load, a copy from the other device), at page sizes 1 and 16,
//! after evictions and re-insertions; a corrupted slot is caught. The file
//! comes from `scripts/fetch-smollm2.sh` (found through `RADIXKV_SMOLLM2`,
//! default the script's cache); without it these tests fail and say how
//! to get it.
#![cfg(feature = "gguf")]

mod common;

use common::smollm2 as model;
use radixkv::{DeviceId, Tier, TokenKey};
use radixkv_engine::backend::ModelBackend;
use radixkv_engine::gguf::{
    GgufBackend, GgufError, GgufFile, LlamaModel, Message, LOGIT_TOLERANCE,
};
use radixkv_engine::kvpool::{HostKvPool, Kv, KvPool};
use radixkv_engine::paged::{compare_rows, ModelError, PagedModel, PagedSeq, PoolConfig};
use radixkv_engine::router::RouterKind;
use radixkv_engine::{Engine, EngineConfig, EngineRequest};
use std::sync::{Arc, OnceLock};

#[test]
fn the_tokenizer_round_trips_and_knows_its_control_tokens() {
    let f = model();
    let t = f.tokenizer().unwrap();
    assert_eq!(t.id("<|im_start|>"), Some(1));
    assert_eq!(t.id("<|im_end|>"), Some(2));
    assert_eq!(f.eos(), Some(2));
    for text in [
        "Hello, world!",
        "The year 2026 has 365 days.",
        "  leading spaces, tabs\tand\nnewlines",
        "café, naïve, 東京, emoji 🚀",
    ] {
        let ids = t.encode(text).unwrap();
        assert!(
            !ids.is_empty() && ids.len() < text.len() + 4,
            "{text}: {ids:?}"
        );
        assert_eq!(t.decode(&ids).unwrap(), text);
    }
    // Digits are split one by one (the `smollm` pre-tokenizer).
    assert_eq!(t.encode("2026").unwrap().len(), 4);
    // Control tokens written in the text are their ids, never split.
    let ids = t.encode("<|im_start|>user\nHi<|im_end|>").unwrap();
    assert_eq!((ids[0], *ids.last().unwrap()), (1, 2), "{ids:?}");
}

#[test]
fn the_chat_template_is_chatml_with_its_default_system_prompt() {
    let f = model();
    let prompt = f
        .template()
        .unwrap()
        .render(&[Message::user("Hi")], true)
        .unwrap();
    assert!(prompt.starts_with("<|im_start|>system\n"), "{prompt}");
    assert!(
        prompt.contains("<|im_start|>user\nHi<|im_end|>\n"),
        "{prompt}"
    );
    assert!(prompt.ends_with("<|im_start|>assistant\n"), "{prompt}");
    let own = f
        .template()
        .unwrap()
        .render(&[Message::system("Be brief."), Message::user("Hi")], false)
        .unwrap();
    assert!(
        own.starts_with("<|im_start|>system\nBe brief.<|im_end|>"),
        "{own}"
    );
}

#[test]
fn the_dense_reference_answers_a_question() {
    let f = model();
    let t = f.tokenizer().unwrap();
    let prompt = f
        .template()
        .unwrap()
        .render(
            &[Message::user(
                "What is the capital of France? Answer in one word.",
            )],
            true,
        )
        .unwrap();
    let ids = t.encode(&prompt).unwrap();
    let mut m = f.dense().unwrap();
    let out = m.greedy(&ids, 16, f.eos()).unwrap();
    let text = t.decode(&out).unwrap();
    // llama.cpp on the same file answers "The capital of France is Paris."
    assert!(text.contains("Paris"), "{text:?}");
    assert_eq!(out.last(), Some(&2), "it ends its turn: {text:?}");
}

/// The paged model, loaded once for the tests of this file.
fn llama() -> &'static LlamaModel {
    static M: OnceLock<LlamaModel> = OnceLock::new();
    M.get_or_init(|| model().llama().unwrap())
}

/// Text of some length, tokenized: a shared "system prompt" and questions.
fn text_ids(f: &GgufFile, text: &str) -> Vec<u32> {
    f.tokenizer().unwrap().encode(text).unwrap()
}

const SYSTEM: &str = "You are a careful assistant for a library. The library opens at nine \
    in the morning and closes at six in the evening, except on Sundays, when it is closed. \
    Members may borrow up to five books at once, for three weeks each; a book may be \
    renewed twice unless someone else has reserved it.";

#[test]
fn the_paged_model_reuses_a_prefix_from_the_pool_exactly() {
    let f = model();
    let m = llama();
    assert_eq!(m.config().kv_row(), 3 * 64);
    assert_eq!(m.config().kv_bytes_per_token(), 30 * 2 * 192 * 4);
    let mut ids = text_ids(&f, SYSTEM);
    let prefix = ids.len();
    ids.extend(text_ids(&f, " How many books may a member borrow?"));
    let slots: Vec<u32> = (0..ids.len() as u32).map(|i| 1000 - 3 * i).collect();
    let mut pool = HostKvPool::new(m.pool_layout(1024));
    // The prefix first, then the question over its K/V read from the pool.
    let seq = |end, start| PagedSeq {
        tokens: &ids[..end],
        slots: &slots,
        start,
    };
    m.forward_paged(&mut pool, &[seq(prefix, 0)], false)
        .unwrap();
    let paged = m
        .forward_paged(&mut pool, &[seq(ids.len(), prefix)], true)
        .unwrap();
    let positions: Vec<usize> = (prefix..ids.len()).collect();
    let reference = m.reference(&ids, &positions).unwrap();
    for (i, &p) in positions.iter().enumerate() {
        let c = compare_rows(paged[0].position(p).unwrap(), &reference[i], m.tolerance());
        assert!(c.ok(), "position {p}: {c:?}");
    }
    // Negative control: a corrupted prefix slot changes the logits.
    let bad = slots[prefix / 2];
    pool.write_rows(3, Kv::K, &[bad], &vec![4.0; 192]).unwrap();
    let again = m
        .forward_paged(&mut pool, &[seq(ids.len(), ids.len() - 1)], false)
        .unwrap();
    let c = compare_rows(
        again[0].last().unwrap(),
        reference.last().unwrap(),
        m.tolerance(),
    );
    assert!(c.max_abs_diff > LOGIT_TOLERANCE, "{c:?}");
}

/// Runs `prompts` in waves on an engine over the GGUF backend; returns
/// the backend and, summed over the requests, (device hits, host loads,
/// peer copies) in tokens, and the tokens evicted.
fn run_engine(cfg: EngineConfig, waves: &[Vec<Vec<u32>>]) -> (Arc<GgufBackend>, [u64; 3], u64) {
    let pools = PoolConfig {
        verify: true,
        ..PoolConfig::for_engine(&cfg)
    };
    let model = model().llama().unwrap();
    let backend = Arc::new(GgufBackend::new(model, pools).unwrap());
    let engine = Engine::start(cfg, backend.clone()).unwrap();
    let mut reuse = [0u64; 3];
    for t in common::run_waves(&engine, waves, 3) {
        reuse[0] += t.cached_tokens;
        reuse[1] += t.copied.host_loaded_tokens;
        reuse[2] += t.copied.peer_copied_tokens;
    }
    let evicted = common::evicted_tokens(&engine.shutdown());
    (backend, reuse, evicted)
}

#[test]
fn prefixes_from_the_device_the_host_tier_and_the_other_device_match_the_dense_reference() {
    let f = model();
    let systems: Vec<Vec<u32>> = ["", " Fines are ten cents a day.", " Guests need a pass."]
        .iter()
        .map(|extra| text_ids(&f, &format!("{SYSTEM}{extra}")))
        .collect();
    let questions = [
        " When does it open?",
        " Can I renew a book?",
        " Is it open on Sunday?",
    ];
    let prompt = |s: usize, q: usize| {
        let mut p = systems[s].clone();
        p.extend(text_ids(&f, questions[q]));
        p
    };
    for ps in [1usize, 16] {
        // Round-robin over 2 devices with pools of 112 tokens: each system
        // prompt (~70 tokens) evicts older ones, the host tier keeps them
        // all, and the other device often holds the prefix.
        let cfg = EngineConfig {
            devices: 2,
            page_size: ps,
            pages_per_device: 112 / ps + 1,
            ..EngineConfig::default()
        };
        let mut cfg = cfg;
        cfg.router.kind = RouterKind::RoundRobin;
        cfg.tiers.host_pages = Some(2048 / ps);
        cfg.tiers.load_back_threshold = 1;
        let waves: Vec<Vec<Vec<u32>>> = (0..3)
            .flat_map(|q| (0..3).map(move |s| (s, q)))
            .map(|(s, q)| vec![prompt(s, q)])
            .collect();
        let (backend, [hit, host, peer], evicted) = run_engine(cfg, &waves);
        let s = backend.stats();
        assert_eq!(s.verified_requests, 9, "page size {ps}: {s:?}");
        assert_eq!(s.mismatches, 0, "page size {ps}: {s:?}");
        assert_eq!(s.stale_reads, 0, "page size {ps}: {s:?}");
        assert!(s.comparison.max_abs_diff <= LOGIT_TOLERANCE, "{s:?}");
        assert!(s.comparison.argmax_checked > 0, "{s:?}");
        assert!(evicted > 0, "page size {ps}: no eviction");
        assert!(hit + host + peer > 0, "page size {ps}: no reuse");
        assert!(host + peer > 0, "page size {ps}: no copy (hit {hit})");
        eprintln!(
            "page size {ps}: hits {hit}, host loads {host}, peer copies {peer}, \
             evicted {evicted}, max |Δlogit| {:e}",
            s.comparison.max_abs_diff
        );
    }
}

#[test]
fn the_engine_verification_catches_a_corrupted_slot_of_the_real_model() {
    let f = model();
    let mut cfg = EngineConfig {
        devices: 1,
        pages_per_device: 64,
        ..EngineConfig::default()
    };
    cfg.tiers.host_pages = None;
    let pools = PoolConfig {
        verify: true,
        ..PoolConfig::for_engine(&cfg)
    };
    let backend = Arc::new(GgufBackend::new(model().llama().unwrap(), pools).unwrap());
    let engine = Engine::start(cfg, backend.clone()).unwrap();
    let first = text_ids(&f, &format!("{SYSTEM} When does it open?"));
    let second = text_ids(&f, &format!("{SYSTEM} Can I renew a book?"));
    engine.submit(EngineRequest::new(first, 2)).unwrap();
    assert!(engine.completions().recv().unwrap().error.is_none());
    let (cache, dev) = engine.cache(0).unwrap();
    let m = cache.match_and_pin(TokenKey::new(&second), dev).unwrap();
    assert!(m.len >= 32, "{}", m.len);
    let slot = m.values[20];
    drop(m);
    backend
        .with_pool(DeviceId(0), |p| {
            p.write_rows(5, Kv::V, &[slot], &vec![2.0; 192]).unwrap()
        })
        .unwrap();
    engine.submit(EngineRequest::new(second, 2)).unwrap();
    assert!(engine.completions().recv().unwrap().error.is_none());
    engine.shutdown();
    let v = backend.verification().unwrap();
    assert_eq!((v.verified, v.mismatches), (2, 1));
    assert!(
        backend.with_pool(Tier::Host, |_| ()).is_err(),
        "no host tier here"
    );
}

#[test]
fn prompts_past_the_context_are_refused_not_computed() {
    let m = llama();
    let n = m.config().context + 1;
    let ids = vec![5u32; n];
    let slots: Vec<u32> = (0..n as u32).collect();
    let mut pool = HostKvPool::new(m.pool_layout(n + 1));
    let r = m.forward_paged(
        &mut pool,
        &[PagedSeq {
            tokens: &ids,
            slots: &slots,
            start: 0,
        }],
        false,
    );
    assert!(
        matches!(r, Err(ModelError::Input(ref why)) if why.contains("context")),
        "{r:?}"
    );
    let small = HostKvPool::new(m.pool_layout(4));
    assert_eq!(small.layout().row, 192);
}

/// A GGUF of another architecture, pre-tokenizer or tensor type is a
/// typed error naming what is unsupported; a missing file says which.
#[test]
fn other_architectures_tokenizers_and_tensor_types_are_refused_by_name() {
    use candle_core::quantized::gguf_file::{self, Value};
    use candle_core::quantized::{GgmlDType, QTensor};
    use candle_core::{Device, Tensor};
    let dir = std::env::temp_dir().join(format!("radixkv-gguf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let write = |name: &str, arch: &str, pre: &str, dtype: GgmlDType| {
        let t = Tensor::zeros((32, 32), candle_core::DType::F32, &Device::Cpu).unwrap();
        let q = QTensor::quantize(&t, dtype).unwrap();
        let path = dir.join(name);
        let mut f = std::fs::File::create(&path).unwrap();
        let (a, m, p) = (
            Value::String(arch.into()),
            Value::String("gpt2".into()),
            Value::String(pre.into()),
        );
        let meta = [
            ("general.architecture", &a),
            ("tokenizer.ggml.model", &m),
            ("tokenizer.ggml.pre", &p),
        ];
        gguf_file::write(&mut f, &meta, &[("token_embd.weight", &q)]).unwrap();
        GgufFile::open(&path).unwrap()
    };
    let e = write("arch.gguf", "gpt2", "smollm", GgmlDType::F32)
        .llama()
        .unwrap_err();
    assert!(
        matches!(&e, GgufError::Unsupported(w) if w.contains("gpt2")),
        "{e}"
    );
    let e = write("pre.gguf", "llama", "llama-bpe", GgmlDType::F32)
        .tokenizer()
        .unwrap_err();
    assert!(
        matches!(&e, GgufError::Unsupported(w) if w.contains("llama-bpe")),
        "{e}"
    );
    let e = write("type.gguf", "llama", "smollm", GgmlDType::Q8_1)
        .llama()
        .unwrap_err();
    assert!(
        matches!(&e, GgufError::Unsupported(w) if w.contains("Q8_1")),
        "{e}"
    );
    let e = GgufFile::open(dir.join("missing.gguf")).unwrap_err();
    assert!(e.to_string().contains("missing.gguf"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}
