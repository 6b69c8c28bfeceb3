//! The requests of `POST /v1/completions` and `POST /v1/chat/completions`
//! (an OpenAI subset) and their validation.
//!
//! Text becomes tokens through the model's [`TextCodec`]; the response
//! shapes are [`crate::wire`].

use super::codec::TextCodec;
use super::error::ApiError;
use radixkv_engine::sched::sampling::Sampling;
use serde_json::{Map, Value};
use std::sync::Arc;

/// A validated completion request.
#[derive(Clone, Debug, PartialEq)]
pub struct CompletionRequest {
    /// Prompt tokens (not empty), in the one buffer the engine's job and
    /// its scheduler share until the cache's request takes its own copy.
    pub tokens: Arc<[u32]>,
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
    /// `temperature`, `top_p` and `seed` (greedy when the temperature is
    /// 0; a request without a seed gets one drawn by the server).
    pub sampling: Sampling,
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
    /// `prompt` (a string, encoded by `codec`, or an array of token ids
    /// within its vocabulary) and the fields of
    /// [`parse_chat`](Self::parse_chat). Every problem is an
    /// [`ApiError::BadRequest`] naming the field.
    pub fn parse(
        body: &[u8],
        limits: Limits,
        codec: &dyn TextCodec,
    ) -> Result<CompletionRequest, ApiError> {
        let obj = body_object(body)?;
        let tokens = prompt_tokens(&obj, codec)?;
        from_fields(&obj, tokens, limits, false)
    }

    /// Parses and validates a `/v1/chat/completions` body: `messages`
    /// rendered by the chat template ([`crate::chat`]), then the common
    /// fields: `max_tokens` or `max_completion_tokens`, `stream`,
    /// `stream_options.include_usage`, `cache_salt`, `lora_name`, `model`, `stop` (a
    /// string or up to 4, applied to the generated text), the sampling
    /// fields `temperature` (0..=2; 0 is greedy), `top_p` (0..=1) and
    /// `seed` (applied by models that compute: the same seed gives the
    /// same text), and fields clients send by default, accepted and not
    /// applied: `user`, `presence_penalty`, `frequency_penalty`.
    /// Fields radixkv cannot honour are refused with a 400 that names
    /// them: `n` > 1, `logprobs`/`top_logprobs`, `tools` (but `[]`),
    /// `tool_choice` and `function_call` (but `"none"`), `functions` (but
    /// `[]`), `response_format` (but `{"type": "text"}`), `best_of` > 1,
    /// `echo`, a non-empty `suffix`.
    pub fn parse_chat(
        body: &[u8],
        limits: Limits,
        codec: &dyn TextCodec,
    ) -> Result<CompletionRequest, ApiError> {
        let obj = body_object(body)?;
        let tokens = crate::chat::render(&obj, codec)?;
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

fn prompt_tokens(obj: &Map<String, Value>, codec: &dyn TextCodec) -> Result<Vec<u32>, ApiError> {
    let vocab = codec.vocab().map_or(1u64 << 32, u64::from);
    match obj.get("prompt") {
        None | Some(Value::Null) => Err(ApiError::BadRequest("`prompt` is required".into())),
        Some(Value::String(s)) => codec.encode(s),
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, t)| {
                t.as_u64()
                    .filter(|&x| x < vocab)
                    .map(|x| x as u32)
                    .ok_or_else(|| {
                        ApiError::BadRequest(format!(
                            "`prompt[{i}]` must be a token id (an integer in 0..{vocab}); \
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
    // An empty list of tools, or a choice of none, asks for no tool calls.
    let no_tools = |key: &str| match obj.get(key) {
        None | Some(Value::Null) => true,
        Some(Value::Array(a)) => a.is_empty() && matches!(key, "tools" | "functions"),
        Some(Value::String(s)) => s == "none" && matches!(key, "tool_choice" | "function_call"),
        Some(_) => false,
    };
    for key in ["tools", "tool_choice", "functions", "function_call"] {
        if !no_tools(key) {
            return unsupported(key, "radixkv generates text only (no tool calls)");
        }
    }
    // Text is the only format; a suffix is not filled in.
    match obj.get("response_format") {
        None | Some(Value::Null) => {}
        Some(Value::Object(f)) if f.get("type").and_then(Value::as_str) == Some("text") => {}
        Some(_) => {
            return unsupported(
                "response_format",
                "only {\"type\": \"text\"} (no JSON mode or schema)",
            )
        }
    }
    let suffix = obj.get("suffix");
    if !chat
        && !matches!(suffix, None | Some(Value::Null))
        && suffix.and_then(Value::as_str) != Some("")
    {
        return unsupported("suffix", "no text is inserted after a suffix");
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
    // OpenAI's default temperature is 1; a request without a seed gets a
    // fresh one (as OpenAI's do).
    let temperature = opt_number(obj, "temperature", 0.0..=2.0)?.unwrap_or(1.0);
    let top_p = opt_number(obj, "top_p", 0.0..=1.0)?.unwrap_or(1.0);
    // Accepted, not applied, but still validated.
    opt_number(obj, "presence_penalty", -2.0..=2.0)?;
    opt_number(obj, "frequency_penalty", -2.0..=2.0)?;
    let seed = match obj.get("seed") {
        None | Some(Value::Null) => fresh_seed(),
        Some(v) => match (v.as_u64(), v.as_i64()) {
            (Some(u), _) => u,
            (None, Some(i)) => i as u64,
            _ => return Err(ApiError::BadRequest("`seed` must be an integer".into())),
        },
    };
    let sampling = Sampling {
        temperature: temperature as f32,
        top_p: top_p as f32,
        seed,
    };
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
        tokens: tokens.into(),
        max_tokens,
        stream,
        include_usage,
        cache_salt,
        lora_name,
        model,
        stop,
        sampling,
    })
}

/// A seed for a request that gives none: the clock's nanoseconds mixed
/// with a counter, so that two requests in the same instant differ.
fn fresh_seed() -> u64 {
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    // Relaxed: only uniqueness of the values matters, no other memory.
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    radixkv_engine::rng::SplitMix64::new(t ^ n.rotate_left(32)).next_u64()
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

/// Watches generated text for the first stop sequence, looking only at
/// what each new piece could complete (linear in the text), and for the
/// model's end-of-sequence token.
#[derive(Debug, Default)]
pub struct StopWatch {
    text: String,
    /// Tokens pushed when a stop sequence was completed.
    hit_at: Option<usize>,
    tokens: usize,
}

impl StopWatch {
    /// Adds one token's decoded `piece`; true when it completes a stop
    /// sequence for the first time.
    pub fn push(&mut self, piece: &str, stop: &[String]) -> bool {
        self.tokens += 1;
        if self.hit_at.is_some() || stop.is_empty() {
            return false;
        }
        let longest = stop.iter().map(String::len).max().unwrap_or(0);
        let mut from = self.text.len().saturating_sub(longest);
        while !self.text.is_char_boundary(from) {
            from -= 1;
        }
        self.text.push_str(piece);
        if stop.iter().any(|s| self.text[from..].contains(s.as_str())) {
            self.hit_at = Some(self.tokens);
            return true;
        }
        false
    }

    /// Adds the model's end-of-sequence token: the generation ends here
    /// unless a stop sequence already ended it; true when it is the first
    /// end.
    pub fn push_eos(&mut self) -> bool {
        self.tokens += 1;
        if self.hit_at.is_some() {
            return false;
        }
        self.hit_at = Some(self.tokens);
        true
    }

    /// Tokens up to and including the one that ended the generation (the
    /// first stop sequence's last, or the end-of-sequence token), if one
    /// did.
    pub fn hit_at(&self) -> Option<usize> {
        self.hit_at
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::ByteCodec;

    const L: Limits = Limits {
        max_tokens_limit: 4096,
        default_max_tokens: 16,
    };

    fn bad(body: &str) -> String {
        match CompletionRequest::parse(body.as_bytes(), L, &ByteCodec) {
            Err(ApiError::BadRequest(m)) => m,
            other => panic!("{body}: expected a 400, got {other:?}"),
        }
    }

    #[test]
    fn parses_strings_and_token_arrays() {
        let r =
            CompletionRequest::parse(br#"{"prompt":"ab","max_tokens":3}"#, L, &ByteCodec).unwrap();
        assert_eq!(
            (&*r.tokens, r.max_tokens, r.stream),
            (&[97, 98][..], 3, false)
        );
        let r = CompletionRequest::parse(
            br#"{"prompt":[1,2,4294967295],"stream":true,"cache_salt":"t","stream_options":{"include_usage":true}}"#,
            L,
            &ByteCodec,
        )
        .unwrap();
        assert_eq!(*r.tokens, [1, 2, u32::MAX]);
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
}
