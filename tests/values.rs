//! Values at the edges of the value space: runs and pages that end at
//! `u32::MAX`, scattered values, page sizes 1, 2 and 16. A match must
//! return exactly as many values as its length, equal to what was
//! inserted, and eviction must hand back every value.

#[path = "common/mod.rs"]
mod common;

use common::values_for;
use radixkv::{DeviceId, RadixCache, TokenKey};

#[test]
fn matches_and_evictions_return_every_value_at_the_edges() {
    for ps in [1usize, 2, 16] {
        for shape in 0..4u8 {
            let cache = RadixCache::builder().page_size(ps).build().unwrap();
            let d = DeviceId(0);
            let key: Vec<u32> = (0..3 * ps as u32).map(|t| t + 1).collect();
            let values = values_for(shape, key.len(), ps, 1);
            cache.insert(TokenKey::new(&key), d, &values, 0).unwrap();
            // The whole key.
            let m = cache.match_and_pin(TokenKey::new(&key), d).unwrap();
            assert_eq!(m.len, key.len(), "ps {ps} shape {shape}");
            assert_eq!(m.values, values, "ps {ps} shape {shape}");
            drop(m.lease);
            // A match ending inside the node splits it: both halves keep
            // their values.
            let mut other = key[..2 * ps].to_vec();
            other.extend(std::iter::repeat_n(999, ps));
            let m = cache.match_and_pin(TokenKey::new(&other), d).unwrap();
            assert_eq!(m.len, 2 * ps, "ps {ps} shape {shape}");
            assert_eq!(m.values, values[..2 * ps], "ps {ps} shape {shape}");
            drop(m.lease);
            let m = cache.match_and_pin(TokenKey::new(&key), d).unwrap();
            assert_eq!(m.values, values, "after the split, ps {ps} shape {shape}");
            drop(m.lease);
            // Eviction hands every value back.
            let mut evicted = cache.evict(d, usize::MAX).unwrap().values;
            evicted.sort_unstable();
            let mut want = values.clone();
            want.sort_unstable();
            assert_eq!(evicted, want, "ps {ps} shape {shape}");
            cache.audit();
        }
    }
}
