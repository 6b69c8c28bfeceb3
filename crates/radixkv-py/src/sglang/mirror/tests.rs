//! The shape's counters, locks and namespaces, checked directly.

use super::*;
use radixkv::{DeviceId, RadixCache, TokenKey};

fn empty(page_size: usize) -> Shape {
    Mirror::new(page_size, false)
        .0
        .into_inner()
        .unwrap_or_else(|p| p.into_inner())
}

fn split(node: u64, prefix: u64, moved: usize) -> SplitEvent {
    SplitEvent {
        tier: DeviceId(0).into(),
        node,
        prefix,
        moved,
    }
}

#[test]
fn a_locked_node_evicted_breaks_the_mirror_and_wraps_no_counter() {
    let mut s = empty(1);
    s.store(1, ROOT, &[1, 2, 3], || None);
    // Counted as a lock counts it, without the core pin behind it.
    s.nodes.get_mut(&1).unwrap().lock_ref = 1;
    (s.evictable, s.protected) = (0, 3);
    s.removed(1);
    let why = s.usable().unwrap_err();
    assert!(why.contains("node 1 evicted with 1 locks"), "{why}");
    assert_eq!(
        (s.evictable, s.protected),
        (0, 0),
        "taken from the size it was counted in"
    );
    // Every later change is ignored, and the first cause stays.
    s.store(2, ROOT, &[4], || None);
    s.removed(7);
    assert_eq!(s.usable().unwrap_err(), why);
    assert_eq!(s.lockable(1), Err(LockRefused::Broken(why.clone())));
    assert_eq!(s.unlock(1).map(|(d, _)| d), Err(LockRefused::Broken(why)));
}

#[test]
fn a_split_past_the_node_breaks_the_mirror_and_wraps_no_length() {
    let mut s = empty(2);
    s.store(1, ROOT, &[1, 2, 3, 4], || None);
    s.split(&split(1, 2, 6));
    let why = s.usable().unwrap_err();
    assert!(
        why.contains("split of node 1 (4 tokens) after 6 tokens"),
        "{why}"
    );
    assert_eq!(s.nodes[&1].len, 4);
    assert_eq!(s.evictable, 4);

    let mut s = empty(2);
    s.store(1, ROOT, &[1, 2, 3, 4], || None);
    s.split(&split(1, 2, 1));
    assert!(
        s.usable().unwrap_err().contains("after 1 tokens"),
        "not a page"
    );
    let mut s = empty(2);
    s.split(&split(9, 2, 2));
    assert!(s.usable().unwrap_err().contains("split of unknown node 9"));
}

#[test]
fn a_store_below_an_unknown_parent_or_twice_breaks_the_mirror() {
    let mut s = empty(1);
    s.store(1, 5, &[1], || None);
    assert!(s.usable().unwrap_err().contains("below unknown node 5"));
    let mut s = empty(1);
    s.store(1, ROOT, &[1], || None);
    s.store(1, ROOT, &[1], || None);
    assert!(s.usable().unwrap_err().contains("stored twice"));
    assert_eq!(s.evictable, 1);
}

#[test]
fn a_removal_past_the_evictable_size_breaks_the_mirror() {
    let mut s = empty(1);
    s.store(1, ROOT, &[1, 2], || None);
    s.evictable = 1;
    s.removed(1);
    assert!(s.usable().unwrap_err().contains("only 1 evictable"));
    assert_eq!(s.evictable, 1);
}

#[test]
fn a_lock_its_pin_and_the_sizes_move_together() {
    let mirror = Arc::new(Mirror::new(1, false));
    let cache = RadixCache::builder()
        .devices(1)
        .listener(Arc::clone(&mirror) as Arc<dyn CacheListener>)
        .build()
        .unwrap();
    let dev = DeviceId(0);
    cache
        .insert(TokenKey::new(&[1, 2, 3]), dev, &[7, 8, 9], 0)
        .unwrap();
    cache
        .insert(TokenKey::new(&[1, 2, 4]), dev, &[7, 8, 5], 0)
        .unwrap();
    let m = cache.match_prefix(TokenKey::new(&[1, 2, 3]), dev).unwrap();
    let id = m.handle.id().unwrap();
    let mut s = mirror.shape();
    assert_eq!((s.evictable, s.protected), (4, 0));
    assert_eq!(s.lock(id, cache.pin(&m.handle).unwrap()), Ok(-3));
    assert_eq!(s.lock(id, cache.pin(&m.handle).unwrap()), Ok(0));
    assert_eq!((s.evictable, s.protected), (1, 3));
    assert_eq!(s.check(4), None);
    assert_eq!(s.leases[&id].len(), 2);
    drop(s);
    // Pinned: the core keeps the path; only the other leaf goes.
    assert_eq!(cache.evict(dev, 10).unwrap().tokens, 1);
    let mut s = mirror.shape();
    let (delta, lease) = s.unlock(id).unwrap();
    assert_eq!((delta, lease.is_some()), (0, true));
    drop(lease);
    let (delta, lease) = s.unlock(id).unwrap();
    assert_eq!((delta, lease.is_some()), (3, true));
    drop(lease);
    assert_eq!(s.unlock(id).map(|(d, _)| d), Err(LockRefused::NotLocked));
    assert_eq!(s.check(3), None);
    drop(s);
    assert_eq!(cache.evict(dev, 10).unwrap().tokens, 3);
    let s = mirror.shape();
    assert_eq!(s.usable(), Ok(()));
    assert_eq!((s.evictable, s.protected, s.node_count()), (0, 0, 0));
    assert_eq!(s.lockable(id), Err(LockRefused::Gone));
}

#[test]
fn a_lock_with_no_pin_behind_it_fails_the_check() {
    let mut s = empty(1);
    s.store(1, ROOT, &[1], || None);
    s.nodes.get_mut(&1).unwrap().lock_ref = 1;
    (s.evictable, s.protected) = (0, 1);
    let why = s.check(1).unwrap();
    assert!(why.contains("1 locks of its own, 0 pins"), "{why}");
}

#[test]
fn namespaces_encode_injectively_and_decode_back() {
    let pairs = [
        (None, None),
        (Some(""), None),
        (None, Some("")),
        (Some("a"), Some("bc")),
        (Some("ab"), Some("c")),
        (Some("+1:x"), None),
        (Some("é-"), Some("-")),
    ];
    let mut seen = std::collections::HashSet::new();
    for (e, s) in pairs {
        let ns = Namespace::encode(e, s);
        assert!(seen.insert(ns.clone()), "{e:?} {s:?} collides");
        let back = Namespace::decode(ns.as_deref()).unwrap();
        assert_eq!(
            (back.extra_key.as_deref(), back.cache_salt.as_deref()),
            (e, s)
        );
    }
    assert_eq!(Namespace::decode(Some("lora:x")), None);
    assert_eq!(Namespace::decode(Some("+5:ab")), None);
}
