//! A subscriber for one device's KV events: the SUB side of the protocol,
//! with replay (for tests, tools, and a late-joining consumer's catch-up).
//!
//! A consumer that joins late subscribes first, then asks the replay socket
//! for every batch from sequence 0 (or the last it saw + 1), and merges the
//! two by sequence number, dropping what it already has: [`Merged`] does
//! that.

use bytes::Bytes;
use std::collections::BTreeMap;
use zeromq::{Socket, SocketRecv, SocketSend, ZmqMessage};

/// One batch as it arrived: its sequence number and msgpack payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Batch {
    /// The topic frame.
    pub topic: Bytes,
    /// The batch's sequence number.
    pub seq: u64,
    /// `[ts, events, rank]` in msgpack.
    pub payload: Bytes,
}

impl Batch {
    /// The type of each of its events, in order (`BlockStored`,
    /// `BlockRemoved`, `AllBlocksCleared`): the `type` of a map-encoded
    /// event, the first element of an array-encoded one. A payload that
    /// does not decode gives `<undecodable>`.
    ///
    /// ```
    /// use radixkv_events::subscriber::Batch;
    /// use radixkv_events::wire::{encode_batch, Encoding, KvEvent, Medium};
    /// let removed = KvEvent::BlockRemoved { block_hashes: vec![7], medium: Medium::Gpu };
    /// for enc in [Encoding::Map, Encoding::Array] {
    ///     let payload = encode_batch(0.0, &[KvEvent::AllBlocksCleared, removed.clone()], None, enc);
    ///     let b = Batch { topic: Default::default(), seq: 1, payload: payload.into() };
    ///     assert_eq!(b.event_types(), ["AllBlocksCleared", "BlockRemoved"]);
    /// }
    /// let junk = Batch { topic: Default::default(), seq: 2, payload: Vec::<u8>::new().into() };
    /// assert_eq!(junk.event_types(), ["<undecodable>"]);
    /// ```
    pub fn event_types(&self) -> Vec<String> {
        let Ok(v) = rmpv::decode::read_value(&mut &self.payload[..]) else {
            return vec!["<undecodable>".into()];
        };
        let events = v
            .as_array()
            .and_then(|a| a.get(1))
            .and_then(|e| e.as_array())
            .cloned()
            .unwrap_or_default();
        events
            .iter()
            .map(|e| {
                let tag = match e {
                    rmpv::Value::Map(m) => m
                        .iter()
                        .find(|(k, _)| k.as_str() == Some("type"))
                        .map(|(_, v)| v.clone()),
                    rmpv::Value::Array(a) => a.first().cloned(),
                    _ => None,
                };
                tag.and_then(|t| t.as_str().map(str::to_owned))
                    .unwrap_or_else(|| "<unknown>".into())
            })
            .collect()
    }
}

/// Why a receive failed.
#[derive(Debug, thiserror::Error)]
pub enum SubscribeError {
    /// ZeroMQ failed (connect, receive).
    #[error("ZeroMQ: {0}")]
    Zmq(#[from] zeromq::ZmqError),
    /// A message that is not `[topic, 8-byte seq, payload]`.
    #[error("malformed KV-event message: {0}")]
    Malformed(String),
}

fn seq_of(frame: &[u8]) -> Result<i64, SubscribeError> {
    <[u8; 8]>::try_from(frame)
        .map(i64::from_be_bytes)
        .map_err(|_| SubscribeError::Malformed(format!("a {}-byte sequence frame", frame.len())))
}

/// A SUB socket on one device's PUB endpoint. It reconnects by itself
/// after the publisher goes away (with a backoff from 100 ms to 30 s);
/// [`KvEventSubscriber::reconnections`] says when.
pub struct KvEventSubscriber {
    sub: zeromq::SubSocket,
    monitor: Option<futures_channel::mpsc::Receiver<zeromq::SocketEvent>>,
}

/// Each time a [`KvEventSubscriber`] connects again after its first
/// connection (the publisher restarted, or the connection broke): what it
/// missed meanwhile only a replay can bring, and nothing says so until the
/// publisher's next batch (which may never come).
pub struct Reconnections {
    monitor: futures_channel::mpsc::Receiver<zeromq::SocketEvent>,
    first_seen: bool,
}

impl std::fmt::Debug for Reconnections {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Reconnections")
    }
}

impl Reconnections {
    /// Waits for the next reconnection; `false` once the socket is gone.
    pub async fn next(&mut self) -> bool {
        use futures_core::Stream;
        loop {
            let event =
                std::future::poll_fn(|cx| std::pin::Pin::new(&mut self.monitor).poll_next(cx))
                    .await;
            match event {
                None => return false,
                Some(zeromq::SocketEvent::Connected(..)) if self.first_seen => return true,
                Some(zeromq::SocketEvent::Connected(..)) => self.first_seen = true,
                Some(_) => {}
            }
        }
    }
}

impl std::fmt::Debug for KvEventSubscriber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KvEventSubscriber")
    }
}

impl KvEventSubscriber {
    /// Connects to `endpoint` and subscribes to `topic` (empty: everything).
    pub async fn connect(endpoint: &str, topic: &str) -> Result<Self, SubscribeError> {
        let mut sub = zeromq::SubSocket::new();
        // Before the connection, so that every connection is reported.
        let monitor = Some(sub.monitor());
        sub.connect(endpoint).await?;
        sub.subscribe(topic).await?;
        Ok(KvEventSubscriber { sub, monitor })
    }

    /// Its reconnections, once (`None` after the first call).
    pub fn reconnections(&mut self) -> Option<Reconnections> {
        self.monitor.take().map(|monitor| Reconnections {
            monitor,
            first_seen: false,
        })
    }

    /// The next batch.
    pub async fn recv(&mut self) -> Result<Batch, SubscribeError> {
        let parts = self.sub.recv().await?.into_vec();
        let [topic, seq, payload]: [Bytes; 3] = parts
            .try_into()
            .map_err(|p: Vec<Bytes>| SubscribeError::Malformed(format!("{} frames", p.len())))?;
        let seq = seq_of(&seq)? as u64;
        Ok(Batch {
            topic,
            seq,
            payload,
        })
    }
}

/// Asks a replay (ROUTER) endpoint for every buffered batch from `start`
/// on; returns them in order (the end marker, sequence -1, is consumed).
/// Replies may carry the topic or not: `["", seq, payload]` (radixkv, older
/// vLLM) or `["", topic, seq, payload]` (SGLang, current vLLM). See
/// [`Replay`] to take them one at a time as they arrive.
pub async fn replay(endpoint: &str, start: u64) -> Result<Vec<Batch>, SubscribeError> {
    let mut r = Replay::start(endpoint, start).await?;
    let mut out = Vec::new();
    while let Some(b) = r.next().await? {
        out.push(b);
    }
    Ok(out)
}

/// A replay in progress: [`replay`]'s batches one at a time, so that a
/// consumer catching up on a long buffer holds one batch at a time, not
/// the whole buffer. Dropping it abandons the rest.
pub struct Replay {
    dealer: zeromq::DealerSocket,
    done: bool,
}

impl std::fmt::Debug for Replay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replay").field("done", &self.done).finish()
    }
}

impl Replay {
    /// Connects to `endpoint` and asks for every buffered batch from
    /// `start` on.
    pub async fn start(endpoint: &str, start: u64) -> Result<Replay, SubscribeError> {
        let mut dealer = zeromq::DealerSocket::new();
        dealer.connect(endpoint).await?;
        let req = ZmqMessage::try_from(vec![
            Bytes::new(),
            Bytes::copy_from_slice(&start.to_be_bytes()),
        ])
        .map_err(|_| SubscribeError::Malformed("empty request".into()))?;
        dealer.send(req).await?;
        Ok(Replay {
            dealer,
            done: false,
        })
    }

    /// The next batch, in order; `None` after the end marker.
    pub async fn next(&mut self) -> Result<Option<Batch>, SubscribeError> {
        if self.done {
            return Ok(None);
        }
        let mut parts = self.dealer.recv().await?.into_vec();
        // The ROUTER's empty delimiter first (the DEALER strips nothing).
        if parts.first().is_some_and(|f| f.is_empty()) && parts.len() >= 3 {
            parts.remove(0);
        }
        let (topic, seq, payload) = match <[Bytes; 3]>::try_from(parts) {
            Ok([topic, seq, payload]) => (topic, seq, payload),
            Err(parts) => match <[Bytes; 2]>::try_from(parts) {
                Ok([seq, payload]) => (Bytes::new(), seq, payload),
                Err(p) => {
                    return Err(SubscribeError::Malformed(format!(
                        "replay: {} frames",
                        p.len()
                    )))
                }
            },
        };
        let seq = seq_of(&seq)?;
        if seq < 0 {
            self.done = true;
            return Ok(None);
        }
        Ok(Some(Batch {
            topic,
            seq: seq as u64,
            payload,
        }))
    }
}

/// Batches from a live subscription and a replay, merged by sequence
/// number: each batch once, in order, with gaps reported.
#[derive(Debug, Default)]
pub struct Merged {
    batches: BTreeMap<u64, Bytes>,
}

impl Merged {
    /// Adds a batch (a duplicate sequence number is ignored).
    pub fn add(&mut self, b: Batch) {
        self.batches.entry(b.seq).or_insert(b.payload);
    }

    /// The payloads in order, if the sequence numbers have no gap.
    pub fn contiguous(&self) -> Option<Vec<&Bytes>> {
        let mut prev: Option<u64> = None;
        for &s in self.batches.keys() {
            if prev.is_some_and(|p| s != p + 1) {
                return None;
            }
            prev = Some(s);
        }
        Some(self.batches.values().collect())
    }

    /// The highest sequence number held.
    pub fn last_seq(&self) -> Option<u64> {
        self.batches.keys().next_back().copied()
    }
}
