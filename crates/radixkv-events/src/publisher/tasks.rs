//! The tokio tasks of one device's sockets: `publish_loop`, which takes the
//! device's queue, encodes it and sends it as one batch on the PUB socket
//! (keeping the replay buffer), and `replay_loop`, which answers replay
//! requests on the ROUTER socket.

use super::config::KvEventsConfig;
use super::queue::{lock, Changes, Kind};
use super::remembered::Remembered;
use super::shared::Shared;
use crate::wire::{BatchEncoder, EventRef};
use bytes::Bytes;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use zeromq::{SocketRecv, SocketSend, ZmqMessage};

fn frames(parts: Vec<Bytes>) -> ZmqMessage {
    // Never empty: every caller passes at least two frames.
    ZmqMessage::try_from(parts).unwrap_or_else(|_| ZmqMessage::from(Bytes::new()))
}

pub(super) fn unix_now() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

pub(super) async fn publish_loop(
    shared: Arc<Shared>,
    d: usize,
    mut socket: zeromq::PubSocket,
    cfg: KvEventsConfig,
    first_seq: u64,
) {
    let q = &shared.queues[d];
    let topic = Bytes::from(cfg.topic.clone().into_bytes());
    let mut seq = first_seq;
    let keep_replays = cfg.replay_endpoint.is_some() && cfg.replay_buffer > 0;
    // Counts `events` sent as `seq` and returns its three frames.
    let send = |payload: Vec<u8>, events: usize, seq: u64| {
        let payload = Bytes::from(payload);
        if keep_replays {
            let mut replay = lock(&q.replay);
            let (buf, bytes) = &mut *replay;
            *bytes += payload.len();
            buf.push_back((seq, payload.clone()));
            while buf.len() > cfg.replay_buffer.max(1)
                || (*bytes > cfg.replay_bytes && buf.len() > 1)
            {
                if let Some((_, old)) = buf.pop_front() {
                    *bytes -= old.len();
                }
            }
        }
        // Relaxed: statistics.
        q.counters.batches.fetch_add(1, Ordering::Relaxed);
        q.counters
            .events
            .fetch_add(events as u64, Ordering::Relaxed);
        q.counters.last_seq.store(seq, Ordering::Relaxed);
        frames(vec![
            topic.clone(),
            Bytes::copy_from_slice(&seq.to_be_bytes()),
            payload,
        ])
    };
    let rank = Some(d as u32);
    // The first event counts as queued, as every later one (flush compares).
    // Relaxed: a statistic.
    q.counters.queued.fetch_add(1, Ordering::Relaxed);
    let cleared = || {
        let mut b = BatchEncoder::new(unix_now().as_secs_f64(), cfg.encoding);
        b.push(EventRef::AllBlocksCleared);
        b.finish(rank)
    };
    let _ = socket.send(send(cleared(), 1, seq)).await;
    // Until the first change is sent, the clearing is sent again every
    // `ANNOUNCE_EVERY`, and the first batch of changes starts with it; no
    // change is sent before `startup_hold` has passed (changes wait in the
    // queue). A subscriber that stayed connected across a restart (ZeroMQ
    // reconnects it some time after the bind, too late for the first
    // message) thus sees the clearing before any other event of this run.
    let mut announcing = true;
    let mut announced = std::time::Instant::now();
    let hold_until = tokio::time::Instant::now() + cfg.startup_hold;
    let mut spare = Changes::default();
    let mut ids = Vec::new();
    let mut mem = Remembered::default();
    let mut idle = 0;
    loop {
        let closing = shared.closing.load(Ordering::SeqCst);
        if announcing && !closing && tokio::time::Instant::now() < hold_until {
            if announced.elapsed() >= ANNOUNCE_EVERY {
                // Relaxed: statistics, as for every batch.
                q.counters.queued.fetch_add(1, Ordering::Relaxed);
                seq += 1;
                let _ = socket.send(send(cleared(), 1, seq)).await;
                announced = std::time::Instant::now();
            }
            // Until the next announcement or the hold's end, whichever is
            // first; a shutdown ends the hold (its changes are sent).
            let next = tokio::time::Instant::from_std(announced + ANNOUNCE_EVERY).min(hold_until);
            let _ = tokio::time::timeout_at(next, q.notify.notified()).await;
            continue;
        }
        if !closing {
            // Let a burst gather into one batch, for at most max_delay.
            tokio::time::sleep(cfg.max_delay).await;
        }
        {
            let mut p = lock(&q.pending);
            std::mem::swap(&mut *p, &mut spare);
            // Under the lock (see `stats`). Relaxed: statistics, ordered by
            // the lock.
            q.counters.queued.fetch_add(spare.events, Ordering::Relaxed);
            q.counters
                .dropped
                .fetch_add(spare.dropped, Ordering::Relaxed);
        }
        if spare.heads.is_empty() {
            if closing {
                return;
            }
            if announcing && announced.elapsed() >= ANNOUNCE_EVERY {
                // Relaxed: statistics, as for every batch.
                q.counters.queued.fetch_add(1, Ordering::Relaxed);
                seq += 1;
                let _ = socket.send(send(cleared(), 1, seq)).await;
                announced = std::time::Instant::now();
            }
            idle += 1;
            if idle >= IDLE_TICKS || announcing {
                // Park: say so, then look once more (see `Shared::push`). A
                // wake-up that comes before the wait is kept by `Notify`.
                // While announcing, the wait ends at the next announcement.
                q.parked.store(true, Ordering::SeqCst);
                if lock(&q.pending).heads.is_empty() {
                    if announcing {
                        let left = ANNOUNCE_EVERY.saturating_sub(announced.elapsed());
                        let _ = tokio::time::timeout(left, q.notify.notified()).await;
                    } else {
                        q.notify.notified().await;
                    }
                }
                q.parked.store(false, Ordering::SeqCst);
                idle = 0;
            }
            continue;
        }
        idle = 0;
        // Event heads queued (those dropped at the push have none).
        let n = (spare.events - spare.dropped) as usize;
        // Room for the tokens (at most 5 bytes each) and the ids (9 each,
        // one per page).
        let pages = spare.tokens.len() / shared.page_size.max(1);
        let bytes = 64 + n * 96 + spare.tokens.len() * 5 + pages * 9;
        let mut b = BatchEncoder::with_capacity(unix_now().as_secs_f64(), cfg.encoding, bytes);
        // Events written, event heads that wrote none, and events beyond
        // one per head (a cleared cache's removals, counted as queued).
        let (mut sent, mut lost, mut extra, mut at) = (0, 0, 0, 0);
        if std::mem::take(&mut announcing) {
            b.push(EventRef::AllBlocksCleared);
            (sent, extra) = (1, 1);
        }
        for h in &spare.heads {
            // A store's pages follow the previous stores'.
            let pages = if h.kind == Kind::Stored {
                at += h.len as usize;
                &spare.tokens[at - h.len as usize..at]
            } else {
                &[]
            };
            let written = shared.encode(&mut b, (h, pages), &spare, &mut mem, &mut ids);
            if h.kind.is_event() {
                lost += usize::from(written == 0);
                extra += written.saturating_sub(1);
            }
            sent += written;
        }
        spare.clear();
        // Relaxed: statistics (`queued` first, so that `flush` never sees
        // more sent than queued).
        q.counters.queued.fetch_add(extra as u64, Ordering::Relaxed);
        q.counters.dropped.fetch_add(lost as u64, Ordering::Relaxed);
        q.counters
            .remembered
            .store(mem.nodes() as u64, Ordering::Relaxed);
        if sent > 0 {
            seq += 1;
            let msg = send(b.finish(rank), sent, seq);
            // PUB never blocks on a slow subscriber: it drops past the
            // high-water mark.
            let _ = socket.send(msg).await;
        }
        if closing {
            return;
        }
    }
}

/// Empty ticks (of `max_delay` each) before a socket's task parks.
const IDLE_TICKS: u32 = 16;

/// How often a socket repeats its first `AllBlocksCleared` until the first
/// change.
const ANNOUNCE_EVERY: Duration = Duration::from_millis(100);

/// Answers `[identity, "", start_seq]` with every buffered batch from
/// `start_seq` on, `[identity, "", seq, payload]` each, then the end marker
/// `[identity, "", -1, ""]` (vLLM's replay protocol).
pub(super) async fn replay_loop(shared: Arc<Shared>, d: usize, mut socket: zeromq::RouterSocket) {
    let q = &shared.queues[d];
    loop {
        let Ok(msg) = socket.recv().await else {
            return;
        };
        let parts = msg.into_vec();
        let (Some(identity), Some(last)) = (parts.first().cloned(), parts.last()) else {
            continue;
        };
        let Ok(start) = <[u8; 8]>::try_from(last.as_ref()) else {
            continue; // not a replay request
        };
        let start = u64::from_be_bytes(start);
        let batches: Vec<(u64, Bytes)> = lock(&q.replay)
            .0
            .iter()
            .filter(|(s, _)| *s >= start)
            .cloned()
            .collect();
        // Relaxed: a statistic.
        q.counters.replays.fetch_add(1, Ordering::Relaxed);
        for (s, payload) in batches {
            let m = frames(vec![
                identity.clone(),
                Bytes::new(),
                Bytes::copy_from_slice(&s.to_be_bytes()),
                payload,
            ]);
            if socket.send(m).await.is_err() {
                break;
            }
        }
        let end = frames(vec![
            identity,
            Bytes::new(),
            Bytes::copy_from_slice(&(-1i64).to_be_bytes()),
            Bytes::new(),
        ]);
        let _ = socket.send(end).await;
    }
}
