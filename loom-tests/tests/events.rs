//! Loom models of residency events: the order a listener sees stores,
//! splits and removals in, against concurrent evictions.
//!
//! Each model names the protecting step it relies on; `negative.sh`
//! builds each without it and requires the model to fail with its own
//! message.
#![cfg(loom)]

use loom::thread;
use loom_tests::{key, model, D0};
use radixkv::RadixCache;
use std::sync::Arc;

/// A listener that checks the order of residency events as they come: a
/// page is stored only while absent and removed only while present, and a
/// child only below a stored parent.
#[derive(Default)]
struct EventOrder(std::sync::Mutex<std::collections::HashSet<Vec<u32>>>);

impl radixkv::events::CacheListener for EventOrder {
    fn stored(&self, e: &radixkv::events::PageEvent<'_>) {
        let loc = e.location().expect("a location");
        let (path, prefix) = (loc.path.to_vec(), loc.prefix(e.pages().len()));
        let mut held = self.0.lock().unwrap();
        assert!(
            prefix.is_empty() || held.contains(prefix),
            "a child's store came before its parent's"
        );
        assert!(
            held.insert(path.clone()),
            "a page was stored twice without a removal between"
        );
    }
    fn removed(&self, e: &radixkv::events::PageEvent<'_>) {
        let path = e.location().expect("a location").path.to_vec();
        assert!(
            self.0.lock().unwrap().remove(&path),
            "a removal came before its store"
        );
    }
}

/// A one-device cache that tells `listener` of its changes, under Mru: its
/// evictor finds leaves by a scan of the tree, so it can meet a leaf as
/// soon as it is published (the event models race exactly that).
fn mru_cache_telling(
    listener: Arc<impl radixkv::events::CacheListener + 'static>,
) -> Arc<RadixCache> {
    Arc::new(
        RadixCache::builder()
            .listener(listener)
            .eviction_policy(radixkv::EvictionPolicy::Mru)
            .build()
            .unwrap(),
    )
}

/// a store racing the removal of the same page: an insert
/// attaches a leaf while an evictor takes it. Protecting step: the store is
/// reported inside the attach's locked section, before the leaf is
/// published, so the eviction (which needs the parent's lock and must see
/// the leaf) reports after it. Control: `event_in_lock` (the store is
/// reported once the attach is done, after the lock). Mru: its evictor finds leaves by
/// a scan of the tree, so it can meet the leaf as soon as it is published.
#[test]
fn store_event_vs_evict() {
    model(|| {
        let log = Arc::new(EventOrder::default());
        let c = mru_cache_telling(log.clone());
        let c1 = Arc::clone(&c);
        let t = thread::spawn(move || {
            c1.insert(key(&[1]), D0, &[10], 0).unwrap();
        });
        c.evict(D0, 1).unwrap();
        t.join().unwrap();
        let held = log.0.lock().unwrap().contains(&vec![1]);
        assert_eq!(
            held,
            c.peek(key(&[1])) == vec![1],
            "the events must end where the cache is"
        );
    });
}

/// A listener that follows every node by its id, as the KV-event
/// publisher does: a store below a known parent adds the node with its
/// tokens, a split divides a known node, a removal takes exactly a known
/// node's tokens.
#[derive(Default)]
struct NodeFollower(std::sync::Mutex<std::collections::HashMap<u64, usize>>);

impl radixkv::events::CacheListener for NodeFollower {
    fn stored(&self, e: &radixkv::events::PageEvent<'_>) {
        let mut nodes = self.0.lock().unwrap();
        assert!(
            e.at_root || nodes.contains_key(&e.parent),
            "a store below a node not known"
        );
        nodes.insert(e.node, e.pages().len());
    }
    fn removed(&self, e: &radixkv::events::PageEvent<'_>) {
        let had = self.0.lock().unwrap().remove(&e.node);
        assert_eq!(
            had,
            Some(e.pages().len()),
            "a removal's pages differ from what the node's store and splits left"
        );
    }
    fn split(&self, e: &radixkv::events::SplitEvent) {
        let mut nodes = self.0.lock().unwrap();
        let n = nodes.get_mut(&e.node).expect("a split of a node not known");
        *n -= e.moved;
        nodes.insert(e.prefix, e.moved);
    }
}

/// a split racing the eviction of the node it splits: an insert
/// of [1 3] splits the leaf [1 2] (into [1] and [2]) while an evictor takes
/// a leaf. Protecting step: the split is reported under the split's locks,
/// before the prefix node is published, so an eviction of the shortened
/// node (which needs its lock and its new parent's) reports after it.
/// Control: `split_event_in_lock` (the split is reported after the locks).
/// Mru: its evictor finds leaves by a scan of the tree.
#[test]
fn split_event_vs_evict() {
    model(|| {
        let log = Arc::new(NodeFollower::default());
        let c = mru_cache_telling(log.clone());
        c.insert(key(&[1, 2]), D0, &[10, 11], 0).unwrap();
        let c1 = Arc::clone(&c);
        let t = thread::spawn(move || {
            c1.insert(key(&[1, 3]), D0, &[10, 12], 0).unwrap();
        });
        c.evict(D0, 1).unwrap();
        t.join().unwrap();
        let tokens: usize = log.0.lock().unwrap().values().sum();
        assert_eq!(
            tokens,
            c.resident_tokens(D0).unwrap(),
            "the events must end where the cache is"
        );
    });
}
