//! Connection hygiene over raw TCP on loopback: the header-read, body-read,
//! idle and send timeouts close what they should, an oversized
//! `Content-Length` gets 413 before its body, and neither held connections
//! beyond the cap nor every slot working lock `/health` out. Every wait is bounded; each check
//! waits for an outcome (a reply, a close) rather than for a time.

mod common;

use common::{get, limits, start, start_full, until_closed};
use radixkv_server::ConnectionLimits;
use radixkv_server::ServerConfig;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

const PATIENCE: Duration = common::PATIENCE;

#[tokio::test]
async fn silent_and_partial_heads_are_closed_by_the_header_timeout() {
    let r = start(limits(200, 10_000, 60_000, 64), 1 << 20).await;
    let mut silent = TcpStream::connect(r.addr).await.unwrap();
    let mut partial = TcpStream::connect(r.addr).await.unwrap();
    partial
        .write_all(b"GET /health HTTP/1.1\r\nho")
        .await
        .unwrap();
    let t = Instant::now();
    until_closed(&mut silent).await;
    until_closed(&mut partial).await;
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    r.stop().await;
}

#[tokio::test]
async fn a_slow_body_gets_408_and_does_not_delay_others() {
    let r = start(limits(10_000, 300, 60_000, 64), 1 << 20).await;
    let mut slow = TcpStream::connect(r.addr).await.unwrap();
    slow.write_all(
        b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"prompt\"",
    )
    .await
    .unwrap();
    // Meanwhile another client is served.
    assert!(get(r.addr, "/health").await.starts_with("HTTP/1.1 200"));
    let reply = until_closed(&mut slow).await;
    assert!(reply.starts_with("HTTP/1.1 408"), "{reply}");
    assert!(
        reply.contains("\"type\":\"invalid_request_error\""),
        "{reply}"
    );
    assert!(reply.contains("\"code\":408"), "{reply}");
    r.stop().await;
}

#[tokio::test]
async fn an_oversized_content_length_gets_413_before_the_body() {
    let r = start(limits(10_000, 10_000, 60_000, 64), 1024).await;
    let mut s = TcpStream::connect(r.addr).await.unwrap();
    // 99 GB announced, nothing sent: the answer cannot wait for the body.
    s.write_all(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 99000000000\r\n\r\n")
        .await
        .unwrap();
    let reply = until_closed(&mut s).await;
    assert!(reply.starts_with("HTTP/1.1 413"), "{reply}");
    assert!(reply.contains("limit 1024 bytes"), "{reply}");
    r.stop().await;
}

#[tokio::test]
async fn an_idle_keep_alive_connection_is_closed() {
    let r = start(limits(10_000, 10_000, 200, 64), 1 << 20).await;
    let mut s = TcpStream::connect(r.addr).await.unwrap();
    s.write_all(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    // The reply comes, then (no further request) the close.
    let reply = until_closed(&mut s).await;
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    r.stop().await;
}

#[tokio::test]
async fn held_connections_beyond_the_cap_never_lock_out_health() {
    let r = start(limits(30_000, 30_000, 60_000, 8), 1 << 20).await;
    // Thirty held connections: idle, a partial head, a partial body.
    let mut held = Vec::new();
    for i in 0..30 {
        let mut s = TcpStream::connect(r.addr).await.unwrap();
        match i % 3 {
            0 => {}
            1 => s.write_all(b"GET /health HTTP/1.1\r\n").await.unwrap(),
            _ => s
                .write_all(b"POST /query HTTP/1.1\r\nhost: x\r\ncontent-length: 50\r\n\r\n{")
                .await
                .unwrap(),
        }
        held.push(s);
    }
    for _ in 0..5 {
        let reply = tokio::time::timeout(PATIENCE, get(r.addr, "/health"))
            .await
            .expect("/health answers under the flood");
        assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    }
    let stats = get(r.addr, "/stats").await;
    let body = &stats[stats.find("\r\n\r\n").unwrap() + 4..];
    let v: serde_json::Value = serde_json::from_str(body).unwrap();
    assert!(v["http"]["open_connections"].as_u64().unwrap() <= 8, "{v}");
    assert!(v["http"]["shed_connections"].as_u64().unwrap() >= 22, "{v}");
    assert_eq!(v["http"]["max_connections"], 8);
    drop(held);
    r.stop().await;
}

/// A streamed completion whose client never reads (its receive buffer
/// small, so that the server's writes stall soon).
async fn stalled_stream(addr: std::net::SocketAddr, max_tokens: usize) -> TcpStream {
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    let mut s = sock.connect(addr).await.unwrap();
    let body = format!(
        r#"{{"prompt": "a client that stops reading", "max_tokens": {max_tokens}, "stream": true}}"#
    );
    let req = format!(
        "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    s
}

fn stats_of(reply: &str) -> serde_json::Value {
    serde_json::from_str(&reply[reply.find("\r\n\r\n").unwrap() + 4..]).unwrap()
}

/// With every slot of the cap answering (two slow streams), a new
/// connection takes a health slot: `/health` and `/metrics` answer there,
/// anything else is 503 and the connection closes.
#[tokio::test]
async fn with_every_slot_working_health_and_metrics_still_answer() {
    let r = start_full(
        0.05,
        256,
        ServerConfig {
            connections: limits(30_000, 30_000, 60_000, 2),
            ..ServerConfig::default()
        },
        None,
    )
    .await;
    let a = stalled_stream(r.addr, 200).await;
    let b = stalled_stream(r.addr, 200).await;
    // Both streams admitted (their connections working).
    let t = Instant::now();
    loop {
        let m = get(r.addr, "/metrics").await;
        if m.lines().any(|l| l == "radixkv_http_in_flight 2") {
            break;
        }
        assert!(
            t.elapsed() < PATIENCE,
            "the two streams were not admitted:\n{m}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for _ in 0..5 {
        let reply = tokio::time::timeout(PATIENCE, get(r.addr, "/health"))
            .await
            .expect("/health answers with every slot working");
        assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    }
    let other = get(r.addr, "/stats").await;
    assert!(other.starts_with("HTTP/1.1 503"), "{other}");
    assert!(
        other.contains("answers /health and /metrics only"),
        "{other}"
    );
    // The clients go: their requests are cancelled, and the drain is quick.
    drop((a, b));
    r.stop().await;
}

/// A client that stops reading a large stream: past the send timeout its
/// connection closes, its request is cancelled, its admission permit freed.
#[tokio::test]
async fn a_stream_nobody_reads_is_cancelled_by_the_send_timeout() {
    let r = start_full(
        1e6,
        8192,
        ServerConfig {
            connections: ConnectionLimits {
                send_timeout: Duration::from_millis(300),
                ..ConnectionLimits::default()
            },
            max_tokens_limit: 100_000,
            ..ServerConfig::default()
        },
        None,
    )
    .await;
    let stalled = stalled_stream(r.addr, 60_000).await;
    let t = Instant::now();
    let v = loop {
        let v = stats_of(&get(r.addr, "/stats").await);
        if v["http"]["send_timeouts"] == 1 && v["http"]["in_flight"] == 0 {
            break v;
        }
        assert!(t.elapsed() < PATIENCE * 3, "not cancelled: {v}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(v["http"]["disconnects"], 1, "{v}");
    drop(stalled);
    r.stop().await;
}
