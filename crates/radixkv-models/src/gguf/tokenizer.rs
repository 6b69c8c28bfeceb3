//! The tokenizer of a GGUF llama file: byte-level BPE from
//! `tokenizer.ggml.tokens` and `tokenizer.ggml.merges`, the pre-tokenizer
//! its `tokenizer.ggml.pre` name stands for, and its control tokens as
//! special tokens, built with the `tokenizers` crate.

use super::arch::Architecture;
use super::{GgufError, GgufFile};
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{AddedToken, Tokenizer};

/// The pre-tokenizers (`tokenizer.ggml.pre`) built here; an
/// architecture lists those of its family among them.
const IMPLEMENTED_PRE: [&str; 1] = ["smollm"];

/// GGUF's token type of a control token (`<|im_start|>` and the like).
const CONTROL: i32 = 3;

/// A GGUF file's tokenizer.
pub struct GgufTokenizer {
    inner: Tokenizer,
    /// The token [`encode`](Self::encode) puts first, where the file (or
    /// its architecture) asks for BOS.
    bos: Option<u32>,
}

impl std::fmt::Debug for GgufTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufTokenizer")
            .field("vocab", &self.inner.get_vocab_size(true))
            .finish()
    }
}

impl GgufTokenizer {
    /// Builds it from `f`'s metadata. Only byte-level BPE (`gpt2`) with
    /// a pre-tokenizer its architecture lists
    /// ([`Architecture::pre_tokenizers`]) is implemented: `smollm` (digits
    /// one by one, then GPT-2's split, as llama.cpp defines that name);
    /// another is refused. BOS comes first where
    /// `tokenizer.ggml.add_bos_token` says so, or the architecture's
    /// default ([`Architecture::add_bos`]) when the file does not say.
    pub fn from_gguf(f: &GgufFile) -> Result<GgufTokenizer, GgufError> {
        let arch = Architecture::of(f)?;
        let model = f.string("tokenizer.ggml.model")?;
        if model != "gpt2" {
            return Err(GgufError::Unsupported(format!(
                "tokenizer.ggml.model `{model}` (only byte-level BPE, `gpt2`)"
            )));
        }
        let pre = f.string("tokenizer.ggml.pre")?;
        if !arch.pre_tokenizers.contains(&pre) || !IMPLEMENTED_PRE.contains(&pre) {
            return Err(GgufError::Unsupported(format!(
                "tokenizer.ggml.pre `{pre}` (architecture `{}`: only {})",
                arch.name,
                arch.pre_tokenizers
                    .iter()
                    .map(|p| format!("`{p}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        let add_bos = match f.value("tokenizer.ggml.add_bos_token") {
            Ok(v) => v.to_bool().map_err(|e| GgufError::Metadata {
                key: "tokenizer.ggml.add_bos_token".into(),
                why: e.to_string(),
            })?,
            Err(_) => arch.add_bos,
        };
        let bos = if add_bos {
            Some(f.u32("tokenizer.ggml.bos_token_id")?)
        } else {
            None
        };
        let strings = |key: &str| -> Result<Vec<String>, GgufError> {
            let bad = |why: String| GgufError::Metadata {
                key: key.into(),
                why,
            };
            f.value(key)?
                .to_vec()
                .map_err(|e| bad(e.to_string()))?
                .iter()
                .map(|v| v.to_string().cloned().map_err(|e| bad(e.to_string())))
                .collect()
        };
        let tokens = strings("tokenizer.ggml.tokens")?;
        let merges = strings("tokenizer.ggml.merges")?;
        let types: Vec<i32> = match f.value("tokenizer.ggml.token_type") {
            Ok(v) => v
                .to_vec()
                .map_err(|e| GgufError::Metadata {
                    key: "tokenizer.ggml.token_type".into(),
                    why: e.to_string(),
                })?
                .iter()
                .map(|t| t.to_i32().unwrap_or(1))
                .collect(),
            Err(_) => Vec::new(),
        };
        let vocab: tokenizers::models::bpe::Vocab = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();
        let merges: Vec<(String, String)> = merges
            .iter()
            .map(|m| match m.split_once(' ') {
                Some((a, b)) => Ok((a.to_string(), b.to_string())),
                None => Err(GgufError::Metadata {
                    key: "tokenizer.ggml.merges".into(),
                    why: format!("`{m}` is not two tokens"),
                }),
            })
            .collect::<Result<_, _>>()?;
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .build()
            .map_err(|e| GgufError::Tokenizer(e.to_string()))?;
        let mut inner = Tokenizer::new(bpe);
        inner.with_pre_tokenizer(Some(Sequence::new(vec![
            PreTokenizerWrapper::Digits(Digits::new(true)),
            PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, true)),
        ])));
        inner.with_decoder(Some(ByteLevelDecoder::default()));
        let special: Vec<AddedToken> = tokens
            .iter()
            .zip(&types)
            .filter(|(_, &t)| t == CONTROL)
            .map(|(s, _)| AddedToken::from(s.clone(), true))
            .collect();
        inner
            .add_special_tokens(special)
            .map_err(|e| GgufError::Tokenizer(e.to_string()))?;
        Ok(GgufTokenizer { inner, bos })
    }

    /// The ids of `text`, control tokens written in it (`<|im_start|>`)
    /// included as their ids, after BOS where the file asks for it
    /// (SmolLM2's does not: `add_bos_token` false).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, GgufError> {
        let ids = self
            .inner
            .encode(text, false)
            .map_err(|e| GgufError::Tokenizer(e.to_string()))?;
        Ok(self
            .bos
            .into_iter()
            .chain(ids.get_ids().iter().copied())
            .collect())
    }

    /// The text of `ids`, control tokens left out.
    pub fn decode(&self, ids: &[u32]) -> Result<String, GgufError> {
        self.inner
            .decode(ids, true)
            .map_err(|e| GgufError::Tokenizer(e.to_string()))
    }

    /// Tokens in the vocabulary, control tokens included.
    pub fn vocab_size(&self) -> u32 {
        self.inner.get_vocab_size(true) as u32
    }

    /// The id of a token given by its text.
    pub fn id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }
}
