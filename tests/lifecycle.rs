//! The request lifecycle, step by step as docs/semantics.md describes it, plus
//! a panic inside a request and a concurrent run against an evictor.

use radixkv::{DeviceId, PagedCache, RadixCache, TokenKey};
use std::sync::Arc;

const D0: DeviceId = DeviceId(0);

fn cache(ps: usize, pages: usize) -> Arc<PagedCache> {
    Arc::new(
        RadixCache::builder()
            .page_size(ps)
            .pages_per_device(pages)
            .build()
            .unwrap(),
    )
}

fn free(c: &PagedCache) -> usize {
    c.allocator(D0).unwrap().free_pages()
}

#[test]
fn matching_never_covers_the_last_token() {
    let c = cache(1, 64);
    let mut r = c.begin(TokenKey::new(&[1, 2, 3, 4]), D0).unwrap();
    r.reserve().unwrap();
    r.finish().unwrap();
    let r = c.begin(TokenKey::new(&[1, 2, 3, 4]), D0).unwrap();
    assert_eq!(r.cached_len(), 3, "the last token is always computed");
    let r2 = c.begin(TokenKey::new(&[1, 2, 3, 4, 5]), D0).unwrap();
    assert_eq!(r2.cached_len(), 4);
    drop((r, r2));
    c.audit();
}

#[test]
fn finish_frees_duplicates_and_the_unaligned_tail() {
    let c = cache(4, 64);
    let prompt: Vec<u32> = (0..10).collect(); // 2 whole pages + 2 tokens
                                              // Two requests for the same prompt, admitted before either finished.
    let mut a = c.begin(TokenKey::new(&prompt), D0).unwrap();
    let mut b = c.begin(TokenKey::new(&prompt), D0).unwrap();
    a.reserve().unwrap();
    b.reserve().unwrap();
    assert_eq!(free(&c), 63 - 6, "3 pages each");
    let ra = a.finish().unwrap();
    assert_eq!(ra.prefix_len, 0);
    assert_eq!(ra.adopted.len(), 1);
    assert_eq!(ra.adopted[0], 0..8);
    assert_eq!(
        free(&c),
        63 - 2 - 3,
        "a's tail page went back, 2 pages cached"
    );
    let rb = b.finish().unwrap();
    assert_eq!(rb.prefix_len, 8, "b's first 8 tokens were duplicates");
    assert_eq!(
        free(&c),
        63 - 2,
        "b's 2 duplicate pages and its tail went back"
    );
    let s = c.sizes(D0).unwrap();
    assert_eq!((s.total, s.protected), (8, 0), "no pin left");
    c.audit();
}

#[test]
fn commit_chunk_pins_the_new_end_before_releasing_the_old() {
    let c = cache(2, 64);
    let prompt: Vec<u32> = (0..12).collect();
    let mut r = c.begin(TokenKey::new(&prompt), D0).unwrap();
    r.reserve().unwrap();
    let mine = r.slots();
    // First chunk of 6 tokens (3 pages).
    let res = r.commit_chunk(6).unwrap();
    assert_eq!(res.prefix_len, 0);
    assert_eq!(r.cached_len(), 6);
    assert_eq!(
        r.slots(),
        mine,
        "the request now reads its own pages from the tree"
    );
    assert_eq!(c.sizes(D0).unwrap().protected, 6, "the chunk is pinned");
    assert_eq!(
        c.evict(D0, 1000).unwrap().tokens,
        0,
        "nothing of it is evictable"
    );
    // Another request caches the next chunk first: ours become duplicates.
    let mut other = c.begin(TokenKey::new(&prompt), D0).unwrap();
    assert_eq!(other.cached_len(), 6);
    other.reserve().unwrap();
    other.commit_chunk(10).unwrap();
    let theirs = other.slots();
    let before = free(&c);
    let res = r.commit_chunk(10).unwrap();
    assert_eq!(res.prefix_len, 10, "tokens 6..10 were cached meanwhile");
    assert_eq!(free(&c), before + 2, "our 2 duplicate pages went back");
    assert_eq!(
        &r.slots()[..10],
        &theirs[..10],
        "we now read the cache's copies"
    );
    assert_eq!(c.sizes(D0).unwrap().protected, 10);
    drop(other);
    r.finish().unwrap();
    assert_eq!(c.sizes(D0).unwrap().protected, 0);
    c.audit();
    c.evict(D0, usize::MAX).unwrap();
    assert_eq!(free(&c), 63, "every page came back");
}

#[test]
fn a_panic_inside_a_request_returns_pins_and_pages() {
    let c = cache(2, 64);
    c.begin(TokenKey::new(&[1, 2, 3, 4, 5]), D0)
        .map(|mut r| {
            r.reserve().unwrap();
            r.finish().unwrap();
        })
        .unwrap();
    let before = free(&c);
    let c2 = Arc::clone(&c);
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        let mut r = c2
            .begin(TokenKey::new(&[1, 2, 3, 4, 5, 6, 7, 8, 9]), D0)
            .unwrap();
        r.reserve().unwrap();
        r.commit_chunk(6).unwrap();
        r.extend(&[10, 11, 12]);
        r.reserve().unwrap();
        panic!("the model backend failed");
    }));
    assert!(result.is_err());
    let s = c.sizes(D0).unwrap();
    assert_eq!(s.protected, 0, "the pin was released");
    assert_eq!(s.total, 6, "the committed chunk stays cached");
    assert_eq!(
        free(&c),
        before - 1,
        "only the chunk's one new page is held, by the tree"
    );
    c.audit();
}

#[test]
fn requests_and_a_hammering_evictor() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let c = cache(4, 256);
    let stop = AtomicBool::new(false);
    // Tokens the evictor has freed so far: the workers wait on it halfway,
    // so evictions provably happen while requests are in flight, however
    // the threads are scheduled (a loaded CI machine once ran the workers
    // to the end before the evictor thread started).
    let evicted_so_far = AtomicUsize::new(0);
    std::thread::scope(|s| {
        let evictor = s.spawn(|| {
            let mut n = 0usize;
            while !stop.load(Ordering::Relaxed) {
                let got = c.evict(D0, 16).unwrap().tokens;
                n += got;
                evicted_so_far.fetch_add(got, Ordering::SeqCst);
                std::thread::yield_now();
            }
            n
        });
        let workers: Vec<_> = (0..3u32)
            .map(|t| {
                let c = &c;
                let evicted_so_far = &evicted_so_far;
                s.spawn(move || {
                    let mut done = 0;
                    let mut seen = 0;
                    for i in 0..600u32 {
                        if i == 300 {
                            // Halfway, with a cache full of this worker's
                            // prefixes: wait (bounded) for the evictor to
                            // free something after this point.
                            seen = evicted_so_far.load(Ordering::SeqCst);
                        }
                        if i == 301 {
                            let deadline =
                                std::time::Instant::now() + std::time::Duration::from_secs(60);
                            while evicted_so_far.load(Ordering::SeqCst) == seen {
                                assert!(
                                    std::time::Instant::now() < deadline,
                                    "the evictor freed nothing in 60 s"
                                );
                                std::thread::yield_now();
                            }
                        }
                        let mut key: Vec<u32> = (0..24).map(|j| (i % 7) * 100 + j).collect();
                        key.extend((0..(i % 5) * 4 + 1).map(|j| 10_000 + t * 1000 + i + j));
                        let mut r = match c.begin(TokenKey::new(&key), D0) {
                            Ok(r) => r,
                            Err(e) => panic!("{e}"),
                        };
                        if r.reserve().is_err() {
                            continue; // out of pages for now: abort
                        }
                        let half = key.len() / 2;
                        let before = r.slots();
                        r.commit_chunk(half).unwrap();
                        // Whatever was evicted, the pinned prefix is still
                        // the cache's and reads back identically.
                        let m = c
                            .match_and_pin(TokenKey::new(&key[..r.cached_len()]), D0)
                            .unwrap();
                        assert_eq!(m.len, r.cached_len());
                        assert_eq!(m.values, r.slots()[..r.cached_len()]);
                        assert!(r.cached_len() >= half / 4 * 4 || r.slots().len() == before.len());
                        drop(m);
                        r.finish().unwrap();
                        done += 1;
                    }
                    done
                })
            })
            .collect();
        let done: usize = workers.into_iter().map(|w| w.join().unwrap()).sum();
        stop.store(true, Ordering::Relaxed);
        let evicted = evictor.join().unwrap();
        assert!(done > 100, "only {done} requests completed");
        // Forced above: every worker saw an eviction in the middle of its run.
        assert!(evicted > 0);
    });
    c.audit();
    assert_eq!(c.sizes(D0).unwrap().protected, 0);
    c.evict(D0, usize::MAX).unwrap();
    assert_eq!(free(&c), 255);
    assert_eq!(c.allocator(D0).unwrap().double_frees(), 0);
}
