//! SGLang's KV-event block hashes (0.5.23, `mem_cache/utils.py` and its
//! native hash): each page's digest is SHA-256 over the previous page's
//! digest (32 raw bytes; absent for a path's first page unless a seed
//! stands in) followed by the page's tokens as little-endian `u32`s. A
//! path in a cache-salted namespace starts from the salt's seed, SHA-256
//! of `sglang-cache-salt-v1\0` and the salt's UTF-8 bytes. The published
//! integer is a digest's first 8 bytes, big-endian, signed; the namespace
//! seeding of that integer reads SGLang's live LoRA table and is done in
//! Python with SGLang's own functions.
//!
//! (SGLang hashes tokens wider than 32 bits differently; radixkv's tokens
//! are 32-bit, so that never applies here.)

use sha2::{Digest as _, Sha256};

/// One page's digest.
pub(crate) type Digest = [u8; 32];

/// The digests of `tokens`' pages (`page_size` tokens each; `tokens` is
/// whole pages), chained from `prior`.
pub(crate) fn chain(prior: Option<&Digest>, tokens: &[u32], page_size: usize) -> Vec<Digest> {
    let mut out: Vec<Digest> = Vec::with_capacity(tokens.len() / page_size.max(1));
    let mut prev = prior.copied();
    let mut bytes = Vec::with_capacity(4 * page_size);
    for page in tokens.chunks(page_size.max(1)) {
        let mut h = Sha256::new();
        if let Some(p) = &prev {
            h.update(p);
        }
        bytes.clear();
        for t in page {
            bytes.extend_from_slice(&t.to_le_bytes());
        }
        h.update(&bytes);
        let d: Digest = h.finalize().into();
        out.push(d);
        prev = Some(d);
    }
    out
}

/// The seed a cache-salted path starts from.
pub(crate) fn salt_seed(salt: &str) -> Digest {
    let mut h = Sha256::new();
    h.update(b"sglang-cache-salt-v1\0");
    h.update(salt.as_bytes());
    h.finalize().into()
}

/// The integer SGLang publishes for a digest: its first 8 bytes,
/// big-endian, as a signed 64-bit integer.
pub(crate) fn block_hash(d: &Digest) -> i64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&d[..8]);
    i64::from_be_bytes(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SGLang 0.5.23's native hash of [1, 2, 3, 4] at page size 2 (printed
    /// by `sglang.srt.mem_cache.utils.get_hash_str([1, 2, 3, 4], None,
    /// page_size=2)`).
    #[test]
    fn chain_equals_sglangs_native_hash() {
        let d = chain(None, &[1, 2, 3, 4], 2);
        let hex: Vec<String> = d
            .iter()
            .map(|d| d.iter().map(|b| format!("{b:02x}")).collect())
            .collect();
        assert_eq!(
            hex,
            [
                "34fb5c825de7ca4aea6e712f19d439c1da0c92c37b423936c5f618545ca4fa1f",
                "c57b445f90651b9a650e516ab2238c965b21af35608a31c303e6d9e407f2915c"
            ]
        );
        // The published integer: the first 16 hex digits, signed.
        assert_eq!(block_hash(&d[0]), 0x34fb_5c82_5de7_ca4a);
        assert!(block_hash(&d[1]) < 0, "c5… is above 2^63: negative");
    }
}
