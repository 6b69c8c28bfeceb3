//! # radixkv
//!
//! A concurrent radix-tree prefix (KV) cache for multi-GPU, single-host LLM
//! serving. One tree over token ids, shared by one scheduler thread per GPU,
//! maps prompt prefixes to the KV-cache slots that hold them on each device.
//! Single-device behaviour is exactly SGLang 0.5.9's `RadixCache`
//! (RadixAttention); across devices the shared tree answers "which GPU
//! already holds the longest prefix of this prompt" exactly.
//!
//! ```
//! use radixkv::{RadixCache, TokenKey, DeviceId};
//! let cache = RadixCache::builder().page_size(2).build().unwrap();
//! cache.insert(TokenKey::new(&[7, 7, 8, 8]), DeviceId(0), &[1, 2, 3, 4], 0).unwrap();
//! let m = cache.match_and_pin(TokenKey::new(&[7, 7, 8, 9]), DeviceId(0)).unwrap();
//! assert_eq!(m.values, vec![1, 2]); // whole pages only
//! ```
//!
//! ## Concurrency
//!
//! * [`RadixCache::peek`] takes no lock and writes nothing.
//! * [`RadixCache::match_prefix`] takes no lock unless the match ends inside
//!   a node, which it then splits under that node's and its parent's lock.
//! * Inserts, splits and evictions lock only the node they change and its
//!   parent. Nothing is global: there is no tree lock.
//! * Pins are one CAS on a per-(node, device) word; a pin is only on the
//!   end node of a match, and its ancestors are protected because eviction
//!   takes only leaves on a device.
//! * Unlinked nodes, replaced key/value images and children arrays are
//!   reclaimed through crossbeam-epoch.
//!
//! ## Memory cost
//!
//! Per node: a header of about 100 bytes plus one cache-padded 128-byte slot
//! per device, an image (parent, key and value pointers: 40 + 16·devices
//! bytes) and a children array (24 bytes + 32 per child). Per token: 4
//! bytes of key, plus 4 bytes of value per device it is resident on.
//!
//! ## Modules
//!
//! * [`alloc`]: per-device paged allocators and owned page spans.
//! * [`cache`]: the public API ([`RadixCache`], [`Lease`], [`MatchResult`]).
//! * [`device`]: device ids.
//! * `kvpool`: KV memory per device (host; CUDA with feature `cuda`).
//! * `rng`: the seeded generator of workloads, policies and model weights.
//! * [`metrics`]: counters and latency histograms (eviction metrics per device).
//! * [`sync`]: the std/loom shim every atomic goes through.
//! * `reference`: a plain sequential model with the same semantics (tests, baselines).
//! * `conformance`: the SGLang conformance runner behind `radixkv ops`.
//! * `torture`: the randomized lifecycle run behind `radixkv stress`.
//! * `sched`: per-device scheduling (waiting-queue policies, the scheduler loop).
//! * `engine`: schedulers on threads, the router and model backends.
//! * `replay`: the main job, `radixkv replay`: a workload through the engine, summarized.
//! * `workload`: request generators for the replay (GSP, chat, tree of thought).
//! * `hitrate`: trace replay and Belady's bound behind `radixkv hitrate`.

pub mod alloc;
pub mod cache;
#[cfg(not(loom))]
pub mod conformance;
pub mod device;
#[cfg(not(loom))]
pub mod engine;
#[cfg(not(loom))]
pub mod hitrate;
#[cfg(not(loom))]
pub mod kvpool;
pub mod metrics;
#[cfg(not(loom))]
pub mod reference;
#[cfg(not(loom))]
pub mod replay;
#[cfg(not(loom))]
pub mod rng;
#[cfg(not(loom))]
pub mod sched;
#[cfg(not(loom))]
pub mod server;
pub mod sync;
#[cfg(not(loom))]
pub mod torture;
pub(crate) mod tree;
#[cfg(not(loom))]
pub mod workload;

pub use cache::{
    CacheError, ClockKind, Evicted, EvictionPolicy, InsertResult, Lease, MatchResult, NodeHandle,
    RadixCache, RadixCacheBuilder, Request, Sizes, TokenKey,
};
#[cfg(not(loom))]
pub use cache::{Evictor, EvictorStats};
pub use device::DeviceId;

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
