//! Where unlinked objects wait for their grace period, and who frees them.
//!
//! crossbeam-epoch runs deferred functions inside `pin()` on whichever thread
//! happens to collect: with plain `defer_destroy`, a scheduler matching a
//! prompt would free the nodes, images and arrays that the evictor just
//! unlinked, and its match latency would carry the evictor's work. Instead,
//! each structural change gathers what it unlinked into one [`Retired`]
//! batch and defers only a cheap hand-over: once the grace period has passed
//! the batch is pushed onto the tree's [`Reclaimer`] queue, and the evictor
//! (or an insert, once the queue is long) frees it.
//!
//! The hand-over takes no lock: it runs inside crossbeam-epoch's
//! collection, which any `pin()` may trigger (a `peek` included), so it is
//! one push onto a lock-free queue (crossbeam's `SegQueue`). Under loom the
//! queue is a std mutex instead, as for the leaf inbox: loom cannot see the
//! queue's own synchronization, and the queue only moves ownership of
//! objects whose grace period is over. It is part of no protocol that the
//! loom models check (the grace period itself is crossbeam-epoch's, which
//! loom does check); its counter is std's, not the `sync` shim's, for the
//! same reason.
//!
//! | atomic | ordering | why |
//! | --- | --- | --- |
//! | the grace period | crossbeam-epoch's | a batch is handed over only from a function deferred past every guard pinned when it was retired |
//! | `queue`, `spare` | the queues' own | they move ownership of batches and buffers whose objects no reader can reach any more |
//! | `pending`, `handed_over` | Relaxed | hints: when an insert should free a share, whether collection still progresses; no memory is published through them |
//! | the staging shard mutexes | a lock | ownership of staged batches |

use crossbeam_epoch::{Guard, Owned, Pointable, Pointer, Shared};
use crossbeam_utils::CachePadded;
use smallvec::SmallVec;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// One unlinked object, type-erased: its address and the function that
/// frees an object of its type at that address. The reclaimer names no
/// type of the tree, so nothing here imports back from the nodes, the
/// namespace table or the children it frees.
struct Garbage {
    addr: usize,
    /// # Safety
    /// Called once, with `addr`, after the grace period: see [`Retired`].
    free: unsafe fn(usize),
}

/// Frees what an `Owned<T>` published at `addr` (crossbeam's own API:
/// `Owned::from_usize` takes back the address `into_shared` gave out).
///
/// # Safety
/// `addr` came from an `Owned<T>` published into an `Atomic<T>`, is
/// unreachable from every object a reader can still load, and is freed
/// nowhere else.
unsafe fn free_owned<T: ?Sized + Pointable>(addr: usize) {
    // SAFETY: the caller's contract.
    drop(unsafe { Owned::<T>::from_usize(addr) });
}

/// Releases a strong reference taken with `Arc::into_raw` at `addr` (the
/// `sync` shim's `Arc`, as `Link::new` took it).
///
/// # Safety
/// `addr` is such a pointer and this releases its count exactly once.
unsafe fn release_strong<T>(addr: usize) {
    // SAFETY: the caller's contract.
    drop(unsafe { crate::sync::Arc::from_raw(addr as *const T) });
}

/// Objects unlinked by one structural change: a few, kept inline (an
/// insert below a flat array retires the array, an eviction an image, a
/// node and perhaps an array), so gathering them allocates nothing.
#[derive(Default)]
pub(crate) struct Retired {
    items: SmallVec<[Garbage; 4]>,
    /// Set once the grace period has passed; until then dropping frees
    /// nothing (a panic mid-change leaks rather than frees too early).
    expired: bool,
}

// SAFETY: the addresses are of objects no thread can reach any more
// (each was retired only after it became unreachable), of `Send` types
// (the bounds of the methods that gather them); they are only freed, after
// the grace period, by whichever thread holds the batch.
unsafe impl Send for Retired {}

impl Retired {
    /// An object that was just replaced or removed in an `Atomic` (an
    /// image, a children array, a namespace entry or slot array): freed
    /// as the `Owned` it was published from. A null pointer is nothing.
    ///
    /// # Safety
    /// `old` was published from an `Owned<T>`, is unreachable from every
    /// object a reader can still load (it was just swapped out, under the
    /// lock that serializes its writers), and is retired nowhere else.
    pub(crate) unsafe fn owned<T: ?Sized + Pointable + Send>(&mut self, old: Shared<'_, T>) {
        if !old.is_null() {
            self.items.push(Garbage {
                addr: old.with_tag(0).into_usize(),
                free: free_owned::<T>,
            });
        }
    }

    /// A strong reference (`Arc::into_raw`) that a structure just gave up:
    /// the tree's reference to a node it unlinked.
    ///
    /// # Safety
    /// `p` came from `Arc::into_raw`, this batch now owns that count (it
    /// is released nowhere else), and the object is unreachable from every
    /// structure a reader can still load.
    pub(crate) unsafe fn strong<T: Send + Sync>(&mut self, p: *const T) {
        self.items.push(Garbage {
            addr: p as usize,
            free: release_strong::<T>,
        });
    }

    fn len(&self) -> usize {
        self.items.len()
    }
}

impl Drop for Retired {
    fn drop(&mut self) {
        if !self.expired {
            return;
        }
        for g in self.items.drain(..) {
            // SAFETY: each object was unreachable when it was retired
            // (`owned`, `strong`), is in this batch alone, and the grace
            // period of every reader that could hold it has passed
            // (`expired`): this is its only release.
            unsafe { (g.free)(g.addr) };
        }
    }
}

/// Staged batches are deferred together once a shard holds this many (one
/// deferred function, one `Arc` clone and one count update for all of
/// them: deferred functions run inside whichever thread pins next, often a
/// reader, which then paid for every single change's hand-over). Eight:
/// a stage's buffer (about 80 bytes a batch) must be allocated while
/// earlier stages wait out their grace period, and during a large
/// eviction that allocation is where the allocator sorts what was just
/// freed; at 32 (2.5 KiB) it took a quarter of a W1 10 % eviction (peer
/// bench, same hour: 16.5–17.9 ms at 32, 12.9–13.4 ms at 8), while the
/// match latency during background eviction stayed within the noise
/// (`benches/latency.rs`, p99.9 during ÷ idle at most 1.72 at 8, 1.49 at
/// 32). Under loom, batches are deferred one by one, as the models expect.
#[cfg(not(loom))]
const STAGE: usize = 8;
#[cfg(loom)]
const STAGE: usize = 1;
/// Staging shards (threads are spread over them).
const SHARDS: usize = 16;
/// Spare stage buffers kept at most.
#[cfg(not(loom))]
const SPARE: usize = 2 * SHARDS;

pub(crate) struct Reclaimer {
    #[cfg(not(loom))]
    queue: crossbeam_queue::SegQueue<Retired>,
    #[cfg(loom)]
    queue: std::sync::Mutex<Vec<Retired>>,
    /// Batches retired but not yet deferred, by thread shard. A batch waits
    /// here at most until `STAGE` batches gathered in its shard or the next
    /// `reclaim`: deferring later only lengthens its grace period. A std
    /// mutex, as for the queue: it only moves ownership and is part of no
    /// protocol the loom models check (under loom it holds one batch for no
    /// time at all).
    staging: Box<[CachePadded<std::sync::Mutex<Vec<Retired>>>]>,
    /// Empty stage buffers, each with room for a whole stage, handed back
    /// by hand-overs for the next stages to fill, so that a steady stream
    /// of changes allocates no buffer at all (see `STAGE` for what one
    /// allocation per stage cost).
    /// Lock-free (hand-overs return buffers, see the module docs), bounded;
    /// under loom a std mutex, as for the queue.
    #[cfg(not(loom))]
    spare: crossbeam_queue::ArrayQueue<Vec<Retired>>,
    #[cfg(loom)]
    spare: std::sync::Mutex<Vec<Vec<Retired>>>,
    pending: AtomicUsize,
    /// Batches handed over so far (to tell whether collection progresses).
    handed_over: AtomicUsize,
}

impl Default for Reclaimer {
    fn default() -> Self {
        Reclaimer {
            queue: Default::default(),
            staging: (0..SHARDS).map(|_| CachePadded::default()).collect(),
            #[cfg(not(loom))]
            spare: crossbeam_queue::ArrayQueue::new(SPARE),
            #[cfg(loom)]
            spare: std::sync::Mutex::new(Vec::new()),
            pending: AtomicUsize::new(0),
            handed_over: AtomicUsize::new(0),
        }
    }
}

impl Drop for Reclaimer {
    fn drop(&mut self) {
        // The last reference goes after the tree itself (which holds one)
        // and after every deferred hand-over ran: no reader can reach what
        // a staged batch holds any more, so it is freed now.
        for shard in self.staging.iter_mut() {
            let staged = match shard.get_mut() {
                Ok(v) => std::mem::take(v),
                Err(p) => std::mem::take(p.into_inner()),
            };
            for mut batch in staged {
                batch.expired = true;
                drop(batch);
            }
        }
    }
}

/// This thread's staging shard.
fn shard() -> usize {
    use std::cell::Cell;
    use std::sync::atomic::AtomicUsize as StdCounter;
    static NEXT: StdCounter = StdCounter::new(0);
    thread_local! {
        static MINE: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    MINE.with(|m| {
        if m.get() == usize::MAX {
            m.set(NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS);
        }
        m.get()
    })
}

/// Locks one of the std mutexes here (staging, and under loom the queue
/// and the spare buffers), poisoning ignored: they only move ownership.
fn lock_vec<T>(m: &std::sync::Mutex<Vec<T>>) -> std::sync::MutexGuard<'_, Vec<T>> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

impl std::fmt::Debug for Reclaimer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reclaimer")
            .field("pending", &self.pending())
            .finish()
    }
}

impl Reclaimer {
    /// Hands `batch` over once every thread pinned now has unpinned (staged
    /// with others first: see `STAGE`).
    pub(crate) fn retire(self: &Arc<Self>, batch: Retired, guard: &Guard) {
        if batch.len() == 0 {
            return;
        }
        let full = {
            let mut staged = lock_vec(&self.staging[shard()]);
            if staged.capacity() == 0 {
                *staged = self.stage_buffer();
            }
            staged.push(batch);
            (staged.len() >= STAGE).then(|| std::mem::take(&mut *staged))
        };
        if let Some(batches) = full {
            self.defer_hand_over(batches, guard);
        }
    }

    /// Defers the hand-over of `batches` past the grace period of `guard`'s
    /// epoch (every batch was retired at or before it, so none is handed
    /// over early).
    fn defer_hand_over(self: &Arc<Self>, mut batches: Vec<Retired>, guard: &Guard) {
        let me = Arc::clone(self);
        guard.defer(move || {
            let mut objects = 0;
            for b in &mut batches {
                b.expired = true;
                objects += b.len();
            }
            // Relaxed: `pending` and `handed_over` are hints (when to
            // reclaim, whether collection progresses); the queue orders the
            // hand-over itself.
            me.pending.fetch_add(objects, Ordering::Relaxed);
            me.handed_over.fetch_add(1, Ordering::Relaxed);
            for b in batches.drain(..) {
                me.push(b);
            }
            me.return_buffer(batches);
        });
    }

    /// An empty buffer with room for a stage: a spare one if any.
    fn stage_buffer(&self) -> Vec<Retired> {
        #[cfg(not(loom))]
        let spare = self.spare.pop();
        #[cfg(loom)]
        let spare = lock_vec(&self.spare).pop();
        spare.unwrap_or_else(|| Vec::with_capacity(STAGE))
    }

    /// Keeps an emptied stage buffer for a later stage (`SPARE` at most;
    /// the rest are freed).
    fn return_buffer(&self, buffer: Vec<Retired>) {
        debug_assert!(buffer.is_empty());
        if buffer.capacity() < STAGE {
            return;
        }
        #[cfg(not(loom))]
        drop(self.spare.push(buffer));
        #[cfg(loom)]
        lock_vec(&self.spare).push(buffer);
    }

    /// Defers every staged batch now (before a reclaim that should see them).
    pub(crate) fn flush_staged(self: &Arc<Self>) {
        let guard = crossbeam_epoch::pin();
        for shard in self.staging.iter() {
            let batches = {
                let mut staged = lock_vec(shard);
                (!staged.is_empty()).then(|| std::mem::take(&mut *staged))
            };
            if let Some(batches) = batches {
                self.defer_hand_over(batches, &guard);
            }
        }
    }

    /// The hand-over: lock-free (see the module docs).
    fn push(&self, batch: Retired) {
        #[cfg(not(loom))]
        self.queue.push(batch);
        #[cfg(loom)]
        lock_vec(&self.queue).push(batch);
    }

    /// Takes one batch handed over, if any.
    fn pop(&self) -> Option<Retired> {
        #[cfg(not(loom))]
        return self.queue.pop();
        #[cfg(loom)]
        return lock_vec(&self.queue).pop();
    }

    /// Objects waiting to be freed.
    pub(crate) fn pending(&self) -> usize {
        self.pending.load(Ordering::Relaxed)
    }

    /// Frees handed-over batches until at least `budget` objects were freed
    /// (or none is left): the bounded share an insert takes on, so that no
    /// single operation frees thousands of objects inline.
    pub(crate) fn reclaim_some(&self, budget: usize) {
        let mut freed = 0;
        while freed < budget {
            let Some(batch) = self.pop() else {
                break;
            };
            let n = batch.len();
            self.pending.fetch_sub(n, Ordering::Relaxed);
            drop(batch);
            freed += n;
        }
    }

    /// Frees every batch whose grace period has passed and was handed over.
    pub(crate) fn reclaim(&self) {
        self.reclaim_some(usize::MAX);
    }

    /// Like [`reclaim`](Self::reclaim), after first letting crossbeam-epoch
    /// advance and run the hand-overs whose grace period is over: pins and
    /// flushes this thread until no further batch arrives (a pinned reader
    /// elsewhere holds the epoch back; then this stops, it never waits).
    /// For an explicit `RadixCache::reclaim`, not for hot paths.
    pub(crate) fn reclaim_all(self: &Arc<Self>) {
        self.flush_staged();
        #[cfg(not(loom))]
        {
            // The epoch must advance twice past a retirement before its
            // function runs, and each flush collects a bounded number of
            // bags (crossbeam's own garbage too, which hands nothing over):
            // flush at least 32 times, then until 16 in a row hand nothing
            // over (a few microseconds when there is nothing left).
            let mut idle = 0;
            for i in 0..(1 << 16) {
                let before = self.handed_over.load(Ordering::Relaxed);
                crossbeam_epoch::pin().flush();
                if self.handed_over.load(Ordering::Relaxed) == before {
                    idle += 1;
                    if idle >= 16 && i >= 32 {
                        break;
                    }
                } else {
                    idle = 0;
                }
            }
        }
        self.reclaim();
    }
}
