//! SmolLM2-135M-Instruct from its GGUF: the tokenizer and chat template its
//! metadata describes, and the dense reference answering a question. The
//! file comes from `scripts/fetch-smollm2.sh` (found through
//! `RADIXKV_SMOLLM2`, default the script's cache); without it these tests
//! fail and say how to get it.
#![cfg(feature = "gguf")]

use radixkv_engine::gguf::{GgufFile, Message};
use std::path::PathBuf;

fn model() -> GgufFile {
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
    GgufFile::open(&path).unwrap_or_else(|e| {
        panic!("{e}: run `bash scripts/fetch-smollm2.sh` (or set RADIXKV_SMOLLM2)")
    })
}

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
