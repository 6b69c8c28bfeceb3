//! A GGUF llama's weights ([`Weights`]), read once at load: each block's
//! norms, projections (quantized blocks as stored) and biases, the final
//! norm, the output layer and the token embedding (rows dequantized on
//! demand).

use super::config::LlamaConfig;
use super::qmatmul::QWeight;
use super::{GgufError, GgufFile};
use candle_core::quantized::QTensor;
use candle_core::Device;

/// Every weight of a model.
pub(super) struct Weights {
    pub(super) embed: Embedding,
    pub(super) blocks: Vec<Block>,
    pub(super) norm: Vec<f32>,
    pub(super) output: QWeight,
}

/// One transformer block's weights.
pub(super) struct Block {
    pub(super) attn_norm: Vec<f32>,
    pub(super) wq: QWeight,
    pub(super) wk: QWeight,
    pub(super) wv: QWeight,
    /// The Q, K and V projections' biases, where the architecture has them.
    pub(super) bias: Option<[Vec<f32>; 3]>,
    pub(super) wo: QWeight,
    pub(super) ffn_norm: Vec<f32>,
    pub(super) gate: QWeight,
    pub(super) up: QWeight,
    pub(super) down: QWeight,
}

/// Where a token's embedding row comes from.
pub(super) enum Embedding {
    /// Dequantized from the output layer's blocks on demand (the GGUF has
    /// no `output.weight`: the two are one matrix).
    Tied,
    /// Dequantized from these blocks on demand.
    Blocks(QWeight),
    /// A type the block reader does not know: the whole table, dequantized
    /// at load (`vocab × hidden`, row-major).
    Table(Vec<f32>),
}

fn candle(e: candle_core::Error) -> GgufError {
    GgufError::Format(e.to_string())
}

impl Weights {
    /// The weights of `f`, whose shape (and architecture) is `cfg`: matmul
    /// weights as [`QWeight`]s (`Q4_1` or `Q8_0`, which
    /// [`check_types`](super::tensors::check_types) checked), vectors of any type candle
    /// dequantizes.
    pub(super) fn load(f: &GgufFile, cfg: &LlamaConfig) -> Result<Weights, GgufError> {
        let (content, arch) = (f.content(), &cfg.arch);
        let hidden = cfg.hidden;
        let path = f.path();
        let mut r = std::fs::File::open(path).map_err(|source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let dev = Device::Cpu;
        let mut q = |name: &str| content.tensor(&mut r, name, &dev).map_err(candle);
        let embed_q = q("token_embd.weight")?;
        let norm = vector(q("output_norm.weight")?, hidden)?;
        // Embedding rows are read from the quantized blocks as tokens need
        // them (a dequantized copy of the table would be vocab x hidden
        // floats). No `output.weight`: the output layer is the embedding's,
        // where the architecture ties them.
        let (output, embed) = if content.tensor_infos.contains_key("output.weight") {
            let embed = match QWeight::new(&embed_q).map_err(candle)? {
                Some(w) => Embedding::Blocks(w),
                None => Embedding::Table(
                    embed_q
                        .dequantize(&dev)
                        .and_then(|t| t.flatten_all()?.to_vec1::<f32>())
                        .map_err(candle)?,
                ),
            };
            (matmul("output.weight", q("output.weight")?)?, embed)
        } else if arch.tied_output {
            (matmul("token_embd.weight", embed_q)?, Embedding::Tied)
        } else {
            return Err(GgufError::Format(format!(
                "no tensor `output.weight` (architecture `{}` has its own output layer)",
                arch.name
            )));
        };
        let kv = cfg.kv_row_floats();
        let mut blocks = Vec::with_capacity(cfg.layers);
        for l in 0..cfg.layers {
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
            let mut vec = |n: &str, len| vector(q(&format!("blk.{l}.{n}"))?, len);
            let bias = if arch.qkv_bias {
                Some([
                    vec("attn_q.bias", hidden)?,
                    vec("attn_k.bias", kv)?,
                    vec("attn_v.bias", kv)?,
                ])
            } else {
                None
            };
            blocks.push(Block {
                attn_norm: vec("attn_norm.weight", hidden)?,
                ffn_norm: vec("ffn_norm.weight", hidden)?,
                wq,
                wk,
                wv,
                bias,
                wo,
                gate,
                up,
                down,
            });
        }
        Ok(Weights {
            embed,
            blocks,
            norm,
            output,
        })
    }

    /// The embedding rows of `ids` (already in the vocabulary), `rows ×
    /// hidden` (row-major).
    pub(super) fn embed_rows(&self, hidden: usize, ids: &[u32]) -> Vec<f32> {
        let mut x = Vec::with_capacity(ids.len() * hidden);
        let blocks = match &self.embed {
            Embedding::Tied => &self.output,
            Embedding::Blocks(w) => w,
            Embedding::Table(t) => {
                for &id in ids {
                    x.extend_from_slice(&t[id as usize * hidden..][..hidden]);
                }
                return x;
            }
        };
        for &id in ids {
            blocks.row_into(id as usize, &mut x);
        }
        x
    }
}

/// The matmul weight `name` (`t`), which
/// [`check_types`](super::tensors::check_types) found
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

/// A vector of weights (an RMSNorm's, a bias): `len` floats, read once at
/// load; another length is an error naming both.
fn vector(t: QTensor, len: usize) -> Result<Vec<f32>, GgufError> {
    let w = t
        .dequantize(&Device::Cpu)
        .and_then(|t| t.to_vec1::<f32>())
        .map_err(candle)?;
    if w.len() != len {
        return Err(GgufError::Format(format!(
            "a vector of {} weights where the model has {len}",
            w.len()
        )));
    }
    Ok(w)
}
