//! The cache owning its pages: concurrent schedulers allocate spans, match
//! and pin, insert their spans and drop leftovers while eviction returns
//! pages; afterwards I2 holds on every device (free + tree + requests =
//! pool - 1, no page owned twice, no double free).

use radixkv::{CacheError, DeviceId, RadixCache, TokenKey};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;

#[test]
fn concurrent_paged_requests_conserve_pages() {
    let (devices, ps, pages) = (3usize, 4usize, 512usize);
    let cache = Arc::new(
        RadixCache::builder()
            .devices(devices)
            .page_size(ps)
            .pages_per_device(pages)
            .build()
            .unwrap(),
    );
    let mut rng = StdRng::seed_from_u64(5);
    let prompts: Arc<Vec<Vec<u32>>> = Arc::new(
        (0..8)
            .map(|_| {
                (0..rng.random_range(8..64))
                    .map(|_| rng.random_range(1..50))
                    .collect()
            })
            .collect(),
    );
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let (cache, prompts) = (Arc::clone(&cache), Arc::clone(&prompts));
            s.spawn(move || {
                let mut rng = StdRng::seed_from_u64(100 + t);
                for _ in 0..3000 {
                    let d = DeviceId(rng.random_range(0..devices as u32));
                    let base = &prompts[rng.random_range(0..prompts.len())];
                    let mut key = base.clone();
                    key.extend((0..rng.random_range(1..24)).map(|_| rng.random_range(100..110)));
                    key.truncate(key.len() / ps * ps);
                    if key.is_empty() {
                        continue;
                    }
                    let m = cache.match_and_pin(TokenKey::new(&key), d).unwrap();
                    assert_eq!(m.values.len(), m.len);
                    assert!(m
                        .values
                        .iter()
                        .all(|&v| v as usize / ps < pages && v as usize >= ps));
                    // A span for the whole key (the prefix pages become
                    // duplicates the cache returns); on shortage, evict.
                    let span = match cache.alloc(d, key.len()) {
                        Ok(s) => s,
                        Err(CacheError::Alloc(_)) => {
                            cache.evict(d, key.len()).unwrap();
                            match cache.alloc(d, key.len()) {
                                Ok(s) => s,
                                Err(_) => continue,
                            }
                        }
                        Err(e) => panic!("{e}"),
                    };
                    if rng.random_bool(0.1) {
                        drop(span); // an aborted request
                    } else {
                        cache.insert_pages(TokenKey::new(&key), span, 0).unwrap();
                    }
                    drop(m.lease);
                    if rng.random_bool(0.05) {
                        cache.evict(d, rng.random_range(1..64)).unwrap();
                    }
                }
            });
        }
    });
    cache.audit();
    for d in 0..devices as u32 {
        let a = cache.allocator(DeviceId(d)).unwrap();
        assert_eq!(a.double_frees(), 0);
        assert_eq!(
            a.pages_in_spans(),
            0,
            "every request span was consumed or dropped"
        );
        let ev = cache.evict(DeviceId(d), usize::MAX).unwrap();
        assert!(ev.values.is_empty(), "the cache returned the pages itself");
        assert_eq!(a.free_pages(), pages - 1, "device {d}: every page is back");
    }
    cache.audit();
}

#[test]
fn page_mode_rejects_foreign_spans_and_bad_lengths() {
    // Plain values into a cache that owns its pages, or pages from one
    // that does not, do not compile (the `cache::ownership` docs' examples).
    let c = RadixCache::builder()
        .devices(2)
        .pages_per_device(16)
        .build()
        .unwrap();
    let other = RadixCache::builder()
        .devices(2)
        .pages_per_device(16)
        .build()
        .unwrap();
    let span = other.alloc(DeviceId(0), 2).unwrap();
    assert_eq!(
        c.insert_pages(TokenKey::new(&[1, 2]), span, 0).unwrap_err(),
        CacheError::ForeignSpan
    );
    assert_eq!(
        other.allocator(DeviceId(0)).unwrap().free_pages(),
        15,
        "the span's pages went back"
    );
    let span = c.alloc(DeviceId(1), 3).unwrap();
    assert!(matches!(
        c.insert_pages(TokenKey::new(&[1, 2]), span, 0),
        Err(CacheError::LengthMismatch {
            tokens: 2,
            values: 3
        })
    ));
    assert_eq!(c.allocator(DeviceId(1)).unwrap().free_pages(), 15);
    assert!(matches!(
        RadixCache::builder().pages_per_device(1).build(),
        Err(CacheError::Alloc(_))
    ));
    c.audit();
}

#[test]
fn allocation_evicts_exactly_the_shortfall_then_retries_once() {
    let c = RadixCache::builder()
        .page_size(2)
        .pages_per_device(9)
        .build()
        .unwrap(); // 8 usable
    let d = DeviceId(0);
    for k in 0..4u32 {
        let span = c.alloc(d, 4).unwrap(); // 2 pages each
        c.insert_pages(TokenKey::new(&[k, 1, 2, 3]), span, 0)
            .unwrap();
    }
    let a = c.allocator(d).unwrap();
    assert_eq!(a.free_pages(), 0);
    // 3 pages wanted, none free: the two least recently used leaves go.
    let span = c.alloc(d, 6).unwrap();
    assert_eq!(span.len(), 3);
    assert_eq!(
        c.sizes(d).unwrap().total,
        8,
        "two of the four 4-token entries were evicted"
    );
    assert_eq!(
        a.free_pages(),
        1,
        "whole leaves: one page more than the shortfall"
    );
    drop(span);
    // Everything pinned: the error says how many pages are missing.
    let leases: Vec<_> = (0..4u32)
        .map(|k| c.match_and_pin(TokenKey::new(&[k, 1, 2, 3]), d).unwrap())
        .collect();
    let err = c.alloc(d, 2 * 8).unwrap_err();
    assert!(
        matches!(
            err,
            CacheError::Alloc(radixkv::alloc::AllocError::OutOfPages { missing: 4, .. })
        ),
        "{err}"
    );
    drop(leases);
    c.audit();
}

/// Issue 6: with candidate heaps, the work of evicting a fixed number of
/// tokens does not grow with the tree.
#[test]
fn eviction_work_does_not_grow_with_the_tree() {
    let work = |leaves: u32| {
        let c = RadixCache::builder().build().unwrap(); // lru: candidate heaps
        for k in 0..leaves {
            let key = [k / 100, k, 7, 7];
            c.insert(TokenKey::new(&key), DeviceId(0), &[1, 2, 3, 4], 0)
                .unwrap();
        }
        c.evict(DeviceId(0), 1).unwrap(); // takes in the leaves inserted so far
        let ev = c.evict(DeviceId(0), 30).unwrap();
        assert!(ev.tokens >= 30);
        ev.examined
    };
    let (small, large) = (work(1_000), work(50_000));
    assert!(
        large <= small + 4,
        "examined {small} candidates on 1,000 leaves, {large} on 50,000"
    );
    // The scan policies, by contrast, look at every leaf.
    let c = RadixCache::builder()
        .eviction_policy(radixkv::EvictionPolicy::Mru)
        .build()
        .unwrap();
    for k in 0..1_000u32 {
        c.insert(TokenKey::new(&[k, 1]), DeviceId(0), &[1, 2], 0)
            .unwrap();
    }
    assert_eq!(c.evict(DeviceId(0), 1).unwrap().examined, 1_000);
}
