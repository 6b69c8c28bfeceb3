//! A GGUF llama's shape ([`LlamaConfig`]), read from the file's metadata
//! under its architecture's prefix and checked before any weight loads.

use super::arch::Architecture;
use super::{GgufError, GgufFile};

/// A GGUF llama's shape, from its metadata.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LlamaConfig {
    /// The architecture it was read as (its metadata prefix, RoPE style,
    /// biases).
    pub arch: Architecture,
    /// Transformer blocks (`{prefix}.block_count`).
    pub layers: usize,
    /// Query heads (`{prefix}.attention.head_count`).
    pub heads: usize,
    /// K/V heads (`{prefix}.attention.head_count_kv`; grouped-query attention
    /// when fewer than `heads`).
    pub kv_heads: usize,
    /// Dimension of a head (`{prefix}.embedding_length / heads`).
    pub head_dim: usize,
    /// Hidden size (`{prefix}.embedding_length`).
    pub hidden: usize,
    /// Vocabulary (rows of `token_embd.weight`).
    pub vocab: usize,
    /// Positions the model was trained for (`{prefix}.context_length`, default 2,048).
    pub context: usize,
    /// RoPE base (`{prefix}.rope.freq_base`, default the architecture's).
    pub rope_base: f32,
    /// RMSNorm epsilon (`{prefix}.attention.layer_norm_rms_epsilon`).
    pub rms_eps: f32,
}

impl LlamaConfig {
    /// The shape of `f` read as `arch`: every key under the
    /// architecture's prefix, checked (heads that divide the width, K/V
    /// heads that divide the heads, RoPE over whole heads, an embedding as
    /// wide as the model); the vocabulary is the embedding's rows.
    pub fn read(f: &GgufFile, arch: &Architecture) -> Result<LlamaConfig, GgufError> {
        let u = |k: &str| f.u32(&arch.key(k)).map(|v| v as usize);
        let heads = u("attention.head_count")?;
        let hidden = u("embedding_length")?;
        if heads == 0 || hidden % heads != 0 || (hidden / heads) % 2 != 0 {
            return Err(GgufError::Unsupported(format!(
                "{hidden} hidden over {heads} heads"
            )));
        }
        let kv_heads = u("attention.head_count_kv").unwrap_or(heads);
        if kv_heads == 0 || heads % kv_heads != 0 {
            return Err(GgufError::Unsupported(format!(
                "{heads} query heads over {kv_heads} K/V heads"
            )));
        }
        let head_dim = hidden / heads;
        if let Ok(rope) = u("rope.dimension_count") {
            if rope != head_dim {
                return Err(GgufError::Unsupported(format!(
                    "RoPE over {rope} of {head_dim} dimensions"
                )));
            }
        }
        let f32_of = |k: &str| {
            let key = arch.key(k);
            f.value(&key)?.to_f32().map_err(|e| GgufError::Metadata {
                key,
                why: e.to_string(),
            })
        };
        let rope_base = f32_of("rope.freq_base").unwrap_or(arch.rope_base);
        let rms_eps = f32_of("attention.layer_norm_rms_epsilon")?;
        let embd = f
            .content()
            .tensor_infos
            .get("token_embd.weight")
            .ok_or_else(|| GgufError::Format("no tensor `token_embd.weight`".into()))?;
        let (vocab, width) = match embd.shape.dims() {
            &[vocab, width] => (vocab, width),
            other => {
                return Err(GgufError::Format(format!(
                    "token_embd.weight of shape {other:?}, not a matrix"
                )))
            }
        };
        if width != hidden {
            return Err(GgufError::Format(format!(
                "token_embd.weight is {vocab} x {width}, the model {hidden} wide"
            )));
        }
        Ok(LlamaConfig {
            arch: *arch,
            layers: u("block_count")?,
            heads,
            kv_heads,
            head_dim,
            hidden,
            vocab,
            context: u("context_length").unwrap_or(2048),
            rope_base,
            rms_eps,
        })
    }
    /// The embedding row of token id `id`: `id % vocab` (workloads' ids
    /// and the engine's synthetic output ids may lie past the vocabulary).
    pub fn vocab_index(&self, id: u32) -> u32 {
        (id as u64 % self.vocab as u64) as u32
    }

    /// Floats in one K or V row of the pool: `kv_heads × head_dim`.
    pub fn kv_row_floats(&self) -> usize {
        self.kv_heads * self.head_dim
    }

    /// Bytes of K/V one token takes in an f32 pool (all layers, K and V).
    pub fn kv_bytes_per_token(&self) -> usize {
        self.layers * 2 * self.kv_row_floats() * 4
    }
}
