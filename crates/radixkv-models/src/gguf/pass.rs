//! One pass of the layers over the computed rows of some sequences
//! ([`Pass::run`]): embeddings, then per block the norm, the Q/K/V
//! projections (with biases where the architecture has them), RoPE, the
//! K/V rows handed to the caller to store and read back for attention,
//! the output projection and the MLP; then the final norm and the logits
//! of the rows asked for. The paged passes and the dense reference are
//! this one pass with another [`StoreKv`]. Every step reads and writes
//! row-major f32 slices (`rows × width`): the matmuls take and return
//! them, and the element-wise steps are computed as candle's CPU ops
//! compute them, so the logits are the bits they were when the pass went
//! through candle tensors.

use super::attention::attend_rows;
use super::config::LlamaConfig;
use super::kernels::Kernel;
use super::qmatmul::matmuls;
use super::rope_norm::rms_norm;
use super::rope_norm::Rope;
use super::weights::{Block, Weights};
use crate::backend::ModelError;

/// One pass's inputs: a model's weights, shape, RoPE and kernels.
pub(super) struct Pass<'a> {
    pub(super) weights: &'a Weights,
    pub(super) cfg: &'a LlamaConfig,
    pub(super) rope: &'a Rope,
    pub(super) kernel: Kernel,
}

impl Pass<'_> {
    /// The layers over the computed rows of `parts` (`(tokens, start)`:
    /// positions `start..` are computed); `kv(layer, part, k, v)` takes the
    /// part's new K/V rows, stores them, and hands the K/V rows of all its
    /// positions to attention.
    /// Returns each part's logits, row-major, of the rows `rows` says.
    ///
    /// The pass runs on one of rayon's threads: its parallel parts (a few
    /// per layer) then fork from inside the pool, where an idle thread is
    /// still spinning for work, instead of each being queued from outside
    /// and waited for on a lock. The price, when several devices' passes
    /// run at once: a thread waiting inside one pass may take up another
    /// device's whole pass queued meanwhile, so a short decode step can
    /// finish only after another device's long prefill (the work done is
    /// the same; which device waits is not).
    pub(super) fn run(
        &self,
        parts: &[(&[u32], usize)],
        rows_wanted: LogitRows<'_>,
        kv: &mut StoreKv<'_>,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        rayon::scope(|_| self.run_in_pool(parts, rows_wanted, kv))
    }

    /// [`run`](Self::run), on the thread it was called on.
    fn run_in_pool(
        &self,
        parts: &[(&[u32], usize)],
        rows_wanted: LogitRows<'_>,
        kv: &mut StoreKv<'_>,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        if parts.is_empty() {
            return Ok(Vec::new());
        }
        let c = self.cfg;
        let eps = c.rms_eps;
        let width = c.heads * c.head_dim;
        let mut ids = Vec::new();
        let mut pos = Vec::new();
        let mut spans = Vec::with_capacity(parts.len());
        let mut want = Vec::new();
        let mut counts = Vec::with_capacity(parts.len());
        for &(tokens, start) in parts {
            let n = tokens.len() - start;
            let first = ids.len();
            spans.push((first, n));
            let before = want.len();
            match rows_wanted {
                LogitRows::All => want.extend(first..first + n),
                LogitRows::Last => want.push(first + n - 1),
                LogitRows::At(at) => want.extend(
                    at.iter()
                        .filter(|&&p| p >= start && p < tokens.len())
                        .map(|&p| first + p - start),
                ),
            }
            counts.push(want.len() - before);
            for (p, &t) in tokens.iter().enumerate().skip(start) {
                ids.push(c.vocab_index(t));
                pos.push(p);
            }
        }
        let rows = ids.len();
        let kernel = self.kernel;
        let mut x = self.weights.embed_rows(c.hidden, &ids);
        let (cos, sin) = self.rope.tables(&pos);
        let kv_width = c.kv_row_floats();
        for (li, b) in self.weights.blocks.iter().enumerate() {
            let h = rms_norm(&x, &b.attn_norm, eps);
            let [mut q, mut k, v] = self.project_qkv(b, &h, rows);
            self.rope.apply(&mut q, c.heads, &cos, &sin);
            self.rope.apply(&mut k, c.kv_heads, &cos, &sin);
            let mut att = Vec::with_capacity(rows * width);
            for (pi, (&(_, start), &(o, n))) in parts.iter().zip(&spans).enumerate() {
                let qr = &q[o * width..(o + n) * width];
                let (kr, vr) = (
                    &k[o * kv_width..(o + n) * kv_width],
                    &v[o * kv_width..(o + n) * kv_width],
                );
                let mut out = Vec::new();
                kv(li, pi, kr, vr, &mut |kr, vr| {
                    out = attend_rows(kernel, c, qr, kr, vr, start)
                })?;
                att.extend(out);
            }
            add_into(&mut x, &b.wo.matmul(kernel, &att, rows));
            let h = rms_norm(&x, &b.ffn_norm, eps);
            let [mut mlp, up] = matmuls([&b.gate, &b.up], kernel, &h, rows);
            for (g, u) in mlp.iter_mut().zip(&up) {
                *g = silu(*g) * u;
            }
            add_into(&mut x, &b.down.matmul(kernel, &mlp, rows));
        }
        let hidden = c.hidden;
        let mut sel = Vec::with_capacity(want.len() * hidden);
        for &r in &want {
            sel.extend_from_slice(&x[r * hidden..][..hidden]);
        }
        let h = rms_norm(&sel, &self.weights.norm, eps);
        let data = self.weights.output.matmul(kernel, &h, want.len());
        let v = c.vocab;
        let mut out = Vec::with_capacity(parts.len());
        let mut at = 0;
        for rows in counts {
            out.push(data[at * v..(at + rows) * v].to_vec());
            at += rows;
        }
        Ok(out)
    }

    /// The Q, K and V projections of `h` (`rows` rows), each plus its
    /// bias where the architecture has them.
    fn project_qkv(&self, b: &Block, h: &[f32], rows: usize) -> [Vec<f32>; 3] {
        let mut qkv = matmuls([&b.wq, &b.wk, &b.wv], self.kernel, h, rows);
        if let Some(bias) = &b.bias {
            for (x, bias) in qkv.iter_mut().zip(bias) {
                for row in x.chunks_exact_mut(bias.len()) {
                    add_into(row, bias);
                }
            }
        }
        qkv
    }
}

/// Stores a part's new K/V rows and hands the K/V rows of all its
/// positions (one `kv_row_floats` slice each) to attention: given `(layer, part,
/// new K, new V, attention)`.
pub(super) type StoreKv<'a> =
    dyn FnMut(usize, usize, &[f32], &[f32], &mut Attend<'_>) -> Result<(), ModelError> + Send + 'a;

/// Attention over a part's K rows and V rows, one slice per position.
pub(super) type Attend<'a> = dyn FnMut(&[&[f32]], &[&[f32]]) + 'a;

/// Which rows' logits [`Pass::run`] returns.
#[derive(Clone, Copy)]
pub(super) enum LogitRows<'a> {
    /// Every computed row of every part.
    All,
    /// The last row of every part.
    Last,
    /// These positions (ascending) of every part.
    At(&'a [usize]),
}

/// `x += y`, element by element (the residual connections, the biases).
fn add_into(x: &mut [f32], y: &[f32]) {
    for (x, y) in x.iter_mut().zip(y) {
        *x += y;
    }
}

/// SiLU, `v / (1 + e^−v)` in f32, as candle's CPU op computes it.
fn silu(v: f32) -> f32 {
    v / (1.0 + (-v).exp())
}
