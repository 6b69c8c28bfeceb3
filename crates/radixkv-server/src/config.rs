//! [`ServerConfig`]: the server's limits and settings, each with a default.

use std::time::Duration;

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
    /// Timeouts and the cap on open connections ([`connections`](crate::connections)).
    pub connections: ConnectionLimits,
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
            connections: ConnectionLimits::default(),
        }
    }
}

/// The connection limits of a server (part of [`ServerConfig`];
/// [`connections`](crate::connections) enforces them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// How long a client may take to send a request head (default 10 s).
    pub header_read_timeout: Duration,
    /// How long a client may take to send a request body once its head is
    /// read (default 30 s); then 408.
    pub body_read_timeout: Duration,
    /// How long a connection may stay open with no request (default 60 s).
    pub idle_timeout: Duration,
    /// Connections open at once (default 4,096); the server keeps it below
    /// the process's open-file limit less [`RESERVED_FILES`](crate::connections::RESERVED_FILES). [`HEALTH_SLOTS`](crate::connections::HEALTH_SLOTS)
    /// more answer `/health` and `/metrics` when it is reached.
    pub max_connections: usize,
    /// How long a response may wait for its client to read (no write
    /// completing) before its connection closes and its request is
    /// cancelled (default 60 s, nginx's `send_timeout`).
    pub send_timeout: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(60),
            max_connections: 4096,
            send_timeout: Duration::from_secs(60),
        }
    }
}
