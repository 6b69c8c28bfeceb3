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
//! This crate is the core an engine embeds: the tree, the cache API, the
//! per-device page allocators and the eviction machinery, with light
//! dependencies only (crossbeam, thiserror, hdrhistogram; no async runtime,
//! HTTP, model code, CLI or serialization). The serving engine, the HTTP
//! server and the `radixkv` binary are the crates `radixkv-engine`,
//! `radixkv-server` and `radixkv-cli` of the same workspace.
//!
//! ## Guarantees of each operation
//!
//! | operation | progress | locks of radixkv's own | writes |
//! | --- | --- | --- | --- |
//! | [`RadixCache::peek`] (resident length per device) | wait-free: at most a number of its own steps bounded by the key length, whatever other threads do | none | nothing |
//! | [`RadixCache::match_prefix`] that ends on a node boundary | wait-free, as `peek` | none | access stamps, hit counts |
//! | [`RadixCache::match_prefix`] that ends inside a node | lock-free: splits under try-locks of that node and its parent; if either is held it returns the prefix it has without splitting, and it re-walks only when another thread completed a change under it | try-locks only, never a wait | the split |
//! | [`RadixCache::match_and_pin`], [`RadixCache::pin`] | as `match_prefix`, plus the pin: a CAS loop on a per-(node, device) word, retried only when another thread changed that word | as `match_prefix` | the pin |
//! | dropping a [`Lease`] | wait-free (one atomic decrement) | none | the pin |
//! | [`RadixCache::insert`] | blocking | the node it changes and its parent, one pair at a time, parent first | new or split nodes, residency |
//! | [`RadixCache::evict`] | blocking | the device's eviction lock, then each victim leaf and its parent | unlinks leaves |
//! | [`RadixCache::reclaim`] | never waits for a reader (it stops when one holds the epoch back) | none | frees retired objects |
//! | [`RadixCache::sizes`], [`RadixCache::node_count`] | wait-free | none | nothing |
//! | [`RadixCache::audit`] | call it when the cache is quiescent | none | nothing |
//!
//! Readers never wait for a writer: a reader that meets a split half done
//! (the child already names its new parent, the parent's new children are
//! not published yet) climbs the child's parent links to the node now
//! below the parent instead of waiting (`tests/parked_writer.rs` parks a
//! writer inside each structural change and checks that readers finish;
//! its negative control restores the old wait and fails). Work that
//! crossbeam-epoch defers to whichever thread collects, as every ~128th
//! `pin()` does, is a lock-free hand-over of retired objects to the
//! reclaimer queue; freeing happens in `evict`, `reclaim` or a long
//! `insert`, never in a reader. Outside these bounds: the global allocator
//! (an insert's or a split's allocations) and crossbeam-epoch's own
//! collection.
//!
//! There is no tree-wide lock. A pin is taken only on the end node of a
//! match; its ancestors stay resident because eviction takes only leaves
//! on a device. Unlinked nodes, replaced key/value images and children
//! arrays are reclaimed through crossbeam-epoch. Single-device results are
//! SGLang 0.5.9's, vector for vector (the conformance tests of
//! `radixkv-engine`), except that a match that would split a node whose
//! lock another thread holds at that instant reports the shorter prefix
//! instead (never in a single-threaded run).
//!
//! ## Memory cost
//!
//! Per node, on x86-64: a 120-byte header (its reference count included)
//! that holds, with one device, that device's slot inline (48 bytes:
//! residency, stamps, hits); with several devices (or a host tier), one
//! 64-byte line per tier in one array instead. One image allocation: a
//! 40-byte head (parent, the key's length, and the values of one resident
//! device inline; with more resident devices, 24 bytes per resident device
//! in an array), then the key, 4 bytes per token. Values are stored as runs
//! (a request's slots allocated together are one run, kept inline;
//! scattered ones cost 4 bytes a value), the node's 16-byte entry in its
//! parent's children array (wide arrays add 24 bytes per chunk of up to 48
//! entries), and, until the evictor next takes them in, a 24-byte note per
//! new leaf. Measured by the peer bench (`bench-peers/`, W1, page size 16,
//! 208 tokens per leaf): about 4.97 bytes per cached token on one device,
//! 4 of them the key, and about 98 bytes per cached block (16 tokens) on
//! four devices.
//!
//! A host tier ([`RadixCacheBuilder::host_pages`]) costs one more slot
//! per node: with one device its inline 48-byte slot becomes an array of
//! two 64-byte lines, measured at 145 bytes more per node (5.10 → 5.80
//! bytes per token with 208-token leaves); with four devices one line
//! more, 83 bytes per node (6.60 → 7.00 bytes per token). Host residencies
//! take image values like a device's.
//!
//! Per namespace (`TokenKey::with_namespace`): a root node (the header
//! above, no key), a table entry (32 bytes and the name), and 8 to 32
//! bytes of hash-table slots (the table is kept between a quarter and a
//! half full, shrinking as namespaces go). A namespace is found in
//! expected O(1), and its root is reclaimed when its last node leaves.
//!
//! ## Tiers: the host tier and copies
//!
//! With [`RadixCacheBuilder::host_pages`] the tree has one more residency
//! slot, a host tier shared by every device's scheduler, named
//! [`Tier::Host`] (every per-tier call takes a [`Tier`], of which a
//! [`DeviceId`] is one: its residency is prefix-closed, pinned by leases of
//! its own, evicted leaves first by the cache's policy, audited with the
//! devices). [`RadixCache::peek_tiers`] reports the resident
//! prefix on every device and on the host in one walk, and a
//! [`MatchResult`] tells how far the host ([`MatchResult::host_len`]) and
//! another device ([`MatchResult::any_len`]) could take the asked device's
//! prefix. A [`PrefixCopy`] ([`RadixCache::copy_prefix`],
//! [`Request::copy_from`]) moves a prefix's KV from the tier that holds it
//! into pages of another instead of recomputing it: the source is pinned
//! for the whole copy, the destination pages are the copy's until it
//! completes, and a cancelled copy gives everything back;
//! [`RadixCache::evict_with_write_back`] copies victims to the host before
//! evicting them (write-back). The loom models of `loom-tests/tests/copies.rs`
//! check the copies' races.
//!
//! ## Who owns the values
//!
//! A [`RadixCache`] is generic over who owns the values it holds:
//! [`CallerValues`] (the default: the caller allocates KV slots and
//! [`RadixCache::insert`]s their indices, as SGLang's `RadixCache` does
//! over its own allocator) or [`OwnedPages`] (a [`PagedCache`], built with
//! [`RadixCacheBuilder::pages_per_device`]: a page allocator per tier,
//! [`Request`]s, [`RadixCache::insert_pages`], copies between tiers, the
//! background evictor). Inserting plain values into a cache that owns its
//! pages, or allocating from one that does not, does not compile.
//!
//! ```
//! use radixkv::{DeviceId, PagedCache, RadixCache, TokenKey};
//! let plain: RadixCache = RadixCache::builder().build().unwrap();
//! plain.insert(TokenKey::new(&[1, 2]), DeviceId(0), &[40, 41], 0).unwrap();
//! let paged: PagedCache = RadixCache::builder().pages_per_device(64).build().unwrap();
//! let span = paged.alloc(DeviceId(0), 2).unwrap();
//! paged.insert_pages(TokenKey::new(&[1, 2]), span, 0).unwrap();
//! assert_eq!(paged.peek(TokenKey::new(&[1, 2])), plain.peek(TokenKey::new(&[1, 2])));
//! ```
//!
//! ## Cargo features
//!
//! | feature | default | what it adds |
//! | --- | --- | --- |
//! | `serde` | off | `serde::Serialize` for the [`metrics`] types |
//! | `testing` | off | `reference`: a sequential model with the same semantics (the test oracle and the benchmarks' baseline); `pause`: pause points inside the tree's structural changes, for tests that park a writer; not for production |
//!
//! Under `--cfg loom` the same code is model-checked: every atomic goes
//! through [`sync`].
//!
//! ## Modules
//!
//! * [`alloc`]: per-device paged allocators and owned page spans.
//! * [`cache`]: the public API ([`RadixCache`], [`Lease`], [`MatchResult`],
//!   [`Request`], [`PrefixCopy`]), eviction policies and the background
//!   [`Evictor`].
//! * [`device`]: devices and tiers ([`DeviceId`], [`Tier`]).
//! * [`events`]: the residency-event hook ([`events::CacheListener`]).
//! * [`metrics`]: counters and latency histograms (eviction metrics per device).
//! * [`routing`]: the cache-aware choice of a device or rank, and the
//!   prefixes dispatched and not yet cached, shared by every router.
//! * [`sync`]: the std/loom shim every atomic goes through.
//! * `reference` (feature `testing`): the sequential model.

#![deny(clippy::undocumented_unsafe_blocks)]

pub mod alloc;
pub mod cache;
pub mod device;
pub mod events;
pub mod metrics;
mod negative;
#[cfg(all(feature = "testing", not(loom)))]
pub mod pause;
#[cfg(not(all(feature = "testing", not(loom))))]
#[path = "pause_off.rs"]
mod pause;
#[cfg(all(feature = "testing", not(loom)))]
pub mod reference;
pub mod routing;
pub mod sync;
pub(crate) mod tree;

pub use cache::{
    CacheError, CallerValues, ClockKind, Evicted, EvictedFrom, EvictionPolicy, HitCounts,
    InsertResult, Lease, MatchResult, NodeHandle, OwnedPages, Ownership, PagedCache, PrefixCopy,
    RadixCache, RadixCacheBuilder, Request, RequestCopy, Sizes, SlotRun, TierLengths, TokenKey,
    TreePlace,
};
#[cfg(not(loom))]
pub use cache::{Evictor, EvictorStats};
pub use device::{DeviceId, Tier};

/// The library guide's examples (`docs/library.md`), compiled and run as
/// doctests.
#[cfg(doctest)]
#[doc = include_str!("../docs/library.md")]
pub struct LibraryGuideDoctests;
