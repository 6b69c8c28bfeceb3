//! `radixkv index`'s service in process, against publishers the tests
//! drive frame by frame: Dynamo's routes and shapes (register, duplicates,
//! bad input, query by tokens and by Dynamo's per-block hashes, the
//! Mooncake form, workers, metrics, unregister), a worker that restarts
//! on the same port (its socket closed and bound again), and one that
//! falls silent past the limit.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::StatusCode;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use radixkv_events::testing::FramePublisher;
use radixkv_events::wire::{KvEvent, Medium};
use radixkv_index::local_hash;
use radixkv_index_service::registry::RegistryOptions;
use radixkv_index_service::InitialWorkers;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

struct Service {
    addr: SocketAddr,
    client: Client<HttpConnector, Full<Bytes>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Service {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Service {
    async fn start(options: RegistryOptions) -> Service {
        let registry = radixkv_index_service::start(options, &InitialWorkers::default()).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            radixkv_index_service::serve(listener, registry, std::future::pending())
                .await
                .unwrap();
        });
        Service {
            addr,
            client: Client::builder(TokioExecutor::new()).build_http(),
            task,
        }
    }

    async fn call(&self, method: &str, path: &str, body: &str) -> (StatusCode, String) {
        self.call_as(method, path, body, "application/json").await
    }

    async fn call_as(
        &self,
        method: &str,
        path: &str,
        body: &str,
        content_type: &str,
    ) -> (StatusCode, String) {
        let req = hyper::Request::builder()
            .method(method)
            .uri(format!("http://{}{path}", self.addr))
            .header("content-type", content_type)
            .body(Full::new(Bytes::from(body.to_string())))
            .unwrap();
        let r = self.client.request(req).await.unwrap();
        let status = r.status();
        let bytes = r.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&bytes).into_owned())
    }

    async fn post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        let (s, b) = self.call("POST", path, &body.to_string()).await;
        (
            s,
            serde_json::from_str(&b).unwrap_or_else(|_| panic!("{path}: not JSON: {b}")),
        )
    }

    async fn get(&self, path: &str) -> (StatusCode, String) {
        self.call("GET", path, "").await
    }

    /// Polls `/query` with `body` until `want(answer)`; panics after 30 s.
    async fn query_until(&self, body: Value, want: impl Fn(&Value) -> bool) -> Value {
        let t = Instant::now();
        loop {
            let (s, v) = self.post("/query", body.clone()).await;
            if s == StatusCode::OK && want(&v) {
                return v;
            }
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "{body}: last answer {s} {v}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

fn stored(hashes: &[u64], parent: Option<u64>, tokens: &[u32]) -> KvEvent {
    KvEvent::BlockStored {
        block_hashes: hashes.to_vec(),
        parent_block_hash: parent,
        token_ids: tokens.to_vec(),
        block_size: 2,
        medium: Medium::Gpu,
        lora_name: None,
        cache_salt: None,
    }
}

/// Sends batch 0 (a clearing) until the worker's listener has it: the
/// service's `/workers` says so.
async fn subscribed(svc: &Service, p: &mut FramePublisher, worker: u64, rank: u32) {
    let t = Instant::now();
    loop {
        p.publish(0, &[KvEvent::AllBlocksCleared], true).await;
        let (_, w) = svc.get("/metrics").await;
        let line = format!("radixkv_index_live_batches_total{{model_name=\"m\",routing_group=\"default\",instance_id=\"{worker}\",dp_rank=\"{rank}\"}} ");
        if w.lines()
            .any(|l| l.starts_with(&line) && !l.ends_with(" 0"))
        {
            return;
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "never subscribed:\n{w}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn register(worker: u64, rank: u32, p: &FramePublisher, replay: bool) -> Value {
    json!({
        "instance_id": worker,
        "dp_rank": rank,
        "endpoint": p.endpoint,
        "replay_endpoint": if replay { Some(&p.replay) } else { None },
        "model_name": "m",
        "block_size": 2,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamos_routes_and_shapes() {
    let svc = Service::start(RegistryOptions::default()).await;
    let mut a = FramePublisher::bind(free_port(), free_port())
        .await
        .unwrap();
    let mut b = FramePublisher::bind(free_port(), free_port())
        .await
        .unwrap();
    assert_eq!(
        svc.post("/register", register(7, 0, &a, true)).await.0,
        StatusCode::CREATED
    );
    assert_eq!(
        svc.post("/register", register(7, 1, &b, true)).await.0,
        StatusCode::CREATED
    );

    // What Dynamo's refuses, refused the same way.
    let (s, v) = svc.post("/register", register(7, 1, &b, true)).await;
    assert_eq!(s, StatusCode::CONFLICT, "{v}");
    assert!(
        v["error"].as_str().unwrap().contains("already registered"),
        "{v}"
    );
    let mut other_size = register(8, 0, &b, true);
    other_size["block_size"] = json!(16);
    assert_eq!(
        svc.post("/register", other_size).await.0,
        StatusCode::CONFLICT
    );
    let mut bad = register(8, 0, &b, true);
    bad["endpoint"] = json!("tcp://nowhere");
    assert_eq!(svc.post("/register", bad).await.0, StatusCode::BAD_REQUEST);
    let (s, v) = svc
        .post("/register", json!({"instance_id": 8, "model_name": "m"}))
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    assert_eq!(
        svc.call("POST", "/query", "{not json").await.0,
        StatusCode::BAD_REQUEST
    );
    let query = r#"{"token_ids": [1, 2], "model_name": "m"}"#;
    for (content_type, want) in [
        ("text/plain", StatusCode::UNSUPPORTED_MEDIA_TYPE),
        ("application/jsonx", StatusCode::UNSUPPORTED_MEDIA_TYPE),
        ("Application/JSON; charset=utf-8", StatusCode::OK),
        ("application/vnd.api+json", StatusCode::OK),
    ] {
        let (s, v) = svc.call_as("POST", "/query", query, content_type).await;
        assert_eq!(s, want, "{content_type}: {v}");
    }
    let (s, _) = svc
        .post(
            "/query",
            json!({"token_ids": [1, 4294967296u64], "model_name": "m"}),
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "a token id past u32");

    subscribed(&svc, &mut a, 7, 0).await;
    subscribed(&svc, &mut b, 7, 1).await;
    let t = Instant::now();
    while svc.get("/health").await.0 != StatusCode::OK {
        assert!(t.elapsed() < Duration::from_secs(30), "never ready");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    a.publish(1, &[stored(&[10, 11], None, &[1, 2, 3, 4])], true)
        .await;
    b.publish(1, &[stored(&[20], None, &[1, 2])], true).await;

    let q = json!({"token_ids": [1, 2, 3, 4, 5], "model_name": "m"});
    let v = svc
        .query_until(q, |v| v["scores"] == json!({"7": {"0": 4, "1": 2}}))
        .await;
    assert_eq!(
        v,
        json!({
            "scores": {"7": {"0": 4, "1": 2}},
            "frequencies": [2, 1],
            "instances": {"7": {"longest_matched": 4, "gpu": 4, "dp": {"0": 4, "1": 2}, "cpu": 4, "disk": 4}}
        })
    );
    // By Dynamo's per-block hashes, signed as its clients send them.
    let hashes: Vec<i64> =
        local_hash::block_hashes(&[1, 2, 3, 4, 5], 2, local_hash::seed(None, None))
            .into_iter()
            .map(|h| h as i64)
            .collect();
    let (s, by_hash) = svc
        .post(
            "/query_by_hash",
            json!({"block_hashes": hashes, "model_name": "m"}),
        )
        .await;
    assert_eq!((s, &by_hash), (StatusCode::OK, &v));
    let (s, _) = svc
        .post(
            "/query_by_hash",
            json!({"block_hashes": hashes, "model_name": "m", "cache_salt": "x"}),
        )
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    // Another namespace holds nothing.
    let (_, salted) = svc
        .post(
            "/query",
            json!({"token_ids": [1, 2, 3, 4], "model_name": "m", "cache_salt": "x"}),
        )
        .await;
    assert_eq!(salted["scores"], json!({}));
    // The Mooncake RFC's form.
    let (_, m) = svc
        .post("/query", json!({"token_ids": [1, 2, 3, 4], "model": "m"}))
        .await;
    assert_eq!(
        m,
        json!({"data": {"7": {"matched_tokens": 4, "L1": {"dp0": 4, "dp1": 2}, "L2": 4, "L3": 4}}})
    );
    // An unknown model or group.
    let (s, v) = svc
        .post("/query", json!({"token_ids": [1], "model_name": "x"}))
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{v}");
    let (s, _) = svc
        .post(
            "/query",
            json!({"token_ids": [1], "model_name": "m", "routing_group": "g"}),
        )
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);

    let (s, w) = svc.get("/workers?model_name=m").await;
    assert_eq!(s, StatusCode::OK);
    let w: Value = serde_json::from_str(&w).unwrap();
    assert_eq!(w.as_array().unwrap().len(), 1, "{w}");
    assert_eq!(w[0]["instance_id"], 7);
    assert_eq!(w[0]["status"], "active");
    assert_eq!(w[0]["endpoints"], json!({"0": a.endpoint, "1": b.endpoint}));
    assert_eq!(w[0]["listeners"]["0"]["blocks"], 2);
    let (_, none) = svc.get("/workers?model_name=x").await;
    assert_eq!(none, "[]");

    let (s, metrics) = svc.get("/metrics").await;
    assert_eq!(s, StatusCode::OK);
    for family in [
        "radixkv_index_events_total{model_name=\"m\",routing_group=\"default\",instance_id=\"7\",dp_rank=\"0\"} ",
        "radixkv_index_worker_blocks{model_name=\"m\",routing_group=\"default\",instance_id=\"7\",dp_rank=\"0\"} 2",
        "radixkv_index_held_blocks{model_name=\"m\",routing_group=\"default\"} 3",
        "radixkv_index_tree_nodes{model_name=\"m\",routing_group=\"default\"} ",
        "radixkv_index_query_duration_seconds_count{route=\"query_by_hash\"} 1",
        "radixkv_index_gaps_total{",
        "radixkv_index_worker_stale{",
    ] {
        assert!(metrics.contains(family), "{family} missing:\n{metrics}");
    }

    // Unregistering one rank, then the rest.
    let one =
        json!({"instance_id": 7, "model_name": "m", "routing_group": "default", "dp_rank": 1});
    assert_eq!(svc.post("/unregister", one.clone()).await.0, StatusCode::OK);
    assert_eq!(svc.post("/unregister", one).await.0, StatusCode::NOT_FOUND);
    let (_, v) = svc
        .post(
            "/query",
            json!({"token_ids": [1, 2, 3, 4], "model_name": "m"}),
        )
        .await;
    assert_eq!(v["scores"], json!({"7": {"0": 4}}));
    let all = json!({"instance_id": 7, "model_name": "m"});
    assert_eq!(svc.post("/unregister", all).await.0, StatusCode::OK);
    let (s, _) = svc
        .post("/query", json!({"token_ids": [1, 2], "model_name": "m"}))
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND, "the model's last worker left");
    // Registered again: what it still holds comes back from its replay
    // (its publisher still buffers those batches).
    assert_eq!(
        svc.post("/register", register(7, 0, &a, true)).await.0,
        StatusCode::CREATED
    );
    let q = json!({"token_ids": [1, 2, 3, 4], "model_name": "m"});
    svc.query_until(q, |v| v["scores"] == json!({"7": {"0": 4}}))
        .await;
}

/// Polls `/query` `q` until its scores are `want`, sending a probe before
/// each (the last batch again: dropped as a duplicate, but heard).
async fn scored(svc: &Service, p: &mut FramePublisher, q: &Value, want: Value) {
    let t = Instant::now();
    loop {
        p.publish(1, &[stored(&[10, 11], None, &[1, 2, 3, 4])], true)
            .await;
        let (_, v) = svc.post("/query", q.clone()).await;
        if v["scores"] == want {
            return;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "{v}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_worker_is_followed_and_a_silent_one_not_scored() {
    let options = RegistryOptions {
        silent_after: Some(Duration::from_millis(1500)),
        ..RegistryOptions::default()
    };
    let svc = Service::start(options).await;
    let (port, rport) = (free_port(), free_port());
    let mut p = FramePublisher::bind(port, rport).await.unwrap();
    assert_eq!(
        svc.post("/register", register(3, 0, &p, true)).await.0,
        StatusCode::CREATED
    );
    subscribed(&svc, &mut p, 3, 0).await;
    p.publish(1, &[stored(&[10, 11], None, &[1, 2, 3, 4])], true)
        .await;
    let q = json!({"token_ids": [1, 2, 3, 4], "model_name": "m"});
    scored(&svc, &mut p, &q, json!({"3": {"0": 4}})).await;
    // Silent past the limit: not scored, and reported (no probe is sent
    // now; one still on its way may postpone it).
    let t = Instant::now();
    loop {
        let (_, v) = svc.post("/query", q.clone()).await;
        let (_, w) = svc.get("/workers").await;
        let w: Value = serde_json::from_str(&w).unwrap();
        if v["scores"] == json!({}) && w[0]["listeners"]["0"]["silent"] == true {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "never silent: {v} {w}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // It speaks again: scored again.
    scored(&svc, &mut p, &q, json!({"3": {"0": 4}})).await;

    // The worker's process restarts: its sockets close, the same ports
    // are bound again, its sequence starts again at 0 with a clearing
    // and other blocks. The listener reconnects by itself.
    drop(p);
    let t = Instant::now();
    let mut p = loop {
        // The old sockets release their ports shortly after.
        match FramePublisher::bind(port, rport).await {
            Ok(p) => break p,
            Err(e) => assert!(t.elapsed() < Duration::from_secs(30), "{e}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let t = Instant::now();
    loop {
        p.publish(0, &[KvEvent::AllBlocksCleared], true).await;
        p.publish(1, &[stored(&[50], None, &[9, 9])], true).await;
        let (_, v) = svc
            .post("/query", json!({"token_ids": [9, 9], "model_name": "m"}))
            .await;
        if v["scores"] == json!({"3": {"0": 2}}) {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "the restart was never followed: {v}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (_, v) = svc.post("/query", q).await;
    assert_eq!(
        v["scores"],
        json!({}),
        "what it held before the restart is gone"
    );
}

/// A batch payload of map-encoded events built by hand.
fn payload(events: Vec<rmpv::Value>) -> Bytes {
    let batch = rmpv::Value::Array(vec![0.0f64.into(), rmpv::Value::Array(events), 0.into()]);
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, &batch).unwrap();
    Bytes::from(out)
}

fn map_event(kind: &str, fields: Vec<(&str, rmpv::Value)>) -> rmpv::Value {
    let mut m = vec![("type".into(), kind.into())];
    m.extend(fields.into_iter().map(|(k, v)| (k.into(), v)));
    rmpv::Value::Map(m)
}

fn store_value(hash: u64, parent: Option<u64>, tokens: &[u64]) -> rmpv::Value {
    map_event(
        "BlockStored",
        vec![
            ("block_hashes", rmpv::Value::Array(vec![hash.into()])),
            (
                "parent_block_hash",
                parent.map_or(rmpv::Value::Nil, Into::into),
            ),
            (
                "token_ids",
                rmpv::Value::Array(tokens.iter().map(|&t| t.into()).collect()),
            ),
            ("block_size", 2.into()),
            ("lora_id", rmpv::Value::Nil),
            ("medium", "GPU".into()),
        ],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_counted_and_the_rest_keeps_serving() {
    let svc = Service::start(RegistryOptions::default()).await;
    let mut p = FramePublisher::bind(free_port(), free_port())
        .await
        .unwrap();
    assert_eq!(
        svc.post("/register", register(4, 0, &p, true)).await.0,
        StatusCode::CREATED
    );
    // A worker whose endpoint nobody answers: registered, never ready.
    let silent = json!({
        "instance_id": 5, "endpoint": format!("tcp://127.0.0.1:{}", free_port()),
        "model_name": "m", "block_size": 2,
    });
    assert_eq!(svc.post("/register", silent).await.0, StatusCode::CREATED);
    subscribed(&svc, &mut p, 4, 0).await;
    assert_eq!(svc.get("/health").await.0, StatusCode::SERVICE_UNAVAILABLE);

    let seq = |s: u64| Bytes::copy_from_slice(&s.to_be_bytes());
    // Junk: one frame; a payload that is not msgpack; msgpack that is not
    // a batch (none consumes a sequence number).
    p.raw(vec![Bytes::from_static(b"junk")]).await;
    p.raw(vec![Bytes::new(), seq(1), Bytes::from_static(&[0xc1])])
        .await;
    p.raw(vec![Bytes::new(), seq(1), Bytes::from_static(&[0x01])])
        .await;
    // Batch 1: an unknown event type, a removal of a block never stored, a
    // store below an unknown parent, a token id past u32 — and one good
    // store, which stands.
    let bad = payload(vec![
        map_event("BlockTeleported", vec![]),
        map_event(
            "BlockRemoved",
            vec![("block_hashes", rmpv::Value::Array(vec![999u64.into()]))],
        ),
        store_value(30, Some(777), &[5, 6]),
        store_value(31, None, &[1, 1u64 << 33]),
        store_value(10, None, &[1, 2]),
    ]);
    p.raw(vec![Bytes::new(), seq(1), bad]).await;
    let q = json!({"token_ids": [1, 2], "model_name": "m"});
    svc.query_until(q, |v| v["scores"] == json!({"4": {"0": 2}}))
        .await;
    let t = Instant::now();
    loop {
        let (_, m) = svc.get("/metrics").await;
        let value = |family: &str| {
            let prefix = format!("radixkv_index_{family}{{model_name=\"m\",routing_group=\"default\",instance_id=\"4\",dp_rank=\"0\"}} ");
            m.lines()
                .find_map(|l| l.strip_prefix(&prefix))
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        // The junk with a sequence frame is counted by the listener;
        // the one-frame message by the socket reader.
        if value("junk_messages_total") >= 3 && value("skipped_events_total") >= 4 {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "not counted: junk {}, skipped {}",
            value("junk_messages_total"),
            value("skipped_events_total")
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The other worker's registration stands, unanswered.
    let (_, w) = svc.get("/workers").await;
    let w: Value = serde_json::from_str(&w).unwrap();
    let five = w
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["instance_id"] == 5)
        .unwrap();
    assert_eq!(five["status"], "pending", "{w}");
}
