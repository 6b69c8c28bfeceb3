//! The router: every route, the middleware (the API key, response
//! counting) and the JSON 404 and 405.

use crate::completions;
use crate::error::ApiError;
use crate::handlers;
use crate::state::AppState;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, Uri};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use std::sync::Arc;

pub(crate) fn app(state: Arc<AppState>) -> Router {
    let limit = state.cfg.max_body_bytes;
    Router::new()
        .route("/v1/completions", post(completions::completions))
        .route("/v1/chat/completions", post(completions::chat_completions))
        .route("/v1/models", get(handlers::models))
        .route("/v1/models/{id}", get(handlers::model))
        .route("/query", post(handlers::query))
        .route("/query_by_hash", post(handlers::query_by_hash))
        .route(
            "/admin/config",
            get(handlers::admin_config).post(handlers::admin_set_config),
        )
        .route("/metrics", get(handlers::prometheus))
        .route("/stats", get(handlers::stats))
        .route("/health", get(handlers::health))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(limit))
        .layer(middleware::from_fn_with_state(
            Arc::clone(&state),
            authorize,
        ))
        .layer(middleware::from_fn_with_state(
            Arc::clone(&state),
            count_responses,
        ))
        .with_state(state)
}

async fn count_responses(State(s): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let r = next.run(req).await;
    s.stats.response(r.status().as_u16());
    r
}

/// With an API key: `/v1/*`, `/query*` and `/admin/*` need OpenAI's
/// `Authorization: Bearer <key>`.
async fn authorize(State(s): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let Some(key) = &s.cfg.api_key else {
        return next.run(req).await;
    };
    let path = req.uri().path();
    let guarded =
        path.starts_with("/v1/") || path.starts_with("/query") || path.starts_with("/admin");
    if !guarded {
        return next.run(req).await;
    }
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            // The scheme is case-insensitive (RFC 9110 §11.1).
            let (scheme, key) = v.split_once(' ')?;
            scheme
                .eq_ignore_ascii_case("bearer")
                .then(|| key.trim_start())
        });
    // Compared in constant time: the key must not leak through timing.
    let ok = given.is_some_and(|g| {
        g.len() == key.len()
            && g.bytes()
                .zip(key.bytes())
                .fold(0u8, |a, (x, y)| a | (x ^ y))
                == 0
    });
    if ok {
        next.run(req).await
    } else {
        ApiError::Unauthorized(if given.is_some() {
            "Incorrect API key provided.".into()
        } else {
            "Missing API key: send `Authorization: Bearer <key>`.".into()
        })
        .into_response()
    }
}

async fn not_found(uri: Uri) -> ApiError {
    ApiError::NotFound(uri.path().to_string())
}

async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}
