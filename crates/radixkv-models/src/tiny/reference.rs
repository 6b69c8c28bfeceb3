//! The tiny model's dense reference ([`TinyModel::forward_dense`]: the
//! model on a whole sequence at once, no pool) and how close the paged
//! pass must come to it ([`TOLERANCE`]).

use super::{Seq, TinyModel};
use crate::backend::{Logits, ModelError, Tolerance};

/// Largest absolute difference allowed between a logit of a paged pass and
/// the dense reference's (f32 throughout: only the order of sums differs).
pub const LOGIT_TOLERANCE: f32 = 1e-4;

/// Argmaxes are compared only where the reference's top-2 margin exceeds
/// this (a near tie may flip on rounding).
pub const ARGMAX_MARGIN: f32 = 1e-3;

/// [`LOGIT_TOLERANCE`] and [`ARGMAX_MARGIN`] together.
pub const TOLERANCE: Tolerance = Tolerance {
    logit: LOGIT_TOLERANCE,
    argmax_margin: ARGMAX_MARGIN,
};

impl TinyModel {
    /// The logits of every position of `tokens`, computed at once without
    /// any pool (the reference the paged passes are checked against).
    pub fn forward_dense(&self, tokens: &[u32]) -> Result<Logits, ModelError> {
        if tokens.is_empty() {
            return Err(ModelError::Input("an empty sequence".into()));
        }
        let seq = Seq {
            tokens,
            slots: None,
            start: 0,
        };
        let rows: Vec<usize> = (0..tokens.len()).collect();
        let data = self.run(&[seq], None, &rows)?;
        Ok(Logits {
            start: 0,
            vocab: self.cfg.vocab,
            data,
        })
    }
}
