//! The per-block hashes Dynamo's routers send to `/query_by_hash`, and that
//! its indexer hashes a `/query`'s tokens into: each whole block hashed
//! alone (not chained) with XXH3-64 over its token ids as `u32`
//! little-endian, seeded by the request's namespace.
//!
//! The seed is 1337, plus XXH3-64 (seed 0) of a non-empty `lora_name`,
//! plus XXH3-64 (seed 1) of a non-empty cache salt, all wrapping. A block
//! with the same tokens in another namespace has another hash.
//!
//! ```
//! use radixkv_index::local_hash::{block_hashes, seed};
//! let s = seed(None, None);
//! let h = block_hashes(&[1, 2, 3, 4, 5], 2, s);
//! assert_eq!(h.len(), 2, "whole blocks only");
//! assert_ne!(h[0], block_hashes(&[1, 2], 2, seed(None, Some("tenant")))[0]);
//! ```

use xxhash_rust::xxh3::xxh3_64_with_seed;

/// The seed with neither a LoRA adapter nor a salt.
pub const BASE_SEED: u64 = 1337;

/// The seed of a namespace: see the module docs. Empty strings count as
/// absent.
pub fn seed(lora_name: Option<&str>, cache_salt: Option<&str>) -> u64 {
    let mut s = BASE_SEED;
    if let Some(l) = lora_name.filter(|l| !l.is_empty()) {
        s = s.wrapping_add(xxh3_64_with_seed(l.as_bytes(), 0));
    }
    if let Some(c) = cache_salt.filter(|c| !c.is_empty()) {
        s = s.wrapping_add(xxh3_64_with_seed(c.as_bytes(), 1));
    }
    s
}

/// One block's hash under `seed`.
#[inline]
pub fn block_hash(tokens: &[u32], seed: u64) -> u64 {
    if cfg!(target_endian = "little") {
        // The token ids' little-endian bytes are their bytes in memory.
        xxh3_64_with_seed(bytemuck::cast_slice(tokens), seed)
    } else {
        let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
        xxh3_64_with_seed(&bytes, seed)
    }
}

/// The hash of every whole block of `tokens` (blocks of `block_size`; a
/// partial last block has none). `block_size` 0 gives none.
///
/// The common block sizes (1 to 64 tokens, powers of two) run a loop made
/// for that size, in which XXH3's choice of path by length is made once
/// and the hash is inlined, so the processor overlaps one block's hash with
/// the next; other sizes take the general path. Every size hashes as
/// [`block_hash`] does.
///
/// ```
/// use radixkv_index::local_hash::{block_hash, block_hashes, seed};
/// let (tokens, s): (Vec<u32>, _) = ((0..10).collect(), seed(None, None));
/// assert_eq!(
///     block_hashes(&tokens, 4, s),
///     vec![block_hash(&tokens[..4], s), block_hash(&tokens[4..8], s)],
/// );
/// ```
pub fn block_hashes(tokens: &[u32], block_size: usize, seed: u64) -> Vec<u64> {
    /// Blocks of exactly `B` tokens: each one's length is a constant.
    #[inline(always)]
    fn sized<const B: usize>(tokens: &[u32], seed: u64) -> Vec<u64> {
        let (blocks, _) = tokens.as_chunks::<B>();
        let mut out = Vec::with_capacity(blocks.len());
        for b in blocks {
            out.push(block_hash(b, seed));
        }
        out
    }
    match block_size {
        0 => Vec::new(),
        1 => sized::<1>(tokens, seed),
        2 => sized::<2>(tokens, seed),
        4 => sized::<4>(tokens, seed),
        8 => sized::<8>(tokens, seed),
        16 => sized::<16>(tokens, seed),
        32 => sized::<32>(tokens, seed),
        64 => sized::<64>(tokens, seed),
        _ => tokens
            .chunks_exact(block_size)
            .map(|b| block_hash(b, seed))
            .collect(),
    }
}
