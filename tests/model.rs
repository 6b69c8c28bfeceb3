//! Property test: random op sequences over 1–4 devices, the concurrent
//! cache against the sequential model, comparing every result and every
//! device's sizes after every op.

#![allow(clippy::single_range_in_vec_init)] // ranges of values are the data here

mod common;

use common::{case_strategy, run_case};
use proptest::prelude::*;
use radixkv::{DeviceId, RadixCache, TokenKey};

fn cases() -> u32 {
    std::env::var("RADIXKV_PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(384)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(),
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::Direct("tests/regressions/model.txt"),
        )),
        ..ProptestConfig::default()
    })]

    #[test]
    fn concurrent_tree_matches_sequential_model((devices, ps, policy, ops) in case_strategy()) {
        run_case(devices, ps, policy, &ops)?;
    }
}

/// The model itself is checked against the shipped SGLang vectors in
/// `conformance.rs`; this checks that a hand-written multi-device scenario
/// behaves as SEMANTICS.md says, so the model is not merely self-consistent.
#[test]
fn multi_device_semantics_by_hand() {
    let cache = RadixCache::builder().devices(2).build().unwrap();
    let (d0, d1) = (DeviceId(0), DeviceId(1));
    cache
        .insert(TokenKey::new(&[1, 2, 3, 4]), d0, &[10, 11, 12, 13], 0)
        .unwrap();
    let r = cache
        .insert(TokenKey::new(&[1, 2]), d1, &[20, 21], 0)
        .unwrap();
    assert_eq!(r.prefix_len, 0, "nothing of it was on device 1");
    assert_eq!(cache.peek(TokenKey::new(&[1, 2, 3, 4, 5])), vec![4, 2]);
    let m = cache.match_and_pin(TokenKey::new(&[1, 2, 3]), d1).unwrap();
    assert_eq!((m.len, m.values.clone()), (2, vec![20, 21]));
    assert_eq!(
        (m.any_len, m.any_device),
        (3, Some(d0)),
        "device 0 holds a longer prefix"
    );
    // Device 0's leaf can go, device 1's pinned prefix cannot.
    assert_eq!(cache.evict(d1, 10).unwrap().tokens, 0);
    let ev = cache.evict(d0, 10).unwrap();
    assert_eq!(ev.values, vec![12, 13, 10, 11]);
    assert_eq!(cache.node_count(), 1, "the [1,2] node stays for device 1");
    drop(m.lease);
    assert_eq!(cache.evict(d1, 1).unwrap().values, vec![20, 21]);
    assert_eq!(cache.node_count(), 0);
    cache.audit();
}
