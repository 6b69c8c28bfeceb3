//! # radixkv-index
//!
//! The index routers ask which worker holds the longest prefix of a prompt:
//! KV-event batches from vLLM, SGLang and radixkv workers, applied to one
//! radixkv tree in which each (worker, data-parallel rank, medium) is a
//! tier.
//!
//! | module | what it holds |
//! | --- | --- |
//! | [`decode`] | a batch's msgpack payload in each producer's encoding, read into [`decode::Batch`] |
//! | [`index`] | [`KvIndex`]: the events of every (worker, rank) applied to one tree; scores per tier |
//! | `block` | what a source keeps of each block it holds: parent, children, media, a place in the tree |
//! | [`dp`] | [`dp::DpRouter`]: one engine's data-parallel ranks from their events, and the rank a request should go to |
//! | [`feed`] | [`feed::Feed`]: one source's sequence numbers: apply, drop, replay a gap, restart, stale |
//! | [`local_hash`] | the per-block hashes Dynamo's routers send (`/query_by_hash`), which key the tree |
//! | `msgpack` | a msgpack reader item by item, borrowing from the payload (what `decode` reads with) |
//! | [`listen`] | [`listen::listen`]: one source's socket into the index, gaps replayed |

mod block;
pub mod decode;
pub mod dp;
pub mod feed;
pub mod index;
pub mod listen;
pub mod local_hash;
mod msgpack;

pub use index::{KvIndex, Score, Source};
