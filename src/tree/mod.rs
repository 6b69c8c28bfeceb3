//! The concurrent radix tree: nodes, per-tier residency, splits, and
//! epoch-based reclamation. The public face is [`crate::cache::RadixCache`];
//! this module holds the tree and its protocol.
//!
//! ```text
//!  namespace table ──► root(ns=None) ──► [1 2 3] ──► [4 5]   (resident d0,d1)
//!                  └─► root(ns="s")  └─► [9]     └─► [6 7]   (resident d0)
//! ```
//!
//! One root per namespace (different namespaces share no node). A node's key
//! is a page-aligned run of tokens; children are keyed by their first page.
//! Per tier (a device, or the host tier), a node either holds the values of
//! all its tokens or none (residency), and residency is prefix-closed per
//! tier (I1).
//!
//! | room | what it holds |
//! | --- | --- |
//! | `node/` | the node and what it is made of: image, values, children (flat and table), tier slots, the raw pointers |
//! | `protocol/` | how readers and writers share it: lock guards (typestate), the residency word, pins, the leaf inbox, reclamation; the readers/writers/reclamation argument is in its docs |
//! | `ops/` | the operations: walk (peek, match), insert, attach and adopt, split, evict, scans |
//! | `state.rs` | [`Tree`](state::Tree): what every operation shares (roots, clocks, counters, inboxes, reclaimer, listener) |
//! | `namespaces.rs` | the namespace table of roots |
//! | `clock.rs` | access and creation stamps |
//! | `prefetch.rs` | hints to the CPU |
//! | `audit.rs` | the invariants checked in quiescent state |
//!
//! The layers import downward: `node` names nothing above it (its
//! containers are generic over the node type) but the residency word its
//! tier slots hold (`protocol::residency`, which names nothing of the
//! tree); `protocol` works on nodes, `ops` on both, and the cache on
//! `ops`. No two files import each other, directly or around a circle.

mod audit;
pub(crate) mod clock;
pub(crate) mod namespaces;
pub(crate) mod node;
pub(crate) mod ops;
pub(crate) mod prefetch;
pub(crate) mod protocol;
pub(crate) mod state;
