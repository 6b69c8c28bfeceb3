//! Dynamo's indexes, driven through their public API.
//!
//! `ConcurrentRadixTreeCompressed` (CRTC) and `PositionalIndexer` apply
//! events only inside `SyncIndexer::worker`, the loop one of Dynamo's event
//! threads runs. A [`Lane`] is that loop on a thread of its own, fed
//! `EventWithAck` tasks a batch at a time, so events are applied back to
//! back on one thread ("applied directly": no hand-off between events). Each
//! event is timed without entering Dynamo's code: every ack's receiver was
//! polled with a waker beforehand, so the loop's `resp.send` calls the waker
//! synchronously, on the lane's thread, right after the event was applied.
//! The waker runs the batch's hook, which records the time and may run
//! queries before the next event (the mixed phases).

use crate::measure::{hist, record};
use dynamo_kv_router::indexer::{SyncIndexer, WorkerTask};
use dynamo_kv_router::protocols::{
    compute_block_hash_for_seq, compute_seq_hash_for_block, BlockHashOptions,
    ExternalSequenceBlockHash, KvCacheEvent, KvCacheEventData, KvCacheRemoveData, KvCacheStoreData,
    KvCacheStoredBlockData, LocalBlockHash, OverlapScores, RouterEvent, WorkerWithDpRank,
};
use hdrhistogram::Histogram;
use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::Mutex;
use std::task::{Context, Wake, Waker};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// Dynamo's block hashes of `tokens` (whole blocks of `block_size`): its
/// local (tokens) hashes, with no LoRA or namespace salt.
pub fn local_hashes(tokens: &[u32], block_size: u32) -> Vec<LocalBlockHash> {
    compute_block_hash_for_seq(tokens, block_size, BlockHashOptions::default())
}

/// Dynamo's chained sequence hashes (the external block ids) of `local`.
pub fn sequence_hashes(local: &[LocalBlockHash]) -> Vec<u64> {
    compute_seq_hash_for_block(local)
}

/// A `BlockStored` event of a request's full key on `worker`, from the root
/// (no parent), as an engine publishes a prefill.
pub fn stored(worker: usize, id: u64, local: &[LocalBlockHash], seq: &[u64]) -> RouterEvent {
    let blocks = local
        .iter()
        .zip(seq)
        .map(|(l, s)| KvCacheStoredBlockData {
            block_hash: ExternalSequenceBlockHash(*s),
            tokens_hash: *l,
            mm_extra_info: None,
        })
        .collect();
    RouterEvent::new(
        worker as u64,
        KvCacheEvent {
            event_id: id,
            data: KvCacheEventData::Stored(KvCacheStoreData {
                parent_hash: None,
                start_position: Some(0),
                blocks,
            }),
            dp_rank: 0,
        },
    )
}

/// A `BlockRemoved` event of `hashes` on `worker`.
pub fn removed(worker: usize, id: u64, hashes: Vec<u64>) -> RouterEvent {
    RouterEvent::new(
        worker as u64,
        KvCacheEvent {
            event_id: id,
            data: KvCacheEventData::Removed(KvCacheRemoveData {
                block_hashes: hashes.into_iter().map(ExternalSequenceBlockHash).collect(),
            }),
            dp_rank: 0,
        },
    )
}

/// Blocks matched per worker (index = worker), from Dynamo's scores.
pub fn per_worker(scores: &OverlapScores, workers: usize) -> Vec<usize> {
    (0..workers)
        .map(|w| {
            scores
                .scores
                .get(&WorkerWithDpRank::new(w as u64, 0))
                .copied()
                .unwrap_or(0) as usize
        })
        .collect()
}

type Hook = Box<dyn FnMut()>;

thread_local! {
    static HOOK: RefCell<Option<Hook>> = const { RefCell::new(None) };
}

struct AckWaker;

impl Wake for AckWaker {
    fn wake(self: Arc<Self>) {
        on_ack();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        on_ack();
    }
}

fn on_ack() {
    HOOK.with(|h| {
        if let Some(f) = h.borrow_mut().as_mut() {
            f();
        }
    });
}

/// Tasks for [`drive`]: each event with an ack whose receiver is already
/// registered with the timing waker. Keep the receivers alive until the
/// drive returns (a dropped receiver makes the ack silent).
pub struct AckedTasks {
    waker: Waker,
    /// The receivers, alive for as long as this value.
    pub receivers: Vec<oneshot::Receiver<bool>>,
}

impl Default for AckedTasks {
    fn default() -> Self {
        AckedTasks {
            waker: Waker::from(Arc::new(AckWaker)),
            receivers: Vec::new(),
        }
    }
}

impl AckedTasks {
    /// `event` as a task whose application calls the hook.
    pub fn task(&mut self, event: RouterEvent) -> WorkerTask {
        let (tx, mut rx) = oneshot::channel();
        let mut cx = Context::from_waker(&self.waker);
        // Pending (nothing sent yet): this registers the waker.
        let _ = Pin::new(&mut rx).poll(&mut cx);
        self.receivers.push(rx);
        WorkerTask::EventWithAck { event, resp: tx }
    }
}

/// One of Dynamo's event threads: `SyncIndexer::worker` running for the
/// lane's lifetime on its own thread, so its per-thread state (CRTC's worker
/// lookups, the positional indexer's block maps) persists across phases as
/// it does in Dynamo. [`Lane::run`] hands it a whole batch at once and waits:
/// events are applied back to back from a non-empty channel, as an event
/// thread does under load, and each is timed on the lane's thread.
pub struct Lane {
    tx: Option<flume::Sender<WorkerTask>>,
    slot: Slot,
    thread: Option<std::thread::JoinHandle<()>>,
}

type Slot = Arc<Mutex<Option<Box<dyn FnMut() + Send>>>>;

/// What one batch measured.
pub struct Batch {
    /// Per-event latency (ack to ack).
    pub store: Histogram<u64>,
    /// Whatever the hook recorded.
    pub query: Histogram<u64>,
    /// From the first event's start to the last event's ack.
    pub wall: Duration,
}

/// Runs after each event of a batch: `None` once before the first, then
/// `Some(i)` after event `i`; may run and time work of its own (queries).
pub type BatchHook = Box<dyn FnMut(Option<usize>, &mut Histogram<u64>) + Send>;

impl Lane {
    /// Starts the event thread of `index`; `capacity` bounds its channel
    /// (`None`: unbounded).
    pub fn new<I: SyncIndexer>(index: Arc<I>, capacity: Option<usize>) -> Lane {
        let (tx, rx) = match capacity {
            Some(c) => flume::bounded(c),
            None => flume::unbounded(),
        };
        let slot: Slot = Arc::new(Mutex::new(None));
        let s = Arc::clone(&slot);
        let thread = std::thread::spawn(move || {
            HOOK.with(|h| {
                *h.borrow_mut() = Some(Box::new(move || {
                    if let Some(f) = s.lock().expect("lane hook").as_mut() {
                        f();
                    }
                }))
            });
            index.worker(rx, None).expect("dynamo event loop");
        });
        Lane {
            tx: Some(tx),
            slot,
            thread: Some(thread),
        }
    }

    fn send(&self, task: WorkerTask) {
        self.tx
            .as_ref()
            .expect("lane open")
            .send(task)
            .expect("lane alive");
    }

    /// Applies `events` in order and returns when the last is applied. A
    /// no-op event is applied first, so the first event's time does not
    /// include waking the lane's thread.
    pub fn run(&self, events: Vec<RouterEvent>, mut hook: BatchHook) -> Batch {
        let n = events.len();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<Batch>();
        let mut acks = AckedTasks::default();
        let mut tasks = Vec::with_capacity(n + 1);
        tasks.push(acks.task(removed(0, 0, Vec::new())));
        for e in events {
            tasks.push(acks.task(e));
        }
        let mut state: Option<(Histogram<u64>, Histogram<u64>, Instant, Instant)> = None;
        let mut i = 0usize;
        let mut done = Some(done_tx);
        *self.slot.lock().expect("lane hook") = Some(Box::new(move || {
            let now = Instant::now();
            match state.as_mut() {
                None => {
                    let mut q = hist();
                    hook(None, &mut q);
                    state = Some((hist(), q, now, Instant::now()));
                }
                Some((h, q, _, last)) => {
                    record(h, now - *last);
                    hook(Some(i), q);
                    i += 1;
                    *last = Instant::now();
                }
            }
            if i == n {
                if let (Some((h, q, start, _)), Some(tx)) = (state.take(), done.take()) {
                    let _ = tx.send(Batch {
                        store: h,
                        query: q,
                        wall: start.elapsed(),
                    });
                }
            }
        }));
        for t in tasks {
            self.send(t);
        }
        let batch = done_rx.recv().expect("batch done");
        *self.slot.lock().expect("lane hook") = None;
        drop(acks);
        batch
    }

    /// Applies `events` without timing them (plain events; the channel's
    /// bound keeps the backlog small) and returns when all are applied.
    pub fn feed(&self, events: impl Iterator<Item = RouterEvent>) {
        for e in events {
            self.send(WorkerTask::Event(e));
        }
        self.run(Vec::new(), Box::new(|_, _| {}));
    }
}

impl Drop for Lane {
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
