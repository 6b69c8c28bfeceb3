//! Loom models of copies between tiers: a copy and the eviction of its
//! source, a copy's completion and an insert on its destination, and a
//! write-back racing a second evictor.
//!
//! Each model names the protecting step it relies on; `negative.sh`
//! builds each without it and requires the model to fail with its own
//! message.
#![cfg(loom)]

use loom::thread;
use loom_tests::{key, model, paged, D0, D1};
use radixkv::RadixCache;
use std::sync::Arc;

/// Copy vs eviction of its source (docs/tiers.md): a copy from
/// device 0 to device 1 reads the source's slots and then moves the KV
/// while device 0's evictor runs. Protecting step: the copy holds a pin on
/// the source's prefix for its whole life (`PrefixCopy`'s source lease), so
/// the source pages cannot be evicted (freed, reused) before it completes
/// or is cancelled. Control: `copy_source_pin` (the pin is dropped as soon
/// as the slots are read).
#[test]
fn copy_vs_evict_source() {
    model(|| {
        let c = paged(2, 4);
        let span = c.alloc(D0, 1).unwrap();
        c.insert_pages(key(&[1]), span, 0).unwrap();
        let c1 = Arc::clone(&c);
        let t = thread::spawn(move || {
            let Some(copy) = c1.copy_prefix(key(&[1]), D0, D1).unwrap() else {
                return; // evicted before the copy was planned: nothing to copy
            };
            // Moving the KV: every source page must still hold it.
            let alloc = c1.allocator(D0).unwrap();
            for &s in copy.source_slots() {
                assert!(
                    !alloc.is_free(s),
                    "the copy's source page {s} was freed mid-copy"
                );
            }
            copy.complete().unwrap();
        });
        c.evict(D0, 1).unwrap();
        t.join().unwrap();
        c.audit();
    });
}

/// Copy completion vs a concurrent insert of the same prefix on the
/// destination: a copy into device 1 completes while a request on device 1
/// computed and inserts the same prefix. Exactly one set of pages may end
/// up resident; the other goes back to device 1's allocator (I2).
/// Protecting step: completing is the general chunk insert, which frees the
/// pages the tree did not adopt. Control: `copy_frees_dups` (the copy's pages are
/// taken as adopted whatever the tree did).
#[test]
fn copy_completion_vs_insert_on_dest() {
    model(|| {
        let c = paged(2, 4);
        let span = c.alloc(D0, 1).unwrap();
        c.insert_pages(key(&[1]), span, 0).unwrap();
        let copy = c.copy_prefix(key(&[1]), D0, D1).unwrap().unwrap();
        let c1 = Arc::clone(&c);
        let t = thread::spawn(move || {
            let span = c1.alloc(D1, 1).unwrap();
            c1.insert_pages(key(&[1]), span, 0).unwrap();
        });
        copy.complete().unwrap();
        t.join().unwrap();
        assert_eq!(c.peek(key(&[1])), vec![1, 1]);
        // Page 0 is reserved; one page resident on device 1, two free.
        assert_eq!(
            c.allocator(D1).unwrap().free_pages(),
            2,
            "the duplicate pages of device 1 must go back"
        );
        c.audit();
    });
}

/// Write-back to the host vs the GPU eviction that triggers it, with a
/// second evictor of the same device (the background one) running: the
/// write-back copies the victim (device 0 → host) before it is claimed.
/// With mru (a policy ranked by a scan, whose evictions of one device do
/// not serialize on the candidate heap's lock) the two evictions overlap.
/// Protecting step: the write-back's copy pins the victim's pages while
/// they are read, so the other evictor cannot free them mid-copy (and the
/// victim is claimed only after the copy completed). Control:
/// `copy_source_pin`.
#[test]
fn write_back_vs_evict() {
    model(|| {
        let c = Arc::new(
            RadixCache::builder()
                .pages_per_device(4)
                .host_pages(4)
                .eviction_policy(radixkv::EvictionPolicy::Mru)
                .build()
                .unwrap(),
        );
        let span = c.alloc(D0, 1).unwrap();
        c.insert_pages(key(&[1]), span, 0).unwrap();
        let c1 = Arc::clone(&c);
        let t = thread::spawn(move || {
            let alloc = Arc::clone(c1.allocator(D0).unwrap());
            c1.evict_with_write_back(D0, 1, |copy| {
                for &s in copy.source_slots() {
                    assert!(
                        !alloc.is_free(s),
                        "the write-back read page {s} after it was freed"
                    );
                }
                true
            })
            .unwrap();
        });
        c.evict(D0, 1).unwrap();
        t.join().unwrap();
        assert_eq!(c.peek(key(&[1])), vec![0]);
        c.audit();
    });
}
