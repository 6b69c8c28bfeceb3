//! Loom model of the page allocator's reserve-then-claim protocol.
//!
//! Each model names the protecting step it relies on; `negative.sh`
//! builds each without it and requires the model to fail with its own
//! message.
#![cfg(loom)]

use loom::thread;
use loom_tests::{model, D0};
use std::sync::Arc;

/// The allocator's reserve-then-claim protocol with two claimers and a
/// free: each claimer reserves a count (CAS on the counter), then claims
/// bits by CAS on the bitmap word; the free sets bits before it raises the
/// counter. Protecting step: the claim's CAS on the word (two claimers that
/// read the same word cannot both take a bit). Control: `claim_cas`.
#[test]
fn two_claimers_and_a_free() {
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
