//! A publisher a test drives frame by frame ([`FramePublisher`], with the
//! cargo feature `testing`): a PUB socket and a replay ROUTER speaking the
//! protocol vLLM, SGLang and radixkv share, whose batches the test numbers
//! and sends (or only logs, as if dropped on the way), alongside junk.
//! For tests of subscribers and indexes: drops, duplicates, reordering,
//! late starts and restarts, on demand.

use crate::wire::{encode_batch, Encoding, KvEvent};
use bytes::Bytes;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use zeromq::{Socket, SocketRecv, SocketSend, ZmqMessage};

/// See the module docs.
pub struct FramePublisher {
    /// Its PUB endpoint.
    pub endpoint: String,
    /// Its replay (ROUTER) endpoint.
    pub replay: String,
    pub_: zeromq::PubSocket,
    /// Every batch it ever logged, by sequence (what its replay serves).
    log: Arc<Mutex<BTreeMap<u64, Bytes>>>,
    /// Held, the replay waits before it answers.
    pub gate: Arc<tokio::sync::Mutex<()>>,
    /// Replay requests answered in full.
    pub replays: Arc<std::sync::atomic::AtomicU64>,
    router: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for FramePublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FramePublisher")
            .field("endpoint", &self.endpoint)
            .field("replay", &self.replay)
            .finish()
    }
}

fn locked<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl FramePublisher {
    /// Binds the PUB socket on 127.0.0.1:`port` and the replay ROUTER on
    /// 127.0.0.1:`replay_port`. The replay answers in SGLang's form
    /// (`[id, "", topic, seq, payload]`, then the end marker).
    pub async fn bind(port: u16, replay_port: u16) -> Result<FramePublisher, zeromq::ZmqError> {
        let endpoint = format!("tcp://127.0.0.1:{port}");
        let replay = format!("tcp://127.0.0.1:{replay_port}");
        let mut pub_ = zeromq::PubSocket::new();
        pub_.bind(&endpoint).await?;
        let mut router = zeromq::RouterSocket::new();
        router.bind(&replay).await?;
        let log: Arc<Mutex<BTreeMap<u64, Bytes>>> = Arc::default();
        let served = Arc::clone(&log);
        let gate: Arc<tokio::sync::Mutex<()>> = Arc::default();
        let gated = Arc::clone(&gate);
        let replays: Arc<std::sync::atomic::AtomicU64> = Arc::default();
        let answered = Arc::clone(&replays);
        let router = tokio::spawn(async move {
            while let Ok(m) = router.recv().await {
                drop(gated.lock().await);
                let parts = m.into_vec();
                let (Some(id), Some(start)) = (parts.first().cloned(), parts.last()) else {
                    continue;
                };
                let Ok(start) = <[u8; 8]>::try_from(&start[..]) else {
                    continue;
                };
                let start = u64::from_be_bytes(start);
                let batches: Vec<(u64, Bytes)> = locked(&served)
                    .range(start..)
                    .map(|(s, p)| (*s, p.clone()))
                    .collect();
                let reply = |seq: Bytes, payload: Bytes| {
                    ZmqMessage::try_from(vec![id.clone(), Bytes::new(), Bytes::new(), seq, payload])
                };
                for (s, p) in batches {
                    let Ok(m) = reply(Bytes::copy_from_slice(&s.to_be_bytes()), p) else {
                        return;
                    };
                    if router.send(m).await.is_err() {
                        return;
                    }
                }
                let Ok(end) = reply(Bytes::copy_from_slice(&(-1i64).to_be_bytes()), Bytes::new())
                else {
                    return;
                };
                if router.send(end).await.is_err() {
                    return;
                }
                // SeqCst: a test reads it to order its next step after
                // this answer; nothing else is published through it.
                answered.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        });
        Ok(FramePublisher {
            endpoint,
            replay,
            pub_,
            log,
            gate,
            replays,
            router,
        })
    }

    /// A batch of `events` (map encoding, rank 0) as a payload.
    pub fn payload(events: &[KvEvent]) -> Bytes {
        Bytes::from(encode_batch(0.0, events, Some(0), Encoding::Map))
    }

    /// Logs batch `seq` (for replays) and, if `live`, sends it.
    pub async fn publish(&mut self, seq: u64, events: &[KvEvent], live: bool) {
        let p = Self::payload(events);
        locked(&self.log).insert(seq, p.clone());
        if live {
            self.raw(vec![
                Bytes::new(),
                Bytes::copy_from_slice(&seq.to_be_bytes()),
                p,
            ])
            .await;
        }
    }

    /// Logs `payload` as batch `seq` (for replays) without sending it.
    pub fn log_payload(&self, seq: u64, payload: Bytes) {
        locked(&self.log).insert(seq, payload);
    }

    /// Sends `payload` live as batch `seq` (not logged).
    pub async fn send_payload(&mut self, seq: u64, payload: Bytes) {
        self.raw(vec![
            Bytes::new(),
            Bytes::copy_from_slice(&seq.to_be_bytes()),
            payload,
        ])
        .await;
    }

    /// Sends `frames` as they are (junk, when they are not a batch); a
    /// send that fails (no frames) is ignored.
    pub async fn raw(&mut self, frames: Vec<Bytes>) {
        if let Ok(m) = ZmqMessage::try_from(frames) {
            let _ = self.pub_.send(m).await;
        }
    }

    /// Forgets every logged batch (a restarted process's replay buffer
    /// starts empty).
    pub fn forget_log(&self) {
        locked(&self.log).clear();
    }
}

impl Drop for FramePublisher {
    fn drop(&mut self) {
        self.router.abort();
    }
}
