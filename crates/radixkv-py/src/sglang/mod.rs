//! The tree under `radixkv.sglang` (SGLang 0.5.23's
//! `--radix-cache-backend radixkv`): the core cache configured as SGLang
//! behaves, a mirror of its shape kept from its residency events, and
//! SGLang's KV-event block hashes. The Python class `RadixKVCache` in
//! `python/radixkv/sglang.py` drives it with SGLang's objects.
//!
//! | file | what it holds |
//! | --- | --- |
//! | `tree.rs` | `SglangTree` (one call per SGLang operation) and `SglangNode` |
//! | `mirror/` | the shape: lock counts and the pins behind them, O(1) sizes, sibling order, per-node digests |
//! | `hash.rs` | SGLang's page-digest chain and published block hashes |

mod hash;
mod mirror;
mod tree;

pub(crate) use tree::{SglangNode, SglangTree};
