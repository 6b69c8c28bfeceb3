//! `POST /v1/chat/completions`: messages through the model's chat
//! template ([`TextCodec::chat`]), and the `chat.completion` response
//! shapes. Roles: `system`, `developer`, `user`, `assistant`, `tool`.
//! Content is a string or an array of `{"type": "text", "text": …}` parts
//! (concatenated). The simulated and tiny models' template is
//! [`crate::codec::byte`]'s; a GGUF model renders its own (ChatML for
//! SmolLM2).
//!
//! ```
//! use radixkv_server::chat::render_messages;
//! use radixkv_server::codec::ByteCodec;
//! let t1 = render_messages(&serde_json::json!([{"role": "user", "content": "hi"}]), &ByteCodec).unwrap();
//! assert_eq!(String::from_utf8(t1.iter().map(|&t| t as u8).collect()).unwrap(),
//!            "<|user|>\nhi\n<|assistant|>\n");
//! let t2 = render_messages(&serde_json::json!([
//!     {"role": "user", "content": "hi"},
//!     {"role": "assistant", "content": "hello"},
//!     {"role": "user", "content": [{"type": "text", "text": "more"}]},
//! ]), &ByteCodec).unwrap();
//! assert!(t2.starts_with(&t1));
//! ```

use super::codec::{TextCodec, Turn};
use super::error::ApiError;
use super::wire::{RunInfo, Usage};
use serde::Serialize;
use serde_json::{Map, Value};

/// The roles the template knows.
pub const ROLES: [&str; 5] = ["system", "developer", "user", "assistant", "tool"];

/// The prompt tokens of a request body's `messages`.
pub(crate) fn render(
    obj: &Map<String, Value>,
    codec: &dyn TextCodec,
) -> Result<Vec<u32>, ApiError> {
    match obj.get("messages") {
        None | Some(Value::Null) => Err(ApiError::BadRequest("`messages` is required".into())),
        Some(m) => render_messages(m, codec),
    }
}

/// The prompt tokens of a `messages` array through `codec`'s template.
pub fn render_messages(messages: &Value, codec: &dyn TextCodec) -> Result<Vec<u32>, ApiError> {
    codec.chat(&turns(messages)?)
}

/// The validated messages of a `messages` array.
fn turns(messages: &Value) -> Result<Vec<Turn>, ApiError> {
    let Value::Array(list) = messages else {
        return Err(ApiError::BadRequest(
            "`messages` must be an array of messages".into(),
        ));
    };
    if list.is_empty() {
        return Err(ApiError::BadRequest("`messages` must not be empty".into()));
    }
    let mut turns = Vec::with_capacity(list.len());
    for (i, m) in list.iter().enumerate() {
        let Value::Object(m) = m else {
            return Err(ApiError::BadRequest(format!(
                "`messages[{i}]` must be an object with `role` and `content`"
            )));
        };
        let role = match m.get("role") {
            Some(Value::String(r)) if ROLES.contains(&r.as_str()) => r.as_str(),
            Some(Value::String(r)) => {
                return Err(ApiError::BadRequest(format!(
                    "`messages[{i}].role` {r:?} is not one of {}",
                    ROLES.join(", ")
                )))
            }
            _ => {
                return Err(ApiError::BadRequest(format!(
                    "`messages[{i}].role` must be a string"
                )))
            }
        };
        let mut text = String::new();
        match m.get("content") {
            Some(Value::String(c)) => text.push_str(c),
            Some(Value::Array(parts)) => {
                for (j, p) in parts.iter().enumerate() {
                    match (p.get("type").and_then(Value::as_str), p.get("text")) {
                        (Some("text"), Some(Value::String(t))) => text.push_str(t),
                        _ => {
                            return Err(ApiError::BadRequest(format!(
                                "`messages[{i}].content[{j}]` must be a text part \
                                 ({{\"type\": \"text\", \"text\": \"…\"}}): only text is supported"
                            )))
                        }
                    }
                }
            }
            None | Some(Value::Null) if role == "assistant" => {}
            _ => {
                return Err(ApiError::BadRequest(format!(
                    "`messages[{i}].content` must be a string or an array of text parts"
                )))
            }
        }
        turns.push(Turn {
            role: role.to_string(),
            content: text,
        });
    }
    Ok(turns)
}

/// The assistant's message of a response.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ChatMessage {
    /// Always `assistant`.
    pub role: &'static str,
    /// The generated text.
    pub content: String,
}

/// One choice of a chat completion.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ChatChoice {
    /// Always 0.
    pub index: u32,
    /// The reply.
    pub message: ChatMessage,
    /// Always null.
    pub logprobs: Option<()>,
    /// `stop` (a stop sequence) or `length` (`max_tokens` reached).
    pub finish_reason: &'static str,
}

/// A `chat.completion` response.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ChatResponse {
    /// `chatcmpl-<engine request id>`.
    pub id: String,
    /// Always `chat.completion`.
    pub object: &'static str,
    /// Unix seconds.
    pub created: u64,
    /// The model name.
    pub model: String,
    /// One choice.
    pub choices: Vec<ChatChoice>,
    /// Token counts, cached tokens under `prompt_tokens_details`.
    pub usage: Usage,
    /// Device and timings.
    pub radixkv: RunInfo,
}
