//! Errors: what the HTTP API answers ([`ApiError`], an OpenAI-style JSON
//! error body) and what starting or running the server can fail with
//! ([`ServerError`]).

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use radixkv_engine::RequestError;

/// An error answered to a client, as
/// `{"error": {"message", "type", "code"}}` with the matching status.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// 400: malformed JSON, wrong types, out-of-range values, a prompt that
    /// cannot fit a device's pool.
    #[error("{0}")]
    BadRequest(String),
    /// 401: a missing or wrong API key (`--api-key`).
    #[error("{0}")]
    Unauthorized(String),
    /// 403: an address that may not use this route (`/admin` from a
    /// remote client).
    #[error("{0}")]
    Forbidden(String),
    /// 404: unknown path.
    #[error("no route for {0}")]
    NotFound(String),
    /// 404: a `model` this server does not serve (OpenAI's
    /// `model_not_found`).
    #[error("the model `{0}` does not exist (this server serves `{1}`)")]
    ModelNotFound(String, String),
    /// 405: known path, wrong method.
    #[error("method not allowed")]
    MethodNotAllowed,
    /// 408: the request body did not arrive within the body-read timeout
    /// (seconds).
    #[error("the request body did not arrive within {0} s")]
    RequestTimeout(f64),
    /// 414: the request line's target is longer than the server reads
    /// (answered for hyper, which refuses it before any handler runs).
    #[error("the request target (URI) is too long")]
    UriTooLong,
    /// 431: the request head is larger than the server reads (answered for
    /// hyper, as above).
    #[error("the request header fields are too large")]
    HeadersTooLarge,
    /// 413: the body is larger than the server accepts.
    #[error("request body too large (limit {limit} bytes)")]
    PayloadTooLarge {
        /// The limit in bytes.
        limit: usize,
    },
    /// 429: the admission queue is full; retry after the given seconds.
    #[error("server busy: {in_flight} requests in flight (limit {limit}); retry later")]
    Busy {
        /// Requests admitted and not finished.
        in_flight: usize,
        /// The admission queue's capacity.
        limit: usize,
        /// Seconds for `Retry-After`.
        retry_after_s: u64,
    },
    /// 503: the server is shutting down or the engine stopped.
    #[error("{0}")]
    Unavailable(String),
    /// 500: the engine failed the request.
    #[error("{0}")]
    Internal(String),
}

impl ApiError {
    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
            ApiError::NotFound(_) | ApiError::ModelNotFound(..) => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::RequestTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            ApiError::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::UriTooLong => StatusCode::URI_TOO_LONG,
            ApiError::HeadersTooLarge => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            ApiError::Busy { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// OpenAI's `error.type`.
    pub fn kind(&self) -> &'static str {
        match self {
            ApiError::BadRequest(_)
            | ApiError::RequestTimeout(_)
            | ApiError::PayloadTooLarge { .. }
            | ApiError::UriTooLong
            | ApiError::HeadersTooLarge
            | ApiError::Unauthorized(_) => "invalid_request_error",
            ApiError::NotFound(_) => "not_found_error",
            ApiError::MethodNotAllowed | ApiError::ModelNotFound(..) => "invalid_request_error",
            ApiError::Forbidden(_) => "permission_error",
            ApiError::Busy { .. } => "rate_limit_error",
            ApiError::Unavailable(_) | ApiError::Internal(_) => "server_error",
        }
    }

    /// The JSON body (OpenAI's shape; a 401's `code` is
    /// `invalid_api_key`, as OpenAI's).
    pub fn body(&self) -> serde_json::Value {
        let code = match self {
            ApiError::Unauthorized(_) => serde_json::json!("invalid_api_key"),
            ApiError::ModelNotFound(..) => serde_json::json!("model_not_found"),
            _ => serde_json::json!(self.status().as_u16()),
        };
        serde_json::json!({
            "error": {
                "message": self.to_string(),
                "type": self.kind(),
                "param": null,
                "code": code,
            }
        })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = crate::response::json_response(self.status(), &self.body());
        if let ApiError::Busy { retry_after_s, .. } = self {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(retry_after_s));
        }
        r
    }
}

impl ApiError {
    /// The error for a completion that failed, `None` if it finished.
    pub fn of_completion(c: &radixkv_engine::Completion) -> Option<ApiError> {
        c.error.as_ref().map(ApiError::from)
    }
}

impl From<&RequestError> for ApiError {
    /// A request the engine ended without finishing: 503 when it was
    /// cancelled or the engine stopped (a retry elsewhere may succeed),
    /// 500 when the cache, the model or its device's scheduler failed.
    fn from(e: &RequestError) -> Self {
        match e {
            RequestError::Cancelled | RequestError::Stopped => {
                ApiError::Unavailable(format!("request {e}"))
            }
            RequestError::Cache(_)
            | RequestError::Backend(_)
            | RequestError::SchedulerFailed(_) => {
                ApiError::Internal(format!("request failed: {e}"))
            }
        }
    }
}

/// Why the server could not start or run.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// Binding or serving the socket failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A bad server setting.
    #[error("invalid server configuration: {0}")]
    Config(String),
}

#[cfg(test)]
mod tests {
    use super::*;
    use radixkv::DeviceId;
    use radixkv_engine::sched::batch::BackendError;

    #[test]
    fn request_errors_map_to_openai_shapes() {
        let stopped = ApiError::from(&RequestError::Stopped);
        assert_eq!(stopped.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(stopped.body()["error"]["message"], "request stopped");
        assert_eq!(stopped.body()["error"]["type"], "server_error");
        let cancelled = ApiError::from(&RequestError::Cancelled);
        assert_eq!(cancelled.status(), StatusCode::SERVICE_UNAVAILABLE);

        let backend = ApiError::from(&RequestError::Backend(BackendError {
            device: DeviceId(1),
            reason: "out of memory".into(),
        }));
        assert_eq!(backend.status(), StatusCode::INTERNAL_SERVER_ERROR);
        let body = backend.body();
        assert_eq!(body["error"]["type"], "server_error");
        assert_eq!(body["error"]["code"], 500);
        let msg = body["error"]["message"].as_str().unwrap();
        assert!(
            msg.starts_with("request failed: ") && msg.contains("out of memory"),
            "{msg}"
        );

        let cache = ApiError::from(&RequestError::Cache(
            radixkv::cache::CacheError::ForeignHandle,
        ));
        assert_eq!(cache.status(), StatusCode::INTERNAL_SERVER_ERROR);
    }
}
