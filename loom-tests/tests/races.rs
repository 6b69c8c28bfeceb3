//! Loom models of CONCURRENCY.md's races, run on the real tree code through
//! radixkv's `sync` shim. Each model names the protecting step it relies
//! on; `negative.sh` removes that step with `--cfg radixkv_negative="…"`
//! and expects the model to fail.
//!
//! Run: `RUSTFLAGS="--cfg loom --cfg crossbeam_loom" LOOM_MAX_PREEMPTIONS=2 \
//!       cargo test -p loom-tests --release --target-dir target/loom`
#![cfg(loom)]

use loom::thread;
use radixkv::{DeviceId, RadixCache, TokenKey};
use std::sync::Arc;

const D0: DeviceId = DeviceId(0);
const D1: DeviceId = DeviceId(1);

fn model<F: Fn() + Sync + Send + 'static>(f: F) {
    model_with_branches(1_000, f);
}

/// A model whose execution takes up to `branches` atomic steps (loom's
/// default is 1,000: a setup of many inserts needs more).
fn model_with_branches<F: Fn() + Sync + Send + 'static>(branches: usize, f: F) {
    let mut b = loom::model::Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(2);
    }
    b.max_branches = b.max_branches.max(branches);
    b.check(f);
}

fn cache(devices: usize) -> Arc<RadixCache> {
    Arc::new(RadixCache::builder().devices(devices).build().unwrap())
}

fn key(t: &[u32]) -> TokenKey<'_> {
    TokenKey::new(t)
}

/// Race 1, match vs evict. Protecting step: eviction claims a residency only
/// by a CAS that expects zero pins (`Residency::try_evict`), and a pin is a
/// CAS that expects `RESIDENT` — so a live lease's values are never freed.
/// Control: `evict_pin_check`.
#[test]
fn race1_match_vs_evict() {
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

/// Race 2, insert below a node being evicted. Protecting step: the evictor
/// re-checks "no child resident on d" under the node's lock, and the
/// inserter attaches a child only under the parent's lock while the parent
/// is resident. Control: `leaf_check`.
#[test]
fn race2_insert_below_evicted_node() {
    model(|| {
        let c = cache(1);
        c.insert(key(&[1]), D0, &[10], 0).unwrap();
        let c1 = Arc::clone(&c);
        let t = thread::spawn(move || {
            c1.insert(key(&[1, 2]), D0, &[20, 21], 0).unwrap();
        });
        c.evict(D0, 1).unwrap();
        t.join().unwrap();
        c.audit();
    });
}

/// Race 3, split vs pin counts. Protecting step: pins live only on the
/// end node of a match, and a split keeps the old node object as the
/// suffix, so a split copies no count and cannot double- or un-count a pin
/// taken concurrently. Control: `split_copies_pins` (copy the count into
/// the new prefix, as SGLang copies `lock_ref`).
///
/// Why this control adds a step instead of removing one: the protection is
/// an omission by design (no pin state moves in a split), so there is no
/// check to take out; the only way to lose it is to do what the design
/// avoids. The copied count is wrong in every interleaving where the pin
/// was taken before the split, which the model reaches first.
#[test]
fn race3_split_vs_pin_counts() {
    model(|| {
        let c = cache(1);
        c.insert(key(&[1, 2]), D0, &[10, 11], 0).unwrap();
        let c1 = Arc::clone(&c);
        let t = thread::spawn(move || c1.match_and_pin(key(&[1, 2]), D0).unwrap());
        // Ends inside [1, 2]: splits it.
        c.match_prefix(key(&[1]), D0).unwrap();
        let m = t.join().unwrap();
        c.audit();
        let s = c.sizes(D0).unwrap();
        assert_eq!(
            (s.protected, s.total),
            (2, 2),
            "the lease protects exactly its path"
        );
        drop(m.lease);
        c.audit();
        assert_eq!(
            c.sizes(D0).unwrap().protected,
            0,
            "a released lease leaves no pin behind"
        );
    });
}

/// Race 4, split vs reader. Protecting step: a reader checks that the
/// child's image names the node it came from as parent, and otherwise
/// climbs the child's parent links to the node now below it (`climb_to`),
/// without waiting for the splitter. Control: `reader_parent_check`.
#[test]
fn race4_split_vs_reader() {
    model(|| {
        let c = cache(1);
        c.insert(key(&[1, 2, 3]), D0, &[10, 11, 12], 0).unwrap();
        let c1 = Arc::clone(&c);
        let t = thread::spawn(move || c1.peek(key(&[1, 2, 3])));
        c.match_prefix(key(&[1]), D0).unwrap();
        assert_eq!(t.join().unwrap(), vec![3], "the whole key stayed cached");
        c.audit();
    });
}

/// Race 5, concurrent insert of the same new prefix. Protecting step:
/// attaching a leaf re-checks, under the parent's lock, that no child with
/// that first page appeared (adoption re-checks residency likewise); the
/// loser's values come back as duplicates. Control: `attach_recheck`.
#[test]
fn race5_concurrent_insert_same_prefix() {
    model(|| {
        let c = cache(1);
        let c1 = Arc::clone(&c);
        let t = thread::spawn(move || c1.insert(key(&[1, 2]), D0, &[10, 11], 0).unwrap());
        let b = c.insert(key(&[1, 2]), D0, &[20, 21], 0).unwrap();
        let a = t.join().unwrap();
        let now = c.match_and_pin(key(&[1, 2]), D0).unwrap();
        assert_eq!(now.len, 2);
        for j in 0..2 {
            let in_a = a.adopted.iter().any(|r| r.contains(&j));
            let in_b = b.adopted.iter().any(|r| r.contains(&j));
            assert!(in_a != in_b, "token {j}: exactly one insert must own it");
            let want = if in_a { 10 + j as u32 } else { 20 + j as u32 };
            assert_eq!(now.values[j], want, "token {j} holds the winner's value");
        }
        drop(now);
        c.audit();
    });
}

/// Race 6, unlink vs insert. Protecting step: adoption refuses a node that
/// was unlinked (checked under its parent's and its own lock, the locks the
/// unlink holds). Control: `unlink_check`.
#[test]
fn race6_unlink_vs_insert() {
    model(|| {
        let c = cache(2);
        c.insert(key(&[1, 2]), D1, &[90, 91], 0).unwrap();
        // A sibling keeps the namespace root alive when [1, 2] is unlinked,
        // so the model shows the node's own check, not the root's reclaim
        // (model 17 covers that).
        c.insert(key(&[7]), D0, &[70], 0).unwrap();
        let c1 = Arc::clone(&c);
        let t = thread::spawn(move || c1.insert(key(&[1, 2]), D0, &[10, 11], 0).unwrap());
        // Evicting device 1's residency unlinks the node unless device 0
        // adopted it first.
        c.evict(D1, 2).unwrap();
        let r = t.join().unwrap();
        assert_eq!(r.prefix_len, 0);
        let m = c.match_and_pin(key(&[1, 2]), D0).unwrap();
        assert_eq!(m.values, vec![10, 11], "the insert must not be lost");
        drop(m);
        c.audit();
    });
}

/// Race 7, epoch reclamation. Protecting step: replaced images are retired
/// with `defer_destroy`, so a reader's guard keeps them alive. Control:
/// `defer_destroy` (free at once); the model sees it through a registry of
/// live images (`radixkv::sync::probe`), not by reading freed memory. The
/// node is resident on two devices, so evicting it from one replaces its
/// image and it stays in the tree (a node that leaves the tree keeps its
/// last image, freed with the node).
#[test]
fn race7_epoch_reclamation() {
    model(|| {
        let c = cache(2);
        c.insert(key(&[1, 2]), D0, &[10, 11], 0).unwrap();
        c.insert(key(&[1, 2]), D1, &[90, 91], 0).unwrap();
        let c1 = Arc::clone(&c);
        let t = thread::spawn(move || c1.peek(key(&[1, 2])));
        let ev = c.evict(D0, 2).unwrap();
        let seen = t.join().unwrap();
        assert!(seen == vec![2, 2] || seen == vec![0, 2]);
        assert_eq!(ev.values, vec![10, 11]);
        c.audit();
    });
}

/// Race 8, residency ABA. Protecting step: the pin is generation-checked
/// and the values are read only after it succeeded ("pin first, then read
/// pages"). Control: `pin_then_read` (read first, pin any residency).
#[test]
fn race8_residency_aba() {
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

/// Race 9, split vs evict. Protecting step: a split takes the parent's and
/// the node's lock, as eviction does, and splits only the image it computed
/// from, of a node still linked. Control: `split_recheck`.
#[test]
fn race9_split_vs_evict() {
    model(|| {
        let c = cache(2);
        c.insert(key(&[1, 2]), D0, &[10, 11], 0).unwrap();
        // A sibling on the other device keeps the namespace root alive, so
        // the model shows the split's own re-check, not the root's reclaim.
        c.insert(key(&[7]), D1, &[70], 0).unwrap();
        let c1 = Arc::clone(&c);
        let t = thread::spawn(move || {
            c1.match_prefix(key(&[1]), D0).unwrap();
        });
        let first = c.evict(D0, 1).unwrap();
        t.join().unwrap();
        c.audit();
        let rest = c.evict(D0, usize::MAX).unwrap();
        let mut all = first.values.clone();
        all.extend(&rest.values);
        all.sort_unstable();
        assert_eq!(all, vec![10, 11], "every value has exactly one owner");
        assert_eq!(c.node_count(), 1, "only the sibling is left");
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
fn model10_lease_drop_vs_evict() {
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

/// Two devices evicting leaves under a shared parent. Protecting step: a
/// node's children array and per-device child counts change only under its
/// lock, which every eviction of a child takes. Control: `parent_lock`.
#[test]
fn model11_two_devices_shared_parent() {
    model(|| {
        let c = cache(2);
        c.insert(key(&[1, 2]), D0, &[10, 11], 0).unwrap();
        c.insert(key(&[1, 3]), D1, &[20, 21], 0).unwrap();
        let c1 = Arc::clone(&c);
        let t = thread::spawn(move || c1.evict(D0, 2).unwrap());
        let mut e1 = c.evict(D1, 2).unwrap().values;
        let mut e0 = t.join().unwrap().values;
        e0.sort_unstable();
        e1.sort_unstable();
        assert_eq!((e0, e1), (vec![10, 11], vec![20, 21]));
        assert_eq!(c.node_count(), 0, "no node may survive without residency");
        c.audit();
    });
}

/// A request's pinned insert racing with eviction. Protecting step: a leaf
/// the insert creates is born pinned (and a node it adopts is pinned under
/// its lock), so the evictor can never take what the request just handed
/// to the tree before the request holds its pin. Control: `born_pinned`.
#[test]
fn model12_pinned_insert_vs_evict() {
    model(|| {
        let c = Arc::new(RadixCache::builder().pages_per_device(4).build().unwrap());
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

/// Race 4 at page size 2: the reader compares whole pages (the page-hash
/// lookup and the first-page check) while a match splits the node after
/// its first page. Protecting step: the reader's parent check and climb.
/// Control: `reader_parent_check`.
#[test]
fn model13_split_vs_reader_pages() {
    model(|| {
        let c = Arc::new(RadixCache::builder().page_size(2).build().unwrap());
        c.insert(key(&[1, 2, 3, 4, 5, 6]), D0, &[10, 11, 12, 13, 14, 15], 0)
            .unwrap();
        let c1 = Arc::clone(&c);
        let t = thread::spawn(move || c1.peek(key(&[1, 2, 3, 4, 5, 6])));
        c.match_prefix(key(&[1, 2, 9, 9]), D0).unwrap();
        assert_eq!(
            t.join().unwrap(),
            vec![6],
            "the whole key stayed cached (page size 2)"
        );
        c.audit();
    });
}

/// Race 5 under a wide node: the root has more children than a flat array
/// holds (4 under loom), so they are a table changed in place, and two
/// inserts of the same new first token race. Protecting step: the attach
/// re-check under the parent's lock, on the table. Control:
/// `attach_recheck`.
///
/// The same model checks table reclamation: the root's table is full
/// (eight children in eleven slots), so the insert that locks first
/// builds a bigger table and publishes it while the other may still be
/// probing the old one; the protecting step is retiring the old table
/// with the grace period. Control: `table_retire` frees it at once, and
/// the table probe reports the use after free.
#[test]
fn model14_wide_children_concurrent_insert() {
    model_with_branches(200_000, || {
        let c = cache(1);
        for k in 100..108u32 {
            c.insert(key(&[k]), D0, &[k], 0).unwrap();
        }
        let c1 = Arc::clone(&c);
        let t = thread::spawn(move || c1.insert(key(&[7, 8]), D0, &[10, 11], 0).unwrap());
        let b = c.insert(key(&[7, 8]), D0, &[20, 21], 0).unwrap();
        let a = t.join().unwrap();
        for j in 0..2 {
            let in_a = a.adopted.iter().any(|r| r.contains(&j));
            let in_b = b.adopted.iter().any(|r| r.contains(&j));
            assert!(
                in_a != in_b,
                "token {j} under a wide node: exactly one insert must own it"
            );
        }
        assert_eq!(c.peek(key(&[105])), vec![1], "the other children stay");
        c.audit();
    });
}

/// The allocator's reserve-then-claim protocol with two claimers and a
/// free: each claimer reserves a count (CAS on the counter), then claims
/// bits by CAS on the bitmap word; the free sets bits before it raises the
/// counter. Protecting step: the claim's CAS on the word (two claimers that
/// read the same word cannot both take a bit). Control: `claim_cas`.
#[test]
fn model15_alloc_two_claimers_and_a_free() {
    use radixkv::alloc::PageAllocator;
    model(|| {
        // Pages 1, 2 and 3 (page 0 is reserved), all in one bitmap word.
        let a = Arc::new(PageAllocator::new(D0, 4, 1).unwrap());
        let first = a.alloc(1).unwrap();
        let a1 = Arc::clone(&a);
        let claimer = thread::spawn(move || a1.alloc(1).ok());
        let freer = thread::spawn(move || drop(first));
        let mine = a.alloc(1).ok();
        let theirs = claimer.join().unwrap();
        freer.join().unwrap();
        let mut held: Vec<u32> = mine
            .iter()
            .chain(theirs.iter())
            .flat_map(|s| s.pages().to_vec())
            .collect();
        let n = held.len();
        held.sort_unstable();
        held.dedup();
        assert_eq!(held.len(), n, "a page was handed to two spans: {held:?}");
        for &p in &held {
            assert!(!a.is_free(p), "page {p} is both held and free");
        }
        assert_eq!(a.free_pages(), 3 - n, "free count and bitmap agree");
        drop((mine, theirs));
        assert_eq!(a.free_pages(), 3);
        assert_eq!(a.double_frees(), 0);
    });
}

/// A pin racing the evictor's candidate selection (page mode: the evictor
/// pops leaves from its per-device heap, sets pinned ones aside, and claims
/// a residency by CAS). Protecting step: the claim's CAS expects zero pins,
/// whatever the heap said. Control: `evict_pin_check`.
#[test]
fn model16_pin_vs_evictor_candidates() {
    model(|| {
        let c = Arc::new(RadixCache::builder().pages_per_device(8).build().unwrap());
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

/// A namespace root reclaimed while an insert into that namespace races it:
/// the eviction of the namespace's last node marks its root obsolete under
/// the root's lock and removes it from the table; an insert that found the
/// root before must not hang its node below it (it would be unreachable).
/// Protecting step: attaching re-checks, under the parent's lock, that the
/// parent (here the root) is not obsolete; the insert then walks again and
/// gets a fresh root. Control: `root_obsolete_check`.
#[test]
fn model17_namespace_root_reclaimed_vs_insert() {
    model(|| {
        let c = cache(1);
        c.insert(key(&[1]).with_namespace("t"), D0, &[10], 0)
            .unwrap();
        let c1 = Arc::clone(&c);
        let t = thread::spawn(move || {
            c1.insert(key(&[2]).with_namespace("t"), D0, &[20], 0)
                .unwrap();
        });
        c.evict(D0, 1).unwrap();
        t.join().unwrap();
        assert_eq!(
            c.peek(key(&[2]).with_namespace("t")),
            vec![1],
            "the insert into a reclaimed namespace must not be lost"
        );
        c.audit();
    });
}

/// Copy vs eviction of its source (TIERS.md, "Copy safety"): a copy from
/// device 0 to device 1 reads the source's slots and then moves the KV
/// while device 0's evictor runs. Protecting step: the copy holds a pin on
/// the source's prefix for its whole life (`PrefixCopy`'s source lease), so
/// the source pages cannot be evicted (freed, reused) before it completes
/// or is cancelled. Control: `copy_source_pin` (the pin is dropped as soon
/// as the slots are read).
#[test]
fn model18_copy_vs_evict_source() {
    model(|| {
        let c = Arc::new(
            RadixCache::builder()
                .devices(2)
                .pages_per_device(4)
                .build()
                .unwrap(),
        );
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
/// pages the tree did not adopt. Control: `copy_dups` (the copy's pages are
/// taken as adopted whatever the tree did).
#[test]
fn model19_copy_completion_vs_insert_on_dest() {
    model(|| {
        let c = Arc::new(
            RadixCache::builder()
                .devices(2)
                .pages_per_device(4)
                .build()
                .unwrap(),
        );
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
fn model20_write_back_vs_evict() {
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

/// Model 21, a store racing the removal of the same page: an insert
/// attaches a leaf while an evictor takes it. Protecting step: the store is
/// reported inside the attach's locked section, before the leaf is
/// published, so the eviction (which needs the parent's lock and must see
/// the leaf) reports after it. Control: `event_in_lock` (the store is
/// reported once the attach is done, after the lock). Mru: its evictor finds leaves by
/// a scan of the tree, so it can meet the leaf as soon as it is published.
#[test]
fn model21_store_event_vs_evict() {
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

/// Model 22, a split racing the eviction of the node it splits: an insert
/// of [1 3] splits the leaf [1 2] (into [1] and [2]) while an evictor takes
/// a leaf. Protecting step: the split is reported under the split's locks,
/// before the prefix node is published, so an eviction of the shortened
/// node (which needs its lock and its new parent's) reports after it.
/// Control: `split_event_in_lock` (the split is reported after the locks).
/// Mru: its evictor finds leaves by a scan of the tree.
#[test]
fn model22_split_event_vs_evict() {
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

/// Model 23, a switch from a policy that ranks by a scan (mru) to one that
/// ranks in a heap (lru) racing an insert: the new leaf must be an
/// eviction candidate afterwards, found either by the switch's scan or by
/// the note the insert leaves. Protecting step: the switch drops the notes
/// taken so far only with a scan after it (a dropped note's leaf was
/// linked before the note, so the scan finds it). Control:
/// `switch_without_scan` (the notes dropped, no scan).
#[test]
fn model23_policy_switch_vs_insert() {
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

/// Model 24, the removal of a wide node's child racing a reader of a child
/// filed behind it: the root's children 2, 5, 7, 10 and 13 are a table of
/// eleven slots where 5 and 13 share a home slot, 13 filed four slots
/// after 5 (tokens chosen for it). The evictor removes 5 (the least
/// recently used) while a reader looks up 13, which stays cached
/// throughout. Protecting step: a removal leaves its slot filled (a
/// tombstone pointer, the tag kept), so a probe never ends there. Control:
/// `table_tomb` empties the slot, and the reader stops before 13.
#[test]
fn model24_table_removal_vs_reader() {
    model_with_branches(20_000, || {
        let c = cache(1);
        for k in [5u32, 2, 7, 10, 13] {
            c.insert(key(&[k]), D0, &[k], 0).unwrap();
        }
        let c1 = Arc::clone(&c);
        let t = thread::spawn(move || c1.evict(D0, 1).unwrap().tokens);
        let seen = c.peek(key(&[13]));
        assert_eq!(t.join().unwrap(), 1);
        assert_eq!(
            seen,
            vec![1],
            "a child filed behind a removed one must stay findable"
        );
        assert_eq!(
            c.peek(key(&[13])),
            vec![1],
            "a child filed behind a removed one must stay findable"
        );
        assert_eq!(c.peek(key(&[5])), vec![0], "the least recently used went");
        c.audit();
    });
}

/// Model 25, race 4 below a wide node: the root's children are a table
/// (five of them; four fit a flat array under loom), and a match splits
/// one of them while a reader walks it. The split puts the new prefix node
/// in the child's slot in place (same first page, same tag), so a reader
/// finds either the old child (and climbs to the prefix node) or the
/// prefix node. Protecting step: as race 4, the reader's climb. Control:
/// `reader_parent_check`.
#[test]
fn model25_split_below_a_table_vs_reader() {
    model_with_branches(20_000, || {
        let c = cache(1);
        for k in [5u32, 6, 7, 8] {
            c.insert(key(&[k]), D0, &[k], 0).unwrap();
        }
        c.insert(key(&[1, 2, 3]), D0, &[10, 11, 12], 0).unwrap();
        let c1 = Arc::clone(&c);
        let t = thread::spawn(move || c1.peek(key(&[1, 2, 3])));
        c.match_prefix(key(&[1]), D0).unwrap();
        assert_eq!(
            t.join().unwrap(),
            vec![3],
            "the whole key stayed cached (below a table)"
        );
        c.audit();
    });
}
