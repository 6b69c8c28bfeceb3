//! The publisher: a [`CacheListener`] that queues each device's events and
//! tokio tasks that send them, in batches, on one ZeroMQ PUB socket per
//! device (and answer replays on an optional ROUTER socket per device).
//!
//! What the cache's thread does per change is one short locked push: a
//! 32-byte head, and for a store the node's own pages. Block ids are
//! computed by the device's socket task, which remembers each resident
//! node's ids: a store is chained from its parent's last id, a removal
//! names the ids remembered for its node, and a split (reported by the
//! cache, see [`radixkv::events`]) divides them. That memory is bounded by
//! what the tiers hold (about 60 bytes per node plus 8 per page;
//! [`SocketStats::remembered_nodes`]) and goes with the cache.
//!
//! Its files: `config` ([`KvEventsConfig`], [`EventsError`], the devices'
//! endpoints), `stats` ([`SocketStats`]), `queue` (a device's queue of
//! changes), `remembered` (the block ids a socket's task remembers),
//! `shared` (the state all of them share; queueing and encoding),
//! `sink` ([`EventSink`]), `handle` ([`KvEventPublisher`]) and `tasks`
//! (the socket tasks).
//!
//! [`CacheListener`]: radixkv::events::CacheListener

mod config;
mod handle;
mod queue;
mod remembered;
mod shared;
mod sink;
mod stats;
mod tasks;

pub use config::{device_endpoints, EventsError, KvEventsConfig};
pub use handle::KvEventPublisher;
pub use sink::EventSink;
pub use stats::SocketStats;
