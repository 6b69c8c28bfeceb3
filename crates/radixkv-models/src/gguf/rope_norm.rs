//! The per-row operations around attention, computed as llama.cpp
//! computes them so that the logits come close to the reference runtime's:
//! RoPE ([`Rope`]: one multiplication per pair for the angles, in f32,
//! pairs as the architecture says) and the RMSNorm ([`rms_norm`]: squares
//! summed in f64).

use super::arch::RopeStyle;
use super::config::LlamaConfig;

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

    /// `cos` and `sin` of every row's angles, `rows × head_dim / 2` each
    /// (row-major): row `r`'s pair `i` turns by `pos[r] × theta_scale^i`.
    pub(super) fn tables(&self, pos: &[usize]) -> (Vec<f32>, Vec<f32>) {
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
        (cos, sin)
    }

    /// Rotates, in place, the pairs of each head of `x` (`rows × heads ×
    /// head_dim`, row-major) by the rows' angles ([`tables`](Self::tables)),
    /// each pair as candle's `rope_i` (interleaved) or `rope` (halves)
    /// computes it: `(a cos − b sin, a sin + b cos)` in f32.
    pub(super) fn apply(&self, x: &mut [f32], heads: usize, cos: &[f32], sin: &[f32]) {
        let (hd, half) = (self.head_dim, self.head_dim / 2);
        let width = heads * hd;
        for (r, row) in x.chunks_exact_mut(width).enumerate() {
            let (cos, sin) = (&cos[r * half..][..half], &sin[r * half..][..half]);
            for head in row.chunks_exact_mut(hd) {
                for i in 0..half {
                    let (i1, i2) = match self.style {
                        RopeStyle::Interleaved => (2 * i, 2 * i + 1),
                        RopeStyle::Halves => (i, i + half),
                    };
                    let (a, b) = (head[i1], head[i2]);
                    head[i1] = a * cos[i] - b * sin[i];
                    head[i2] = a * sin[i] + b * cos[i];
                }
            }
        }
    }
}

/// RMSNorm of each row of `x` (`rows × hidden`, row-major), times `w`,
/// computed as llama.cpp computes it: the squares summed in f64, `1 /
/// sqrt(mean + eps)` in f32, each element scaled, then multiplied by its
/// weight.
pub(super) fn rms_norm(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let hidden = w.len();
    let mut y = x.to_vec();
    for row in y.chunks_exact_mut(hidden) {
        let sum: f64 = row.iter().map(|&v| (v * v) as f64).sum();
        let mean = (sum / hidden as f64) as f32;
        let scale = 1.0 / (mean + eps).sqrt();
        for (v, &g) in row.iter_mut().zip(w) {
            *v = (*v * scale) * g;
        }
    }
    y
}
