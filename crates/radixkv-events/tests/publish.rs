//! The publisher end to end over real sockets (loopback): a cache with two
//! devices and a host tier publishes; subscribers read both devices'
//! sockets and the replay sockets; every payload is decoded (rmpv) and
//! checked field by field. Also: the latency of an event at idle
//! (printed), and bad endpoints.

use radixkv::{DeviceId, RadixCache, Tier, TokenKey};
use radixkv_events::subscriber::{replay, KvEventSubscriber, Merged};
use radixkv_events::wire::block_ids;
use radixkv_events::{Encoding, EventsError, KvEventPublisher, KvEventsConfig};
use rmpv::Value;
use std::time::{Duration, Instant};

/// `n` consecutive free loopback ports (probed by binding them).
fn free_ports(n: u16) -> u16 {
    for _ in 0..200 {
        let p = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if p > 65_000 - n {
            continue;
        }
        if (0..n).all(|i| std::net::TcpListener::bind(("127.0.0.1", p + i)).is_ok()) {
            return p;
        }
    }
    panic!("no {n} consecutive free ports");
}

/// A publisher for `devices` devices (page size `ps`) on free loopback
/// ports, with a replay socket per device after the PUB sockets and no
/// startup hold (the first change is sent at once); `tweak` sets anything
/// else. Ports found free can be taken before the publisher binds them
/// (by a test running beside this one, or as an outgoing connection's
/// ephemeral port): a bind refused as in use tries other ports.
async fn publisher_with_replay(
    devices: u16,
    ps: usize,
    tweak: impl Fn(&mut KvEventsConfig),
) -> KvEventPublisher {
    let mut last = None;
    for _ in 0..20 {
        let port = free_ports(2 * devices);
        let mut cfg = KvEventsConfig::new(format!("tcp://127.0.0.1:{port}"));
        cfg.replay_endpoint = Some(format!("tcp://127.0.0.1:{}", port + devices));
        cfg.startup_hold = Duration::ZERO;
        tweak(&mut cfg);
        match KvEventPublisher::start(cfg, usize::from(devices), ps).await {
            Ok(p) => return p,
            Err(e @ EventsError::Bind { .. }) => last = Some(e),
            Err(e) => panic!("the publisher does not start: {e}"),
        }
    }
    panic!("no free ports bound in 20 tries; the last refusal: {last:?}");
}

/// A one-device cache at page size 2 that publishes through `p`.
fn cache_on(p: &KvEventPublisher) -> RadixCache {
    RadixCache::builder()
        .page_size(2)
        .listener(p.listener())
        .build()
        .unwrap()
}

fn decode(payload: &[u8]) -> (f64, Vec<Value>, Option<u64>) {
    let v = rmpv::decode::read_value(&mut &payload[..]).unwrap();
    let a = v.as_array().expect("a batch is an array").clone();
    assert_eq!(a.len(), 3, "[ts, events, rank]");
    (
        a[0].as_f64().expect("ts is a float"),
        a[1].as_array().expect("events is a list").clone(),
        a[2].as_u64(),
    )
}

fn field<'a>(e: &'a Value, name: &str) -> &'a Value {
    e.as_map()
        .expect("a map-encoded event")
        .iter()
        .find(|(k, _)| k.as_str() == Some(name))
        .map(|(_, v)| v)
        .unwrap_or_else(|| panic!("no field {name} in {e}"))
}

fn ids(v: &Value) -> Vec<u64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}

async fn wait_sent(p: &KvEventPublisher, events: u64) {
    let t = Instant::now();
    while p.stats().iter().map(|s| s.events).sum::<u64>() < events {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "events not sent: {:?}",
            p.stats()
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_reach_subscribers_and_replays_in_vllm_format() {
    let p = publisher_with_replay(2, 2, |_| {}).await;
    assert_eq!(p.endpoints().len(), 2);
    let cache = RadixCache::builder()
        .devices(2)
        .page_size(2)
        .host_pages(64)
        .listener(p.listener())
        .build()
        .unwrap();
    let mut live0 = KvEventSubscriber::connect(&p.endpoints()[0], "")
        .await
        .unwrap();

    // Wait for the subscription to be live: probe until a batch arrives.
    let probe = [90u32, 91];
    let mut probes = 0;
    loop {
        cache
            .insert(TokenKey::new(&probe), DeviceId(0), &[1, 2], 0)
            .unwrap();
        probes += 1;
        match tokio::time::timeout(Duration::from_millis(100), live0.recv()).await {
            Ok(b) => {
                b.unwrap();
                break;
            }
            Err(_) => {
                cache.evict(DeviceId(0), 2).unwrap();
                probes += 1;
                assert!(probes < 400, "the subscription never became live");
            }
        }
    }
    // A probe's batch may have come late, after its removal and the next
    // probe were queued: read up to a marker, so that the latency loop
    // below sees only its own inserts.
    let marker = [80u32, 81];
    cache
        .insert(TokenKey::new(&marker), DeviceId(0), &[1, 2], 0)
        .unwrap();
    probes += 1;
    loop {
        let b = tokio::time::timeout(Duration::from_secs(5), live0.recv())
            .await
            .expect("the marker within 5 s")
            .unwrap();
        let (_, evs, _) = decode(&b.payload);
        let is_marker = |e: &Value| {
            field(e, "type").as_str() == Some("BlockStored")
                && ids(field(e, "block_hashes")) == block_ids(None, &marker, 2)
        };
        if evs.iter().any(is_marker) {
            break;
        }
    }
    // Latency at idle: one insert, then the batch that reports it.
    let mut lat = Vec::new();
    for i in 0..20u32 {
        let t = Instant::now();
        cache
            .insert(TokenKey::new(&[100 + i, 0]), DeviceId(0), &[1, 2], 0)
            .unwrap();
        let b = tokio::time::timeout(Duration::from_secs(5), live0.recv())
            .await
            .expect("an event within 5 s")
            .unwrap();
        lat.push(t.elapsed());
        let (_, evs, rank) = decode(&b.payload);
        assert_eq!(rank, Some(0));
        assert_eq!(
            ids(field(&evs[0], "block_hashes")),
            block_ids(None, &[100 + i, 0], 2)
        );
    }
    lat.sort();
    println!(
        "KV-event latency at idle (insert -> SUB receives), 20 samples: p50 {:?}, max {:?}",
        lat[10], lat[19]
    );

    // A prefix, a child, a namespace, the host tier, an eviction.
    let a = [1u32, 2, 3, 4];
    cache.insert(TokenKey::new(&a), DeviceId(1), &a, 0).unwrap();
    cache
        .insert(
            TokenKey::new(&[1, 2, 3, 4, 5, 6]),
            DeviceId(1),
            &[1, 2, 3, 4, 5, 6],
            0,
        )
        .unwrap();
    cache
        .insert(
            TokenKey::new(&a).in_namespace(Some("t1")),
            DeviceId(1),
            &a,
            0,
        )
        .unwrap();
    cache
        .insert(TokenKey::new(&[7, 7]), Tier::Host, &[3, 3], 0)
        .unwrap();
    let ev = cache.evict(DeviceId(1), 2).unwrap();
    assert_eq!(ev.tokens, 2);
    let before = p.stats();
    // events so far: probes (stores/removals) + 20 + device 1's four + the
    // host's store on both sockets + the eviction.
    wait_sent(&p, probes as u64 + 20 + 3 + 2 + 1).await;
    p.flush().await;

    // Device 1's socket, read entirely through its replay (it had no
    // subscriber): the first batch is AllBlocksCleared, then in order.
    let batches = replay(&p.replay_endpoints()[1], 0).await.unwrap();
    let mut merged = Merged::default();
    for b in batches.clone() {
        merged.add(b);
    }
    let payloads = merged.contiguous().expect("no gap in the sequence numbers");
    let first_seq = batches[0].seq;
    let now_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64;
    assert!(
        first_seq > now_us - 600_000_000 && first_seq <= now_us,
        "seq starts at the wall clock"
    );
    let events: Vec<Value> = payloads.iter().flat_map(|p| decode(p).1).collect();
    let ty = |e: &Value| field(e, "type").as_str().unwrap().to_owned();
    assert_eq!(ty(&events[0]), "AllBlocksCleared");
    let stored: Vec<&Value> = events.iter().filter(|e| ty(e) == "BlockStored").collect();
    let removed: Vec<&Value> = events.iter().filter(|e| ty(e) == "BlockRemoved").collect();
    assert_eq!(stored.len(), 4, "{events:?}");
    // [1 2 3 4] on device 1: two blocks from the root.
    assert_eq!(
        ids(field(stored[0], "block_hashes")),
        block_ids(None, &a, 2)
    );
    assert!(field(stored[0], "parent_block_hash").is_nil());
    assert_eq!(field(stored[0], "block_size").as_u64(), Some(2));
    assert_eq!(field(stored[0], "medium").as_str(), Some("GPU"));
    let toks: Vec<u64> = field(stored[0], "token_ids")
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect();
    assert_eq!(toks, [1, 2, 3, 4]);
    // The child [5 6]: parent = the id of [1 2 3 4]'s last block.
    let chain = block_ids(None, &[1, 2, 3, 4, 5, 6], 2);
    assert_eq!(ids(field(stored[1], "block_hashes")), &chain[2..]);
    assert_eq!(
        field(stored[1], "parent_block_hash").as_u64(),
        Some(chain[1])
    );
    // The namespace: its own ids, and its salt.
    assert_eq!(field(stored[2], "cache_salt").as_str(), Some("t1"));
    assert_eq!(
        ids(field(stored[2], "block_hashes")),
        block_ids(Some("t1"), &a, 2)
    );
    assert_ne!(block_ids(Some("t1"), &a, 2), block_ids(None, &a, 2));
    // The host tier's page, medium CPU, on device 1's socket too.
    assert_eq!(field(stored[3], "medium").as_str(), Some("CPU"));
    // The eviction took one leaf's block: one that was stored before.
    assert_eq!(removed.len(), 1);
    let gone = ids(field(removed[0], "block_hashes"));
    assert!(stored
        .iter()
        .any(|s| ids(field(s, "block_hashes")).ends_with(&gone)));
    assert_eq!(field(removed[0], "medium").as_str(), Some("GPU"));

    // Device 0 saw the host page too.
    let b0 = replay(&p.replay_endpoints()[0], 0).await.unwrap();
    let cpu0 = b0
        .iter()
        .flat_map(|b| decode(&b.payload).1)
        .filter(|e| ty(e) == "BlockStored" && field(e, "medium").as_str() == Some("CPU"))
        .count();
    assert_eq!(cpu0, 1);
    // A replay from a later sequence number returns only the rest.
    let later = replay(&p.replay_endpoints()[1], first_seq + 2)
        .await
        .unwrap();
    assert_eq!(later.len(), batches.len() - 2);
    assert!(before.iter().all(|s| s.dropped_events == 0));
    p.shutdown().await;
}

/// For `startup_hold` after the start, changes wait in the queue while the
/// socket repeats `AllBlocksCleared` (a subscriber that reconnects after a
/// restart sees it before any store); then the first batch of changes
/// starts with it. A shutdown ends the hold at once, nothing lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_changes_wait_for_the_startup_hold_behind_repeated_clearings() {
    let hold = Duration::from_millis(450);
    let started = Instant::now();
    let p = publisher_with_replay(1, 2, |cfg| cfg.startup_hold = hold).await;
    let cache = cache_on(&p);
    cache
        .insert(TokenKey::new(&[1, 2]), DeviceId(0), &[1, 2], 0)
        .unwrap();
    // Until the hold ends, only clearings are sent.
    wait_sent(&p, 3).await;
    let during = replay(&p.replay_endpoints()[0], 0).await.unwrap();
    if started.elapsed() < hold {
        let kinds: Vec<_> = during
            .iter()
            .flat_map(|b| decode(&b.payload).1)
            .map(|e| field(&e, "type").as_str().unwrap().to_string())
            .collect();
        assert!(
            kinds.iter().all(|k| k == "AllBlocksCleared"),
            "a change sent during the hold: {kinds:?}"
        );
    }
    p.flush().await;
    assert!(
        started.elapsed() >= hold,
        "flush returned before the hold ended"
    );
    let batches = replay(&p.replay_endpoints()[0], 0).await.unwrap();
    let kinds: Vec<Vec<String>> = batches
        .iter()
        .map(|b| {
            decode(&b.payload)
                .1
                .iter()
                .map(|e| field(e, "type").as_str().unwrap().to_string())
                .collect()
        })
        .collect();
    let (last, repeated) = kinds.split_last().unwrap();
    assert_eq!(last, &["AllBlocksCleared", "BlockStored"], "{kinds:?}");
    assert!(
        repeated.len() >= 3 && repeated.iter().all(|k| k == &["AllBlocksCleared"]),
        "the clearing repeats every 100 ms of the hold: {kinds:?}"
    );
    p.shutdown().await;

    // A shutdown during the hold sends what waits.
    let p = publisher_with_replay(1, 2, |cfg| cfg.startup_hold = Duration::from_secs(3600)).await;
    let cache = cache_on(&p);
    cache
        .insert(TokenKey::new(&[3, 4]), DeviceId(0), &[3, 4], 0)
        .unwrap();
    let t = Instant::now();
    let s = p.shutdown().await;
    assert!(t.elapsed() < Duration::from_secs(60));
    assert_eq!(s[0].events, s[0].queued, "{s:?}");
    assert_eq!(s[0].dropped_events, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_array_encoding_carries_the_salt_in_extra_keys() {
    let p = publisher_with_replay(1, 2, |cfg| {
        cfg.encoding = Encoding::Array;
    })
    .await;
    let cache = cache_on(&p);
    cache
        .insert(
            TokenKey::new(&[1, 2, 3, 4]).in_namespace(Some("s")),
            DeviceId(0),
            &[1, 2, 3, 4],
            0,
        )
        .unwrap();
    wait_sent(&p, 2).await;
    let b = replay(&p.replay_endpoints()[0], 0).await.unwrap();
    let evs: Vec<Value> = b.iter().flat_map(|b| decode(&b.payload).1).collect();
    assert_eq!(
        evs[0].as_array().unwrap()[0].as_str(),
        Some("AllBlocksCleared")
    );
    // The clearing is repeated until the first change, which it leads.
    let s = evs
        .iter()
        .map(|e| e.as_array().unwrap())
        .find(|e| e[0].as_str() != Some("AllBlocksCleared"))
        .unwrap();
    assert_eq!(s.len(), 9);
    assert_eq!(s[0].as_str(), Some("BlockStored"));
    assert_eq!(s[4].as_u64(), Some(2));
    assert!(s[5].is_nil(), "lora_id");
    assert_eq!(s[6].as_str(), Some("GPU"));
    let extra = s[8].as_array().unwrap();
    assert_eq!(extra.len(), 2, "one entry per block");
    assert_eq!(
        extra[0].as_array().unwrap()[0].as_str(),
        Some("dynamo-cache-salt:s")
    );
    assert!(extra[1].is_nil());
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_endpoints_and_ports_in_use_are_clear_errors() {
    for bad in [
        "tcp://127.0.0.1",
        "udp://127.0.0.1:5557",
        "tcp://127.0.0.1:x",
    ] {
        let e = KvEventPublisher::start(KvEventsConfig::new(bad), 1, 16)
            .await
            .unwrap_err();
        assert!(matches!(e, EventsError::Endpoint { .. }), "{bad}: {e}");
    }
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let e = KvEventPublisher::start(
        KvEventsConfig::new(format!("tcp://127.0.0.1:{port}")),
        1,
        16,
    )
    .await
    .unwrap_err();
    assert!(matches!(e, EventsError::Bind { .. }), "{e}");
    assert!(e.to_string().contains(&port.to_string()), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removals_after_splits_name_the_blocks_that_left() {
    let p = publisher_with_replay(1, 2, |_| {}).await;
    let cache = RadixCache::builder()
        .page_size(2)
        .eviction_policy(radixkv::EvictionPolicy::Lru)
        .listener(p.listener())
        .build()
        .unwrap();
    let d = DeviceId(0);
    let long: Vec<u32> = (1..=12).collect();
    cache.insert(TokenKey::new(&long), d, &long, 0).unwrap();
    p.flush().await; // its ids are remembered once sent
                     // Two splits of the first leaf: at 4 tokens, then at 8.
    let a: Vec<u32> = [1, 2, 3, 4, 50, 51].to_vec();
    let b: Vec<u32> = [1, 2, 3, 4, 5, 6, 7, 8, 60, 61].to_vec();
    cache.insert(TokenKey::new(&a), d, &a, 0).unwrap();
    cache.insert(TokenKey::new(&b), d, &b, 0).unwrap();
    // Touch the new leaves, so that LRU takes the old suffix first, then
    // everything.
    cache.match_prefix(TokenKey::new(&a), d).unwrap();
    cache.match_prefix(TokenKey::new(&b), d).unwrap();
    cache.evict(d, 4).unwrap();
    cache.evict(d, 100).unwrap();
    p.flush().await;
    let batches = replay(&p.replay_endpoints()[0], 0).await.unwrap();
    let evs: Vec<Value> = batches.iter().flat_map(|b| decode(&b.payload).1).collect();
    let mut removed: Vec<u64> = Vec::new();
    let mut stored: Vec<u64> = Vec::new();
    for e in &evs {
        match field(e, "type").as_str().unwrap() {
            "BlockStored" => stored.extend(ids(field(e, "block_hashes"))),
            "BlockRemoved" => removed.extend(ids(field(e, "block_hashes"))),
            _ => {}
        }
    }
    // The first removal is the 12-token leaf's last 4 tokens (the suffix
    // left on the node after both splits).
    let first_removal = evs
        .iter()
        .find(|e| field(e, "type").as_str() == Some("BlockRemoved"))
        .unwrap();
    assert_eq!(
        ids(field(first_removal, "block_hashes")),
        &block_ids(None, &long, 2)[4..]
    );
    // In the end every stored block was removed exactly once.
    stored.sort_unstable();
    removed.sort_unstable();
    assert_eq!(stored, removed);
    let mut want: Vec<u64> = block_ids(None, &long, 2);
    want.extend(&block_ids(None, &a, 2)[2..]);
    want.extend(&block_ids(None, &b, 2)[4..]);
    want.sort_unstable();
    assert_eq!(removed, want);
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_replay_buffer_is_bounded_in_batches_and_in_bytes() {
    for (batches, bytes, kept) in [(2, usize::MAX, 2), (10_000, 1, 1)] {
        let p = publisher_with_replay(1, 2, |cfg| {
            cfg.replay_buffer = batches;
            cfg.replay_bytes = bytes;
        })
        .await;
        let cache = cache_on(&p);
        for i in 0..5u32 {
            cache
                .insert(TokenKey::new(&[i, i]), DeviceId(0), &[1, 2], 0)
                .unwrap();
            p.flush().await; // one batch each
        }
        let got = replay(&p.replay_endpoints()[0], 0).await.unwrap();
        assert_eq!(got.len(), kept, "bounds {batches} batches, {bytes} bytes");
        assert_eq!(
            got.last().unwrap().seq,
            p.stats()[0].last_seq,
            "the newest are kept"
        );
        p.shutdown().await;
    }
}

/// Several threads insert and evict at once on two devices and the host
/// tier, in two namespaces, with short keys over a small alphabet (many
/// splits, re-stores of evicted pages). Every socket's replayed events,
/// applied in order, must leave exactly the blocks the cache holds (its
/// devices' as GPU blocks, the host tier's as CPU blocks), with nothing
/// dropped: the publisher chains each store from its parent's ids and
/// names each removal's ids from what it remembers, so this checks that
/// what it remembers follows the tree through splits. Then the cache goes,
/// and the publisher forgets its nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_changes_replay_to_what_the_cache_holds() {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    use std::collections::HashSet;
    use std::sync::{Arc, Mutex};
    const PS: usize = 2;
    let p = publisher_with_replay(2, PS, |_| {}).await;
    let cache = Arc::new(
        RadixCache::builder()
            .page_size(PS)
            .devices(2)
            .host_pages(1 << 16)
            .listener(p.listener())
            .build()
            .unwrap(),
    );
    let tiers = [DeviceId(0).into(), DeviceId(1).into(), Tier::Host];
    type Keys = HashSet<(Option<&'static str>, Vec<u32>)>;
    let keys: Arc<Mutex<Keys>> = Arc::default();
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let (cache, keys) = (Arc::clone(&cache), Arc::clone(&keys));
            std::thread::spawn(move || {
                let mut rng = StdRng::seed_from_u64(t);
                for _ in 0..1_500 {
                    let tier = tiers[rng.random_range(0..tiers.len())];
                    if rng.random_bool(0.3) {
                        cache.evict(tier, PS * rng.random_range(1..6)).unwrap();
                        continue;
                    }
                    let len = PS * rng.random_range(1..6);
                    let key: Vec<u32> = (0..len).map(|_| rng.random_range(0..3)).collect();
                    let ns = [None, Some("tenant")][rng.random_range(0..2)];
                    cache
                        .insert(TokenKey::new(&key).in_namespace(ns), tier, &key, 0)
                        .unwrap();
                    keys.lock().unwrap().insert((ns, key));
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    p.flush().await;
    let stats = p.stats();
    assert!(stats.iter().all(|s| s.dropped_events == 0), "{stats:?}");
    // What the cache holds, as block ids: every resident page lies on some
    // inserted key's path, with its whole prefix resident on that tier.
    let keys = keys.lock().unwrap().clone();
    let held = |tier: Tier| -> HashSet<u64> {
        let mut out = HashSet::new();
        for (ns, key) in &keys {
            let t = cache.peek_tiers(TokenKey::new(key).in_namespace(*ns));
            let len = match tier {
                Tier::Host => t.host,
                Tier::Device(d) => t.devices[d.index()],
            };
            out.extend(block_ids(*ns, &key[..len], PS));
        }
        out
    };
    let host_blocks = held(Tier::Host);
    for (d, ep) in p.replay_endpoints().iter().enumerate() {
        let (gpu, cpu) = blocks_held(&replay(ep, 0).await.unwrap(), d);
        assert_eq!(
            gpu,
            held(DeviceId(d as u32).into()),
            "socket {d}: GPU blocks"
        );
        assert_eq!(cpu, host_blocks, "socket {d}: CPU blocks");
        assert!(!gpu.is_empty() && !cpu.is_empty());
    }
    // The cache goes (a reset): every socket says AllBlocksCleared, and
    // the publisher forgets every node it remembered.
    assert!(p.stats().iter().all(|s| s.remembered_nodes > 0));
    drop(cache);
    p.flush().await;
    assert!(
        p.stats().iter().all(|s| s.remembered_nodes == 0),
        "{:?}",
        p.stats()
    );
    for ep in p.replay_endpoints() {
        let last = replay(ep, 0).await.unwrap().pop().unwrap();
        let events = decode(&last.payload).1;
        assert_eq!(
            field(events.last().unwrap(), "type").as_str(),
            Some("AllBlocksCleared")
        );
    }
    p.shutdown().await;
}

/// The blocks that socket `d`'s events (replayed from the start) leave
/// held: (GPU, CPU). Checks that no block is stored twice or removed
/// unstored; `AllBlocksCleared` empties both.
fn blocks_held(
    batches: &[radixkv_events::subscriber::Batch],
    d: usize,
) -> (
    std::collections::HashSet<u64>,
    std::collections::HashSet<u64>,
) {
    let (mut gpu, mut cpu) = (
        std::collections::HashSet::new(),
        std::collections::HashSet::new(),
    );
    for b in batches {
        for e in decode(&b.payload).1 {
            if field(&e, "type").as_str() == Some("AllBlocksCleared") {
                gpu.clear();
                cpu.clear();
                continue;
            }
            let set = if field(&e, "medium").as_str() == Some("CPU") {
                &mut cpu
            } else {
                &mut gpu
            };
            match field(&e, "type").as_str().unwrap() {
                "BlockStored" => {
                    for id in ids(field(&e, "block_hashes")) {
                        assert!(set.insert(id), "socket {d}: block {id} stored twice");
                    }
                }
                "BlockRemoved" => {
                    for id in ids(field(&e, "block_hashes")) {
                        assert!(set.remove(&id), "socket {d}: block {id} removed unstored");
                    }
                }
                other => panic!("an event of type {other}"),
            }
        }
    }
    (gpu, cpu)
}

/// Private trees (one cache per device, each with a host tier, whose
/// pages every socket publishes): dropping one cache retracts exactly its
/// blocks, on both sockets, and leaves the other cache's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_cache_retracts_its_blocks_and_no_other() {
    let p = publisher_with_replay(2, 2, |_| {}).await;
    let caches: Vec<RadixCache> = (0..2)
        .map(|d| {
            RadixCache::builder()
                .page_size(2)
                .host_pages(64)
                .listener(p.listener_for_device(d))
                .build()
                .unwrap()
        })
        .collect();
    for (i, c) in caches.iter().enumerate() {
        let gpu: Vec<u32> = vec![i as u32 + 1; 8];
        let host: Vec<u32> = vec![i as u32 + 10; 6];
        c.insert(TokenKey::new(&gpu), DeviceId(0), &gpu, 0).unwrap();
        c.insert(TokenKey::new(&host), Tier::Host, &host, 0)
            .unwrap();
    }
    let mut caches = caches.into_iter();
    drop(caches.next()); // device 0's cache
    p.flush().await;
    let cache1_gpu: std::collections::HashSet<u64> =
        block_ids(None, &[2; 8], 2).into_iter().collect();
    let cache1_host: std::collections::HashSet<u64> =
        block_ids(None, &[11; 6], 2).into_iter().collect();
    let eps = p.replay_endpoints().to_vec();
    let (gpu0, cpu0) = blocks_held(&replay(&eps[0], 0).await.unwrap(), 0);
    let (gpu1, cpu1) = blocks_held(&replay(&eps[1], 0).await.unwrap(), 1);
    assert!(gpu0.is_empty(), "device 0's cache is gone: {gpu0:?}");
    assert_eq!(
        cpu0, cache1_host,
        "socket 0 keeps device 1's cache's host blocks"
    );
    assert_eq!(gpu1, cache1_gpu);
    assert_eq!(cpu1, cache1_host);
    drop(caches);
    p.shutdown().await;
}

/// A full queue drops events, counted; what depends on a dropped store (its
/// children's stores, its removal) cannot be chained and is dropped too,
/// counted; every batch still decodes. On a current-thread runtime the
/// socket's task cannot run until the test awaits, so every change below
/// is queued before the first is taken, however threads are scheduled.
#[tokio::test(flavor = "current_thread")]
async fn a_full_queue_drops_whole_events_and_counts_them() {
    let p = publisher_with_replay(1, 2, |cfg| {
        cfg.max_pending = 3;
    })
    .await;
    let cache = cache_on(&p);
    let d = DeviceId(0);
    // A chain: each key extends the previous one by a page, so each store
    // is the previous one's child.
    let mut key = Vec::new();
    for i in 0..20u32 {
        key.extend([i, i]);
        cache.insert(TokenKey::new(&key), d, &key, 0).unwrap();
    }
    cache.evict(d, 1_000).unwrap();
    p.flush().await;
    let s = p.stats()[0];
    assert_eq!(s.events + s.dropped_events, s.queued, "{s:?}");
    // Three stores queued; the other 17, and the removals of all 20
    // (queued behind them), dropped.
    assert_eq!(s.dropped_events, 17 + 20, "{s:?}");
    // AllBlocksCleared alone, then again leading the three stores.
    assert_eq!(s.events, 1 + 1 + 3, "{s:?}");
    let mut events = 0;
    for b in replay(&p.replay_endpoints()[0], 0).await.unwrap() {
        events += decode(&b.payload).1.len() as u64;
    }
    assert_eq!(events, s.events, "every sent event decodes, in its batch");
    p.shutdown().await;
}
