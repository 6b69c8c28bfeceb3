//! Readers never wait for a writer. For each structural change (split,
//! attach, adopt, evict, unlink) a writer is parked in the middle of it,
//! holding its locks, at a test-only pause point (`radixkv::pause`); then
//! `peek`, `match_prefix` and `match_and_pin` of the same path run on
//! other threads and must all finish while it stays parked, with answers
//! that are a state of the tree before or after the change.
//!
//! Negative control (`scripts/test.sh`): built with
//! `RADIXKV_NEGATIVE=reader_never_waits`, readers wait for a split's parent
//! publication as they used to, and this test fails with its own message
//! ("did not finish while a writer was parked").

use radixkv::pause::{climbs, Gate, Point};
use radixkv::{DeviceId, RadixCache, TokenKey};
use std::sync::mpsc;
use std::time::Duration;

const PS: usize = 4;

/// The pause gate is process-wide: the tests of this file take turns.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ONE.lock().unwrap_or_else(|p| p.into_inner())
}
const D0: DeviceId = DeviceId(0);
const D1: DeviceId = DeviceId(1);

fn key_a() -> Vec<u32> {
    (1..=16).collect()
}

fn cache() -> RadixCache {
    RadixCache::builder()
        .page_size(PS)
        .devices(2)
        .build()
        .unwrap()
}

/// What one reader did, for the report.
type Read = (&'static str, usize);

/// Runs the readers of path A on their own threads while the writer is
/// parked; each must finish within `limit` (generous: a loaded machine).
fn readers_finish(cache: &RadixCache, point: Point, gate: &Gate) -> Vec<Read> {
    let a = key_a();
    let limit = Duration::from_secs(20);
    std::thread::scope(|s| {
        let (tx, rx) = mpsc::channel::<Read>();
        let readers: Vec<Box<dyn FnOnce() -> Read + Send + '_>> = vec![
            Box::new(|| ("peek", cache.peek(TokenKey::new(&a))[0])),
            Box::new(|| {
                let m = cache.match_prefix(TokenKey::new(&a), D0).unwrap();
                ("match_prefix", m.len)
            }),
            Box::new(|| {
                // Ends inside a node: would split; never waits for a lock.
                let mut k = a[..PS].to_vec();
                k.extend([900, 901, 902, 903]);
                let m = cache.match_prefix(TokenKey::new(&k), D0).unwrap();
                assert!(m.len <= PS);
                ("match_prefix (split)", m.len)
            }),
            Box::new(|| {
                let m = cache.match_and_pin(TokenKey::new(&a), D0).unwrap();
                assert_eq!(m.values.len(), m.len, "values for every matched token");
                ("match_and_pin", m.len)
            }),
        ];
        let n = readers.len();
        for r in readers {
            let tx = tx.clone();
            s.spawn(move || {
                let _ = tx.send(r());
            });
        }
        let mut done = Vec::new();
        for _ in 0..n {
            match rx.recv_timeout(limit) {
                Ok(r) => done.push(r),
                Err(_) => {
                    // Let the writer go so the stuck reader can end, then fail.
                    gate.release();
                    panic!(
                        "a reader did not finish while a writer was parked at {point:?} \
                         (finished: {done:?})"
                    );
                }
            }
        }
        done
    })
}

/// Parks `writer` at `point`, checks the readers, releases it.
fn with_parked_writer(
    cache: &RadixCache,
    point: Point,
    writer: impl FnOnce() + Send,
    check: impl FnOnce(&[Read]),
) {
    std::thread::scope(|s| {
        // Armed inside the scope: if a check panics, the gate is dropped
        // (releasing the writer) before the scope joins the writer thread.
        let gate = Gate::arm(point);
        let w = s.spawn(writer);
        assert!(
            gate.wait_parked(Duration::from_secs(60)),
            "the writer never reached {point:?}"
        );
        let reads = readers_finish(cache, point, &gate);
        eprintln!("{point:?}: {reads:?}");
        check(&reads);
        gate.release();
        w.join().unwrap();
    });
    cache.audit();
}

fn len_of(reads: &[Read], name: &str) -> usize {
    reads.iter().find(|r| r.0 == name).map(|r| r.1).unwrap()
}

#[test]
fn readers_finish_while_a_writer_is_parked_inside_each_change() {
    let _one_gate = serial();
    let a = key_a();
    let values: Vec<u32> = (100..116).collect();

    // Split: an insert sharing A's first 8 tokens splits A's node and
    // parks between the child's new image and the parent's new children.
    let c = cache();
    c.insert(TokenKey::new(&a), D0, &values, 0).unwrap();
    let before = climbs();
    let mut b = a[..8].to_vec();
    b.extend([70, 71, 72, 73]);
    with_parked_writer(
        &c,
        Point::Split,
        || {
            c.insert(
                TokenKey::new(&b),
                D0,
                &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12],
                0,
            )
            .unwrap();
        },
        |r| {
            assert_eq!(len_of(r, "peek"), 16);
            assert_eq!(len_of(r, "match_prefix"), 16);
            assert_eq!(len_of(r, "match_and_pin"), 16);
            // The split of the parked node's parent pair is busy: the match
            // reports the prefix it has without splitting.
            assert_eq!(len_of(r, "match_prefix (split)"), 0);
        },
    );
    assert!(climbs() > before, "the readers met the split mid-way");
    assert_eq!(c.peek(TokenKey::new(&b)), vec![12, 0]);

    // Attach: a new leaf under the root, parked before it is linked.
    let c = cache();
    c.insert(TokenKey::new(&a), D0, &values, 0).unwrap();
    with_parked_writer(
        &c,
        Point::Attach,
        || {
            let other: Vec<u32> = (500..508).collect();
            c.insert(TokenKey::new(&other), D0, &[0; 8], 0).unwrap();
        },
        |r| {
            assert_eq!(len_of(r, "peek"), 16);
            assert_eq!(len_of(r, "match_and_pin"), 16);
            // The attacher holds the root's lock, which a split of A's node
            // needs: the match does not wait, it reports no split prefix.
            assert_eq!(len_of(r, "match_prefix (split)"), 0);
        },
    );

    // Adopt: A's values arriving for device 1, parked before publication.
    let c = cache();
    c.insert(TokenKey::new(&a), D0, &values, 0).unwrap();
    with_parked_writer(
        &c,
        Point::Adopt,
        || {
            c.insert(TokenKey::new(&a), D1, &values, 0).unwrap();
        },
        |r| {
            assert_eq!(len_of(r, "peek"), 16);
            assert_eq!(len_of(r, "match_prefix"), 16);
        },
    );
    assert_eq!(c.peek(TokenKey::new(&a)), vec![16, 16]);

    // Evict and unlink: A's leaf on device 0 (also resident on device 1
    // for the evict case, so the node stays; alone for the unlink case).
    for (point, also_d1) in [(Point::Evict, true), (Point::Unlink, false)] {
        let c = cache();
        c.insert(TokenKey::new(&a), D0, &values, 0).unwrap();
        if also_d1 {
            c.insert(TokenKey::new(&a), D1, &values, 0).unwrap();
        }
        with_parked_writer(
            &c,
            point,
            || {
                c.evict(D0, usize::MAX).unwrap();
            },
            |r| {
                // Claimed already: readers see it gone or (peek) not yet.
                let l = len_of(r, "peek");
                assert!(l == 0 || l == 16, "{l}");
                assert_eq!(len_of(r, "match_and_pin"), 0);
            },
        );
        assert_eq!(c.peek(TokenKey::new(&a))[0], 0);
    }
}

/// A panic in the middle of an insert that holds pins (a request's chunk
/// commit: the cached prefix pinned, then a new leaf attached) leaks no pin
/// and no page: the insert's pins are RAII (`HeldPin`), released as the
/// panic unwinds. The panic is injected at the attach's pause point, with
/// the parent's lock held.
#[test]
fn a_panic_mid_insert_leaks_no_pin() {
    let _one_gate = serial();
    let c = std::sync::Arc::new(
        RadixCache::builder()
            .page_size(PS)
            .pages_per_device(64)
            .build()
            .unwrap(),
    );
    let a = key_a();
    let span = c.alloc(D0, a.len()).unwrap();
    c.insert_pages(TokenKey::new(&a), span, 0).unwrap();
    let mut longer = a.clone();
    longer.extend(200..208);
    let gate = Gate::arm_panic(Point::Attach);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut req = c.begin(TokenKey::new(&longer), D0).unwrap();
        assert_eq!(req.cached_len(), 16);
        req.reserve().unwrap();
        // Pins the cached 16 tokens' node inside the insert, then attaches
        // the new 8: the injected panic fires there.
        let _ = req.commit_chunk(longer.len());
    }));
    drop(gate);
    assert!(r.is_err(), "the injected panic fired");
    // No pin survived the unwind (I6: pins equal live leases), and every
    // page is back or in the tree.
    c.audit();
    assert_eq!(c.sizes(D0).unwrap().protected, 0);
    c.evict(D0, usize::MAX).unwrap();
    assert_eq!(c.allocator(D0).unwrap().free_pages(), 63);
}
