//! What the server's integration tests share: a server on loopback with
//! given connection limits, and raw-TCP requests.

#![allow(dead_code)]

use radixkv_engine::simulator::{CostModel, SimulatedBackend};
use radixkv_engine::{Engine, EngineConfig};
use radixkv_server::ConnectionLimits;
use radixkv_server::{Server, ServerConfig};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::oneshot;

pub const PATIENCE: Duration = Duration::from_secs(20);

pub struct Running {
    pub addr: SocketAddr,
    stop: oneshot::Sender<()>,
    handle: tokio::task::JoinHandle<
        Result<radixkv_server::ShutdownReport, radixkv_server::ServerError>,
    >,
}

pub async fn start(limits: ConnectionLimits, max_body_bytes: usize) -> Running {
    start_with(|cfg| {
        cfg.connections = limits;
        cfg.max_body_bytes = max_body_bytes;
    })
    .await
}

/// A server with the default configuration as `edit` changes it.
pub async fn start_with(edit: impl FnOnce(&mut ServerConfig)) -> Running {
    let mut cfg = ServerConfig::default();
    edit(&mut cfg);
    start_full(50.0, 256, cfg, None).await
}

/// A server over a simulator at `speedup` (1: a token every ~6 ms) with
/// `pages` pages, and `force` ending its drain at once if given.
pub async fn start_full(
    speedup: f64,
    pages: usize,
    cfg: ServerConfig,
    force: Option<oneshot::Receiver<()>>,
) -> Running {
    let engine = Engine::start(
        EngineConfig {
            devices: 1,
            page_size: 16,
            pages_per_device: pages,
            ..EngineConfig::default()
        },
        Arc::new(SimulatedBackend::new(CostModel::default(), speedup)),
    )
    .unwrap();
    let mut server = Server::bind("127.0.0.1:0".parse().unwrap(), engine, cfg)
        .await
        .unwrap();
    if let Some(f) = force {
        server = server.with_force_stop(async move {
            let _ = f.await;
        });
    }
    let addr = server.local_addr().unwrap();
    let (stop, rx) = oneshot::channel::<()>();
    let handle = tokio::spawn(server.run(async move {
        let _ = rx.await;
    }));
    Running { addr, stop, handle }
}

impl Running {
    /// Stops it and asserts that every request finished.
    pub async fn stop(self) {
        let (signal, done) = self.signal();
        signal();
        assert!(done.await.drained);
    }

    /// The shutdown signal, and the server's end (its report).
    pub fn signal(
        self,
    ) -> (
        impl FnOnce(),
        impl std::future::Future<Output = radixkv_server::ShutdownReport>,
    ) {
        let stop = self.stop;
        let handle = self.handle;
        (
            move || {
                let _ = stop.send(());
            },
            async move {
                tokio::time::timeout(PATIENCE, handle)
                    .await
                    .expect("the server stops")
                    .unwrap()
                    .unwrap()
            },
        )
    }
}

pub fn limits(header: u64, body: u64, idle: u64, cap: usize) -> ConnectionLimits {
    ConnectionLimits {
        header_read_timeout: Duration::from_millis(header),
        body_read_timeout: Duration::from_millis(body),
        idle_timeout: Duration::from_millis(idle),
        max_connections: cap,
        ..ConnectionLimits::default()
    }
}

/// Reads until the server closes the connection; what it sent.
pub async fn until_closed(s: &mut TcpStream) -> String {
    let mut out = Vec::new();
    tokio::time::timeout(PATIENCE, s.read_to_end(&mut out))
        .await
        .expect("the server closes the connection")
        .ok();
    String::from_utf8_lossy(&out).into_owned()
}

/// One `GET path` on a fresh connection, closed after the reply.
pub async fn get(addr: SocketAddr, path: &str) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    until_closed(&mut s).await
}

/// Sends `raw` (a whole request, which should say `connection: close`) on
/// a fresh connection; what came back before the close.
pub async fn raw(addr: SocketAddr, raw: &str) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(raw.as_bytes()).await.unwrap();
    until_closed(&mut s).await
}

/// A POST of `body` to `path` with extra header lines.
pub async fn post(addr: SocketAddr, path: &str, headers: &str, body: &str) -> String {
    let req = format!(
        "POST {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-type: application/json\r\n{headers}content-length: {}\r\n\r\n{body}",
        body.len()
    );
    raw(addr, &req).await
}
