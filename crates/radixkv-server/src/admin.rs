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
//! high free pages per device, low < high < pages per device) need a
//! server started with watermarks (`--watermarks`); the router's counts
//! run from 0 to 2²⁰ and `balance_rel` from 1 to 10⁶; its `kind` is fixed
//! at start (it may be given, as it is). The whole body is validated
//! before anything is applied: a field that cannot be taken is a 400 naming
//! it, and the request changes nothing.

use super::error::ApiError;
use radixkv::EvictionPolicy;
use radixkv_engine::router::RouterConfig;
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

/// The largest count a router setting takes (outstanding requests).
const MAX_COUNT: u64 = 1 << 20;

fn count(o: &Map<String, Value>, key: &str) -> Result<Option<usize>, ApiError> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .filter(|x| *x <= MAX_COUNT)
            .map(|x| Some(x as usize))
            .ok_or_else(|| {
                ApiError::BadRequest(format!(
                    "`router.{key}` must be an integer from 0 to {MAX_COUNT}"
                ))
            }),
    }
}

fn object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    match serde_json::from_slice(body) {
        Ok(Value::Object(o)) => Ok(o),
        Ok(_) => Err(ApiError::BadRequest(
            "the body must be a JSON object".into(),
        )),
        Err(err) => Err(ApiError::BadRequest(format!("malformed JSON body: {err}"))),
    }
}

fn only(o: &Map<String, Value>, known: &[&str], at: &str) -> Result<(), ApiError> {
    match o.keys().find(|k| !known.contains(&k.as_str())) {
        Some(k) => Err(ApiError::BadRequest(format!(
            "unknown setting `{at}{k}` ({})",
            known.join(", ")
        ))),
        None => Ok(()),
    }
}

fn eviction_policy(o: &Map<String, Value>) -> Result<Option<EvictionPolicy>, ApiError> {
    match o.get("eviction_policy") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(p)) => p
            .parse()
            .map(Some)
            .map_err(|err| ApiError::BadRequest(format!("`eviction_policy`: {err}"))),
        Some(_) => Err(ApiError::BadRequest(
            "`eviction_policy` must be a string".into(),
        )),
    }
}

fn watermarks(e: &Engine, o: &Map<String, Value>) -> Result<Option<(usize, usize)>, ApiError> {
    let w = match o.get("watermarks") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Array(w)) if w.len() == 2 => (w[0].as_u64(), w[1].as_u64()),
        Some(_) => (None, None),
    };
    let (Some(low), Some(high)) = w else {
        return Err(ApiError::BadRequest(
            "`watermarks` must be [low, high] in free pages".into(),
        ));
    };
    if e.watermarks().is_none() {
        return Err(ApiError::BadRequest(
            "`watermarks`: the server was started without them (--watermarks)".into(),
        ));
    }
    let pages = e.config().pages_per_device as u64;
    if !(low < high && high < pages) {
        return Err(ApiError::BadRequest(format!(
            "`watermarks` need low < high < {pages} (the pages per device), not [{low}, {high}]"
        )));
    }
    Ok(Some((low as usize, high as usize)))
}

fn router(e: &Engine, o: &Map<String, Value>) -> Result<Option<RouterConfig>, ApiError> {
    let r = match o.get("router") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(r)) => r,
        Some(_) => return Err(ApiError::BadRequest("`router` must be an object".into())),
    };
    only(
        r,
        &[
            "kind",
            "balance_abs",
            "balance_rel",
            "copy_slack",
            "copy_slack_long",
        ],
        "router.",
    )?;
    let mut cfg = *e.router_config();
    match r.get("kind") {
        None | Some(Value::Null) => {}
        Some(Value::String(k)) if k == cfg.kind.name() => {}
        Some(k) => {
            return Err(ApiError::BadRequest(format!(
                "`router.kind` is fixed at start ({}), not {k}",
                cfg.kind.name()
            )))
        }
    }
    if let Some(x) = count(r, "balance_abs")? {
        cfg.balance_abs = x;
    }
    if let Some(x) = count(r, "copy_slack")? {
        cfg.copy_slack = x;
    }
    if let Some(x) = count(r, "copy_slack_long")? {
        cfg.copy_slack_long = x;
    }
    match r.get("balance_rel") {
        None | Some(Value::Null) => {}
        Some(v) => {
            cfg.balance_rel = v
                .as_f64()
                .filter(|x| (1.0..=1e6).contains(x))
                .ok_or_else(|| {
                    ApiError::BadRequest(
                        "`router.balance_rel` must be a number from 1 to 1e6".into(),
                    )
                })?
        }
    }
    Ok(Some(cfg))
}

/// Validates a whole body, then applies it; returns the settings now. A
/// body with any bad field changes nothing.
pub(crate) fn apply(e: &Engine, body: &[u8]) -> Result<Value, ApiError> {
    let o = object(body)?;
    only(&o, &["eviction_policy", "watermarks", "router"], "")?;
    let policy = eviction_policy(&o)?;
    let marks = watermarks(e, &o)?;
    let router = router(e, &o)?;
    let bad =
        |at: &str, err: radixkv_engine::EngineError| ApiError::BadRequest(format!("`{at}`: {err}"));
    // What can still be refused goes first (the watermarks against every
    // tier's pool, the host tier's too); the router's fields and the
    // policy, checked above, cannot fail.
    if let Some((low, high)) = marks {
        e.set_watermarks(low, high)
            .map_err(|err| bad("watermarks", err))?;
    }
    if let Some(cfg) = router {
        e.set_router_config(cfg).map_err(|err| bad("router", err))?;
    }
    if let Some(p) = policy {
        e.set_eviction_policy(p);
    }
    Ok(current(e))
}
