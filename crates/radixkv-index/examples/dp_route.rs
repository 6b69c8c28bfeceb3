//! The cost of one `DpRouter` dispatch on a long prompt, by part: hashing
//! the prompt's blocks (`hashes`), and chaining them as the prompts-sent
//! index names them (`hashes+chain`, `chain alone`), the index walk
//! (`scores`, hashing included), the prompts-sent lookup
//! (`PendingIndex::longest_pages`, chaining included) and the whole
//! `route` (hashing, walk, lookup, recording the prompt as sent and
//! forgetting the oldest past the token budget; then again with new
//! prefixes placed by the ranks' recent writes), each the fastest of 20
//! rounds with everything in the cache; then the prompts-sent index with
//! 64 long prompts pending and the cache flushed before each call, as a
//! dispatcher meets it between other work. Opt-in:
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

/// Microseconds per call of `f`: the fastest of 20 rounds of `n / 20`
/// calls (this VM's neighbours slow whole rounds down, never speed one up).
fn per_call(n: u32, mut f: impl FnMut()) -> f64 {
    let round = (n / 20).max(1);
    (0..20)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..round {
                f();
            }
            t.elapsed().as_secs_f64() / f64::from(round) * 1e6
        })
        .fold(f64::INFINITY, f64::min)
}

/// A uniform 64-bit hash of `(a, b)` (splitmix64's finaliser), standing in
/// for a page's hash.
fn page_hash(a: u64, b: u64) -> u64 {
    let mut z = a.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ b.wrapping_add(0x6a09_e667_f3bc_c909);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Conversations of prompts pending on 8 ranks (conversation c on rank
/// c mod 8): `conversations` of `turns` turns, sharing a system prompt of
/// `system` pages; turn t is `first + t * step` pages.
struct Pending {
    conversations: u64,
    turns: u64,
    system: u64,
    first: u64,
    step: u64,
}

/// The prompts-sent lookup as a dispatcher meets it between other work:
/// the prompts of `shape` pending, every cache flushed before each call (a
/// 64 MiB buffer written), each call timed alone. Medians in microseconds
/// of `PendingIndex::longest_chain` for the next turn of a pending
/// conversation and for a new conversation, and of one `add_chain` plus
/// `remove_chain` of that next turn.
fn cold_pending(page: usize, shape: &Pending) -> (f64, f64, f64) {
    let pending = radixkv::routing::PendingIndex::new(8, page);
    let system = shape.system;
    let prompt = |conversation: u64, pages: u64| -> Vec<u64> {
        (0..pages)
            .map(|i| {
                if i < system {
                    page_hash(0, i)
                } else {
                    page_hash(conversation + 1, i)
                }
            })
            .collect()
    };
    for c in 0..shape.conversations {
        for turn in 0..shape.turns {
            let chain = pending.chain_pages(&prompt(c, shape.first + shape.step * turn));
            pending.add_chain(chain, (c % 8) as usize);
        }
    }
    let next = shape.first + shape.step * shape.turns;
    let next_turn = pending.chain_pages(&prompt(5, next));
    let new_conversation = pending.chain_pages(&prompt(u64::MAX - 1, next));
    let mut flush = vec![0u8; 64 << 20];
    let mut timed = |f: &mut dyn FnMut()| -> f64 {
        let mut xs: Vec<f64> = (0..200)
            .map(|_| {
                for i in (0..flush.len()).step_by(64) {
                    flush[i] = flush[i].wrapping_add(1);
                }
                let t = Instant::now();
                f();
                t.elapsed().as_secs_f64() * 1e6
            })
            .collect();
        xs.sort_by(f64::total_cmp);
        xs[xs.len() / 2]
    };
    let next = timed(&mut || {
        std::hint::black_box(pending.longest_chain(&next_turn));
    });
    let new = timed(&mut || {
        std::hint::black_box(pending.longest_chain(&new_conversation));
    });
    let churn = timed(&mut || {
        pending.add_chain(next_turn.clone(), 5);
        pending.remove_chain(&next_turn, 5);
    });
    (next, new, churn)
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
    let batch = encode_batch(0.0, &[stored], None, Encoding::Map);
    r.ingest(3, &batch, None).expect("a batch");
    // The same, placing new prefixes by the ranks' recent writes.
    let spread = DpRouter::new(
        8,
        page,
        DpPolicy {
            cache_aware: radixkv::routing::CacheAwarePolicy {
                new_prefix: radixkv::routing::NewPrefix::LeastPressure,
                ..policy.cache_aware
            },
            ..policy
        },
    )
    .expect("a router");
    spread.ingest(3, &batch, None).expect("a batch");
    let loads = vec![RankLoad::idle(); 8];
    let seed = radixkv_index::local_hash::seed(None, None);
    let pages_hashed = radixkv_index::local_hash::block_hashes(&tokens, page, seed);
    let pending = radixkv::routing::PendingIndex::new(8, page);
    pending.add_pages(&pages_hashed, 3);
    let n = 4000;
    let hashes = per_call(n, || {
        std::hint::black_box(radixkv_index::local_hash::block_hashes(&tokens, page, seed));
    });
    let chained = per_call(n, || {
        let v = radixkv_index::local_hash::block_hashes(&tokens, page, seed);
        let c = pending.chain_pages(&v);
        std::hint::black_box((v, c));
    });
    let chain_only = per_call(n, || {
        std::hint::black_box(pending.chain_pages(&pages_hashed));
    });
    let scores = per_call(n, || {
        std::hint::black_box(r.scores(&tokens, None));
    });
    let longest = per_call(n, || {
        std::hint::black_box(pending.longest_pages(&pages_hashed));
    });
    let route = per_call(n, || {
        std::hint::black_box(r.route(&tokens, None, &loads).expect("a route"));
    });
    let route_spread = per_call(n, || {
        std::hint::black_box(spread.route(&tokens, None, &loads).expect("a route"));
    });
    println!(
        "{pages} pages of {page}: hashes {hashes:.2} µs, hashes+chain {chained:.2} µs, chain alone {chain_only:.2} µs"
    );
    println!(
        "{pages} pages of {page}: scores {scores:.2} µs, PendingIndex::longest_pages {longest:.2} µs, route {route:.2} µs per call, with new_prefix least_written {route_spread:.2} µs"
    );
    let shapes = [
        (
            "64 long prompts (16 conversations of 4 turns, 3,400 to 4,150 pages, sharing 1,000)",
            Pending {
                conversations: 16,
                turns: 4,
                system: 1000,
                first: 3400,
                step: 250,
            },
        ),
        (
            "4,096 short prompts (512 conversations of 8 turns, 8 to 22 pages, sharing 4)",
            Pending {
                conversations: 512,
                turns: 8,
                system: 4,
                first: 8,
                step: 2,
            },
        ),
        (
            "12 short prompts (12 conversations of 1 turn, 14 pages, sharing 4)",
            Pending {
                conversations: 12,
                turns: 1,
                system: 4,
                first: 14,
                step: 0,
            },
        ),
    ];
    for (what, shape) in &shapes {
        let (next, new, churn) = cold_pending(page, shape);
        println!(
            "cold, {what} pending on 8 ranks: longest_chain {next:.2} µs (a pending conversation's next turn), {new:.2} µs (a new conversation); add_chain + remove_chain {churn:.2} µs"
        );
    }
}
