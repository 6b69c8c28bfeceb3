//! The dense reference: candle-transformers' quantized llama over a GGUF
//! file, with its own contiguous KV cache. It never reads radixkv's pools,
//! so what it computes is what a verification compares the paged path
//! with.

use super::GgufError;
use candle_core::quantized::gguf_file::Content;
use candle_core::{Device, Tensor};
use candle_transformers::models::quantized_llama::ModelWeights;
use std::path::Path;

/// A GGUF llama on the CPU, computed densely.
pub struct DenseModel {
    weights: ModelWeights,
}

impl std::fmt::Debug for DenseModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DenseModel")
    }
}

fn format(e: candle_core::Error) -> GgufError {
    GgufError::Format(e.to_string())
}

impl DenseModel {
    /// Loads the weights of the GGUF file at `path`.
    pub fn load(path: &Path) -> Result<DenseModel, GgufError> {
        let mut f = std::fs::File::open(path).map_err(|source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let content = Content::read(&mut f).map_err(format)?;
        let weights = ModelWeights::from_gguf(content, &mut f, &Device::Cpu).map_err(format)?;
        Ok(DenseModel { weights })
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

    /// Up to `max` greedy tokens after `prompt`, stopping after `eos`.
    pub fn greedy(
        &mut self,
        prompt: &[u32],
        max: usize,
        eos: Option<u32>,
    ) -> Result<Vec<u32>, GgufError> {
        let mut out = Vec::with_capacity(max);
        let mut logits = self.logits(prompt)?;
        while out.len() < max {
            let next = argmax(&logits);
            out.push(next);
            if Some(next) == eos {
                break;
            }
            logits = self.extend(&[next], prompt.len() + out.len() - 1)?;
        }
        Ok(out)
    }
}

/// The index of the largest value (the first of equals).
pub fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    best as u32
}
