//! One device's queue: the 32-byte `Head` of each queued change (its
//! `Kind`, decoded as an `Op`), `Changes` (the heads and a store's pages, as
//! the listener leaves them for the socket's task), `DeviceQueue` (the
//! queue, the replay buffer and the counters) and `lock`, the poison-proof
//! lock every one of these mutexes is taken with.

use super::stats::Counters;
use bytes::Bytes;
use std::collections::VecDeque;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::Notify;

/// One queued change, in 32 bytes (two to a cache line: the cache's thread
/// writes one per change into lines the socket's task read last, and each
/// new line costs a transfer from the other core). A store's own pages
/// follow the previous stores' in `Changes::tokens`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Head {
    pub(super) node: u64,
    /// A store's parent (unless `at_root`), a split's prefix node.
    other: u64,
    /// A store's tokens, a split's moved tokens.
    pub(super) len: u32,
    /// The sink's tag: node ids are unique within one cache only.
    pub(super) tag: u32,
    /// 1 + the index of the namespace in `Changes::namespaces`; 0: none.
    namespace: u32,
    pub(super) kind: Kind,
    pub(super) host: bool,
    at_root: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    Stored,
    Removed,
    Split,
    Cleared,
    Forget,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Op {
    /// The node's pages became resident, chained from `parent`'s last
    /// block id (`None`: the parent is a namespace root).
    Stored { parent: Option<u64> },
    /// The node's pages left the tier.
    Removed,
    /// The node's first `moved` tokens became node `prefix`: what is
    /// remembered of the node is divided (no event).
    Split { prefix: u64, moved: u32 },
    /// The sink's cache was dropped: `AllBlocksCleared` if it is the only
    /// one this socket has published for, else a removal of each of its
    /// nodes; its nodes are forgotten.
    Cleared,
    /// The sink is gone: its nodes are forgotten (no event).
    Forget,
}

impl Kind {
    /// Whether subscribers see it (counted as queued, sent or dropped).
    pub(super) fn is_event(self) -> bool {
        matches!(self, Kind::Stored | Kind::Removed | Kind::Cleared)
    }
}

impl Op {
    pub(super) fn kind(self) -> Kind {
        match self {
            Op::Stored { .. } => Kind::Stored,
            Op::Removed => Kind::Removed,
            Op::Split { .. } => Kind::Split,
            Op::Cleared => Kind::Cleared,
            Op::Forget => Kind::Forget,
        }
    }
}

impl Head {
    pub(super) fn op(&self) -> Op {
        match self.kind {
            Kind::Stored => Op::Stored {
                parent: (!self.at_root).then_some(self.other),
            },
            Kind::Removed => Op::Removed,
            Kind::Split => Op::Split {
                prefix: self.other,
                moved: self.len,
            },
            Kind::Cleared => Op::Cleared,
            Kind::Forget => Op::Forget,
        }
    }
}

/// A device's queued changes, as the listener leaves them: a head per
/// change and a store's own pages copied into one flat buffer (hashed into
/// block ids by the socket's task, off the cache's locked section). The
/// task swaps the whole queue for an empty one of the same capacity and
/// hands that back after sending, so in a steady state queueing allocates
/// and frees nothing (a free on another thread than the allocation's, per
/// event, cost more than the insert it reported).
#[derive(Debug, Default)]
pub(super) struct Changes {
    pub(super) heads: Vec<Head>,
    pub(super) tokens: Vec<u32>,
    /// Events handed to this queue, and those of them dropped.
    pub(super) events: u64,
    pub(super) dropped: u64,
    /// The namespaces the heads name (a run of changes in one namespace
    /// shares one entry).
    namespaces: Vec<Arc<str>>,
}

impl Changes {
    /// Asks the CPU for the lines the next change will write, with intent
    /// to write: its head, and as many tokens as this change had (and a
    /// line more; 4 KiB at most). The socket's task read those lines last,
    /// on another core, and a write to a line another core holds has to
    /// fetch it first; the lock's release after the write then waits for
    /// that. Fetched now, they arrive while the cache does the rest of this
    /// insert and the next (measured: the insert ratio went from 1.09–1.10
    /// to 1.05–1.06 in the overhead bench).
    pub(super) fn prepare_next(&self, tokens: usize) {
        if self.heads.len() < self.heads.capacity() {
            prefetch_for_write(self.heads.as_ptr_range().end.cast());
        }
        let free = self.tokens.capacity() - self.tokens.len();
        let end = self.tokens.as_ptr_range().end;
        // 16 tokens to a 64-byte line.
        for at in (0..free.min(tokens + 16).min(1024)).step_by(16) {
            prefetch_for_write(end.wrapping_add(at).cast());
        }
    }

    pub(super) fn clear(&mut self) {
        self.heads.clear();
        self.tokens.clear();
        self.namespaces.clear();
        self.events = 0;
        self.dropped = 0;
    }

    /// Queues a change (a store's `pages` are under 2^32 tokens: the
    /// caller checks).
    pub(super) fn push(
        &mut self,
        op: Op,
        (host, tag, node): (bool, u32, u64),
        namespace: Option<&str>,
        pages: &[u32],
    ) {
        let namespace = match namespace {
            None => 0,
            Some(n) => {
                if self.namespaces.last().is_none_or(|last| **last != *n) {
                    self.namespaces.push(Arc::from(n));
                }
                self.namespaces.len() as u32
            }
        };
        let kind = op.kind();
        let (other, len, at_root) = match op {
            Op::Stored { parent } => (parent.unwrap_or(0), pages.len() as u32, parent.is_none()),
            Op::Split { prefix, moved } => (prefix, moved, false),
            Op::Removed | Op::Cleared | Op::Forget => (0, 0, false),
        };
        if kind == Kind::Stored {
            self.tokens.extend_from_slice(pages);
        }
        self.heads.push(Head {
            node,
            other,
            len,
            tag,
            namespace,
            kind,
            host,
            at_root,
        });
    }

    pub(super) fn namespace(&self, h: &Head) -> Option<&Arc<str>> {
        (h.namespace as usize)
            .checked_sub(1)
            .and_then(|i| self.namespaces.get(i))
    }
}

/// Asks the CPU to fetch the cache line at `p` for writing (a hint: a
/// no-op off x86-64).
#[inline]
fn prefetch_for_write(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `_mm_prefetch` is a hint: it reads and writes nothing the
    // program sees and never faults, whatever the address. SSE is part of
    // the x86-64 baseline, so the instruction exists (a CPU without
    // PREFETCHW runs the ET0 hint as a plain prefetch).
    unsafe {
        std::arch::x86_64::_mm_prefetch(p.cast::<i8>(), std::arch::x86_64::_MM_HINT_ET0)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// One device's queue and replay buffer.
#[derive(Debug, Default)]
pub(super) struct DeviceQueue {
    pub(super) pending: Mutex<Changes>,
    /// Whether the task waits for `notify` (it ticks on its own otherwise).
    pub(super) parked: AtomicBool,
    pub(super) notify: Notify,
    /// The batches kept for replays, and their payloads' bytes.
    pub(super) replay: Mutex<(VecDeque<(u64, Bytes)>, usize)>,
    pub(super) counters: Counters,
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding one of these locks leaves plain vectors
    // behind, still usable.
    m.lock().unwrap_or_else(|p| p.into_inner())
}
