//! Residency events under concurrency: several threads insert and evict on
//! two devices and the host tier at once, in two namespaces, while a
//! listener checks the order of every event as it enters (a page stored
//! only while absent, removed only while present, a child stored only
//! below a stored parent, per tier) and follows every node by its id, as a
//! publisher that remembers per-node block ids does (a store's parent is
//! known, a split divides a known node, a removal takes exactly a known
//! node's pages). At the end the pages the events say are resident must
//! be exactly what the cache holds, and so must the nodes' pages.
//!
//! The checks hold for every interleaving, so the test does not depend on
//! how the threads happen to be scheduled.

use radixkv::events::{CacheListener, PageEvent, SplitEvent};
use radixkv::{DeviceId, RadixCache, Tier, TokenKey};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

/// A page as a router sees it: tier, namespace, and every token from the
/// root through the page's end.
type PageId = (Tier, Option<String>, Vec<u32>);

#[derive(Default)]
struct Mirror {
    held: Mutex<HashSet<PageId>>,
    /// (tier, node id) → the node's tokens, from stores, splits and removals.
    nodes: Mutex<HashMap<(Tier, u64), usize>>,
    events: Mutex<u64>,
    splits: Mutex<u64>,
    cleared: Mutex<u32>,
}

impl Mirror {
    /// The event's pages as router page ids, with their parent's path.
    fn pages(e: &PageEvent<'_>, ps: usize) -> (Vec<PageId>, Vec<u32>) {
        let loc = e.location().expect("a location under the cache's locks");
        let prefix = loc.prefix(e.pages().len()).to_vec();
        let path = loc.path.to_vec();
        let start = prefix.len();
        assert_eq!(
            &path[start..],
            e.pages(),
            "the location ends with the pages"
        );
        assert_eq!(e.at_root, start == 0, "at_root is a path from the root");
        assert_eq!(start % ps, 0, "pages start on a page boundary");
        assert_eq!(path.len() % ps, 0, "pages end on a page boundary");
        assert!(!e.pages().is_empty(), "an event of no page");
        let ns = loc.namespace.map(|n| n.into_owned());
        let ids = (start / ps..path.len() / ps)
            .map(|p| (e.tier, ns.clone(), path[..(p + 1) * ps].to_vec()))
            .collect();
        (ids, prefix)
    }
}

const PS: usize = 2;

impl CacheListener for Mirror {
    fn stored(&self, e: &PageEvent<'_>) {
        let (pages, prefix) = Self::pages(e, PS);
        let mut held = self.held.lock().unwrap();
        if !prefix.is_empty() {
            let parent = (pages[0].0, pages[0].1.clone(), prefix);
            assert!(
                held.contains(&parent),
                "{}: a child's store came before its parent's ({:?})",
                e.tier,
                pages[0].2
            );
        }
        for p in pages {
            assert!(held.insert(p), "a page was stored twice without a removal");
        }
        let mut nodes = self.nodes.lock().unwrap();
        let tier = e.tier;
        assert!(
            e.at_root || nodes.contains_key(&(tier, e.parent)),
            "{tier}: node {}'s parent {} is not a known node",
            e.node,
            e.parent
        );
        assert!(
            nodes.insert((tier, e.node), e.pages().len()).is_none(),
            "{tier}: node {} stored twice",
            e.node
        );
        *self.events.lock().unwrap() += 1;
    }

    fn removed(&self, e: &PageEvent<'_>) {
        let (pages, _) = Self::pages(e, PS);
        let mut held = self.held.lock().unwrap();
        let last = pages.last().cloned().expect("pages");
        for p in pages {
            assert!(held.remove(&p), "a removal came before its store: {p:?}");
        }
        // Only leaves are evicted: nothing below the removed pages is held.
        let (dev, ns, path) = last;
        assert!(
            !held
                .iter()
                .any(|(d, n, q)| *d == dev && *n == ns && q.starts_with(&path)),
            "a parent's removal came before its child's"
        );
        let had = self.nodes.lock().unwrap().remove(&(dev, e.node));
        assert_eq!(
            had,
            Some(e.pages().len()),
            "{dev}: node {}'s removal against what its store and splits left",
            e.node
        );
        *self.events.lock().unwrap() += 1;
    }

    fn cleared(&self) {
        *self.cleared.lock().unwrap() += 1;
    }

    fn split(&self, e: &SplitEvent) {
        let mut nodes = self.nodes.lock().unwrap();
        let tier = e.tier;
        let Some(n) = nodes.get_mut(&(tier, e.node)) else {
            panic!("{tier}: a split of node {} never stored", e.node);
        };
        assert!(
            e.moved > 0 && e.moved < *n && e.moved.is_multiple_of(PS),
            "a split of {} tokens at {}",
            *n,
            e.moved
        );
        *n -= e.moved;
        assert!(
            nodes.insert((tier, e.prefix), e.moved).is_none(),
            "a split's prefix node {} already known",
            e.prefix
        );
        *self.splits.lock().unwrap() += 1;
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
    let tiers = [DeviceId(0).into(), DeviceId(1).into(), Tier::Host];
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
        let len = match d {
            Tier::Host => t.host,
            Tier::Device(d) => t.devices[d.index()],
        };
        assert!(
            len >= path.len(),
            "the events say {path:?} is on tier {d}; the cache has {len}"
        );
    }
    for tier in tiers {
        let pages = held.iter().filter(|(d, _, _)| *d == tier).count();
        assert_eq!(
            pages * PS,
            cache.resident_tokens(tier).unwrap(),
            "{}: the events' pages against the cache's",
            tier
        );
        let nodes = mirror.nodes.lock().unwrap();
        let tokens: usize = nodes
            .iter()
            .filter(|((d, _), _)| *d == tier)
            .map(|(_, n)| n)
            .sum();
        assert_eq!(
            tokens,
            cache.resident_tokens(tier).unwrap(),
            "{}: the nodes' pages against the cache's",
            tier
        );
    }
    assert!(*mirror.events.lock().unwrap() > 0);
    // Short keys over a 3-token alphabet split often: the split reports
    // were exercised, not assumed.
    assert!(*mirror.splits.lock().unwrap() > 0);
}

#[test]
fn a_split_changes_no_page_and_names_its_nodes_and_a_drop_clears() {
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
    // The match splits [1 1 | 2 2]: no page changes, so no store or
    // removal; the split says the old node keeps [2 2].
    let m = cache.match_prefix(TokenKey::new(&[1, 1, 3, 3]), d).unwrap();
    assert_eq!(m.len, 2);
    assert_eq!(*mirror.events.lock().unwrap(), 1);
    assert_eq!(*mirror.splits.lock().unwrap(), 1);
    let nodes = mirror.nodes.lock().unwrap().clone();
    let mut sizes: Vec<usize> = nodes.values().copied().collect();
    sizes.sort_unstable();
    assert_eq!(sizes, [2, 2]);
    // A duplicate insert stores nothing.
    cache
        .insert(TokenKey::new(&[1, 1, 2, 2]), d, &[9, 9, 9, 9], 0)
        .unwrap();
    assert_eq!(*mirror.events.lock().unwrap(), 1);
    assert_eq!(mirror.held.lock().unwrap().len(), 2);
    // Dropping the cache clears it, once, after every other call.
    assert_eq!(*mirror.cleared.lock().unwrap(), 0);
    drop(cache);
    assert_eq!(*mirror.cleared.lock().unwrap(), 1);
}
