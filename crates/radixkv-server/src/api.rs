//! The wire format of `POST /v1/completions` (an OpenAI subset), its
//! validation, and the byte-level tokenizer.
//!
//! ## Tokenizer
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

use super::error::ApiError;
use serde::Serialize;
use serde_json::{Map, Value};

/// A validated completion request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompletionRequest {
    /// Prompt tokens (not empty).
    pub tokens: Vec<u32>,
    /// Output tokens to generate (1..=the server's limit).
    pub max_tokens: usize,
    /// Server-sent events, one per token.
    pub stream: bool,
    /// With `stream`: send a last chunk with `usage` before `[DONE]`
    /// (`stream_options.include_usage`).
    pub include_usage: bool,
    /// Cache namespace (`cache_salt`): prompts under different salts never
    /// share cached prefixes.
    pub cache_salt: Option<String>,
    /// A LoRA adapter's name (`lora_name`): with the salt, the cache
    /// namespace (`radixkv::TokenKey::namespace_for`), published in KV
    /// events as `lora_name`. No adapter is applied (the models here have
    /// none); the prompt's KV is kept apart as an adapter's would be.
    pub lora_name: Option<String>,
    /// The `model` field as given (echoed back; not used for routing).
    pub model: Option<String>,
    /// Stop sequences (`stop`): the text ends before the first one.
    pub stop: Vec<String>,
}

/// Limits a request is validated against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Largest `max_tokens` accepted.
    pub max_tokens_limit: usize,
    /// `max_tokens` when the request has none.
    pub default_max_tokens: usize,
}

impl CompletionRequest {
    /// Parses and validates a `/v1/completions` body: a JSON object with
    /// `prompt` (a string or an array of token ids) and the fields of
    /// [`parse_chat`](Self::parse_chat). Every problem is an
    /// [`ApiError::BadRequest`] naming the field.
    pub fn parse(body: &[u8], limits: Limits) -> Result<CompletionRequest, ApiError> {
        let obj = body_object(body)?;
        let tokens = prompt_tokens(&obj)?;
        from_fields(&obj, tokens, limits, false)
    }

    /// Parses and validates a `/v1/chat/completions` body: `messages`
    /// rendered by the chat template ([`crate::chat`]), then the common
    /// fields: `max_tokens` or `max_completion_tokens`, `stream`,
    /// `stream_options.include_usage`, `cache_salt`, `lora_name`, `model`, `stop` (a
    /// string or up to 4, applied to the generated text), and the sampling
    /// fields clients send by default, accepted and not applied (the
    /// models here decode greedily): `temperature` (0..=2), `top_p`
    /// (0..=1), `seed`, `user`, `presence_penalty`, `frequency_penalty`.
    /// Fields radixkv cannot honour are refused with a 400 that names
    /// them: `n` > 1, `logprobs`/`top_logprobs`, `tools`, `tool_choice`,
    /// `functions`, `best_of` > 1, `echo`.
    pub fn parse_chat(body: &[u8], limits: Limits) -> Result<CompletionRequest, ApiError> {
        let obj = body_object(body)?;
        let tokens = crate::chat::render(&obj)?;
        from_fields(&obj, tokens, limits, true)
    }
}

fn body_object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::BadRequest(format!("malformed JSON body: {e}")))?;
    match v {
        Value::Object(obj) => Ok(obj),
        _ => Err(ApiError::BadRequest(
            "the body must be a JSON object".into(),
        )),
    }
}

fn prompt_tokens(obj: &Map<String, Value>) -> Result<Vec<u32>, ApiError> {
    match obj.get("prompt") {
        None | Some(Value::Null) => Err(ApiError::BadRequest("`prompt` is required".into())),
        Some(Value::String(s)) => Ok(encode(s)),
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, t)| {
                t.as_u64()
                    .and_then(|x| u32::try_from(x).ok())
                    .ok_or_else(|| {
                        ApiError::BadRequest(format!(
                            "`prompt[{i}]` must be a token id (an integer in 0..2^32); \
                             batched prompts are not supported"
                        ))
                    })
            })
            .collect::<Result<Vec<u32>, ApiError>>(),
        Some(_) => Err(ApiError::BadRequest(
            "`prompt` must be a string or an array of token ids".into(),
        )),
    }
}

/// A number field within `range`, if present.
fn opt_number(
    obj: &Map<String, Value>,
    key: &str,
    range: std::ops::RangeInclusive<f64>,
) -> Result<Option<f64>, ApiError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_f64().filter(|x| range.contains(x)) {
            Some(x) => Ok(Some(x)),
            None => Err(ApiError::BadRequest(format!(
                "`{key}` must be a number between {} and {}",
                range.start(),
                range.end()
            ))),
        },
    }
}

/// `stop`: a string or an array of up to 4 non-empty strings.
fn stop_sequences(obj: &Map<String, Value>) -> Result<Vec<String>, ApiError> {
    let bad =
        || ApiError::BadRequest("`stop` must be a string or an array of up to 4 strings".into());
    match obj.get("stop") {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(s)) => Ok([s.clone()].into_iter().filter(|s| !s.is_empty()).collect()),
        Some(Value::Array(items)) if items.len() <= 4 => items
            .iter()
            .map(|v| v.as_str().map(str::to_owned).ok_or_else(bad))
            .filter(|r| r.as_ref().map_or(true, |s| !s.is_empty()))
            .collect(),
        Some(_) => Err(bad()),
    }
}

fn from_fields(
    obj: &Map<String, Value>,
    tokens: Vec<u32>,
    limits: Limits,
    chat: bool,
) -> Result<CompletionRequest, ApiError> {
    if tokens.is_empty() {
        return Err(ApiError::BadRequest("`prompt` is empty".into()));
    }
    // Refused: what radixkv cannot honour, each named.
    let unsupported = |key: &str, why: &str| {
        Err(ApiError::BadRequest(format!(
            "`{key}` is not supported: {why}"
        )))
    };
    let set = |key: &str| !matches!(obj.get(key), None | Some(Value::Null));
    for key in ["tools", "tool_choice", "functions", "function_call"] {
        if set(key) {
            return unsupported(key, "radixkv generates text only (no tool calls)");
        }
    }
    match obj.get("logprobs") {
        None | Some(Value::Null) | Some(Value::Bool(false)) => {}
        Some(_) => return unsupported("logprobs", "no log probabilities are computed"),
    }
    if set("top_logprobs") {
        return unsupported("top_logprobs", "no log probabilities are computed");
    }
    if !chat {
        if matches!(obj.get("echo"), Some(Value::Bool(true))) {
            return unsupported("echo", "the prompt is not echoed");
        }
        match obj.get("best_of") {
            None | Some(Value::Null) => {}
            Some(v) if v.as_u64() == Some(1) => {}
            Some(_) => return unsupported("best_of", "one candidate per request"),
        }
    }
    match obj.get("n") {
        None | Some(Value::Null) => {}
        Some(v) if v.as_u64() == Some(1) => {}
        Some(_) => {
            return Err(ApiError::BadRequest(
                "`n` must be 1 (one choice per request)".into(),
            ))
        }
    }
    // Accepted, not applied (greedy decoding), but still validated.
    opt_number(obj, "temperature", 0.0..=2.0)?;
    opt_number(obj, "top_p", 0.0..=1.0)?;
    opt_number(obj, "presence_penalty", -2.0..=2.0)?;
    opt_number(obj, "frequency_penalty", -2.0..=2.0)?;
    match obj.get("seed") {
        None | Some(Value::Null) => {}
        Some(v) if v.is_i64() || v.is_u64() => {}
        Some(_) => return Err(ApiError::BadRequest("`seed` must be an integer".into())),
    }
    opt_str(obj, "user")?;
    let stop = stop_sequences(obj)?;
    let max_key = if chat && !set("max_tokens") {
        "max_completion_tokens"
    } else {
        "max_tokens"
    };
    let max_tokens = match obj.get(max_key) {
        None | Some(Value::Null) => limits.default_max_tokens,
        Some(v) => {
            let n = v.as_u64().ok_or_else(|| {
                ApiError::BadRequest(format!("`{max_key}` must be a positive integer"))
            })?;
            usize::try_from(n).unwrap_or(usize::MAX)
        }
    };
    if max_tokens == 0 || max_tokens > limits.max_tokens_limit {
        return Err(ApiError::BadRequest(format!(
            "`{max_key}` must be between 1 and {} (got {max_tokens})",
            limits.max_tokens_limit
        )));
    }
    let stream = opt_bool(obj, "stream")?.unwrap_or(false);
    let include_usage = match obj.get("stream_options") {
        None | Some(Value::Null) => false,
        Some(Value::Object(o)) => opt_bool(o, "include_usage")
            .map_err(|_| {
                ApiError::BadRequest("`stream_options.include_usage` must be a boolean".into())
            })?
            .unwrap_or(false),
        Some(_) => {
            return Err(ApiError::BadRequest(
                "`stream_options` must be an object".into(),
            ))
        }
    };
    let cache_salt = opt_str(obj, "cache_salt")?.filter(|s| !s.is_empty());
    let lora_name = opt_str(obj, "lora_name")?.filter(|s| !s.is_empty());
    let model = opt_str(obj, "model")?;
    Ok(CompletionRequest {
        tokens,
        max_tokens,
        stream,
        include_usage,
        cache_salt,
        lora_name,
        model,
        stop,
    })
}

/// `text` cut at the first of `stop` it contains: the kept text, and
/// whether a stop sequence was found.
///
/// ```
/// use radixkv_server::api::cut_at_stop;
/// assert_eq!(cut_at_stop("ab\n\ncd", &["\n\n".into()]), ("ab", true));
/// assert_eq!(cut_at_stop("abc", &["x".into()]), ("abc", false));
/// ```
pub fn cut_at_stop<'a>(text: &'a str, stop: &[String]) -> (&'a str, bool) {
    match stop.iter().filter_map(|s| text.find(s.as_str())).min() {
        Some(i) => (&text[..i], true),
        None => (text, false),
    }
}

fn opt_bool(obj: &Map<String, Value>, key: &str) -> Result<Option<bool>, ApiError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(ApiError::BadRequest(format!("`{key}` must be a boolean"))),
    }
}

fn opt_str(obj: &Map<String, Value>, key: &str) -> Result<Option<String>, ApiError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(ApiError::BadRequest(format!("`{key}` must be a string"))),
    }
}

/// The byte-level tokenizer: one token per UTF-8 byte of `text`.
///
/// ```
/// assert_eq!(radixkv_server::api::encode("hé"), vec![0x68, 0xc3, 0xa9]);
/// ```
pub fn encode(text: &str) -> Vec<u32> {
    text.bytes().map(u32::from).collect()
}

/// The byte an output token stands for: itself below 256, else a printable
/// ASCII character (`0x20 + id % 95`).
///
/// ```
/// use radixkv_server::api::token_byte;
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
/// use radixkv_server::api::Utf8Decoder;
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

/// `usage.prompt_tokens_details`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PromptTokensDetails {
    /// Prompt tokens not computed: served from the device's prefix cache,
    /// loaded from the host tier or copied from another device (the
    /// `radixkv` part of the response breaks it down).
    pub cached_tokens: usize,
}

/// A response's `usage`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Generated tokens.
    pub completion_tokens: usize,
    /// Both.
    pub total_tokens: usize,
    /// Prompt tokens not computed (device hits, host loads, peer copies;
    /// also under `prompt_tokens_details`, OpenAI's place for it).
    pub cached_tokens: usize,
    /// OpenAI's details.
    pub prompt_tokens_details: PromptTokensDetails,
}

impl Usage {
    /// Usage of a finished request: every prompt token it did not compute
    /// counts as cached.
    pub fn of(c: &radixkv_engine::sched::scheduler::Completion) -> Usage {
        Usage::new(
            c.prompt_tokens,
            c.output_tokens,
            c.cached_tokens + c.host_loaded_tokens + c.peer_copied_tokens,
        )
    }

    /// Usage of a finished request.
    pub fn new(prompt_tokens: usize, completion_tokens: usize, cached_tokens: usize) -> Usage {
        Usage {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
            cached_tokens,
            prompt_tokens_details: PromptTokensDetails { cached_tokens },
        }
    }
}

/// One choice of a completion (always index 0 here).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Choice {
    /// Generated text (the whole of it, or a stream chunk's part).
    pub text: String,
    /// Always 0.
    pub index: u32,
    /// Always null.
    pub logprobs: Option<()>,
    /// `"length"` once `max_tokens` tokens are generated; null in stream
    /// chunks before the last.
    pub finish_reason: Option<&'static str>,
}

/// Where and how fast the request ran (radixkv's addition).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RunInfo {
    /// The device that served it.
    pub device: u32,
    /// Prompt tokens served from that device's prefix cache.
    pub device_hit_tokens: usize,
    /// Prompt tokens loaded from the host tier.
    pub host_loaded_tokens: usize,
    /// Prompt tokens copied from another device.
    pub peer_copied_tokens: usize,
    /// Arrival to first token, milliseconds.
    pub ttft_ms: f64,
    /// Arrival to last token, milliseconds.
    pub e2e_ms: f64,
    /// Times it was retracted and re-queued.
    pub retractions: u32,
}

/// A completion, or one chunk of a streamed one.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CompletionResponse {
    /// `cmpl-<engine request id>`.
    pub id: String,
    /// Always `text_completion`.
    pub object: &'static str,
    /// Unix time in seconds.
    pub created: u64,
    /// The model name.
    pub model: String,
    /// One choice (none in a stream's usage chunk).
    pub choices: Vec<Choice>,
    /// Token counts (absent from token chunks).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// Device and timings (absent from token chunks).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub radixkv: Option<RunInfo>,
}

#[cfg(test)]
mod tests {
    use super::*;

    const L: Limits = Limits {
        max_tokens_limit: 4096,
        default_max_tokens: 16,
    };

    fn bad(body: &str) -> String {
        match CompletionRequest::parse(body.as_bytes(), L) {
            Err(ApiError::BadRequest(m)) => m,
            other => panic!("{body}: expected a 400, got {other:?}"),
        }
    }

    #[test]
    fn parses_strings_and_token_arrays() {
        let r = CompletionRequest::parse(br#"{"prompt":"ab","max_tokens":3}"#, L).unwrap();
        assert_eq!((r.tokens, r.max_tokens, r.stream), (vec![97, 98], 3, false));
        let r = CompletionRequest::parse(
            br#"{"prompt":[1,2,4294967295],"stream":true,"cache_salt":"t","stream_options":{"include_usage":true}}"#,
            L,
        )
        .unwrap();
        assert_eq!(r.tokens, vec![1, 2, u32::MAX]);
        assert_eq!(r.max_tokens, 16);
        assert!(r.stream && r.include_usage);
        assert_eq!(r.cache_salt.as_deref(), Some("t"));
    }

    #[test]
    fn rejects_bad_fields_with_a_message() {
        assert!(bad("{").contains("malformed JSON"));
        assert!(bad("[]").contains("object"));
        assert!(bad(r#"{"max_tokens":3}"#).contains("required"));
        assert!(bad(r#"{"prompt":""}"#).contains("empty"));
        assert!(bad(r#"{"prompt":7}"#).contains("string or an array"));
        assert!(bad(r#"{"prompt":[1,-2]}"#).contains("prompt[1]"));
        assert!(bad(r#"{"prompt":[4294967296]}"#).contains("prompt[0]"));
        assert!(bad(r#"{"prompt":["a"]}"#).contains("batched"));
        assert!(bad(r#"{"prompt":"a","max_tokens":0}"#).contains("between 1 and 4096"));
        assert!(bad(r#"{"prompt":"a","max_tokens":4097}"#).contains("4097"));
        assert!(bad(r#"{"prompt":"a","max_tokens":"3"}"#).contains("max_tokens"));
        assert!(bad(r#"{"prompt":"a","max_tokens":1.5}"#).contains("max_tokens"));
        assert!(bad(r#"{"prompt":"a","stream":"yes"}"#).contains("stream"));
        assert!(bad(r#"{"prompt":"a","cache_salt":1}"#).contains("cache_salt"));
        assert!(bad(r#"{"prompt":"a","n":2}"#).contains("`n` must be 1"));
        assert!(
            bad(r#"{"prompt":"a","stream_options":{"include_usage":1}}"#).contains("include_usage")
        );
    }

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
