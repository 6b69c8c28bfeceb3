//! Test-only pause points in the tree's structural changes (feature
//! `testing`; compiled out otherwise). A test arms one [`Point`]; the next
//! thread that reaches it parks there, inside the change, holding its
//! locks, until the test releases it. Meanwhile the test checks that
//! readers of the same path still finish: they never wait for a writer.
//!
//! ```
//! use radixkv::pause::{Gate, Point};
//! use radixkv::{DeviceId, RadixCache, TokenKey};
//! use std::time::Duration;
//! let cache = RadixCache::builder().build().unwrap();
//! let gate = Gate::arm(Point::Attach);
//! std::thread::scope(|s| {
//!     let writer = s.spawn(|| cache.insert(TokenKey::new(&[1, 2]), DeviceId(0), &[7, 8], 0));
//!     assert!(gate.wait_parked(Duration::from_secs(30)));
//!     // The writer holds the root's lock: a reader still answers.
//!     assert_eq!(cache.peek(TokenKey::new(&[1, 2])), vec![0]);
//!     gate.release();
//!     writer.join().unwrap().unwrap();
//! });
//! assert_eq!(cache.peek(TokenKey::new(&[1, 2])), vec![2]);
//! ```

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// Where a writer can be parked: inside each structural change, after its
/// checks, holding its locks, before it publishes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Point {
    /// A split: the child's new image (parent = the new prefix node) is
    /// published, the parent's new children array is not.
    Split,
    /// Attaching a new leaf: parent locked and checked, leaf built, not
    /// yet in the parent's children.
    Attach,
    /// Adopting values into an existing node: both locked, new image not
    /// yet published.
    Adopt,
    /// Evicting a leaf's residency: claimed by CAS, its values still in
    /// its image.
    Evict,
    /// Unlinking a node with nothing left: marked obsolete, still in its
    /// parent's children.
    Unlink,
    /// Taking one block out (`evict_from`, `evict_from_place`): the node
    /// that starts at its page found (no lock held), not yet evicted.
    Located,
    /// Taking a subtree out of a tier (`evict_from`, `evict_from_place`):
    /// its nodes gathered (no lock held), none evicted yet.
    Gathered,
}

impl Point {
    fn code(self) -> u8 {
        match self {
            Point::Split => 1,
            Point::Attach => 2,
            Point::Adopt => 3,
            Point::Evict => 4,
            Point::Unlink => 5,
            Point::Located => 6,
            Point::Gathered => 7,
        }
    }
}

/// The armed point's code (0: none): the one check on a writer's path
/// when nothing is armed.
static ARMED: AtomicU8 = AtomicU8::new(0);
/// Parent-link climbs by readers (see the tree's `climb_to`).
static CLIMBS: AtomicU64 = AtomicU64::new(0);

#[derive(Default)]
struct State {
    parked: bool,
    released: bool,
    /// Panic at the point instead of parking.
    panic: bool,
}

static STATE: Mutex<State> = Mutex::new(State {
    parked: false,
    released: false,
    panic: false,
});
static WAKE: Condvar = Condvar::new();

fn state() -> std::sync::MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(|p| p.into_inner())
}

/// A pause point armed by a test. One at a time per process (tests that
/// arm one should not run concurrently with each other); dropping it
/// releases a parked writer and disarms.
#[derive(Debug)]
pub struct Gate {
    point: Point,
}

impl Gate {
    /// Arms `point`: the next thread to reach it parks there.
    pub fn arm(point: Point) -> Gate {
        *state() = State::default();
        ARMED.store(point.code(), Ordering::SeqCst);
        Gate { point }
    }

    /// Arms `point` to panic instead: the next thread to reach it panics
    /// there, inside the change, holding its locks (for tests that a panic
    /// mid-change leaks nothing).
    pub fn arm_panic(point: Point) -> Gate {
        *state() = State {
            panic: true,
            ..State::default()
        };
        ARMED.store(point.code(), Ordering::SeqCst);
        Gate { point }
    }

    /// The armed point.
    pub fn point(&self) -> Point {
        self.point
    }

    /// Waits until a writer is parked at the point, at most `timeout`;
    /// whether one is.
    pub fn wait_parked(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut s = state();
        while !s.parked {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            s = WAKE
                .wait_timeout(s, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        true
    }

    /// Lets the parked writer (if any) go on, and disarms.
    pub fn release(&self) {
        ARMED.store(0, Ordering::SeqCst);
        state().released = true;
        WAKE.notify_all();
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.release();
    }
}

/// Parent-link climbs readers have made so far (process-wide).
pub fn climbs() -> u64 {
    CLIMBS.load(Ordering::SeqCst)
}

/// Called by a writer at `point`: parks if that point is armed (the first
/// thread to arrive disarms it, so only one writer parks).
pub(crate) fn at(point: Point) {
    if ARMED.load(Ordering::SeqCst) != point.code() {
        return;
    }
    if ARMED
        .compare_exchange(point.code(), 0, Ordering::SeqCst, Ordering::SeqCst)
        .is_err()
    {
        return;
    }
    let mut s = state();
    if s.panic {
        s.parked = true;
        drop(s);
        WAKE.notify_all();
        panic!("injected panic at pause point {point:?}");
    }
    s.parked = true;
    WAKE.notify_all();
    while !s.released {
        s = WAKE.wait(s).unwrap_or_else(|p| p.into_inner());
    }
}

/// Called by a reader on each parent-link climb: a counter, no lock.
pub(crate) fn climbed() {
    CLIMBS.fetch_add(1, Ordering::Relaxed);
}
