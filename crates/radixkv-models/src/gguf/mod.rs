//! GGUF models (SmolLM2-135M-Instruct first): what a GGUF file's metadata
//! holds besides the weights, read into the pieces a server needs.
//!
//! | file | what it holds |
//! | --- | --- |
//! | `tokenizer.rs` | the byte-level BPE tokenizer built from `tokenizer.ggml.*` ([`GgufTokenizer`]) |
//! | `template.rs` | the chat template (`tokenizer.chat_template`) rendered with minijinja ([`ChatTemplate`]) |
//! | `arch.rs` | what an architecture is ([`Architecture`]: metadata prefix, RoPE style, biases, tied output, BOS, pre-tokenizers) and the table of those computed |
//! | `config.rs` | a model's shape read from its metadata and checked ([`LlamaConfig`]) |
//! | `llama.rs` | the model computed with its K/V in the engine's pools ([`LlamaModel`], a paged model): its weights, the paged and dense passes |
//! | `weights.rs` | its weights, read at load |
//! | `pass.rs` | one pass of the layers over some sequences' rows |
//! | `rope_norm.rs` | RoPE and the RMSNorm, as llama.cpp computes them |
//! | `attention.rs` | grouped-query attention over the K/V rows of the queries' positions, and its split over threads |
//! | `qmatmul.rs` | `Q4_1` and `Q8_0` matmuls as llama.cpp computes them: the blocks read out of a tensor, a product split over rayon's threads |
//! | `kernels/` | the compute kernels, plain Rust or AVX2, chosen by a [`Kernel`] the model is given |
//! | `tensors.rs` | which types each tensor may have: matmul weights `Q4_1` or `Q8_0` only |
//!
//! [`GgufBackend`] is the engine's backend over a [`LlamaModel`]; its
//! verification compares each request with the model's dense pass, which
//! reads no pool. The independent checks of the model itself are in its
//! tests: candle-transformers' quantized llama over the same file
//! (tests/gguf.rs) and llama.cpp (tests/llama_cpp.rs).
//!
//! ```no_run
//! use radixkv_models::gguf::{GgufFile, Message};
//! use radixkv_models::backend::argmax;
//! let f = GgufFile::open("SmolLM2-135M-Instruct.Q4_1.gguf")?;
//! let prompt = f.template()?.render(&[Message::user("Hi")], true)?;
//! let ids = f.tokenizer()?.encode(&prompt)?;
//! let model = f.llama()?;
//! let logits = model.forward_dense(&ids, &[ids.len() - 1])?;
//! let next = argmax(&logits[0]).map(|(id, _)| id);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod arch;
mod attention;
mod config;
mod kernels;
mod llama;
mod pass;
mod qmatmul;
mod rope_norm;
mod template;
mod tensors;
mod tokenizer;
mod weights;

pub use arch::{Architecture, RopeStyle};
pub use config::LlamaConfig;
pub use kernels::Kernel;
pub use llama::{LlamaModel, ARGMAX_MARGIN, LOGIT_TOLERANCE};
pub use template::{ChatTemplate, Message};
pub use tokenizer::GgufTokenizer;

use crate::backend::PagedBackend;
use candle_core::quantized::gguf_file::{Content, Value};
use std::path::{Path, PathBuf};

/// Why a GGUF file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    /// Reading the file failed.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The file is not a GGUF candle can read, or a tensor is missing.
    #[error("GGUF: {0}")]
    Format(String),
    /// A metadata key is missing or has another type.
    #[error("GGUF metadata `{key}`: {why}")]
    Metadata {
        /// The key.
        key: String,
        /// What is wrong with it.
        why: String,
    },
    /// Something the file asks for that radixkv does not implement.
    #[error("unsupported GGUF: {0}")]
    Unsupported(String),
    /// The tokenizer refused an input.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// The chat template failed to render.
    #[error("chat template: {0}")]
    Template(String),
}

/// A GGUF llama as the engine's backend.
pub type GgufBackend = PagedBackend<LlamaModel>;

/// A GGUF file's header and metadata (the tensors stay on disk until a
/// model loads them).
#[derive(Debug)]
pub struct GgufFile {
    path: PathBuf,
    content: Content,
}

impl GgufFile {
    /// Reads `path`'s header and metadata.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        let path = path.as_ref().to_path_buf();
        let io = |source| GgufError::Io {
            path: path.clone(),
            source,
        };
        let mut f = std::fs::File::open(&path).map_err(io)?;
        let content = Content::read(&mut f).map_err(|e| GgufError::Format(e.to_string()))?;
        Ok(GgufFile { path, content })
    }

    /// Where the file is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Its header and metadata as candle reads them.
    pub fn content(&self) -> &Content {
        &self.content
    }

    /// The metadata value under `key`.
    pub(crate) fn value(&self, key: &str) -> Result<&Value, GgufError> {
        self.content
            .metadata
            .get(key)
            .ok_or_else(|| GgufError::Metadata {
                key: key.into(),
                why: "missing".into(),
            })
    }

    /// A string under `key`.
    pub(crate) fn string(&self, key: &str) -> Result<&str, GgufError> {
        self.value(key)?
            .to_string()
            .map(String::as_str)
            .map_err(|e| GgufError::Metadata {
                key: key.into(),
                why: e.to_string(),
            })
    }

    /// An unsigned integer under `key`.
    pub(crate) fn u32(&self, key: &str) -> Result<u32, GgufError> {
        self.value(key)?.to_u32().map_err(|e| GgufError::Metadata {
            key: key.into(),
            why: e.to_string(),
        })
    }

    /// The end-of-sequence token (`tokenizer.ggml.eos_token_id`).
    pub fn eos(&self) -> Option<u32> {
        self.u32("tokenizer.ggml.eos_token_id").ok()
    }

    /// The positions the model was trained for (`{prefix}.context_length`
    /// of its architecture).
    pub fn context_length(&self) -> Option<usize> {
        let arch = Architecture::of(self).ok()?;
        self.u32(&arch.key("context_length"))
            .ok()
            .map(|n| n as usize)
    }

    /// The tokenizer its metadata describes.
    pub fn tokenizer(&self) -> Result<GgufTokenizer, GgufError> {
        GgufTokenizer::from_gguf(self)
    }

    /// Its chat template.
    pub fn template(&self) -> Result<ChatTemplate, GgufError> {
        ChatTemplate::new(self.string("tokenizer.chat_template")?)
    }

    /// The paged model over its weights (loads them).
    pub fn llama(&self) -> Result<LlamaModel, GgufError> {
        LlamaModel::load(self)
    }
}
