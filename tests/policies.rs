//! The scan-resistant policies (slru, sieve), tlru, replica-aware eviction and
//! the eviction metrics.

use radixkv::{DeviceId, EvictionPolicy, RadixCache, TokenKey};
use rand::{rngs::StdRng, Rng, SeedableRng};

const D0: DeviceId = DeviceId(0);

fn cache(policy: EvictionPolicy) -> RadixCache {
    RadixCache::builder()
        .eviction_policy(policy)
        .build()
        .unwrap()
}

/// Caches `[k, k]` with values `[10k, 10k + 1]`.
fn put(c: &RadixCache, k: u32) {
    c.insert(TokenKey::new(&[k, k]), D0, &[10 * k, 10 * k + 1], 0)
        .unwrap();
}

fn hit(c: &RadixCache, k: u32) {
    assert_eq!(c.match_prefix(TokenKey::new(&[k, k]), D0).unwrap().len, 2);
}

/// The values of each leaf evicted, in order, by one-leaf evictions until
/// the cache is empty.
fn evicted_leaves(c: &RadixCache) -> Vec<Vec<u32>> {
    let mut order = Vec::new();
    loop {
        let ev = c.evict(D0, 1).unwrap();
        if ev.leaves == 0 {
            return order;
        }
        assert_eq!(ev.leaves, 1);
        order.push(ev.values);
    }
}

/// The keys evicted, in order, by one-leaf evictions until the cache is empty.
fn eviction_order(c: &RadixCache) -> Vec<u32> {
    evicted_leaves(c).iter().map(|v| v[0] / 10).collect()
}

#[test]
fn slru_evicts_never_reused_leaves_before_reused_ones() {
    for (policy, expected) in [
        // lru: the reused leaf 1 is the least recently used after the scan.
        (EvictionPolicy::Lru, vec![1, 2, 3, 4, 5]),
        // slru: the scan (never hit) goes first, then the protected leaf.
        (EvictionPolicy::Slru, vec![2, 3, 4, 5, 1]),
    ] {
        let c = cache(policy);
        put(&c, 1);
        hit(&c, 1);
        for k in 2..=5 {
            put(&c, k); // a scan of one-off requests
        }
        assert_eq!(eviction_order(&c), expected, "{policy}");
        c.check().unwrap();
    }
}

#[test]
fn slru_puts_a_prefix_whose_children_were_evicted_back_on_probation() {
    let c = cache(EvictionPolicy::Slru);
    // A conversation: every turn passes through the history [7, 7].
    c.insert(TokenKey::new(&[7, 7, 1]), D0, &[70, 71, 1], 0)
        .unwrap();
    for turn in 2..5 {
        let key = [7, 7, turn];
        assert_eq!(c.match_prefix(TokenKey::new(&key), D0).unwrap().len, 2);
        c.insert(TokenKey::new(&key), D0, &[70, 71, turn], 0)
            .unwrap();
    }
    // A leaf reused while it is a leaf: protected.
    put(&c, 9);
    hit(&c, 9);
    // The turns' tails go first (never reused); then [7, 7], now a leaf
    // whose hits were all passes through to them, is on probation and goes
    // before the protected leaf 9.
    let ev = c.evict(D0, 4).unwrap();
    assert_eq!(ev.tokens, 4);
    assert_eq!(c.peek(TokenKey::new(&[7, 7])), vec![2]);
    assert_eq!(c.evict(D0, 1).unwrap().values, vec![70, 71]);
    assert_eq!(c.evict(D0, 1).unwrap().values, vec![90, 91]);
    c.check().unwrap();
}

#[test]
fn sieve_gives_a_visited_leaf_one_more_round() {
    let c = cache(EvictionPolicy::Sieve);
    for k in 1..=3 {
        put(&c, k);
    }
    hit(&c, 1);
    // The hand passes 1 (visited: bit cleared), evicts 2 and 3, then comes
    // back to 1 in the next round.
    assert_eq!(eviction_order(&c), vec![2, 3, 1]);
    // Against fifo, which evicts in creation order regardless of hits.
    let f = cache(EvictionPolicy::Fifo);
    for k in 1..=3 {
        put(&f, k);
    }
    hit(&f, 1);
    assert_eq!(eviction_order(&f), vec![1, 2, 3]);
}

#[test]
fn sieve_new_leaves_join_behind_the_hand_and_a_second_hit_renews_the_chance() {
    let c = cache(EvictionPolicy::Sieve);
    for k in 1..=4 {
        put(&c, k);
    }
    hit(&c, 1);
    hit(&c, 3);
    // Hand: passes 1 (clear), evicts 2.
    assert_eq!(c.evict(D0, 1).unwrap().values, vec![20, 21]);
    put(&c, 5); // newest: after 4 in this round
    hit(&c, 1); // visited again since the hand passed it
                // Round 0 continues: 3 (clear), 4 evicted, 5 evicted; round 1: 1
                // (visited again: clear), 3 evicted, round 2: 1.
    assert_eq!(eviction_order(&c), vec![4, 5, 3, 1]);
    c.check().unwrap();
}

/// Hits of a hot request reused every third step among one-off requests,
/// with room for six leaves.
fn hot_hits(policy: EvictionPolicy) -> usize {
    let c = cache(policy);
    put(&c, 1);
    let mut hits = 0;
    for (step, next) in (0..60).zip(100..) {
        if step % 3 == 0 {
            if c.match_prefix(TokenKey::new(&[1, 1]), D0).unwrap().len == 2 {
                hits += 1;
            } else {
                put(&c, 1);
            }
        }
        put(&c, next);
        let total = c.sizes(D0).unwrap().total;
        if total > 12 {
            c.evict(D0, total - 12).unwrap();
        }
        c.check().unwrap();
    }
    hits
}

#[test]
fn sieve_keeps_a_reused_prefix_through_a_scan() {
    assert_eq!(hot_hits(EvictionPolicy::Sieve), 20, "hit on every visit");
    assert_eq!(hot_hits(EvictionPolicy::Slru), 20, "hit on every visit");
    // fifo drops it every six insertions, hits or not.
    assert!(hot_hits(EvictionPolicy::Fifo) < 15);
}

#[test]
fn sieve_and_slru_keep_the_invariants_under_random_operations() {
    for policy in [EvictionPolicy::Sieve, EvictionPolicy::Slru] {
        for seed in 0..40u64 {
            let mut rng = StdRng::seed_from_u64(seed);
            let devices = rng.random_range(1..=3usize);
            let c = RadixCache::builder()
                .devices(devices)
                .eviction_policy(policy)
                .replica_aware(seed % 2 == 0)
                .build()
                .unwrap();
            let mut leases = Vec::new();
            let mut cached: Vec<Vec<u32>> = Vec::new();
            for _ in 0..120 {
                let d = DeviceId(rng.random_range(0..devices) as u32);
                let len = rng.random_range(1..8);
                let key: Vec<u32> = (0..len).map(|_| rng.random_range(0..3)).collect();
                match rng.random_range(0..10) {
                    0..=3 => {
                        let vals: Vec<u32> = key.iter().map(|t| t + 100).collect();
                        c.insert(TokenKey::new(&key), d, &vals, 0).unwrap();
                        cached.push(key);
                    }
                    4..=5 => {
                        let m = c.match_and_pin(TokenKey::new(&key), d).unwrap();
                        leases.push((d, m.len, key.clone(), m.lease));
                    }
                    6 => {
                        if !leases.is_empty() {
                            let i = rng.random_range(0..leases.len());
                            leases.swap_remove(i);
                        }
                    }
                    _ => {
                        let n = rng.random_range(1..10);
                        c.evict(d, n).unwrap();
                    }
                }
                c.check()
                    .unwrap_or_else(|e| panic!("{policy} seed {seed}: {e}"));
                // A pinned prefix is still resident on its device.
                for (d, len, key, _) in &leases {
                    let held = c.peek(TokenKey::new(key))[d.index()];
                    assert!(held >= *len, "{policy} seed {seed}: pinned prefix lost");
                }
            }
            drop(leases);
            for d in 0..devices {
                c.evict(DeviceId(d as u32), usize::MAX).unwrap();
                assert_eq!(c.sizes(DeviceId(d as u32)).unwrap().total, 0);
            }
            c.check().unwrap();
        }
    }
}

#[test]
fn replica_aware_prefers_replicated_leaves_within_its_window() {
    for aware in [false, true] {
        let c = RadixCache::builder()
            .devices(2)
            .replica_aware(aware)
            .build()
            .unwrap();
        // Ten single-copy leaves, then (newest in lru order) one replicated.
        for k in 1..=10 {
            put(&c, k);
        }
        put(&c, 11);
        c.insert(TokenKey::new(&[11, 11]), DeviceId(1), &[0, 1], 0)
            .unwrap();
        put(&c, 12);
        c.insert(TokenKey::new(&[12, 12]), DeviceId(1), &[0, 1], 0)
            .unwrap();
        // Candidates in lru order: 1..=10 (one copy), 11, 12 (replicated).
        // With a window of 8, the replicas are preferred once 11 is among
        // the next 8 candidates: after 1, 2 and 3 have gone.
        let expected = if aware {
            vec![1, 2, 3, 11, 12, 4, 5, 6, 7, 8, 9, 10]
        } else {
            (1..=12).collect()
        };
        assert_eq!(eviction_order(&c), expected, "replica_aware({aware})");
        c.check().unwrap();
    }
}

#[test]
fn eviction_metrics_count_calls_leaves_tokens_and_latency() {
    for policy in EvictionPolicy::ALL {
        let c = RadixCache::builder()
            .devices(2)
            .eviction_policy(policy)
            .build()
            .unwrap();
        for k in 1..=5 {
            put(&c, k);
        }
        c.evict(D0, 3).unwrap(); // two leaves, four tokens
        c.evict(D0, 0).unwrap(); // not a call: nothing asked
        c.evict(D0, 100).unwrap(); // the other three
        let m = c.eviction_metrics(D0).unwrap();
        assert_eq!(
            (
                m.evict_calls,
                m.evicted_leaves,
                m.evicted_tokens,
                m.evicted_pages
            ),
            (2, 5, 10, 0),
            "{policy}"
        );
        assert_eq!(m.latency.count, 2);
        assert!(m.latency.max_ns > 0 && m.latency.p50_ns <= m.latency.max_ns);
        let other = c.eviction_metrics(DeviceId(1)).unwrap();
        assert_eq!(other.evict_calls, 0);
        assert!(c.eviction_metrics(DeviceId(2)).is_err());
    }
}

#[test]
fn a_policy_switch_at_run_time_re_ranks_the_candidates() {
    // a is created first, b second; then a is used again: LRU evicts b
    // first, FIFO evicts a first.
    let c = radixkv::RadixCache::builder().build().unwrap();
    let d = radixkv::DeviceId(0);
    let key = radixkv::TokenKey::new;
    c.insert(key(&[9, 9]), d, &[9, 9], 0).unwrap();
    c.insert(key(&[1, 1]), d, &[1, 1], 0).unwrap();
    c.insert(key(&[2, 2]), d, &[2, 2], 0).unwrap();
    c.match_prefix(key(&[1, 1]), d).unwrap();
    // An eviction under LRU (of the oldest leaf, made before both) files
    // a and b in the heap under LRU keys, b first: after the switch FIFO's
    // order must come out all the same.
    assert_eq!(c.evict(d, 1).unwrap().values, vec![9, 9]);
    c.set_eviction_policy(radixkv::EvictionPolicy::Fifo);
    assert_eq!(c.eviction_policy(), radixkv::EvictionPolicy::Fifo);
    let ev = c.evict(d, 1).unwrap();
    assert_eq!(ev.values, vec![1, 1], "FIFO evicts the oldest leaf");
    c.set_eviction_policy(radixkv::EvictionPolicy::Lru);
    c.insert(key(&[3, 3]), d, &[3, 3], 0).unwrap();
    c.match_prefix(key(&[2, 2]), d).unwrap();
    assert_eq!(c.evict(d, 1).unwrap().values, vec![3, 3], "LRU again");
    // Into a policy that ranks by a scan (mru), and back: leaves made
    // while the scan ranked (no notes) are in the new heap.
    c.insert(key(&[4, 4]), d, &[4, 4], 0).unwrap();
    c.insert(key(&[5, 5]), d, &[5, 5], 0).unwrap();
    c.match_prefix(key(&[4, 4]), d).unwrap();
    c.set_eviction_policy(radixkv::EvictionPolicy::Mru);
    assert_eq!(c.evict(d, 1).unwrap().values, vec![4, 4], "MRU");
    c.insert(key(&[6, 6]), d, &[6, 6], 0).unwrap();
    c.set_eviction_policy(radixkv::EvictionPolicy::Lru);
    c.match_prefix(key(&[5, 5]), d).unwrap();
    let order: Vec<Vec<u32>> = (0..3).map(|_| c.evict(d, 1).unwrap().values).collect();
    assert_eq!(
        order,
        [vec![2, 2], vec![6, 6], vec![5, 5]],
        "LRU over all leaves"
    );
    c.audit();
}

#[test]
fn a_cache_built_with_a_scan_policy_switches_to_a_heap_policy() {
    let c = radixkv::RadixCache::builder()
        .eviction_policy(radixkv::EvictionPolicy::Mru)
        .build()
        .unwrap();
    let d = radixkv::DeviceId(0);
    let key = radixkv::TokenKey::new;
    c.insert(key(&[1, 1]), d, &[1, 1], 0).unwrap();
    c.insert(key(&[2, 2]), d, &[2, 2], 0).unwrap();
    c.match_prefix(key(&[1, 1]), d).unwrap();
    c.set_eviction_policy(radixkv::EvictionPolicy::Lru);
    // Noted from now on.
    c.insert(key(&[3, 3]), d, &[3, 3], 0).unwrap();
    let order: Vec<Vec<u32>> = (0..3).map(|_| c.evict(d, 1).unwrap().values).collect();
    assert_eq!(order, [vec![2, 2], vec![1, 1], vec![3, 3]]);
    assert!(c.evict(d, 1).unwrap().values.is_empty());
    c.audit();
}

/// Two conversations of 8 tokens at a budget of 4: `[20; 8]`, older, in
/// one node (all within its budget), then `[1 ..= 8]`, newer, grown from
/// `[1 ..= 4]` (its last 4 tokens past its budget). Returns the values of
/// one-leaf evictions until the cache is empty.
fn tlru_two_conversations(c: &RadixCache, switch_to_tlru: bool) -> Vec<Vec<u32>> {
    let key = TokenKey::new;
    c.insert(key(&[20; 8]), D0, &[30; 8], 0).unwrap();
    c.insert(key(&[1, 2, 3, 4]), D0, &[10, 11, 12, 13], 0)
        .unwrap();
    let v: Vec<u32> = (10..18).collect();
    c.insert(key(&[1, 2, 3, 4, 5, 6, 7, 8]), D0, &v, 0).unwrap();
    if switch_to_tlru {
        c.set_eviction_policy(EvictionPolicy::Tlru);
    }
    evicted_leaves(c)
}

#[test]
fn tlru_trims_conversations_to_their_budget_before_lru_order() {
    let tlru = RadixCache::builder()
        .eviction_policy(EvictionPolicy::Tlru)
        .tlru_threshold(4)
        .build()
        .unwrap();
    // The newer conversation's tail first; trimmed to its budget (its
    // branch's depth stays 8), the rest go in LRU order.
    let want = vec![vec![14, 15, 16, 17], vec![30; 8], vec![10, 11, 12, 13]];
    assert_eq!(tlru_two_conversations(&tlru, false), want);
    // LRU takes the older conversation first.
    let lru = cache(EvictionPolicy::Lru);
    assert_eq!(
        tlru_two_conversations(&lru, false)[0],
        vec![30; 8],
        "lru's order differs"
    );
    // A next prompt expected to fill the budget leaves nothing past it.
    let full = RadixCache::builder()
        .eviction_policy(EvictionPolicy::Tlru)
        .tlru_threshold(4)
        .tlru_next_prompt_estimate(4)
        .build()
        .unwrap();
    assert_eq!(tlru_two_conversations(&full, false)[0], vec![30; 8]);
    // A cache switched to tlru at run time learns the depths from the tree
    // as it stands: `[1 ..= 4]` knows its branch reached 8 (without, it
    // would be past a budget of 0 and go second).
    let switched = RadixCache::builder().tlru_threshold(4).build().unwrap();
    assert_eq!(tlru_two_conversations(&switched, true), want);
    for c in [&tlru, &lru, &full, &switched] {
        c.audit();
    }
}

#[test]
fn tlru_files_a_leaf_again_when_a_split_moves_its_start() {
    // At a budget of 2, `[9; 8]` and `[1 2 3 4 5 6]` are both within their
    // budgets (6 and 4 tokens needed, none before them); `[8 8]` is past
    // its own (none needed), and an eviction takes it after filing the
    // other two in the heap under their keys. An insert that parts after 4
    // tokens splits the second: its leaf `[5 6]` now starts at 4 and lies
    // past the budget. It goes first, before the new leaf `[7 7]` (past its
    // budget too, and newer).
    let c = RadixCache::builder()
        .eviction_policy(EvictionPolicy::Tlru)
        .tlru_threshold(2)
        .build()
        .unwrap();
    let key = TokenKey::new;
    c.insert(key(&[9; 8]), D0, &[90; 8], 0).unwrap();
    c.insert(key(&[1, 2, 3, 4, 5, 6]), D0, &[1, 2, 3, 4, 5, 6], 0)
        .unwrap();
    c.insert(key(&[8, 8]), D0, &[80, 81], 0).unwrap();
    assert_eq!(c.evict(D0, 1).unwrap().values, vec![80, 81]);
    c.insert(key(&[1, 2, 3, 4, 7, 7]), D0, &[1, 2, 3, 4, 7, 8], 0)
        .unwrap();
    let order: Vec<Vec<u32>> = (0..3).map(|_| c.evict(D0, 1).unwrap().values).collect();
    assert_eq!(order, [vec![5, 6], vec![7, 8], vec![90; 8]]);
    c.audit();
}
