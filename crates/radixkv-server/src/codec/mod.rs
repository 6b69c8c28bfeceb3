//! How the server turns text into token ids and back: a [`TextCodec`]. The
//! simulated and tiny models use [`ByteCodec`] (one token per UTF-8 byte
//! and radixkv's own prefix-stable chat template); a GGUF model uses its
//! own tokenizer and chat template (`GgufCodec`, feature `gguf`). The HTTP
//! handlers ask a codec; a codec knows nothing of HTTP but [`ApiError`].
//!
//! | file | what it holds |
//! | --- | --- |
//! | `mod.rs` | [`TextCodec`], [`TokenDecoder`], [`Turn`] |
//! | `byte.rs` | [`ByteCodec`] and its chat template ([`byte::template`]) |
//! | `byte_tokenizer.rs` | the byte-level tokenizer and incremental UTF-8 decoder ([`byte_tokenizer`]) |
//! | `gguf.rs` | `GgufCodec`: a GGUF model's tokenizer and template (feature `gguf`) |

pub mod byte;
pub mod byte_tokenizer;
#[cfg(feature = "gguf")]
mod gguf;

pub use byte::ByteCodec;
#[cfg(feature = "gguf")]
pub use gguf::GgufCodec;

use crate::error::ApiError;

/// One message of a chat, as the request gave it (content already joined
/// from text parts).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Turn {
    /// `system`, `developer`, `user`, `assistant` or `tool`.
    pub role: String,
    /// Its text.
    pub content: String,
}

/// Turns output tokens into text as they come: text out as soon as it is
/// complete (a character split across tokens waits for its last one). A
/// token the model's tokenizer cannot turn into text is an error (a 500:
/// the model produced it), never text silently left out.
pub trait TokenDecoder: Send {
    /// Adds one token; returns the text it completes (often empty).
    fn push(&mut self, token: u32) -> Result<String, ApiError>;
    /// Whatever is left at the end.
    fn finish(&mut self) -> Result<String, ApiError>;
}

/// A model's text interface: tokenizer, chat template, end of sequence.
pub trait TextCodec: Send + Sync + std::fmt::Debug {
    /// The token ids of `text` (a `/v1/completions` prompt given as a
    /// string, a `/query` prompt).
    fn encode(&self, text: &str) -> Result<Vec<u32>, ApiError>;

    /// The prompt tokens of a chat, ending where the assistant's reply
    /// begins.
    fn chat(&self, turns: &[Turn]) -> Result<Vec<u32>, ApiError>;

    /// A decoder of one completion's output tokens.
    fn decoder(&self) -> Box<dyn TokenDecoder>;

    /// The token that ends the model's turn, if it has one: generation
    /// stops there (finish reason `stop`).
    fn eos(&self) -> Option<u32> {
        None
    }

    /// Largest token id + 1 a prompt given as ids may use (`None`: any
    /// `u32`).
    fn vocab(&self) -> Option<u32> {
        None
    }

    /// Positions the model can attend over (prompt and output together;
    /// `None`: no limit but the KV pool's).
    fn context(&self) -> Option<usize> {
        None
    }

    /// All of `tokens` as text.
    fn decode(&self, tokens: &[u32]) -> Result<String, ApiError> {
        let mut d = self.decoder();
        let mut s = String::new();
        for &t in tokens {
            s.push_str(&d.push(t)?);
        }
        s.push_str(&d.finish()?);
        Ok(s)
    }
}
