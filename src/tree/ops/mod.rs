//! The operations on the tree, each a walk or one structural change made
//! through the lock guards of `protocol::lock`, taking one argument
//! struct.
//!
//! | file | what it holds |
//! | --- | --- |
//! | `walk.rs` | the step to a child, `peek`, `match_on`, the climbs back to the root; the readers' protecting steps |
//! | `climb.rs` | climbs from a place a caller kept: to the node starting at a page, to the key up to a page |
//! | `insert.rs` | the insert walk ([`Insert`](insert::Insert)): split, adopt, attach, pins hand over hand |
//! | `attach.rs` | attaching a leaf ([`Attach`](attach::Attach)) and adopting values into a node ([`Adopt`](attach::Adopt)) |
//! | `split.rs` | splitting a node ([`Split`](split::Split)) |
//! | `evict.rs` | evicting one leaf from one tier, unlinking what is left of nothing |
//! | `scan.rs` | whole-tree scans: nodes, leaves of a tier, values, sizes |
//! | `depth.rs` | branch depths for tlru: raising a new node's ancestors, turning tracking on |

pub(crate) mod attach;
pub(crate) mod climb;
pub(crate) mod depth;
pub(crate) mod evict;
pub(crate) mod insert;
pub(crate) mod scan;
pub(crate) mod split;
pub(crate) mod walk;
