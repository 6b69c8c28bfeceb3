//! Property test: random op sequences over 1–4 devices, the concurrent
//! cache against the sequential model, comparing every result and every
//! device's sizes after every op.

#![allow(clippy::single_range_in_vec_init)] // ranges of values are the data here

mod common;

use common::{case_strategy, run_case, run_case_tiers};
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

    /// The same op sequences in a tree of 20 devices, of which the ops
    /// use the first few: a node's tier slots are allocated on first use
    /// there (`Slots::Sparse`), and every other tier stays absent.
    #[test]
    fn a_tree_of_many_tiers_matches_the_model((_devices, ps, policy, ops) in case_strategy()) {
        run_case(20, ps, policy, &ops)?;
    }

    /// The same op sequences with the last tier a host tier (2–4 tiers:
    /// 1–3 devices and the host): its residency behaves as the model's
    /// device does, and the tier-aware answers agree with the model.
    #[test]
    fn a_host_tier_matches_the_model_as_one_more_device(
        (devices, ps, policy, ops) in case_strategy().prop_filter("two tiers or more", |c| c.0 >= 2)
    ) {
        run_case_tiers(devices, true, ps, policy, &ops)?;
    }
}

/// The model itself is checked against the shipped SGLang vectors in
/// `conformance.rs`; this checks that a hand-written multi-device scenario
/// behaves as docs/semantics.md says, so the model is not merely self-consistent.
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

/// Wide nodes (hundreds of continuations of one prompt, as a system prompt
/// gets) use chunked children arrays; compare them with the model through
/// inserts, splits, matches and evictions.
#[test]
fn wide_nodes_match_the_model() {
    use radixkv::reference::SequentialCache;
    use radixkv::EvictionPolicy;
    for ps in [1usize, 4] {
        let cache = RadixCache::builder().page_size(ps).build().unwrap();
        let mut model = SequentialCache::new(ps, 1, EvictionPolicy::Lru);
        let prompt: Vec<u32> = (0..32).collect();
        let mut next = 1u32;
        let mut keys = Vec::new();
        for i in 0..700u32 {
            let mut k = prompt.clone();
            // Continuations that collide on their first token now and then.
            k.extend([1000 + (i * 37) % 450, i, i + 1, 7]);
            k.truncate(k.len() / ps * ps);
            let v: Vec<u32> = (next..next + k.len() as u32).collect();
            next += k.len() as u32;
            let got = cache
                .insert(TokenKey::new(&k), DeviceId(0), &v, 0)
                .unwrap()
                .prefix_len;
            assert_eq!(got, model.insert(None, &k, &v, 0, 0).unwrap());
            keys.push(k);
            if i % 50 == 49 {
                let ev = cache.evict(DeviceId(0), 40).unwrap();
                assert_eq!((ev.tokens, ev.values), model.evict(0, 40));
                cache.audit();
            }
        }
        for k in keys.iter().step_by(3) {
            let m = cache
                .match_and_pin(TokenKey::new(&k[..k.len() - ps]), DeviceId(0))
                .unwrap();
            let want = model.match_prefix(None, &k[..k.len() - ps], 0);
            assert_eq!((m.len, &m.values), (want.len, &want.values));
        }
        let (e, p, t, n) = model.sizes(0);
        let s = cache.sizes(DeviceId(0)).unwrap();
        assert_eq!((s.evictable, s.protected, s.total, s.nodes), (e, p, t, n));
        assert_eq!(
            cache.evict(DeviceId(0), usize::MAX).unwrap().values,
            model.evict(0, usize::MAX).1
        );
        assert_eq!(cache.node_count(), 0);
        cache.audit();
    }
}
