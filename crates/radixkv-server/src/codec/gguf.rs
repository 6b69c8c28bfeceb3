//! A GGUF model's text interface: [`GgufCodec`], its tokenizer, chat
//! template and end-of-sequence token from the file's metadata.

use super::{TextCodec, TokenDecoder, Turn};
use crate::error::ApiError;
use radixkv_models::gguf::{ChatTemplate, GgufError, GgufFile, GgufTokenizer, Message};
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
/// character (a BPE token may hold part of a UTF-8 sequence). A token
/// outside the vocabulary, or one the tokenizer cannot decode, is an
/// error.
struct Decoder {
    tokenizer: Arc<GgufTokenizer>,
    vocab: u32,
    ids: Vec<u32>,
    /// Tokens before `prefix` are out; `prefix..read` are the context
    /// whose text was already sent.
    prefix: usize,
    read: usize,
}

impl Decoder {
    fn text(&self, ids: &[u32]) -> Result<String, ApiError> {
        self.tokenizer
            .decode(ids)
            .map_err(|e| ApiError::Internal(format!("cannot decode the model's output: {e}")))
    }

    /// The text after what was sent, if it grew by whole characters.
    fn delta(&self, before: &str, now: &str) -> Result<String, ApiError> {
        now.get(before.len()..).map(str::to_string).ok_or_else(|| {
            ApiError::Internal(format!(
                "cannot decode the model's output: the text of tokens {:?} does not extend the text before them",
                &self.ids[self.prefix..]
            ))
        })
    }
}

impl TokenDecoder for Decoder {
    fn push(&mut self, token: u32) -> Result<String, ApiError> {
        if token >= self.vocab {
            return Err(ApiError::Internal(format!(
                "cannot decode the model's output: token {token} is outside its vocabulary of {}",
                self.vocab
            )));
        }
        self.ids.push(token);
        let before = self.text(&self.ids[self.prefix..self.read])?;
        let now = self.text(&self.ids[self.prefix..])?;
        if now.len() > before.len() && !now.ends_with('\u{fffd}') {
            let out = self.delta(&before, &now)?;
            self.prefix = self.read;
            self.read = self.ids.len();
            Ok(out)
        } else {
            Ok(String::new())
        }
    }

    fn finish(&mut self) -> Result<String, ApiError> {
        let before = self.text(&self.ids[self.prefix..self.read])?;
        let now = self.text(&self.ids[self.prefix..])?;
        let out = if now.len() >= before.len() {
            self.delta(&before, &now)?
        } else {
            String::new()
        };
        self.prefix = self.ids.len();
        self.read = self.ids.len();
        Ok(out)
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
            vocab: self.vocab,
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

#[cfg(test)]
mod tests {
    use super::GgufCodec;
    use crate::codec::TextCodec;
    use radixkv_models::gguf::GgufFile;

    /// SmolLM2's codec: text round-trips; a token outside the vocabulary
    /// is an error naming it, never text silently left out.
    #[test]
    fn an_undecodable_token_is_an_error_not_missing_text() {
        let path = std::env::var_os("RADIXKV_SMOLLM2").expect(
            "RADIXKV_SMOLLM2: SmolLM2's GGUF (scripts/fetch-smollm2.sh prints its path; scripts/test.sh sets it)",
        );
        let c = GgufCodec::new(&GgufFile::open(path).unwrap()).unwrap();
        let ids = c.encode("hello world").unwrap();
        assert_eq!(c.decode(&ids).unwrap(), "hello world");
        let vocab = c.vocab().unwrap();
        let mut d = c.decoder();
        let e = d.push(vocab + 5).unwrap_err();
        assert_eq!(e.status().as_u16(), 500);
        assert!(
            e.to_string()
                .contains(&format!("token {} is outside its vocabulary", vocab + 5)),
            "{e}"
        );
        assert!(c.decode(&[ids[0], vocab]).is_err());
    }
}
