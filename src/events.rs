//! Residency events: a hook the cache calls whenever pages become resident
//! on a tier or leave it, so that something outside the cache (a KV-event
//! publisher for cross-host routers, a mirror index, a test) can follow
//! exactly what every device and the host tier hold.
//!
//! The core has no transport: it calls a [`CacheListener`] installed with
//! [`RadixCacheBuilder::listener`](crate::RadixCacheBuilder::listener).
//! `radixkv-events` turns these calls into vLLM-format KV events over
//! ZeroMQ.
//!
//! # What is reported
//!
//! * [`CacheListener::stored`]: pages became resident on a tier: an insert
//!   (or a completed copy, or a write-back to the host tier) attached a new
//!   leaf there or adopted an existing node's pages;
//! * [`CacheListener::removed`]: an eviction took a leaf's pages off a tier.
//!
//! A split changes no page and reports nothing. Events name whole pages
//! (every key in the tree is page-aligned), with the full token path from
//! the namespace's root, so a consumer can compute chained block ids.
//!
//! # Order
//!
//! The cache calls the listener inside the locked section of the change it
//! reports: a store before the new node is published (so no thread can
//! see, extend or evict it before its store was reported), a removal while
//! the evicted node and its parent are locked. Hence, per tier:
//!
//! * a page's store is reported before its removal (the eviction needs the
//!   lock the store held), and a store after a removal is a new store;
//! * a parent's store is reported before any store of its children (a
//!   child attaches or is adopted only below a resident parent, under the
//!   parent's lock), and a child's removal before its parent's (only leaves
//!   are evicted).
//!
//! These hold for the order in which calls *enter* the listener, as long as
//! the listener serialises them (a mutex or a queue: an unsynchronised
//! listener sees calls from several threads at once). Loom model 21 and
//! `tests/events.rs` check them under concurrent inserts and evictions.
//!
//! # Cost
//!
//! Without a listener nothing is computed. With one, a removal climbs the
//! evicted node's parent links to build its path (one allocation), and
//! every call runs inside a locked section of the tree: a listener must be
//! quick (queue the event and return), must not block for long, and must
//! not call back into the cache.
//!
//! ```
//! use radixkv::events::{CacheListener, PageEvent};
//! use radixkv::{DeviceId, RadixCache, TokenKey};
//! use std::sync::{Arc, Mutex};
//!
//! #[derive(Default)]
//! struct Log(Mutex<Vec<String>>);
//! impl CacheListener for Log {
//!     fn stored(&self, e: &PageEvent<'_>) {
//!         self.0.lock().unwrap().push(format!("+{} {:?}", e.device.0, e.pages()));
//!     }
//!     fn removed(&self, e: &PageEvent<'_>) {
//!         self.0.lock().unwrap().push(format!("-{} {:?}", e.device.0, e.pages()));
//!     }
//! }
//!
//! let log = Arc::new(Log::default());
//! let cache = RadixCache::builder().page_size(2).listener(log.clone()).build().unwrap();
//! cache.insert(TokenKey::new(&[1, 2, 3, 4]), DeviceId(0), &[5, 6, 7, 8], 0).unwrap();
//! cache.insert(TokenKey::new(&[1, 2, 9, 9]), DeviceId(0), &[5, 6, 1, 2], 0).unwrap(); // splits: no event for [1, 2]
//! cache.evict(DeviceId(0), 2).unwrap();
//! assert_eq!(*log.0.lock().unwrap(), ["+0 [1, 2, 3, 4]", "+0 [9, 9]", "-0 [3, 4]"]);
//! ```

use crate::device::DeviceId;

/// Pages that became resident on a tier, or left it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageEvent<'a> {
    /// The tier: a device, or the host tier ([`RadixCache::host`](crate::RadixCache::host)).
    pub device: DeviceId,
    /// Whether `device` is the host tier.
    pub host: bool,
    /// The namespace ([`TokenKey::in_namespace`](crate::TokenKey::in_namespace)), if any.
    pub namespace: Option<&'a str>,
    /// Every token from the namespace's root through the last changed page.
    pub path: &'a [u32],
    /// Where the changed pages start in `path` (a multiple of the page size).
    pub start: usize,
}

impl<'a> PageEvent<'a> {
    /// The tokens of the changed pages (`path[start..]`).
    pub fn pages(&self) -> &'a [u32] {
        &self.path[self.start..]
    }

    /// The tokens before the changed pages (`path[..start]`): the path of
    /// their parent page, empty at the root.
    pub fn prefix(&self) -> &'a [u32] {
        &self.path[..self.start]
    }
}

/// Told about every residency change of a cache (see the [module
/// docs](self) for what and in which order). Called from whichever thread
/// makes the change, inside the tree's locked section: queue and return.
pub trait CacheListener: Send + Sync + 'static {
    /// Pages became resident on `event.device`.
    fn stored(&self, event: &PageEvent<'_>);
    /// Pages left `event.device`.
    fn removed(&self, event: &PageEvent<'_>);
}

/// A listener as the cache holds it (with a `Debug` for the builder).
#[derive(Clone)]
pub(crate) struct Listener(pub(crate) std::sync::Arc<dyn CacheListener>);

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CacheListener")
    }
}
