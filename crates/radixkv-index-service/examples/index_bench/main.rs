//! `radixkv index` against NVIDIA Dynamo's standalone indexer
//! (`python -m dynamo.indexer`, ai-dynamo-runtime 1.6.1), one run, the
//! same event streams and the same queries (`scripts/index-bench.sh`
//! runs it; opt-in).
//!
//! The streams: a trace's requests spread over `--workers` × `--ranks`
//! sources (a prefix-affine choice by the first block, one request in
//! seven spilled), each source a cache of `--capacity` blocks of 16
//! tokens with leaf-first LRU eviction, one batch per request (its new
//! blocks stored, the evicted ones removed) in vLLM's map encoding, logged
//! by one test publisher per source ([`FramePublisher`]: a PUB and a
//! replay ROUTER). A trace block id `b` stands for tokens `16·b + j` (a
//! Mooncake request's whole 512-token blocks, an agentic one's blocks).
//!
//! Per index, alone on the machine (the other not running):
//!
//! * **ingestion**: every source registered, then an empty live batch per
//!   source every 20 ms: the index finds the gap and replays the whole
//!   stream; the time from the first registration until its answers for
//!   probe prompts equal the streams' own truth (checked every 10 ms, eight
//!   probes in flight) gives events per second;
//! * **memory**: resident set growth over that ingestion per holder-block
//!   (a block held by one source);
//! * **answers**: `/query` for `--probes` prompts equal to the truth;
//! * **queries**: `/query` (Dynamo's shape, prompts of the trace,
//!   pre-serialized bodies) from 1 and 8 closed-loop clients on
//!   keep-alive connections for `--seconds` each: p50, p99, queries per
//!   second, and this process's CPU time per query (what the load
//!   generator cost the two cores it shares with the index). The clients
//!   are threads of [`wire`]'s (one `write` of a request serialized
//!   beforehand, one `read` of the answer; the default), or with
//!   `--client hyper` tasks of hyper's pooled client on this process's
//!   two runtime threads, which cost the machine two to three times more
//!   CPU per query (BENCHMARKS.md);
//! * **round trip**: `GET /health` from one such client (up to 3 s): the
//!   HTTP round trip with no query work, which bounds one client's
//!   queries per second from above.
//!
//! First, in this process, the streams are decoded, then applied to a
//! `KvIndex` on one thread, and the probes checked against the truth: it
//! prints the decoding and the apply times (with the blocks stored and
//! removed, and the blocks walked to build paths), the apply rate, the
//! live heap bytes per holder-block (a counting allocator), then a
//! query's own work without HTTP (its body parsed by the service's reader
//! and by serde_json alone, the scores read). `INDEX_BENCH_APPLY_ROUNDS=N` applies the
//! streams N more times before (to profile ingestion alone); `--only none`
//! stops there.
//!
//! Prints a table and, with `--out FILE`, writes the figures as JSON.
//! `--max-tiers N` is passed to `radixkv index`; `--only radixkv` (or
//! `dynamo`) runs one side.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use radixkv_events::testing::FramePublisher;
use radixkv_events::wire::{encode_batch, Encoding, KvEvent, Medium};
use radixkv_index::Source;
use radixkv_tools::trace::{read_trace, Prompt, Trace};
use serde_json::{json, Value};
use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod wire;

/// Live heap bytes of this process (the in-process index's accounting).
static LIVE: AtomicUsize = AtomicUsize::new(0);

/// The system allocator, counting live bytes.
struct Counting;

// SAFETY: forwards to `System` unchanged; the counter has no effect on
// the allocations.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size(), Ordering::Relaxed);
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size(), Ordering::Relaxed);
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        LIVE.fetch_add(new, Ordering::Relaxed);
        LIVE.fetch_sub(l.size(), Ordering::Relaxed);
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

const BLOCK: usize = 16;
const MODEL: &str = "bench";

struct Args {
    radixkv: PathBuf,
    dynamo_python: PathBuf,
    traces: Vec<PathBuf>,
    requests: usize,
    workers: u64,
    ranks: u32,
    capacity: usize,
    seconds: f64,
    probes: usize,
    threads: usize,
    max_tiers: Option<usize>,
    only: Option<String>,
    /// The load generator's clients: [`wire`]'s (`--client wire`, the
    /// default) or hyper's (`--client hyper`).
    wire_client: bool,
    out: Option<PathBuf>,
}

const USAGE: &str = "usage: index_bench --trace FILE [--trace FILE ...] \
[--radixkv PATH] [--dynamo-python PATH] [--only radixkv|dynamo|none] \
[--requests N] [--workers N] [--ranks N] [--capacity BLOCKS] [--seconds S] \
[--probes N] [--threads N] [--max-tiers N] [--client wire|hyper] [--out FILE]
(scripts/index-bench.sh runs it with both indexes; see the module docs)";

/// Says `what` was wrong and the usage, and exits with status 2.
fn usage_error(what: std::fmt::Arguments<'_>) -> ! {
    eprintln!("index_bench: {what}\n{USAGE}");
    std::process::exit(2)
}

/// `v`, the value of `flag`, parsed; a usage error if it does not parse.
fn parsed<T: std::str::FromStr>(flag: &str, v: String) -> T {
    v.parse()
        .unwrap_or_else(|_| usage_error(format_args!("{flag} {v:?} is not a valid value")))
}

fn args() -> Args {
    let mut a = Args {
        radixkv: "target/release/radixkv".into(),
        dynamo_python: "python3".into(),
        traces: Vec::new(),
        requests: 12_000,
        workers: 8,
        ranks: 2,
        capacity: 16_384,
        seconds: 10.0,
        probes: 300,
        threads: 2,
        max_tiers: None,
        only: None,
        wire_client: true,
        out: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut v = || {
            it.next()
                .unwrap_or_else(|| usage_error(format_args!("{flag} needs a value")))
        };
        match flag.as_str() {
            "--radixkv" => a.radixkv = v().into(),
            "--dynamo-python" => a.dynamo_python = v().into(),
            "--trace" => a.traces.push(v().into()),
            "--requests" => a.requests = parsed(&flag, v()),
            "--workers" => a.workers = parsed(&flag, v()),
            "--ranks" => a.ranks = parsed(&flag, v()),
            "--capacity" => a.capacity = parsed(&flag, v()),
            "--seconds" => a.seconds = parsed(&flag, v()),
            "--probes" => a.probes = parsed(&flag, v()),
            "--threads" => a.threads = parsed(&flag, v()),
            "--max-tiers" => a.max_tiers = Some(parsed(&flag, v())),
            "--only" => a.only = Some(v()),
            "--client" => {
                a.wire_client = match v().as_str() {
                    "wire" => true,
                    "hyper" => false,
                    other => usage_error(format_args!("--client is wire or hyper, not {other}")),
                }
            }
            "--out" => a.out = Some(v().into()),
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => usage_error(format_args!("unknown flag {other}")),
        }
    }
    if a.traces.is_empty() {
        usage_error(format_args!("give at least one --trace FILE"));
    }
    a
}

/// One source's cache: held blocks (parent, children, last use) and its
/// leaves by last use.
#[derive(Default)]
struct SourceCache {
    held: HashMap<u32, (Option<u32>, u32, u64)>,
    leaves: BTreeSet<(u64, u32)>,
}

impl SourceCache {
    fn touch(&mut self, b: u32, now: u64) {
        if let Some(h) = self.held.get_mut(&b) {
            if h.1 == 0 {
                self.leaves.remove(&(h.2, b));
                self.leaves.insert((now, b));
            }
            h.2 = now;
        }
    }

    /// Leading blocks of `path` held.
    fn matched(&self, path: &[u32]) -> usize {
        path.iter()
            .take_while(|b| self.held.contains_key(b))
            .count()
    }
}

/// Tokens cached per (worker, rank).
type Scores = BTreeMap<(u64, u32), usize>;

struct Workload {
    name: String,
    /// Per source (index = worker · ranks + rank): its batches' payloads.
    batches: Vec<Vec<Bytes>>,
    events: u64,
    /// Query prompts (whole blocks) and, for the probes among them (by
    /// index), the truth: (worker, rank) → tokens.
    prompts: Vec<Vec<u32>>,
    truth: Vec<(usize, Scores)>,
    holder_blocks: usize,
}

/// Source `s` (index = worker · ranks + rank) as a worker and rank.
fn source_of(s: usize, ranks: u32) -> Source {
    Source {
        worker: s as u64 / u64::from(ranks),
        rank: (s as u64 % u64::from(ranks)) as u32,
    }
}

fn path_of(trace: &Trace, last: Option<u32>) -> Vec<u32> {
    let mut path = Vec::new();
    let mut cur = last;
    while let Some(b) = cur {
        path.push(b);
        cur = trace.blocks.parent(b);
    }
    path.reverse();
    path
}

fn tokens_of(path: &[u32]) -> Vec<u32> {
    path.iter()
        .flat_map(|&b| (0..BLOCK as u32).map(move |j| b * BLOCK as u32 + j))
        .collect()
}

fn workload(a: &Args, file: &Path) -> Workload {
    let trace = read_trace(file, 1, 1.0).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let sources = (a.workers * u64::from(a.ranks)) as usize;
    let mut caches: Vec<SourceCache> = (0..sources).map(|_| SourceCache::default()).collect();
    let mut batches: Vec<Vec<Bytes>> = vec![Vec::new(); sources];
    let mut events = 0u64;
    let mut paths = Vec::new();
    for (i, r) in trace.requests.iter().take(a.requests).enumerate() {
        let path = match &r.prompt {
            Prompt::Blocks { last, .. } => path_of(&trace, *last),
            // Mooncake's: block id `h` read as tokens `512·h + j`.
            Prompt::Tokens(t) => t.chunks_exact(512).map(|c| c[0] / 512).collect(),
        };
        if path.is_empty()
            || path
                .iter()
                .any(|&b| u64::from(b) * BLOCK as u64 > u64::from(u32::MAX))
        {
            continue;
        }
        let spill = if i % 7 == 0 { i } else { 0 };
        let s = ((u64::from(path[0]).wrapping_mul(2_654_435_761) as usize) + spill) % sources;
        let now = i as u64 + 1;
        let c = &mut caches[s];
        let have = c.matched(&path);
        for &b in &path[..have] {
            c.touch(b, now);
        }
        let mut batch = Vec::new();
        if have < path.len() {
            let new = &path[have..];
            let mut parent = have.checked_sub(1).map(|k| path[k]);
            if let Some(p) = parent {
                if let Some(h) = c.held.get_mut(&p) {
                    if h.1 == 0 {
                        c.leaves.remove(&(h.2, p));
                    }
                    h.1 += 1;
                }
            }
            for (k, &b) in new.iter().enumerate() {
                let children = u32::from(k + 1 < new.len());
                c.held.insert(b, (parent, children, now));
                parent = Some(b);
            }
            c.leaves.insert((now, *new.last().unwrap_or(&0)));
            batch.push(KvEvent::BlockStored {
                block_hashes: new.iter().map(|&b| u64::from(b)).collect(),
                parent_block_hash: have.checked_sub(1).map(|k| u64::from(path[k])),
                token_ids: tokens_of(new),
                block_size: BLOCK,
                medium: Medium::Gpu,
                lora_name: None,
                cache_salt: None,
            });
        }
        let mut removed = Vec::new();
        while c.held.len() > a.capacity {
            let Some(&(t, b)) = c.leaves.iter().next() else {
                break;
            };
            c.leaves.remove(&(t, b));
            let Some((parent, _, _)) = c.held.remove(&b) else {
                continue;
            };
            removed.push(u64::from(b));
            if let Some(p) = parent {
                if let Some(h) = c.held.get_mut(&p) {
                    h.1 -= 1;
                    if h.1 == 0 {
                        c.leaves.insert((h.2, p));
                    }
                }
            }
        }
        if !removed.is_empty() {
            batch.push(KvEvent::BlockRemoved {
                block_hashes: removed,
                medium: Medium::Gpu,
            });
        }
        if !batch.is_empty() {
            events += batch.len() as u64;
            batches[s].push(Bytes::from(encode_batch(
                i as f64,
                &batch,
                Some(source_of(s, a.ranks).rank),
                Encoding::Map,
            )));
        }
        paths.push(path);
    }
    // The queries: the last requests' prompts; the probes, spread over
    // them, with their truth.
    let take = paths.len().min(4000);
    let prompts: Vec<Vec<u32>> = paths[paths.len() - take..]
        .iter()
        .map(|p| tokens_of(p))
        .collect();
    let step = (prompts.len() / a.probes.max(1)).max(1);
    let truth = (0..prompts.len())
        .step_by(step)
        .map(|i| {
            let path = &paths[paths.len() - take + i];
            let mut t = BTreeMap::new();
            for (s, c) in caches.iter().enumerate() {
                let n = c.matched(path);
                if n > 0 {
                    let src = source_of(s, a.ranks);
                    t.insert((src.worker, src.rank), n * BLOCK);
                }
            }
            (i, t)
        })
        .collect();
    Workload {
        name: trace.name.clone(),
        batches,
        events,
        prompts,
        truth,
        holder_blocks: caches.iter().map(|c| c.held.len()).sum(),
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// A publisher on two free ports. A port found free can be taken before
/// the bind (the previous index's load left thousands of connections'
/// ephemeral ports in use): tried again on new ports.
async fn bind_publisher() -> FramePublisher {
    let mut tries = 0;
    loop {
        match FramePublisher::bind(free_port(), free_port()).await {
            Ok(p) => return p,
            Err(e) if tries < 20 => {
                tries += 1;
                eprintln!("bind a publisher: {e}; new ports");
            }
            Err(e) => panic!("bind a publisher: {e}"),
        }
    }
}

fn rss_kb(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

struct Http {
    client: Client<HttpConnector, Full<Bytes>>,
    base: String,
    port: u16,
}

impl Http {
    fn new(port: u16) -> Http {
        Http {
            client: Client::builder(TokioExecutor::new()).build_http(),
            base: format!("http://127.0.0.1:{port}"),
            port,
        }
    }

    async fn post(&self, path: &str, body: Bytes) -> Result<(u16, Bytes), String> {
        let req = hyper::Request::post(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .body(Full::new(body))
            .map_err(|e| e.to_string())?;
        let r = self.client.request(req).await.map_err(|e| e.to_string())?;
        let status = r.status().as_u16();
        let b = r
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok((status, b))
    }

    async fn get(&self, path: &str) -> Result<u16, String> {
        let req = hyper::Request::get(format!("{}{path}", self.base))
            .body(Full::new(Bytes::new()))
            .map_err(|e| e.to_string())?;
        let r = self.client.request(req).await.map_err(|e| e.to_string())?;
        Ok(r.status().as_u16())
    }
}

/// A query body as a service reads it.
#[derive(serde::Deserialize)]
struct QueryShape {
    token_ids: Vec<u32>,
    model_name: String,
}

fn body(prompt: &[u32]) -> Bytes {
    Bytes::from(json!({"token_ids": prompt, "model_name": MODEL}).to_string())
}

/// The scores of a Dynamo-shaped answer.
fn scores(v: &Value) -> Scores {
    let mut out = BTreeMap::new();
    if let Some(w) = v["scores"].as_object() {
        for (worker, ranks) in w {
            for (rank, n) in ranks.as_object().into_iter().flatten() {
                let n = n.as_u64().unwrap_or(0) as usize;
                if n > 0 {
                    out.insert((worker.parse().unwrap_or(0), rank.parse().unwrap_or(0)), n);
                }
            }
        }
    }
    out
}

/// The scores `/query` answers for `body` (none on any failure).
async fn answer(http: &Http, body: &Bytes) -> Scores {
    match http.post("/query", body.clone()).await {
        Ok((200, b)) => serde_json::from_slice(&b)
            .map(|v: Value| scores(&v))
            .unwrap_or_default(),
        _ => BTreeMap::new(),
    }
}

/// Probes not yet equal to the truth.
async fn wrong(http: &Http, w: &Workload, bodies: &[Bytes]) -> usize {
    let mut bad = 0;
    for (k, want) in &w.truth {
        let got = answer(http, &bodies[*k]).await;
        if &got != want && bad == 0 && std::env::var_os("INDEX_BENCH_DEBUG").is_some() {
            eprintln!("probe {k}: want {want:?}, got {got:?}");
        }
        bad += usize::from(&got != want);
    }
    bad
}

/// Whether every probe's answer equals the truth: eight probes in flight
/// (the check is the benchmark's cost, not the index's), all stopping at
/// the first that does not.
async fn all_right(http: &Http, w: &Workload, bodies: &[Bytes]) -> bool {
    let wrong = std::sync::atomic::AtomicBool::new(false);
    let part = |first: usize| {
        let wrong = &wrong;
        async move {
            for (k, want) in w.truth.iter().skip(first).step_by(8) {
                // Relaxed: a stop flag; the answer is read after the join.
                if wrong.load(Ordering::Relaxed) {
                    return;
                }
                if &answer(http, &bodies[*k]).await != want {
                    wrong.store(true, Ordering::Relaxed);
                    return;
                }
            }
        }
    };
    tokio::join!(
        part(0),
        part(1),
        part(2),
        part(3),
        part(4),
        part(5),
        part(6),
        part(7)
    );
    !wrong.load(Ordering::Relaxed)
}

#[derive(Clone, Debug, serde::Serialize)]
struct Figures {
    index: String,
    trace: String,
    sources: usize,
    events: u64,
    ingest_s: f64,
    events_per_s: f64,
    holder_blocks: usize,
    rss_growth_bytes_per_holder_block: f64,
    probes_wrong: usize,
    /// One per load phase (1 and 8 clients).
    queries: Vec<Load>,
    /// `GET /health` from one client: (p50 µs, requests per second), the
    /// round trip with no query work, for scale.
    health: (f64, f64),
}

/// `GET /health` in a closed loop from one client for `seconds`: p50 µs
/// and requests per second.
async fn health_round_trip(http: &Http, wire_client: bool, seconds: f64) -> (f64, f64) {
    let mut h = hdrhistogram::Histogram::<u64>::new(3).expect("histogram");
    let start = Instant::now();
    if wire_client {
        let port = http.port;
        return tokio::task::spawn_blocking(move || {
            let request = wire::get(port, "/health");
            let mut c = wire::Connection::open(port).expect("connect");
            while start.elapsed().as_secs_f64() < seconds {
                let t = Instant::now();
                match c.round_trip(&request) {
                    Ok((200, _)) => {
                        let _ = h.record(t.elapsed().as_micros() as u64);
                    }
                    other => panic!("/health failed: {other:?}"),
                }
            }
            (
                h.value_at_quantile(0.5) as f64,
                h.len() as f64 / start.elapsed().as_secs_f64(),
            )
        })
        .await
        .expect("the /health loop");
    }
    while start.elapsed().as_secs_f64() < seconds {
        let t = Instant::now();
        match http.get("/health").await {
            Ok(200) => {
                let _ = h.record(t.elapsed().as_micros() as u64);
            }
            other => panic!("/health failed: {other:?}"),
        }
    }
    (
        h.value_at_quantile(0.5) as f64,
        h.len() as f64 / start.elapsed().as_secs_f64(),
    )
}

/// One load phase's figures.
#[derive(Clone, Debug, serde::Serialize)]
struct Load {
    clients: usize,
    p50_us: f64,
    p99_us: f64,
    queries_per_s: f64,
    /// This process's CPU time over the phase per query: what the load
    /// generator itself cost the two cores it shares with the index.
    client_cpu_us_per_query: f64,
}

/// `/query` from `clients` closed-loop clients on keep-alive connections
/// for `seconds`: threads of [`wire`]'s (`wire_client`; requests
/// serialized beforehand), or tasks of hyper's client on this process's
/// runtime.
async fn load(
    http: Arc<Http>,
    bodies: Arc<Vec<Bytes>>,
    wire_client: bool,
    clients: usize,
    seconds: f64,
) -> Load {
    if wire_client {
        return tokio::task::spawn_blocking(move || {
            wire_load(http.port, &bodies, clients, seconds)
        })
        .await
        .expect("the load");
    }
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let cpu0 = cpu_seconds();
    let start = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..clients {
        let http = Arc::clone(&http);
        let bodies = Arc::clone(&bodies);
        tasks.push(tokio::spawn(async move {
            let mut h = hdrhistogram::Histogram::<u64>::new(3).expect("histogram");
            let mut i = c * 7919;
            while Instant::now() < deadline {
                let b = bodies[i % bodies.len()].clone();
                i += 1;
                let t = Instant::now();
                match http.post("/query", b).await {
                    Ok((200, _)) => {
                        let _ = h.record(t.elapsed().as_micros() as u64);
                    }
                    other => panic!("a query failed: {other:?}"),
                }
            }
            h
        }));
    }
    let mut histograms = Vec::new();
    for t in tasks {
        histograms.push(t.await.expect("a client"));
    }
    phase(clients, &histograms, start, cpu0)
}

/// A load phase's figures from its clients' latency histograms, its
/// start and this process's CPU seconds then.
fn phase(
    clients: usize,
    histograms: &[hdrhistogram::Histogram<u64>],
    start: Instant,
    cpu0: f64,
) -> Load {
    let elapsed = start.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu0;
    let mut all = hdrhistogram::Histogram::<u64>::new(3).expect("histogram");
    for h in histograms {
        all.add(h).expect("histograms of one shape");
    }
    Load {
        clients,
        p50_us: all.value_at_quantile(0.5) as f64,
        p99_us: all.value_at_quantile(0.99) as f64,
        queries_per_s: all.len() as f64 / elapsed,
        client_cpu_us_per_query: cpu * 1e6 / all.len().max(1) as f64,
    }
}

/// [`load`] from `clients` threads, each a [`wire::Connection`].
fn wire_load(port: u16, bodies: &[Bytes], clients: usize, seconds: f64) -> Load {
    let requests: Vec<Vec<u8>> = bodies
        .iter()
        .map(|b| wire::post(port, "/query", b))
        .collect();
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let cpu0 = cpu_seconds();
    let start = Instant::now();
    let histograms: Vec<hdrhistogram::Histogram<u64>> = std::thread::scope(|s| {
        let threads: Vec<_> = (0..clients)
            .map(|c| {
                let requests = &requests;
                s.spawn(move || {
                    let mut conn = wire::Connection::open(port).expect("connect");
                    let mut h = hdrhistogram::Histogram::<u64>::new(3).expect("histogram");
                    let mut i = c * 7919;
                    while Instant::now() < deadline {
                        let r = &requests[i % requests.len()];
                        i += 1;
                        let t = Instant::now();
                        match conn.round_trip(r) {
                            Ok((200, body)) if !body.is_empty() => {
                                let _ = h.record(t.elapsed().as_micros() as u64);
                            }
                            Ok((status, body)) => {
                                panic!("a query failed: {status} {}", String::from_utf8_lossy(body))
                            }
                            Err(e) => panic!("a query failed: {e}"),
                        }
                    }
                    h
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("a client"))
            .collect()
    });
    phase(clients, &histograms, start, cpu0)
}

/// CPU seconds this process has used (user and system), from
/// `/proc/self/stat` in clock ticks of 1/100 s (Linux's `USER_HZ`).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // The fields after the command name's closing parenthesis; utime and
    // stime are the 14th and 15th of the line, the 12th and 13th here.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let tick = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (tick(11) + tick(12)) / 100.0
}

fn spawn_index(a: &Args, which: &str, port: u16) -> Child {
    let mut c = if which == "radixkv" {
        let mut c = Command::new(&a.radixkv);
        c.args(["index", "--host", "127.0.0.1", "--port", &port.to_string()])
            .args([
                "--threads",
                &a.threads.to_string(),
                "--replay-timeout-s",
                "120",
            ]);
        if let Some(t) = a.max_tiers {
            c.args(["--max-tiers", &t.to_string()]);
        }
        c
    } else {
        let mut c = Command::new(&a.dynamo_python);
        c.args(["-m", "dynamo.indexer", "--port", &port.to_string()])
            .args(["--threads", &a.threads.to_string()]);
        c
    };
    c.stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("start {which}: {e}"))
}

async fn run_one(a: &Args, which: &str, w: &Workload, pubs: &mut [FramePublisher]) -> Figures {
    let port = free_port();
    let mut child = spawn_index(a, which, port);
    let http = Arc::new(Http::new(port));
    let t = Instant::now();
    while http.get("/health").await.is_err() {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "{which} never answered"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss0 = rss_kb(child.id());
    let bodies: Arc<Vec<Bytes>> = Arc::new(w.prompts.iter().map(|p| body(p)).collect());

    let start = Instant::now();
    for (s, p) in pubs.iter().enumerate() {
        let src = source_of(s, a.ranks);
        let reg = json!({
            "instance_id": src.worker,
            "dp_rank": src.rank,
            "endpoint": p.endpoint,
            "replay_endpoint": p.replay,
            "model_name": MODEL,
            "block_size": BLOCK,
        });
        let (st, b) = http
            .post("/register", Bytes::from(reg.to_string()))
            .await
            .expect("register");
        assert_eq!(
            st,
            201,
            "{which} /register: {}",
            String::from_utf8_lossy(&b)
        );
    }
    // Live empty batches after each stream's end until the index has it
    // all (it replays the rest).
    let mut next: Vec<u64> = w.batches.iter().map(|b| b.len() as u64).collect();
    let ingest_s;
    loop {
        for (s, p) in pubs.iter_mut().enumerate() {
            let rank = source_of(s, a.ranks).rank;
            // Logged too: a replay serves every batch a publisher sent.
            let empty = Bytes::from(encode_batch(0.0, &[], Some(rank), Encoding::Map));
            p.log_payload(next[s], empty.clone());
            p.send_payload(next[s], empty).await;
            next[s] += 1;
        }
        // Checked every 10 ms, the check stopping at the first wrong
        // probe (a query or a few while ingestion goes on).
        let mut done = false;
        for _ in 0..2 {
            tokio::time::sleep(Duration::from_millis(10)).await;
            if all_right(&http, w, &bodies).await {
                done = true;
                break;
            }
        }
        if done {
            ingest_s = start.elapsed().as_secs_f64();
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(600),
            "{which} never caught up"
        );
    }
    let rss1 = rss_kb(child.id());
    let probes_wrong = wrong(&http, w, &bodies).await;
    let mut queries = Vec::new();
    for clients in [1, 8] {
        queries.push(
            load(
                Arc::clone(&http),
                Arc::clone(&bodies),
                a.wire_client,
                clients,
                a.seconds,
            )
            .await,
        );
    }
    let health = health_round_trip(&http, a.wire_client, a.seconds.min(3.0)).await;
    let _ = child.kill();
    let _ = child.wait();
    Figures {
        index: which.to_string(),
        trace: w.name.clone(),
        sources: w.batches.len(),
        events: w.events,
        ingest_s,
        events_per_s: w.events as f64 / ingest_s,
        holder_blocks: w.holder_blocks,
        rss_growth_bytes_per_holder_block: (rss1.saturating_sub(rss0) * 1024) as f64
            / w.holder_blocks.max(1) as f64,
        probes_wrong,
        queries,
        health,
    }
}

/// Applies every source's decoded batches to `ix`, in order; every event
/// must apply.
/// Applies every source's batches in turn; returns the blocks stored and
/// removed.
fn apply_all(
    ix: &radixkv_index::KvIndex,
    decoded: &[Vec<radixkv_index::decode::Batch>],
    ranks: u32,
) -> (u64, u64) {
    let (mut stored, mut removed) = (0, 0);
    for (s, b) in decoded.iter().enumerate() {
        for batch in b {
            let (done, errors) = ix.apply(source_of(s, ranks), &batch.events);
            assert!(errors.is_empty(), "source {s}: {errors:?}");
            stored += done.stored;
            removed += done.removed;
        }
    }
    (stored, removed)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let a = args();
    let mut all = Vec::new();
    for file in &a.traces {
        let w = workload(&a, file);
        eprintln!(
            "{}: {} sources, {} batches ({} bytes), {} events, {} holder-blocks at the end, {} query prompts",
            w.name,
            w.batches.len(),
            w.batches.iter().map(Vec::len).sum::<usize>(),
            w.batches.iter().flatten().map(Bytes::len).sum::<usize>(),
            w.events,
            w.holder_blocks,
            w.prompts.len()
        );
        // The streams' truth against radixkv-index in process first: a
        // workload whose truth is wrong would fail both indexes alike.
        let t = Instant::now();
        let decoded: Vec<Vec<radixkv_index::decode::Batch>> = w
            .batches
            .iter()
            .map(|b| {
                b.iter()
                    .map(|p| radixkv_index::decode::decode_batch(p).expect("a batch"))
                    .collect()
            })
            .collect();
        let decode_s = t.elapsed().as_secs_f64();
        // INDEX_BENCH_APPLY_ROUNDS=N: apply the streams N more times into
        // fresh indexes first (to profile ingestion alone).
        let rounds: usize = std::env::var("INDEX_BENCH_APPLY_ROUNDS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let new_index = || {
            radixkv_index::KvIndex::new(BLOCK, a.max_tiers.unwrap_or(w.batches.len()))
                .expect("an index")
        };
        for _ in 0..rounds {
            apply_all(&new_index(), &decoded, a.ranks);
        }
        // INDEX_BENCH_CONCURRENT_ROUNDS=N: apply the streams N times into
        // fresh indexes from a thread per source (each source in order, as
        // the service's listeners apply them) and check each index against
        // the streams' truth and its own invariants.
        let concurrent: usize = std::env::var("INDEX_BENCH_CONCURRENT_ROUNDS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        for round in 0..concurrent {
            let ix = new_index();
            std::thread::scope(|scope| {
                for (s, b) in decoded.iter().enumerate() {
                    let ix = &ix;
                    scope.spawn(move || {
                        for batch in b {
                            let (_, errors) = ix.apply(source_of(s, a.ranks), &batch.events);
                            assert!(errors.is_empty(), "source {s}: {errors:?}");
                        }
                    });
                }
            });
            let wrong = w
                .truth
                .iter()
                .filter(|(k, want)| {
                    let got: Scores = ix
                        .scores(&w.prompts[*k], None)
                        .into_iter()
                        .map(|s| ((s.source.worker, s.source.rank), s.tokens))
                        .collect();
                    got != *want
                })
                .count();
            eprintln!(
                "concurrent apply, round {round}: {} held blocks (truth {}), {wrong} wrong probes, check: {:?}",
                ix.held_blocks(),
                w.holder_blocks,
                ix.check()
            );
        }
        let ix = new_index();
        let live0 = LIVE.load(Ordering::Relaxed);
        let t = Instant::now();
        let (stored, removed) = apply_all(&ix, &decoded, a.ranks);
        let apply_s = t.elapsed().as_secs_f64();
        let live = LIVE.load(Ordering::Relaxed).saturating_sub(live0);
        let steps: u64 = (0..w.batches.len())
            .map(|s| ix.path_steps(source_of(s, a.ranks)))
            .sum();
        eprintln!(
            "in process, one thread: all batches decoded in {decode_s:.3} s, then applied in {apply_s:.3} s \
             ({stored} blocks stored, {removed} removed, {steps} blocks walked to build paths)"
        );
        eprintln!(
            "in process, one thread: {:.0} events/s applied (decoded), {:.0} live heap bytes per holder-block ({} held blocks, {} tree nodes)",
            w.events as f64 / apply_s,
            live as f64 / w.holder_blocks.max(1) as f64,
            ix.held_blocks(),
            ix.tree_nodes()
        );
        // A query's own work, without HTTP: its body parsed (by serde_json
        // alone, and as the service parses it) and the tree walked.
        let histogram = || hdrhistogram::Histogram::<u64>::new(3).expect("histogram");
        let (mut by_serde, mut parse, mut walk) = (histogram(), histogram(), histogram());
        for p in &w.prompts {
            let b = body(p);
            let t = Instant::now();
            let q: QueryShape = serde_json::from_slice(&b).expect("a query body");
            let _ = by_serde.record(t.elapsed().as_nanos() as u64);
            std::hint::black_box(q);
            let t = Instant::now();
            let q: QueryShape =
                radixkv_index_service::token_ids::read(&b, |q: &mut QueryShape| &mut q.token_ids)
                    .expect("a query body");
            let _ = parse.record(t.elapsed().as_nanos() as u64);
            let t = Instant::now();
            std::hint::black_box(ix.scores(&q.token_ids, None));
            let _ = walk.record(t.elapsed().as_nanos() as u64);
            std::hint::black_box(q.model_name);
        }
        eprintln!(
            "in process, per query ({} bytes of JSON at p50): body parsed p50 {:.1} µs (by serde_json alone {:.1} µs), scores p50 {:.1} µs",
            {
                let mut sizes: Vec<usize> = w.prompts.iter().map(|p| body(p).len()).collect();
                sizes.sort_unstable();
                sizes.get(sizes.len() / 2).copied().unwrap_or(0)
            },
            parse.value_at_quantile(0.5) as f64 / 1e3,
            by_serde.value_at_quantile(0.5) as f64 / 1e3,
            walk.value_at_quantile(0.5) as f64 / 1e3
        );
        for (k, want) in &w.truth {
            let got: Scores = ix
                .scores(&w.prompts[*k], None)
                .into_iter()
                .map(|s| ((s.source.worker, s.source.rank), s.tokens))
                .collect();
            assert_eq!(&got, want, "probe {k} in process");
        }
        drop(ix);
        for which in ["radixkv", "dynamo"] {
            if a.only.as_deref().is_some_and(|o| o != which) {
                continue;
            }
            // Fresh publishers per index: the same logged streams.
            let mut pubs = Vec::new();
            for b in &w.batches {
                let p = bind_publisher().await;
                for (seq, payload) in b.iter().enumerate() {
                    p.log_payload(seq as u64, payload.clone());
                }
                pubs.push(p);
            }
            let f = run_one(&a, which, &w, &mut pubs).await;
            eprintln!("{f:?}");
            all.push(f);
        }
    }
    println!("| trace | index | events/s | ingest s | RSS B/holder-block | wrong probes | 1 client p50/p99 µs, q/s (client CPU per query) | 8 clients p50/p99 µs, q/s (client CPU per query) | GET /health, 1 client: p50 µs, q/s |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for f in &all {
        let q = |i: usize| {
            f.queries.get(i).map_or(String::new(), |l| {
                format!(
                    "{:.0}/{:.0}, {:.0} ({:.1} µs)",
                    l.p50_us, l.p99_us, l.queries_per_s, l.client_cpu_us_per_query
                )
            })
        };
        println!(
            "| {} | {} | {:.0} | {:.2} | {:.1} | {} | {} | {} | {:.0}, {:.0} |",
            f.trace,
            f.index,
            f.events_per_s,
            f.ingest_s,
            f.rss_growth_bytes_per_holder_block,
            f.probes_wrong,
            q(0),
            q(1),
            f.health.0,
            f.health.1
        );
    }
    if let Some(out) = &a.out {
        std::fs::write(out, serde_json::to_string_pretty(&all).expect("json"))
            .expect("write --out");
    }
}
