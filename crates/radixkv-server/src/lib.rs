//! `radixkv serve`: an HTTP front end (tokio + axum) over the [`Engine`].
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

mod admin;
pub mod api;
pub mod chat;
pub mod codec;
mod completions;
mod conn_io;
pub mod connections;
pub mod error;
pub mod metrics;
pub mod query;
mod stream;
pub mod tokenizer;
pub mod wire;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, StatusCode, Uri};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
pub use error::{ApiError, ServerError};
use metrics::{HttpStats, ServerStats};
use radixkv::{DeviceId, PagedCache};
use radixkv_engine::{Engine, EngineReport};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// The server's limits and settings; every field has a default.
#[derive(Clone, Debug, PartialEq)]
pub struct ServerConfig {
    /// Requests admitted at once (queued or running in the engine, or
    /// streaming); one more is answered 429 (default 256).
    pub max_queue: usize,
    /// Largest `max_tokens` accepted (default 4,096).
    pub max_tokens_limit: usize,
    /// `max_tokens` of a request without one (default 16, OpenAI's).
    pub default_max_tokens: usize,
    /// Largest request body in bytes (default 4 MiB).
    pub max_body_bytes: usize,
    /// How long a graceful shutdown waits for in-flight requests
    /// (default 30 s).
    pub drain_timeout: Duration,
    /// `Retry-After` of a 429, in seconds (default 1).
    pub retry_after_s: u64,
    /// The model name in responses and `/v1/models` (default `radixkv-sim`).
    pub model_name: String,
    /// With a key, `/v1/*`, `/query*` and `/admin/*` need
    /// `Authorization: Bearer <key>` (401 otherwise); `/health`, `/metrics`
    /// and `/stats` stay open (default none).
    pub api_key: Option<String>,
    /// Accept `/admin/*` from any address, not only loopback (default
    /// false).
    pub admin_from_anywhere: bool,
    /// Timeouts and the cap on open connections ([`connections`]).
    pub connections: connections::ConnectionLimits,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            max_queue: 256,
            max_tokens_limit: 4096,
            default_max_tokens: 16,
            max_body_bytes: 4 << 20,
            drain_timeout: Duration::from_secs(30),
            retry_after_s: 1,
            model_name: "radixkv-sim".into(),
            api_key: None,
            admin_from_anywhere: false,
            connections: connections::ConnectionLimits::default(),
        }
    }
}

/// What the handlers share.
#[derive(Debug)]
pub(crate) struct AppState {
    /// The engine, shared by every handler without a lock (`Engine` is
    /// `Sync`: its calls send messages to the schedulers and read atomics).
    engine: Engine,
    /// Each device's cache and its id there, for scans outside the lock.
    caches: Vec<(Arc<PagedCache>, DeviceId)>,
    cfg: ServerConfig,
    /// `cfg.connections.max_connections`, kept below the open-file limit.
    connection_cap: usize,
    admission: Arc<Semaphore>,
    stats: ServerStats,
    draining: AtomicBool,
    started: Instant,
    /// Unix seconds at start (`/v1/models`' `created`).
    started_unix: u64,
    /// The KV-event publisher, if the cache publishes (its counters go to
    /// /metrics).
    kv_events: std::sync::OnceLock<Arc<radixkv_events::KvEventPublisher>>,
    /// The model's text interface (the byte codec unless set).
    codec: std::sync::OnceLock<Arc<dyn codec::TextCodec>>,
}

impl AppState {
    /// How text becomes tokens and back.
    fn codec(&self) -> &dyn codec::TextCodec {
        match self.codec.get() {
            Some(c) => c.as_ref(),
            None => &codec::ByteCodec,
        }
    }

    fn engine(&self) -> &Engine {
        &self.engine
    }

    /// `/stats`, computed on a blocking thread.
    fn stats(&self) -> metrics::Stats {
        let m = self.engine().metrics();
        let host = self.engine().host_tier();
        let devices = metrics::device_stats(m, &self.caches);
        let mut s = metrics::stats(devices, host, self.http_stats(), || self.engine().audit());
        if let Some(why) = self.engine().failure() {
            s.audit_ok = false;
            s.audit_error = Some(format!("the engine failed: {why}"));
            s.engine_failure = Some(why.to_string());
        }
        s
    }

    /// `/metrics`, computed on a blocking thread.
    fn prometheus(&self) -> Result<String, std::fmt::Error> {
        let (m, host, latencies) = {
            let engine = self.engine();
            (
                engine.metrics(),
                engine.host_tier(),
                engine.latency_histograms(),
            )
        };
        let devices = metrics::device_stats(m, &self.caches);
        let events = self.kv_events.get().map(|p| p.stats());
        metrics::prometheus(devices, host, latencies, self.http_stats(), events)
    }

    fn in_flight(&self) -> usize {
        self.cfg
            .max_queue
            .saturating_sub(self.admission.available_permits())
    }

    fn http_stats(&self) -> HttpStats {
        HttpStats {
            in_flight: self.in_flight(),
            max_queue: self.cfg.max_queue,
            // Relaxed: statistics.
            rejected_busy: self.stats.rejected_busy.load(Ordering::Relaxed),
            disconnects: self.stats.disconnects.load(Ordering::Relaxed),
            responses: self.stats.responses(),
            uptime_s: self.started.elapsed().as_secs_f64(),
            draining: self.draining.load(Ordering::Relaxed),
            open_connections: self.stats.open_connections.load(Ordering::Relaxed),
            max_connections: self.connection_cap,
            shed_connections: self.stats.shed_connections.load(Ordering::Relaxed),
            send_timeouts: self.stats.send_timeouts.load(Ordering::Relaxed),
        }
    }
}

/// How a [`Server::run`] ended.
#[derive(Debug)]
pub struct ShutdownReport {
    /// Every in-flight request finished within the drain timeout.
    pub drained: bool,
    /// Requests still in flight when the drain timed out (they were
    /// stopped).
    pub abandoned: usize,
    /// The engine's report, when it could be shut down cleanly (every
    /// handler had let go of it).
    pub engine: Option<EngineReport>,
}

/// A bound, not yet running server.
pub struct Server {
    listener: TcpListener,
    state: Arc<AppState>,
    /// Ends a drain at once (a second Ctrl-C), as its timeout would.
    force: Option<std::pin::Pin<Box<dyn Future<Output = ()> + Send>>>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("listener", &self.listener)
            .field("force_stop", &self.force.is_some())
            .finish()
    }
}

impl Server {
    /// Binds `addr` (port 0: an ephemeral port) for `engine`.
    pub async fn bind(
        addr: SocketAddr,
        engine: Engine,
        cfg: ServerConfig,
    ) -> Result<Server, ServerError> {
        if cfg.max_queue == 0 || cfg.max_queue > Semaphore::MAX_PERMITS {
            return Err(ServerError::Config(format!(
                "max_queue must be between 1 and {}",
                Semaphore::MAX_PERMITS
            )));
        }
        if cfg.max_tokens_limit == 0 || cfg.default_max_tokens == 0 {
            return Err(ServerError::Config(
                "max_tokens_limit and default_max_tokens must be at least 1".into(),
            ));
        }
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| ServerError::Io {
                context: format!("cannot listen on {addr}"),
                source,
            })?;
        let devices = engine.config().devices;
        let caches = (0..devices)
            .filter_map(|d| engine.cache(d).map(|(c, dev)| (Arc::clone(c), dev)))
            .collect();
        let connection_cap = connections::effective_cap(
            cfg.connections.max_connections,
            connections::raise_open_file_limit(),
        );
        let state = Arc::new(AppState {
            engine,
            caches,
            connection_cap,
            admission: Arc::new(Semaphore::new(cfg.max_queue)),
            cfg,
            stats: ServerStats::new(),
            draining: AtomicBool::new(false),
            started: Instant::now(),
            started_unix: unix_now(),
            kv_events: std::sync::OnceLock::new(),
            codec: std::sync::OnceLock::new(),
        });
        Ok(Server {
            listener,
            state,
            force: None,
        })
    }

    /// Ends a drain at once when `force` completes (for instance a second
    /// signal: the second future of [`shutdown_signals`]), stopping the
    /// requests still in flight as the drain timeout would.
    pub fn with_force_stop(mut self, force: impl Future<Output = ()> + Send + 'static) -> Self {
        self.force = Some(Box::pin(force));
        self
    }

    /// Encodes prompts and decodes outputs with `codec` (a GGUF model's
    /// tokenizer and chat template) instead of the byte codec; its
    /// end-of-sequence token ends generation.
    pub fn with_codec(self, codec: Arc<dyn codec::TextCodec>) -> Self {
        let _ = self.state.codec.set(codec);
        self
    }

    /// Reports `publisher`'s counters in `/metrics` (the publisher whose
    /// listener the engine's caches were built with).
    pub fn with_kv_events(self, publisher: Arc<radixkv_events::KvEventPublisher>) -> Self {
        let _ = self.state.kv_events.set(publisher);
        self
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> Result<SocketAddr, ServerError> {
        self.listener
            .local_addr()
            .map_err(|source| ServerError::Io {
                context: "cannot read the listening address".into(),
                source,
            })
    }

    /// Serves until `shutdown` completes, then drains: stops accepting,
    /// waits up to the drain timeout for in-flight requests, stops the
    /// engine if they did not finish, and shuts the engine down.
    pub async fn run<F>(self, shutdown: F) -> Result<ShutdownReport, ServerError>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let state = self.state;
        let app = app(Arc::clone(&state));
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let mut serve = tokio::spawn(connections::serve(
            self.listener,
            app,
            Arc::clone(&state),
            stop_rx,
        ));
        let join_err = |e: tokio::task::JoinError| ServerError::Io {
            context: "the server task failed".into(),
            source: std::io::Error::other(e.to_string()),
        };
        tokio::select! {
            r = &mut serve => r.map_err(join_err)?,
            _ = shutdown => {}
        }
        // Relaxed: advisory (health and new completions answer 503).
        state.draining.store(true, Ordering::Relaxed);
        let _ = stop_tx.send(true);
        let force = self
            .force
            .unwrap_or_else(|| Box::pin(std::future::pending()));
        let finished = tokio::select! {
            r = tokio::time::timeout(state.cfg.drain_timeout, &mut serve) => r.ok(),
            _ = force => None,
        };
        let (drained, abandoned) = match finished {
            Some(r) => {
                r.map_err(join_err)?;
                (true, 0)
            }
            None => {
                let abandoned = state.in_flight();
                // Stragglers end as stopped (an error event, then the end of
                // their streams); their connections then close.
                state.engine().stop();
                if tokio::time::timeout(Duration::from_secs(2), &mut serve)
                    .await
                    .is_err()
                {
                    serve.abort();
                }
                (false, abandoned)
            }
        };
        // Connections still open (after a timed-out drain) hold the state
        // until their requests fail as stopped: wait a little for them.
        let deadline = Instant::now() + Duration::from_secs(2);
        while Arc::strong_count(&state) > 1 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let engine = Arc::try_unwrap(state).ok().map(|s| s.engine);
        let engine = match engine {
            Some(e) => tokio::task::spawn_blocking(move || e.shutdown()).await.ok(),
            None => None,
        };
        Ok(ShutdownReport {
            drained,
            abandoned,
            engine,
        })
    }
}

/// Two futures over one set of signal handlers: the first resolves on the
/// first SIGINT (Ctrl-C) or, on Unix, SIGTERM (a shutdown: give it to
/// [`Server::run`]); the second on the second such signal (give it to
/// [`Server::with_force_stop`]). The handlers are installed when this is
/// called (inside a tokio runtime), not when a future is first polled: a
/// signal that comes before (say, right after the server printed its
/// address, or a second one right after the first, before the drain
/// begins) is counted, not lost, and does not kill the process.
pub fn shutdown_signals() -> (
    impl Future<Output = ()> + Send + 'static,
    impl Future<Output = ()> + Send + 'static,
) {
    let (tx, rx) = tokio::sync::watch::channel(0u32);
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        // A source that could not be installed never fires.
        let mut int = signal(SignalKind::interrupt()).ok();
        let mut term = signal(SignalKind::terminate()).ok();
        tokio::spawn(async move {
            async fn next(s: &mut Option<tokio::signal::unix::Signal>) {
                match s {
                    Some(s) => {
                        if s.recv().await.is_none() {
                            std::future::pending::<()>().await;
                        }
                    }
                    None => std::future::pending::<()>().await,
                }
            }
            loop {
                tokio::select! {
                    _ = next(&mut int) => {}
                    _ = next(&mut term) => {}
                }
                tx.send_modify(|n| *n = n.saturating_add(1));
            }
        });
    }
    #[cfg(not(unix))]
    tokio::spawn(async move {
        while tokio::signal::ctrl_c().await.is_ok() {
            tx.send_modify(|n| *n = n.saturating_add(1));
        }
    });
    let nth = move |n: u32| {
        let mut rx = rx.clone();
        async move {
            if rx.wait_for(|&seen| seen >= n).await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    };
    (nth(1), nth(2))
}

fn app(state: Arc<AppState>) -> Router {
    let limit = state.cfg.max_body_bytes;
    Router::new()
        .route("/v1/completions", post(completions::completions))
        .route("/v1/chat/completions", post(completions::chat_completions))
        .route("/v1/models", get(models))
        .route("/v1/models/{id}", get(model))
        .route("/query", post(query))
        .route("/query_by_hash", post(query_by_hash))
        .route("/admin/config", get(admin_config).post(admin_set_config))
        .route("/metrics", get(prometheus))
        .route("/stats", get(stats))
        .route("/health", get(health))
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

async fn health(State(s): State<Arc<AppState>>) -> Response {
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

async fn stats(State(s): State<Arc<AppState>>) -> Response {
    let st = Arc::clone(&s);
    match tokio::task::spawn_blocking(move || st.stats()).await {
        Ok(v) => json_response(StatusCode::OK, &v),
        Err(e) => ApiError::Internal(format!("stats failed: {e}")).into_response(),
    }
}

async fn prometheus(State(s): State<Arc<AppState>>) -> Response {
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

/// `/v1/models`: the one model served.
async fn models(State(s): State<Arc<AppState>>) -> Response {
    json_response(
        StatusCode::OK,
        &serde_json::json!({"object": "list", "data": [model_card(&s)]}),
    )
}

/// `/v1/models/{id}`.
async fn model(
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
async fn query(
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
async fn query_by_hash(
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
async fn admin_config(
    State(s): State<Arc<AppState>>,
    axum::extract::ConnectInfo(peer): axum::extract::ConnectInfo<SocketAddr>,
) -> Result<Response, ApiError> {
    admin_allowed(&s, peer)?;
    let v = admin::current(s.engine());
    Ok(json_response(StatusCode::OK, &v))
}

/// `POST /admin/config`: changes run-time settings (see [`admin`]).
async fn admin_set_config(
    State(s): State<Arc<AppState>>,
    axum::extract::ConnectInfo(peer): axum::extract::ConnectInfo<SocketAddr>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    admin_allowed(&s, peer)?;
    let body = body_or_error(&s, body)?;
    let v = admin::apply(s.engine(), &body)?;
    Ok(json_response(StatusCode::OK, &v))
}
