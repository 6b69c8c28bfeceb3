//! The background evictor: woken by the low watermark, it restores the high
//! watermark; it stops cleanly when dropped mid-eviction or when the cache
//! goes away; misconfiguration is a typed error.

use radixkv::{CacheError, DeviceId, PagedCache, RadixCache, TokenKey};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn cache() -> Arc<PagedCache> {
    Arc::new(
        RadixCache::builder()
            .devices(2)
            .page_size(4)
            .pages_per_device(129)
            .watermarks(16, 32)
            .build()
            .unwrap(),
    )
}

fn fill(c: &PagedCache, d: DeviceId, from: u32, n: u32) {
    for k in from..from + n {
        let span = c.alloc(d, 8).unwrap();
        c.insert_pages(TokenKey::new(&[k, k, 1, 2, 3, 4, 5, 6]), span, 0)
            .unwrap();
    }
}

#[test]
fn background_evictor_restores_the_high_watermark() {
    let c = cache();
    for d in [DeviceId(0), DeviceId(1)] {
        fill(&c, d, 0, 60); // 120 of 128 pages: below the low watermark
    }
    // Started after both fills, so that it cannot catch a device half
    // filled, bring it back up and leave it no crossing to signal: each
    // device's crossing is waiting for it in the cache's signal channel.
    let ev = c.start_evictor().unwrap();
    // Waits for the evictor thread however late it is scheduled (bounded:
    // a loaded machine may start it seconds late; the test never assumes it
    // ran by some time).
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline
        && [0, 1]
            .iter()
            .any(|&d| c.allocator(DeviceId(d)).unwrap().free_pages() < 32)
    {
        std::thread::sleep(Duration::from_millis(5));
    }
    for d in 0..2 {
        assert!(
            c.allocator(DeviceId(d)).unwrap().free_pages() >= 32,
            "device {d} back at the high watermark"
        );
    }
    assert!(ev.stats().wakeups() >= 1 && ev.stats().evicted_pages() > 0);
    drop(ev);
    // The metrics module saw the same, per device.
    for d in 0..2 {
        let m = c.eviction_metrics(DeviceId(d)).unwrap();
        assert!(m.evictor_wakeups >= 1, "device {d}: {m:?}");
        assert!(m.evict_calls >= 1 && m.evicted_pages > 0 && m.evicted_leaves > 0);
        assert_eq!(m.evicted_tokens, m.evicted_pages * 4);
        assert!(m.time_below_low_watermark > std::time::Duration::ZERO);
        assert_eq!(m.latency.count, m.evict_calls);
    }
    c.audit();
}

#[test]
fn dropping_the_evictor_mid_eviction_stops_it_cleanly() {
    let c = cache();
    let ev = c.start_evictor().unwrap();
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut k = 0;
            while !stop.load(Ordering::Relaxed) {
                fill(&c, DeviceId(k % 2), 1000 + k, 1);
                k += 1;
            }
        });
        std::thread::sleep(Duration::from_millis(200));
        let t = Instant::now();
        drop(ev); // joins the thread, whatever it was doing
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "the evictor took {:?} to stop",
            t.elapsed()
        );
        stop.store(true, Ordering::Relaxed);
    });
    c.audit();
    // With the evictor gone, allocations still succeed by evicting the
    // shortfall themselves.
    fill(&c, DeviceId(0), 50_000, 100);
    c.audit();
}

#[test]
fn dropping_the_cache_ends_the_evictor() {
    let c = cache();
    let ev = c.start_evictor().unwrap();
    fill(&c, DeviceId(1), 0, 60);
    drop(c); // the thread holds only a weak reference
    let t = Instant::now();
    drop(ev);
    assert!(t.elapsed() < Duration::from_secs(60));
}

#[test]
fn evictor_misconfiguration_is_a_typed_error() {
    let plain = Arc::new(RadixCache::builder().pages_per_device(64).build().unwrap());
    assert!(matches!(
        plain.start_evictor(),
        Err(CacheError::InvalidConfig(_))
    ));
    let c = cache();
    let _ev = c.start_evictor().unwrap();
    assert!(
        matches!(c.start_evictor(), Err(CacheError::InvalidConfig(m)) if m.contains("already"))
    );
    // Watermarks without pages do not compile: only a builder that made
    // the cache own its pages takes them (`RadixCacheBuilder::watermarks`).
    assert!(matches!(
        RadixCache::builder()
            .pages_per_device(64)
            .watermarks(10, 5)
            .build(),
        Err(CacheError::InvalidConfig(_))
    ));
    assert!(matches!(
        RadixCache::builder()
            .pages_per_device(64)
            .watermarks(10, 64)
            .build(),
        Err(CacheError::InvalidConfig(_))
    ));
}
