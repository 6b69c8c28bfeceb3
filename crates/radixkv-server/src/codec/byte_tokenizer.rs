//! The byte-level tokenizer of the simulated and tiny models.
//!
//! A prompt given as a string is UTF-8 encoded and each byte is one token
//! (ids 0..256). A prompt given as an array of integers is used as token
//! ids unchanged (any `u32`).
//!
//! Output tokens become text one byte each ([`token_byte`]): an id below
//! 256 is that byte; any other id (the simulator's outputs are synthetic
//! ids ≥ 2³¹) maps to a printable ASCII character, `0x20 + id % 95`. The
//! bytes are decoded as UTF-8 incrementally ([`Utf8Decoder`]): a character
//! split across tokens appears with its last byte; invalid bytes become
//! U+FFFD.

/// The byte-level tokenizer: one token per UTF-8 byte of `text`.
///
/// ```
/// assert_eq!(radixkv_server::codec::byte_tokenizer::encode("hé"), vec![0x68, 0xc3, 0xa9]);
/// ```
pub fn encode(text: &str) -> Vec<u32> {
    text.bytes().map(u32::from).collect()
}

/// The byte an output token stands for: itself below 256, else a printable
/// ASCII character (`0x20 + id % 95`).
///
/// ```
/// use radixkv_server::codec::byte_tokenizer::token_byte;
/// assert_eq!(token_byte(b'A' as u32), b'A');
/// assert!((0x20..0x7f).contains(&token_byte(0x8000_1234)));
/// ```
pub fn token_byte(id: u32) -> u8 {
    match u8::try_from(id) {
        Ok(b) => b,
        Err(_) => 0x20 + (id % 95) as u8,
    }
}

/// Decodes output tokens to text in one go (see [`token_byte`]).
pub fn decode(tokens: &[u32]) -> String {
    let mut d = Utf8Decoder::default();
    let mut s: String = tokens.iter().map(|&t| d.push(token_byte(t))).collect();
    s.push_str(&d.finish());
    s
}

/// An incremental UTF-8 decoder: bytes in, text out as soon as each
/// character is complete; invalid bytes become U+FFFD.
///
/// ```
/// use radixkv_server::codec::byte_tokenizer::Utf8Decoder;
/// let mut d = Utf8Decoder::default();
/// assert_eq!(d.push(0xc3), "");
/// assert_eq!(d.push(0xa9), "é");
/// assert_eq!(d.push(0xff), "\u{fffd}");
/// ```
#[derive(Clone, Debug, Default)]
pub struct Utf8Decoder {
    pending: Vec<u8>,
}

impl Utf8Decoder {
    /// Adds one byte; returns the text it completes (often empty or one
    /// character).
    pub fn push(&mut self, b: u8) -> String {
        self.pending.push(b);
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    return out;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    out.push_str(&String::from_utf8_lossy(&self.pending[..valid]));
                    match e.error_len() {
                        // An incomplete character at the end: wait for more.
                        None => {
                            self.pending.drain(..valid);
                            return out;
                        }
                        Some(bad) => {
                            out.push('\u{fffd}');
                            self.pending.drain(..valid + bad);
                        }
                    }
                }
            }
        }
    }

    /// Whatever is left (an incomplete character) as U+FFFD.
    pub fn finish(&mut self) -> String {
        if self.pending.is_empty() {
            String::new()
        } else {
            self.pending.clear();
            "\u{fffd}".into()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decoding_is_incremental_and_lossy() {
        let text = "añ€😀";
        let toks = encode(text);
        assert_eq!(decode(&toks), text);
        let mut d = Utf8Decoder::default();
        let joined: String = text.bytes().map(|b| d.push(b)).collect();
        assert_eq!(joined, text);
        assert_eq!(decode(&[0xe2, 0x82]), "\u{fffd}");
        assert_eq!(decode(&[0x80, u32::from(b'a')]), "\u{fffd}a");
        assert!(decode(&[0x8000_0000, 0xffff_ffff])
            .chars()
            .all(|c| c.is_ascii_graphic() || c == ' '));
    }
}
