//! The waiting-queue policies (`radixkv_engine::sched::policy`): every ordering
//! rule of SGLang 0.5.9's `SchedulePolicy`, with exact expected orders.

use radixkv::{CacheError, DeviceId, RadixCache, TokenKey};
use radixkv_engine::sched::policy::{
    OrderReport, PolicyConfig, QueueOrderer, SchedulePolicy, UnknownSchedulePolicy, Waiting,
};

const D0: DeviceId = DeviceId(0);

fn cache(page_size: usize) -> RadixCache {
    RadixCache::builder().page_size(page_size).build().unwrap()
}

fn put(c: &RadixCache, ns: Option<&str>, tokens: &[u32]) {
    let values: Vec<u32> = (0..tokens.len() as u32).collect();
    c.insert(TokenKey::new(tokens).in_namespace(ns), D0, &values, 0)
        .unwrap();
}

fn ids(q: &[Waiting]) -> Vec<u64> {
    q.iter().map(|w| w.id).collect()
}

fn run(cfg: PolicyConfig, q: &mut [Waiting], c: &RadixCache) -> OrderReport {
    QueueOrderer::new(cfg).order(q, c, D0).unwrap()
}

/// `n` distinct tokens starting at `from`.
fn seq(from: u32, n: u32) -> Vec<u32> {
    (from..from + n).collect()
}

fn cat(a: &[u32], b: &[u32]) -> Vec<u32> {
    [a, b].concat()
}

#[test]
fn names_parse_and_display() {
    for p in SchedulePolicy::ALL {
        assert_eq!(p.to_string().parse::<SchedulePolicy>(), Ok(p));
    }
    let names: Vec<String> = SchedulePolicy::ALL.iter().map(|p| p.to_string()).collect();
    assert_eq!(names, ["fcfs", "lof", "random", "lpm", "dfs-weight"]);
    assert_eq!(
        "dfs_weight".parse::<SchedulePolicy>(),
        Err(UnknownSchedulePolicy("dfs_weight".into()))
    );
    assert!("LPM".parse::<SchedulePolicy>().is_err());
    assert!(SchedulePolicy::Lpm.is_cache_aware() && SchedulePolicy::DfsWeight.is_cache_aware());
    assert!(!SchedulePolicy::Fcfs.is_cache_aware());
}

#[test]
fn defaults_are_sglangs() {
    let d = PolicyConfig::default();
    assert_eq!(d.policy, SchedulePolicy::Fcfs);
    assert!(!d.priority_scheduling);
    assert!(!d.low_priority_values_first);
    assert_eq!(d.lpm_fallback_queue_len, 128);
    assert_eq!(d.in_batch_check_threshold, Some(32));
    assert_eq!(d.in_batch_deprioritize_threshold, 32);
}

/// fcfs keeps the queue order, which is its arrival order; SGLang sorts
/// nothing here, even if `arrival` says otherwise.
#[test]
fn fcfs_keeps_the_queue_order() {
    let c = cache(1);
    put(&c, None, &[1, 2, 3]);
    let mut q = vec![
        Waiting::new(0, vec![5, 5], 3),
        Waiting::new(1, vec![1, 2, 3, 4], 1).with_priority(9),
        Waiting::new(2, vec![6], 2),
    ];
    q[1].prefix_len = 77; // stale: reset to 0
    let r = run(PolicyConfig::default(), &mut q, &c);
    assert_eq!(ids(&q), [0, 1, 2]);
    assert_eq!(
        (r.applied, r.fell_back(), r.prefix_computed()),
        (SchedulePolicy::Fcfs, false, false)
    );
    assert!(q.iter().all(|w| w.prefix_len == 0));
}

/// Priority scheduling under fcfs: priority (larger first by default), then
/// arrival; ties of both keep queue order.
#[test]
fn fcfs_priority_then_arrival() {
    let c = cache(1);
    let mk = || {
        vec![
            Waiting::new(0, vec![1], 5).with_priority(1),
            Waiting::new(1, vec![1], 4).with_priority(5),
            Waiting::new(2, vec![1], 3).with_priority(5),
            Waiting::new(3, vec![1], 2).with_priority(-3),
            Waiting::new(4, vec![1], 3).with_priority(5),
            Waiting::new(5, vec![1], 1).with_priority(1),
        ]
    };
    let mut cfg = PolicyConfig {
        priority_scheduling: true,
        ..PolicyConfig::default()
    };
    let mut q = mk();
    run(cfg.clone(), &mut q, &c);
    assert_eq!(ids(&q), [2, 4, 1, 5, 0, 3]);

    cfg.low_priority_values_first = true;
    let mut q = mk();
    run(cfg, &mut q, &c);
    assert_eq!(ids(&q), [3, 5, 0, 2, 4, 1]);
}

#[test]
fn lof_longest_output_first_stable() {
    let c = cache(1);
    let mut q: Vec<Waiting> = [10, 50, 20, 50, 5]
        .iter()
        .enumerate()
        .map(|(i, &m)| Waiting::new(i as u64, vec![1], 10 - i as u64).with_max_new_tokens(m))
        .collect();
    let r = run(PolicyConfig::new(SchedulePolicy::Lof), &mut q, &c);
    assert_eq!(ids(&q), [1, 3, 2, 0, 4]);
    assert_eq!(r.applied, SchedulePolicy::Lof);
}

#[test]
fn lof_with_priority_sorts_priority_first() {
    let c = cache(1);
    let mk = || {
        vec![
            Waiting::new(0, vec![1], 0)
                .with_priority(0)
                .with_max_new_tokens(100),
            Waiting::new(1, vec![1], 1)
                .with_priority(2)
                .with_max_new_tokens(10),
            Waiting::new(2, vec![1], 2)
                .with_priority(2)
                .with_max_new_tokens(30),
            Waiting::new(3, vec![1], 3)
                .with_priority(0)
                .with_max_new_tokens(300),
        ]
    };
    let mut cfg = PolicyConfig {
        priority_scheduling: true,
        ..PolicyConfig::new(SchedulePolicy::Lof)
    };
    let mut q = mk();
    run(cfg.clone(), &mut q, &c);
    assert_eq!(ids(&q), [2, 1, 3, 0]);
    cfg.low_priority_values_first = true;
    let mut q = mk();
    run(cfg, &mut q, &c);
    assert_eq!(ids(&q), [3, 0, 2, 1]);
}

#[test]
fn random_is_a_seeded_permutation() {
    let c = cache(1);
    let mk = || -> Vec<Waiting> { (0..40).map(|i| Waiting::new(i, vec![1], i)).collect() };
    let order = |seed: u64, rounds: usize| {
        let mut o = QueueOrderer::new(PolicyConfig {
            seed,
            ..PolicyConfig::new(SchedulePolicy::Random)
        });
        let mut q = mk();
        let mut all = Vec::new();
        for _ in 0..rounds {
            o.order(&mut q, &c, D0).unwrap();
            all.push(ids(&q));
        }
        all
    };
    let a = order(42, 2);
    assert_eq!(a, order(42, 2), "same seed, same orders");
    assert_ne!(a[0], order(43, 1)[0], "another seed, another order");
    assert_ne!(a[0], a[1], "the generator advances between calls");
    for o in &a {
        assert_ne!(*o, (0..40).collect::<Vec<u64>>());
        let mut s = o.clone();
        s.sort_unstable();
        assert_eq!(s, (0..40).collect::<Vec<u64>>());
    }
}

#[test]
fn lpm_longest_cached_prefix_first() {
    let c = cache(1);
    put(&c, None, &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
    put(&c, None, &[1, 2, 3, 20, 21]);
    put(&c, Some("t"), &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
    let mut q = vec![
        Waiting::new(0, vec![7, 7], 0),                   // 0
        Waiting::new(1, vec![1, 2, 3, 20, 21, 22], 1),    // 5
        Waiting::new(2, vec![1, 2, 3, 4, 5, 6, 7, 0], 2), // 7
        Waiting::new(3, vec![1, 2, 3, 4, 99], 3),         // 4
        Waiting::new(4, vec![1, 2, 3, 20, 0], 4),         // 4
        Waiting::new(5, vec![1, 2, 3, 4, 5, 6, 7, 0], 5).with_namespace("u"), // 0: other namespace
        Waiting::new(6, vec![1, 2, 3, 4, 5, 6, 0], 6).with_namespace("t"), // 6
    ];
    let r = run(PolicyConfig::new(SchedulePolicy::Lpm), &mut q, &c);
    assert_eq!(r.applied, SchedulePolicy::Lpm);
    assert!(r.deprioritized.is_empty());
    assert_eq!(ids(&q), [2, 6, 1, 3, 4, 0, 5]);
    let lens: Vec<usize> = q.iter().map(|w| w.prefix_len).collect();
    assert_eq!(lens, [7, 6, 5, 4, 4, 0, 0]);
}

/// Priorities do not enter lpm (nor dfs-weight) in SGLang.
#[test]
fn lpm_ignores_priority() {
    let c = cache(1);
    put(&c, None, &[1, 2, 3]);
    let mut q = vec![
        Waiting::new(0, vec![9, 9], 0).with_priority(100),
        Waiting::new(1, vec![1, 2, 3, 4], 1).with_priority(-100),
    ];
    let cfg = PolicyConfig {
        priority_scheduling: true,
        ..PolicyConfig::new(SchedulePolicy::Lpm)
    };
    run(cfg, &mut q, &c);
    assert_eq!(ids(&q), [1, 0]);
}

/// The match never covers the last token, and is whole pages.
#[test]
fn matching_excludes_the_last_token() {
    let key: Vec<u32> = (1..=8).collect();
    for (page, want) in [(1, 7), (2, 6), (4, 4), (8, 0)] {
        let c = cache(page);
        put(&c, None, &key);
        let mut q = vec![Waiting::new(0, key.clone(), 0)];
        run(PolicyConfig::new(SchedulePolicy::Lpm), &mut q, &c);
        assert_eq!(q[0].prefix_len, want, "page size {page}");
        let mut q = vec![Waiting::new(0, cat(&key, &[0]), 0)];
        run(PolicyConfig::new(SchedulePolicy::DfsWeight), &mut q, &c);
        assert_eq!(q[0].prefix_len, 8, "page size {page}: one more token");
    }
    // An empty request matches nothing.
    let c = cache(1);
    let mut q = vec![Waiting::new(0, Vec::<u32>::new(), 0)];
    run(PolicyConfig::new(SchedulePolicy::Lpm), &mut q, &c);
    assert_eq!(q[0].prefix_len, 0);
}

/// Above 128 waiting requests lpm is fcfs: no matching, queue order kept.
#[test]
fn lpm_falls_back_to_fcfs_above_128() {
    let c = cache(1);
    put(&c, None, &[1, 2, 3, 4]);
    let mk = |n: u64| -> Vec<Waiting> {
        (0..n)
            .map(|i| {
                let t = if i == n - 1 {
                    vec![1, 2, 3, 4, 5]
                } else {
                    vec![100 + i as u32, 0]
                };
                Waiting::new(i, t, i).with_priority(i as i64)
            })
            .collect()
    };
    let cfg = PolicyConfig {
        priority_scheduling: true, // not applied on the fallback, as in SGLang
        ..PolicyConfig::new(SchedulePolicy::Lpm)
    };
    let mut q = mk(129);
    let r = run(cfg.clone(), &mut q, &c);
    assert_eq!((r.applied, r.fell_back()), (SchedulePolicy::Fcfs, true));
    assert_eq!(ids(&q), (0..129).collect::<Vec<u64>>());
    assert!(q.iter().all(|w| w.prefix_len == 0));

    let mut q = mk(128);
    let r = run(cfg.clone(), &mut q, &c);
    assert_eq!((r.applied, r.fell_back()), (SchedulePolicy::Lpm, false));
    assert_eq!(q[0].id, 127);
    assert_eq!(q[0].prefix_len, 4);
    assert_eq!(ids(&q[1..]), (0..127).collect::<Vec<u64>>());

    // The threshold is configurable.
    let mut q = mk(5);
    let r = run(
        PolicyConfig {
            lpm_fallback_queue_len: 4,
            ..cfg
        },
        &mut q,
        &c,
    );
    assert!(r.fell_back());
    assert_eq!(ids(&q), [0, 1, 2, 3, 4]);
}

/// SGLang's fallback is for lpm only: dfs-weight still applies above 128.
#[test]
fn dfs_weight_does_not_fall_back() {
    let c = cache(1);
    put(&c, None, &[1, 2, 3]);
    let mut q: Vec<Waiting> = (0..200)
        .map(|i| {
            let t = if i == 150 {
                vec![1, 2, 3, 0]
            } else {
                vec![500 + i as u32, 0]
            };
            Waiting::new(i, t, i)
        })
        .collect();
    let r = run(PolicyConfig::new(SchedulePolicy::DfsWeight), &mut q, &c);
    assert_eq!(
        (r.applied, r.fell_back()),
        (SchedulePolicy::DfsWeight, false)
    );
    // The one request with a match is in a subtree; the rest sit at the root.
    assert_eq!(q[0].id, 150);
    assert_eq!(q[0].prefix_len, 3);
    let rest: Vec<u64> = (0..200).filter(|&i| i != 150).collect();
    assert_eq!(ids(&q[1..]), rest);
}

/// Five requests share a new 64-token prefix: the first computes it, the
/// other four wait behind the unrelated requests.
#[test]
fn in_batch_prefix_caching_deprioritizes_shared_new_prefixes() {
    let c = cache(1);
    let shared = seq(1000, 64);
    let s = |i: u32| cat(&shared, &[i, i]);
    let mut q = vec![
        Waiting::new(0, s(0), 0),
        Waiting::new(1, seq(1, 10), 1),
        Waiting::new(2, s(2), 2),
        Waiting::new(3, s(3), 3),
        Waiting::new(4, seq(50, 40), 4),
        Waiting::new(5, s(5), 5),
        Waiting::new(6, s(6), 6),
    ];
    let r = run(PolicyConfig::new(SchedulePolicy::Lpm), &mut q, &c);
    assert_eq!(r.deprioritized, [2, 3, 5, 6]);
    assert_eq!(ids(&q), [0, 1, 4, 2, 3, 5, 6]);

    // Turned off: nothing is deprioritized.
    let mut q2 = q.clone();
    q2.sort_by_key(|w| w.arrival);
    let r = run(
        PolicyConfig {
            in_batch_check_threshold: None,
            ..PolicyConfig::new(SchedulePolicy::Lpm)
        },
        &mut q2,
        &c,
    );
    assert!(r.deprioritized.is_empty());
    assert_eq!(ids(&q2), [0, 1, 2, 3, 4, 5, 6]);
}

/// The thresholds: an in-batch match of 31 < 32 keeps the request; 32
/// deprioritizes it; deprioritized requests sort after every other request,
/// whatever their cached prefix, and keep their relative order.
#[test]
fn in_batch_thresholds() {
    let c = cache(1);
    let base = seq(1000, 40);
    let mut q = vec![
        Waiting::new(0, base.clone(), 0),
        Waiting::new(1, cat(&base[..31], &[1, 1, 1]), 1), // shares 31
        Waiting::new(2, cat(&base[..32], &[2, 2, 2]), 2), // shares 32
        Waiting::new(3, cat(&base[..33], &[3, 3]), 3),    // shares 33
    ];
    let r = run(PolicyConfig::new(SchedulePolicy::Lpm), &mut q, &c);
    assert_eq!(r.deprioritized, [2, 3]);
    assert_eq!(ids(&q), [0, 1, 2, 3]);

    // A request whose cached prefix exceeds the check threshold is never
    // checked (and not inserted in the scratch tree); one at exactly the
    // threshold is.
    let c = cache(1);
    let p33 = seq(5000, 33);
    let p32 = seq(6000, 32);
    put(&c, None, &p33);
    put(&c, None, &p32);
    let mut q = vec![
        Waiting::new(0, cat(&p33, &seq(1, 40)), 0), // cached 33: not checked
        Waiting::new(1, cat(&p33, &seq(1, 41)), 1), // cached 33: not checked
        Waiting::new(2, cat(&p32, &seq(1, 40)), 2), // cached 32: checked, inserted
        Waiting::new(3, cat(&p32, &seq(1, 41)), 3), // cached 32: in-batch 72 → deprioritized
        Waiting::new(4, seq(7000, 3), 4),
    ];
    let r = run(PolicyConfig::new(SchedulePolicy::Lpm), &mut q, &c);
    assert_eq!(r.deprioritized, [3]);
    assert_eq!(ids(&q), [0, 1, 2, 4, 3]);
    let lens: Vec<usize> = q.iter().map(|w| w.prefix_len).collect();
    assert_eq!(lens, [33, 33, 32, 0, 32]);
}

/// In-batch matching is per namespace.
#[test]
fn in_batch_respects_namespaces() {
    let c = cache(1);
    let p = seq(1, 50);
    let mut q = vec![
        Waiting::new(0, p.clone(), 0).with_namespace("a"),
        Waiting::new(1, p.clone(), 1).with_namespace("b"),
        Waiting::new(2, p.clone(), 2),
        Waiting::new(3, p.clone(), 3).with_namespace("a"),
    ];
    let r = run(PolicyConfig::new(SchedulePolicy::Lpm), &mut q, &c);
    assert_eq!(r.deprioritized, [3]);
    assert_eq!(ids(&q), [0, 1, 2, 3]);
}

/// dfs-weight on a hand-built tree.
///
/// Cached: [1,2,3,4,5,6], [1,2,3,7,8], [9,9,9]. Requests' matched prefixes
/// (the last token is never matched):
///
/// ```text
/// root (r5) ─┬─ [1,2,3] (r4) ─┬─ [4] (r7) ─── [5,6] (r2, r3)
///            │    weight 5    │   weight 3      weight 2
///            │                └─ [7,8] (r1)  weight 1
///            └─ [9,9,9] (r0, r6)  weight 2
/// ```
///
/// Post-order, heavier children first: r2 r3 r7 r1 r4 r0 r6 r5.
#[test]
fn dfs_weight_on_a_hand_built_tree() {
    let c = cache(1);
    put(&c, None, &[1, 2, 3, 4, 5, 6]);
    put(&c, None, &[1, 2, 3, 7, 8]);
    put(&c, None, &[9, 9, 9]);
    let mk = || {
        vec![
            Waiting::new(0, vec![9, 9, 9, 0], 0),
            Waiting::new(1, vec![1, 2, 3, 7, 8, 0], 1),
            Waiting::new(2, vec![1, 2, 3, 4, 5, 6, 0], 2),
            Waiting::new(3, vec![1, 2, 3, 4, 5, 6, 1], 3),
            Waiting::new(4, vec![1, 2, 3, 0], 4),
            Waiting::new(5, vec![5, 5], 5).with_priority(99),
            Waiting::new(6, vec![9, 9, 9, 1], 6),
            Waiting::new(7, vec![1, 2, 3, 4, 9], 7),
        ]
    };
    let cfg = PolicyConfig {
        priority_scheduling: true, // ignored by dfs-weight, as in SGLang
        ..PolicyConfig::new(SchedulePolicy::DfsWeight)
    };
    let mut q = mk();
    let r = run(cfg.clone(), &mut q, &c);
    assert_eq!(r.applied, SchedulePolicy::DfsWeight);
    assert!(r.deprioritized.is_empty());
    assert_eq!(ids(&q), [2, 3, 7, 1, 4, 0, 6, 5]);
    let lens: Vec<usize> = q.iter().map(|w| w.prefix_len).collect();
    assert_eq!(lens, [6, 6, 4, 5, 3, 3, 3, 0]);

    // The order does not depend on the queue's order except for ties
    // (none here) and within a node.
    let mut q = mk();
    q.reverse();
    run(cfg, &mut q, &c);
    assert_eq!(ids(&q), [3, 2, 7, 1, 4, 6, 0, 5]);
}

/// Equal-weight siblings: the one whose first request comes first in the
/// queue goes first (SGLang uses the tree's child order, not observable).
#[test]
fn dfs_weight_ties_keep_first_appearance() {
    let c = cache(1);
    put(&c, None, &[1, 1]);
    put(&c, None, &[2, 2]);
    let mut q = vec![
        Waiting::new(0, vec![2, 2, 0], 0),
        Waiting::new(1, vec![1, 1, 0], 1),
        Waiting::new(2, vec![1, 1, 5], 2),
        Waiting::new(3, vec![2, 2, 7], 3),
    ];
    run(PolicyConfig::new(SchedulePolicy::DfsWeight), &mut q, &c);
    assert_eq!(ids(&q), [0, 3, 1, 2]);
}

#[test]
fn unknown_device_is_an_error_and_changes_nothing() {
    let c = cache(1);
    put(&c, None, &[1, 2, 3]);
    for p in SchedulePolicy::ALL {
        let mut q = vec![
            Waiting::new(0, vec![9, 9], 0).with_max_new_tokens(1),
            Waiting::new(1, vec![1, 2, 3, 4], 1).with_max_new_tokens(9),
        ];
        let before = q.clone();
        let e = QueueOrderer::new(PolicyConfig::new(p))
            .order(&mut q, &c, DeviceId(3))
            .unwrap_err();
        assert!(matches!(e, CacheError::UnknownDevice { .. }), "{p}: {e}");
        assert_eq!(q, before, "{p}");
    }
}

/// Matching goes to the asked device only.
#[test]
fn lpm_matches_on_the_asked_device() {
    let c = RadixCache::builder().devices(2).build().unwrap();
    c.insert(TokenKey::new(&[1, 2, 3]), DeviceId(1), &[0, 1, 2], 0)
        .unwrap();
    c.insert(TokenKey::new(&[4, 5]), D0, &[0, 1], 0).unwrap();
    let mk = || {
        vec![
            Waiting::new(0, vec![4, 5, 0], 0),
            Waiting::new(1, vec![1, 2, 3, 0], 1),
        ]
    };
    let mut o = QueueOrderer::new(PolicyConfig::new(SchedulePolicy::Lpm));
    let mut q = mk();
    o.order(&mut q, &c, D0).unwrap();
    assert_eq!(ids(&q), [0, 1]);
    let mut q = mk();
    o.order(&mut q, &c, DeviceId(1)).unwrap();
    assert_eq!(ids(&q), [1, 0]);
}

/// Deprioritized requests keep their queue order whatever their cached
/// prefix (SGLang's key is +inf for all of them).
#[test]
fn deprioritized_requests_keep_queue_order() {
    let c = cache(1);
    let s1 = seq(100, 40);
    let s2 = seq(200, 40);
    put(&c, None, &s2[..8]);
    let mut q = vec![
        Waiting::new(0, cat(&s1, &[1]), 0),    // cached 0, inserted
        Waiting::new(1, cat(&s1, &[2, 2]), 1), // cached 0, deprioritized
        Waiting::new(2, cat(&s2, &[1]), 2),    // cached 8, inserted
        Waiting::new(3, cat(&s2, &[2, 2]), 3), // cached 8, deprioritized
    ];
    let r = run(PolicyConfig::new(SchedulePolicy::Lpm), &mut q, &c);
    assert_eq!(r.deprioritized, [1, 3]);
    assert_eq!(ids(&q), [2, 0, 1, 3]);
    let lens: Vec<usize> = q.iter().map(|w| w.prefix_len).collect();
    assert_eq!(lens, [8, 0, 0, 8]);
}
