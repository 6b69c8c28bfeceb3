//! Models whose K/V live in the engine's KV pools, at the slots the cache
//! allocated, and the engine backend that runs any of them.
//!
//! A [`PagedModel`] computes a pass over [`PagedSeq`]s: for each sequence
//! only the positions `start..` are computed; their K/V rows are written to
//! the pool at their slots, and attention reads the K/V of every earlier
//! position back from the pool (the prefix's rows come from whoever
//! computed them: an earlier request, chunk or step, or a copy from another
//! device or the host tier). It also has a dense reference, separate code
//! that never reads a pool, which verification compares the paged logits
//! with.
//!
//! [`PagedBackend`] is the engine's
//! [`ModelBackend`](radixkv_engine::sched::batch::ModelBackend) over any of them
//! (`wants_data() == true`): one pool per device and one for the host tier
//! ([`PoolConfig`]), copies between pools, slot provenance tags (a read of
//! a slot never written for the reader's token prefix counts a stale read),
//! sampling of the next token as each request asks
//! ([`Sampling`](radixkv_engine::sched::sampling::Sampling)), and, with `verify`, the check of every
//! request against the reference when it leaves its device. The models:
//! the tiny random-weights transformer (`crate::tiny`) and GGUF llamas
//! (`crate::gguf`).
//!
//! | file | what it holds |
//! | --- | --- |
//! | `mod.rs` | [`PagedModel`], [`PagedSeq`], [`Logits`], [`ModelError`] |
//! | `runner.rs` | [`PagedBackend`], [`PoolConfig`], [`PoolKind`], [`PagedStats`] |
//! | `verify.rs` | [`compare_rows`], [`Comparison`], [`Tolerance`] and the per-request log |

mod runner;
mod verify;

pub use runner::{PagedBackend, PagedStats, PoolConfig, PoolKind};
pub use verify::{argmax, compare_rows, Comparison, Tolerance};

use crate::kvpool::{KvLayout, KvPool, KvPoolError};
use radixkv::device::Tier;

/// Errors of a paged model and its backend.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A configuration the model or its pools cannot have.
    #[error("invalid model configuration: {0}")]
    InvalidConfig(String),
    /// Input that does not fit the model or the pool (empty sequences,
    /// missing slots, a batch without token data, a context too long).
    #[error("bad input to the model: {0}")]
    Input(String),
    /// A tensor operation failed.
    #[error("candle: {0}")]
    Candle(#[from] candle_core::Error),
    /// The KV pool refused an access (or has no CUDA driver).
    #[error("KV pool: {0}")]
    Pool(#[from] KvPoolError),
    /// A device (or the host tier) the backend has no pool for.
    #[error("no KV pool for {0}")]
    UnknownTier(Tier),
    /// A CUDA pool was asked for, but radixkv was built without feature
    /// `cuda`.
    #[error("CUDA KV pools need radixkv built with `--features cuda`")]
    CudaNotBuilt,
    /// The dense reference failed (or cannot reach a position).
    #[error("dense reference: {0}")]
    Reference(String),
}

/// One sequence of a paged pass: positions `start..tokens.len()` are
/// computed; `slots[p]` is the pool slot of position `p`.
#[derive(Clone, Copy, Debug)]
pub struct PagedSeq<'a> {
    /// Every token up to and including the computed ones.
    pub tokens: &'a [u32],
    /// The slot of each position (at least `tokens.len()` of them).
    pub slots: &'a [u32],
    /// The first computed position; the K/V of `0..start` is read from
    /// the pool.
    pub start: usize,
}

impl PagedSeq<'_> {
    /// Checks that the sequence computes something and has a slot for
    /// every position.
    pub fn validate(&self) -> Result<(), ModelError> {
        if self.start >= self.tokens.len() {
            return Err(ModelError::Input(format!(
                "nothing to compute: start {} of {} tokens",
                self.start,
                self.tokens.len()
            )));
        }
        if self.slots.len() < self.tokens.len() {
            return Err(ModelError::Input(format!(
                "{} slots for {} tokens",
                self.slots.len(),
                self.tokens.len()
            )));
        }
        Ok(())
    }
}

/// Checks that `pool` has `layers` layers of `row` floats, as a model
/// needs (the model's own layout: `pool_layout`).
pub fn check_pool(pool: &dyn KvPool, layers: usize, row: usize) -> Result<(), ModelError> {
    let l = pool.layout();
    if l.layers != layers || l.row != row {
        return Err(ModelError::InvalidConfig(format!(
            "a pool of {} layers x {} floats for a model of {layers} layers x {row}",
            l.layers, l.row
        )));
    }
    Ok(())
}

/// Logits of consecutive positions `start..start + rows()`.
#[derive(Clone, Debug, PartialEq)]
pub struct Logits {
    /// The position of the first row.
    pub start: usize,
    /// Floats per row.
    pub vocab: usize,
    /// Row-major, `rows × vocab`.
    pub data: Vec<f32>,
}

impl Logits {
    /// Rows (positions).
    pub fn rows(&self) -> usize {
        self.data.len() / self.vocab.max(1)
    }

    /// The logits of position `pos`, if this holds it.
    pub fn position(&self, pos: usize) -> Option<&[f32]> {
        let i = pos.checked_sub(self.start)?;
        self.data.get(i * self.vocab..(i + 1) * self.vocab)
    }

    /// The logits of the last position.
    pub fn last(&self) -> Option<&[f32]> {
        let n = self.rows();
        n.checked_sub(1).and_then(|i| self.position(self.start + i))
    }
}

/// A model that computes with its K/V in a [`KvPool`], and a dense
/// reference to check it with. Called from one scheduler thread per device
/// at once.
pub trait PagedModel: Send + Sync {
    /// The layout of a pool of `slots` slots for this model (its layers,
    /// one row of K or V per token).
    fn pool_layout(&self, slots: usize) -> KvLayout;

    /// One paged pass over `seqs` (see the module's docs). Returns, per
    /// sequence, the logits of every computed position (`all_rows`) or of
    /// the last one only.
    fn forward_paged(
        &self,
        pool: &mut dyn KvPool,
        seqs: &[PagedSeq<'_>],
        all_rows: bool,
    ) -> Result<Vec<Logits>, ModelError>;

    /// The dense reference's logits at `positions` (ascending, each below
    /// `tokens.len()`) of `tokens`, computed by code that reads no pool.
    fn reference(&self, tokens: &[u32], positions: &[usize]) -> Result<Vec<Vec<f32>>, ModelError>;

    /// How close the paged logits must be to the reference's.
    fn tolerance(&self) -> Tolerance;

    /// Whether a verifying backend keeps every computed position's logits
    /// (true) or only the positions that sample a token (false: a model
    /// whose reference is costly per position).
    fn verifies_every_position(&self) -> bool;

    /// A short description for reports.
    fn describe(&self) -> String;
}
