//! The test gate (feature `test-hooks`, never in the released wheel): armed,
//! the next store an event log sees parks the thread that reports it
//! (inside the insert, the tree's locks held, the GIL released) until
//! another Python thread lets it go, which it can only do if the insert
//! released the GIL.

use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The gate's state.
#[derive(Debug, Default)]
struct GateState {
    armed: bool,
    parked: bool,
    released: bool,
    timed_out: bool,
    /// How long a parked store waits before it gives up (a test that never
    /// releases it fails instead of hanging).
    limit: Duration,
}

/// The gate of one event log.
#[derive(Debug, Default)]
pub(crate) struct StoreGate {
    state: Mutex<GateState>,
    wake: Condvar,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl StoreGate {
    /// Arms the gate: the next store parks its thread, for `limit` at most.
    pub(crate) fn hold_next_store(&self, limit: Duration) {
        *lock(&self.state) = GateState {
            armed: true,
            limit,
            ..GateState::default()
        };
    }

    /// Waits (at most `limit`) until a store is parked; whether one is.
    pub(crate) fn wait_parked(&self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        let mut g = lock(&self.state);
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
        let mut g = lock(&self.state);
        let was = g.parked;
        g.armed = false;
        g.released = true;
        self.wake.notify_all();
        was
    }

    /// Whether the last parked store gave up waiting instead of being let go.
    pub(crate) fn timed_out(&self) -> bool {
        lock(&self.state).timed_out
    }

    /// Parks this thread if the gate is armed (the first store disarms it).
    pub(crate) fn park_if_armed(&self) {
        let mut g = lock(&self.state);
        if !g.armed {
            return;
        }
        g.armed = false;
        g.parked = true;
        self.wake.notify_all();
        let deadline = Instant::now() + g.limit;
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
