//! The independent reference the GGUF tests compare the paged model with:
//! candle-transformers' quantized llama over the same file, with its own
//! contiguous KV cache and candle's quantized matmuls (a dev-dependency:
//! the library never computes with it).

use candle_core::quantized::gguf_file::Content;
use candle_core::{Device, Tensor};
use candle_transformers::models::quantized_llama::ModelWeights;
use radixkv_models::backend::argmax;
use radixkv_models::gguf::GgufError;
use std::path::Path;

/// A GGUF llama on the CPU, computed by candle-transformers (its quantized
/// llama, one token at a time with its own K/V cache).
pub struct CandleLlama {
    weights: ModelWeights,
}

fn format(e: candle_core::Error) -> GgufError {
    GgufError::Format(e.to_string())
}

impl CandleLlama {
    /// Loads the weights of the GGUF file at `path`.
    pub fn load(path: &Path) -> Result<CandleLlama, GgufError> {
        let mut f = std::fs::File::open(path).map_err(|source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let content = Content::read(&mut f).map_err(format)?;
        let weights = ModelWeights::from_gguf(content, &mut f, &Device::Cpu).map_err(format)?;
        Ok(CandleLlama { weights })
    }

    /// The logits after `ids`, computed from scratch (the model's own
    /// cache is cleared first).
    pub fn logits(&mut self, ids: &[u32]) -> Result<Vec<f32>, GgufError> {
        self.weights.clear_kv_cache();
        self.extend(ids, 0)
    }

    /// The logits after feeding `ids` at positions `pos..` (the model's
    /// cache must hold exactly the `pos` tokens before them).
    pub fn extend(&mut self, ids: &[u32], pos: usize) -> Result<Vec<f32>, GgufError> {
        let x = Tensor::new(ids, &Device::Cpu)
            .and_then(|t| t.unsqueeze(0))
            .map_err(format)?;
        self.weights
            .forward(&x, pos)
            .and_then(|l| l.squeeze(0))
            .and_then(|l| l.to_vec1::<f32>())
            .map_err(format)
    }

    /// Up to `max` greedy tokens after `prompt`, stopping after `eos` or
    /// at a row without an argmax (empty or all NaN).
    pub fn greedy(
        &mut self,
        prompt: &[u32],
        max: usize,
        eos: Option<u32>,
    ) -> Result<Vec<u32>, GgufError> {
        let mut out = Vec::with_capacity(max);
        let mut logits = self.logits(prompt)?;
        while out.len() < max {
            let Some((next, _)) = argmax(&logits) else {
                break;
            };
            out.push(next);
            if Some(next) == eos {
                break;
            }
            logits = self.extend(&[next], prompt.len() + out.len() - 1)?;
        }
        Ok(out)
    }
}
