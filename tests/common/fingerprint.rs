//! Fingerprints of token paths, for ownership checks in concurrent tests.

/// The fingerprint of `key[..=j]` for every `j` (never 0).
pub fn fingerprints(key: &[u32]) -> Vec<u64> {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    key.iter()
        .map(|&t| {
            h ^= u64::from(t) + 1;
            h = h.wrapping_mul(0x0100_0000_01b3);
            h | 1
        })
        .collect()
}
