//! A GGUF llama computed with its K/V in the engine's KV pools
//! ([`LlamaModel`], a [`PagedModel`]): quantized matmuls over the file's
//! tensors (`super::qmatmul`: `Q4_1` and `Q8_0` with AVX2; a matmul weight
//! of another type is refused at load, see `super::tensors`),
//! grouped-query attention reading every earlier position's K/V back from
//! the slots the cache allocated, and GGUF's interleaved RoPE.
//!
//! Every step is computed row by row in a fixed order (the matmuls
//! quantize each activation row on its own; attention is a loop per query
//! row and head, a K/V head's query heads taken together or apart with the
//! same bits), so a position's logits do not depend on how the prompt was
//! chunked or batched, nor on how the work was shared among threads. That
//! matters: the matmuls quantize activations to 8 bits, so a rounding
//! difference of 1e-7 in one layer (another summation order in a batched
//! attention) can flip a quantization step and move the logits by 0.1 to 1
//! thirty layers later.
//! For the same reason the RMSNorm (squares summed in f64), the RoPE
//! angles (one multiplication per pair) and the softmax (a reciprocal of
//! an f64 sum) follow llama.cpp's arithmetic, which brings the logits
//! closer to the reference runtime's (tests/llama_cpp.rs).
//!
//! The dense reference ([`LlamaModel::forward_dense`]) is the same layers
//! over the whole sequence at once with its K/V in a local buffer, never
//! a pool: with correct K/V in the slots it gives the same logits, and a
//! stale, foreign or corrupted slot shows. candle-transformers' quantized
//! llama and llama.cpp are the independent checks (tests/gguf.rs,
//! tests/llama_cpp.rs).

use super::attention::{attention_group, Group};
use super::qmatmul::QWeight;
use super::{tensors, GgufError, GgufFile};
use crate::kvpool::{with_kv_rows, Kv, KvLayout, KvPool};
use crate::paged::{Logits, ModelError, PagedModel, PagedSeq, Tolerance};
use candle_core::quantized::QTensor;
use candle_core::{Device, Tensor};
use rayon::prelude::*;
use std::path::PathBuf;

/// Largest absolute difference allowed between a paged logit and the dense
/// reference's. Both compute every row in the same order, so correct K/V
/// gives a difference of 0; a wrong slot moves logits by far more.
pub const LOGIT_TOLERANCE: f32 = 1e-2;

/// A GGUF llama's shape, from its metadata.
#[derive(Clone, Debug, PartialEq)]
pub struct LlamaConfig {
    /// Transformer blocks (`llama.block_count`).
    pub layers: usize,
    /// Query heads (`llama.attention.head_count`).
    pub heads: usize,
    /// K/V heads (`llama.attention.head_count_kv`; grouped-query attention
    /// when fewer than `heads`).
    pub kv_heads: usize,
    /// Dimension of a head (`llama.embedding_length / heads`).
    pub head_dim: usize,
    /// Hidden size (`llama.embedding_length`).
    pub hidden: usize,
    /// Vocabulary (rows of `token_embd.weight`).
    pub vocab: usize,
    /// Positions the model was trained for (`llama.context_length`).
    pub context: usize,
    /// RoPE base (`llama.rope.freq_base`, default 10,000).
    pub rope_base: f32,
    /// RMSNorm epsilon (`llama.attention.layer_norm_rms_epsilon`).
    pub rms_eps: f32,
}

impl LlamaConfig {
    /// Floats in one K or V row of the pool: `kv_heads × head_dim`.
    pub fn kv_row(&self) -> usize {
        self.kv_heads * self.head_dim
    }

    /// Bytes of K/V one token takes in an f32 pool (all layers, K and V).
    pub fn kv_bytes_per_token(&self) -> usize {
        self.layers * 2 * self.kv_row() * 4
    }
}

struct Block {
    attn_norm: Vec<f32>,
    wq: QWeight,
    wk: QWeight,
    wv: QWeight,
    wo: QWeight,
    ffn_norm: Vec<f32>,
    gate: QWeight,
    up: QWeight,
    down: QWeight,
}

/// A GGUF llama whose K/V live in [`KvPool`]s (see the module's docs).
///
/// ```no_run
/// use radixkv_engine::gguf::{GgufFile, LlamaModel};
/// use radixkv_engine::kvpool::HostKvPool;
/// use radixkv_engine::paged::{PagedModel, PagedSeq};
/// let f = GgufFile::open("SmolLM2-135M-Instruct.Q4_1.gguf")?;
/// let model = LlamaModel::load(&f)?;
/// let mut pool = HostKvPool::new(model.pool_layout(64));
/// let ids = f.tokenizer()?.encode("The capital of France is")?;
/// let slots: Vec<u32> = (1..=ids.len() as u32).collect();
/// let seq = PagedSeq { tokens: &ids, slots: &slots, start: 0 };
/// let logits = model.forward_paged(&mut pool, &[seq], false)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct LlamaModel {
    cfg: LlamaConfig,
    path: PathBuf,
    embed: Embedding,
    blocks: Vec<Block>,
    norm: Vec<f32>,
    output: QWeight,
    /// `base^(-2 / head_dim)`: pair `i` of position `p` turns by `p ×
    /// theta_scale^i`, computed as llama.cpp does (one multiplication per
    /// pair, in f32), so the angles are the reference runtime's to the bit.
    theta_scale: f32,
}

impl std::fmt::Debug for LlamaModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlamaModel")
            .field("cfg", &self.cfg)
            .field("path", &self.path)
            .finish()
    }
}

/// Where a token's embedding row comes from.
enum Embedding {
    /// Dequantized from the output layer's blocks on demand (the GGUF has
    /// no `output.weight`: the two are one matrix).
    Tied,
    /// Dequantized from these blocks on demand.
    Blocks(QWeight),
    /// A type the block reader does not know: the whole table, dequantized
    /// at load.
    Table(Tensor),
}

fn candle(e: candle_core::Error) -> GgufError {
    GgufError::Format(e.to_string())
}

impl LlamaModel {
    /// Loads the weights of `f`: architecture `llama`, matmul weights
    /// `Q4_1` or `Q8_0` (embeddings and norms of any type candle
    /// dequantizes); anything else is a typed error
    /// ([`GgufError::Unsupported`]) that names it.
    pub fn load(f: &GgufFile) -> Result<LlamaModel, GgufError> {
        let arch = f.string("general.architecture")?;
        if arch != "llama" {
            return Err(GgufError::Unsupported(format!(
                "architecture `{arch}` (only `llama`)"
            )));
        }
        let content = f.content();
        tensors::check_types(
            content
                .tensor_infos
                .iter()
                .map(|(name, info)| (name.as_str(), info.ggml_dtype)),
        )?;
        let u = |k: &str| f.u32(k).map(|v| v as usize);
        let heads = u("llama.attention.head_count")?;
        let hidden = u("llama.embedding_length")?;
        if heads == 0 || hidden % heads != 0 || (hidden / heads) % 2 != 0 {
            return Err(GgufError::Unsupported(format!(
                "{hidden} hidden over {heads} heads"
            )));
        }
        let kv_heads = u("llama.attention.head_count_kv").unwrap_or(heads);
        if kv_heads == 0 || heads % kv_heads != 0 {
            return Err(GgufError::Unsupported(format!(
                "{heads} query heads over {kv_heads} K/V heads"
            )));
        }
        let head_dim = hidden / heads;
        if let Ok(rope) = u("llama.rope.dimension_count") {
            if rope != head_dim {
                return Err(GgufError::Unsupported(format!(
                    "RoPE over {rope} of {head_dim} dimensions"
                )));
            }
        }
        let f32_of = |k: &str| f.value(k).and_then(|v| v.to_f32().map_err(candle));
        let rope_base = f32_of("llama.rope.freq_base").unwrap_or(10_000.0);
        let rms_eps = f32_of("llama.attention.layer_norm_rms_epsilon")?;
        let path = f.path().to_path_buf();
        let mut r = std::fs::File::open(&path).map_err(|source| GgufError::Io {
            path: path.clone(),
            source,
        })?;
        let dev = Device::Cpu;
        let mut q = |name: &str| content.tensor(&mut r, name, &dev).map_err(candle);
        let embed_q = q("token_embd.weight")?;
        let (vocab, width) = embed_q.shape().dims2().map_err(candle)?;
        if width != hidden {
            return Err(GgufError::Format(format!(
                "token_embd.weight is {vocab} x {width}, the model {hidden} wide"
            )));
        }
        let norm = norm_weights(q("output_norm.weight")?, hidden)?;
        // Embedding rows are read from the quantized blocks as tokens need
        // them (a dequantized copy of the table would be vocab x hidden
        // floats). No `output.weight`: the output layer is the embedding's.
        let (output, embed) = if content.tensor_infos.contains_key("output.weight") {
            let embed = match QWeight::new(&embed_q).map_err(candle)? {
                Some(w) => Embedding::Blocks(w),
                None => Embedding::Table(embed_q.dequantize(&dev).map_err(candle)?),
            };
            (matmul("output.weight", q("output.weight")?)?, embed)
        } else {
            (matmul("token_embd.weight", embed_q)?, Embedding::Tied)
        };
        let layers = u("llama.block_count")?;
        let mut blocks = Vec::with_capacity(layers);
        for l in 0..layers {
            let mut mm = |n: &str| {
                let name = format!("blk.{l}.{n}.weight");
                matmul(&name, q(&name)?)
            };
            let (wq, wk, wv, wo) = (
                mm("attn_q")?,
                mm("attn_k")?,
                mm("attn_v")?,
                mm("attn_output")?,
            );
            let (gate, up, down) = (mm("ffn_gate")?, mm("ffn_up")?, mm("ffn_down")?);
            let mut vec = |n: &str| norm_weights(q(&format!("blk.{l}.{n}.weight"))?, hidden);
            blocks.push(Block {
                attn_norm: vec("attn_norm")?,
                ffn_norm: vec("ffn_norm")?,
                wq,
                wk,
                wv,
                wo,
                gate,
                up,
                down,
            });
        }
        let context = u("llama.context_length").unwrap_or(2048);
        let theta_scale = rope_base.powf(-2.0 / head_dim as f32);
        Ok(LlamaModel {
            cfg: LlamaConfig {
                layers,
                heads,
                kv_heads,
                head_dim,
                hidden,
                vocab,
                context,
                rope_base,
                rms_eps,
            },
            path,
            embed,
            blocks,
            norm,
            output,
            theta_scale,
        })
    }

    /// The shape.
    pub fn config(&self) -> &LlamaConfig {
        &self.cfg
    }

    /// The embedding rows of `ids` (already in the vocabulary), `(rows,
    /// hidden)`.
    fn embed_rows(&self, ids: Vec<u32>, dev: &Device) -> candle_core::Result<Tensor> {
        let rows = ids.len();
        let blocks = match &self.embed {
            Embedding::Tied => &self.output,
            Embedding::Blocks(w) => w,
            Embedding::Table(t) => return t.index_select(&Tensor::from_vec(ids, rows, dev)?, 0),
        };
        let mut x = Vec::with_capacity(rows * self.cfg.hidden);
        for id in ids {
            blocks.row_into(id as usize, &mut x);
        }
        Tensor::from_vec(x, (rows, self.cfg.hidden), dev)
    }

    /// The embedding row of token id `id`: `id % vocab` (workloads' ids
    /// and the engine's synthetic output ids may lie past the vocabulary).
    pub fn vocab_index(&self, id: u32) -> u32 {
        (id as u64 % self.cfg.vocab as u64) as u32
    }

    /// `cos` and `sin` of every row's angles, `(rows, 1, head_dim / 2)`,
    /// for candle's interleaved `rope_i` with one table per row.
    fn rope_tables(&self, pos: &[usize]) -> candle_core::Result<(Tensor, Tensor)> {
        let half = self.cfg.head_dim / 2;
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

    /// Rotates `x` `(rows, heads × head_dim)` in place of its pairs.
    fn rope(
        &self,
        x: &Tensor,
        heads: usize,
        cos: &Tensor,
        sin: &Tensor,
    ) -> candle_core::Result<Tensor> {
        let (rows, width) = x.dims2()?;
        let x = x
            .reshape((rows, heads, 1, self.cfg.head_dim))?
            .contiguous()?;
        candle_nn::rotary_emb::rope_i(&x, cos, sin)?.reshape((rows, width))
    }

    /// Grouped-query causal attention of `q` `(n, heads × head_dim)` at
    /// positions `start..start + n` over the K and V rows of positions
    /// `0..len` (one slice of `kv_heads × head_dim` each): query head `h`
    /// reads K/V head `h / (heads / kv_heads)`. Query rows run in parallel,
    /// each head's keys in order: the result of a row never depends on the
    /// others, nor on how the heads were grouped.
    fn attention(&self, q: &[f32], k: &[&[f32]], v: &[&[f32]], start: usize) -> Vec<f32> {
        let c = &self.cfg;
        let group = c.heads / c.kv_heads;
        let rows = q.len() / (c.heads * c.head_dim);
        // One item per query row and K/V head: the query heads that read
        // that K/V head, so each K row is read once per item. With too few
        // of those to share among the threads (a decode step's one row),
        // one item per query head instead.
        let threads = rayon::current_num_threads();
        let per_item = if rows * c.kv_heads >= 4 * threads {
            group
        } else {
            1
        };
        let span = per_item * c.head_dim;
        let items_per_row = c.heads / per_item;
        let mut out = vec![0f32; q.len()];
        let item = |w: &mut Vec<f32>, (idx, o): (usize, &mut [f32])| {
            let (i, first) = (idx / items_per_row, idx % items_per_row * per_item);
            let heads = Group {
                head_dim: c.head_dim,
                q: &q[idx * span..][..span],
                kvh: first / group,
                k,
                v,
                keys: start + i + 1,
            };
            attention_group(&heads, o, w)
        };
        // Floats of K and V read over all rows' heads; parallel only when
        // that is worth a thread, with enough of it per task.
        let items = rows * items_per_row;
        let work = rows * (start + rows) * c.heads * c.head_dim;
        if work < 1 << 16 {
            let mut w = Vec::new();
            out.chunks_mut(span)
                .enumerate()
                .for_each(|x| item(&mut w, x));
        } else {
            let min_len = (items << 14).div_ceil(work).max(1);
            out.par_chunks_mut(span)
                .enumerate()
                .with_min_len(min_len)
                .for_each_init(Vec::new, item);
        }
        out
    }

    fn check(&self, pool: &dyn KvPool, seqs: &[PagedSeq<'_>]) -> Result<(), ModelError> {
        crate::paged::check_pool(pool, self.cfg.layers, self.cfg.kv_row())?;
        for s in seqs {
            s.validate()?;
            if s.tokens.len() > self.cfg.context {
                return Err(ModelError::Input(format!(
                    "{} tokens, past the model's context of {}",
                    s.tokens.len(),
                    self.cfg.context
                )));
            }
        }
        Ok(())
    }

    /// The paged pass (see [`PagedModel::forward_paged`]).
    fn paged(
        &self,
        pool: &mut dyn KvPool,
        seqs: &[PagedSeq<'_>],
        all_rows: bool,
    ) -> Result<Vec<Logits>, ModelError> {
        self.check(pool, seqs)?;
        let parts: Vec<(&[u32], usize)> = seqs.iter().map(|s| (s.tokens, s.start)).collect();
        // Each sequence's new K/V rows go to their slots; attention reads
        // every position, the new ones included, back from the pool (in
        // place when the pool is host memory).
        let mut kv = |li: usize, si: usize, k: Vec<f32>, v: Vec<f32>, attend: &mut Attend<'_>| {
            let s = &seqs[si];
            let end = s.tokens.len();
            let new = &s.slots[s.start..end];
            pool.write_rows(li, Kv::K, new, &k)?;
            pool.write_rows(li, Kv::V, new, &v)?;
            with_kv_rows(&*pool, li, &s.slots[..end], |k, v| attend(k, v))?;
            Ok(())
        };
        let rows = if all_rows { Rows::All } else { Rows::Last };
        let data = self.run(&parts, rows, &mut kv)?;
        Ok(seqs
            .iter()
            .zip(data)
            .map(|(s, data)| Logits {
                start: s.tokens.len() - data.len() / self.cfg.vocab,
                vocab: self.cfg.vocab,
                data,
            })
            .collect())
    }

    /// The logits of `positions` (ascending) of `tokens`, computed over
    /// the whole sequence at once with its K/V in a local buffer, no pool:
    /// the reference the paged passes are checked against.
    pub fn forward_dense(
        &self,
        tokens: &[u32],
        positions: &[usize],
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        if tokens.is_empty() || tokens.len() > self.cfg.context {
            return Err(ModelError::Input(format!(
                "{} tokens (1 to the context of {})",
                tokens.len(),
                self.cfg.context
            )));
        }
        let row = self.cfg.kv_row();
        let mut kv = |_: usize, _: usize, k: Vec<f32>, v: Vec<f32>, attend: &mut Attend<'_>| {
            let kr: Vec<&[f32]> = k.chunks_exact(row).collect();
            let vr: Vec<&[f32]> = v.chunks_exact(row).collect();
            attend(&kr, &vr);
            Ok(())
        };
        if let Some(p) = positions.iter().find(|&&p| p >= tokens.len()) {
            return Err(ModelError::Input(format!(
                "position {p} of {}",
                tokens.len()
            )));
        }
        let data = self.run(&[(tokens, 0)], Rows::At(positions), &mut kv)?;
        let v = self.cfg.vocab;
        Ok(data[0].chunks(v).map(<[f32]>::to_vec).collect())
    }

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
    fn run(
        &self,
        parts: &[(&[u32], usize)],
        rows_wanted: Rows<'_>,
        kv: &mut KvRows<'_>,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        rayon::scope(|_| self.run_in_pool(parts, rows_wanted, kv))
    }

    /// [`run`](Self::run), on the thread it was called on.
    fn run_in_pool(
        &self,
        parts: &[(&[u32], usize)],
        rows_wanted: Rows<'_>,
        kv: &mut KvRows<'_>,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        if parts.is_empty() {
            return Ok(Vec::new());
        }
        let dev = Device::Cpu;
        let c = &self.cfg;
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
                Rows::All => want.extend(first as u32..(first + n) as u32),
                Rows::Last => want.push((first + n - 1) as u32),
                Rows::At(at) => want.extend(
                    at.iter()
                        .filter(|&&p| p >= start && p < tokens.len())
                        .map(|&p| (first + p - start) as u32),
                ),
            }
            counts.push(want.len() - before);
            for (p, &t) in tokens.iter().enumerate().skip(start) {
                ids.push(self.vocab_index(t));
                pos.push(p);
            }
        }
        let rows = ids.len();
        let mut x = self.embed_rows(ids, &dev)?;
        let (cos, sin) = self.rope_tables(&pos)?;
        for (li, b) in self.blocks.iter().enumerate() {
            let h = rms_norm(&x, &b.attn_norm, eps)?;
            let q = self.rope(&b.wq.forward(&h)?, c.heads, &cos, &sin)?;
            let k = self.rope(&b.wk.forward(&h)?, c.kv_heads, &cos, &sin)?;
            let v = b.wv.forward(&h)?;
            let mut att = Vec::with_capacity(rows * width);
            for (pi, (&(_, start), &(o, n))) in parts.iter().zip(&spans).enumerate() {
                let rows_of = |t: &Tensor| -> candle_core::Result<Vec<f32>> {
                    t.narrow(0, o, n)?.flatten_all()?.to_vec1()
                };
                let qr = rows_of(&q)?;
                let mut out = Vec::new();
                kv(li, pi, rows_of(&k)?, rows_of(&v)?, &mut |kr, vr| {
                    out = self.attention(&qr, kr, vr, start)
                })?;
                att.extend(out);
            }
            let att = Tensor::from_vec(att, (rows, width), &dev)?;
            x = (x + b.wo.forward(&att)?)?;
            let h = rms_norm(&x, &b.ffn_norm, eps)?;
            let mlp = (candle_nn::ops::silu(&b.gate.forward(&h)?)? * b.up.forward(&h)?)?;
            x = (x + b.down.forward(&mlp)?)?;
        }
        let n = want.len();
        let sel = x.index_select(&Tensor::from_vec(want, n, &dev)?, 0)?;
        let h = rms_norm(&sel, &self.norm, eps)?;
        let data = self.output.forward(&h)?.flatten_all()?.to_vec1::<f32>()?;
        let v = c.vocab;
        let mut out = Vec::with_capacity(parts.len());
        let mut at = 0;
        for rows in counts {
            out.push(data[at * v..(at + rows) * v].to_vec());
            at += rows;
        }
        Ok(out)
    }
}

/// The matmul weight `name` (`t`), which [`tensors::check_types`] found
/// `Q4_1` or `Q8_0`; a tensor that is not a matrix is an error naming it.
fn matmul(name: &str, t: QTensor) -> Result<QWeight, GgufError> {
    QWeight::new(&t).map_err(candle)?.ok_or_else(|| {
        GgufError::Unsupported(format!(
            "matmul weight `{name}` of type {:?} and shape {:?} (a matrix of Q4_1 or Q8_0)",
            t.dtype(),
            t.shape().dims()
        ))
    })
}

/// An RMSNorm's weights: `hidden` floats, read once at load.
fn norm_weights(t: candle_core::quantized::QTensor, hidden: usize) -> Result<Vec<f32>, GgufError> {
    let w = t
        .dequantize(&Device::Cpu)
        .and_then(|t| t.to_vec1::<f32>())
        .map_err(candle)?;
    if w.len() != hidden {
        return Err(GgufError::Format(format!(
            "a norm of {} weights in a model {hidden} wide",
            w.len()
        )));
    }
    Ok(w)
}

/// RMSNorm of each row of `x` `(rows, hidden)`, times `w`, computed as
/// llama.cpp computes it: the squares summed in f64, `1 / sqrt(mean +
/// eps)` in f32, each element scaled, then multiplied by its weight.
fn rms_norm(x: &Tensor, w: &[f32], eps: f32) -> candle_core::Result<Tensor> {
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

/// Stores a part's new K/V rows and hands the K/V rows of all its
/// positions (one `kv_row` slice each) to attention: given `(layer, part,
/// new K, new V, attention)`.
type KvRows<'a> = dyn FnMut(usize, usize, Vec<f32>, Vec<f32>, &mut Attend<'_>) -> Result<(), ModelError>
    + Send
    + 'a;

/// Attention over a part's K rows and V rows, one slice per position.
type Attend<'a> = dyn FnMut(&[&[f32]], &[&[f32]]) + 'a;

/// Which rows' logits [`LlamaModel::run`] returns.
#[derive(Clone, Copy)]
enum Rows<'a> {
    /// Every computed row of every part.
    All,
    /// The last row of every part.
    Last,
    /// These positions (ascending) of every part.
    At(&'a [usize]),
}

impl PagedModel for LlamaModel {
    fn pool_layout(&self, slots: usize) -> KvLayout {
        KvLayout {
            layers: self.cfg.layers,
            slots,
            row: self.cfg.kv_row(),
        }
    }

    fn forward_paged(
        &self,
        pool: &mut dyn KvPool,
        seqs: &[PagedSeq<'_>],
        all_rows: bool,
    ) -> Result<Vec<Logits>, ModelError> {
        self.paged(pool, seqs, all_rows)
    }

    fn reference(&self, tokens: &[u32], positions: &[usize]) -> Result<Vec<Vec<f32>>, ModelError> {
        self.forward_dense(tokens, positions)
    }

    fn tolerance(&self) -> Tolerance {
        Tolerance {
            logit: LOGIT_TOLERANCE,
            argmax_margin: LOGIT_TOLERANCE,
        }
    }

    fn verifies_every_position(&self) -> bool {
        false
    }

    fn describe(&self) -> String {
        let c = &self.cfg;
        format!(
            "GGUF llama {} ({} layers, {} heads / {} K/V heads x {}, vocab {})",
            self.path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            c.layers,
            c.heads,
            c.kv_heads,
            c.head_dim,
            c.vocab
        )
    }
}
