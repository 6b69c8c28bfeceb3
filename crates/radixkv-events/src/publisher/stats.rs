//! The counters of one device's socket: [`SocketStats`], the public
//! snapshot, and `Counters`, the atomics the socket's task keeps.

use std::sync::atomic::AtomicU64;

/// Counters of one device's socket.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SocketStats {
    /// Batches sent.
    pub batches: u64,
    /// Events sent.
    pub events: u64,
    /// Events not sent: the queue held [`KvEventsConfig::max_pending`]
    /// (or, after such a drop, a removal of the dropped node or a store of
    /// its child, whose block ids cannot be known).
    ///
    /// [`KvEventsConfig::max_pending`]: super::config::KvEventsConfig::max_pending
    pub dropped_events: u64,
    /// Replay requests answered.
    pub replays: u64,
    /// The last sequence number sent.
    pub last_seq: u64,
    /// Events handed to the queue (sent, dropped or still queued).
    pub queued: u64,
    /// Nodes whose block ids the socket's task remembers (for their
    /// children's stores and their removals): about 60 bytes plus 8 per
    /// page each, bounded by what the device (and the host tier) holds.
    pub remembered_nodes: u64,
}

#[derive(Debug, Default)]
pub(super) struct Counters {
    pub(super) batches: AtomicU64,
    pub(super) events: AtomicU64,
    pub(super) dropped: AtomicU64,
    pub(super) replays: AtomicU64,
    pub(super) last_seq: AtomicU64,
    pub(super) queued: AtomicU64,
    pub(super) remembered: AtomicU64,
}
