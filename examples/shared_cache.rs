//! Two scheduler threads (one per GPU) and an evictor sharing one cache.
//!
//! Each scheduler serves requests that share a few system prompts: it pins
//! the cached prefix (computing only the rest), then hands its KV slots to
//! the cache. The router's view (`peek`) shows which GPU holds what.
//!
//! Run: `cargo run --release --example shared_cache`

use radixkv::{DeviceId, RadixCache, TokenKey};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

fn main() -> Result<(), radixkv::CacheError> {
    let cache = Arc::new(RadixCache::builder().devices(2).page_size(4).build()?);
    let system_prompts: Vec<Vec<u32>> = (0..4)
        .map(|s| (0..64).map(|t| s * 1000 + t).collect())
        .collect();
    let next_slot = Arc::new(AtomicU32::new(1));

    let schedulers: Vec<_> = (0..2u32)
        .map(|gpu| {
            let (cache, prompts, next_slot) = (
                Arc::clone(&cache),
                system_prompts.clone(),
                Arc::clone(&next_slot),
            );
            std::thread::spawn(move || -> Result<(usize, usize), radixkv::CacheError> {
                let (mut reused, mut computed) = (0, 0);
                for r in 0..200u32 {
                    let mut prompt = prompts[(r % 4) as usize].clone();
                    prompt.extend((0..16).map(|t| 100_000 + r * 16 + t));
                    let key = TokenKey::new(&prompt);
                    let m = cache.match_and_pin(key, DeviceId(gpu))?;
                    reused += m.len;
                    computed += prompt.len() - m.len;
                    // "Prefill" the suffix into fresh slots; reuse the pinned ones.
                    let first =
                        next_slot.fetch_add((prompt.len() - m.len) as u32, Ordering::Relaxed);
                    let mut slots = m.values.clone();
                    slots.extend(first..first + (prompt.len() - m.len) as u32);
                    cache.insert(key, DeviceId(gpu), &slots, 0)?;
                    drop(m.lease);
                }
                Ok((reused, computed))
            })
        })
        .collect();
    let evictor = {
        let cache = Arc::clone(&cache);
        std::thread::spawn(move || -> Result<usize, radixkv::CacheError> {
            let mut freed = 0;
            for i in 0..200 {
                freed += cache.evict(DeviceId(i % 2), 32)?.tokens;
                std::thread::yield_now();
            }
            Ok(freed)
        })
    };
    for (gpu, s) in schedulers.into_iter().enumerate() {
        let (reused, computed) = s.join().expect("scheduler panicked")?;
        println!("gpu {gpu}: {reused} tokens reused from the cache, {computed} computed");
    }
    println!(
        "evictor freed {} tokens",
        evictor.join().expect("evictor panicked")?
    );
    let probe: Vec<u32> = system_prompts[0]
        .iter()
        .copied()
        .chain([7, 7, 7, 7])
        .collect();
    println!(
        "router view of system prompt 0 (resident tokens per GPU): {:?}",
        cache.peek(TokenKey::new(&probe))
    );
    cache.audit();
    Ok(())
}
