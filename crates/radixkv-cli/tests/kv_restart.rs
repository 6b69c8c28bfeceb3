//! A router's view across a restart: a subscriber stays connected while
//! `radixkv serve --kv-events` is killed (SIGKILL) and started again on the
//! same endpoint. The first batch the subscriber gets from the new run is
//! `AllBlocksCleared`, whenever ZeroMQ reconnects it, and the new run's
//! first stores come after (in a batch the clearing leads): otherwise a
//! router keeps the dead run's blocks.

#![cfg(unix)]

use radixkv_events::subscriber::{Batch, KvEventSubscriber};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const PATIENCE: Duration = Duration::from_secs(30);

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `radixkv serve` publishing on `endpoint`; its HTTP address.
fn serve(endpoint: &str) -> (Child, SocketAddr) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_radixkv"))
        .args(["serve", "--port", "0", "--devices", "1"])
        .args(["--pages-per-device", "256", "--speedup", "1000"])
        .args(["--kv-events", endpoint])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start radixkv serve");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .rsplit("http://")
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no address in {line:?}"));
    (child, addr)
}

/// One completion, on its own connection.
fn complete(addr: SocketAddr, prompt: &str) {
    let body = format!(r#"{{"prompt": "{prompt}", "max_tokens": 2}}"#);
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    write!(
        s,
        "POST /v1/completions HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
}

/// The event types of a batch, in order.
fn kinds(b: &Batch) -> Vec<String> {
    b.event_types()
}

async fn next(sub: &mut KvEventSubscriber) -> Batch {
    tokio::time::timeout(PATIENCE, sub.recv())
        .await
        .expect("a batch")
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_across_a_kill_and_restart_sees_the_clearing_first() {
    let endpoint = format!("tcp://127.0.0.1:{}", free_port());
    let (mut first, addr) = serve(&endpoint);
    let mut sub = KvEventSubscriber::connect(&endpoint, "").await.unwrap();
    // The first run stores blocks, and the subscriber sees them.
    let mut last_seq = 0;
    let mut stored = false;
    for i in 0..60 {
        complete(
            addr,
            &format!("the first run, request {i}, long enough for pages"),
        );
        // The subscription takes effect some time after the connect: until
        // then batches pass it by, and the next request makes more.
        while let Ok(b) = tokio::time::timeout(Duration::from_millis(500), sub.recv()).await {
            let b = b.unwrap();
            last_seq = last_seq.max(b.seq);
            stored |= kinds(&b).iter().any(|k| k == "BlockStored");
        }
        if stored {
            break;
        }
    }
    assert!(stored, "the first run's stores reach the subscriber");
    first.kill().unwrap();
    first.wait().unwrap();

    // Restarted on the same endpoint. Before any request, whenever ZeroMQ
    // reconnects the subscriber, the new run's first batch it gets is the
    // clearing (leftovers of the first run, numbered at or below its last
    // batch, aside).
    let (mut second, addr) = serve(&endpoint);
    let b = loop {
        let b = next(&mut sub).await;
        if b.seq > last_seq {
            break b;
        }
    };
    assert_eq!(kinds(&b), ["AllBlocksCleared"]);
    // Then the new run's stores.
    complete(
        addr,
        "the second run's first request, long enough for pages",
    );
    let stored = loop {
        let k = kinds(&next(&mut sub).await);
        if k.iter().any(|k| k != "AllBlocksCleared") {
            break k;
        }
    };
    assert_eq!(
        stored.first().map(String::as_str),
        Some("AllBlocksCleared"),
        "{stored:?}"
    );
    assert!(stored.iter().any(|k| k == "BlockStored"), "{stored:?}");
    second.kill().unwrap();
    second.wait().unwrap();
}
