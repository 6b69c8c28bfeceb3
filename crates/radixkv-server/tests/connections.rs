//! Connection hygiene over raw TCP on loopback: the header-read, body-read
//! and idle timeouts close what they should, an oversized
//! `Content-Length` gets 413 before its body, and held connections beyond
//! the cap never lock `/health` out. Every wait is bounded; each check
//! waits for an outcome (a reply, a close) rather than for a time.

mod common;

use common::{get, limits, start, until_closed};
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
