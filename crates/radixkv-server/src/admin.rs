//! `GET` and `POST /admin/config`: settings changed at run time, without a
//! restart. Loopback clients only, unless
//! [`ServerConfig::admin_from_anywhere`](crate::ServerConfig::admin_from_anywhere)
//! (and behind `--api-key` when one is set).
//!
//! The body (every field optional) and the answer (the settings now):
//!
//! ```json
//! {"eviction_policy": "lfu",
//!  "watermarks": [256, 1024],
//!  "router": {"balance_abs": 32, "balance_rel": 1.5, "copy_slack": 2, "copy_slack_long": 16}}
//! ```
//!
//! `eviction_policy` switches to any policy
//! ([`radixkv::RadixCache::set_eviction_policy`]); `watermarks` (low,
//! high free pages per device) need a server started with watermarks
//! (`--watermarks`); the router's kind is fixed at start. A change that
//! cannot be made is a 400 naming it, and nothing of that request is
//! applied past it (fields are applied in the order above).

use super::error::ApiError;
use radixkv::EvictionPolicy;
use radixkv_engine::Engine;
use serde_json::{json, Map, Value};

/// The settings now, as the answer shows them.
pub(crate) fn current(e: &Engine) -> Value {
    let r = e.router_config();
    json!({
        "eviction_policy": e.eviction_policy().name(),
        "watermarks": e.watermarks().map(|(l, h)| vec![l, h]),
        "router": {
            "kind": r.kind.name(),
            "balance_abs": r.balance_abs,
            "balance_rel": r.balance_rel,
            "copy_slack": r.copy_slack,
            "copy_slack_long": r.copy_slack_long,
        },
    })
}

fn uint(o: &Map<String, Value>, key: &str, at: &str) -> Result<Option<usize>, ApiError> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_u64().map(|x| Some(x as usize)).ok_or_else(|| {
            ApiError::BadRequest(format!("`{at}{key}` must be a non-negative integer"))
        }),
    }
}

/// Validates and applies a body; returns the settings now.
pub(crate) fn apply(e: &Engine, body: &[u8]) -> Result<Value, ApiError> {
    let o = match serde_json::from_slice(body) {
        Ok(Value::Object(o)) => o,
        Ok(_) => {
            return Err(ApiError::BadRequest(
                "the body must be a JSON object".into(),
            ))
        }
        Err(err) => return Err(ApiError::BadRequest(format!("malformed JSON body: {err}"))),
    };
    for k in o.keys() {
        if !["eviction_policy", "watermarks", "router"].contains(&k.as_str()) {
            return Err(ApiError::BadRequest(format!(
                "unknown setting `{k}` (eviction_policy, watermarks, router)"
            )));
        }
    }
    let bad =
        |at: &str, e: radixkv_engine::EngineError| ApiError::BadRequest(format!("`{at}`: {e}"));
    match o.get("eviction_policy") {
        None | Some(Value::Null) => {}
        Some(Value::String(p)) => {
            let p: EvictionPolicy = p
                .parse()
                .map_err(|err| ApiError::BadRequest(format!("`eviction_policy`: {err}")))?;
            e.set_eviction_policy(p);
        }
        Some(_) => {
            return Err(ApiError::BadRequest(
                "`eviction_policy` must be a string".into(),
            ))
        }
    }
    match o.get("watermarks") {
        None | Some(Value::Null) => {}
        Some(Value::Array(w)) if w.len() == 2 && w.iter().all(Value::is_u64) => {
            let (l, h) = (w[0].as_u64().unwrap_or(0), w[1].as_u64().unwrap_or(0));
            e.set_watermarks(l as usize, h as usize)
                .map_err(|err| bad("watermarks", err))?;
        }
        Some(_) => {
            return Err(ApiError::BadRequest(
                "`watermarks` must be [low, high] in free pages".into(),
            ))
        }
    }
    match o.get("router") {
        None | Some(Value::Null) => {}
        Some(Value::Object(r)) => {
            let mut cfg = *e.router_config();
            if let Some(x) = uint(r, "balance_abs", "router.")? {
                cfg.balance_abs = x;
            }
            if let Some(x) = uint(r, "copy_slack", "router.")? {
                cfg.copy_slack = x;
            }
            if let Some(x) = uint(r, "copy_slack_long", "router.")? {
                cfg.copy_slack_long = x;
            }
            match r.get("balance_rel") {
                None | Some(Value::Null) => {}
                Some(v) => {
                    cfg.balance_rel = v.as_f64().ok_or_else(|| {
                        ApiError::BadRequest("`router.balance_rel` must be a number".into())
                    })?
                }
            }
            for k in r.keys() {
                if ![
                    "balance_abs",
                    "balance_rel",
                    "copy_slack",
                    "copy_slack_long",
                    "kind",
                ]
                .contains(&k.as_str())
                {
                    return Err(ApiError::BadRequest(format!(
                        "unknown router setting `{k}`"
                    )));
                }
            }
            if let Some(k) = r.get("kind").and_then(Value::as_str) {
                cfg.kind = k
                    .parse()
                    .map_err(|err| ApiError::BadRequest(format!("`router.kind`: {err}")))?;
            }
            e.set_router_config(cfg).map_err(|err| bad("router", err))?;
        }
        Some(_) => return Err(ApiError::BadRequest("`router` must be an object".into())),
    }
    Ok(current(e))
}
