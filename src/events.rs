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
//! * [`CacheListener::removed`]: an eviction took a leaf's pages off a tier;
//! * [`CacheListener::cleared`]: the cache was dropped, and with it
//!   everything it held;
//! * [`CacheListener::split`]: a node's first pages became a node of their
//!   own. No page changes residency; a listener that remembers something
//!   per node (the block ids of its pages) divides it here, and otherwise
//!   ignores it (the default does nothing).
//!
//! Events name whole pages (every key in the tree is page-aligned) and the
//! ids of their node and its parent; the full token path from the
//! namespace's root is there on request ([`PageEvent::location`]), so a
//! consumer can compute chained block ids.
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
//!   are evicted);
//! * a split of a node is reported, for every tier that holds the node,
//!   after the node's store there and before its removal, and before any
//!   event of the new prefix node (the split holds the node's and its
//!   parent's locks, and publishes the prefix node only after the report).
//!
//! So a listener that keeps, per tier and node id, the block ids of the
//! node's pages (from its store, chained from its parent's) always finds a
//! stored node's parent and an evicted node's ids, with no path: what
//! `radixkv-events` does.
//!
//! These hold for the order in which calls *enter* the listener, as long as
//! the listener serialises them (a mutex or a queue: an unsynchronised
//! listener sees calls from several threads at once). The loom models
//! `store_event_vs_evict` and `split_event_vs_evict` and
//! `tests/events.rs` check them under concurrent inserts and evictions.
//!
//! # Cost
//!
//! Without a listener nothing is computed. With one, each change costs a
//! call inside a locked section of the tree (a removal's path is built
//! only if the listener asks for it): a listener must be quick (queue the
//! event and return), must not block for long, and must not call back into
//! the cache.
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
//!         self.0.lock().unwrap().push(format!("+{} {:?}", e.tier, e.pages()));
//!     }
//!     fn removed(&self, e: &PageEvent<'_>) {
//!         self.0.lock().unwrap().push(format!("-{} {:?}", e.tier, e.pages()));
//!     }
//! }
//!
//! let log = Arc::new(Log::default());
//! let cache = RadixCache::builder().page_size(2).listener(log.clone()).build().unwrap();
//! cache.insert(TokenKey::new(&[1, 2, 3, 4]), DeviceId(0), &[5, 6, 7, 8], 0).unwrap();
//! cache.insert(TokenKey::new(&[1, 2, 9, 9]), DeviceId(0), &[5, 6, 1, 2], 0).unwrap(); // splits: no event for [1, 2]
//! cache.evict(DeviceId(0), 2).unwrap();
//! assert_eq!(
//!     *log.0.lock().unwrap(),
//!     ["+device 0 [1, 2, 3, 4]", "+device 0 [9, 9]", "-device 0 [3, 4]"]
//! );
//! ```

use crate::device::Tier;
use std::borrow::Cow;

/// Where the changed pages sit: the namespace and every token from the
/// namespace's root through the last changed page.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Location<'a> {
    /// The namespace ([`TokenKey::in_namespace`](crate::TokenKey::in_namespace)), if any.
    pub namespace: Option<Cow<'a, str>>,
    /// Root → the last changed page.
    pub path: Cow<'a, [u32]>,
}

impl Location<'_> {
    /// The tokens before the changed pages (`pages` long at the end): the
    /// parent page's path, empty at the root.
    pub fn prefix(&self, pages: usize) -> &[u32] {
        &self.path[..self.path.len().saturating_sub(pages)]
    }
}

/// How an event gets its location: at hand (a store: the insert's own key),
/// or by climbing the tree (a removal: only if asked).
#[derive(Clone, Copy)]
pub(crate) enum Locate<'a> {
    Known {
        namespace: Option<&'a str>,
        path: &'a [u32],
    },
    Climb(&'a dyn Fn() -> Option<(Option<String>, Vec<u32>)>),
}

/// Pages that became resident on a tier, or left it: always the pages of
/// one node (whole pages), that node's id and its parent's. The location
/// (namespace and path from the root) is computed only when asked
/// ([`location`](Self::location)): for a store it is the insert's own
/// key, for a removal a climb of the tree's parent links.
///
/// Node ids are unique for the cache's life, and a node's last page never
/// changes (a split moves a node's first pages to a new node with a new
/// id): a listener may remember something per node id, such as the block
/// id of its last page, and find it again for the node's children and for
/// its removal without the path.
#[derive(Clone, Copy)]
pub struct PageEvent<'a> {
    /// The tier: a device, or the host tier.
    pub tier: Tier,
    /// The id of the node whose pages these are.
    pub node: u64,
    /// The id of its parent node.
    pub parent: u64,
    /// Whether the parent is a namespace root (the pages start the path).
    pub at_root: bool,
    pages: &'a [u32],
    locate: Locate<'a>,
}

impl std::fmt::Debug for PageEvent<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PageEvent")
            .field("tier", &self.tier)
            .field("node", &self.node)
            .field("parent", &self.parent)
            .field("at_root", &self.at_root)
            .field("pages", &self.pages)
            .finish_non_exhaustive()
    }
}

impl<'a> PageEvent<'a> {
    /// An event of `pages` of node `ids.0` (parent `ids.1`, a root if
    /// `ids.2`) on `tier`.
    pub(crate) fn new(
        tier: Tier,
        (node, parent, at_root): (u64, u64, bool),
        pages: &'a [u32],
        locate: Locate<'a>,
    ) -> Self {
        PageEvent {
            tier,
            node,
            parent,
            at_root,
            pages,
            locate,
        }
    }

    /// The tokens of the changed pages.
    pub fn pages(&self) -> &'a [u32] {
        self.pages
    }

    /// The namespace and the path from the root through the changed pages
    /// (for a removal, read by climbing the evicted node's parent links
    /// under the cache's locks: about one cache miss per ancestor and a
    /// copy of the path). `None` only if the chain was cut, which the locks
    /// held during the call rule out.
    pub fn location(&self) -> Option<Location<'a>> {
        match self.locate {
            Locate::Known { namespace, path } => Some(Location {
                namespace: namespace.map(Cow::Borrowed),
                path: Cow::Borrowed(path),
            }),
            Locate::Climb(f) => f().map(|(ns, path)| Location {
                namespace: ns.map(Cow::Owned),
                path: Cow::Owned(path),
            }),
        }
    }
}

/// A split of a node that a tier holds: the node's first `moved` tokens
/// became the new node `prefix`, between the node and its parent; the node
/// keeps its id and its last pages. Nothing changed residency: the prefix
/// node is resident on the same tiers, with the same pages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SplitEvent {
    /// The tier: a device, or the host tier.
    pub tier: Tier,
    /// The node that was split (it keeps its last pages).
    pub node: u64,
    /// The id of the new node holding the first `moved` tokens.
    pub prefix: u64,
    /// How many tokens moved to `prefix` (whole pages).
    pub moved: usize,
}

/// Told about every residency change of a cache (see the [module
/// docs](self) for what and in which order). Called from whichever thread
/// makes the change, inside the tree's locked section: queue and return.
pub trait CacheListener: Send + Sync + 'static {
    /// Pages became resident on `event.tier`.
    fn stored(&self, event: &PageEvent<'_>);
    /// Pages left `event.tier`.
    fn removed(&self, event: &PageEvent<'_>);
    /// A node that `event.tier` holds was split (no page changed
    /// residency). Called once per tier holding the node. The default does
    /// nothing: only a listener that remembers something per node needs it.
    fn split(&self, event: &SplitEvent) {
        let _ = event;
    }
    /// The cache is being dropped: everything it held, on every tier, is
    /// gone (what a reset is here: an engine replaces its cache, or shuts
    /// down). Called once, after every other call. The default does
    /// nothing.
    fn cleared(&self) {}
}

/// A listener as the cache holds it (with a `Debug` for the builder).
#[derive(Clone)]
pub(crate) struct Listener(pub(crate) std::sync::Arc<dyn CacheListener>);

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CacheListener")
    }
}
