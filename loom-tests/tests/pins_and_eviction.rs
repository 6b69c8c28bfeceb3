//! Loom models of pins and eviction: a pin and an eviction of the same
//! residency, a lease released while others pin and evict, a pinned
//! insert, the evictor's candidates, and a policy switch racing an insert.
//!
//! Each model names the protecting step it relies on; `negative.sh`
//! builds each without it and requires the model to fail with its own
//! message.
#![cfg(loom)]

use loom::thread;
use loom_tests::{cache, key, model, paged, D0, D1};
use radixkv::RadixCache;
use std::sync::Arc;

/// match vs evict. Protecting step: eviction claims a residency only
/// by a CAS that expects zero pins (`Residency::try_evict`), and a pin is a
/// CAS that expects `RESIDENT` — so a live lease's values are never freed.
/// Control: `evict_pin_check`.
#[test]
fn match_vs_evict() {
    model(|| {
        let c = cache(1);
        c.insert(key(&[1, 2]), D0, &[10, 11], 0).unwrap();
        let c1 = Arc::clone(&c);
        let t = thread::spawn(move || {
            let m = c1.match_and_pin(key(&[1, 2]), D0).unwrap();
            (m.values, m.lease)
        });
        let ev = c.evict(D0, 2).unwrap();
        let (values, lease) = t.join().unwrap();
        if !values.is_empty() {
            for v in &values {
                assert!(
                    !ev.values.contains(v),
                    "value {v} was evicted while a lease on it was live"
                );
            }
        }
        drop(lease);
        c.audit();
    });
}

/// residency ABA. Protecting step: the pin is generation-checked
/// and the values are read only after it succeeded ("pin first, then read
/// pages"). Control: `pin_then_read` (read first, pin any residency).
#[test]
fn residency_aba() {
    model(|| {
        let c = cache(2);
        c.insert(key(&[1, 2]), D0, &[10, 11], 0).unwrap();
        // Resident on device 1 too, so the node stays in the tree when
        // device 0 loses it and can become resident there again.
        c.insert(key(&[1, 2]), D1, &[90, 91], 0).unwrap();
        let c1 = Arc::clone(&c);
        let t = thread::spawn(move || {
            let m = c1.match_and_pin(key(&[1, 2]), D0).unwrap();
            (m.values, m.lease)
        });
        let ev = c.evict(D0, 2).unwrap();
        if ev.tokens > 0 {
            c.insert(key(&[1, 2]), D0, &[30, 31], 0).unwrap();
        }
        let (values, lease) = t.join().unwrap();
        if let Some(l) = &lease {
            if !l.is_empty() {
                let now = c.match_and_pin(key(&[1, 2]), D0).unwrap();
                assert_eq!(
                    values, now.values,
                    "a lease returned values of an older residency"
                );
            }
        }
        drop(lease);
        c.audit();
    });
}

/// Lease drop racing with a new pin and an eviction. Protecting step: a
/// lease releases its pin with one atomic RMW on the state word (which pins
/// and eviction CAS too), and holds its node by `Arc` across it. Control:
/// `unpin_rmw` (a load and a store).
///
/// This control removes the protecting step: the atomicity of the release.
/// The load-store pair loses an update only when the other thread's pin
/// CAS lands between the two, an interleaving loom finds; in a serial run
/// it behaves like the RMW.
#[test]
fn lease_drop_vs_pin_and_evict() {
    model(|| {
        let c = cache(1);
        c.insert(key(&[1, 2]), D0, &[10, 11], 0).unwrap();
        let first = c.match_and_pin(key(&[1, 2]), D0).unwrap().lease.unwrap();
        let c1 = Arc::clone(&c);
        let dropper = thread::spawn(move || drop(first));
        let t = thread::spawn(move || {
            let m = c1.match_and_pin(key(&[1, 2]), D0).unwrap();
            (m.values, m.lease)
        });
        let ev = c.evict(D0, 2).unwrap();
        dropper.join().unwrap();
        let (values, lease) = t.join().unwrap();
        for v in &values {
            assert!(
                !ev.values.contains(v),
                "value {v} was evicted under a live lease"
            );
        }
        c.audit();
        drop(lease);
        c.audit();
    });
}

/// A request's pinned insert racing with eviction. Protecting step: a leaf
/// the insert creates is born pinned (and a node it adopts is pinned under
/// its lock), so the evictor can never take what the request just handed
/// to the tree before the request holds its pin. Control: `born_pinned`.
#[test]
fn pinned_insert_vs_evict() {
    model(|| {
        let c = paged(1, 4);
        let c1 = Arc::clone(&c);
        let t = thread::spawn(move || {
            let mut r = c1.begin(key(&[1, 2, 3]), D0).unwrap();
            r.reserve().unwrap();
            r.commit_chunk(2).unwrap();
            r.cached_len()
        });
        c.evict(D0, 2).unwrap();
        assert_eq!(
            t.join().unwrap(),
            2,
            "the committed chunk must stay the request's"
        );
        c.audit();
        c.evict(D0, usize::MAX).unwrap();
        c.audit();
    });
}

/// A pin racing the evictor's candidate selection (page mode: the evictor
/// pops leaves from its per-device heap, sets pinned ones aside, and claims
/// a residency by CAS). Protecting step: the claim's CAS expects zero pins,
/// whatever the heap said. Control: `evict_pin_check`.
#[test]
fn pin_vs_evictor_candidates() {
    model(|| {
        let c = paged(1, 8);
        let span = c.alloc(D0, 2).unwrap();
        c.insert_pages(key(&[1, 2]), span, 0).unwrap();
        let c1 = Arc::clone(&c);
        let t = thread::spawn(move || {
            let m = c1.match_and_pin(key(&[1, 2]), D0).unwrap();
            (m.values, m.lease)
        });
        c.evict(D0, 2).unwrap();
        let (values, lease) = t.join().unwrap();
        let alloc = c.allocator(D0).unwrap();
        for v in &values {
            assert!(
                !alloc.is_free(*v),
                "page {v} was freed while a lease on it was live"
            );
        }
        drop(lease);
        c.audit();
    });
}

/// a switch from a policy that ranks by a scan (mru) to one that
/// ranks in a heap (lru) racing an insert: the new leaf must be an
/// eviction candidate afterwards, found either by the switch's scan or by
/// the note the insert leaves. Protecting step: the switch drops the notes
/// taken so far only with a scan after it (a dropped note's leaf was
/// linked before the note, so the scan finds it). Control:
/// `switch_rescans` (the notes dropped, no scan).
#[test]
fn policy_switch_vs_insert() {
    model(|| {
        let c = Arc::new(
            RadixCache::builder()
                .eviction_policy(radixkv::EvictionPolicy::Mru)
                .build()
                .unwrap(),
        );
        let c1 = Arc::clone(&c);
        let t = thread::spawn(move || {
            c1.insert(key(&[1]), D0, &[10], 0).unwrap();
        });
        c.set_eviction_policy(radixkv::EvictionPolicy::Lru);
        t.join().unwrap();
        assert_eq!(
            c.evict(D0, 1).unwrap().tokens,
            1,
            "a leaf inserted during a switch to a heap policy must be a candidate"
        );
        c.audit();
    });
}
