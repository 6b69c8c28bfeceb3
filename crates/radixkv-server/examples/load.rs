//! A bounded load generator for `radixkv serve` (loopback only).
//!
//! ```text
//! cargo run --release --example load -- --url http://127.0.0.1:8000 \
//!     --concurrency 32 --requests 2000 --max-seconds 30
//! ```
//!
//! `--concurrency` clients each send completions back to back (prompts
//! from `--groups` shared system prompts plus a unique question; every
//! `--stream-every`-th request streamed) until `--requests` were sent or
//! `--max-seconds` passed. Prints requests/s, tokens/s, latency
//! percentiles (and time to first streamed token), the prompt tokens
//! served from the cache, then `/stats` once the server is idle. Exits
//! non-zero on any failed request or when `audit_ok` is not true.

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Request, StatusCode};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

type HttpClient = Client<HttpConnector, Full<Bytes>>;

#[derive(Debug)]
struct Args {
    url: String,
    concurrency: usize,
    requests: usize,
    max_seconds: f64,
    groups: usize,
    system_bytes: usize,
    max_tokens: usize,
    stream_every: usize,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        url: "http://127.0.0.1:8000".into(),
        concurrency: 32,
        requests: 2000,
        max_seconds: 30.0,
        groups: 16,
        system_bytes: 512,
        max_tokens: 32,
        stream_every: 4,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut val = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        let num = |v: String| v.parse::<usize>().map_err(|e| format!("{flag}: {e}"));
        match flag.as_str() {
            "--url" => a.url = val()?,
            "--concurrency" => a.concurrency = num(val()?)?,
            "--requests" => a.requests = num(val()?)?,
            "--max-seconds" => {
                a.max_seconds = val()?.parse().map_err(|e| format!("{flag}: {e}"))?
            }
            "--groups" => a.groups = num(val()?)?,
            "--system-bytes" => a.system_bytes = num(val()?)?,
            "--max-tokens" => a.max_tokens = num(val()?)?,
            "--stream-every" => a.stream_every = num(val()?)?,
            "-h" | "--help" => {
                return Err(
                    "flags: --url --concurrency --requests --max-seconds --groups \
                            --system-bytes --max-tokens --stream-every"
                        .into(),
                )
            }
            other => return Err(format!("unknown flag {other}")),
        }
    }
    let host = a
        .url
        .strip_prefix("http://")
        .ok_or("--url must start with http://")?
        .split('/')
        .next()
        .unwrap_or_default();
    let loopback = ["127.0.0.1:", "localhost:", "[::1]:"]
        .iter()
        .any(|p| host.starts_with(p));
    if !loopback {
        return Err(format!(
            "--url must be a loopback address with a port, not {host}"
        ));
    }
    if !(1..=1024).contains(&a.concurrency) || !(1..=1_000_000).contains(&a.requests) {
        return Err("--concurrency must be 1..=1024 and --requests 1..=1000000".into());
    }
    if !(a.max_seconds > 0.0 && a.max_seconds <= 600.0) {
        return Err("--max-seconds must be in (0, 600]".into());
    }
    a.url = a.url.trim_end_matches('/').to_string();
    a.groups = a.groups.max(1);
    a.max_tokens = a.max_tokens.max(1);
    Ok(a)
}

#[derive(Default)]
struct Totals {
    latencies: Vec<Duration>,
    ttfts: Vec<Duration>,
    ok: usize,
    busy: usize,
    failed: usize,
    prompt_tokens: u64,
    cached_tokens: u64,
    completion_tokens: u64,
    first_error: Option<String>,
}

async fn one(client: &HttpClient, a: &Args, i: usize, t: &Mutex<Totals>) {
    let stream = a.stream_every > 0 && i.is_multiple_of(a.stream_every);
    let system = format!("System prompt {} ", i % a.groups);
    let system = system.repeat(a.system_bytes / system.len() + 1);
    let body = json!({
        "prompt": format!("{}Question {i}?", &system[..a.system_bytes]),
        "max_tokens": a.max_tokens,
        "stream": stream,
        "stream_options": {"include_usage": true},
    });
    let req = Request::post(format!("{}/v1/completions", a.url))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())));
    let start = Instant::now();
    let result: Result<(Value, Option<Duration>), (StatusCode, String)> = async {
        let req = req.map_err(|e| (StatusCode::BAD_REQUEST, e.to_string()))?;
        let resp = client
            .request(req)
            .await
            .map_err(|e| (StatusCode::SERVICE_UNAVAILABLE, e.to_string()))?;
        let status = resp.status();
        let mut body = resp.into_body();
        let mut text = String::new();
        let mut ttft = None;
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| (status, e.to_string()))?;
            if let Ok(d) = frame.into_data() {
                if stream && ttft.is_none() {
                    ttft = Some(start.elapsed());
                }
                text.push_str(&String::from_utf8_lossy(&d));
            }
        }
        if status != StatusCode::OK {
            return Err((status, text));
        }
        let usage = if stream {
            // The usage chunk is the event before [DONE].
            text.split("\n\n")
                .filter_map(|e| e.strip_prefix("data: "))
                .filter_map(|d| serde_json::from_str::<Value>(d).ok())
                .find(|v| v.get("usage").is_some() || v.get("error").is_some())
                .ok_or((status, format!("no usage chunk in {text}")))?
        } else {
            serde_json::from_str(&text).map_err(|e| (status, e.to_string()))?
        };
        if let Some(e) = usage.get("error") {
            return Err((status, e.to_string()));
        }
        Ok((usage, ttft))
    }
    .await;
    let took = start.elapsed();
    let mut t = t.lock().unwrap_or_else(|p| p.into_inner());
    match result {
        Ok((v, ttft)) => {
            t.ok += 1;
            t.latencies.push(took);
            t.ttfts.extend(ttft);
            let u = &v["usage"];
            t.prompt_tokens += u["prompt_tokens"].as_u64().unwrap_or(0);
            t.cached_tokens += u["cached_tokens"].as_u64().unwrap_or(0);
            t.completion_tokens += u["completion_tokens"].as_u64().unwrap_or(0);
        }
        Err((StatusCode::TOO_MANY_REQUESTS, _)) => t.busy += 1,
        Err((status, e)) => {
            t.failed += 1;
            t.first_error.get_or_insert(format!("{status}: {e}"));
        }
    }
}

fn pct(v: &mut [Duration], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_unstable();
    let i = ((v.len() as f64 * p).ceil() as usize).clamp(1, v.len()) - 1;
    v[i].as_secs_f64() * 1e3
}

async fn get_json(client: &HttpClient, url: String) -> Result<Value, String> {
    let req = Request::get(url)
        .body(Full::new(Bytes::new()))
        .map_err(|e| e.to_string())?;
    let r = client.request(req).await.map_err(|e| e.to_string())?;
    let b = r
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    serde_json::from_slice(&b).map_err(|e| e.to_string())
}

#[tokio::main]
async fn main() -> ExitCode {
    let a = match parse_args() {
        Ok(a) => Arc::new(a),
        Err(e) => {
            eprintln!("load: {e}");
            return ExitCode::from(2);
        }
    };
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    let totals = Arc::new(Mutex::new(Totals::default()));
    let next = Arc::new(AtomicUsize::new(0));
    let deadline = Instant::now() + Duration::from_secs_f64(a.max_seconds);
    let start = Instant::now();
    let workers: Vec<_> = (0..a.concurrency)
        .map(|_| {
            let (a, client, totals, next) = (
                Arc::clone(&a),
                client.clone(),
                Arc::clone(&totals),
                Arc::clone(&next),
            );
            tokio::spawn(async move {
                loop {
                    // Relaxed: a ticket counter.
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= a.requests || Instant::now() >= deadline {
                        break;
                    }
                    one(&client, &a, i, &totals).await;
                }
            })
        })
        .collect();
    for w in workers {
        let _ = w.await;
    }
    let wall = start.elapsed().as_secs_f64();
    let mut t = std::mem::take(&mut *totals.lock().unwrap_or_else(|p| p.into_inner()));
    let sent = t.ok + t.busy + t.failed;
    println!(
        "{sent} requests in {wall:.2} s with {} clients: {} ok, {} busy (429), {} failed",
        a.concurrency, t.ok, t.busy, t.failed
    );
    println!(
        "throughput: {:.1} requests/s, {:.0} output tokens/s",
        t.ok as f64 / wall,
        t.completion_tokens as f64 / wall
    );
    let mean = if t.latencies.is_empty() {
        0.0
    } else {
        t.latencies.iter().map(Duration::as_secs_f64).sum::<f64>() / t.latencies.len() as f64 * 1e3
    };
    let lat = &mut t.latencies;
    println!(
        "latency ms: mean {mean:.2}  p50 {:.2}  p90 {:.2}  p99 {:.2}  max {:.2}",
        pct(lat, 0.5),
        pct(lat, 0.9),
        pct(lat, 0.99),
        pct(lat, 1.0)
    );
    let tt = &mut t.ttfts;
    println!(
        "streamed ttft ms: p50 {:.2}  p90 {:.2}  p99 {:.2} ({} streams)",
        pct(tt, 0.5),
        pct(tt, 0.9),
        pct(tt, 0.99),
        tt.len()
    );
    println!(
        "prompt tokens: {}, cached: {} ({:.1} %)",
        t.prompt_tokens,
        t.cached_tokens,
        100.0 * t.cached_tokens as f64 / t.prompt_tokens.max(1) as f64
    );
    if let Some(e) = &t.first_error {
        println!("first error: {e}");
    }
    // The server settles (completions are counted just after the last
    // token is sent): poll /stats until audit_ok or 10 s.
    let until = Instant::now() + Duration::from_secs(10);
    let stats = loop {
        match get_json(&client, format!("{}/stats", a.url)).await {
            Ok(s) if s["audit_ok"] == true || Instant::now() >= until => break Ok(s),
            Ok(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            Err(e) => break Err(e),
        }
    };
    match stats {
        Ok(s) => {
            println!(
                "/stats: audit_ok={} outstanding={} pinned_tokens={} in_flight={} audit_error={}",
                s["audit_ok"],
                s["outstanding"],
                s["pinned_tokens"],
                s["http"]["in_flight"],
                s["audit_error"]
            );
            if t.failed == 0 && s["audit_ok"] == true {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("load: GET /stats failed: {e}");
            ExitCode::FAILURE
        }
    }
}
