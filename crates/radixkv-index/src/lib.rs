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

pub mod decode;
pub mod index;

pub use index::{KvIndex, Score, Source};
