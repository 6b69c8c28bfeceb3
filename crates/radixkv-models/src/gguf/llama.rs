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

use super::arch::Architecture;
use super::config::LlamaConfig;
use super::kernels::Kernel;
use super::pass::{Attend, LogitRows, Pass};
use super::rope_norm::Rope;
use super::weights::Weights;
use super::{tensors, GgufError, GgufFile};
use crate::backend::{Logits, ModelError, PagedModel, PagedSeq, Tolerance};
use crate::kvpool::{with_kv_rows, Kv, KvLayout, KvPool};
use std::path::PathBuf;

/// Largest absolute difference allowed between a paged logit and the dense
/// reference's. Both compute every row in the same order, so correct K/V
/// gives a difference of 0; a wrong slot moves logits by far more.
pub const LOGIT_TOLERANCE: f32 = 1e-2;

/// Argmaxes of a paged pass and the dense reference are compared only
/// where the reference's top-2 margin exceeds this (the two agree to the
/// bit with correct K/V, so any clear margin will do; a near tie is left
/// to [`LOGIT_TOLERANCE`]).
pub const ARGMAX_MARGIN: f32 = 1e-2;

/// A GGUF llama whose K/V live in [`KvPool`]s (see the module's docs).
///
/// ```no_run
/// use radixkv_models::gguf::{GgufFile, LlamaModel};
/// use radixkv_models::kvpool::HostKvPool;
/// use radixkv_models::backend::{PagedModel, PagedSeq};
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
    pub(super) cfg: LlamaConfig,
    pub(super) path: PathBuf,
    /// Its weights, read at load.
    pub(super) weights: Weights,
    /// Its RoPE (angles and pairing).
    pub(super) rope: Rope,
    /// The compute kernels' path ([`Kernel::detect`] unless set).
    pub(super) kernel: Kernel,
}

impl std::fmt::Debug for LlamaModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlamaModel")
            .field("cfg", &self.cfg)
            .field("path", &self.path)
            .field("kernel", &self.kernel)
            .finish()
    }
}

impl LlamaModel {
    /// Loads the weights of `f` as its architecture ([`Architecture::of`]:
    /// one of [`ARCHITECTURES`](super::arch::ARCHITECTURES)), matmul
    /// weights `Q4_1` or `Q8_0` (embeddings, norms and biases of any type
    /// candle dequantizes); anything else is a typed error
    /// ([`GgufError::Unsupported`]) that names it.
    pub fn load(f: &GgufFile) -> Result<LlamaModel, GgufError> {
        LlamaModel::load_as(f, Architecture::of(f)?)
    }

    /// Loads the weights of `f` described by `arch` (an architecture not in
    /// the table, say, whose layers are llama's up to what `arch` says).
    pub fn load_as(f: &GgufFile, arch: &Architecture) -> Result<LlamaModel, GgufError> {
        let content = f.content();
        tensors::check_types(
            content
                .tensor_infos
                .iter()
                .map(|(name, info)| (name.as_str(), info.ggml_dtype)),
        )?;
        let cfg = LlamaConfig::read(f, arch)?;
        let weights = Weights::load(f, &cfg)?;
        Ok(LlamaModel {
            rope: Rope::new(&cfg),
            cfg,
            path: f.path().to_path_buf(),
            weights,
            kernel: Kernel::detect(),
        })
    }

    /// The model computing with `kernel`'s path instead (the portable one
    /// on a CPU with AVX2, say, as the tests run both).
    pub fn with_kernel(mut self, kernel: Kernel) -> LlamaModel {
        self.kernel = kernel;
        self
    }

    /// The compute kernels' path.
    pub fn kernel(&self) -> Kernel {
        self.kernel
    }

    /// The shape.
    pub fn config(&self) -> &LlamaConfig {
        &self.cfg
    }

    /// The embedding row of token id `id`: `id % vocab` (workloads' ids
    /// and the engine's synthetic output ids may lie past the vocabulary).
    pub fn vocab_index(&self, id: u32) -> u32 {
        self.cfg.vocab_index(id)
    }

    /// One pass of the layers with this model's weights and kernels.
    fn pass(&self) -> Pass<'_> {
        Pass {
            weights: &self.weights,
            cfg: &self.cfg,
            rope: &self.rope,
            kernel: self.kernel,
        }
    }

    fn check(&self, pool: &dyn KvPool, seqs: &[PagedSeq<'_>]) -> Result<(), ModelError> {
        crate::backend::check_pool(pool, self.cfg.layers, self.cfg.kv_row_floats())?;
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
        let mut kv = |li: usize, si: usize, k: &[f32], v: &[f32], attend: &mut Attend<'_>| {
            let s = &seqs[si];
            let end = s.tokens.len();
            let new = &s.slots[s.start..end];
            pool.write_rows(li, Kv::K, new, k)?;
            pool.write_rows(li, Kv::V, new, v)?;
            with_kv_rows(&*pool, li, &s.slots[..end], |k, v| attend(k, v))?;
            Ok(())
        };
        let rows = if all_rows {
            LogitRows::All
        } else {
            LogitRows::Last
        };
        let data = self.pass().run(&parts, rows, &mut kv)?;
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
        let row = self.cfg.kv_row_floats();
        let mut kv = |_: usize, _: usize, k: &[f32], v: &[f32], attend: &mut Attend<'_>| {
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
        let data = self
            .pass()
            .run(&[(tokens, 0)], LogitRows::At(positions), &mut kv)?;
        let v = self.cfg.vocab;
        Ok(data[0].chunks(v).map(<[f32]>::to_vec).collect())
    }
}

impl PagedModel for LlamaModel {
    fn pool_layout(&self, slots: usize) -> KvLayout {
        KvLayout {
            layers: self.cfg.layers,
            slots,
            row: self.cfg.kv_row_floats(),
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
            argmax_margin: ARGMAX_MARGIN,
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
