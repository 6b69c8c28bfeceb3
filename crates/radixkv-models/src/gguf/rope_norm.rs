//! The per-row operations around attention, computed as llama.cpp
//! computes them so that the logits come close to the reference runtime's:
//! RoPE ([`Rope`]: one multiplication per pair for the angles, in f32,
//! pairs as the architecture says) and the RMSNorm ([`rms_norm`]: squares
//! summed in f64).

use super::arch::RopeStyle;
use super::config::LlamaConfig;
use candle_core::{Device, Tensor};

/// A model's RoPE: how far each pair of a head turns at a position, and
/// which dimensions pair up.
#[derive(Clone, Copy, Debug)]
pub(super) struct Rope {
    head_dim: usize,
    /// `base^(-2 / head_dim)`: pair `i` of position `p` turns by `p ×
    /// theta_scale^i`, computed as llama.cpp does (one multiplication per
    /// pair, in f32), so the angles are the reference runtime's to the bit.
    theta_scale: f32,
    style: RopeStyle,
}

impl Rope {
    pub(super) fn new(cfg: &LlamaConfig) -> Rope {
        Rope {
            head_dim: cfg.head_dim,
            theta_scale: cfg.rope_base.powf(-2.0 / cfg.head_dim as f32),
            style: cfg.arch.rope,
        }
    }

    /// `cos` and `sin` of every row's angles, `(rows, 1, head_dim / 2)`:
    /// one table per row, as candle's rotations take them.
    pub(super) fn tables(&self, pos: &[usize]) -> candle_core::Result<(Tensor, Tensor)> {
        let half = self.head_dim / 2;
        let mut cos = Vec::with_capacity(pos.len() * half);
        let mut sin = Vec::with_capacity(pos.len() * half);
        for &p in pos {
            let mut theta = p as f32;
            for _ in 0..half {
                cos.push(theta.cos());
                sin.push(theta.sin());
                theta *= self.theta_scale;
            }
        }
        Ok((
            Tensor::from_vec(cos, (pos.len(), 1, half), &Device::Cpu)?,
            Tensor::from_vec(sin, (pos.len(), 1, half), &Device::Cpu)?,
        ))
    }

    /// Rotates the pairs of each head of `x` `(rows, heads × head_dim)`
    /// by the rows' angles ([`tables`](Self::tables)).
    pub(super) fn apply(
        &self,
        x: &Tensor,
        heads: usize,
        cos: &Tensor,
        sin: &Tensor,
    ) -> candle_core::Result<Tensor> {
        let (rows, width) = x.dims2()?;
        let x = x.reshape((rows, heads, 1, self.head_dim))?.contiguous()?;
        let turned = match self.style {
            RopeStyle::Interleaved => candle_nn::rotary_emb::rope_i(&x, cos, sin)?,
            RopeStyle::Halves => candle_nn::rotary_emb::rope(&x, cos, sin)?,
        };
        turned.reshape((rows, width))
    }
}

/// RMSNorm of each row of `x` `(rows, hidden)`, times `w`, computed as
/// llama.cpp computes it: the squares summed in f64, `1 / sqrt(mean +
/// eps)` in f32, each element scaled, then multiplied by its weight.
pub(super) fn rms_norm(x: &Tensor, w: &[f32], eps: f32) -> candle_core::Result<Tensor> {
    let (rows, hidden) = x.dims2()?;
    let mut y = x.flatten_all()?.to_vec1::<f32>()?;
    for row in y.chunks_exact_mut(hidden) {
        let sum: f64 = row.iter().map(|&v| (v * v) as f64).sum();
        let mean = (sum / hidden as f64) as f32;
        let scale = 1.0 / (mean + eps).sqrt();
        for (v, &g) in row.iter_mut().zip(w) {
            *v = (*v * scale) * g;
        }
    }
    Tensor::from_vec(y, (rows, hidden), x.device())
}
