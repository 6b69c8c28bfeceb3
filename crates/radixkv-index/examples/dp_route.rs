//! The cost of one `DpRouter` dispatch on a long prompt, by part: the
//! index walk (`scores`, hashing the prompt's blocks included), the
//! prompts-sent lookup (`PendingIndex::longest_pages`, from the block hashes)
//! and the whole `route` (walk, lookup, recording the prompt as sent and
//! forgetting the oldest past the token budget). Opt-in:
//!
//! ```text
//! cargo run --release -p radixkv-index --example dp_route [PAGES] [PAGE_SIZE]
//! ```
//!
//! Defaults: 4,400 pages of 4 tokens (an agentic trace's 70,000-token
//! prompt as `scripts/dp_sim.py` models it), 8 ranks, the prompt cached on
//! one of them.

use radixkv_events::wire::{encode_batch, Encoding, KvEvent, Medium};
use radixkv_index::dp::{DpPolicy, DpRouter, RankLoad};
use std::time::{Duration, Instant};

fn per_call(n: u32, mut f: impl FnMut()) -> f64 {
    let t = Instant::now();
    for _ in 0..n {
        f();
    }
    t.elapsed().as_secs_f64() / f64::from(n) * 1e6
}

fn main() {
    let mut args = std::env::args().skip(1);
    let pages: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(4400);
    let page: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(4);
    let policy = DpPolicy {
        pending_ttl: Duration::from_secs(3600),
        ..DpPolicy::default()
    };
    let r = DpRouter::new(8, page, policy).expect("a router");
    let tokens: Vec<u32> = (0..(pages * page) as u32).map(|i| i * 7 + 1).collect();
    let stored = KvEvent::BlockStored {
        block_hashes: (1..=pages as u64).collect(),
        parent_block_hash: None,
        token_ids: tokens.clone(),
        block_size: page,
        medium: Medium::Gpu,
        lora_name: None,
        cache_salt: None,
    };
    r.ingest(3, &encode_batch(0.0, &[stored], None, Encoding::Map), None)
        .expect("a batch");
    let loads = vec![RankLoad::idle(); 8];
    let pages_hashed = radixkv_index::local_hash::block_hashes(
        &tokens,
        page,
        radixkv_index::local_hash::seed(None, None),
    );
    let pending = radixkv::routing::PendingIndex::new(8, page);
    pending.add_pages(&pages_hashed, 3);
    let n = 2000;
    let scores = per_call(n, || {
        std::hint::black_box(r.scores(&tokens, None));
    });
    let longest = per_call(n, || {
        std::hint::black_box(pending.longest_pages(&pages_hashed));
    });
    let route = per_call(n, || {
        std::hint::black_box(r.route(&tokens, None, &loads).expect("a route"));
    });
    println!(
        "{pages} pages of {page}: scores {scores:.1} µs, PendingIndex::longest_pages {longest:.1} µs, route {route:.1} µs per call"
    );
}
