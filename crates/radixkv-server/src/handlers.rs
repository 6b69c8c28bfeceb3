//! The small handlers (`/health`, `/stats`, `/metrics`, `/v1/models`,
//! `/query`, `/admin/config`) and the helpers every handler uses (request
//! bodies, the clock).

use crate::admin;
use crate::error::ApiError;
use crate::metrics;
use crate::query;
use crate::response::json_response;
use crate::state::AppState;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

pub(crate) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The body of a request, or the API error for it.
pub(crate) fn body_or_error(
    s: &AppState,
    body: Result<Bytes, BytesRejection>,
) -> Result<Bytes, ApiError> {
    body.map_err(|r| {
        if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::PayloadTooLarge {
                limit: s.cfg.max_body_bytes,
            }
        } else {
            ApiError::BadRequest(r.body_text())
        }
    })
}

pub(crate) async fn health(State(s): State<Arc<AppState>>) -> Response {
    if let Some(why) = s.engine().failure() {
        json_response(
            StatusCode::SERVICE_UNAVAILABLE,
            &serde_json::json!({"status": "failed", "reason": why}),
        )
    } else if s.draining.load(Ordering::Relaxed) {
        json_response(
            StatusCode::SERVICE_UNAVAILABLE,
            &serde_json::json!({"status": "draining"}),
        )
    } else {
        json_response(StatusCode::OK, &serde_json::json!({"status": "ok"}))
    }
}

pub(crate) async fn stats(State(s): State<Arc<AppState>>) -> Response {
    let st = Arc::clone(&s);
    match tokio::task::spawn_blocking(move || st.stats()).await {
        Ok(v) => json_response(StatusCode::OK, &v),
        Err(e) => ApiError::Internal(format!("stats failed: {e}")).into_response(),
    }
}

pub(crate) async fn prometheus(State(s): State<Arc<AppState>>) -> Response {
    let st = Arc::clone(&s);
    let text = tokio::task::spawn_blocking(move || st.prometheus()).await;
    match text {
        Ok(Ok(t)) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, metrics::CONTENT_TYPE)],
            t,
        )
            .into_response(),
        Ok(Err(e)) => ApiError::Internal(format!("cannot encode the metrics: {e}")).into_response(),
        Err(e) => ApiError::Internal(format!("metrics failed: {e}")).into_response(),
    }
}

/// `/v1/models`: the one model served.
pub(crate) async fn models(State(s): State<Arc<AppState>>) -> Response {
    json_response(
        StatusCode::OK,
        &serde_json::json!({"object": "list", "data": [model_card(&s)]}),
    )
}

/// `/v1/models/{id}`.
pub(crate) async fn model(
    State(s): State<Arc<AppState>>,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> Result<Response, ApiError> {
    if id != s.cfg.model_name {
        return Err(ApiError::NotFound(format!("model {id}")));
    }
    Ok(json_response(StatusCode::OK, &model_card(&s)))
}

fn model_card(s: &AppState) -> serde_json::Value {
    serde_json::json!({
        "id": s.cfg.model_name,
        "object": "model",
        "created": s.started_unix,
        "owned_by": "radixkv",
    })
}

/// `/query` (see [`query`]).
pub(crate) async fn query(
    State(s): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body_or_error(&s, body)?;
    let q = query::Query::parse(&body, s.codec())?;
    let v = query::answer(&s.caches, &q.tokens, q.namespace.as_deref());
    Ok(json_response(StatusCode::OK, &v))
}

/// `/query_by_hash` (see [`query`]): block ids resolved through the KV-event
/// publisher's index.
pub(crate) async fn query_by_hash(
    State(s): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body_or_error(&s, body)?;
    let (ids, namespace) = query::parse_by_hash(&body)?;
    let resolved = s.kv_events.get().and_then(|p| p.resolve(&ids)).ok_or_else(|| {
        ApiError::BadRequest(
            "`/query_by_hash` needs the KV-event publisher's block index: start the server with --kv-events".into(),
        )
    })?;
    let (ns, mut tokens) = resolved;
    // The ids name their namespace; one the body names as well must be
    // theirs, or none of the chain is in it.
    if namespace.is_some() && namespace.as_deref() != ns.as_deref() {
        tokens.clear();
    }
    let v = query::answer(&s.caches, &tokens, ns.as_deref());
    Ok(json_response(StatusCode::OK, &v))
}

/// `/admin/*` from loopback only, unless configured otherwise.
fn admin_allowed(s: &AppState, peer: SocketAddr) -> Result<(), ApiError> {
    // `to_canonical`: an IPv4 client of a dual-stack (`::`) socket is
    // `::ffff:127.0.0.1`, loopback too.
    if s.cfg.admin_from_anywhere || peer.ip().to_canonical().is_loopback() {
        Ok(())
    } else {
        Err(ApiError::Forbidden(format!(
            "/admin is for loopback clients only (this one is {}); start the server with --admin-from-anywhere to allow it",
            peer.ip()
        )))
    }
}

/// `GET /admin/config`: the run-time settings now.
pub(crate) async fn admin_config(
    State(s): State<Arc<AppState>>,
    axum::extract::ConnectInfo(peer): axum::extract::ConnectInfo<SocketAddr>,
) -> Result<Response, ApiError> {
    admin_allowed(&s, peer)?;
    let v = admin::current(s.engine());
    Ok(json_response(StatusCode::OK, &v))
}

/// `POST /admin/config`: changes run-time settings (see [`admin`]).
pub(crate) async fn admin_set_config(
    State(s): State<Arc<AppState>>,
    axum::extract::ConnectInfo(peer): axum::extract::ConnectInfo<SocketAddr>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    admin_allowed(&s, peer)?;
    let body = body_or_error(&s, body)?;
    let v = admin::apply(s.engine(), &body)?;
    Ok(json_response(StatusCode::OK, &v))
}
