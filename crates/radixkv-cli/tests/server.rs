//! `radixkv serve`: the HTTP front end, end to end. Each test starts a
//! server on 127.0.0.1 with an ephemeral port (in process, or the binary
//! for the signal test) and talks to it with a real HTTP client.

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use radixkv_engine::simulator::{CostModel, SimulatedBackend};
use radixkv_engine::{Engine, EngineConfig};
use radixkv_server::{Server, ServerConfig, ServerError, ShutdownReport};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// A client of one server.
struct Http {
    addr: SocketAddr,
    client: HttpClient,
}

/// A server running in this process, and a client of it.
struct TestServer {
    http: Http,
    stop: Option<oneshot::Sender<()>>,
    handle: JoinHandle<Result<ShutdownReport, ServerError>>,
}

impl std::ops::Deref for TestServer {
    type Target = Http;
    fn deref(&self) -> &Http {
        &self.http
    }
}

fn engine_cfg(devices: usize, pages: usize) -> EngineConfig {
    EngineConfig {
        devices,
        page_size: 16,
        pages_per_device: pages,
        ..EngineConfig::default()
    }
}

/// Starts a server; `speedup` scales the simulated GPUs (1: a token every
/// ~6 ms; 50: every ~0.1 ms).
async fn start(ecfg: EngineConfig, scfg: ServerConfig, speedup: f64) -> TestServer {
    let backend = Arc::new(SimulatedBackend::new(CostModel::default(), speedup));
    let engine = Engine::start(ecfg, backend).expect("engine");
    let server = Server::bind("127.0.0.1:0".parse().unwrap(), engine, scfg)
        .await
        .expect("bind");
    let addr = server.local_addr().expect("addr");
    let (tx, rx) = oneshot::channel::<()>();
    let handle = tokio::spawn(server.run(async move {
        let _ = rx.await;
    }));
    TestServer {
        http: Http::new(addr),
        stop: Some(tx),
        handle,
    }
}

async fn start_default() -> TestServer {
    start(engine_cfg(2, 512), ServerConfig::default(), 50.0).await
}

struct Reply {
    status: StatusCode,
    headers: hyper::HeaderMap,
    body: String,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }

    /// The error message of a JSON error body.
    fn error(&self) -> String {
        let v = self.json();
        assert_eq!(v["error"]["code"], self.status.as_u16(), "{v}");
        v["error"]["message"]
            .as_str()
            .unwrap_or_else(|| panic!("no message: {v}"))
            .to_string()
    }
}

impl Http {
    fn new(addr: SocketAddr) -> Http {
        Http {
            addr,
            client: Client::builder(TokioExecutor::new()).build_http(),
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    async fn send(&self, method: &str, path: &str, body: Vec<u8>) -> Response<Incoming> {
        self.send_auth(method, path, body, None).await
    }

    /// `send`, with `Authorization: Bearer <key>` when given.
    async fn send_auth(
        &self,
        method: &str,
        path: &str,
        body: Vec<u8>,
        key: Option<&str>,
    ) -> Response<Incoming> {
        let mut b = Request::builder()
            .method(method)
            .uri(self.url(path))
            .header("content-type", "application/json");
        if let Some(k) = key {
            b = b.header("authorization", format!("Bearer {k}"));
        }
        let req = b.body(Full::new(Bytes::from(body))).unwrap();
        self.client.request(req).await.expect("request")
    }

    async fn call(&self, method: &str, path: &str, body: Vec<u8>) -> Reply {
        self.call_auth(method, path, body, None).await
    }

    /// `call`, with `Authorization: Bearer <key>` when given.
    async fn call_auth(&self, method: &str, path: &str, body: Vec<u8>, key: Option<&str>) -> Reply {
        let r = self.send_auth(method, path, body, key).await;
        let status = r.status();
        let headers = r.headers().clone();
        let bytes = r.into_body().collect().await.expect("body").to_bytes();
        Reply {
            status,
            headers,
            body: String::from_utf8_lossy(&bytes).into_owned(),
        }
    }

    async fn post(&self, body: Value) -> Reply {
        self.call("POST", "/v1/completions", body.to_string().into_bytes())
            .await
    }

    async fn post_raw(&self, body: &str) -> Reply {
        self.call("POST", "/v1/completions", body.as_bytes().to_vec())
            .await
    }

    async fn get(&self, path: &str) -> Reply {
        self.call("GET", path, Vec::new()).await
    }

    async fn stats(&self) -> Value {
        let r = self.get("/stats").await;
        assert_eq!(r.status, StatusCode::OK);
        r.json()
    }

    /// Polls `/stats` until `audit_ok` (idle, nothing pinned, audit
    /// passes); panics after 10 s.
    async fn wait_idle(&self) -> Value {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let s = self.stats().await;
            if s["audit_ok"] == true {
                return s;
            }
            assert!(Instant::now() < deadline, "never idle and clean: {s:#}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl TestServer {
    async fn shutdown(mut self) -> ShutdownReport {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        tokio::time::timeout(Duration::from_secs(15), self.handle)
            .await
            .expect("shutdown in time")
            .expect("server task")
            .expect("server")
    }
}

/// The data payloads of a server-sent-event body, one at a time.
struct Sse {
    body: Incoming,
    buf: String,
}

impl Sse {
    fn new(r: Response<Incoming>) -> Sse {
        assert_eq!(r.status(), StatusCode::OK);
        let ct = r.headers()["content-type"].to_str().unwrap().to_string();
        assert!(ct.starts_with("text/event-stream"), "{ct}");
        Sse {
            body: r.into_body(),
            buf: String::new(),
        }
    }

    /// The next event's data, `None` at the end of the body.
    async fn next(&mut self) -> Option<String> {
        loop {
            while let Some(i) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..i + 2).collect();
                let data: Vec<&str> = block
                    .lines()
                    .filter_map(|l| l.strip_prefix("data:"))
                    .map(|d| d.strip_prefix(' ').unwrap_or(d))
                    .collect();
                if !data.is_empty() {
                    return Some(data.join("\n"));
                }
            }
            let frame = self.body.frame().await?.expect("body frame");
            if let Ok(d) = frame.into_data() {
                self.buf.push_str(std::str::from_utf8(&d).expect("utf-8"));
            }
        }
    }

    /// Every remaining event's data.
    async fn rest(&mut self) -> Vec<String> {
        let mut v = Vec::new();
        while let Some(d) = self.next().await {
            v.push(d);
        }
        v
    }
}

fn sum(stats: &Value, field: &str) -> u64 {
    stats["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d[field].as_u64().unwrap())
        .sum()
}

#[tokio::test]
async fn completion_returns_text_and_usage() {
    let s = start_default().await;
    let r = s
        .post(json!({"prompt": "hello world", "max_tokens": 5}))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert!(r.headers["content-type"]
        .to_str()
        .unwrap()
        .starts_with("application/json"));
    let v = r.json();
    assert_eq!(v["object"], "text_completion");
    assert!(v["id"].as_str().unwrap().starts_with("cmpl-"));
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "length");
    assert_eq!(choice["text"].as_str().unwrap().chars().count(), 5);
    let u = &v["usage"];
    assert_eq!(u["prompt_tokens"], 11);
    assert_eq!(u["completion_tokens"], 5);
    assert_eq!(u["total_tokens"], 16);
    assert_eq!(
        u["cached_tokens"],
        u["prompt_tokens_details"]["cached_tokens"]
    );
    // A model this server does not serve: OpenAI's 404 `model_not_found`.
    let r = s.post(json!({"prompt": "a", "model": "m"})).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.body);
    assert_eq!(r.json()["error"]["code"], "model_not_found", "{}", r.body);
    // A prompt of token ids; max_tokens defaults to 16.
    let r = s
        .post(json!({"prompt": [1, 2, 3, 70000], "model": "radixkv-sim"}))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let v = r.json();
    assert_eq!(v["model"], "radixkv-sim");
    assert_eq!(v["usage"]["prompt_tokens"], 4);
    assert_eq!(v["usage"]["completion_tokens"], 16);
    s.wait_idle().await;
    let report = s.shutdown().await;
    assert!(report.drained);
    assert_eq!(report.engine.expect("engine report").devices.len(), 2);
}

#[tokio::test]
async fn streaming_sends_one_event_per_token_then_done() {
    let s = start_default().await;
    let body = json!({"prompt": "stream me", "max_tokens": 7, "stream": true,
                      "stream_options": {"include_usage": true}});
    let mut sse = Sse::new(
        s.send("POST", "/v1/completions", body.to_string().into_bytes())
            .await,
    );
    let events = sse.rest().await;
    assert_eq!(events.len(), 7 + 2, "{events:?}");
    assert_eq!(events.last().unwrap(), "[DONE]");
    let mut text = String::new();
    for (i, e) in events[..7].iter().enumerate() {
        let v: Value = serde_json::from_str(e).unwrap();
        assert_eq!(v["object"], "text_completion");
        let c = &v["choices"][0];
        text.push_str(c["text"].as_str().unwrap());
        let want = if i == 6 { json!("length") } else { Value::Null };
        assert_eq!(c["finish_reason"], want, "{e}");
    }
    assert_eq!(text.chars().count(), 7);
    let usage: Value = serde_json::from_str(&events[7]).unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["prompt_tokens"], 9);
    assert_eq!(usage["usage"]["completion_tokens"], 7);
    // Without include_usage: tokens, then [DONE].
    let body = json!({"prompt": "again", "max_tokens": 3, "stream": true});
    let mut sse = Sse::new(
        s.send("POST", "/v1/completions", body.to_string().into_bytes())
            .await,
    );
    let events = sse.rest().await;
    assert_eq!(events.len(), 4, "{events:?}");
    assert_eq!(events[3], "[DONE]");
    s.wait_idle().await;
}

#[tokio::test]
async fn cached_tokens_grow_on_a_repeated_prefix() {
    let s = start_default().await;
    let system = "You are a helpful assistant. ".repeat(8); // 232 bytes
    let ask = |q: &str, salt: Option<&str>, stream: bool| {
        let mut b = json!({"prompt": format!("{system}{q}"), "max_tokens": 4});
        if let Some(salt) = salt {
            b["cache_salt"] = json!(salt);
        }
        if stream {
            b["stream"] = json!(true);
            b["stream_options"] = json!({"include_usage": true});
        }
        b
    };
    let cached = |r: &Reply| {
        assert_eq!(r.status, StatusCode::OK, "{}", r.body);
        r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
    };
    let first = cached(&s.post(ask("What is 2+2?", None, false)).await);
    assert_eq!(first, 0);
    let second = cached(&s.post(ask("Name a colour.", None, false)).await);
    assert!(
        second >= 224,
        "the shared 232-byte prefix (14 whole pages) is cached: {second}"
    );
    // Another namespace shares nothing.
    let salted = cached(&s.post(ask("Name a colour.", Some("tenant-b"), false)).await);
    assert_eq!(salted, 0);
    // Streaming clients see it in the usage chunk.
    let body = ask("Count to three.", None, true).to_string().into_bytes();
    let events = Sse::new(s.send("POST", "/v1/completions", body).await)
        .rest()
        .await;
    let usage: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    assert!(
        usage["usage"]["cached_tokens"].as_u64().unwrap() >= 224,
        "{usage}"
    );
    let st = s.wait_idle().await;
    assert_eq!(
        sum(&st, "cached_tokens"),
        second + usage["usage"]["cached_tokens"].as_u64().unwrap(),
        "{st:#}"
    );
}

fn metric(text: &str, name: &str, labels: &str) -> f64 {
    let prefix = format!("{name}{{{labels}}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no {prefix} in\n{text}"))
        .parse()
        .unwrap()
}

/// The latency histogram families of `/metrics`.
const LATENCY_FAMILIES: [&str; 5] = [
    "radixkv_ttft_seconds",
    "radixkv_e2e_seconds",
    "radixkv_match_seconds",
    "radixkv_insert_seconds",
    "radixkv_evict_seconds",
];

/// Checks that `family` is a histogram with, for `device`, cumulative
/// `_bucket` lines at increasing bounds ending in `le="+Inf"`, equal to
/// its `_count`, and a `_sum`; returns the count.
fn histogram(text: &str, family: &str, device: &str) -> f64 {
    assert!(
        text.lines()
            .any(|l| l == format!("# TYPE {family} histogram")),
        "{family} is no histogram in\n{text}"
    );
    let prefix = format!("{family}_bucket{{le=\"");
    let suffix = format!("\",device=\"{device}\"}} ");
    let buckets: Vec<(String, f64)> = text
        .lines()
        .filter_map(|l| l.strip_prefix(prefix.as_str()))
        .filter_map(|l| l.split_once(suffix.as_str()))
        .map(|(le, n)| (le.to_string(), n.parse().unwrap()))
        .collect();
    assert!(buckets.len() >= 2, "{family}\n{text}");
    let (last, inf) = buckets.last().unwrap();
    assert_eq!(last, "+Inf", "{family}\n{text}");
    assert!(
        buckets.windows(2).all(|w| w[0].1 <= w[1].1),
        "{family}\n{text}"
    );
    let bounds: Vec<f64> = buckets[..buckets.len() - 1]
        .iter()
        .map(|(le, _)| le.parse().unwrap())
        .collect();
    assert!(bounds.windows(2).all(|w| w[0] < w[1]), "{family}\n{text}");
    let labels = format!("device=\"{device}\"");
    let count = metric(text, &format!("{family}_count"), &labels);
    assert_eq!(*inf, count, "{family}\n{text}");
    let sum = metric(text, &format!("{family}_sum"), &labels);
    assert!(
        sum >= 0.0 && (count > 0.0 || sum == 0.0),
        "{family}\n{text}"
    );
    count
}

fn metric_sum(text: &str, name: &str, contains: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains(contains))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum()
}

#[tokio::test]
async fn metrics_and_stats_move() {
    let s = start(engine_cfg(1, 256), ServerConfig::default(), 50.0).await;
    let before = s.get("/metrics").await;
    assert_eq!(before.status, StatusCode::OK);
    assert!(before.headers["content-type"]
        .to_str()
        .unwrap()
        .starts_with("application/openmetrics-text; version=1.0.0"));
    let m = &before.body;
    assert!(m.ends_with("# EOF\n"), "{m}");
    assert_eq!(
        metric(
            m,
            "radixkv_requests_total",
            "device=\"0\",outcome=\"finished\""
        ),
        0.0
    );
    assert_eq!(
        metric(m, "radixkv_pool_pages", "device=\"0\",state=\"free\""),
        255.0
    );
    for family in [
        "# TYPE radixkv_ttft_seconds histogram",
        "# TYPE radixkv_e2e_seconds histogram",
        "# TYPE radixkv_match_seconds histogram",
        "# TYPE radixkv_insert_seconds histogram",
        "# TYPE radixkv_evict_seconds histogram",
        "# TYPE radixkv_evictions counter",
        "# TYPE radixkv_requests counter",
        "# TYPE radixkv_cache_hit_rate gauge",
    ] {
        assert!(m.lines().any(|l| l == family), "{family}");
    }
    // Every device's histogram series exists before its first request.
    for family in LATENCY_FAMILIES {
        assert_eq!(histogram(m, family, "0"), 0.0, "{family}");
    }
    let prompt = "x".repeat(100);
    for _ in 0..2 {
        let r = s.post(json!({"prompt": prompt, "max_tokens": 3})).await;
        assert_eq!(r.status, StatusCode::OK);
    }
    let st = s.wait_idle().await;
    assert_eq!(sum(&st, "finished"), 2);
    assert_eq!(sum(&st, "prompt_tokens"), 200);
    assert_eq!(sum(&st, "output_tokens"), 6);
    assert!(sum(&st, "cached_tokens") >= 96, "{st:#}");
    // 2 completions, the first /metrics, and /stats polls.
    assert!(
        st["http"]["responses"]["200"].as_u64().unwrap() >= 3,
        "{st:#}"
    );
    let m = s.get("/metrics").await.body;
    assert_eq!(
        metric(
            &m,
            "radixkv_requests_total",
            "device=\"0\",outcome=\"finished\""
        ),
        2.0
    );
    assert_eq!(
        metric(&m, "radixkv_prompt_tokens_total", "device=\"0\""),
        200.0
    );
    // All five latencies are real histograms (cumulative `_bucket{le=...}`
    // lines ending in `+Inf` = `_count`), read from the engine's and the
    // cache's one record of each: TTFT and e2e count the finished requests.
    let completed = sum(&st, "finished") as f64;
    assert_eq!(completed, 2.0);
    let counts: Vec<f64> = LATENCY_FAMILIES
        .iter()
        .map(|f| histogram(&m, f, "0"))
        .collect();
    assert_eq!(counts[0], completed, "ttft\n{m}");
    assert_eq!(counts[1], completed, "e2e\n{m}");
    assert!(counts[2] >= 2.0, "match\n{m}");
    assert!(counts[3] >= 1.0, "insert\n{m}");
    assert!(metric(&m, "radixkv_ttft_seconds_sum", "device=\"0\"") > 0.0);
    assert!(metric(&m, "radixkv_e2e_seconds_sum", "device=\"0\"") > 0.0);
    assert!(metric(&m, "radixkv_match_seconds_sum", "device=\"0\"") > 0.0);
    // Each request's e2e includes its TTFT, so the sums keep that order.
    assert!(
        metric(&m, "radixkv_e2e_seconds_sum", "device=\"0\"")
            >= metric(&m, "radixkv_ttft_seconds_sum", "device=\"0\""),
        "{m}"
    );
    // No quantile gauges or call counters beside the histograms.
    assert!(!m.contains("quantile=\""), "{m}");
    assert!(!m.contains("radixkv_matches_total"), "{m}");
    assert!(metric(&m, "radixkv_cache_hit_rate", "device=\"0\"") > 0.4);
    assert!(metric(&m, "radixkv_pool_pages", "device=\"0\",state=\"used\"") > 0.0);
    assert!(metric_sum(&m, "radixkv_http_responses_total", "code=\"200\"") >= 4.0);
}

#[tokio::test]
async fn health_unknown_paths_and_methods() {
    let s = start_default().await;
    let r = s.get("/health").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.json()["status"], "ok");
    let r = s.get("/v2/nothing").await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert!(r.error().contains("/v2/nothing"));
    let r = s.get("/v1/completions").await;
    assert_eq!(r.status, StatusCode::METHOD_NOT_ALLOWED);
    r.error();
}

#[tokio::test]
async fn bad_input_is_a_400_with_a_message() {
    // 64 pages of 16 tokens: requests hold at most 1,008 tokens.
    let s = start(engine_cfg(2, 64), ServerConfig::default(), 50.0).await;
    let cases: Vec<(&str, String)> = vec![
        ("malformed JSON", r#"{"prompt": "a", "max_tokens": "#.into()),
        ("malformed JSON", "not json".into()),
        ("object", "[1, 2]".into()),
        ("required", r#"{"max_tokens": 3}"#.into()),
        ("`prompt` must be", r#"{"prompt": 42}"#.into()),
        ("prompt[1]", r#"{"prompt": [1, "x"]}"#.into()),
        ("prompt[0]", r#"{"prompt": [-1]}"#.into()),
        ("empty", r#"{"prompt": ""}"#.into()),
        (
            "max_tokens",
            r#"{"prompt": "a", "max_tokens": "many"}"#.into(),
        ),
        (
            "between 1 and 4096",
            r#"{"prompt": "a", "max_tokens": 0}"#.into(),
        ),
        (
            "between 1 and 4096",
            r#"{"prompt": "a", "max_tokens": 4097}"#.into(),
        ),
        (
            "`stream` must be a boolean",
            r#"{"prompt": "a", "stream": 1}"#.into(),
        ),
        ("cache_salt", r#"{"prompt": "a", "cache_salt": []}"#.into()),
        (
            "KV pool",
            json!({"prompt": "p".repeat(1000), "max_tokens": 16}).to_string(),
        ),
    ];
    for (want, body) in &cases {
        let r = s.post_raw(body).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{body}: {}", r.body);
        let msg = r.error();
        assert!(msg.contains(want), "{body}: {msg:?} lacks {want:?}");
        assert_eq!(r.json()["error"]["type"], "invalid_request_error");
    }
    // The longest prompt that fits is accepted.
    let r = s
        .post(json!({"prompt": "p".repeat(1008 - 16 - 16), "max_tokens": 16}))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let st = s.wait_idle().await;
    assert_eq!(st["http"]["responses"]["400"], cases.len(), "{st:#}");
}

#[tokio::test]
async fn oversized_body_is_a_413() {
    let cfg = ServerConfig {
        max_body_bytes: 64 << 10,
        ..ServerConfig::default()
    };
    let s = start(engine_cfg(1, 256), cfg, 50.0).await;
    let body = json!({"prompt": "y".repeat(200_000), "max_tokens": 1}).to_string();
    let r = s.post_raw(&body).await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE, "{}", r.body);
    assert!(r.error().contains("65536"));
    // Under the limit, the same server answers.
    let r = s
        .post(json!({"prompt": "y".repeat(500), "max_tokens": 1}))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
}

#[tokio::test]
async fn a_full_admission_queue_answers_429_with_retry_after() {
    let cfg = ServerConfig {
        max_queue: 1,
        ..ServerConfig::default()
    };
    let s = start(engine_cfg(1, 512), cfg, 1.0).await;
    let body = json!({"prompt": "slow", "max_tokens": 2000, "stream": true}).to_string();
    let mut sse = Sse::new(s.send("POST", "/v1/completions", body.into_bytes()).await);
    assert!(sse.next().await.is_some());
    let r = s.post(json!({"prompt": "next", "max_tokens": 1})).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{}", r.body);
    assert_eq!(r.headers["retry-after"], "1");
    assert!(r.error().contains("busy"));
    drop(sse); // disconnect: cancels the slow request
    let st = s.wait_idle().await;
    assert_eq!(st["http"]["rejected_busy"], 1);
    let r = s.post(json!({"prompt": "next", "max_tokens": 1})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
}

#[tokio::test]
async fn a_client_disconnect_mid_stream_releases_pages_and_pins() {
    let s = start(engine_cfg(1, 512), ServerConfig::default(), 1.0).await;
    let body = json!({"prompt": "q".repeat(300), "max_tokens": 3000, "stream": true});
    let mut sse = Sse::new(
        s.send("POST", "/v1/completions", body.to_string().into_bytes())
            .await,
    );
    for _ in 0..3 {
        assert!(sse.next().await.is_some());
    }
    // Running: its prompt is pinned and its pages held.
    let st = s.stats().await;
    assert_eq!(st["audit_ok"], false);
    assert_eq!(st["outstanding"], 1, "{st:#}");
    assert!(st["pinned_tokens"].as_u64().unwrap() >= 288, "{st:#}");
    drop(sse);
    let st = s.wait_idle().await;
    assert_eq!(st["pinned_tokens"], 0);
    assert_eq!(st["outstanding"], 0);
    assert_eq!(sum(&st, "failed"), 1, "cancelled, not finished: {st:#}");
    assert_eq!(sum(&st, "finished"), 0, "{st:#}");
    assert_eq!(st["http"]["disconnects"], 1, "{st:#}");
    // The pages it held are free again (what stays used is cached).
    let pages_used = sum(&st, "pages_used");
    let tree_tokens = sum(&st, "tree_tokens");
    assert_eq!(pages_used * 16, tree_tokens, "{st:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_concurrent_clients() {
    let s = Arc::new(start(engine_cfg(4, 1024), ServerConfig::default(), 50.0).await);
    let started = Instant::now();
    let tasks: Vec<_> = (0..100)
        .map(|i| {
            let s = Arc::clone(&s);
            tokio::spawn(async move {
                let prompt = format!("{}{i}", format!("group {} ", i % 10).repeat(20));
                if i % 2 == 0 {
                    let r = s.post(json!({"prompt": prompt, "max_tokens": 8})).await;
                    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
                    assert_eq!(r.json()["usage"]["completion_tokens"], 8);
                } else {
                    let body = json!({"prompt": prompt, "max_tokens": 8, "stream": true});
                    let events = Sse::new(
                        s.send("POST", "/v1/completions", body.to_string().into_bytes())
                            .await,
                    )
                    .rest()
                    .await;
                    assert_eq!(events.len(), 9);
                    assert_eq!(events[8], "[DONE]");
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("client");
    }
    assert!(started.elapsed() < Duration::from_secs(120));
    let st = s.wait_idle().await;
    assert_eq!(sum(&st, "finished"), 100);
    assert_eq!(sum(&st, "failed"), 0);
    assert!(sum(&st, "cached_tokens") > 0);
    assert_eq!(st["http"]["rejected_busy"], 0, "{st:#}");
}

#[tokio::test]
async fn shutdown_drains_in_flight_requests() {
    let s = start(engine_cfg(2, 512), ServerConfig::default(), 5.0).await;
    let mut streams = Vec::new();
    for i in 0..4 {
        let body = json!({"prompt": format!("drain {i}"), "max_tokens": 150, "stream": true});
        let mut sse = Sse::new(
            s.send("POST", "/v1/completions", body.to_string().into_bytes())
                .await,
        );
        assert!(sse.next().await.is_some());
        streams.push(sse);
    }
    let addr = s.addr;
    let health = Http::new(addr);
    let _ = s.stop.unwrap().send(());
    // While the streams go on, a new client learns that the server drains.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = health.get("/health").await;
        if r.status == StatusCode::SERVICE_UNAVAILABLE {
            assert_eq!(r.json()["status"], "draining");
            break;
        }
        assert!(Instant::now() < deadline, "never draining: {}", r.body);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for mut sse in streams {
        let rest = sse.rest().await;
        assert_eq!(rest.len(), 149 + 1, "the whole stream");
        assert_eq!(rest.last().unwrap(), "[DONE]");
    }
    // Then the listener closes.
    while tokio::net::TcpStream::connect(addr).await.is_ok() {
        assert!(Instant::now() < deadline, "still accepting");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let report = tokio::time::timeout(Duration::from_secs(60), s.handle)
        .await
        .expect("in time")
        .unwrap()
        .unwrap();
    assert!(report.drained);
    assert_eq!(report.abandoned, 0);
    let engine = report.engine.expect("engine shut down");
    let decode: u64 = engine
        .devices
        .iter()
        .map(|d| d.scheduler.decode_passes)
        .sum();
    assert!(decode >= 149, "{decode}");
}

#[tokio::test]
async fn a_timed_out_drain_stops_the_stragglers() {
    let cfg = ServerConfig {
        drain_timeout: Duration::from_millis(200),
        ..ServerConfig::default()
    };
    let s = start(engine_cfg(1, 512), cfg, 1.0).await;
    let body = json!({"prompt": "straggler", "max_tokens": 3000, "stream": true});
    let mut sse = Sse::new(
        s.send("POST", "/v1/completions", body.to_string().into_bytes())
            .await,
    );
    assert!(sse.next().await.is_some());
    let t = Instant::now();
    let report = s.shutdown().await;
    assert!(t.elapsed() < Duration::from_secs(5));
    assert!(!report.drained);
    assert_eq!(report.abandoned, 1);
    // The stream ends early: an error event, then [DONE].
    let rest = tokio::time::timeout(Duration::from_secs(5), sse.rest())
        .await
        .expect("the stream ends");
    assert!(rest.len() < 3000, "{}", rest.len());
    assert_eq!(rest.last().map(String::as_str), Some("[DONE]"));
    let err: Value = serde_json::from_str(&rest[rest.len() - 2]).unwrap();
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("stopped"),
        "{err}"
    );
}

/// Starts the binary, `radixkv serve --port 0 ARGS`, and a client of it.
#[cfg(unix)]
async fn spawn_binary(args: &[&str]) -> (std::process::Child, Http) {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    let mut child = Command::new(env!("CARGO_BIN_EXE_radixkv"))
        .args(["serve", "--port", "0"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start radixkv serve");
    let stdout = child.stdout.take().unwrap();
    let line = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).map(|_| line)
    })
    .await
    .unwrap()
    .unwrap();
    let addr: SocketAddr = line
        .trim()
        .rsplit("http://")
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no address in {line:?}"));
    (child, Http::new(addr))
}

/// Sends SIGTERM to the process `pid`.
#[cfg(unix)]
fn sigterm(pid: u32) {
    let kill = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .expect("kill");
    assert!(kill.success());
}

/// Sends SIGTERM and waits (at most 10 s) for the exit.
#[cfg(unix)]
async fn terminate(child: std::process::Child) -> std::process::ExitStatus {
    sigterm(child.id());
    wait_exit(child, Duration::from_secs(10))
        .await
        .expect("radixkv serve did not exit after SIGTERM")
}

/// Waits (at most `within`) for `child` to exit; `None` (and the child
/// killed) if it did not.
#[cfg(unix)]
async fn wait_exit(
    mut child: std::process::Child,
    within: Duration,
) -> Option<std::process::ExitStatus> {
    tokio::task::spawn_blocking(move || {
        let deadline = Instant::now() + within;
        loop {
            if let Some(st) = child.try_wait().expect("wait") {
                return Some(st);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    })
    .await
    .unwrap()
}

/// The binary: `--watermarks LOW,HIGH` is taken; SIGTERM drains the
/// in-flight stream and exits 0.
#[cfg(unix)]
#[tokio::test]
async fn sigterm_drains_and_exits_zero() {
    let args = [
        "--devices",
        "1",
        "--pages-per-device",
        "256",
        "--speedup",
        "5",
        "--watermarks",
        "16,64",
    ];
    let (child, s) = spawn_binary(&args).await;
    // `--watermarks LOW,HIGH`, as documented, reaches the cache.
    let config = s.get("/admin/config").await;
    assert_eq!(
        config.json()["watermarks"],
        json!([16, 64]),
        "{}",
        config.body
    );
    let body = json!({"prompt": "bye", "max_tokens": 100, "stream": true});
    let mut sse = Sse::new(
        s.send("POST", "/v1/completions", body.to_string().into_bytes())
            .await,
    );
    assert!(sse.next().await.is_some());
    let exit = tokio::spawn(terminate(child));
    let rest = sse.rest().await;
    assert_eq!(rest.len(), 99 + 1);
    assert_eq!(rest.last().unwrap(), "[DONE]");
    let status = exit.await.unwrap();
    assert!(status.success(), "{status}");
}

/// A second signal during the drain ends it at once (the drain would
/// otherwise wait ten minutes for the slow stream), and the stream ends
/// instead of hanging. (That no second signal is missed however soon it
/// comes is `radixkv-server`'s `tests/signals.rs`.)
#[cfg(unix)]
#[tokio::test]
async fn a_second_signal_ends_the_drain() {
    let args = [
        "--devices",
        "1",
        "--pages-per-device",
        "256",
        "--speedup",
        "0.05",
        "--drain-timeout-s",
        "600",
    ];
    let (child, s) = spawn_binary(&args).await;
    let body = json!({"prompt": "stay a while", "max_tokens": 500, "stream": true});
    let mut sse = Sse::new(
        s.send("POST", "/v1/completions", body.to_string().into_bytes())
            .await,
    );
    assert!(sse.next().await.is_some(), "the stream started");
    sigterm(child.id());
    // The first signal was taken: the server drains.
    let t = Instant::now();
    while s.get("/health").await.status != StatusCode::SERVICE_UNAVAILABLE {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "no drain after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    sigterm(child.id());
    let status = wait_exit(child, Duration::from_secs(30))
        .await
        .expect("the second signal did not end the drain within 30 s");
    assert!(status.success(), "{status}");
    let rest = tokio::time::timeout(Duration::from_secs(10), sse.rest())
        .await
        .expect("the stream ended");
    assert!(rest.len() < 500, "stopped early: {} events", rest.len());
}

/// The binary with `--model tiny`: real compute behind the same API.
#[cfg(unix)]
#[tokio::test]
async fn serves_the_tiny_model() {
    let (child, s) = spawn_binary(&["--model", "tiny", "--devices", "1"]).await;
    let prompt = "The tiny model reads every byte of this.";
    let mut texts = Vec::new();
    for want_cached in [0, 32] {
        let r = s
            .post(json!({"prompt": prompt, "max_tokens": 6, "temperature": 0}))
            .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.body);
        let v = r.json();
        assert_eq!(v["model"], "radixkv-tiny");
        assert_eq!(v["usage"]["completion_tokens"], 6);
        assert_eq!(v["usage"]["cached_tokens"], want_cached, "{v}");
        texts.push(v["choices"][0]["text"].as_str().unwrap().to_string());
    }
    // Greedy decoding over reused K/V gives the same text.
    assert_eq!(texts[0], texts[1]);
    // Sampling: the same seed gives the same text, another seed another
    // (the tiny model's logits are spread enough for 6 tokens to differ).
    let sampled = |seed: u64| {
        let s = &s;
        async move {
            let body = json!({"prompt": prompt, "max_tokens": 6, "temperature": 1.5, "seed": seed});
            let v = s.post(body).await.json();
            v["choices"][0]["text"].as_str().unwrap().to_string()
        }
    };
    let (a, b, c) = (sampled(7).await, sampled(7).await, sampled(8).await);
    assert_eq!(a, b);
    assert_ne!(a, c);
    assert_eq!(s.wait_idle().await["audit_ok"], true);
    assert!(terminate(child).await.success());
}

// ------------------------------------------------------------ the OpenAI surface

impl Http {
    async fn post_to(&self, path: &str, body: Value) -> Reply {
        self.call("POST", path, body.to_string().into_bytes()).await
    }
}

#[tokio::test]
async fn models_list_the_served_model() {
    let s = start_default().await;
    let r = s.get("/v1/models").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let v = r.json();
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"][0]["id"], "radixkv-sim");
    assert_eq!(v["data"][0]["object"], "model");
    assert_eq!(v["data"][0]["owned_by"], "radixkv");
    assert!(v["data"][0]["created"].as_u64().unwrap() > 1_600_000_000);
    let one = s.get("/v1/models/radixkv-sim").await;
    assert_eq!(one.json()["id"], "radixkv-sim");
    let none = s.get("/v1/models/gpt-4").await;
    assert_eq!(none.status, StatusCode::NOT_FOUND);
    s.shutdown().await;
}

/// The chat template's prompt length of `messages`, by its documented rule.
fn rendered_len(messages: &Value) -> usize {
    radixkv_server::chat::render_messages(messages, &radixkv_server::codec::ByteCodec)
        .unwrap()
        .len()
}

#[tokio::test]
async fn a_chat_reuses_earlier_turns_and_reports_cached_tokens() {
    let s = start_default().await;
    let mut messages = json!([
        {"role": "system", "content": "You are a terse assistant. ".repeat(4)},
        {"role": "user", "content": "Name three prime numbers, please."},
    ]);
    let mut cached = Vec::new();
    for turn in 0..3 {
        let r = s
            .post_to(
                "/v1/chat/completions",
                json!({"model": "radixkv-sim", "messages": messages, "max_completion_tokens": 8,
                       "temperature": 0.7, "top_p": 0.9, "seed": 1, "user": "u1"}),
            )
            .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.body);
        let v = r.json();
        assert_eq!(v["object"], "chat.completion");
        assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
        let m = &v["choices"][0]["message"];
        assert_eq!(m["role"], "assistant");
        assert_eq!(v["choices"][0]["finish_reason"], "length");
        assert_eq!(v["usage"]["prompt_tokens"], rendered_len(&messages));
        assert_eq!(v["usage"]["completion_tokens"], 8);
        let c = v["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap();
        cached.push(c);
        // The next turn: this reply and a new question.
        let reply = m["content"].as_str().unwrap().to_owned();
        let list = messages.as_array_mut().unwrap();
        list.push(json!({"role": "assistant", "content": reply}));
        list.push(json!({"role": "user", "content": format!("And {turn} more?")}));
        s.wait_idle().await;
    }
    assert_eq!(cached[0], 0, "{cached:?}");
    assert!(
        cached[1] > 0 && cached[2] > cached[1],
        "cached tokens must grow: {cached:?}"
    );
    s.shutdown().await;
}

#[tokio::test]
async fn a_chat_streams_deltas_then_usage_then_done() {
    let s = start_default().await;
    let r = s
        .send(
            "POST",
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5,
                   "stream": true, "stream_options": {"include_usage": true}})
            .to_string()
            .into_bytes(),
        )
        .await;
    let events = Sse::new(r).rest().await;
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert!(chunks
        .iter()
        .all(|c| c["object"] == "chat.completion.chunk"));
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let usage = chunks.last().unwrap();
    assert_eq!(usage["choices"].as_array().unwrap().len(), 0);
    assert_eq!(usage["usage"]["completion_tokens"], 5);
    let text: Vec<&Value> = chunks[..chunks.len() - 1].iter().collect();
    assert_eq!(
        text.last().unwrap()["choices"][0]["finish_reason"],
        "length"
    );
    let content: String = text
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(content.chars().count(), 5, "{content:?}");
    s.shutdown().await;
}

/// The first request of a fresh server, whole and streamed.
async fn first_reply(body: Value, stream: bool) -> (String, String) {
    let s = start_default().await;
    let out = if stream {
        let mut b = body.clone();
        b["stream"] = json!(true);
        let r = s
            .send("POST", "/v1/completions", b.to_string().into_bytes())
            .await;
        let events = Sse::new(r).rest().await;
        let chunks: Vec<Value> = events
            .iter()
            .filter(|e| *e != "[DONE]")
            .map(|e| serde_json::from_str(e).unwrap())
            .collect();
        let text = chunks
            .iter()
            .map(|c| c["choices"][0]["text"].as_str().unwrap())
            .collect();
        let finish = chunks.last().unwrap()["choices"][0]["finish_reason"]
            .as_str()
            .unwrap()
            .to_owned();
        (text, finish)
    } else {
        let v = s.post(body).await.json();
        (
            v["choices"][0]["text"].as_str().unwrap().to_owned(),
            v["choices"][0]["finish_reason"]
                .as_str()
                .unwrap()
                .to_owned(),
        )
    };
    s.shutdown().await;
    out
}

#[tokio::test]
async fn stop_sequences_cut_the_text_whole_and_streamed() {
    // A fresh server's first request generates the same text each time.
    let body = json!({"prompt": "stop here", "max_tokens": 40});
    let (full, finish) = first_reply(body.clone(), false).await;
    assert_eq!((full.len(), finish.as_str()), (40, "length"));
    let stop = full[12..14].to_owned();
    let want = &full[..full.find(&stop).unwrap()];
    let mut with_stop = body.clone();
    with_stop["stop"] = json!(["never-in-the-output", stop]);
    assert_eq!(
        first_reply(with_stop.clone(), false).await,
        (want.to_owned(), "stop".into())
    );
    assert_eq!(
        first_reply(with_stop, true).await,
        (want.to_owned(), "stop".into())
    );
}

/// A stop sequence ends the request's generation in the engine: usage
/// counts the tokens up to the stop (one byte each), the engine generated
/// far fewer than `max_tokens`, and nothing stays pinned or in flight.
#[tokio::test]
async fn a_stop_sequence_stops_generation_whole_and_streamed() {
    // A token every ~6 ms: 4,096 of them would take ~25 s.
    let s = start(engine_cfg(1, 1024), ServerConfig::default(), 1.0).await;
    let stops = json!(["a", "e", "i", "o"]);
    let body = json!({"prompt": "stop test", "max_tokens": 4096, "stop": stops});
    let v = s.post(body.clone()).await.json();
    let text = v["choices"][0]["text"].as_str().unwrap();
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
    // The stop is one byte: the text, then the token that completed it.
    assert_eq!(v["usage"]["completion_tokens"], text.len() + 1, "{v}");
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let r = s
        .send("POST", "/v1/completions", streamed.to_string().into_bytes())
        .await;
    let events = Sse::new(r).rest().await;
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let usage: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    let chunks: Vec<Value> = events[..events.len() - 2]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let text: String = chunks
        .iter()
        .map(|c| c["choices"][0]["text"].as_str().unwrap())
        .collect();
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "stop"
    );
    assert_eq!(
        usage["usage"]["completion_tokens"],
        text.len() + 1,
        "{usage}"
    );
    // The engine generated a few tokens past each stop at most, not 4,096.
    let st = s.get("/stats").await.json();
    let generated = sum(&st, "output_tokens");
    assert!(generated < 2 * 512, "{st}");
    assert_eq!(st["audit_ok"], true, "{st}");
    assert_eq!(st["outstanding"], 0);
    assert_eq!(st["pinned_tokens"], 0);
    s.shutdown().await;
}

#[tokio::test]
async fn an_api_key_guards_the_api_and_leaves_health_open() {
    let cfg = ServerConfig {
        api_key: Some("sk-test".into()),
        ..ServerConfig::default()
    };
    let s = start(engine_cfg(1, 256), cfg, 50.0).await;
    for (path, method, body) in [
        ("/v1/models", "GET", ""),
        (
            "/v1/completions",
            "POST",
            r#"{"prompt": "a", "max_tokens": 1}"#,
        ),
        (
            "/v1/chat/completions",
            "POST",
            r#"{"messages": [{"role": "user", "content": "a"}]}"#,
        ),
        ("/query", "POST", r#"{"token_ids": [1]}"#),
    ] {
        for key in [None, Some("sk-wrong")] {
            let r = s.call_auth(method, path, body.into(), key).await;
            assert_eq!(
                r.status,
                StatusCode::UNAUTHORIZED,
                "{path} {key:?}: {}",
                r.body
            );
            let v = r.json();
            assert_eq!(v["error"]["code"], "invalid_api_key", "{v}");
            assert_eq!(v["error"]["type"], "invalid_request_error");
        }
        let ok = s
            .call_auth(method, path, body.into(), Some("sk-test"))
            .await;
        assert_eq!(ok.status, StatusCode::OK, "{path}: {}", ok.body);
    }
    assert_eq!(s.get("/health").await.status, StatusCode::OK);
    assert_eq!(s.get("/metrics").await.status, StatusCode::OK);
    s.shutdown().await;
}

#[tokio::test]
async fn unsupported_fields_and_bad_chats_are_400s_that_name_the_field() {
    let s = start_default().await;
    let cases: Vec<(&str, &str, Value)> = vec![
        ("/v1/completions", "`n`", json!({"prompt": "a", "n": 2})),
        (
            "/v1/completions",
            "`logprobs`",
            json!({"prompt": "a", "logprobs": 2}),
        ),
        (
            "/v1/completions",
            "`best_of`",
            json!({"prompt": "a", "best_of": 3}),
        ),
        (
            "/v1/completions",
            "`echo`",
            json!({"prompt": "a", "echo": true}),
        ),
        (
            "/v1/completions",
            "`temperature`",
            json!({"prompt": "a", "temperature": 9}),
        ),
        (
            "/v1/completions",
            "`stop`",
            json!({"prompt": "a", "stop": [1]}),
        ),
        (
            "/v1/completions",
            "`stop`",
            json!({"prompt": "a", "stop": ["a", "b", "c", "d", "e"]}),
        ),
        (
            "/v1/chat/completions",
            "`tools`",
            json!({"messages": [{"role": "user", "content": "a"}], "tools": [{"type": "function"}]}),
        ),
        (
            "/v1/chat/completions",
            "`logprobs`",
            json!({"messages": [{"role": "user", "content": "a"}], "logprobs": true}),
        ),
        (
            "/v1/chat/completions",
            "`n`",
            json!({"messages": [{"role": "user", "content": "a"}], "n": 3}),
        ),
        (
            "/v1/chat/completions",
            "`messages` is required",
            json!({"model": "m"}),
        ),
        (
            "/v1/chat/completions",
            "must not be empty",
            json!({"messages": []}),
        ),
        (
            "/v1/chat/completions",
            "`messages[0].role` \"wizard\"",
            json!({"messages": [{"role": "wizard", "content": "a"}]}),
        ),
        (
            "/v1/chat/completions",
            "`messages[1].content`",
            json!({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": 7}]}),
        ),
        (
            "/v1/chat/completions",
            "`messages[0].content[0]`",
            json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
        ),
        (
            "/v1/chat/completions",
            "`max_completion_tokens`",
            json!({"messages": [{"role": "user", "content": "a"}], "max_completion_tokens": 0}),
        ),
        ("/query", "`token_ids[1]`", json!({"token_ids": [1, 2.5]})),
        ("/query", "`token_ids[0]`", json!({"token_ids": ["x"]})),
        ("/query", "required", json!({"cache_salt": "t"})),
        (
            "/query_by_hash",
            "--kv-events",
            json!({"block_hashes": [1]}),
        ),
        (
            "/query_by_hash",
            "`block_hashes[0]`",
            json!({"block_hashes": [-1]}),
        ),
    ];
    for (path, want, body) in &cases {
        let r = s.post_to(path, body.clone()).await;
        assert_eq!(
            r.status,
            StatusCode::BAD_REQUEST,
            "{path} {body}: {}",
            r.body
        );
        let msg = r.error();
        assert!(msg.contains(want), "{path} {body}: {msg:?} lacks {want:?}");
    }
    s.shutdown().await;
}

#[tokio::test]
async fn query_reports_the_cached_prefix_per_device() {
    let s = start_default().await;
    let prompt = "a prompt that the query endpoint will find, page by page".repeat(2);
    let r = s
        .post(json!({"prompt": prompt, "max_tokens": 4, "cache_salt": "t1"}))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let device = r.json()["radixkv"]["device"].as_u64().unwrap();
    s.wait_idle().await;
    let whole = prompt.len() / 16 * 16;
    for body in [
        json!({"prompt": prompt, "cache_salt": "t1", "model": "radixkv-sim"}),
        json!({"token_ids": prompt.bytes().collect::<Vec<u8>>(), "cache_salt": "t1"}),
    ] {
        let v = s.post_to("/query", body).await.json();
        let d = &v["data"]["radixkv"];
        assert_eq!(d["matched_tokens"], whole, "{v}");
        assert_eq!(d["L1"][format!("dp{device}")], whole, "{v}");
        assert_eq!(d["L1"][format!("dp{}", 1 - device)], 0, "{v}");
        assert_eq!(d["L2"], 0, "{v}");
    }
    // Another namespace holds nothing.
    let v = s.post_to("/query", json!({"prompt": prompt})).await.json();
    assert_eq!(v["data"]["radixkv"]["matched_tokens"], 0, "{v}");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_by_hash_resolves_published_block_ids() {
    use radixkv_events::{KvEventPublisher, KvEventsConfig};
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut ecfg = KvEventsConfig::new(format!("tcp://127.0.0.1:{}", port.min(65_000)));
    ecfg.index_blocks = true;
    let publisher = Arc::new(KvEventPublisher::start(ecfg, 1, 16).await.unwrap());
    let sink = publisher.listener();
    let mut cfg = engine_cfg(1, 256);
    cfg.listeners = Some(radixkv_engine::CacheListeners::new(move |_| sink.clone()));
    let engine = Engine::start(
        cfg,
        Arc::new(SimulatedBackend::new(CostModel::default(), 50.0)),
    )
    .unwrap();
    let server = Server::bind(
        "127.0.0.1:0".parse().unwrap(),
        engine,
        ServerConfig::default(),
    )
    .await
    .unwrap()
    .with_kv_events(Arc::clone(&publisher));
    let http = Http::new(server.local_addr().unwrap());
    let (tx, rx) = oneshot::channel::<()>();
    let handle = tokio::spawn(server.run(async move {
        let _ = rx.await;
    }));
    let prompt: Vec<u32> = (0..100).collect();
    let r = http.post(json!({"prompt": prompt, "max_tokens": 2})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    http.wait_idle().await;
    publisher.flush().await;
    let ids = radixkv_events::wire::block_ids(None, &prompt[..96], 16);
    let by_hash = http
        .post_to("/query_by_hash", json!({"block_hashes": ids}))
        .await
        .json();
    let by_tokens = http
        .post_to("/query", json!({"token_ids": prompt}))
        .await
        .json();
    assert_eq!(
        by_hash["data"]["radixkv"]["matched_tokens"], 96,
        "{by_hash}"
    );
    assert_eq!(by_hash, by_tokens);
    // A chain that leaves the cache after two blocks stops there.
    let mut off = ids[..2].to_vec();
    off.push(12345);
    let v = http
        .post_to("/query_by_hash", json!({"block_hashes": off}))
        .await
        .json();
    assert_eq!(v["data"]["radixkv"]["matched_tokens"], 32, "{v}");
    // The ids are in the default namespace: a salt or an adapter named
    // with them matches nothing.
    for other in [
        json!({"cache_salt": "tenant-b"}),
        json!({"lora_name": "sql"}),
    ] {
        let mut body = other.clone();
        body["block_hashes"] = json!(ids);
        let v = http.post_to("/query_by_hash", body).await.json();
        assert_eq!(v["data"]["radixkv"]["matched_tokens"], 0, "{other}: {v}");
    }
    // A salted prompt's ids match with their salt named, and without.
    let r = http
        .post(json!({"prompt": prompt, "max_tokens": 2, "cache_salt": "tenant-b"}))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    http.wait_idle().await;
    publisher.flush().await;
    let ns = radixkv::TokenKey::namespace_for(None, Some("tenant-b"));
    let salted = radixkv_events::wire::block_ids(ns.as_deref(), &prompt[..96], 16);
    for body in [
        json!({"block_hashes": salted, "cache_salt": "tenant-b"}),
        json!({"block_hashes": salted}),
    ] {
        let v = http.post_to("/query_by_hash", body.clone()).await.json();
        assert_eq!(v["data"]["radixkv"]["matched_tokens"], 96, "{body}: {v}");
    }
    let _ = tx.send(());
    handle.await.unwrap().unwrap();
}

#[tokio::test]
async fn admin_config_changes_settings_at_run_time() {
    let mut ecfg = engine_cfg(2, 256);
    ecfg.watermarks = Some((8, 32));
    let s = start(ecfg, ServerConfig::default(), 50.0).await;
    let now = s.get("/admin/config").await;
    assert_eq!(now.status, StatusCode::OK, "{}", now.body);
    let v = now.json();
    assert_eq!(v["eviction_policy"], "lru");
    assert_eq!(v["watermarks"], json!([8, 32]));
    assert_eq!(v["router"]["kind"], "cache-aware");
    let r = s
        .post_to(
            "/admin/config",
            json!({"eviction_policy": "lfu", "watermarks": [16, 64], "router": {"balance_abs": 4, "balance_rel": 2.0}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let v = r.json();
    assert_eq!(v["eviction_policy"], "lfu");
    assert_eq!(v["watermarks"], json!([16, 64]));
    assert_eq!(v["router"]["balance_abs"], 4);
    assert_eq!(v["router"]["balance_rel"], 2.0);
    // Requests keep working under the new settings.
    let c = s
        .post(json!({"prompt": "after the change", "max_tokens": 4}))
        .await;
    assert_eq!(c.status, StatusCode::OK, "{}", c.body);
    // Into a policy that ranks by a scan, and back.
    for policy in ["mru", "lru"] {
        let r = s
            .post_to("/admin/config", json!({"eviction_policy": policy}))
            .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.body);
        assert_eq!(r.json()["eviction_policy"], policy);
    }
    for (want, body) in [
        ("unknown", json!({"eviction_policy": "random-ish"})),
        ("low < high", json!({"watermarks": [64, 16]})),
        ("[low, high]", json!({"watermarks": [1]})),
        ("kind", json!({"router": {"kind": "round-robin"}})),
        ("balance_rel", json!({"router": {"balance_rel": 0.5}})),
        ("unknown setting `colour`", json!({"colour": "blue"})),
        ("router.kind", json!({"router": {"kind": 5}})),
        (
            "router.copy_slack",
            json!({"router": {"copy_slack": 18446744073709551615u64}}),
        ),
        (
            "watermarks",
            json!({"eviction_policy": "lfu", "router": {"balance_abs": 9}, "watermarks": [1, 9999]}),
        ),
        (
            "router.balance_abs",
            json!({"eviction_policy": "lfu", "router": {"balance_abs": -1}}),
        ),
    ] {
        let r = s.post_to("/admin/config", body.clone()).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{body}: {}", r.body);
        assert!(r.error().contains(want), "{body}: {} lacks {want}", r.body);
    }
    // A refused body changed nothing, not even its valid fields.
    let v = s.get("/admin/config").await.json();
    assert_eq!(v["eviction_policy"], "lru", "{v}");
    assert_eq!(v["router"]["balance_abs"], 4, "{v}");
    assert_eq!(v["watermarks"], json!([16, 64]), "{v}");
    s.wait_idle().await;
    s.shutdown().await;
}

#[tokio::test]
async fn a_lora_name_keeps_a_prompt_apart_and_query_finds_it_under_it() {
    let s = start_default().await;
    let prompt = "an adapter's prompt, long enough for two pages".to_string();
    let r = s
        .post(json!({"prompt": prompt, "max_tokens": 2, "lora_name": "math", "cache_salt": "t"}))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    s.wait_idle().await;
    let whole = prompt.len() / 16 * 16;
    let q = |body: Value| async {
        s.post_to("/query", body).await.json()["data"]["radixkv"]["matched_tokens"].clone()
    };
    assert_eq!(
        q(json!({"prompt": prompt, "lora_name": "math", "cache_salt": "t"})).await,
        whole
    );
    assert_eq!(q(json!({"prompt": prompt, "cache_salt": "t"})).await, 0);
    assert_eq!(q(json!({"prompt": prompt, "lora_name": "math"})).await, 0);
    // The same LoRA and salt reuse it.
    let r = s
        .post(json!({"prompt": prompt, "max_tokens": 2, "lora_name": "math", "cache_salt": "t"}))
        .await;
    assert_eq!(
        r.json()["usage"]["prompt_tokens_details"]["cached_tokens"],
        whole
    );
    s.shutdown().await;
}
