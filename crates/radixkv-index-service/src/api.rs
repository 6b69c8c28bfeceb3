//! The HTTP routes: Dynamo's standalone indexer's, with its request and
//! answer shapes, and the Mooncake RFC's `/query` form.
//!
//! | route | body / query | answer |
//! | --- | --- | --- |
//! | `POST /register` | `{instance_id, endpoint, model_name, block_size, dp_rank?, routing_group?, replay_endpoint?}` | 201 `{"status":"ok"}`; 409 a duplicate or another block size; 400 a bad endpoint |
//! | `POST /unregister` | `{instance_id, model_name, routing_group?, dp_rank?}` (no group: every group) | 200 `{"status":"ok"}`; 404 nothing registered |
//! | `GET /workers` | `?model_name=&routing_group=` | `[{instance_id, source, status, model_name, routing_group, block_size, endpoints, listeners}]` |
//! | `POST /query` | `{token_ids, model_name, routing_group?, lora_name?, cache_salt?}` | [`crate::answer::DynamoAnswer`]; 404 an unknown partition |
//! | `POST /query` | `{token_ids, model, lora_name?, cache_salt?}` | [`crate::answer::MooncakeAnswer`] (routing group `default`) |
//! | `POST /query_by_hash` | `{block_hashes, model_name, routing_group?}` (Dynamo's per-block hashes, signed or not) | [`crate::answer::DynamoAnswer`]; 400 with a `cache_salt` |
//! | `GET /health` | | 200 `{"status":"ready"}` once every registered worker is subscribed, else 503 `{"status":"starting"}` |
//! | `GET /metrics` | | OpenMetrics ([`crate::metrics`]) |
//!
//! A body that is not JSON is a 400, one missing a field or with a field
//! of the wrong type (a token id past `u32`) a 422, as axum's extractor
//! (and so Dynamo's) answers; errors carry `{"error": "…"}`.

use crate::answer;
use crate::metrics::{self, QueryLatency, RouteLabels};
use crate::registry::{PartitionKey, Registration, Registry, RegistryError};
use axum::extract::{FromRequest, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use prometheus_client::metrics::histogram::Histogram;
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

/// What the handlers share.
#[derive(Clone, Debug)]
pub struct AppState {
    /// The workers and their trees.
    pub registry: Arc<Registry>,
    /// The query latency histogram.
    pub latency: QueryLatency,
    /// Its series of `/query`, looked up once (the family's lookup takes
    /// its lock).
    query_latency: Histogram,
    /// Its series of `/query_by_hash`, likewise.
    by_hash_latency: Histogram,
}

impl AppState {
    /// State over `registry`.
    pub fn new(registry: Arc<Registry>) -> AppState {
        let latency = metrics::query_latency();
        let route = |route| latency.get_or_create(&RouteLabels { route }).clone();
        AppState {
            registry,
            query_latency: route("query"),
            by_hash_latency: route("query_by_hash"),
            latency,
        }
    }
}

fn default_group() -> String {
    "default".to_string()
}

fn error(status: StatusCode, msg: impl std::fmt::Display) -> Response {
    (status, Json(json!({"error": msg.to_string()}))).into_response()
}

/// A JSON body, parsed with serde_json directly (axum's `Json` tracks
/// the path of every element it parses, which on a prompt's thousands of
/// token ids is most of a query's time), a query's token ids by
/// [`crate::token_ids`]. Refused as axum's `Json` refuses: 415 without a
/// JSON `Content-Type`, 400 for malformed JSON, 422 for JSON of the wrong
/// shape, the reason as `{"error": …}`.
struct Body<T>(T);

/// How a request's body is read: serde_json, unless the shape has a
/// reader of its own.
trait ReadBody: Sized {
    /// `bytes` read, or serde_json's error.
    fn read(bytes: &[u8]) -> serde_json::Result<Self>;
}

/// Whether `content_type` names JSON (`application/json`, or an
/// `application/…+json` type), parameters aside.
fn is_json(content_type: &str) -> bool {
    let essence = content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    essence == "application/json"
        || essence
            .strip_prefix("application/")
            .is_some_and(|sub| sub.ends_with("+json"))
}

impl<T, S> FromRequest<S> for Body<T>
where
    T: ReadBody,
    S: Send + Sync,
{
    type Rejection = Response;

    async fn from_request(req: axum::extract::Request, state: &S) -> Result<Self, Response> {
        let json = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(is_json);
        if !json {
            return Err(error(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "Expected request with `Content-Type: application/json`",
            ));
        }
        let bytes = axum::body::Bytes::from_request(req, state)
            .await
            .map_err(IntoResponse::into_response)?;
        T::read(&bytes).map(Body).map_err(|e| {
            let status = match e.classify() {
                serde_json::error::Category::Data => StatusCode::UNPROCESSABLE_ENTITY,
                _ => StatusCode::BAD_REQUEST,
            };
            error(status, format!("Failed to parse the JSON body: {e}"))
        })
    }
}

#[derive(Deserialize)]
struct RegisterRequest {
    instance_id: u64,
    endpoint: String,
    model_name: String,
    block_size: usize,
    #[serde(default)]
    dp_rank: Option<u32>,
    #[serde(default = "default_group")]
    routing_group: String,
    #[serde(default)]
    replay_endpoint: Option<String>,
}

/// The shapes serde_json reads whole.
macro_rules! read_by_serde {
    ($($shape:ty),*) => {$(
        impl ReadBody for $shape {
            fn read(bytes: &[u8]) -> serde_json::Result<Self> {
                serde_json::from_slice(bytes)
            }
        }
    )*};
}
read_by_serde!(RegisterRequest, UnregisterRequest, QueryByHashRequest);

async fn register(State(s): State<AppState>, Body(r): Body<RegisterRequest>) -> Response {
    let reg = Registration {
        instance_id: r.instance_id,
        dp_rank: r.dp_rank.unwrap_or(0),
        endpoint: r.endpoint,
        replay_endpoint: r.replay_endpoint,
        partition: PartitionKey {
            model_name: r.model_name,
            routing_group: r.routing_group,
        },
        block_size: r.block_size,
    };
    match s.registry.register(reg) {
        Ok(()) => (StatusCode::CREATED, Json(json!({"status": "ok"}))).into_response(),
        Err(
            e @ (RegistryError::BadEndpoint(_)
            | RegistryError::ZeroBlockSize
            | RegistryError::Index(..)),
        ) => error(StatusCode::BAD_REQUEST, e),
        Err(e) => error(StatusCode::CONFLICT, e),
    }
}

#[derive(Deserialize)]
struct UnregisterRequest {
    instance_id: u64,
    model_name: String,
    #[serde(default)]
    routing_group: Option<String>,
    #[serde(default)]
    dp_rank: Option<u32>,
}

async fn unregister(State(s): State<AppState>, Body(r): Body<UnregisterRequest>) -> Response {
    match s
        .registry
        .unregister(
            r.instance_id,
            &r.model_name,
            r.routing_group.as_deref(),
            r.dp_rank,
        )
        .await
    {
        Ok(_) => (StatusCode::OK, Json(json!({"status": "ok"}))).into_response(),
        Err(e) => error(StatusCode::NOT_FOUND, e),
    }
}

#[derive(Deserialize)]
struct WorkersFilter {
    model_name: Option<String>,
    routing_group: Option<String>,
}

async fn workers(State(s): State<AppState>, Query(f): Query<WorkersFilter>) -> Response {
    // One entry per (worker, partition), its ranks gathered.
    let mut out: BTreeMap<(String, String, u64), Value> = BTreeMap::new();
    for w in s
        .registry
        .workers(f.model_name.as_deref(), f.routing_group.as_deref())
    {
        let r = &w.registration;
        let key = (
            r.partition.model_name.clone(),
            r.partition.routing_group.clone(),
            r.instance_id,
        );
        // Relaxed: status flags.
        let subscribed = w.counters.subscribed.load(Ordering::Relaxed);
        let stale = w.counters.stale.load(Ordering::Relaxed);
        let status = if subscribed { "active" } else { "pending" };
        let e = out.entry(key).or_insert_with(|| {
            json!({
                "instance_id": r.instance_id,
                "source": "zmq",
                "status": status,
                "model_name": r.partition.model_name,
                "routing_group": r.partition.routing_group,
                "block_size": r.block_size,
                "endpoints": {},
                "listeners": {},
            })
        });
        if !subscribed {
            e["status"] = json!("pending");
        }
        let rank = r.dp_rank.to_string();
        e["endpoints"][&rank] = json!(r.endpoint);
        e["listeners"][&rank] = json!({
            "endpoint": r.endpoint,
            "replay_endpoint": r.replay_endpoint,
            "status": status,
            "stale": stale,
            "silent": w.silent,
            "blocks": w.blocks,
        });
    }
    Json(Value::Array(out.into_values().collect())).into_response()
}

#[derive(Deserialize)]
struct QueryRequest {
    token_ids: Vec<u32>,
    #[serde(default)]
    model_name: Option<String>,
    /// The Mooncake RFC's name for it (its answer's shape too).
    #[serde(default)]
    model: Option<String>,
    #[serde(default = "default_group")]
    routing_group: String,
    #[serde(default)]
    lora_name: Option<String>,
    #[serde(default)]
    cache_salt: Option<String>,
}

impl ReadBody for QueryRequest {
    fn read(bytes: &[u8]) -> serde_json::Result<Self> {
        crate::token_ids::read(bytes, |q: &mut QueryRequest| &mut q.token_ids)
    }
}

/// A 200 with `body`, JSON written beforehand.
fn json_bytes(body: Vec<u8>) -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        axum::body::Body::from(body),
    )
        .into_response()
}

fn unknown_partition(k: &PartitionKey) -> Response {
    error(
        StatusCode::NOT_FOUND,
        format!(
            "no indexer for model={} routing_group={}",
            k.model_name, k.routing_group
        ),
    )
}

async fn query(State(s): State<AppState>, Body(q): Body<QueryRequest>) -> Response {
    let t = Instant::now();
    let (model, mooncake) = match (q.model_name, q.model) {
        (Some(m), _) => (m, false),
        (None, Some(m)) => (m, true),
        (None, None) => {
            return error(
                StatusCode::UNPROCESSABLE_ENTITY,
                "missing field `model_name` (or the Mooncake RFC's `model`)",
            )
        }
    };
    let key = PartitionKey {
        model_name: model,
        routing_group: q.routing_group,
    };
    let Some(part) = s.registry.partition(&key) else {
        return unknown_partition(&key);
    };
    let ns = radixkv::TokenKey::namespace_for(q.lora_name.as_deref(), q.cache_salt.as_deref());
    let scores = part.index.scores(&q.token_ids, ns.as_deref());
    let scored = |src| s.registry.scored(&part, src);
    let resp = if mooncake {
        Json(answer::mooncake(&scores, scored)).into_response()
    } else {
        json_bytes(answer::dynamo_json(&scores, part.block_size, scored))
    };
    s.query_latency.observe(t.elapsed().as_secs_f64());
    resp
}

/// A block hash as Dynamo's clients send it: an `i64` (its `u64` bits), or
/// a `u64`.
#[derive(Deserialize)]
#[serde(untagged)]
enum WireHash {
    Signed(i64),
    Unsigned(u64),
}

#[derive(Deserialize)]
struct QueryByHashRequest {
    block_hashes: Vec<WireHash>,
    model_name: String,
    #[serde(default = "default_group")]
    routing_group: String,
    #[serde(default)]
    cache_salt: Option<String>,
}

async fn query_by_hash(State(s): State<AppState>, Body(q): Body<QueryByHashRequest>) -> Response {
    let t = Instant::now();
    if q.cache_salt.is_some() {
        return error(
            StatusCode::BAD_REQUEST,
            "cache_salt is not accepted by /query_by_hash: the block hashes carry their salt",
        );
    }
    let key = PartitionKey {
        model_name: q.model_name,
        routing_group: q.routing_group,
    };
    let Some(part) = s.registry.partition(&key) else {
        return unknown_partition(&key);
    };
    let hashes: Vec<u64> = q
        .block_hashes
        .iter()
        .map(|h| match *h {
            WireHash::Signed(i) => i as u64,
            WireHash::Unsigned(u) => u,
        })
        .collect();
    let scores = part.index.scores_by_hash(&hashes);
    let resp = json_bytes(answer::dynamo_json(&scores, part.block_size, |src| {
        s.registry.scored(&part, src)
    }));
    s.by_hash_latency.observe(t.elapsed().as_secs_f64());
    resp
}

async fn health(State(s): State<AppState>) -> Response {
    if s.registry.all_subscribed() {
        (StatusCode::OK, Json(json!({"status": "ready"}))).into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "starting"})),
        )
            .into_response()
    }
}

async fn metrics_text(State(s): State<AppState>) -> Response {
    match metrics::render(&s.registry, &s.latency) {
        Ok(text) => ([(header::CONTENT_TYPE, metrics::CONTENT_TYPE)], text).into_response(),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e),
    }
}

/// The routes over `state`.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/register", post(register))
        .route("/unregister", post(unregister))
        .route("/workers", get(workers))
        .route("/query", post(query))
        .route("/query_by_hash", post(query_by_hash))
        .route("/health", get(health))
        .route("/metrics", get(metrics_text))
        .with_state(state)
}
