//! Following one source's KV-event socket ([`listen`]): a SUB socket on its
//! PUB endpoint (reconnected by the socket itself after the publisher
//! goes), each batch decoded and offered to the source's [`Feed`], applied
//! to the index in sequence; a gap filled from the source's replay endpoint
//! (the ROUTER protocol vLLM, SGLang and radixkv share), or, with none or a
//! replay that cannot give every missing batch, the source cleared and
//! stale until its next `AllBlocksCleared`.
//!
//! A message that is not three frames, or whose payload is not a batch, is
//! counted and ignored (its sequence is not consumed: were it a real batch,
//! the next one shows the gap and the replay brings it).
//!
//! Between the socket and the index is a bounded queue
//! ([`ListenOptions::queue`]): one task reads the socket into it, another
//! applies. A batch that finds it full is counted ([`SourceCounters::overflow`])
//! and dropped, which the next batch shows as a gap, replayed as any other:
//! a flood costs neither unbounded memory nor a blocked publisher.
//!
//! Once subscribed, the listener asks the replay endpoint (when it has
//! one) for every batch it buffers, from sequence 0, and applies them in
//! order: a worker followed from the middle of its life is known at once,
//! not at its next batch (which would show the gap and bring the same
//! replay), and one that stays quiet is known at all. A buffer that no
//! longer reaches back to sequence 0 is a gap that cannot be filled, as
//! when the next batch shows it: the source is cleared and stale until
//! its next `AllBlocksCleared`.
//!
//! The socket reconnects by itself after the publisher goes (a restart, a
//! broken connection). Whatever was published meanwhile is lost to it, and
//! a publisher that restarts, sends its few batches and falls quiet would
//! never show a gap. So on each reconnection too the listener asks the
//! replay endpoint for every batch it still buffers, from sequence 0, and
//! offers them in order: those already applied are dropped, a restarted
//! publisher's clearing and batches are applied, and a buffer that no
//! longer reaches back to what is missing is a lost gap.
//! The reconnection may come before a restarted publisher has sent its
//! first batches: if the next live batch does not continue the stream
//! followed so far, the listener catches up once more. (A restarted vLLM or
//! SGLang numbers from 0 again, below what was followed: without this, its
//! batches would look like duplicates when its clearing was missed.)

use crate::decode::{decode_batch, Event};
use crate::feed::{Feed, Step};
use crate::index::{KvIndex, Source};
use radixkv_events::subscriber::{KvEventSubscriber, Replay, SubscribeError};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Where one source publishes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Feedpoint {
    /// Whose events these are.
    pub source: Source,
    /// Its PUB endpoint, `tcp://HOST:PORT`.
    pub endpoint: String,
    /// Its replay (ROUTER) endpoint, if it has one.
    pub replay: Option<String>,
    /// The topic to subscribe to (empty: every message).
    pub topic: String,
}

/// How a listener buffers and recovers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ListenOptions {
    /// Batches read from the socket and not yet applied, at most.
    pub queue: usize,
    /// How long a replay may take before the gap counts as lost.
    pub replay_timeout: Duration,
}

impl Default for ListenOptions {
    /// 4,096 batches; 5 s.
    fn default() -> Self {
        ListenOptions {
            queue: 4096,
            replay_timeout: Duration::from_secs(5),
        }
    }
}

/// A source's live counters, read by the service's metrics.
#[derive(Debug, Default)]
pub struct SourceCounters {
    /// Batches received (live and replayed).
    pub batches: AtomicU64,
    /// Batches read from the PUB socket (live), queued or dropped.
    pub live_batches: AtomicU64,
    /// Events applied.
    pub events: AtomicU64,
    /// Events that could not be decoded or applied.
    pub skipped_events: AtomicU64,
    /// Messages that were not batches.
    pub junk: AtomicU64,
    /// Batches dropped because the queue was full (each shows as a gap).
    pub overflow: AtomicU64,
    /// Failed attempts to connect to the endpoint.
    pub connect_failures: AtomicU64,
    /// Whether the socket is subscribed (it reconnects by itself after).
    pub subscribed: std::sync::atomic::AtomicBool,
    /// Times the socket connected again after its first connection.
    pub reconnects: AtomicU64,
    /// The causes of trouble already logged (each is logged once).
    logged: Mutex<std::collections::HashSet<&'static str>>,
    /// Milliseconds since the epoch at the last batch (0: none yet).
    pub last_batch_ms: AtomicU64,
    /// The feed's own counts (gaps, recoveries, restarts, …).
    pub feed: Mutex<crate::feed::FeedStats>,
    /// Whether the source is stale now.
    pub stale: std::sync::atomic::AtomicBool,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Aborts the task when dropped (the reader goes with its listener).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Follows `fp`'s socket into `index` forever (abort the task to stop):
/// see the module docs. `counters` says what it did.
pub async fn listen(
    index: Arc<KvIndex>,
    fp: Feedpoint,
    counters: Arc<SourceCounters>,
    options: ListenOptions,
) {
    let sub = loop {
        match KvEventSubscriber::connect(&fp.endpoint, &fp.topic).await {
            Ok(s) => break s,
            // Nobody listening there yet (or a malformed endpoint, which
            // the service refuses before it starts a listener): retry.
            Err(e) => {
                counters.note(
                    fp.source,
                    "cannot connect",
                    format!("{}: {e}; retrying", fp.endpoint),
                );
                // Relaxed: a statistic.
                counters.connect_failures.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    // Relaxed: a status flag read by the health check; nothing is
    // published through it.
    counters.subscribed.store(true, Ordering::Relaxed);
    let mut sub = sub;
    let (tx, mut rx) = tokio::sync::mpsc::channel(options.queue.max(1));
    let _watcher = sub.reconnections().map(|mut r| {
        let tx = tx.clone();
        AbortOnDrop(tokio::spawn(async move {
            // Waits for room: a reconnection is never dropped.
            while r.next().await && tx.send(Item::Reconnected).await.is_ok() {}
        }))
    });
    let _reader = AbortOnDrop(tokio::spawn(read(
        sub,
        tx,
        Arc::clone(&counters),
        fp.source,
    )));
    let mut feed = Feed::new();
    // What the source did before this subscription (the reader queues
    // what it sends meanwhile).
    catch_up(&index, &fp, &counters, &mut feed, &options).await;
    // Set by a reconnection until the next live batch.
    let mut resync = false;
    while let Some(item) = rx.recv().await {
        match item {
            Item::Batch(b) => {
                if std::mem::take(&mut resync) && feed.expected() != Some(b.seq) {
                    // Not the continuation of the stream followed so far:
                    // a restarted publisher whose first batches (its
                    // clearing among them) went out before the socket
                    // reconnected, and after the catch-up's replay.
                    catch_up(&index, &fp, &counters, &mut feed, &options).await;
                }
                offer(&index, &fp, &counters, &mut feed, &options, b).await;
            }
            Item::Reconnected => {
                // Relaxed: a statistic.
                counters.reconnects.fetch_add(1, Ordering::Relaxed);
                catch_up(&index, &fp, &counters, &mut feed, &options).await;
                resync = true;
            }
        }
    }
}

/// What the reader and the reconnection watcher queue for the applier.
#[derive(Debug)]
enum Item {
    Batch(radixkv_events::subscriber::Batch),
    Reconnected,
}

/// After the subscription and after each reconnection: every batch the
/// replay endpoint still buffers, offered in order (see the module docs).
/// Without a replay endpoint, nothing to do: the next batch shows any gap.
async fn catch_up(
    index: &KvIndex,
    fp: &Feedpoint,
    counters: &SourceCounters,
    feed: &mut Feed,
    options: &ListenOptions,
) {
    let Some(ep) = &fp.replay else {
        return;
    };
    // Offered as they arrive (one batch held at a time); no answer in
    // time, or the rest of it not in time: the next live batch shows the
    // gap, if any.
    let deadline = tokio::time::Instant::now() + options.replay_timeout;
    let Ok(Ok(mut r)) = tokio::time::timeout_at(deadline, Replay::start(ep, 0)).await else {
        return;
    };
    while let Ok(Ok(Some(b))) = tokio::time::timeout_at(deadline, r.next()).await {
        offer(index, fp, counters, feed, options, b).await;
    }
}

/// Reads the socket into the queue; a batch that finds it full is counted
/// and dropped.
async fn read(
    mut sub: KvEventSubscriber,
    tx: tokio::sync::mpsc::Sender<Item>,
    counters: Arc<SourceCounters>,
    source: Source,
) {
    loop {
        match sub.recv().await {
            Ok(b) => {
                // Relaxed: a statistic.
                counters.live_batches.fetch_add(1, Ordering::Relaxed);
                match tx.try_send(Item::Batch(b)) {
                    Ok(()) => {}
                    Err(tokio::sync::mpsc::error::TrySendError::Full(_)) => {
                        counters.note(
                            source,
                            "queue full",
                            "a batch dropped, to be replayed as a gap",
                        );
                        // Relaxed: a statistic.
                        counters.overflow.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(tokio::sync::mpsc::error::TrySendError::Closed(_)) => return,
                }
            }
            Err(SubscribeError::Malformed(m)) => {
                counters.note(source, "not a KV-event message", m);
                // Relaxed: a statistic.
                counters.junk.fetch_add(1, Ordering::Relaxed);
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// Offers one batch (filling a gap before it, if any) and records the
/// feed's counts.
async fn offer(
    index: &KvIndex,
    fp: &Feedpoint,
    counters: &SourceCounters,
    feed: &mut Feed,
    options: &ListenOptions,
    b: radixkv_events::subscriber::Batch,
) {
    let seq = b.seq;
    let Some(batch) = decode(counters, fp.source, &b.payload) else {
        return;
    };
    let clears = matches!(batch.first(), Some(Event::Cleared));
    match feed.offer(seq, clears) {
        Step::Gap { from } => {
            if fill(index, fp, counters, feed, options, from, seq).await {
                let step = feed.offer(seq, clears);
                apply(index, fp.source, counters, step, &batch);
            } else {
                counters.note(
                    fp.source,
                    "a gap that could not be replayed",
                    format!("batches {from}..{seq} missing; cleared, stale until its next AllBlocksCleared"),
                );
                feed.lost();
                index.clear(fp.source);
            }
        }
        step => apply(index, fp.source, counters, step, &batch),
    }
    *counters.feed.lock().unwrap_or_else(|p| p.into_inner()) = feed.stats();
    // Relaxed: a statistic.
    counters.stale.store(feed.is_stale(), Ordering::Relaxed);
}

/// The events of `payload`, counting a payload that is not a batch as junk
/// and the events it could not read as skipped.
fn decode(counters: &SourceCounters, source: Source, payload: &[u8]) -> Option<Vec<Event>> {
    // Relaxed: statistics.
    counters.batches.fetch_add(1, Ordering::Relaxed);
    counters.last_batch_ms.store(now_ms(), Ordering::Relaxed);
    match decode_batch(payload) {
        Ok(b) => {
            if let Some((i, why)) = b.skipped.first() {
                counters.note(
                    source,
                    "an event it cannot read",
                    format!("event {i}: {why}"),
                );
            }
            counters
                .skipped_events
                .fetch_add(b.skipped.len() as u64, Ordering::Relaxed);
            Some(b.events)
        }
        Err(e) => {
            counters.note(source, "a payload that is not a batch", e);
            counters.junk.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

fn apply(index: &KvIndex, source: Source, counters: &SourceCounters, step: Step, events: &[Event]) {
    let Step::Apply { clear } = step else {
        return;
    };
    if clear {
        index.clear(source);
    }
    let (done, errors) = index.apply(source, events);
    for (i, e) in &errors {
        counters.note(source, e.cause(), format!("event {i}: {e}"));
    }
    // Relaxed: statistics.
    counters.events.fetch_add(done.events, Ordering::Relaxed);
    counters
        .skipped_events
        .fetch_add(errors.len() as u64, Ordering::Relaxed);
}

/// Fills the gap `[from, seq)` from the replay endpoint; `false` when it
/// cannot (no endpoint, no answer, or a replay that lacks batches): the
/// gap is lost.
async fn fill(
    index: &KvIndex,
    fp: &Feedpoint,
    counters: &SourceCounters,
    feed: &mut Feed,
    options: &ListenOptions,
    from: u64,
    seq: u64,
) -> bool {
    let Some(ep) = &fp.replay else {
        return false;
    };
    // Applied as they arrive (one batch held at a time), up to `seq`; a
    // replay that does not answer, or not in time, loses the gap (what it
    // applied is cleared with the source).
    let deadline = tokio::time::Instant::now() + options.replay_timeout;
    let Ok(Ok(mut r)) = tokio::time::timeout_at(deadline, Replay::start(ep, from)).await else {
        return false;
    };
    loop {
        let b = match tokio::time::timeout_at(deadline, r.next()).await {
            Ok(Ok(Some(b))) if b.seq < seq => b,
            Ok(Ok(_)) => break,
            Ok(Err(_)) | Err(_) => return false,
        };
        let Some(events) = decode(counters, fp.source, &b.payload) else {
            continue;
        };
        let clears = matches!(events.first(), Some(Event::Cleared));
        match feed.offer(b.seq, clears) {
            Step::Gap { .. } => {
                // The replay lacks batches too (its buffer no longer
                // reaches back).
                return false;
            }
            step => apply(index, fp.source, counters, step, &events),
        }
    }
    feed.expected() == Some(seq)
}

impl SourceCounters {
    /// Logs `detail` to stderr the first time `cause` occurs for `source`
    /// (later occurrences are only counted).
    pub fn note(&self, source: Source, cause: &'static str, detail: impl std::fmt::Display) {
        if self
            .logged
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(cause)
        {
            eprintln!(
                "radixkv index: worker {} rank {}: {cause}: {detail} (logged once; counted in the metrics)",
                source.worker, source.rank
            );
        }
    }

    /// The feed's counts now.
    pub fn feed_stats(&self) -> crate::feed::FeedStats {
        *self.feed.lock().unwrap_or_else(|p| p.into_inner())
    }
}
