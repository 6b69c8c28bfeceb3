//! A tiny decoder-only transformer that runs real compute behind the
//! engine, with its K/V in the device's KV pool at the slots the cache
//! allocated: the end-to-end proof that prefix reuse is correct.
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
//! * **Backend** ([`TinyBackend`]): the engine's [`ModelBackend`]
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
//! ([`ModelBackend::release`]: finished, retracted or failed), recomputes
//! its whole context with the dense reference (teacher-forced on the same
//! tokens) and compares every computed position: within
//! [`LOGIT_TOLERANCE`] absolute, and the argmax where the top-2 margin
//! exceeds [`ARGMAX_MARGIN`]. That is the per-pass check (each pass's
//! computed positions against a recomputation of `WorkData.tokens`),
//! done once per request instead of once per pass.
//!
//! Independently of `verify`, every slot carries a tag of the token prefix
//! whose K/V it holds; a pass that reads a slot whose tag differs from its
//! own prefix (K/V never written for that prefix: a stale or foreign slot)
//! counts a stale read ([`TinyStats::stale_reads`]).
//!
//! ```
//! use radixkv::engine::tiny::{TinyConfig, TinyModel, PagedSeq};
//! use radixkv::kvpool::HostKvPool;
//! let model = TinyModel::new(TinyConfig::default())?;
//! let mut pool = HostKvPool::new(model.pool_layout(64));
//! let tokens = [5, 6, 7, 8, 9];
//! let slots = [10, 11, 12, 13, 14];
//! // First the prefix 5 6 7, then 8 9 reusing its K/V from the pool.
//! model.forward_paged(&mut pool, &[PagedSeq { tokens: &tokens[..3], slots: &slots[..3], start: 0 }], true)?;
//! let paged = model.forward_paged(&mut pool, &[PagedSeq { tokens: &tokens, slots: &slots, start: 3 }], true)?;
//! let dense = model.forward_dense(&tokens)?;
//! for pos in 3..5 {
//!     let c = radixkv::engine::tiny::compare_rows(paged[0].position(pos).unwrap(), dense.position(pos).unwrap());
//!     assert!(c.ok(), "{c:?}");
//! }
//! # Ok::<(), radixkv::engine::tiny::TinyError>(())
//! ```

use super::EngineConfig;
use crate::device::DeviceId;
use crate::kvpool::{HostKvPool, Kv, KvLayout, KvPool, KvPoolError};
use crate::sched::batch::{BackendError, Batch, ModelBackend, StepOutput, Verification};
use crate::workload::Workload;
use candle_core::{Device, Tensor};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

/// Largest absolute difference allowed between a logit of a paged pass and
/// the dense reference's.
pub const LOGIT_TOLERANCE: f32 = 1e-4;

/// Argmaxes are compared only where the reference's top-2 margin exceeds
/// this (a near tie may flip on rounding).
pub const ARGMAX_MARGIN: f32 = 1e-3;

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

    fn validate(&self) -> Result<(), TinyError> {
        let bad = |m: &str| Err(TinyError::InvalidConfig(m.to_string()));
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

/// Errors of the tiny model and its backend.
#[derive(Debug, thiserror::Error)]
pub enum TinyError {
    /// A configuration the model cannot have.
    #[error("invalid tiny model configuration: {0}")]
    InvalidConfig(String),
    /// Input that does not fit the model or the pool (empty sequences,
    /// missing slots, a batch without token data).
    #[error("bad input to the tiny model: {0}")]
    Input(String),
    /// A tensor operation failed.
    #[error("candle: {0}")]
    Candle(#[from] candle_core::Error),
    /// The KV pool refused an access (or has no CUDA driver).
    #[error("KV pool: {0}")]
    Pool(#[from] KvPoolError),
    /// A device the backend has no pool for.
    #[error("no KV pool for {0}")]
    UnknownDevice(DeviceId),
    /// A CUDA pool was asked for, but radixkv was built without feature
    /// `cuda`.
    #[error("CUDA KV pools need radixkv built with `--features cuda`")]
    CudaNotBuilt,
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

/// The argmax of a row and its margin over the runner-up (`None` for an
/// empty row; NaNs never win).
pub fn argmax(row: &[f32]) -> Option<(u32, f32)> {
    let mut best: Option<(usize, f32)> = None;
    let mut second = f32::NEG_INFINITY;
    for (i, &x) in row.iter().enumerate() {
        match best {
            Some((_, b)) if x > b => {
                second = b;
                best = Some((i, x));
            }
            Some(_) => second = second.max(x),
            None => best = Some((i, x)),
        }
    }
    best.map(|(i, b)| (i as u32, b - second))
}

/// How paged logits compare with the dense reference's.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Comparison {
    /// Positions (rows) compared.
    pub positions: u64,
    /// Largest absolute difference of a logit (NaN counts as infinite).
    pub max_abs_diff: f32,
    /// Positions with a logit off by more than [`LOGIT_TOLERANCE`].
    pub logit_mismatches: u64,
    /// Positions whose argmax was compared (top-2 margin above
    /// [`ARGMAX_MARGIN`]).
    pub argmax_checked: u64,
    /// Of which the argmaxes differ.
    pub argmax_mismatches: u64,
}

impl Comparison {
    /// No mismatch of logits or argmaxes.
    pub fn ok(&self) -> bool {
        self.logit_mismatches == 0 && self.argmax_mismatches == 0
    }

    /// Adds another comparison's counts.
    pub fn merge(&mut self, o: &Comparison) {
        self.positions += o.positions;
        self.max_abs_diff = self.max_abs_diff.max(o.max_abs_diff);
        self.logit_mismatches += o.logit_mismatches;
        self.argmax_checked += o.argmax_checked;
        self.argmax_mismatches += o.argmax_mismatches;
    }
}

/// Compares one position's logits (`got`, from a paged pass) with the
/// dense reference's (`want`). Rows of different lengths mismatch.
pub fn compare_rows(got: &[f32], want: &[f32]) -> Comparison {
    let mut c = Comparison {
        positions: 1,
        ..Comparison::default()
    };
    if got.len() != want.len() {
        c.logit_mismatches = 1;
        c.max_abs_diff = f32::INFINITY;
        return c;
    }
    for (a, b) in got.iter().zip(want) {
        let d = (a - b).abs();
        // A NaN difference is a mismatch too.
        let d = if d.is_nan() { f32::INFINITY } else { d };
        c.max_abs_diff = c.max_abs_diff.max(d);
    }
    if c.max_abs_diff > LOGIT_TOLERANCE {
        c.logit_mismatches = 1;
    }
    if let (Some((wi, margin)), Some((gi, _))) = (argmax(want), argmax(got)) {
        if margin > ARGMAX_MARGIN {
            c.argmax_checked = 1;
            if wi != gi {
                c.argmax_mismatches = 1;
            }
        }
    }
    c
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
    pub fn new(cfg: TinyConfig) -> Result<Self, TinyError> {
        cfg.validate()?;
        let device = Device::Cpu;
        let d = cfg.hidden();
        let mut rng = crate::rng::SplitMix64::new(cfg.seed ^ 0x7469_6E79_6D6F_6465);
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

    /// The logits of every position of `tokens`, computed at once without
    /// any pool (the reference the paged passes are checked against).
    pub fn forward_dense(&self, tokens: &[u32]) -> Result<Logits, TinyError> {
        if tokens.is_empty() {
            return Err(TinyError::Input("an empty sequence".into()));
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
    ) -> Result<Vec<Logits>, TinyError> {
        let l = pool.layout();
        if l.layers != self.cfg.layers || l.row != self.cfg.hidden() {
            return Err(TinyError::InvalidConfig(format!(
                "a pool of {} layers x {} floats for a model of {} layers x {}",
                l.layers,
                l.row,
                self.cfg.layers,
                self.cfg.hidden()
            )));
        }
        let mut inner = Vec::with_capacity(seqs.len());
        let mut want = Vec::new();
        let mut first = 0;
        for s in seqs {
            if s.start >= s.tokens.len() {
                return Err(TinyError::Input(format!(
                    "nothing to compute: start {} of {} tokens",
                    s.start,
                    s.tokens.len()
                )));
            }
            if s.slots.len() < s.tokens.len() {
                return Err(TinyError::Input(format!(
                    "{} slots for {} tokens",
                    s.slots.len(),
                    s.tokens.len()
                )));
            }
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
    ) -> Result<Vec<f32>, TinyError> {
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
                        return Err(TinyError::Input(
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

/// Where the backend keeps each device's KV pool.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PoolKind {
    /// Host memory ([`HostKvPool`]).
    #[default]
    Host,
    /// GPU memory (`CudaKvPool`, feature `cuda`): device `d`'s pool on GPU
    /// `d % GPUs`. Without the feature, or without a CUDA driver, building
    /// the backend is an error.
    Cuda,
}

impl std::str::FromStr for PoolKind {
    type Err = TinyError;
    fn from_str(s: &str) -> Result<Self, TinyError> {
        match s {
            "host" => Ok(PoolKind::Host),
            "cuda" | "gpu" => Ok(PoolKind::Cuda),
            _ => Err(TinyError::InvalidConfig(format!(
                "unknown KV pool {s:?} (host or cuda)"
            ))),
        }
    }
}

/// How to build a [`TinyBackend`].
#[derive(Clone, Debug, PartialEq)]
pub struct TinyBackendConfig {
    /// The model.
    pub model: TinyConfig,
    /// Devices, one pool each.
    pub devices: usize,
    /// Slots per pool: the engine's pages per device × page size.
    pub slots_per_device: usize,
    /// Host or GPU pools.
    pub pool: PoolKind,
    /// Check every computed position against the dense reference (when
    /// the request leaves the device, on that device's scheduler thread:
    /// latencies then include the check).
    pub verify: bool,
}

impl TinyBackendConfig {
    /// Pools that fit `engine`'s devices and pages, host memory, no
    /// verification, the default model.
    pub fn for_engine(engine: &EngineConfig) -> Self {
        TinyBackendConfig {
            model: TinyConfig::default(),
            devices: engine.devices,
            slots_per_device: engine.pages_per_device.saturating_mul(engine.page_size),
            pool: PoolKind::Host,
            verify: false,
        }
    }
}

/// What a [`TinyBackend`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct TinyStats {
    /// Prefill passes run.
    pub prefill_passes: u64,
    /// Decode passes run.
    pub decode_passes: u64,
    /// Positions computed (K/V written to the pool).
    pub computed_positions: u64,
    /// Positions whose K/V was read from the pool rather than computed.
    pub reused_positions: u64,
    /// Reads of a slot whose K/V was not written for the reader's token
    /// prefix (stale or foreign KV handed out by the cache).
    pub stale_reads: u64,
    /// Requests verified (a retracted request counts once per admission).
    pub verified_requests: u64,
    /// Passes whose computed positions were verified.
    pub verified_passes: u64,
    /// Requests with at least one mismatching position.
    pub mismatches: u64,
    /// The positions' comparison.
    pub comparison: Comparison,
}

/// One request's computed positions on a device, kept for verification.
#[derive(Debug, Default)]
struct RequestLog {
    tokens: Vec<u32>,
    rows: Vec<(usize, Vec<f32>)>,
    passes: u64,
}

struct DeviceState {
    pool: Box<dyn KvPool>,
    /// Per slot: the tag of the token prefix whose K/V it holds (0: none).
    tags: Vec<u64>,
    logs: HashMap<u64, RequestLog>,
}

/// Tags of the prefixes `tokens[..=p]` for every `p` (never 0).
fn prefix_tags(tokens: &[u32]) -> Vec<u64> {
    let mut h = 0x6A09_E667_F3BC_C908u64;
    tokens
        .iter()
        .map(|&t| {
            h = (h ^ u64::from(t)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            h ^= h >> 29;
            h | 1
        })
        .collect()
}

/// The tiny model as the engine's backend: one KV pool per device, sized
/// for the cache's slots.
///
/// ```
/// use radixkv::engine::{Engine, EngineConfig, EngineRequest};
/// use radixkv::engine::tiny::{TinyBackend, TinyBackendConfig};
/// use std::sync::Arc;
/// let cfg = EngineConfig { devices: 2, pages_per_device: 64, ..EngineConfig::default() };
/// let backend = Arc::new(TinyBackend::new(TinyBackendConfig {
///     verify: true,
///     ..TinyBackendConfig::for_engine(&cfg)
/// })?);
/// let engine = Engine::start(cfg, backend.clone()).unwrap();
/// let system: Vec<u32> = (0..40).collect();
/// for q in 0..4u32 {
///     let mut prompt = system.clone();
///     prompt.extend([1000 + q; 8]);
///     engine.submit(EngineRequest::new(prompt, 3)).unwrap();
/// }
/// for _ in 0..4 {
///     assert!(engine.completions().recv().unwrap().error.is_none());
/// }
/// engine.shutdown();
/// let s = backend.stats();
/// assert_eq!((s.verified_requests, s.mismatches, s.stale_reads), (4, 0, 0));
/// # Ok::<(), radixkv::engine::tiny::TinyError>(())
/// ```
pub struct TinyBackend {
    model: TinyModel,
    pool: PoolKind,
    verify: bool,
    devices: Vec<Mutex<DeviceState>>,
    stats: Mutex<TinyStats>,
}

impl std::fmt::Debug for TinyBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TinyBackend")
            .field("model", &self.model)
            .field("devices", &self.devices.len())
            .field("pool", &self.pool)
            .field("verify", &self.verify)
            .finish()
    }
}

#[cfg(feature = "cuda")]
fn cuda_pools(devices: usize, layout: KvLayout) -> Result<Vec<Box<dyn KvPool>>, TinyError> {
    use crate::kvpool::CudaKvPool;
    let mut pools: Vec<Box<dyn KvPool>> = Vec::with_capacity(devices);
    // The first pool proves a driver is there (a typed error otherwise);
    // only then is the GPU count asked for.
    pools.push(Box::new(CudaKvPool::new(0, layout)?));
    let gpus = cudarc::driver::CudaContext::device_count()
        .map_err(|e| KvPoolError::Cuda(format!("{e:?}")))?
        .max(1) as usize;
    for d in 1..devices {
        pools.push(Box::new(CudaKvPool::new(d % gpus, layout)?));
    }
    Ok(pools)
}

#[cfg(not(feature = "cuda"))]
fn cuda_pools(_devices: usize, _layout: KvLayout) -> Result<Vec<Box<dyn KvPool>>, TinyError> {
    Err(TinyError::CudaNotBuilt)
}

impl TinyBackend {
    /// Builds the model and one zeroed pool per device. A CUDA pool without
    /// feature `cuda` or without a driver is an error, not a panic.
    pub fn new(cfg: TinyBackendConfig) -> Result<Self, TinyError> {
        if cfg.devices == 0 {
            return Err(TinyError::InvalidConfig("at least one device".into()));
        }
        if cfg.slots_per_device == 0 || cfg.slots_per_device > u32::MAX as usize {
            return Err(TinyError::InvalidConfig(format!(
                "{} slots per device (1..=2^32-1)",
                cfg.slots_per_device
            )));
        }
        let model = TinyModel::new(cfg.model)?;
        let layout = model.pool_layout(cfg.slots_per_device);
        if layout
            .layers
            .checked_mul(2 * layout.row)
            .and_then(|x| x.checked_mul(layout.slots))
            .is_none_or(|n| n > isize::MAX as usize / 4)
        {
            return Err(TinyError::InvalidConfig(format!(
                "a pool of {} slots is too large",
                cfg.slots_per_device
            )));
        }
        let pools: Vec<Box<dyn KvPool>> = match cfg.pool {
            PoolKind::Host => (0..cfg.devices)
                .map(|_| Box::new(HostKvPool::new(layout)) as Box<dyn KvPool>)
                .collect(),
            PoolKind::Cuda => cuda_pools(cfg.devices, layout)?,
        };
        let devices = pools
            .into_iter()
            .map(|pool| {
                Mutex::new(DeviceState {
                    pool,
                    tags: vec![0; cfg.slots_per_device],
                    logs: HashMap::new(),
                })
            })
            .collect();
        Ok(TinyBackend {
            model,
            pool: cfg.pool,
            verify: cfg.verify,
            devices,
            stats: Mutex::new(TinyStats::default()),
        })
    }

    /// The model.
    pub fn model(&self) -> &TinyModel {
        &self.model
    }

    /// What the backend did so far.
    pub fn stats(&self) -> TinyStats {
        self.stats.lock().map(|s| *s).unwrap_or_default()
    }

    /// Runs `f` on `device`'s pool (tests read it, or corrupt a slot as a
    /// negative control).
    pub fn with_pool<R>(
        &self,
        device: DeviceId,
        f: impl FnOnce(&mut dyn KvPool) -> R,
    ) -> Result<R, TinyError> {
        let mut st = self.state(device)?;
        Ok(f(st.pool.as_mut()))
    }

    fn state(&self, device: DeviceId) -> Result<std::sync::MutexGuard<'_, DeviceState>, TinyError> {
        self.devices
            .get(device.index())
            .ok_or(TinyError::UnknownDevice(device))?
            .lock()
            .map_err(|_| TinyError::Input(format!("{device}'s state is poisoned")))
    }

    fn bump(&self, f: impl FnOnce(&mut TinyStats)) {
        if let Ok(mut s) = self.stats.lock() {
            f(&mut s);
        }
    }

    /// Runs one pass (see [`ModelBackend::step`]).
    fn pass(&self, device: DeviceId, batch: &Batch) -> Result<StepOutput, TinyError> {
        let t0 = Instant::now();
        // (request, work, whether it samples)
        let mut works = Vec::with_capacity(batch.prefill.len() + batch.decode.len());
        for p in &batch.prefill {
            let data = p.data.as_ref().ok_or_else(|| {
                TinyError::Input(format!("request {} came without token data", p.request))
            })?;
            works.push((p.request, data, p.new_tokens, p.samples));
        }
        for d in &batch.decode {
            let data = d.data.as_ref().ok_or_else(|| {
                TinyError::Input(format!("request {} came without token data", d.request))
            })?;
            works.push((d.request, data, 1, true));
        }
        let mut seqs = Vec::with_capacity(works.len());
        for &(req, data, new, _) in &works {
            let n = data.tokens.len();
            if data.slots.len() != n || new == 0 || new > n {
                return Err(TinyError::Input(format!(
                    "request {req}: {n} tokens, {} slots, {new} to compute",
                    data.slots.len()
                )));
            }
            seqs.push(PagedSeq {
                tokens: &data.tokens,
                slots: &data.slots,
                start: n - new,
            });
        }
        let mut st = self.state(device)?;
        let st = &mut *st;
        // Provenance: every read slot must hold its reader's prefix.
        let mut stale = 0u64;
        let mut reused = 0u64;
        let tags: Vec<Vec<u64>> = seqs.iter().map(|s| prefix_tags(s.tokens)).collect();
        for (s, tg) in seqs.iter().zip(&tags) {
            for (&slot, tag) in s.slots[..s.start].iter().zip(tg) {
                reused += 1;
                if st.tags.get(slot as usize) != Some(tag) {
                    stale += 1;
                }
            }
        }
        let logits = self
            .model
            .forward_paged(st.pool.as_mut(), &seqs, self.verify)?;
        let mut computed = 0u64;
        for (s, tg) in seqs.iter().zip(&tags) {
            let new = &s.slots[s.start..s.tokens.len()];
            for (&slot, &tag) in new.iter().zip(&tg[s.start..]) {
                if let Some(t) = st.tags.get_mut(slot as usize) {
                    *t = tag;
                }
                computed += 1;
            }
        }
        let mut next_tokens = Vec::new();
        for (&(req, data, _, samples), lg) in works.iter().zip(&logits) {
            if samples {
                if let Some((tok, _)) = lg.last().and_then(argmax) {
                    next_tokens.push((req, tok));
                }
            }
            if self.verify {
                self.log(st, req, &data.tokens, lg);
            }
        }
        let prefill = !batch.prefill.is_empty();
        let decode = !batch.decode.is_empty();
        self.bump(|s| {
            s.prefill_passes += u64::from(prefill);
            s.decode_passes += u64::from(decode);
            s.computed_positions += computed;
            s.reused_positions += reused;
            s.stale_reads += stale;
        });
        Ok(StepOutput {
            time: t0.elapsed(),
            next_tokens,
        })
    }

    /// Keeps a pass's logits of `req` for verification at release.
    fn log(&self, st: &mut DeviceState, req: u64, tokens: &[u32], lg: &Logits) {
        let log = st.logs.entry(req).or_default();
        let common = log.tokens.len().min(tokens.len());
        if log.tokens[..common] != tokens[..common] {
            // Not a continuation (cannot happen with the scheduler): check
            // what was kept and start again.
            let old = std::mem::take(log);
            self.check(old);
        }
        let log = st.logs.entry(req).or_default();
        if tokens.len() > log.tokens.len() {
            log.tokens = tokens.to_vec();
        }
        log.passes += 1;
        for i in 0..lg.rows() {
            let pos = lg.start + i;
            if let Some(row) = lg.position(pos) {
                log.rows.push((pos, row.to_vec()));
            }
        }
    }

    /// Recomputes a request's context densely and compares every kept row.
    fn check(&self, log: RequestLog) {
        let Some(end) = log.rows.iter().map(|(p, _)| p + 1).max() else {
            return;
        };
        let mut c = Comparison::default();
        let mut failed = false;
        match log
            .tokens
            .get(..end)
            .ok_or_else(|| TinyError::Input("rows past the tokens".into()))
            .and_then(|t| self.model.forward_dense(t))
        {
            Ok(dense) => {
                for (pos, row) in &log.rows {
                    match dense.position(*pos) {
                        Some(want) => c.merge(&compare_rows(row, want)),
                        None => failed = true,
                    }
                }
            }
            Err(_) => failed = true,
        }
        let bad = failed || !c.ok();
        self.bump(|s| {
            s.verified_requests += 1;
            s.verified_passes += log.passes;
            s.mismatches += u64::from(bad);
            s.comparison.merge(&c);
        });
    }
}

impl ModelBackend for TinyBackend {
    fn step(&self, device: DeviceId, batch: &Batch) -> Result<StepOutput, BackendError> {
        self.pass(device, batch).map_err(|e| BackendError {
            device,
            reason: e.to_string(),
        })
    }

    fn wants_data(&self) -> bool {
        true
    }

    fn release(&self, device: DeviceId, request: u64) {
        if !self.verify {
            return;
        }
        let log = match self.state(device) {
            Ok(mut st) => st.logs.remove(&request),
            Err(_) => None,
        };
        if let Some(log) = log {
            self.check(log);
        }
    }

    fn verification(&self) -> Option<Verification> {
        self.verify.then(|| {
            let s = self.stats();
            Verification {
                verified: s.verified_requests,
                mismatches: s.mismatches,
            }
        })
    }

    fn describe(&self) -> String {
        let c = self.model.config();
        format!(
            "tiny transformer ({} layers, {} heads x {}, vocab {}, seed {}; {} KV pools{})",
            c.layers,
            c.heads,
            c.head_dim,
            c.vocab,
            c.seed,
            match self.pool {
                PoolKind::Host => "host",
                PoolKind::Cuda => "CUDA",
            },
            if self.verify { ", verifying" } else { "" }
        )
    }
}

/// The default workload of `radixkv replay --model tiny` (when no size is
/// given): generated shared prefixes, 32 groups × 8 prompts (256
/// requests), 64-token system prompts, 16-token questions, 4 output
/// tokens, small enough to run in seconds on two cores.
pub fn default_workload(seed: u64) -> Workload {
    crate::workload::gsp(32, 8, 64, 16, 4, seed)
}

/// KV tokens per device of the default tiny replay: far less than the
/// default workload's shared prefixes (2,048 tokens), so prefixes are
/// evicted and inserted again during the run.
pub const DEFAULT_POOL_TOKENS: usize = 512;

/// Pages per device (page 0 reserved) holding [`DEFAULT_POOL_TOKENS`].
pub fn default_pages_per_device(page_size: usize) -> usize {
    DEFAULT_POOL_TOKENS / page_size.max(1) + 1
}
