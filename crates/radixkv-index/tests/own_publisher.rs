//! radixkv's own publisher as a worker: a cache with two devices and a host
//! tier, changed by several threads at once (inserts and evictions, two
//! namespaces, many splits), publishes; every batch of both devices'
//! sockets (read back through their replay sockets) is decoded and applied
//! to an index, one source per device. Then every key's score per (device,
//! medium) equals what the cache itself holds of it: the device's resident
//! prefix as `GPU`, the host tier's as `CPU` on both sources.

use radixkv::{DeviceId, RadixCache, Tier, TokenKey};
use radixkv_events::subscriber::replay;
use radixkv_events::{KvEventPublisher, KvEventsConfig};
use radixkv_index::decode::{decode_batch, Medium};
use radixkv_index::{KvIndex, Source};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::HashSet;
use std::sync::{Arc, Mutex};

const PS: usize = 2;

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_index_holds_what_a_radixkv_worker_holds() {
    let port = free_ports(4);
    let mut cfg = KvEventsConfig::new(format!("tcp://127.0.0.1:{port}"));
    cfg.replay_endpoint = Some(format!("tcp://127.0.0.1:{}", port + 2));
    cfg.startup_hold = std::time::Duration::ZERO;
    let p = KvEventPublisher::start(cfg, 2, PS).await.unwrap();
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
                    let len = PS * rng.random_range(1..7);
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
    assert!(p.stats().iter().all(|s| s.dropped_events == 0));

    let ix = KvIndex::new(PS, 8).unwrap();
    let mut applied = 0;
    for (d, ep) in p.replay_endpoints().iter().enumerate() {
        let source = Source {
            worker: 7,
            rank: d as u32,
        };
        for b in replay(ep, 0).await.unwrap() {
            let batch = decode_batch(&b.payload).unwrap();
            assert!(batch.skipped.is_empty(), "{:?}", batch.skipped);
            assert_eq!(batch.rank, Some(d as u32));
            let (done, errors) = ix.apply(source, &batch.events);
            assert!(errors.is_empty(), "socket {d}, batch {}: {errors:?}", b.seq);
            applied += done.events;
        }
    }
    assert!(applied > 1_000, "{applied} events");
    ix.check().unwrap();
    let keys = keys.lock().unwrap().clone();
    let mut seen = [0usize; 3];
    for (ns, key) in &keys {
        let want = cache.peek_tiers(TokenKey::new(key).in_namespace(*ns));
        let scores = ix.scores(key, *ns);
        let got = |rank: u32, medium: Medium| {
            scores
                .iter()
                .find(|s| s.source == Source { worker: 7, rank } && s.medium == medium)
                .map_or(0, |s| s.tokens)
        };
        for (d, (&on_device, seen)) in want.devices.iter().zip(&mut seen).enumerate() {
            let rank = d as u32;
            assert_eq!(
                got(rank, Medium::Gpu),
                on_device,
                "{ns:?} {key:?}: device {d}"
            );
            assert_eq!(
                got(rank, Medium::Cpu),
                want.host,
                "{ns:?} {key:?}: host on socket {d}"
            );
            *seen += usize::from(on_device > 0);
        }
        seen[2] += usize::from(want.host > 0);
        assert_eq!(scores.len(), scores.iter().filter(|s| s.tokens > 0).count());
    }
    assert!(seen.iter().all(|&n| n > 10), "keys held per tier: {seen:?}");
    drop(cache);
    p.shutdown().await;
}
