//! The edges of the HTTP API that clients and proxies reach: the scheme of
//! an API key in any case, a client that goes away during a whole
//! completion,
//! OpenAI's shapes for 405, the fields that ask for no tools or plain text
//! (accepted) and those that ask for more (refused, named), and a failed
//! engine seen by `/health`.

mod common;

use common::{limits, post, raw, start, PATIENCE};
use radixkv::DeviceId;
use radixkv_engine::sched::batch::{BackendError, Batch, ModelBackend, StepOutput};
use radixkv_engine::simulator::{CostModel, SimulatedBackend};
use radixkv_engine::{Engine, EngineConfig};
use radixkv_server::{Server, ServerConfig};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

const COMPLETION: &str = r#"{"prompt": "hi", "max_tokens": 2}"#;

/// A client that goes away during a non-streamed completion, closing or
/// only shutting its write side, cancels it: the engine stops computing it
/// and nothing stays in flight (a half-close is taken as gone, as hyper
/// does by default).
#[tokio::test]
async fn a_client_that_goes_away_cancels_its_whole_completion() {
    // A token every ~6 ms: 4,000 would take ~25 s.
    let r = common::start_full(1.0, 1024, ServerConfig::default(), None).await;
    for half_close in [false, true] {
        let body = r#"{"prompt": "a long answer", "max_tokens": 4000}"#;
        let mut s = TcpStream::connect(r.addr).await.unwrap();
        let req = format!(
            "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        s.write_all(req.as_bytes()).await.unwrap();
        // The request is in the engine once /stats shows it outstanding.
        wait_stats(r.addr, |v| v["outstanding"] == 1).await;
        if half_close {
            s.shutdown().await.unwrap();
        } else {
            drop(s);
        }
        let v = wait_stats(r.addr, |v| v["outstanding"] == 0 && v["audit_ok"] == true).await;
        assert_eq!(v["http"]["in_flight"], 0, "{v}");
        let generated: u64 = v["devices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["output_tokens"].as_u64().unwrap())
            .sum();
        assert_eq!(generated, 0, "cancelled, not finished: {v}");
    }
    r.stop().await;
}

/// `/stats` once `until` holds (bounded).
async fn wait_stats(
    addr: std::net::SocketAddr,
    until: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let reply = raw(
            addr,
            "GET /stats HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
        )
        .await;
        let body = &reply[reply.find("\r\n\r\n").map_or(0, |i| i + 4)..];
        let v: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
        if until(&v) {
            return v;
        }
        assert!(tokio::time::Instant::now() < deadline, "{v}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn method_not_allowed_is_an_invalid_request() {
    let r = start(limits(10_000, 10_000, 60_000, 64), 1 << 20).await;
    let reply = raw(
        r.addr,
        "GET /v1/completions HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert!(reply.starts_with("HTTP/1.1 405"), "{reply}");
    assert!(
        reply.contains("\"type\":\"invalid_request_error\""),
        "{reply}"
    );
    r.stop().await;
}

#[tokio::test]
async fn no_tools_and_plain_text_are_accepted_more_is_refused_by_name() {
    let r = start(limits(10_000, 10_000, 60_000, 64), 1 << 20).await;
    for ok in [
        r#"{"prompt": "hi", "max_tokens": 2, "tools": []}"#,
        r#"{"prompt": "hi", "max_tokens": 2, "tool_choice": "none"}"#,
        r#"{"prompt": "hi", "max_tokens": 2, "response_format": {"type": "text"}}"#,
        r#"{"prompt": "hi", "max_tokens": 2, "suffix": ""}"#,
    ] {
        let reply = post(r.addr, "/v1/completions", "", ok).await;
        assert!(reply.starts_with("HTTP/1.1 200"), "{ok}: {reply}");
    }
    for (bad, field) in [
        (
            r#"{"prompt": "hi", "tools": [{"type": "function"}]}"#,
            "`tools`",
        ),
        (
            r#"{"prompt": "hi", "tool_choice": "auto"}"#,
            "`tool_choice`",
        ),
        (
            r#"{"prompt": "hi", "response_format": {"type": "json_object"}}"#,
            "`response_format`",
        ),
        (r#"{"prompt": "hi", "suffix": "end"}"#, "`suffix`"),
    ] {
        let reply = post(r.addr, "/v1/completions", "", bad).await;
        assert!(reply.starts_with("HTTP/1.1 400"), "{bad}: {reply}");
        assert!(reply.contains(field), "{bad}: {reply}");
    }
    r.stop().await;
}

#[tokio::test]
async fn the_api_key_scheme_is_case_insensitive() {
    let r = common::start_with(|cfg| cfg.api_key = Some("sk-test".into())).await;
    for (header, want) in [
        ("authorization: Bearer sk-test\r\n", "200"),
        ("authorization: bearer sk-test\r\n", "200"),
        ("authorization: BEARER sk-test\r\n", "200"),
        ("authorization: bearer sk-wrong\r\n", "401"),
        ("authorization: Basic sk-test\r\n", "401"),
        ("", "401"),
    ] {
        let reply = post(r.addr, "/v1/completions", header, COMPLETION).await;
        assert!(
            reply.starts_with(&format!("HTTP/1.1 {want}")),
            "{header:?}: {reply}"
        );
    }
    r.stop().await;
}

/// The simulator, panicking in every pass: its scheduler thread dies.
struct Panicking(SimulatedBackend);

impl ModelBackend for Panicking {
    fn step(&self, _device: DeviceId, _batch: &Batch) -> Result<StepOutput, BackendError> {
        panic!("a bug in the model");
    }

    fn describe(&self) -> String {
        self.0.describe()
    }
}

#[tokio::test]
async fn a_failed_scheduler_turns_health_to_503_with_the_reason() {
    let engine = Engine::start(
        EngineConfig {
            devices: 1,
            page_size: 16,
            pages_per_device: 64,
            ..EngineConfig::default()
        },
        Arc::new(Panicking(SimulatedBackend::new(CostModel::default(), 50.0))),
    )
    .unwrap();
    let server = Server::bind(
        "127.0.0.1:0".parse().unwrap(),
        engine,
        ServerConfig::default(),
    )
    .await
    .unwrap();
    let addr = server.local_addr().unwrap();
    let (stop, rx) = tokio::sync::oneshot::channel::<()>();
    let handle = tokio::spawn(server.run(async move {
        let _ = rx.await;
    }));
    // The request dies with its scheduler: a 503, not a hang.
    let reply = post(
        addr,
        "/v1/completions",
        "",
        r#"{"prompt": "boom", "max_tokens": 2}"#,
    )
    .await;
    assert!(reply.starts_with("HTTP/1.1 503"), "{reply}");
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let health = loop {
        let h = raw(
            addr,
            "GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
        )
        .await;
        if h.contains("failed") || tokio::time::Instant::now() > deadline {
            break h;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert!(health.starts_with("HTTP/1.1 503"), "{health}");
    assert!(health.contains(r#""status":"failed""#), "{health}");
    assert!(health.contains("a bug in the model"), "{health}");
    let stats = raw(
        addr,
        "GET /stats HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert!(
        stats
            .contains(r#""engine_failure":"the scheduler of device 0 failed: a bug in the model""#),
        "{stats}"
    );
    assert!(stats.contains(r#""audit_ok":false"#), "{stats}");
    // A new request is refused at once, naming the failure.
    let refused = post(
        addr,
        "/v1/completions",
        "",
        r#"{"prompt": "again", "max_tokens": 2}"#,
    )
    .await;
    assert!(
        refused.starts_with("HTTP/1.1 503") && refused.contains("failed"),
        "{refused}"
    );
    let _ = stop.send(());
    let _ = tokio::time::timeout(PATIENCE, handle).await;
}
