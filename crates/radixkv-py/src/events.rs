//! The cache's residency events, queued for Python (`take_events`): every
//! store, removal, split and clear the core reports, in the order the
//! core's listener sees them (see `radixkv::events`), with what SGLang's
//! `BlockStored` / `BlockRemoved` need: the tokens, the node and its
//! parent, and the namespace. With the feature `test-hooks` it also holds
//! the tests' store gate (`gate.rs`).

use radixkv::events::{CacheListener, PageEvent, SplitEvent};
use radixkv::Tier;
use std::sync::{Mutex, MutexGuard};

/// One event, as Python gets it.
#[derive(Clone, Debug)]
pub(crate) enum Event {
    /// Pages became resident on a tier.
    Stored {
        tier: Tier,
        node: u64,
        /// The parent node (`None`: a namespace root).
        parent: Option<u64>,
        namespace: Option<String>,
        /// The tokens before the pages (the parent's path).
        prefix_len: usize,
        tokens: Vec<u32>,
    },
    /// A node's pages left a tier.
    Removed {
        tier: Tier,
        node: u64,
        tokens: usize,
    },
    /// A node's first `moved` tokens became node `prefix`.
    Split {
        tier: Tier,
        node: u64,
        prefix: u64,
        moved: usize,
    },
    /// The cache was dropped or reset.
    Cleared,
}

/// The queue of events (and, with the feature `test-hooks`, the test gate).
#[derive(Debug, Default)]
pub(crate) struct EventLog {
    queue: Mutex<Vec<Event>>,
    /// The test gate (see `gate.rs`).
    #[cfg(feature = "test-hooks")]
    pub(crate) gate: crate::gate::StoreGate,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl EventLog {
    /// Every event queued since the last call.
    pub(crate) fn take(&self) -> Vec<Event> {
        std::mem::take(&mut *lock(&self.queue))
    }

    fn push(&self, e: Event) {
        lock(&self.queue).push(e);
    }
}

impl CacheListener for EventLog {
    fn stored(&self, e: &PageEvent<'_>) {
        #[cfg(feature = "test-hooks")]
        self.gate.park_if_armed();
        let loc = e.location();
        let (namespace, prefix_len) = match &loc {
            Some(l) => (
                l.namespace.as_deref().map(str::to_string),
                l.prefix(e.pages().len()).len(),
            ),
            None => (None, 0),
        };
        self.push(Event::Stored {
            tier: e.tier,
            node: e.node,
            parent: (!e.at_root).then_some(e.parent),
            namespace,
            prefix_len,
            tokens: e.pages().to_vec(),
        });
    }

    fn removed(&self, e: &PageEvent<'_>) {
        self.push(Event::Removed {
            tier: e.tier,
            node: e.node,
            tokens: e.pages().len(),
        });
    }

    fn split(&self, e: &SplitEvent) {
        self.push(Event::Split {
            tier: e.tier,
            node: e.node,
            prefix: e.prefix,
            moved: e.moved,
        });
    }

    fn cleared(&self) {
        self.push(Event::Cleared);
    }
}
