//! Prefill and decode speed of radixkv's paged GGUF model on this CPU:
//! `PROMPT_TOKENS` tokens (default 1,500) of the text in `--text FILE` (or a
//! built-in paragraph, repeated) prefilled in chunks of 512 through a KV
//! pool, then `DECODE_STEPS` greedy decode steps (default 64; more make a
//! profile of decode alone easy to take); printed as JSON. `scripts/model-bench.sh`
//! runs it beside llama.cpp on the same GGUF and thread count.
//!
//! ```text
//! cargo run --release -p radixkv-models --example gguf_speed -- MODEL.gguf [--text FILE]
//! ```

use radixkv_engine::sched::sampling::Sampling;
use radixkv_models::backend::{PagedModel, PagedSeq};
use radixkv_models::gguf::GgufFile;
use radixkv_models::kvpool::HostKvPool;
use std::time::Instant;

const PARAGRAPH: &str = "The city library opens at nine in the morning and closes at six in \
    the evening, except on Sundays, when it is closed all day. Members may borrow up to five \
    books at once, for three weeks each; a book may be renewed twice unless someone else has \
    reserved it. ";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let path = args
        .first()
        .ok_or("usage: gguf_speed MODEL.gguf [--text FILE]")?;
    let text = match args.iter().position(|a| a == "--text") {
        Some(i) => std::fs::read_to_string(args.get(i + 1).ok_or("--text needs a file")?)?,
        None => PARAGRAPH.repeat(40),
    };
    let n: usize = std::env::var("PROMPT_TOKENS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1500);
    let f = GgufFile::open(path)?;
    let mut ids = f.tokenizer()?.encode(&text)?;
    if ids.len() < n {
        return Err(format!("the text has {} tokens, fewer than {n}", ids.len()).into());
    }
    ids.truncate(n);
    let m = f.llama()?;
    let steps: usize = std::env::var("DECODE_STEPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64);
    let slots: Vec<u32> = (0..(n + steps) as u32).collect();
    let mut pool = HostKvPool::new(m.pool_layout(n + steps));
    let t0 = Instant::now();
    let mut last = Vec::new();
    for start in (0..n).step_by(512) {
        let seq = PagedSeq {
            tokens: &ids[..(start + 512).min(n)],
            slots: &slots,
            start,
        };
        last = m.forward_paged(&mut pool, &[seq], false)?;
    }
    let prefill = t0.elapsed().as_secs_f64();
    let greedy = Sampling::default();
    let t0 = Instant::now();
    for _ in 0..steps {
        let row = last[0].last().ok_or("no logits")?;
        let next = greedy.sample(row, ids.len() - 1).ok_or("no token")?;
        ids.push(next);
        let seq = PagedSeq {
            tokens: &ids,
            slots: &slots,
            start: ids.len() - 1,
        };
        last = m.forward_paged(&mut pool, &[seq], false)?;
    }
    let decode = t0.elapsed().as_secs_f64();
    println!(
        "{{\"prefill_tokens\": {n}, \"prefill_tokens_per_s\": {:.1}, \"decode_tokens_per_s\": {:.1}}}",
        n as f64 / prefill,
        steps as f64 / decode
    );
    Ok(())
}
