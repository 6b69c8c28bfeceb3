//! A server's life: [`Server::bind`], [`Server::run`] with its drain on
//! the shutdown signal, and [`shutdown_signals`].

use crate::config::ServerConfig;
use crate::error::ServerError;
use crate::handlers::unix_now;
use crate::metrics::ServerStats;
use crate::routes::app;
use crate::state::AppState;
use crate::{codec, connections};
use radixkv_engine::{Engine, EngineReport};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

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
