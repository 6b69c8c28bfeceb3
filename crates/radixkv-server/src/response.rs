//! [`json_response`]: a JSON body with its status, what every handler and
//! every [`ApiError`](crate::ApiError) answers with.

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};

/// A JSON response.
pub(crate) fn json_response<T: serde::Serialize>(status: StatusCode, body: &T) -> Response {
    match serde_json::to_vec(body) {
        Ok(v) => (status, [(header::CONTENT_TYPE, "application/json")], v).into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot serialize the response: {e}"),
        )
            .into_response(),
    }
}
