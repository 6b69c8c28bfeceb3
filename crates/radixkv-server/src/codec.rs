//! How the server turns text into token ids and back: a [`TextCodec`]. The
//! simulated and tiny models use [`ByteCodec`] (one token per UTF-8 byte,
//! [`crate::tokenizer`], and radixkv's own prefix-stable chat template,
//! [`crate::chat`]); a GGUF model uses its own tokenizer and chat template
//! (`GgufCodec`, feature `gguf`).

use super::error::ApiError;

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
/// complete (a character split across tokens waits for its last one).
pub trait TokenDecoder: Send {
    /// Adds one token; returns the text it completes (often empty).
    fn push(&mut self, token: u32) -> String;
    /// Whatever is left at the end.
    fn finish(&mut self) -> String;
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
    fn decode(&self, tokens: &[u32]) -> String {
        let mut d = self.decoder();
        let mut s: String = tokens.iter().map(|&t| d.push(t)).collect();
        s.push_str(&d.finish());
        s
    }
}

/// The byte codec of the simulated and tiny models (see
/// [`crate::tokenizer`] and [`crate::chat`]).
///
/// ```
/// use radixkv_server::codec::{ByteCodec, TextCodec, Turn};
/// let c = ByteCodec;
/// assert_eq!(c.encode("hé").unwrap(), vec![0x68, 0xc3, 0xa9]);
/// assert_eq!(c.decode(&[0x68, 0xc3, 0xa9]), "hé");
/// let t = c.chat(&[Turn { role: "user".into(), content: "hi".into() }]).unwrap();
/// assert_eq!(c.decode(&t), "<|user|>\nhi\n<|assistant|>\n");
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct ByteCodec;

struct ByteDecoder(super::tokenizer::Utf8Decoder);

impl TokenDecoder for ByteDecoder {
    fn push(&mut self, token: u32) -> String {
        self.0.push(super::tokenizer::token_byte(token))
    }
    fn finish(&mut self) -> String {
        self.0.finish()
    }
}

impl TextCodec for ByteCodec {
    fn encode(&self, text: &str) -> Result<Vec<u32>, ApiError> {
        Ok(super::tokenizer::encode(text))
    }

    fn chat(&self, turns: &[Turn]) -> Result<Vec<u32>, ApiError> {
        Ok(super::tokenizer::encode(&super::chat::byte_template(turns)))
    }

    fn decoder(&self) -> Box<dyn TokenDecoder> {
        Box::new(ByteDecoder(Default::default()))
    }
}

#[cfg(feature = "gguf")]
pub use gguf::GgufCodec;

#[cfg(feature = "gguf")]
mod gguf {
    use super::{ApiError, TextCodec, TokenDecoder, Turn};
    use radixkv_engine::gguf::{ChatTemplate, GgufError, GgufFile, GgufTokenizer, Message};
    use std::sync::Arc;

    /// A GGUF model's text interface: its tokenizer, chat template and
    /// end-of-sequence token from the file's metadata.
    #[derive(Debug)]
    pub struct GgufCodec {
        tokenizer: Arc<GgufTokenizer>,
        template: ChatTemplate,
        eos: Option<u32>,
        vocab: u32,
        context: Option<usize>,
    }

    impl GgufCodec {
        /// Reads them from `f` (a missing or unsupported tokenizer or
        /// template is an error).
        pub fn new(f: &GgufFile) -> Result<GgufCodec, GgufError> {
            let tokenizer = f.tokenizer()?;
            Ok(GgufCodec {
                vocab: tokenizer.vocab_size(),
                tokenizer: Arc::new(tokenizer),
                template: f.template()?,
                eos: f.eos(),
                context: f.context_length(),
            })
        }
    }

    fn bad(e: GgufError) -> ApiError {
        ApiError::BadRequest(e.to_string())
    }

    /// Incremental detokenization: the text of the tokens since the last
    /// complete piece, emitted once it no longer ends in an incomplete
    /// character (a BPE token may hold part of a UTF-8 sequence).
    struct Decoder {
        tokenizer: Arc<GgufTokenizer>,
        ids: Vec<u32>,
        /// Tokens before `prefix` are out; `prefix..read` are the context
        /// whose text was already sent.
        prefix: usize,
        read: usize,
    }

    impl Decoder {
        fn text(&self, ids: &[u32]) -> String {
            self.tokenizer.decode(ids).unwrap_or_default()
        }
    }

    impl TokenDecoder for Decoder {
        fn push(&mut self, token: u32) -> String {
            self.ids.push(token);
            let before = self.text(&self.ids[self.prefix..self.read]);
            let now = self.text(&self.ids[self.prefix..]);
            if now.len() > before.len() && !now.ends_with('\u{fffd}') {
                let out = now.get(before.len()..).unwrap_or_default().to_string();
                self.prefix = self.read;
                self.read = self.ids.len();
                out
            } else {
                String::new()
            }
        }

        fn finish(&mut self) -> String {
            let before = self.text(&self.ids[self.prefix..self.read]);
            let now = self.text(&self.ids[self.prefix..]);
            self.prefix = self.ids.len();
            self.read = self.ids.len();
            now.get(before.len()..).unwrap_or_default().to_string()
        }
    }

    impl TextCodec for GgufCodec {
        fn encode(&self, text: &str) -> Result<Vec<u32>, ApiError> {
            self.tokenizer.encode(text).map_err(bad)
        }

        fn chat(&self, turns: &[Turn]) -> Result<Vec<u32>, ApiError> {
            let messages: Vec<Message> = turns
                .iter()
                .map(|t| Message {
                    role: t.role.clone(),
                    content: t.content.clone(),
                })
                .collect();
            let text = self.template.render(&messages, true).map_err(bad)?;
            self.encode(&text)
        }

        fn decoder(&self) -> Box<dyn TokenDecoder> {
            Box::new(Decoder {
                tokenizer: Arc::clone(&self.tokenizer),
                ids: Vec::new(),
                prefix: 0,
                read: 0,
            })
        }

        fn eos(&self) -> Option<u32> {
            self.eos
        }

        fn vocab(&self) -> Option<u32> {
            Some(self.vocab)
        }

        fn context(&self) -> Option<usize> {
            self.context
        }
    }
}
