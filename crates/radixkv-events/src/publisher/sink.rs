//! [`EventSink`]: the [`CacheListener`] installed on a cache, which turns
//! its residency changes into queued changes on the right device's queue.

use super::queue::Op;
use super::shared::Shared;
use radixkv::events::{CacheListener, PageEvent, SplitEvent};
use std::sync::Arc;

/// The [`CacheListener`] of a [`KvEventPublisher`]: converts residency
/// changes into KV events on the right device's queue. When the cache it
/// is installed on is dropped, its blocks are cleared on every socket (see
/// [`KvEventPublisher`]) and the publisher forgets its nodes.
///
/// [`KvEventPublisher`]: super::handle::KvEventPublisher
#[derive(Debug)]
pub struct EventSink {
    pub(super) shared: Arc<Shared>,
    /// For a cache with one device that stands for engine device `d`
    /// (private trees): every device event goes to `d`'s socket.
    pub(super) device: Option<usize>,
    /// This sink's own tag: node ids are unique within one cache only, so
    /// what the publisher remembers per node is keyed by sink too (one
    /// sink per cache).
    pub(super) tag: u32,
}

impl CacheListener for EventSink {
    fn stored(&self, e: &PageEvent<'_>) {
        // A store's location is the insert's own key: no climb.
        let loc = e.location();
        let namespace = loc.as_ref().and_then(|l| l.namespace.as_deref());
        let parent = (!e.at_root).then_some(e.parent);
        self.shared.fan_out(
            e.tier,
            self.device,
            Op::Stored { parent },
            (self.tag, e.node),
            namespace,
            e.pages(),
        );
    }

    fn removed(&self, e: &PageEvent<'_>) {
        // The node's ids are remembered by the task: nothing to read.
        self.shared.fan_out(
            e.tier,
            self.device,
            Op::Removed,
            (self.tag, e.node),
            None,
            &[],
        );
    }

    fn cleared(&self) {
        // Every socket: the host tier's pages are on all of them.
        self.every_queue(Op::Cleared);
    }

    fn split(&self, e: &SplitEvent) {
        self.shared.fan_out(
            e.tier,
            self.device,
            Op::Split {
                prefix: e.prefix,
                // A node's tokens fit (see `push`); a larger split moves
                // nothing of what is remembered.
                moved: u32::try_from(e.moved).unwrap_or(0),
            },
            (self.tag, e.node),
            None,
            &[],
        );
    }
}

impl EventSink {
    /// Every device queue, in order.
    fn every_queue(&self, op: Op) {
        for d in 0..self.shared.queues.len() {
            self.shared.push(d, op, (false, self.tag, 0), None, &[]);
        }
    }
}

impl Drop for EventSink {
    fn drop(&mut self) {
        // A sink whose cache was never built or was cleared already: what
        // is left of it (nothing, usually) is forgotten.
        self.every_queue(Op::Forget);
    }
}
