//! Residency events under concurrency: several threads insert and evict on
//! two devices and the host tier at once, in two namespaces, while a
//! listener checks the order of every event as it enters (a page stored
//! only while absent, removed only while present, a child stored only
//! below a stored parent, per tier). At the end the pages the events say
//! are resident must be exactly what the cache holds.
//!
//! The checks hold for every interleaving, so the test does not depend on
//! how the threads happen to be scheduled.

use radixkv::events::{CacheListener, PageEvent};
use radixkv::{DeviceId, RadixCache, TokenKey};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::HashSet;
use std::sync::{Arc, Mutex};

/// A page as a router sees it: tier, namespace, and every token from the
/// root through the page's end.
type PageId = (u32, Option<String>, Vec<u32>);

#[derive(Default)]
struct Mirror {
    held: Mutex<HashSet<PageId>>,
    events: Mutex<u64>,
}

impl Mirror {
    fn pages<'a>(e: &'a PageEvent<'a>, ps: usize) -> impl Iterator<Item = PageId> + 'a {
        let ns = e.namespace.map(str::to_owned);
        (e.start / ps..e.path.len() / ps)
            .map(move |p| (e.device.0, ns.clone(), e.path[..(p + 1) * ps].to_vec()))
    }
}

const PS: usize = 2;

impl CacheListener for Mirror {
    fn stored(&self, e: &PageEvent<'_>) {
        assert_eq!(e.start % PS, 0, "a store must start on a page boundary");
        assert_eq!(e.path.len() % PS, 0, "a store must end on a page boundary");
        assert!(e.start < e.path.len(), "a store of no page");
        let mut held = self.held.lock().unwrap();
        let ns = e.namespace.map(str::to_owned);
        if e.start > 0 {
            assert!(
                held.contains(&(e.device.0, ns, e.prefix().to_vec())),
                "tier {}: a child's store came before its parent's ({:?})",
                e.device.0,
                e.path
            );
        }
        for p in Self::pages(e, PS) {
            assert!(held.insert(p), "a page was stored twice without a removal");
        }
        *self.events.lock().unwrap() += 1;
    }

    fn removed(&self, e: &PageEvent<'_>) {
        let mut held = self.held.lock().unwrap();
        for p in Self::pages(e, PS) {
            assert!(held.remove(&p), "a removal came before its store: {p:?}");
        }
        // Only leaves are evicted: nothing below the removed pages is held.
        let (dev, ns) = (e.device.0, e.namespace.map(str::to_owned));
        assert!(
            !held
                .iter()
                .any(|(d, n, path)| *d == dev && *n == ns && path.starts_with(e.path)),
            "a parent's removal came before its child's"
        );
        *self.events.lock().unwrap() += 1;
    }
}

fn ops() -> usize {
    std::env::var("RADIXKV_STRESS_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(4_000, |n: usize| n / 6)
}

#[test]
fn events_follow_the_tree_under_concurrent_inserts_and_evictions() {
    let mirror = Arc::new(Mirror::default());
    let cache = Arc::new(
        RadixCache::builder()
            .page_size(PS)
            .devices(2)
            .host_pages(1 << 16)
            .listener(mirror.clone())
            .build()
            .unwrap(),
    );
    let host = cache.host().unwrap();
    let tiers = [DeviceId(0), DeviceId(1), host];
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let cache = Arc::clone(&cache);
            std::thread::spawn(move || {
                let mut rng = StdRng::seed_from_u64(t);
                for _ in 0..ops() {
                    let tier = tiers[rng.random_range(0..tiers.len())];
                    if rng.random_bool(0.3) {
                        let _ = cache.evict(tier, PS * rng.random_range(1..6)).unwrap();
                        continue;
                    }
                    // Short alphabets and keys: many shared prefixes, splits
                    // and re-stores of evicted pages.
                    let len = PS * rng.random_range(1..6);
                    let key: Vec<u32> = (0..len).map(|_| rng.random_range(0..3)).collect();
                    let ns = [None, Some("tenant")][rng.random_range(0..2)];
                    cache
                        .insert(TokenKey::new(&key).in_namespace(ns), tier, &key, 0)
                        .unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    cache.audit();
    // Quiescent: the mirror must be the cache, page for page.
    let held = mirror.held.lock().unwrap();
    for (d, ns, path) in held.iter() {
        let t = cache.peek_tiers(TokenKey::new(path).in_namespace(ns.as_deref()));
        let len = if DeviceId(*d) == host {
            t.host
        } else {
            t.devices[*d as usize]
        };
        assert!(
            len >= path.len(),
            "the events say {path:?} is on tier {d}; the cache has {len}"
        );
    }
    for tier in tiers {
        let pages = held.iter().filter(|(d, _, _)| *d == tier.0).count();
        assert_eq!(
            pages * PS,
            cache.resident_tokens(tier).unwrap(),
            "tier {}: the events' pages against the cache's",
            tier.0
        );
    }
    assert!(*mirror.events.lock().unwrap() > 0);
}

#[test]
fn a_split_and_a_match_report_nothing() {
    let mirror = Arc::new(Mirror::default());
    let cache = RadixCache::builder()
        .page_size(PS)
        .listener(mirror.clone())
        .build()
        .unwrap();
    let d = DeviceId(0);
    cache
        .insert(TokenKey::new(&[1, 1, 2, 2]), d, &[1, 2, 3, 4], 0)
        .unwrap();
    assert_eq!(*mirror.events.lock().unwrap(), 1);
    // The match splits [1 1 | 2 2]: no page changes, so no event.
    let m = cache.match_prefix(TokenKey::new(&[1, 1, 3, 3]), d).unwrap();
    assert_eq!(m.len, 2);
    assert_eq!(*mirror.events.lock().unwrap(), 1);
    // A duplicate insert stores nothing.
    cache
        .insert(TokenKey::new(&[1, 1, 2, 2]), d, &[9, 9, 9, 9], 0)
        .unwrap();
    assert_eq!(*mirror.events.lock().unwrap(), 1);
    assert_eq!(mirror.held.lock().unwrap().len(), 2);
}
