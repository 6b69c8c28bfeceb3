//! Routing a request to the device (or data-parallel rank) that holds its
//! prefix: the pieces every router of the workspace shares.
//!
//! | file | what it holds |
//! | --- | --- |
//! | `choice.rs` | [`choose`]: the cache-aware choice from loads and prefixes ([`CacheAwarePolicy`]) |
//! | `pending.rs` | [`PendingIndex`]: prefixes sent to each device and not yet cached there |

mod choice;
mod pending;

pub use choice::{choose, least_loaded, BalanceRule, CacheAwarePolicy, Choice, NewPrefix};
pub use pending::{PageChain, PendingIndex};
