//! The byte codec of the simulated and tiny models: one token per UTF-8
//! byte ([`byte_tokenizer`]) and radixkv's own prefix-stable chat template
//! ([`template`]).
//!
//! With the simulated and tiny models ([`ByteCodec`]), each message becomes
//! `<|ROLE|>\n` + its content + `\n`, in order, and the prompt ends with
//! `<|assistant|>\n` (the generation prompt); the result is byte-tokenized
//! ([`byte_tokenizer::encode`]). A GGUF model renders its own template
//! (ChatML for SmolLM2).
//!
//! The template is prefix-stable: the prompt of a conversation's turn `k`
//! begins with the whole prompt of turn `k - 1` (that prompt ended with
//! `<|assistant|>\n`, which the next turn's assistant message starts
//! with), so each turn reuses every earlier turn's cached KV and
//! `usage.prompt_tokens_details.cached_tokens` grows turn by turn.

use super::byte_tokenizer;
use super::{TextCodec, TokenDecoder, Turn};
use crate::error::ApiError;

/// The byte codec of the simulated and tiny models (see
/// [`byte_tokenizer`] and [`template`]).
///
/// ```
/// use radixkv_server::codec::{ByteCodec, TextCodec, Turn};
/// let c = ByteCodec;
/// assert_eq!(c.encode("hé").unwrap(), vec![0x68, 0xc3, 0xa9]);
/// assert_eq!(c.decode(&[0x68, 0xc3, 0xa9]).unwrap(), "hé");
/// let t = c.chat(&[Turn { role: "user".into(), content: "hi".into() }]).unwrap();
/// assert_eq!(c.decode(&t).unwrap(), "<|user|>\nhi\n<|assistant|>\n");
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct ByteCodec;

struct ByteDecoder(byte_tokenizer::Utf8Decoder);

impl TokenDecoder for ByteDecoder {
    fn push(&mut self, token: u32) -> Result<String, ApiError> {
        Ok(self.0.push(byte_tokenizer::token_byte(token)))
    }
    fn finish(&mut self) -> Result<String, ApiError> {
        Ok(self.0.finish())
    }
}

impl TextCodec for ByteCodec {
    fn encode(&self, text: &str) -> Result<Vec<u32>, ApiError> {
        Ok(byte_tokenizer::encode(text))
    }

    fn chat(&self, turns: &[Turn]) -> Result<Vec<u32>, ApiError> {
        Ok(byte_tokenizer::encode(&template(turns)))
    }

    fn decoder(&self) -> Box<dyn TokenDecoder> {
        Box::new(ByteDecoder(Default::default()))
    }
}

/// The byte codec's chat template of `turns` (see the module docs).
pub fn template(turns: &[Turn]) -> String {
    let mut text = String::new();
    for t in turns {
        text.push_str("<|");
        text.push_str(&t.role);
        text.push_str("|>\n");
        text.push_str(&t.content);
        text.push('\n');
    }
    text.push_str("<|assistant|>\n");
    text
}
