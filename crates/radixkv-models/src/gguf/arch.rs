//! What a GGUF architecture is, as far as the model and its tokenizer need
//! to know: one [`Architecture`] a family, found by the file's
//! `general.architecture`. The model reads its shape under the family's
//! metadata prefix and computes by its description (RoPE style, biases,
//! output layer), and the tokenizer checks its pre-tokenizer and BOS
//! against it; a family whose layers are llama's up to those is one more
//! entry of [`ARCHITECTURES`] and a test, not another model.

use super::{GgufError, GgufFile};

/// How RoPE pairs a head's dimensions before it turns each pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Dimensions `2i` and `2i + 1` (GGUF's llama: the converter permutes
    /// Q and K so that this is the original model's rotation).
    Interleaved,
    /// Dimensions `i` and `i + head_dim / 2` (GPT-NeoX, Qwen2).
    Halves,
}

/// One architecture: its name, where its metadata lives and how its
/// layers differ from llama's.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Architecture {
    /// `general.architecture`.
    pub name: &'static str,
    /// The prefix of its metadata keys: `{prefix}.block_count`,
    /// `{prefix}.attention.head_count`, ….
    pub prefix: &'static str,
    /// How RoPE pairs dimensions.
    pub rope: RopeStyle,
    /// RoPE's base when the file does not say (`{prefix}.rope.freq_base`).
    pub rope_base: f32,
    /// Whether the Q, K and V projections add a bias
    /// (`blk.N.attn_q.bias`, …).
    pub qkv_bias: bool,
    /// Whether a file without `output.weight` uses the token embedding as
    /// its output layer (otherwise such a file is refused).
    pub tied_output: bool,
    /// Whether the tokenizer puts BOS first when the file does not say
    /// (`tokenizer.ggml.add_bos_token`).
    pub add_bos: bool,
    /// The pre-tokenizers (`tokenizer.ggml.pre`) this family's files may
    /// name that radixkv implements.
    pub pre_tokenizers: &'static [&'static str],
}

/// The llama family (SmolLM2, Llama 2 and 3, TinyLlama): interleaved
/// RoPE, no biases, an output layer of its own or the embedding's, and
/// BOS only where the file asks for it (llama.cpp's default for the
/// byte-level BPE vocabularies radixkv reads).
pub const LLAMA: Architecture = Architecture {
    name: "llama",
    prefix: "llama",
    rope: RopeStyle::Interleaved,
    rope_base: 10_000.0,
    qkv_bias: false,
    tied_output: true,
    add_bos: false,
    pre_tokenizers: &["smollm"],
};

/// Every architecture radixkv computes.
pub const ARCHITECTURES: &[Architecture] = &[LLAMA];

impl Architecture {
    /// The architecture of `f` (its `general.architecture`), from
    /// [`ARCHITECTURES`]; another is [`GgufError::Unsupported`], naming
    /// it and those known.
    pub fn of(f: &GgufFile) -> Result<&'static Architecture, GgufError> {
        Architecture::named(f.string("general.architecture")?)
    }

    /// The architecture called `name` (see [`Architecture::of`]).
    pub fn named(name: &str) -> Result<&'static Architecture, GgufError> {
        ARCHITECTURES
            .iter()
            .find(|a| a.name == name)
            .ok_or_else(|| {
                let known: Vec<String> = ARCHITECTURES
                    .iter()
                    .map(|a| format!("`{}`", a.name))
                    .collect();
                GgufError::Unsupported(format!("architecture `{name}` (only {})", known.join(", ")))
            })
    }

    /// The metadata key `{prefix}.{suffix}`.
    pub fn key(&self, suffix: &str) -> String {
        format!("{}.{suffix}", self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama_is_known_and_another_is_refused_by_name() {
        assert_eq!(Architecture::named("llama").unwrap(), &LLAMA);
        assert_eq!(LLAMA.key("block_count"), "llama.block_count");
        let e = Architecture::named("mamba").unwrap_err().to_string();
        assert!(e.contains("architecture `mamba` (only `llama`)"), "{e}");
    }
}
