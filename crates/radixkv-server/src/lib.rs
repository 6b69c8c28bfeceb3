//! `radixkv serve`: an HTTP front end (tokio + axum) over the [`Engine`](radixkv_engine::Engine).
//!
//! Routes:
//!
//! * `POST /v1/completions`: an OpenAI-style subset ([`api`]): `prompt` (a
//!   string, tokenized by the model's [`codec`]: byte-level for the
//!   simulated and tiny models, a GGUF model's own tokenizer; or an array
//!   of token ids), `max_tokens`
//!   (default 16, at most [`ServerConfig::max_tokens_limit`]), `stream`
//!   (server-sent events, one per token, then `data: [DONE]`),
//!   `stream_options.include_usage`, `cache_salt` (a cache namespace),
//!   `stop`, `temperature`, `top_p`, `seed`; generation also stops at the
//!   model's end-of-sequence token.
//!   `usage` has `prompt_tokens`, `completion_tokens`, `total_tokens`,
//!   `cached_tokens` and `prompt_tokens_details.cached_tokens`.
//! * `POST /v1/chat/completions`: the same over `messages`, rendered by the
//!   chat template ([`chat`]); `GET /v1/models` and `/v1/models/{id}`.
//! * `POST /query` and `/query_by_hash`: each device's cached prefix of a
//!   prompt, by tokens or by KV-event block hashes ([`query`]), for routers.
//! * `GET /admin/config` and `POST /admin/config`: the run-time settings
//!   (router, copies, eviction), loopback clients only unless configured.
//! * `GET /metrics`: Prometheus metrics in the OpenMetrics text format
//!   ([`metrics::prometheus`], encoded by `prometheus-client`).
//! * `GET /stats`: the same figures as JSON plus `audit_ok`
//!   ([`metrics::Stats`]).
//! * `GET /health`: `{"status": "ok"}` (503 `draining` during shutdown,
//!   503 `failed` with a `reason` once a scheduler thread failed).
//!
//! Errors are JSON (`{"error": {"message", "type", "code"}}`): 400 for bad
//! input, 404 for unknown paths, 405 for a wrong method, 413 for a body
//! over [`ServerConfig::max_body_bytes`], 429 with `Retry-After` when
//! [`ServerConfig::max_queue`] requests are already in flight, 503 while
//! shutting down. hyper's own refusals of a request head (400, 414, 431)
//! carry the same JSON body (`conn_io.rs` replaces hyper's empty one).
//!
//! Connections are bounded ([`connections`]: header-read, body-read, idle
//! and send timeouts, a cap below the open-file limit with health slots
//! beyond it for `/health` and `/metrics`, an early 413). A client that
//! disconnects, or stops reading its response past the send timeout,
//! cancels its request: the engine releases its pages and pins; a stop
//! sequence ends the request's generation in the engine.
//! [`Server::run`] drains on its shutdown signal: in-flight requests finish
//! for up to [`ServerConfig::drain_timeout`] (or until
//! [`Server::with_force_stop`] fires) while `/health` and new completions
//! answer 503, then it stops the engine. [`shutdown_signals`] gives both
//! futures from one set of signal handlers, installed at once, so that no
//! second signal is missed.
//!
//! | file | what it holds |
//! | --- | --- |
//! | `config.rs` | [`ServerConfig`] |
//! | `lifecycle.rs` | [`Server`]: bind, run, drain; [`shutdown_signals`] |
//! | `state.rs` | what the handlers share |
//! | `routes.rs` | the routes and the middleware (API key, response counts) |
//! | `handlers.rs` | the small handlers and the helpers every handler uses |
//! | `response.rs` | JSON responses |
//! | `completions.rs`, `stream.rs` | the completions handlers, streamed or not |
//! | [`api`], [`chat`], [`query`], [`wire`] | request parsing and response shapes |
//! | [`codec`] | text to tokens and back: the byte codec, a GGUF model's |
//! | [`connections`], `conn_io.rs` | bounded connections and their timeouts |
//! | `admin.rs` | `/admin/config` |
//! | [`metrics`] | Prometheus and `/stats` |
//! | [`error`] | [`ApiError`] (JSON errors) and [`ServerError`] |

mod admin;
pub mod api;
pub mod chat;
pub mod codec;
mod completions;
mod config;
mod conn_io;
pub mod connections;
pub mod error;
mod handlers;
mod lifecycle;
pub mod metrics;
pub mod query;
mod response;
mod routes;
mod state;
mod stream;
pub mod wire;

pub use config::{ConnectionLimits, ServerConfig};
pub use error::{ApiError, ServerError};
pub use lifecycle::{shutdown_signals, Server, ShutdownReport};
