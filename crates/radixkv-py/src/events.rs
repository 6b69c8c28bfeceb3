//! The cache's residency events, queued for Python (`take_events`): every
//! store, removal, split and clear the core reports, in the order the
//! core's listener sees them (see `radixkv::events`), with what SGLang's
//! `BlockStored` / `BlockRemoved` need: the tokens, the node and its
//! parent, and the namespace.
//!
//! It also holds a gate for the tests: armed, the next store parks the
//! thread that reports it (inside the insert, the tree's locks held, the
//! GIL released) until another Python thread lets it go, which it can only
//! do if the insert released the GIL.

use radixkv::events::{CacheListener, PageEvent, SplitEvent};
use radixkv::Tier;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

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

/// The test gate's state.
#[derive(Debug, Default)]
struct GateState {
    armed: bool,
    parked: bool,
    released: bool,
    timed_out: bool,
}

/// How long a parked store waits before it gives up (a test that never
/// releases it fails instead of hanging).
const PARK_LIMIT: Duration = Duration::from_secs(30);

/// The queue of events, and the test gate.
#[derive(Debug, Default)]
pub(crate) struct EventLog {
    queue: Mutex<Vec<Event>>,
    gate: Mutex<GateState>,
    wake: Condvar,
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

    /// Arms the gate: the next store parks its thread.
    pub(crate) fn hold_next_store(&self) {
        *lock(&self.gate) = GateState {
            armed: true,
            ..GateState::default()
        };
    }

    /// Waits (at most `limit`) until a store is parked; whether one is.
    pub(crate) fn wait_parked(&self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        let mut g = lock(&self.gate);
        while !g.parked {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            g = self
                .wake
                .wait_timeout(g, deadline - now)
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        }
        true
    }

    /// Lets a parked store go (and disarms); whether one was parked.
    pub(crate) fn release(&self) -> bool {
        let mut g = lock(&self.gate);
        let was = g.parked;
        g.armed = false;
        g.released = true;
        self.wake.notify_all();
        was
    }

    /// Whether the last parked store gave up waiting instead of being let go.
    pub(crate) fn timed_out(&self) -> bool {
        lock(&self.gate).timed_out
    }

    /// Parks this thread if the gate is armed (the first store disarms it).
    fn park_if_armed(&self) {
        let mut g = lock(&self.gate);
        if !g.armed {
            return;
        }
        g.armed = false;
        g.parked = true;
        self.wake.notify_all();
        let deadline = Instant::now() + PARK_LIMIT;
        while !g.released {
            let now = Instant::now();
            if now >= deadline {
                g.timed_out = true;
                break;
            }
            g = self
                .wake
                .wait_timeout(g, deadline - now)
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        }
    }
}

impl CacheListener for EventLog {
    fn stored(&self, e: &PageEvent<'_>) {
        self.park_if_armed();
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
