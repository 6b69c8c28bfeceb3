//! Accepting and holding connections: the cap on open connections and the
//! health slots beyond it, the header-read, body-read, idle and send
//! timeouts, and the early 413.
//!
//! Each accepted connection is served by hyper's HTTP/1 connection in its
//! own task, so a slow client delays only itself. A connection is
//! *working* while one of its requests has its body read and is being
//! answered (a streamed response included); otherwise it is *held*: idle
//! between requests, sending a request head, or sending a body. Held
//! connections are what a flood consists of, and what the limits close:
//!
//! | limit | what it closes |
//! | --- | --- |
//! | header-read timeout | a connection whose request head is not complete in time (hyper's timer, from the connection's start) |
//! | body-read timeout | a request whose body is not complete in time: 408, and the connection closes |
//! | idle timeout | a held connection with no request for this long (hyper also restarts the header-read timeout when a connection goes idle, so the smaller of the two applies) |
//! | send timeout | a working connection whose response has waited this long for the client to read (no write completed): it closes, which cancels its request and releases its admission permit |
//! | connection cap | when a new connection would exceed it, the oldest held connection is closed to make room; with none held, the new connection takes one of the [`HEALTH_SLOTS`] |
//!
//! The health slots, beyond the cap, keep `/health` and `/metrics`
//! answering whatever the load: a connection in one is answered on those
//! two routes only (anything else: 503, and the connection closes), and
//! when every slot is taken the oldest one held for [`HEALTH_GRACE`] makes
//! room; a new connection finding none is closed.
//!
//! A request whose `Content-Length` exceeds the body limit is answered 413
//! before its body is read. While the server drains it still accepts (so
//! that `/health` can answer `draining`), every response closes its
//! connection, and once nothing is in flight it stops accepting. The cap is kept below the process's limit on
//! open files, which [`raise_open_file_limit`] lifts to the hard limit
//! where the OS allows, so that `accept` never fails for want of a file
//! descriptor and `/health` stays reachable under a flood.

use super::conn_io::{ConnIo, WriteProgress};
use super::error::ApiError;
use crate::state::AppState;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{header, HeaderValue, Request, Response};
use axum::Router;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify};
use tokio::task::JoinSet;
use tower::ServiceExt;

/// File descriptors kept free beside the connections (the engine's
/// threads, KV-event sockets, logs, the listener itself, the health slots).
pub const RESERVED_FILES: u64 = 64;

/// Connections beyond the cap that answer `/health` and `/metrics` only
/// (taken from [`RESERVED_FILES`]'s descriptors).
pub const HEALTH_SLOTS: usize = 4;

/// How long a connection in a health slot may stay held before a newer
/// one may close it to take its slot (a flood of new connections would
/// otherwise close each health check before its request is read).
pub const HEALTH_GRACE: Duration = Duration::from_millis(500);

/// Raises the soft limit on open files to the hard limit, where the OS
/// allows; returns the soft limit in force afterwards (`None` where the
/// OS has no such limit or will not say).
pub fn raise_open_file_limit() -> Option<u64> {
    #[cfg(unix)]
    {
        let _ = rlimit::increase_nofile_limit(u64::MAX);
        rlimit::getrlimit(rlimit::Resource::NOFILE)
            .ok()
            .map(|(soft, _)| soft)
    }
    #[cfg(not(unix))]
    {
        None
    }
}

/// The connection cap in force: `wanted`, kept below `open_files` (the
/// soft limit) less [`RESERVED_FILES`], and at least 1.
pub fn effective_cap(wanted: usize, open_files: Option<u64>) -> usize {
    let room = open_files.map_or(u64::MAX, |f| f.saturating_sub(RESERVED_FILES));
    wanted
        .min(usize::try_from(room).unwrap_or(usize::MAX))
        .max(1)
}

/// One open connection's state, shared by its task and its requests.
#[derive(Debug)]
struct Conn {
    id: u64,
    /// Requests being answered (body read, response not yet sent).
    working: AtomicUsize,
    /// A request's body is being read.
    reading: AtomicBool,
    /// Milliseconds since the registry's start at the last request start
    /// or response end.
    last_active_ms: AtomicU64,
    /// Set to close the connection now (made room for a newer one).
    close: Notify,
    /// In a health slot: it answers `/health` and `/metrics` only.
    health_only: bool,
}

/// The open connections, oldest first.
#[derive(Debug)]
struct Registry {
    start: Instant,
    next: AtomicU64,
    conns: Mutex<BTreeMap<u64, Arc<Conn>>>,
}

impl Registry {
    fn new() -> Self {
        Registry {
            start: Instant::now(),
            next: AtomicU64::new(0),
            conns: Mutex::new(BTreeMap::new()),
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn len(&self) -> usize {
        self.conns.lock().map_or(0, |c| c.len())
    }

    /// Open connections in the cap's slots and in the health slots.
    fn counts(&self) -> (usize, usize) {
        self.conns.lock().map_or((0, 0), |c| {
            let health = c.values().filter(|c| c.health_only).count();
            (c.len() - health, health)
        })
    }

    fn add(&self, health_only: bool) -> Arc<Conn> {
        // Relaxed: ids need only be unique and increasing per registry.
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let c = Arc::new(Conn {
            id,
            working: AtomicUsize::new(0),
            reading: AtomicBool::new(false),
            last_active_ms: AtomicU64::new(self.now_ms()),
            close: Notify::new(),
            health_only,
        });
        if let Ok(mut m) = self.conns.lock() {
            m.insert(id, Arc::clone(&c));
        }
        c
    }

    fn remove(&self, id: u64) {
        if let Ok(mut m) = self.conns.lock() {
            m.remove(&id);
        }
    }

    /// Closes the oldest held connection in the cap's slots (or, with
    /// `health_only`, in the health slots, held for at least
    /// [`HEALTH_GRACE`]: a health check just accepted, its request on the
    /// way, is not taken for a connection left idle); false when there is
    /// none.
    fn shed_oldest_held(&self, health_only: bool) -> bool {
        let now = self.now_ms();
        let grace = if health_only {
            u64::try_from(HEALTH_GRACE.as_millis()).unwrap_or(u64::MAX)
        } else {
            0
        };
        let victim = self.conns.lock().ok().and_then(|mut m| {
            // Relaxed: a snapshot; a connection that starts working meanwhile
            // is closed with its request, as a client's own disconnect would.
            let id = m
                .values()
                .find(|c| {
                    c.health_only == health_only
                        && c.working.load(Ordering::Relaxed) == 0
                        && now.saturating_sub(c.last_active_ms.load(Ordering::Relaxed)) >= grace
                })
                .map(|c| c.id)?;
            m.remove(&id)
        });
        match victim {
            Some(c) => {
                c.close.notify_one();
                true
            }
            None => false,
        }
    }
}

impl Conn {
    fn touch(&self, reg: &Registry) {
        // Relaxed: a timestamp read by this connection's own idle check.
        self.last_active_ms.store(reg.now_ms(), Ordering::Relaxed);
    }

    /// Held with no request for at least `idle`.
    fn idle_for(&self, reg: &Registry, idle: Duration) -> bool {
        // Relaxed: counters and a timestamp of this connection, checked
        // periodically; a stale read only delays the close by one tick.
        let since = reg
            .now_ms()
            .saturating_sub(self.last_active_ms.load(Ordering::Relaxed));
        self.working.load(Ordering::Relaxed) == 0
            && !self.reading.load(Ordering::Relaxed)
            && u128::from(since) >= idle.as_millis()
    }
}

/// Marks a connection working until dropped (with the response body).
struct Working {
    conn: Arc<Conn>,
    reg: Arc<Registry>,
}

impl Working {
    fn new(conn: &Arc<Conn>, reg: &Arc<Registry>) -> Self {
        // Relaxed: a counter read by the idle check and the shedding scan.
        conn.working.fetch_add(1, Ordering::Relaxed);
        Working {
            conn: Arc::clone(conn),
            reg: Arc::clone(reg),
        }
    }
}

impl Drop for Working {
    fn drop(&mut self) {
        self.conn.touch(&self.reg);
        // Relaxed: as in `new`.
        self.conn.working.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A response body that keeps its connection marked working until it is
/// sent (or dropped).
struct Tracked {
    inner: Body,
    _working: Working,
}

impl http_body::Body for Tracked {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// What every connection's task shares.
#[derive(Clone)]
struct Ctx {
    router: Router,
    state: Arc<AppState>,
    reg: Arc<Registry>,
    /// Turns true when the server stops accepting: every connection closes
    /// once its request is answered.
    closing: watch::Receiver<bool>,
}

/// How often a draining server checks whether its requests are done.
const DRAIN_POLL: Duration = Duration::from_millis(20);

/// Serves `listener` with `router`. When `stop` turns true it drains: it
/// still accepts (so that `/health` can say `draining`, and new
/// completions get 503) and every response closes its connection; once no
/// request is in flight it stops accepting, closes every connection once
/// its request is answered, and returns when all are closed.
pub(crate) async fn serve(
    listener: TcpListener,
    router: Router,
    state: Arc<AppState>,
    mut stop: watch::Receiver<bool>,
) {
    let cap = state.connection_cap;
    let (closing_tx, closing) = watch::channel(false);
    let ctx = Ctx {
        router,
        state: Arc::clone(&state),
        reg: Arc::new(Registry::new()),
        closing,
    };
    let reg = &ctx.reg;
    let mut tasks = JoinSet::new();
    let mut draining = false;
    // One timer for the whole drain: a fresh one per turn would never fire
    // while connections keep arriving faster than it.
    let mut drain_poll = tokio::time::interval(DRAIN_POLL);
    // Ticks missed before the drain are not made up in a burst.
    drain_poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        if draining && state.in_flight() == 0 {
            break;
        }
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stop.wait_for(|s| *s), if !draining => {
                draining = true;
                drain_poll.reset();
                continue;
            }
            _ = drain_poll.tick(), if draining => continue,
        };
        while tasks.try_join_next().is_some() {}
        let (stream, addr) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // Out of descriptors despite the cap (other files of the
                // process): make room and wait a little; other errors
                // concern one connection that never was.
                if matches!(e.raw_os_error(), Some(23 | 24)) {
                    if reg.shed_oldest_held(false) {
                        shed(&state);
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                continue;
            }
        };
        let (regular, health) = reg.counts();
        let health_only = if regular < cap {
            false
        } else if reg.shed_oldest_held(false) {
            // The oldest held connection made room.
            shed(&state);
            false
        } else if health < HEALTH_SLOTS || reg.shed_oldest_held(true) {
            // Every slot is working: a health slot, free or made free.
            true
        } else {
            // Every health slot is working too.
            shed(&state);
            drop(stream);
            continue;
        };
        let conn = reg.add(health_only);
        open(&state, reg);
        tasks.spawn(connection(stream, addr, conn, ctx.clone()));
    }
    drop(listener);
    let _ = closing_tx.send(true);
    while tasks.join_next().await.is_some() {}
    open(&state, reg);
}

fn shed(state: &AppState) {
    // Relaxed: a statistic.
    state.stats.shed_connections.fetch_add(1, Ordering::Relaxed);
}

fn open(state: &AppState, reg: &Registry) {
    // Relaxed: a statistic.
    state
        .stats
        .open_connections
        .store(reg.len(), Ordering::Relaxed);
}

/// Removes a connection from the registry when its task ends, however it
/// ends (a panicking handler included).
struct Registered {
    reg: Arc<Registry>,
    state: Arc<AppState>,
    id: u64,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.reg.remove(self.id);
        open(&self.state, &self.reg);
    }
}

async fn connection(stream: TcpStream, addr: SocketAddr, conn: Arc<Conn>, mut ctx: Ctx) {
    let _registered = Registered {
        reg: Arc::clone(&ctx.reg),
        state: Arc::clone(&ctx.state),
        id: conn.id,
    };
    let limits = ctx.state.cfg.connections;
    let progress = WriteProgress::new();
    let io = ConnIo::new(stream, Arc::clone(&progress), Arc::clone(&ctx.state));
    let (c, shared) = (Arc::clone(&conn), ctx.clone());
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        let (c, ctx) = (Arc::clone(&c), shared.clone());
        async move { Ok::<_, std::convert::Infallible>(request(req, addr, &ctx, c).await) }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    // No half-close: a client that shuts its write side is taken as gone
    // (hyper then notices a disconnect while a whole response is being
    // computed, and the request is cancelled, its pages released).
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    let served = builder.serve_connection(TokioIo::new(io), service);
    tokio::pin!(served);
    let tick = (limits.idle_timeout.min(limits.send_timeout) / 4)
        .clamp(Duration::from_millis(10), Duration::from_secs(1));
    let mut idle_check = tokio::time::interval(tick);
    let mut closing = false;
    loop {
        tokio::select! {
            _ = served.as_mut() => break,
            _ = conn.close.notified() => break,
            _ = ctx.closing.wait_for(|c| *c), if !closing => {
                closing = true;
                served.as_mut().graceful_shutdown();
            }
            _ = idle_check.tick() => {
                if conn.idle_for(&ctx.reg, limits.idle_timeout) {
                    break;
                }
                if progress.blocked_for() >= limits.send_timeout {
                    // Dropping the connection drops its response, whose
                    // stream cancels the request and frees its permit.
                    // Relaxed: a statistic.
                    ctx.state.stats.send_timeouts.fetch_add(1, Ordering::Relaxed);
                    break;
                }
            }
        }
    }
}

/// One request: the early 413, the body read within its timeout, then the
/// router with the connection marked working until the response is sent.
async fn request(
    req: Request<Incoming>,
    addr: SocketAddr,
    ctx: &Ctx,
    conn: Arc<Conn>,
) -> Response<Body> {
    let (state, reg) = (&ctx.state, &ctx.reg);
    conn.touch(reg);
    if conn.health_only && !matches!(req.uri().path(), "/health" | "/metrics") {
        return closing(
            state,
            ApiError::Unavailable(format!(
                "the server is at its connection limit ({}): this connection answers /health and /metrics only",
                state.connection_cap
            )),
        );
    }
    let limit = state.cfg.max_body_bytes;
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return closing(state, ApiError::PayloadTooLarge { limit });
    }
    let (mut parts, body) = req.into_parts();
    // Relaxed: read by this connection's idle check only.
    conn.reading.store(true, Ordering::Relaxed);
    let read = tokio::time::timeout(
        state.cfg.connections.body_read_timeout,
        Limited::new(body, limit).collect(),
    )
    .await;
    conn.reading.store(false, Ordering::Relaxed);
    let bytes = match read {
        Ok(Ok(b)) => b.to_bytes(),
        Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => {
            return closing(state, ApiError::PayloadTooLarge { limit });
        }
        Ok(Err(e)) => {
            return closing(
                state,
                ApiError::BadRequest(format!("cannot read the request body: {e}")),
            );
        }
        Err(_) => {
            let secs = state.cfg.connections.body_read_timeout.as_secs_f64();
            return closing(state, ApiError::RequestTimeout(secs));
        }
    };
    parts.extensions.insert(ConnectInfo(addr));
    let working = Working::new(&conn, reg);
    let request = Request::from_parts(parts, Body::from(bytes));
    let mut response = match ctx.router.clone().oneshot(request).await {
        Ok(r) => r,
        Err(never) => match never {},
    };
    // Relaxed: advisory; a draining server closes each connection after
    // its response.
    if state.draining.load(Ordering::Relaxed) {
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response.map(|inner| {
        Body::new(Tracked {
            inner,
            _working: working,
        })
    })
}

/// An error answered before the router, counted like the router's, on a
/// connection that then closes (its body may be unread).
fn closing(state: &AppState, e: ApiError) -> Response<Body> {
    use axum::response::IntoResponse;
    let mut r = e.into_response();
    r.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    state.stats.response(r.status().as_u16());
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_stays_below_the_open_file_limit() {
        assert_eq!(
            effective_cap(4096, Some(256)),
            256 - RESERVED_FILES as usize
        );
        assert_eq!(effective_cap(100, Some(1 << 20)), 100);
        assert_eq!(effective_cap(100, None), 100);
        assert_eq!(effective_cap(100, Some(10)), 1);
    }

    #[test]
    fn shedding_closes_the_oldest_held_connection_only() {
        let reg = Arc::new(Registry::new());
        let (a, b, c) = (reg.add(false), reg.add(false), reg.add(false));
        let health = reg.add(true);
        let _working = Working::new(&a, &reg);
        assert!(reg.shed_oldest_held(false));
        assert_eq!(reg.len(), 3);
        let m: Vec<u64> = reg.conns.lock().unwrap().keys().copied().collect();
        assert_eq!(m, [a.id, c.id, health.id], "b, the oldest held one, went");
        let _ = b;
        let _w2 = Working::new(&c, &reg);
        assert!(
            !reg.shed_oldest_held(false),
            "every connection in the cap's slots is working"
        );
        assert_eq!(reg.counts(), (2, 1));
        assert!(
            !reg.shed_oldest_held(true),
            "a health slot's connection just accepted has its grace"
        );
        // Held past its grace (its last activity long ago).
        health.last_active_ms.store(0, Ordering::Relaxed);
        std::thread::sleep(HEALTH_GRACE);
        assert!(
            reg.shed_oldest_held(true),
            "the health slot's held connection, past its grace"
        );
        assert_eq!(reg.counts(), (2, 0));
    }

    #[test]
    fn a_connection_is_idle_only_when_held_past_the_timeout() {
        let reg = Arc::new(Registry::new());
        let c = reg.add(false);
        assert!(c.idle_for(&reg, Duration::ZERO));
        assert!(!c.idle_for(&reg, Duration::from_secs(3600)));
        c.reading.store(true, Ordering::Relaxed);
        assert!(!c.idle_for(&reg, Duration::ZERO), "reading a body");
        c.reading.store(false, Ordering::Relaxed);
        let w = Working::new(&c, &reg);
        assert!(!c.idle_for(&reg, Duration::ZERO), "answering");
        drop(w);
        assert!(c.idle_for(&reg, Duration::ZERO));
    }
}
