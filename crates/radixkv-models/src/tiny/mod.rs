//! A tiny decoder-only transformer that runs real compute behind the
//! engine, with its K/V in the device's KV pool at the slots the cache
//! allocated: the end-to-end proof that prefix reuse is correct.
//!
//! | file | what it holds |
//! | --- | --- |
//! | `mod.rs` | [`TinyModel`]: configuration, weights, the paged pass |
//! | `reference.rs` | its dense reference and the tolerance of the check |
//! | `backend.rs` | [`TinyBackend`], the engine's backend over it |
//!
//! * **Model** ([`TinyModel`]): seeded random weights, f32, candle-core ops
//!   on the CPU. By default 2 layers, 4 heads of dimension 32 (hidden size
//!   128), a SiLU MLP of 512, RMSNorm, RoPE (base 10,000) and a vocabulary
//!   of 1,024.
//! * **Token ids**: workloads use ids up to 2³¹ and the engine's synthetic
//!   output ids are at or above 2³¹; the model embeds id `t` as row
//!   `t % vocab` ([`TinyModel::vocab_index`]). Its own samples are argmax
//!   indices, so they are below `vocab`.
//! * **Paged pass** ([`TinyModel::forward_paged`]): for each sequence, only
//!   the positions `start..` are computed; their K/V rows are written to
//!   the pool at their slots, and attention reads the K/V of every position
//!   up to them back from the pool (the prefix's rows come from whoever
//!   computed them: an earlier request, chunk or step). Every pool access
//!   goes through the [`KvPool`] trait, so the pool may be host memory or,
//!   with feature `cuda`, GPU memory; attention itself stays on the CPU.
//! * **Dense reference** ([`TinyModel::forward_dense`]): the same model on
//!   a whole sequence at once, with no pool.
//! * **Backend** ([`TinyBackend`]): the engine's
//!   [`ModelBackend`](radixkv_engine::sched::batch::ModelBackend)
//!   (`wants_data() == true`). Prefill passes write the new tokens' K/V
//!   and read the prefix's from the slots; decode passes append one slot
//!   per step. The next token of every sampling pass (a prefill that
//!   completes its prompt, every decode) is the argmax of the last
//!   position's logits. The scheduler prefers a workload's fixed outputs
//!   over the model's (teacher forcing), so only workloads without fixed
//!   outputs generate the model's tokens.
//!
//! With `verify`, the backend keeps the logits of every position each pass
//! computed and, when the request leaves the device
//! ([`ModelBackend::release`](radixkv_engine::sched::batch::ModelBackend::release):
//! finished, retracted or failed), recomputes its whole context with the
//! dense reference (teacher-forced on the same tokens) and compares every
//! computed position: within [`LOGIT_TOLERANCE`] absolute, and the argmax
//! where the top-2 margin exceeds [`ARGMAX_MARGIN`]. That is the per-pass check (each pass's
//! computed positions against a recomputation of `WorkData.tokens`),
//! done once per request instead of once per pass.
//!
//! Independently of `verify`, every slot carries a tag of the token prefix
//! whose K/V it holds; a pass that reads a slot whose tag differs from its
//! own prefix (K/V never written for that prefix: a stale or foreign slot)
//! counts a stale read ([`PagedStats::stale_reads`](crate::backend::PagedStats::stale_reads)).
//!
//! ```
//! use radixkv_models::backend::{compare_rows, PagedModel, PagedSeq};
//! use radixkv_models::tiny::{TinyConfig, TinyModel, TOLERANCE};
//! use radixkv_models::kvpool::HostKvPool;
//! let model = TinyModel::new(TinyConfig::default())?;
//! let mut pool = HostKvPool::new(model.pool_layout(64));
//! let tokens = [5, 6, 7, 8, 9];
//! let slots = [10, 11, 12, 13, 14];
//! // First the prefix 5 6 7, then 8 9 reusing its K/V from the pool.
//! model.forward_paged(&mut pool, &[PagedSeq { tokens: &tokens[..3], slots: &slots[..3], start: 0 }], true)?;
//! let paged = model.forward_paged(&mut pool, &[PagedSeq { tokens: &tokens, slots: &slots, start: 3 }], true)?;
//! let dense = model.forward_dense(&tokens)?;
//! for pos in 3..5 {
//!     let c = compare_rows(paged[0].position(pos).unwrap(), dense.position(pos).unwrap(), TOLERANCE);
//!     assert!(c.ok(), "{c:?}");
//! }
//! # Ok::<(), radixkv_models::backend::ModelError>(())
//! ```

// This file is the model (configuration, weights, the paged forward pass);
// `reference` is its dense reference, and `backend` the engine's backend over
// it with the defaults of `radixkv replay --model tiny`.
mod backend;
mod reference;

pub use backend::{default_pages_per_device, TinyBackend, DEFAULT_POOL_TOKENS};
pub use reference::{ARGMAX_MARGIN, LOGIT_TOLERANCE, TOLERANCE};

use crate::backend::{Logits, ModelError, PagedSeq};
use crate::kvpool::{Kv, KvLayout, KvPool};
use candle_core::{Device, Tensor};

/// The model's shape and seed.
#[derive(Clone, Debug, PartialEq)]
pub struct TinyConfig {
    /// Transformer layers (default 2).
    pub layers: usize,
    /// Attention heads (default 4).
    pub heads: usize,
    /// Dimension of a head (default 32; even, for RoPE).
    pub head_dim: usize,
    /// Vocabulary size; token id `t` is embedded as row `t % vocab`
    /// (default 1,024).
    pub vocab: usize,
    /// Hidden size of the MLP (default 512).
    pub mlp: usize,
    /// RoPE base (default 10,000).
    pub rope_base: f64,
    /// Seed of the weights (default 7).
    pub seed: u64,
}

impl Default for TinyConfig {
    fn default() -> Self {
        TinyConfig {
            layers: 2,
            heads: 4,
            head_dim: 32,
            vocab: 1024,
            mlp: 512,
            rope_base: 10_000.0,
            seed: 7,
        }
    }
}

impl TinyConfig {
    /// The model's hidden size: `heads × head_dim` (also the floats in one
    /// K or V row of the pool).
    pub fn hidden(&self) -> usize {
        self.heads * self.head_dim
    }

    fn validate(&self) -> Result<(), ModelError> {
        let bad = |m: &str| Err(ModelError::InvalidConfig(m.to_string()));
        if self.layers == 0 || self.heads == 0 || self.vocab == 0 || self.mlp == 0 {
            return bad("layers, heads, vocab and mlp must be at least 1");
        }
        if self.head_dim == 0 || !self.head_dim.is_multiple_of(2) {
            return bad("head_dim must be even and at least 2 (RoPE rotates pairs)");
        }
        if self.vocab > u32::MAX as usize {
            return bad("vocab must fit a u32");
        }
        if !(self.rope_base.is_finite() && self.rope_base > 1.0) {
            return bad("rope_base must be a finite number above 1");
        }
        Ok(())
    }
}

struct Layer {
    wq: Tensor,
    wk: Tensor,
    wv: Tensor,
    wo: Tensor,
    w1: Tensor,
    w2: Tensor,
}

/// The tiny transformer: weights and the two forward paths.
pub struct TinyModel {
    cfg: TinyConfig,
    device: Device,
    embed: Tensor,
    layers: Vec<Layer>,
    head: Tensor,
    inv_freq: Vec<f64>,
}

impl std::fmt::Debug for TinyModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TinyModel").field("cfg", &self.cfg).finish()
    }
}

/// `x / sqrt(mean(x²) + eps)` over the last dimension of `(rows, hidden)`.
fn rms_norm(x: &Tensor) -> candle_core::Result<Tensor> {
    let ms = x.sqr()?.mean_keepdim(1)?.affine(1.0, 1e-5)?.sqrt()?;
    x.broadcast_div(&ms)
}

/// Softmax over the last dimension (candle-core has none: max, subtract,
/// exp, sum, divide).
fn softmax_last(x: &Tensor) -> candle_core::Result<Tensor> {
    let d = x.rank() - 1;
    let m = x.max_keepdim(d)?;
    let e = x.broadcast_sub(&m)?.exp()?;
    let s = e.sum_keepdim(d)?;
    e.broadcast_div(&s)
}

impl TinyModel {
    /// A model with weights drawn from `cfg.seed` (the same seed gives the
    /// same weights).
    pub fn new(cfg: TinyConfig) -> Result<Self, ModelError> {
        cfg.validate()?;
        let device = Device::Cpu;
        let d = cfg.hidden();
        let mut rng = radixkv_engine::rng::SplitMix64::new(cfg.seed ^ 0x7469_6E79_6D6F_6465);
        // Uniform with variance `var`.
        let mut mat = |rows: usize, cols: usize, var: f32| -> candle_core::Result<Tensor> {
            let a = (3.0 * var).sqrt();
            let v: Vec<f32> = (0..rows * cols).map(|_| rng.symmetric_f32() * a).collect();
            Tensor::from_vec(v, (rows, cols), &Device::Cpu)
        };
        let embed = mat(cfg.vocab, d, 1.0)?;
        let mut layers = Vec::with_capacity(cfg.layers);
        for _ in 0..cfg.layers {
            let lin = 1.0 / d as f32;
            layers.push(Layer {
                wq: mat(d, d, lin)?,
                wk: mat(d, d, lin)?,
                wv: mat(d, d, lin)?,
                wo: mat(d, d, lin)?,
                w1: mat(d, cfg.mlp, lin)?,
                w2: mat(cfg.mlp, d, 1.0 / cfg.mlp as f32)?,
            });
        }
        let head = mat(d, cfg.vocab, 1.0 / d as f32)?;
        let half = cfg.head_dim / 2;
        let inv_freq = (0..half)
            .map(|i| cfg.rope_base.powf(-(2.0 * i as f64) / cfg.head_dim as f64))
            .collect();
        Ok(TinyModel {
            cfg,
            device,
            embed,
            layers,
            head,
            inv_freq,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &TinyConfig {
        &self.cfg
    }

    /// The embedding row of token id `id`: `id % vocab`.
    pub fn vocab_index(&self, id: u32) -> u32 {
        (id as u64 % self.cfg.vocab as u64) as u32
    }

    /// The layout of a pool of `slots` slots for this model (its layers,
    /// one row of `hidden()` floats per K or V).
    pub fn pool_layout(&self, slots: usize) -> KvLayout {
        KvLayout {
            layers: self.cfg.layers,
            slots,
            row: self.cfg.hidden(),
        }
    }

    /// One paged pass over `seqs`: computes each sequence's positions
    /// `start..`, writes their K/V to `pool` at their slots, and attends
    /// over the K/V of every earlier position read from `pool`. Returns,
    /// per sequence, the logits of every computed position (`all_rows`) or
    /// of the last one only. Linear layers run once over the rows of all
    /// sequences; attention per sequence.
    pub fn forward_paged(
        &self,
        pool: &mut dyn KvPool,
        seqs: &[PagedSeq<'_>],
        all_rows: bool,
    ) -> Result<Vec<Logits>, ModelError> {
        crate::backend::check_pool(pool, self.cfg.layers, self.cfg.hidden())?;
        let mut inner = Vec::with_capacity(seqs.len());
        let mut want = Vec::new();
        let mut first = 0;
        for s in seqs {
            s.validate()?;
            let n = s.tokens.len() - s.start;
            if all_rows {
                want.extend(first..first + n);
            } else {
                want.push(first + n - 1);
            }
            first += n;
            inner.push(Seq {
                tokens: s.tokens,
                slots: Some(s.slots),
                start: s.start,
            });
        }
        if inner.is_empty() {
            return Ok(Vec::new());
        }
        let data = self.run(&inner, Some(pool), &want)?;
        let v = self.cfg.vocab;
        let mut out = Vec::with_capacity(seqs.len());
        let mut at = 0;
        for s in seqs {
            let rows = if all_rows {
                s.tokens.len() - s.start
            } else {
                1
            };
            out.push(Logits {
                start: s.tokens.len() - rows,
                vocab: v,
                data: data[at * v..(at + rows) * v].to_vec(),
            });
            at += rows;
        }
        Ok(out)
    }

    /// `cos` and `sin` of every row's angles, `(rows, 1, head_dim / 2)`.
    fn rope_tables(&self, pos: &[usize]) -> candle_core::Result<(Tensor, Tensor)> {
        let half = self.inv_freq.len();
        let mut cos = Vec::with_capacity(pos.len() * half);
        let mut sin = Vec::with_capacity(pos.len() * half);
        for &p in pos {
            for &f in &self.inv_freq {
                let a = p as f64 * f;
                cos.push(a.cos() as f32);
                sin.push(a.sin() as f32);
            }
        }
        Ok((
            Tensor::from_vec(cos, (pos.len(), 1, half), &self.device)?,
            Tensor::from_vec(sin, (pos.len(), 1, half), &self.device)?,
        ))
    }

    /// Rotates each head's halves of `x` `(rows, hidden)` by its row's angles.
    fn rope(&self, x: &Tensor, cos: &Tensor, sin: &Tensor) -> candle_core::Result<Tensor> {
        let (rows, hidden) = x.dims2()?;
        let (h, hd) = (self.cfg.heads, self.cfg.head_dim);
        let x = x.reshape((rows, h, hd))?;
        let x1 = x.narrow(2, 0, hd / 2)?;
        let x2 = x.narrow(2, hd / 2, hd / 2)?;
        let a = (x1.broadcast_mul(cos)? - x2.broadcast_mul(sin)?)?;
        let b = (x2.broadcast_mul(cos)? + x1.broadcast_mul(sin)?)?;
        Tensor::cat(&[a, b], 2)?.reshape((rows, hidden))
    }

    /// Causal attention of `q` `(n, hidden)` at positions `start..start+n`
    /// over `k`, `v` `(len, hidden)` at positions `0..len`.
    fn attention(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        start: usize,
    ) -> candle_core::Result<Tensor> {
        let (h, hd) = (self.cfg.heads, self.cfg.head_dim);
        let n = q.dims2()?.0;
        let len = k.dims2()?.0;
        let heads = |t: &Tensor, rows: usize| -> candle_core::Result<Tensor> {
            t.reshape((rows, h, hd))?.transpose(0, 1)?.contiguous()
        };
        let (q, k, v) = (heads(q, n)?, heads(k, len)?, heads(v, len)?);
        let kt = k.transpose(1, 2)?.contiguous()?;
        let mut s = q.matmul(&kt)?.affine(1.0 / (hd as f64).sqrt(), 0.0)?; // (h, n, len)
        if start + n < len || n > 1 {
            // Query i (position start + i) sees keys 0..=start + i.
            let mask: Vec<f32> = (0..n)
                .flat_map(|i| {
                    (0..len).map(move |j| {
                        if j <= start + i {
                            0.0
                        } else {
                            f32::NEG_INFINITY
                        }
                    })
                })
                .collect();
            let mask = Tensor::from_vec(mask, (1, n, len), &self.device)?;
            s = s.broadcast_add(&mask)?;
        }
        let p = softmax_last(&s)?;
        p.matmul(&v)?.transpose(0, 1)?.reshape((n, h * hd))
    }

    /// The forward pass over the computed rows of `seqs` (K/V through
    /// `pool` when given, else each sequence's own rows, which must then
    /// start at 0); returns the logits of rows `want` (indices into the
    /// concatenated computed rows), row-major.
    fn run(
        &self,
        seqs: &[Seq<'_>],
        mut pool: Option<&mut dyn KvPool>,
        want: &[usize],
    ) -> Result<Vec<f32>, ModelError> {
        let d = self.cfg.hidden();
        let mut ids = Vec::new();
        let mut pos = Vec::new();
        let mut spans = Vec::with_capacity(seqs.len());
        for s in seqs {
            spans.push((ids.len(), s.tokens.len() - s.start));
            for (p, &t) in s.tokens.iter().enumerate().skip(s.start) {
                ids.push(self.vocab_index(t));
                pos.push(p);
            }
        }
        let rows = ids.len();
        let ids = Tensor::from_vec(ids, rows, &self.device)?;
        let mut x = self.embed.index_select(&ids, 0)?;
        let (cos, sin) = self.rope_tables(&pos)?;
        for (li, layer) in self.layers.iter().enumerate() {
            let h = rms_norm(&x)?;
            let q = self.rope(&h.matmul(&layer.wq)?, &cos, &sin)?;
            let k = self.rope(&h.matmul(&layer.wk)?, &cos, &sin)?;
            let v = h.matmul(&layer.wv)?;
            let mut outs = Vec::with_capacity(seqs.len());
            for (s, &(o, n)) in seqs.iter().zip(&spans) {
                let (qs, ks, vs) = (q.narrow(0, o, n)?, k.narrow(0, o, n)?, v.narrow(0, o, n)?);
                let (kc, vc) = match (pool.as_deref_mut(), s.slots) {
                    (Some(p), Some(slots)) => {
                        let end = s.tokens.len();
                        let new = &slots[s.start..end];
                        p.write_rows(li, Kv::K, new, &ks.flatten_all()?.to_vec1::<f32>()?)?;
                        p.write_rows(li, Kv::V, new, &vs.flatten_all()?.to_vec1::<f32>()?)?;
                        // Every position, the new ones included, read back
                        // from the pool.
                        let kr = p.read_rows(li, Kv::K, &slots[..end])?;
                        let vr = p.read_rows(li, Kv::V, &slots[..end])?;
                        (
                            Tensor::from_vec(kr, (end, d), &self.device)?,
                            Tensor::from_vec(vr, (end, d), &self.device)?,
                        )
                    }
                    _ if s.start == 0 => (ks, vs),
                    _ => {
                        return Err(ModelError::Input(
                            "a sequence with a prefix needs a pool and slots".into(),
                        ))
                    }
                };
                outs.push(self.attention(&qs, &kc, &vc, s.start)?);
            }
            let a = Tensor::cat(&outs, 0)?;
            x = (x + a.matmul(&layer.wo)?)?;
            let h = rms_norm(&x)?;
            x = (&x + h.matmul(&layer.w1)?.silu()?.matmul(&layer.w2)?)?;
        }
        let want: Vec<u32> = want.iter().map(|&i| i as u32).collect();
        let n = want.len();
        let sel = x.index_select(&Tensor::from_vec(want, n, &self.device)?, 0)?;
        let logits = rms_norm(&sel)?.matmul(&self.head)?;
        Ok(logits.flatten_all()?.to_vec1::<f32>()?)
    }
}

/// A sequence of [`TinyModel::run`]: slots only on the paged path.
struct Seq<'a> {
    tokens: &'a [u32],
    slots: Option<&'a [u32]>,
    start: usize,
}
