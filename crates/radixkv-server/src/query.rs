//! `POST /query` and `POST /query_by_hash`: what radixkv holds of a prompt,
//! per device and on the host tier, in the Mooncake KV-indexer RFC's shape,
//! so that an external router can ask radixkv directly.
//!
//! Request (`/query`): `token_ids` (an array of token ids) or `prompt` (a
//! string, tokenized as completions are), and optional `cache_salt`,
//! `lora_name` (together the cache namespace, as in the KV events) and
//! `model` (accepted, not used). `/query_by_hash` takes `block_hashes`
//! instead: radixkv's own block ids, as its KV events publish them (it
//! needs `--kv-events`, whose publisher keeps the id → tokens index). The
//! ids carry their namespace; a `cache_salt` or `lora_name` sent with them
//! must name that namespace, or nothing matches.
//!
//! Answer, in tokens (whole pages):
//!
//! ```json
//! {"data": {"radixkv": {"matched_tokens": 64, "L1": {"dp0": 64, "dp1": 0}, "L2": 32}}}
//! ```
//!
//! `L1` is the prefix resident on each device (`dp<d>`), `L2` on the host
//! tier (0 without one), `matched_tokens` the longest of them.

use super::error::ApiError;
use radixkv::{DeviceId, PagedCache, TokenKey};
use serde_json::{json, Map, Value};
use std::sync::Arc;

/// A parsed `/query` body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Query {
    /// The prompt's tokens.
    pub tokens: Vec<u32>,
    /// The cache namespace (from `cache_salt` and `lora_name`).
    pub namespace: Option<String>,
}

fn object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    match serde_json::from_slice(body) {
        Ok(Value::Object(o)) => Ok(o),
        Ok(_) => Err(ApiError::BadRequest(
            "the body must be a JSON object".into(),
        )),
        Err(e) => Err(ApiError::BadRequest(format!("malformed JSON body: {e}"))),
    }
}

fn opt_str<'a>(o: &'a Map<String, Value>, key: &str) -> Result<Option<&'a str>, ApiError> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(ApiError::BadRequest(format!("`{key}` must be a string"))),
    }
}

/// The namespace of a body's `cache_salt` and `lora_name`.
fn namespace(o: &Map<String, Value>) -> Result<Option<String>, ApiError> {
    let _ = opt_str(o, "model")?;
    Ok(radixkv::TokenKey::namespace_for(
        opt_str(o, "lora_name")?,
        opt_str(o, "cache_salt")?,
    ))
}

/// An array of integers in `0..=max`, every bad entry named.
fn ints(o: &Map<String, Value>, key: &str, max: u64) -> Result<Option<Vec<u64>>, ApiError> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, v)| {
                v.as_u64().filter(|&x| x <= max).ok_or_else(|| {
                    ApiError::BadRequest(format!(
                        "`{key}[{i}]` must be an integer in 0..={max}, not {v}"
                    ))
                })
            })
            .collect::<Result<Vec<u64>, ApiError>>()
            .map(Some),
        Some(_) => Err(ApiError::BadRequest(format!(
            "`{key}` must be an array of integers"
        ))),
    }
}

impl Query {
    /// Parses a `/query` body.
    ///
    /// ```
    /// use radixkv_server::{codec::ByteCodec, query::Query};
    /// let q = Query::parse(br#"{"token_ids": [1, 2, 3], "cache_salt": "t"}"#, &ByteCodec).unwrap();
    /// assert_eq!((q.tokens, q.namespace.as_deref()), (vec![1, 2, 3], Some("t")));
    /// assert!(Query::parse(br#"{"token_ids": [1, "x"]}"#, &ByteCodec).is_err());
    /// ```
    pub fn parse(body: &[u8], codec: &dyn crate::codec::TextCodec) -> Result<Query, ApiError> {
        let o = object(body)?;
        let namespace = namespace(&o)?;
        let tokens = match (
            ints(&o, "token_ids", u64::from(u32::MAX))?,
            opt_str(&o, "prompt")?,
        ) {
            (Some(t), None) => t.into_iter().map(|x| x as u32).collect(),
            (None, Some(p)) => codec.encode(p)?,
            (Some(_), Some(_)) => {
                return Err(ApiError::BadRequest(
                    "give `token_ids` or `prompt`, not both".into(),
                ))
            }
            (None, None) => {
                return Err(ApiError::BadRequest(
                    "`token_ids` (or `prompt`) is required".into(),
                ))
            }
        };
        Ok(Query { tokens, namespace })
    }
}

/// The block ids of a `/query_by_hash` body, and its namespace.
pub fn parse_by_hash(body: &[u8]) -> Result<(Vec<u64>, Option<String>), ApiError> {
    let o = object(body)?;
    let namespace = namespace(&o)?;
    let ids = ints(&o, "block_hashes", u64::MAX)?
        .ok_or_else(|| ApiError::BadRequest("`block_hashes` is required".into()))?;
    Ok((ids, namespace))
}

/// The answer for `tokens` in `namespace` over each device's cache.
pub fn answer(
    caches: &[(Arc<PagedCache>, DeviceId)],
    tokens: &[u32],
    namespace: Option<&str>,
) -> Value {
    let key = TokenKey::new(tokens).in_namespace(namespace);
    let mut l1 = Map::new();
    let mut l2 = 0;
    let mut best = 0;
    for (d, (cache, dev)) in caches.iter().enumerate() {
        let t = cache.peek_tiers(key);
        let on = t.devices.get(dev.index()).copied().unwrap_or(0);
        l1.insert(format!("dp{d}"), json!(on));
        l2 = l2.max(t.host);
        best = best.max(on);
    }
    json!({"data": {"radixkv": {"matched_tokens": best.max(l2), "L1": l1, "L2": l2}}})
}
