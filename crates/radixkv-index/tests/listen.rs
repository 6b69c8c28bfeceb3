//! The listener against a publisher the test drives frame by frame (a PUB
//! socket and a replay ROUTER of the test's own, speaking the protocol
//! vLLM, SGLang and radixkv share): batches dropped, duplicated, reordered,
//! junk frames, a late start, a quiet source known from its replay alone,
//! a replay that no longer reaches back, a restart, with and without a
//! replay endpoint. After each, the index equals the one the same batches make
//! when applied in order (or, where a gap was lost, holds nothing of the
//! source until it clears).

use bytes::Bytes;
use radixkv_events::testing::FramePublisher;
use radixkv_events::wire::{KvEvent, Medium};
use radixkv_index::listen::{listen, Feedpoint, ListenOptions, SourceCounters};
use radixkv_index::{KvIndex, Source};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

const SRC: Source = Source { worker: 3, rank: 0 };

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A stream of batches: a clearing, then chains of stores and removals
/// over a small alphabet (blocks of 2 tokens).
fn stream(n: usize, seed: u64) -> Vec<Vec<KvEvent>> {
    let mut out = vec![vec![KvEvent::AllBlocksCleared]];
    let mut held: Vec<(u64, Vec<u32>)> = Vec::new(); // (hash, path)
    let mut x = seed;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut id = 1000 * seed;
    for _ in 0..n {
        if !held.is_empty() && next() % 4 == 0 {
            // Remove a leaf: a held block nothing held continues.
            let leaves: Vec<usize> = (0..held.len())
                .filter(|&i| {
                    !held
                        .iter()
                        .any(|(_, p)| p.len() > held[i].1.len() && p.starts_with(&held[i].1))
                })
                .collect();
            let i = leaves[(next() as usize) % leaves.len()];
            let (h, _) = held.remove(i);
            out.push(vec![KvEvent::BlockRemoved {
                block_hashes: vec![h],
                medium: Medium::Gpu,
            }]);
            continue;
        }
        let parent = if held.is_empty() || next() % 3 == 0 {
            None
        } else {
            Some(held[(next() as usize) % held.len()].clone())
        };
        let tokens = vec![(next() % 5) as u32, (next() % 5) as u32];
        let mut path = parent.as_ref().map_or(Vec::new(), |(_, p)| p.clone());
        path.extend(&tokens);
        if held.iter().any(|(_, p)| *p == path) {
            continue;
        }
        id += 1;
        out.push(vec![KvEvent::BlockStored {
            block_hashes: vec![id],
            parent_block_hash: parent.map(|(h, _)| h),
            token_ids: tokens,
            block_size: 2,
            medium: Medium::Gpu,
            lora_name: None,
            cache_salt: None,
        }]);
        held.push((id, path));
    }
    out
}

/// The index the batches make applied in order.
fn reference(batches: &[Vec<KvEvent>]) -> KvIndex {
    let ix = KvIndex::new(2, 4).unwrap();
    for b in batches {
        let decoded = radixkv_index::decode::decode_batch(&FramePublisher::payload(b)).unwrap();
        if matches!(
            decoded.events.first(),
            Some(radixkv_index::decode::Event::Cleared)
        ) {
            ix.clear(SRC);
        }
        let (_, errors) = ix.apply(SRC, &decoded.events);
        assert!(errors.is_empty(), "{errors:?}");
    }
    ix
}

/// Every path of two-token blocks up to four blocks deep over the alphabet
/// the stream draws from, as prompts.
fn prompts() -> Vec<Vec<u32>> {
    let mut out = vec![Vec::new()];
    let mut frontier = vec![Vec::new()];
    for _ in 0..3 {
        let mut next = Vec::new();
        for p in &frontier {
            for a in 0..5 {
                for b in 0..5 {
                    let mut q: Vec<u32> = p.clone();
                    q.extend([a, b]);
                    next.push(q);
                }
            }
        }
        out.extend(next.iter().cloned());
        frontier = next;
    }
    out
}

fn same(a: &KvIndex, b: &KvIndex) -> Result<(), String> {
    for p in prompts() {
        let (x, y) = (a.scores(&p, None), b.scores(&p, None));
        if x != y {
            return Err(format!("{p:?}: {x:?} vs {y:?}"));
        }
    }
    Ok(())
}

/// Waits (bounded) until `ix` equals `want`.
async fn converges(ix: &KvIndex, want: &KvIndex, what: &str) {
    let t = Instant::now();
    loop {
        match same(ix, want) {
            Ok(()) => return,
            Err(e) if t.elapsed() > Duration::from_secs(30) => panic!("{what}: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

async fn started(
    replay: bool,
    options: ListenOptions,
) -> (
    FramePublisher,
    Arc<KvIndex>,
    Arc<SourceCounters>,
    tokio::task::JoinHandle<()>,
) {
    let fake = FramePublisher::bind(free_port(), free_port())
        .await
        .unwrap();
    let (ix, counters, task) = listener(&fake, replay, options);
    (fake, ix, counters, task)
}

/// A listener on `fake`'s endpoint (and its replay one if `replay`).
fn listener(
    fake: &FramePublisher,
    replay: bool,
    options: ListenOptions,
) -> (
    Arc<KvIndex>,
    Arc<SourceCounters>,
    tokio::task::JoinHandle<()>,
) {
    let ix = Arc::new(KvIndex::new(2, 4).unwrap());
    let counters = Arc::new(SourceCounters::default());
    let fp = Feedpoint {
        source: SRC,
        endpoint: fake.endpoint.clone(),
        replay: replay.then(|| fake.replay.clone()),
        topic: String::new(),
    };
    let task = tokio::spawn(listen(Arc::clone(&ix), fp, Arc::clone(&counters), options));
    (ix, counters, task)
}

/// Sends probes (batches that change nothing: clearings are not) until the
/// listener has its subscription: a duplicate of the last batch, which it
/// drops, counted.
async fn subscribed(fake: &mut FramePublisher, counters: &SourceCounters, last: (u64, &[KvEvent])) {
    let t = Instant::now();
    while counters.live_batches.load(Ordering::Relaxed) == 0 {
        assert!(t.elapsed() < Duration::from_secs(30), "no subscription");
        fake.publish(last.0, last.1, true).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drops_duplicates_reorders_and_junk_converge_with_a_replay() {
    let (mut fake, ix, counters, task) = started(true, ListenOptions::default()).await;
    let batches = stream(300, 7);
    // Seq 0 is sent until the subscription holds (the listener applies it
    // once and drops the repeats).
    subscribed(&mut fake, &counters, (0, &batches[0])).await;
    for (i, b) in batches.iter().enumerate().skip(1) {
        let seq = i as u64;
        match i % 11 {
            // Dropped: only the replay has it.
            3 => fake.publish(seq, b, false).await,
            // Sent twice.
            5 => {
                fake.publish(seq, b, true).await;
                fake.publish(seq, b, true).await;
            }
            // Junk beside it: one frame, and a payload that is not a batch.
            7 => {
                fake.raw(vec![Bytes::from_static(b"junk")]).await;
                fake.raw(vec![
                    Bytes::new(),
                    Bytes::copy_from_slice(&seq.to_be_bytes()),
                    Bytes::from_static(&[0xc1, 0x00]),
                ])
                .await;
                fake.publish(seq, b, true).await;
            }
            _ => fake.publish(seq, b, true).await,
        }
    }
    let want = reference(&batches);
    converges(&ix, &want, "after drops, duplicates and junk").await;
    let f = *counters.feed.lock().unwrap();
    assert!(
        f.gaps >= 20 && f.recovered == f.gaps && f.lost == 0,
        "{f:?}"
    );
    assert!(f.duplicates >= 20, "{f:?}");
    assert!(counters.junk.load(Ordering::Relaxed) >= 1, "junk counted");
    // Reordered: a later batch first (a gap, filled), the earlier after (a
    // duplicate).
    let more = stream(40, 8);
    let base = batches.len() as u64;
    let all: Vec<Vec<KvEvent>> = batches
        .iter()
        .cloned()
        .chain(more.iter().skip(1).cloned())
        .collect();
    let tail: Vec<(usize, &Vec<KvEvent>)> = more.iter().enumerate().skip(1).collect();
    for pair in tail.chunks(2) {
        // Both logged first (a publisher's replay buffer has a batch from
        // the moment it sends it), then sent later one first.
        for (k, ev) in pair {
            fake.publish(base + *k as u64 - 1, ev, false).await;
        }
        for (k, ev) in pair.iter().rev() {
            fake.publish(base + *k as u64 - 1, ev, true).await;
        }
    }
    converges(&ix, &reference(&all), "after reordering").await;
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_start_replays_from_zero() {
    let (mut fake, ix, counters, task) = started(true, ListenOptions::default()).await;
    let batches = stream(100, 11);
    // The first 60 before anyone listens (logged for the replay only).
    for (i, b) in batches.iter().enumerate().take(60) {
        fake.publish(i as u64, b, false).await;
    }
    subscribed(&mut fake, &counters, (60, &batches[60])).await;
    for (i, b) in batches.iter().enumerate().skip(61) {
        fake.publish(i as u64, b, true).await;
    }
    converges(&ix, &reference(&batches), "a late start").await;
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_source_is_known_from_its_replay_once_subscribed() {
    let fake = FramePublisher::bind(free_port(), free_port())
        .await
        .unwrap();
    let batches = stream(80, 19);
    // Everything before anyone listens, and nothing after: only the
    // replay can tell the listener.
    for (i, b) in batches.iter().enumerate() {
        fake.log_payload(i as u64, FramePublisher::payload(b));
    }
    let (ix, counters, task) = listener(&fake, true, ListenOptions::default());
    let t = Instant::now();
    let n = batches.len() as u64;
    while counters.feed.lock().unwrap().applied < n {
        assert!(t.elapsed() < Duration::from_secs(30), "not replayed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    same(&ix, &reference(&batches)).unwrap();
    assert_eq!(counters.live_batches.load(Ordering::Relaxed), 0);
    let f = *counters.feed.lock().unwrap();
    assert_eq!((f.gaps, f.lost, f.applied), (0, 0, n), "{f:?}");
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_that_no_longer_reaches_back_leaves_the_source_stale() {
    let mut fake = FramePublisher::bind(free_port(), free_port())
        .await
        .unwrap();
    let batches = stream(40, 23);
    // The publisher's buffer holds batches 10 on: what came before is
    // unknown.
    for (i, b) in batches.iter().enumerate().skip(10) {
        fake.log_payload(i as u64, FramePublisher::payload(b));
    }
    let (ix, counters, task) = listener(&fake, true, ListenOptions::default());
    let t = Instant::now();
    while !counters.stale.load(Ordering::Relaxed) {
        assert!(t.elapsed() < Duration::from_secs(30), "never stale");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(ix.held_blocks(), 0, "nothing of a stale source");
    // Its next clearing makes it known again.
    let restarted = stream(20, 29);
    let t = Instant::now();
    while counters.stale.load(Ordering::Relaxed) {
        assert!(t.elapsed() < Duration::from_secs(30), "still stale");
        fake.publish(0, &restarted[0], true).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for (i, b) in restarted.iter().enumerate().skip(1) {
        fake.publish(i as u64, b, true).await;
    }
    converges(&ix, &reference(&restarted), "after its clearing").await;
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_replay_a_gap_leaves_the_source_stale_until_it_clears() {
    let (mut fake, ix, counters, task) = started(false, ListenOptions::default()).await;
    let batches = stream(60, 13);
    subscribed(&mut fake, &counters, (0, &batches[0])).await;
    for (i, b) in batches.iter().enumerate().skip(1).take(29) {
        fake.publish(i as u64, b, true).await;
    }
    converges(&ix, &reference(&batches[..30]), "before the gap").await;
    // 30 is lost: the source is cleared and stale.
    fake.publish(30, &batches[30], false).await;
    for (i, b) in batches.iter().enumerate().skip(31) {
        fake.publish(i as u64, b, true).await;
    }
    let t = Instant::now();
    while !counters.stale.load(Ordering::Relaxed) {
        assert!(t.elapsed() < Duration::from_secs(30), "never stale");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    converges(
        &ix,
        &KvIndex::new(2, 4).unwrap(),
        "stale: nothing of the source",
    )
    .await;
    // The worker restarts: its clearing (sequence 0 again) and new stores.
    let restarted = stream(50, 17);
    for (i, b) in restarted.iter().enumerate() {
        fake.publish(i as u64, b, true).await;
    }
    converges(&ix, &reference(&restarted), "after the restart").await;
    assert!(!counters.stale.load(Ordering::Relaxed));
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_past_the_queue_is_counted_and_replayed_as_gaps() {
    let options = ListenOptions {
        queue: 8,
        // Long: the test holds the replay while it floods.
        replay_timeout: Duration::from_secs(120),
    };
    let (mut fake, ix, counters, task) = started(true, options).await;
    let batches = stream(400, 19);
    subscribed(&mut fake, &counters, (0, &batches[0])).await;
    // The applier is held in a replay (1 missing, 2 sent) ...
    let gate = Arc::clone(&fake.gate);
    let held = gate.lock().await;
    fake.publish(1, &batches[1], false).await;
    fake.publish(2, &batches[2], true).await;
    // ... while the rest floods in.
    for (i, b) in batches.iter().enumerate().skip(3) {
        fake.publish(i as u64, b, true).await;
    }
    let t = Instant::now();
    while counters.overflow.load(Ordering::Relaxed) == 0 {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "the queue never filled"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    drop(held);
    // The last batch again, until it is applied (it may have been one of
    // those dropped, and only a later batch shows a gap).
    let last = batches.len() as u64 - 1;
    let t = Instant::now();
    while counters.feed.lock().unwrap().applied < batches.len() as u64 {
        assert!(t.elapsed() < Duration::from_secs(60), "never caught up");
        fake.publish(last, &batches[last as usize], true).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    converges(&ix, &reference(&batches), "after the flood").await;
    let f = *counters.feed.lock().unwrap();
    let overflow = counters.overflow.load(Ordering::Relaxed);
    assert!(
        overflow > 0 && f.lost == 0 && f.recovered == f.gaps,
        "{overflow} {f:?}"
    );
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_whose_first_batches_precede_the_reconnection_is_caught_up() {
    let (port, rport) = (free_port(), free_port());
    let fake = FramePublisher::bind(port, rport).await.unwrap();
    let (ix, counters, task) = listener(&fake, true, ListenOptions::default());
    let mut fake = fake;
    let first = stream(80, 23);
    subscribed(&mut fake, &counters, (0, &first[0])).await;
    for (i, b) in first.iter().enumerate().skip(1) {
        fake.publish(i as u64, b, true).await;
    }
    converges(&ix, &reference(&first), "the first run").await;

    // The process dies; a new one binds the same ports and numbers from 0
    // again, as vLLM and SGLang do.
    drop(fake);
    let t = Instant::now();
    let mut fake = loop {
        match FramePublisher::bind(port, rport).await {
            Ok(f) => break f,
            Err(e) => assert!(t.elapsed() < Duration::from_secs(30), "{e}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // The reconnection's catch-up finds nothing yet ...
    let t = Instant::now();
    while fake.replays.load(Ordering::SeqCst) == 0 {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "no catch-up after the reconnection"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // ... then the new run's first batches (its clearing among them) go
    // out unseen, and a later one live: below the sequence followed so
    // far, it is no duplicate.
    let second = stream(60, 29);
    for (i, b) in second.iter().enumerate().take(40) {
        fake.publish(i as u64, b, false).await;
    }
    for (i, b) in second.iter().enumerate().skip(40) {
        fake.publish(i as u64, b, true).await;
    }
    converges(&ix, &reference(&second), "the restarted run").await;
    assert!(counters.reconnects.load(Ordering::Relaxed) >= 1);
    task.abort();
}
