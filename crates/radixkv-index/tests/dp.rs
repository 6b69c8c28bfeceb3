//! `DpRouter`: ranks' batches in (radixkv's publisher encoding, both
//! forms), scores per rank, and routes as the engine's cache-aware rule
//! makes them: the longest cached or dispatched prefix, load balance,
//! inactive ranks skipped, a gap leaving its rank stale until it clears.

use radixkv::routing::{BalanceRule, CacheAwarePolicy, NewPrefix};
use radixkv_events::wire::{encode_batch, Encoding, KvEvent, Medium};
use radixkv_index::dp::{DpError, DpPolicy, DpRouter, LoadMeasure, RankLoad};
use std::time::Duration;

fn stored(hashes: &[u64], parent: Option<u64>, tokens: &[u32]) -> KvEvent {
    KvEvent::BlockStored {
        block_hashes: hashes.to_vec(),
        parent_block_hash: parent,
        token_ids: tokens.to_vec(),
        block_size: 2,
        medium: Medium::Gpu,
        lora_name: None,
        cache_salt: None,
    }
}

fn batch(events: &[KvEvent], enc: Encoding) -> Vec<u8> {
    encode_batch(0.0, events, None, enc)
}

fn idle(n: usize) -> Vec<RankLoad> {
    vec![RankLoad::idle(); n]
}

fn load(requests: &[usize]) -> Vec<RankLoad> {
    requests
        .iter()
        .map(|&r| RankLoad {
            requests: r,
            tokens: 100 * r,
            active: true,
        })
        .collect()
}

#[test]
fn a_request_goes_where_its_longest_prefix_is_cached() {
    for enc in Encoding::ALL {
        let r = DpRouter::new(3, 2, DpPolicy::default()).unwrap();
        r.ingest(
            1,
            &batch(&[stored(&[1, 2], None, &[5, 6, 7, 8])], enc),
            Some(0),
        )
        .unwrap();
        r.ingest(2, &batch(&[stored(&[9], None, &[5, 6])], enc), Some(0))
            .unwrap();
        assert_eq!(r.scores(&[5, 6, 7, 8, 9], None), [0, 4, 2], "{enc:?}");
        let c = r.route(&[5, 6, 7, 8, 9], None, &idle(3)).unwrap().unwrap();
        assert_eq!((c.device, c.expected_prefix, c.balanced), (1, 4, false));
        // Rank 1 is busier but the load is not imbalanced (2 <= 32).
        let c = r
            .route(&[5, 6, 7, 8], None, &load(&[0, 2, 0]))
            .unwrap()
            .unwrap();
        assert_eq!(c.device, 1);
        // Imbalanced (40 > 32 and 40 > 1.5 x 1): the least loaded.
        let c = r
            .route(&[5, 6, 7, 8], None, &load(&[3, 40, 1]))
            .unwrap()
            .unwrap();
        assert_eq!((c.device, c.balanced), (2, true));
    }
}

#[test]
fn a_burst_of_one_prefix_follows_the_first_and_without_pending_it_spreads() {
    let burst = |ttl: Duration| {
        let r = DpRouter::new(
            4,
            2,
            DpPolicy {
                pending_ttl: ttl,
                ..DpPolicy::default()
            },
        )
        .unwrap();
        // The dispatcher counts each request on its rank as it sends it.
        let mut requests = [0usize; 4];
        let mut ranks = Vec::new();
        for i in 0..8u32 {
            let prompt = [40, 41, 42, 43, 100 + i, 7];
            let c = r.route(&prompt, None, &load(&requests)).unwrap().unwrap();
            requests[c.device] += 1;
            ranks.push(c.device);
        }
        ranks
    };
    assert_eq!(burst(Duration::from_secs(60)), [0; 8]);
    // The negative control: a router that forgets what it dispatched
    // spreads the burst over every rank (each one recomputes the prefix).
    let blind = burst(Duration::ZERO);
    assert_eq!(blind[..4], [0, 1, 2, 3], "{blind:?}");
}

#[test]
fn dispatched_prefixes_expire_and_settle() {
    let r = DpRouter::new(
        2,
        2,
        DpPolicy {
            pending_tokens: 4,
            ..DpPolicy::default()
        },
    )
    .unwrap();
    r.route(&[1, 2, 3, 4], None, &load(&[0, 1])).unwrap();
    assert_eq!(r.dispatched_len(), 1);
    // Over the token budget: the oldest is forgotten at the next route.
    let c = r.route(&[9, 9], None, &load(&[1, 0])).unwrap().unwrap();
    assert_eq!(c.device, 1);
    let c = r
        .route(&[1, 2, 3, 4], None, &load(&[1, 0]))
        .unwrap()
        .unwrap();
    assert_eq!(
        (c.device, c.expected_prefix),
        (1, 0),
        "rank 0's dispatch forgotten"
    );
    r.settled(&[1, 2, 3, 4], None, 1);
    r.settled(&[9, 9], None, 1);
    assert_eq!(r.dispatched_len(), 0);
}

#[test]
fn inactive_ranks_are_skipped_and_none_active_is_none() {
    let r = DpRouter::new(2, 2, DpPolicy::default()).unwrap();
    r.ingest(
        0,
        &batch(&[stored(&[1], None, &[5, 6])], Encoding::Map),
        None,
    )
    .unwrap();
    let mut l = idle(2);
    l[0].active = false;
    let c = r.route(&[5, 6], None, &l).unwrap().unwrap();
    assert_eq!((c.device, c.expected_prefix), (1, 0));
    l[1].active = false;
    assert!(r.route(&[5, 6], None, &l).unwrap().is_none());
    assert!(matches!(
        r.route(&[5, 6], None, &idle(3)),
        Err(DpError::NoRank { rank: 3, ranks: 2 })
    ));
}

#[test]
fn a_gap_leaves_the_rank_stale_until_it_clears_and_duplicates_drop() {
    let r = DpRouter::new(2, 2, DpPolicy::default()).unwrap();
    let a = batch(&[stored(&[1], None, &[5, 6])], Encoding::Map);
    assert_eq!(r.ingest(0, &a, Some(0)).unwrap().events, 1);
    let a2 = batch(&[stored(&[4], Some(1), &[1, 1])], Encoding::Map);
    assert_eq!(r.ingest(0, &a2, Some(1)).unwrap().events, 1);
    assert!(r.ingest(0, &a2, Some(1)).unwrap().dropped, "a duplicate");
    assert_eq!(r.scores(&[5, 6], None), [2, 0]);
    let b = batch(&[stored(&[2], Some(1), &[7, 8])], Encoding::Map);
    let g = r.ingest(0, &b, Some(5)).unwrap();
    assert!(g.gap && g.dropped);
    assert_eq!(r.stale_ranks(), [0]);
    assert_eq!(r.scores(&[5, 6, 7, 8], None), [0, 0], "cleared while stale");
    assert!(r.ingest(0, &b, Some(6)).unwrap().dropped, "stale: dropped");
    let restart = batch(
        &[KvEvent::AllBlocksCleared, stored(&[3], None, &[5, 6])],
        Encoding::Map,
    );
    assert_eq!(r.ingest(0, &restart, Some(0)).unwrap().events, 2);
    assert!(r.stale_ranks().is_empty());
    assert_eq!(r.scores(&[5, 6], None), [2, 0]);
}

#[test]
fn above_mean_weighs_each_active_rank_against_the_mean_of_the_active() {
    let r = DpRouter::new(
        4,
        2,
        DpPolicy {
            cache_aware: CacheAwarePolicy {
                rule: BalanceRule::AboveMean,
                balance_abs: 4,
                balance_rel: 1.2,
                ..CacheAwarePolicy::default()
            },
            ..DpPolicy::default()
        },
    )
    .unwrap();
    let e = batch(&[stored(&[7], None, &[1, 2])], Encoding::Map);
    r.ingest(1, &e, None).unwrap();
    r.ingest(2, &e, None).unwrap();
    // Rank 3 idle: the global rule would send this there. Against the
    // mean (6.5; bound 7.8) rank 1 keeps its prefix.
    let c = r
        .route(&[1, 2, 9], None, &load(&[8, 7, 11, 0]))
        .unwrap()
        .unwrap();
    assert_eq!((c.device, c.expected_prefix, c.balanced), (1, 2, false));
    // Rank 1 above the bound (mean 7.25, bound 8.7): rank 2, which holds
    // the prefix too, takes it, though busier than ranks 0 and 3.
    let c = r
        .route(&[1, 2, 9], None, &load(&[5, 12, 8, 4]))
        .unwrap()
        .unwrap();
    assert_eq!((c.device, c.expected_prefix, c.balanced), (2, 2, false));
    // Both holders above it: the least loaded of the rest, balanced.
    let c = r
        .route(&[1, 2, 3], None, &load(&[5, 12, 12, 1]))
        .unwrap()
        .unwrap();
    assert_eq!((c.device, c.expected_prefix, c.balanced), (3, 0, true));
    // The mean is the active ranks': with rank 3 (idle) inactive, the mean
    // is 9 (bound 10.8) and rank 1 (9) keeps the prefix (it was sent [1, 2]
    // as ranks 2 and 3 were; rank 2 is busier). Counting rank 3, the bound
    // would be 8.1 and both holders would step aside.
    let mut l = load(&[8, 9, 10, 0]);
    l[3].active = false;
    let c = r.route(&[1, 2, 4], None, &l).unwrap().unwrap();
    assert_eq!((c.device, c.balanced), (1, false));
}

#[test]
fn a_rank_holding_keep_prefix_tokens_keeps_the_request_however_loaded() {
    let policy = |keep| DpPolicy {
        cache_aware: CacheAwarePolicy {
            rule: BalanceRule::AboveMean,
            balance_abs: 4,
            balance_rel: 1.2,
            keep_prefix_tokens: keep,
            ..CacheAwarePolicy::default()
        },
        ..DpPolicy::default()
    };
    // Rank 1 holds 4 tokens (two pages) of the prompt and runs 12
    // requests against a mean of 7.25 (bound 8.7).
    let e = batch(&[stored(&[7, 8], None, &[1, 2, 3, 4])], Encoding::Map);
    let busy = load(&[5, 12, 8, 4]);
    for (keep, device, prefix, balanced) in [(4, 1, 4, false), (5, 3, 0, true)] {
        let r = DpRouter::new(4, 2, policy(keep)).unwrap();
        r.ingest(1, &e, None).unwrap();
        let c = r.route(&[1, 2, 3, 4, 9], None, &busy).unwrap().unwrap();
        assert_eq!(
            (c.device, c.expected_prefix, c.balanced),
            (device, prefix, balanced),
            "keep_prefix_tokens {keep}"
        );
    }
    // What was sent counts as held: the next turn of a prompt routed to
    // the busy rank stays there before the rank has cached it.
    let r = DpRouter::new(4, 2, policy(4)).unwrap();
    let quiet = load(&[0, 0, 0, 0]);
    let first = r.route(&[5, 6, 7, 8], None, &quiet).unwrap().unwrap();
    let mut l = load(&[1, 1, 1, 1]);
    l[first.device].requests = 12;
    let c = r.route(&[5, 6, 7, 8, 9, 9], None, &l).unwrap().unwrap();
    assert_eq!((c.device, c.expected_prefix), (first.device, 4));
}

#[test]
fn tokens_can_be_the_load_and_bad_input_is_an_error() {
    let r = DpRouter::new(
        2,
        2,
        DpPolicy {
            load: LoadMeasure::Tokens,
            ..DpPolicy::default()
        },
    )
    .unwrap();
    // 1 request each, but rank 0 has 100 tokens against 0: imbalanced in
    // tokens (100 > 32 and 100 > 0).
    let l = [
        RankLoad {
            requests: 1,
            tokens: 100,
            active: true,
        },
        RankLoad {
            requests: 1,
            tokens: 0,
            active: true,
        },
    ];
    let c = r.route(&[1, 2], None, &l).unwrap().unwrap();
    assert_eq!((c.device, c.balanced), (1, true));
    assert!(matches!(
        r.ingest(0, b"\xc1", None),
        Err(DpError::Decode(_))
    ));
    assert!(matches!(
        r.ingest(2, &batch(&[], Encoding::Map), None),
        Err(DpError::NoRank { rank: 2, ranks: 2 })
    ));
    assert!(DpRouter::new(0, 2, DpPolicy::default()).is_err());
    assert!(DpRouter::new(2, 0, DpPolicy::default()).is_err());
    let skipped = r
        .ingest(
            0,
            &batch(&[stored(&[1], Some(77), &[1, 2])], Encoding::Map),
            None,
        )
        .unwrap();
    assert_eq!(skipped.events, 0);
    assert!(skipped.skipped[0].contains("does not hold"), "{skipped:?}");
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscribed_rank_is_followed_on_its_sockets_gaps_replayed() {
    use bytes::Bytes;
    use radixkv_events::testing::FramePublisher;
    let mut p = FramePublisher::bind(free_port(), free_port())
        .await
        .unwrap();
    let r = DpRouter::new(2, 2, DpPolicy::default()).unwrap();
    // Published before the router listens: found by the replay it asks for
    // once subscribed.
    let early = Bytes::from(batch(&[stored(&[1], None, &[5, 6])], Encoding::Map));
    p.log_payload(0, early);
    r.subscribe(1, &p.endpoint, Some(&p.replay), "", Default::default())
        .unwrap();
    assert!(matches!(
        r.subscribe(1, &p.endpoint, None, "", Default::default()),
        Err(DpError::Subscribed(1))
    ));
    assert!(matches!(
        r.ingest(1, &batch(&[], Encoding::Map), None),
        Err(DpError::Subscribed(1))
    ));
    let next = Bytes::from(batch(&[stored(&[2], Some(1), &[7, 8])], Encoding::Map));
    p.log_payload(1, next.clone());
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    // Sent until the subscription has joined (a PUB drops what it sends
    // before), each time the same batch: duplicates are dropped.
    while r.scores(&[5, 6, 7, 8], None) != [0, 4] {
        assert!(std::time::Instant::now() < deadline, "never followed");
        p.send_payload(1, next.clone()).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let c = r.route(&[5, 6, 7, 8], None, &idle(2)).unwrap().unwrap();
    assert_eq!(c.device, 1);
    // A batch the socket never carries (only the replay has it): the next
    // one shows the gap, and the replay fills it.
    p.log_payload(
        2,
        Bytes::from(batch(&[stored(&[3], Some(2), &[9, 10])], Encoding::Map)),
    );
    let after = Bytes::from(batch(&[stored(&[4], Some(3), &[11, 12])], Encoding::Map));
    p.log_payload(3, after.clone());
    // Sent until it is followed (the subscription may have joined after
    // the replay brought batch 1); the copies after it are dropped.
    while r.scores(&[5, 6, 7, 8, 9, 10, 11, 12], None) != [0, 8] {
        assert!(std::time::Instant::now() < deadline, "the gap never filled");
        p.send_payload(3, after.clone()).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(r.stale_ranks().is_empty());
    let counters = r.subscription(1).unwrap();
    assert!(counters.feed_stats().recovered >= 1, "the gap was replayed");
    assert!(r.subscription(0).is_none());
}

#[test]
fn a_new_prefix_goes_to_the_rank_written_least_lately() {
    let policy = |new_prefix| DpPolicy {
        cache_aware: CacheAwarePolicy {
            new_prefix,
            ..CacheAwarePolicy::default()
        },
        ..DpPolicy::default()
    };
    // Rank 0 is sent 4 new tokens, then rank 1 (the less loaded) 2; then
    // a third new prompt comes with rank 0 the busier. Returns where it
    // goes.
    let third = |new_prefix, held: &[u64]| {
        let r = DpRouter::new(2, 2, policy(new_prefix)).unwrap();
        if !held.is_empty() {
            let tokens: Vec<u32> = (0..2 * held.len() as u32).map(|t| 1000 + t).collect();
            r.ingest(
                1,
                &batch(&[stored(held, None, &tokens)], Encoding::Map),
                None,
            )
            .unwrap();
        }
        let first = r.route(&[1, 2, 3, 4], None, &idle(2)).unwrap().unwrap();
        let second = r.route(&[5, 6], None, &load(&[3, 0])).unwrap().unwrap();
        assert_eq!((first.device, second.device), (0, 1));
        r.route(&[7, 8], None, &load(&[3, 0]))
            .unwrap()
            .unwrap()
            .device
    };
    // Nothing held: the window is one block (2 tokens), and rank 1's 2
    // new tokens decayed rank 0's 4 to 4/e (1.47 < 2): the new prompt goes
    // to rank 0, the busier, under least-pressure; by default to rank 1.
    assert_eq!(third(NewPrefix::LeastPressure, &[]), 0);
    assert_eq!(third(NewPrefix::LeastLoaded, &[]), 1);
    // 10 blocks held (20 tokens): rank 0's 4 decay only to 3.62, above
    // rank 1's 2.
    let held: Vec<u64> = (100..110).collect();
    assert_eq!(third(NewPrefix::LeastPressure, &held), 1);
}
