//! A drain as load balancers see it: while in-flight requests finish,
//! `/health` answers 503 `draining` and new completions 503, on fresh
//! connections; a second signal ends the drain at once.

mod common;

use common::{post, raw, start_full, PATIENCE};
use radixkv_server::ServerConfig;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Starts a long streamed completion; returns its connection once the
/// first event has arrived.
async fn streaming(addr: std::net::SocketAddr) -> TcpStream {
    let body = r#"{"prompt": "a long one", "max_tokens": 4000, "stream": true}"#;
    let mut s = TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains("data:") {
        let n = tokio::time::timeout(PATIENCE, s.read(&mut buf))
            .await
            .expect("the first event")
            .unwrap();
        assert!(n > 0, "the stream ended early");
        seen.extend_from_slice(&buf[..n]);
    }
    s
}

/// `/health`, until it answers `draining` (bounded).
async fn until_draining(addr: std::net::SocketAddr) -> String {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let reply = raw(
            addr,
            "GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
        )
        .await;
        if reply.contains("draining") || tokio::time::Instant::now() > deadline {
            return reply;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn health_says_draining_while_requests_finish() {
    let cfg = ServerConfig {
        drain_timeout: Duration::from_secs(60),
        ..ServerConfig::default()
    };
    // A token every ~6 ms: 4,000 take ~25 s, well inside the drain.
    let r = start_full(1.0, 1024, cfg, None).await;
    let addr = r.addr;
    let stream = streaming(addr).await;
    let (signal, done) = r.signal();
    signal();
    let health = until_draining(addr).await;
    assert!(health.starts_with("HTTP/1.1 503"), "{health}");
    assert!(health.contains(r#""status":"draining""#), "{health}");
    let refused = post(addr, "/v1/completions", "", r#"{"prompt": "late"}"#).await;
    assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
    assert!(refused.contains("shutting down"), "{refused}");
    // The in-flight stream's client leaves: nothing is in flight, and the
    // drain ends.
    drop(stream);
    let report = done.await;
    assert!(report.drained, "{report:?}");
}

#[tokio::test]
async fn a_second_signal_ends_the_drain_at_once() {
    let cfg = ServerConfig {
        drain_timeout: Duration::from_secs(3600),
        ..ServerConfig::default()
    };
    let (force, forced) = tokio::sync::oneshot::channel();
    let r = start_full(1.0, 1024, cfg, Some(forced)).await;
    let addr = r.addr;
    let mut stream = streaming(addr).await;
    let (signal, done) = r.signal();
    signal();
    assert!(until_draining(addr).await.contains("draining"));
    force.send(()).unwrap();
    let report = done.await;
    assert!(!report.drained);
    assert_eq!(report.abandoned, 1, "{report:?}");
    // The stream ends with the engine's stop, not after its 4,000 tokens.
    let mut rest = Vec::new();
    tokio::time::timeout(PATIENCE, stream.read_to_end(&mut rest))
        .await
        .expect("the stream ends")
        .ok();
    let rest = String::from_utf8_lossy(&rest);
    assert!(rest.contains("stopped") || rest.is_empty(), "{rest}");
}
