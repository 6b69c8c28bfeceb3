//! `radixkv replay`: runs a workload through the engine in (scaled) real
//! time and summarizes what prefix caching bought.
//!
//! Model time is wall time × `speedup`: the simulated backend sleeps for
//! its cost model's duration / `speedup`, and arrivals are scheduled the
//! same way, so latencies are reported in model milliseconds (the engine's
//! own CPU time is scaled up with them, which makes the figures slightly
//! pessimistic).
//!
//! ```
//! use radixkv_engine::EngineConfig;
//! use radixkv_tools::replay::{replay, ReplayConfig};
//! use radixkv_tools::trace::gsp;
//! let w = gsp(4, 4, 256, 32, 4, 1);
//! let cfg = ReplayConfig {
//!     engine: EngineConfig { devices: 2, pages_per_device: 1024, ..EngineConfig::default() },
//!     speedup: 200.0,
//!     // One request at a time: the same figures on any machine.
//!     max_concurrency: Some(1),
//!     ..ReplayConfig::default()
//! };
//! let s = replay(&w, &cfg, &Default::default())?;
//! assert_eq!((s.requests, s.finished), (16, 16));
//! // Each prompt token was a device hit, a copy from the other device, or
//! // computed.
//! let reused = s.tokens_device_hit + s.tokens_peer_copied;
//! assert_eq!(reused + s.tokens_recomputed, s.prompt_tokens);
//! // Each group's first prompt is computed; the 3 others find its 256
//! // shared tokens on the device that computed them: the ceiling.
//! assert_eq!(s.tokens_device_hit, 4 * 3 * 256);
//! assert!((s.hit_rate - s.infinite_cache_hit_rate).abs() < 1e-9);
//! # Ok::<(), radixkv_engine::EngineError>(())
//! ```

use crate::trace::Trace;
use radixkv::metrics::LatencyHistogram;
use radixkv_engine::simulator::{CostModel, SimulatedBackend};
use radixkv_engine::{Engine, EngineConfig, EngineError, EngineRequest, PromptTokens};
use serde::Serialize;
use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How to replay.
#[derive(Clone, Debug, PartialEq)]
pub struct ReplayConfig {
    /// The engine.
    pub engine: EngineConfig,
    /// The simulator's cost model.
    pub cost: CostModel,
    /// Model time per wall time (default 4).
    pub speedup: f64,
    /// Requests per second of model time, as a Poisson process, instead of
    /// the workload's arrival times (`f64::INFINITY`: all at once).
    pub request_rate: Option<f64>,
    /// Seed of the Poisson arrivals.
    pub seed: u64,
    /// At most this many requests outstanding at once (`--max-concurrency`
    /// of SGLang's and vLLM's serving benchmarks): a request is sent at its
    /// arrival time or when an earlier one finishes, whichever is later.
    /// `Some(1)` makes the replay a closed loop with one request at a time,
    /// which runs the same way on every machine (every request sees the
    /// cache and the router's load as all earlier requests left them).
    /// `None` (the default): no limit. `Some(0)` is taken as `Some(1)`.
    pub max_concurrency: Option<usize>,
    /// Show progress on stderr (a bar on a terminal, else a line per 10 %).
    pub progress: bool,
    /// The model behind the engine (default: the simulator).
    pub model: ReplayModel,
    /// Whether requests share cached prefixes (default true); false puts
    /// every request in a cache namespace of its own, so nothing is
    /// reused: the baseline without a prefix cache.
    pub share_prefixes: bool,
}

/// Which model runs the engine's passes.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum ReplayModel {
    /// The simulated GPU ([`SimulatedBackend`], sleeping for the cost
    /// model's time / `speedup`).
    #[default]
    Simulated,
    /// The tiny candle transformer ([`radixkv_models::tiny::TinyBackend`]):
    /// real compute with its KV in per-device pools sized like the cache
    /// (the pool, model, device count and slots come from the engine's
    /// configuration). Times are wall time: `speedup` is taken as 1.
    /// Feature `candle`.
    #[cfg(feature = "candle")]
    Tiny {
        /// The model.
        model: radixkv_models::tiny::TinyConfig,
        /// Host or GPU pools.
        pool: radixkv_models::backend::PoolKind,
        /// Check every computed position against the dense reference.
        verify: bool,
    },
    /// A GGUF llama ([`radixkv_models::gguf::GgufBackend`]) computing for
    /// real on the CPU, its KV in per-device pools sized like the cache.
    /// Times are wall time. Feature `gguf`.
    #[cfg(feature = "gguf")]
    Gguf {
        /// The model file.
        path: std::path::PathBuf,
        /// Host or GPU pools.
        pool: radixkv_models::backend::PoolKind,
        /// Check every sampled position against the dense reference.
        verify: bool,
    },
}

impl Default for ReplayConfig {
    fn default() -> Self {
        ReplayConfig {
            engine: EngineConfig::default(),
            cost: CostModel::default(),
            speedup: 4.0,
            request_rate: None,
            seed: 42,
            max_concurrency: None,
            progress: false,
            model: ReplayModel::Simulated,
            share_prefixes: true,
        }
    }
}

/// The replay's summary (the JSON keys are stable).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ReplaySummary {
    /// The workload's name.
    pub workload: String,
    /// The router.
    pub router: String,
    /// Devices.
    pub devices: usize,
    /// Requests in the workload.
    pub requests: usize,
    /// Requests that finished.
    pub finished: usize,
    /// Requests that failed after admission (or were stopped).
    pub failed: usize,
    /// Requests rejected at submission (e.g. larger than a device's pool).
    pub rejected: usize,
    /// Whether the run was interrupted (Ctrl-C): the figures are partial.
    pub interrupted: bool,
    /// Requests never sent because the run was interrupted first
    /// (`finished + failed + rejected + not_sent == requests`).
    pub not_sent: usize,
    /// Prompt tokens of the finished requests.
    pub prompt_tokens: usize,
    /// Output tokens of the finished requests.
    pub output_tokens: usize,
    /// Token hit rate: prompt tokens served from the device's own cache /
    /// prompt tokens.
    pub hit_rate: f64,
    /// Prompt tokens served from the device's own cache (`hit_rate`'s
    /// numerator).
    pub tokens_device_hit: usize,
    /// Prompt tokens loaded from the host tier instead of computed.
    pub tokens_host_loaded: usize,
    /// Prompt tokens copied from another device instead of computed.
    pub tokens_peer_copied: usize,
    /// Prompt tokens computed: every prompt token of a finished request is
    /// in exactly one of these four, which sum to `prompt_tokens`.
    pub tokens_recomputed: usize,
    /// Share of prompt tokens not recomputed: 1 − `tokens_recomputed` /
    /// `prompt_tokens` (with `--copy none` it equals `hit_rate`).
    pub reuse_rate: f64,
    /// The same per device.
    pub reuse_rate_per_device: Vec<f64>,
    /// Tokens loaded from the host, per device.
    pub tokens_host_loaded_per_device: Vec<usize>,
    /// Tokens copied from other devices, per device (the destination).
    pub tokens_peer_copied_per_device: Vec<usize>,
    /// Bytes of KV copied into devices (host loads and peer copies).
    pub copy_bytes: u64,
    /// Model time of those copies, seconds (per the tier cost model;
    /// overlapped with compute as `radixkv_engine::tiers` says).
    pub copy_time_s: f64,
    /// Tokens written to the host tier (write-through or write-back).
    pub host_written_tokens: u64,
    /// Bytes of those writes.
    pub host_write_bytes: u64,
    /// Pages of the host tier (0: none).
    pub host_pages: usize,
    /// The copy policy (`none`, `host`, `peer`, `all`).
    pub copy_policy: String,
    /// The write policy (`write-through`, `write-through-selective`,
    /// `write-back`).
    pub write_policy: String,
    /// The same per device.
    pub hit_rate_per_device: Vec<f64>,
    /// The workload's hit rate with an infinite cache (the ceiling).
    pub infinite_cache_hit_rate: f64,
    /// Prompt tokens not computed thanks to the cache.
    pub prefill_tokens_saved: usize,
    /// Tokens computed by prefill passes (retractions recompute).
    pub prefill_tokens_computed: u64,
    /// Model time from the first arrival to the last completion, seconds.
    pub duration_s: f64,
    /// Output tokens per second of model time.
    pub throughput_tok_s: f64,
    /// Prompt + output tokens per second of model time.
    pub total_throughput_tok_s: f64,
    /// Time to first token, model milliseconds.
    pub ttft_p50_ms: f64,
    /// 90th percentile.
    pub ttft_p90_ms: f64,
    /// 99th percentile.
    pub ttft_p99_ms: f64,
    /// End-to-end latency, model milliseconds.
    pub e2e_p50_ms: f64,
    /// 90th percentile.
    pub e2e_p90_ms: f64,
    /// 99th percentile.
    pub e2e_p99_ms: f64,
    /// Retractions (requests re-queued for lack of pages).
    pub retractions: u64,
    /// Leaves evicted, per device.
    pub evicted_leaves_per_device: Vec<u64>,
    /// Tokens evicted, per device.
    pub evicted_tokens_per_device: Vec<u64>,
    /// Share of each device's pool holding cached KV at the end.
    pub pool_use_per_device: Vec<f64>,
    /// Wall-clock seconds the replay took.
    pub wall_s: f64,
    /// The cap on outstanding requests ([`ReplayConfig::max_concurrency`];
    /// `null` in JSON: none).
    pub max_concurrency: Option<usize>,
    /// Requests whose computed positions a verifying model checked against
    /// a recomputation (0 without one; a retracted request counts once per
    /// admission).
    pub verified_requests: u64,
    /// Of which mismatched (must be 0).
    pub mismatches: u64,
}

struct Progress {
    bar: Option<indicatif::ProgressBar>,
    total: usize,
    last_decile: usize,
    enabled: bool,
}

impl Progress {
    fn new(total: usize, enabled: bool, label: &str) -> Self {
        let bar = (enabled && std::io::stderr().is_terminal()).then(|| {
            let b = indicatif::ProgressBar::new(total as u64);
            if let Ok(style) = indicatif::ProgressStyle::with_template(
                "{prefix} [{elapsed_precise}] {bar:40} {pos}/{len} {msg}",
            ) {
                b.set_style(style);
            }
            b.set_prefix(label.to_string());
            b
        });
        Progress {
            bar,
            total,
            last_decile: 0,
            enabled,
        }
    }

    fn set(&mut self, done: usize, hit: f64) {
        if let Some(b) = &self.bar {
            b.set_position(done as u64);
            b.set_message(format!("hit {:.1}%", hit * 100.0));
        } else if self.enabled && self.total > 0 {
            let decile = done * 10 / self.total;
            if decile > self.last_decile {
                self.last_decile = decile;
                eprintln!(
                    "{done}/{} requests done, hit rate {:.1}%",
                    self.total,
                    hit * 100.0
                );
            }
        }
    }

    fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

/// Model-time arrival offsets: the workload's, or a Poisson process.
fn arrivals(w: &Trace, rate: Option<f64>, seed: u64) -> Vec<f64> {
    match rate {
        None => w.requests.iter().map(|r| r.arrival_ms).collect(),
        Some(r) if !r.is_finite() || r <= 0.0 => vec![0.0; w.requests.len()],
        Some(r) => {
            let mut rng = radixkv_engine::rng::SplitMix64::new(seed);
            let mut t = 0.0;
            w.requests
                .iter()
                .map(|_| {
                    let at = t;
                    t += rng.exp(1000.0 / r);
                    at
                })
                .collect()
        }
    }
}

/// The default workload of `radixkv replay --model tiny` (when no size is
/// given): generated shared prefixes, 32 groups × 8 prompts (256
/// requests), 64-token system prompts, 16-token questions, 4 output
/// tokens, small enough to run in seconds on two cores.
pub fn tiny_default_workload(seed: u64) -> Trace {
    crate::trace::gsp(32, 8, 64, 16, 4, seed)
}

/// The workload `radixkv replay --model gguf:PATH` runs when the default
/// gsp sizes are not changed: 6 system prompts of 256 tokens, 16
/// questions of 32 tokens each, 16 output tokens (about 30 s of
/// SmolLM2-135M on 2 cores).
pub fn gguf_default_workload(seed: u64) -> Trace {
    crate::trace::gsp(6, 16, 256, 32, 16, seed)
}

/// Model time per wall time must be a positive number.
fn check_speedup(speedup: f64) -> Result<(), EngineError> {
    if speedup.is_finite() && speedup > 0.0 {
        Ok(())
    } else {
        Err(EngineError::InvalidConfig(format!(
            "speedup must be a positive number, not {speedup}"
        )))
    }
}

/// Replays `w` on a fresh engine; `interrupt` (e.g. set by Ctrl-C) stops
/// it early with a partial summary.
pub fn replay(
    w: &Trace,
    cfg: &ReplayConfig,
    interrupt: &AtomicBool,
) -> Result<ReplaySummary, EngineError> {
    check_speedup(cfg.speedup)?;
    // The tiny model (feature candle) runs in wall time: speedup 1.
    #[cfg_attr(not(feature = "candle"), allow(unused_mut))]
    let mut cfg = cfg.clone();
    let backend: Arc<dyn radixkv_engine::sched::batch::ModelBackend> = match &cfg.model {
        ReplayModel::Simulated => Arc::new(
            SimulatedBackend::new(cfg.cost, cfg.speedup).with_layers(cfg.engine.tiers.shape.layers),
        ),
        #[cfg(feature = "candle")]
        ReplayModel::Tiny {
            model,
            pool,
            verify,
        } => {
            use radixkv_models::backend::{PagedBackend, PoolConfig};
            cfg.speedup = 1.0; // real compute: model time is wall time
            let pools = PoolConfig {
                pool: *pool,
                verify: *verify,
                ..PoolConfig::for_engine(&cfg.engine)
            };
            let invalid =
                |e: radixkv_models::backend::ModelError| EngineError::InvalidConfig(e.to_string());
            let model = radixkv_models::tiny::TinyModel::new(model.clone()).map_err(invalid)?;
            Arc::new(PagedBackend::new(model, pools).map_err(invalid)?)
        }
        #[cfg(feature = "gguf")]
        ReplayModel::Gguf { path, pool, verify } => {
            use radixkv_models::backend::{PagedBackend, PoolConfig};
            cfg.speedup = 1.0; // real compute: model time is wall time
            let pools = PoolConfig {
                pool: *pool,
                verify: *verify,
                ..PoolConfig::for_engine(&cfg.engine)
            };
            let model = radixkv_models::gguf::GgufFile::open(path)
                .and_then(|f| f.llama())
                .map_err(|e| EngineError::InvalidConfig(e.to_string()))?;
            let backend = PagedBackend::new(model, pools)
                .map_err(|e| EngineError::InvalidConfig(e.to_string()))?;
            Arc::new(backend)
        }
    };
    replay_on(w, &cfg, backend, interrupt)
}

/// [`replay`] on `backend` (the simulator, a paged model, or one of your
/// own), with `cfg.model` ignored and `cfg.speedup` taken as given (it
/// must be a positive number; `replay` sets it to 1 for the models that
/// compute, whose model time is wall time). A scheduler thread that fails
/// ends the replay with [`EngineError::Failed`] (the requests it held
/// complete with that failure; a replay with a device gone measures
/// nothing).
pub fn replay_on(
    w: &Trace,
    cfg: &ReplayConfig,
    backend: Arc<dyn radixkv_engine::sched::batch::ModelBackend>,
    interrupt: &AtomicBool,
) -> Result<ReplaySummary, EngineError> {
    check_speedup(cfg.speedup)?;
    let engine = Engine::start(cfg.engine.clone(), Arc::clone(&backend))?;
    let failed_engine =
        |engine: &Engine| engine.failure().map(|why| EngineError::Failed(why.into()));
    let wall = Instant::now();
    let at = arrivals(w, cfg.request_rate, cfg.seed);
    let n = w.requests.len();
    let devices = cfg.engine.devices;
    let mut progress = Progress::new(n, cfg.progress, cfg.engine.router.kind.name());
    // Prompt tokens of finished requests per device, by where they came from.
    let mut per_dev = vec![PromptTokens::default(); devices];
    let (mut finished, mut failed, mut rejected) = (0usize, 0usize, 0usize);
    let (mut output, mut retractions_seen) = (0usize, 0u64);
    let mut submitted = 0usize;
    let mut done = 0usize;
    let mut interrupted = false;
    let scale = |d: Duration| d.mul_f64(cfg.speedup);
    let max_concurrency = cfg.max_concurrency.map(|c| c.max(1));
    let cap = max_concurrency.unwrap_or(usize::MAX);
    let mut last_done = wall;
    let mut record = |c: radixkv_engine::sched::scheduler::Completion,
                      done: &mut usize,
                      progress: &mut Progress| {
        *done += 1;
        if c.error.is_some() {
            failed += 1;
        } else {
            finished += 1;
            output += c.output_tokens;
            per_dev[c.device.index().min(devices - 1)] += c.tokens;
        }
        retractions_seen += u64::from(c.retractions);
        progress.set(*done, sum(&per_dev).hit_rate());
    };
    // Feed in arrival order from this thread, collecting between arrivals.
    for (i, r) in w.requests.iter().enumerate() {
        let due = wall + Duration::from_secs_f64(at[i].max(0.0) / 1000.0 / cfg.speedup);
        loop {
            if let Some(e) = failed_engine(&engine) {
                progress.finish();
                return Err(e);
            }
            if interrupt.load(Ordering::Relaxed) {
                interrupted = true;
                break;
            }
            let now = Instant::now();
            let room = submitted - done < cap;
            if now >= due && room {
                break;
            }
            let wait = if now >= due {
                Duration::from_millis(50) // only a completion makes room
            } else {
                (due - now).min(Duration::from_millis(50))
            };
            if let Ok(c) = engine.completions().recv_timeout(wait) {
                last_done = Instant::now();
                record(c, &mut done, &mut progress);
            }
        }
        if interrupted {
            engine.stop(); // what was sent completes with "stopped"
            break;
        }
        let mut req = EngineRequest::new(w.tokens(i), r.output_len);
        req.output_tokens = r.output_tokens.clone();
        if !cfg.share_prefixes {
            req.namespace = Some(format!("replay-request-{i}").into());
        }
        match engine.submit(req) {
            Ok(_) => submitted += 1,
            Err(EngineError::Rejected(_)) => rejected += 1,
            Err(e) => return Err(e),
        }
    }
    while done < submitted {
        if !interrupted && interrupt.load(Ordering::Relaxed) {
            interrupted = true;
            engine.stop(); // the rest complete with "stopped"
        }
        match engine.completions().recv_timeout(Duration::from_millis(50)) {
            Ok(c) => {
                last_done = Instant::now();
                record(c, &mut done, &mut progress);
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                if let Some(e) = failed_engine(&engine) {
                    progress.finish();
                    return Err(e);
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    progress.finish();
    if let Some(e) = failed_engine(&engine) {
        return Err(e);
    }
    let lat = engine.latencies();
    let report = engine.shutdown();
    let verification = backend.verification().unwrap_or_default();
    let first_arrival = at.iter().copied().fold(f64::INFINITY, f64::min);
    let first_arrival = if first_arrival.is_finite() {
        first_arrival
    } else {
        0.0
    };
    let duration_s = (scale(last_done - wall).as_secs_f64() - first_arrival / 1000.0).max(1e-9);
    let all = sum(&per_dev);
    let prompt = all.prompt_tokens as usize;
    let cached = all.cached_tokens as usize;
    // The engine's wall-time latencies, in model time.
    let ms = |h: &LatencyHistogram, q: fn(&radixkv::metrics::LatencySummary) -> u64| {
        q(&h.summary()) as f64 / 1e6 * cfg.speedup
    };
    let (ttft, e2e) = (lat.ttft, lat.e2e);
    Ok(ReplaySummary {
        workload: w.name.clone(),
        router: cfg.engine.router.kind.name().to_string(),
        devices,
        requests: n,
        finished,
        failed,
        rejected,
        interrupted,
        not_sent: n - submitted - rejected,
        prompt_tokens: prompt,
        output_tokens: output,
        hit_rate: all.hit_rate(),
        tokens_device_hit: cached,
        tokens_host_loaded: all.copied.host_loaded_tokens as usize,
        tokens_peer_copied: all.copied.peer_copied_tokens as usize,
        tokens_recomputed: all.recomputed_tokens() as usize,
        // As a ratio of the reused tokens: with no copies it is `hit_rate`
        // exactly.
        reuse_rate: all.reuse_rate(),
        reuse_rate_per_device: per_dev.iter().map(PromptTokens::reuse_rate).collect(),
        tokens_host_loaded_per_device: per_dev
            .iter()
            .map(|p| p.copied.host_loaded_tokens as usize)
            .collect(),
        tokens_peer_copied_per_device: per_dev
            .iter()
            .map(|p| p.copied.peer_copied_tokens as usize)
            .collect(),
        copy_bytes: all.copied.bytes,
        copy_time_s: all.copied.time.as_secs_f64(),
        host_written_tokens: report
            .devices
            .iter()
            .map(|d| d.scheduler.host_written_tokens)
            .sum(),
        host_write_bytes: report
            .devices
            .iter()
            .map(|d| d.scheduler.host_write_bytes)
            .sum(),
        host_pages: cfg.engine.tiers.host_pages.unwrap_or(0),
        copy_policy: cfg.engine.tiers.copy.name().to_string(),
        write_policy: cfg.engine.tiers.write.name().to_string(),
        hit_rate_per_device: per_dev.iter().map(PromptTokens::hit_rate).collect(),
        infinite_cache_hit_rate: w.infinite_cache_hit_rate(cfg.engine.page_size),
        prefill_tokens_saved: cached,
        prefill_tokens_computed: report
            .devices
            .iter()
            .map(|d| d.scheduler.prefill_tokens)
            .sum(),
        duration_s,
        throughput_tok_s: output as f64 / duration_s,
        total_throughput_tok_s: (prompt + output) as f64 / duration_s,
        ttft_p50_ms: ms(&ttft, |s| s.p50_ns),
        ttft_p90_ms: ms(&ttft, |s| s.p90_ns),
        ttft_p99_ms: ms(&ttft, |s| s.p99_ns),
        e2e_p50_ms: ms(&e2e, |s| s.p50_ns),
        e2e_p90_ms: ms(&e2e, |s| s.p90_ns),
        e2e_p99_ms: ms(&e2e, |s| s.p99_ns),
        retractions: report
            .devices
            .iter()
            .map(|d| d.scheduler.retractions)
            .sum::<u64>()
            .max(retractions_seen),
        evicted_leaves_per_device: report
            .devices
            .iter()
            .map(|d| d.eviction.evicted_leaves)
            .collect(),
        evicted_tokens_per_device: report
            .devices
            .iter()
            .map(|d| d.eviction.evicted_tokens)
            .collect(),
        pool_use_per_device: report
            .devices
            .iter()
            .map(|d| ratio(d.used_pages, d.pool_pages))
            .collect(),
        wall_s: wall.elapsed().as_secs_f64(),
        max_concurrency,
        verified_requests: verification.verified,
        mismatches: verification.mismatches,
    })
}

/// The devices' prompt tokens summed.
fn sum(per_dev: &[PromptTokens]) -> PromptTokens {
    let mut all = PromptTokens::default();
    per_dev.iter().for_each(|&p| all += p);
    all
}

fn ratio(a: usize, b: usize) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

/// The summary as text: one block per run, or with several runs one
/// column per run (`--compare`).
pub fn format_summaries(runs: &[ReplaySummary]) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let Some(first) = runs.first() else {
        return s;
    };
    let _ = writeln!(
        s,
        "{}: {} requests on {} devices (infinite-cache hit rate {:.1}%)",
        first.workload,
        first.requests,
        first.devices,
        first.infinite_cache_hit_rate * 100.0
    );
    type Row = (&'static str, fn(&ReplaySummary) -> String);
    let rows: [Row; 26] = [
        ("router", |r| r.router.clone()),
        ("finished", |r| r.finished.to_string()),
        ("failed / rejected", |r| {
            format!("{} / {}", r.failed, r.rejected)
        }),
        ("token hit rate", |r| format!("{:.1}%", r.hit_rate * 100.0)),
        ("reuse rate (not recomputed)", |r| {
            format!("{:.1}%", r.reuse_rate * 100.0)
        }),
        ("tokens hit/host/peer/comp", |r| {
            format!(
                "{}/{}/{}/{}",
                r.tokens_device_hit,
                r.tokens_host_loaded,
                r.tokens_peer_copied,
                r.tokens_recomputed
            )
        }),
        ("copied GB / model s", |r| {
            format!("{:.1} / {:.2}", r.copy_bytes as f64 / 1e9, r.copy_time_s)
        }),
        ("copy / host tier", |r| {
            if r.host_pages == 0 {
                format!("{} / none", r.copy_policy)
            } else {
                format!("{} / {}", r.copy_policy, r.write_policy)
            }
        }),
        ("written to host", |r| r.host_written_tokens.to_string()),
        ("hit rate per device", |r| {
            r.hit_rate_per_device
                .iter()
                .map(|h| format!("{:.0}", h * 100.0))
                .collect::<Vec<_>>()
                .join(" ")
        }),
        ("prefill tokens saved", |r| {
            r.prefill_tokens_saved.to_string()
        }),
        ("prefill tokens computed", |r| {
            r.prefill_tokens_computed.to_string()
        }),
        ("output tokens", |r| r.output_tokens.to_string()),
        ("duration (model s)", |r| format!("{:.1}", r.duration_s)),
        ("output tok/s", |r| format!("{:.0}", r.throughput_tok_s)),
        ("TTFT p50/p90/p99 ms", |r| {
            format!(
                "{:.0}/{:.0}/{:.0}",
                r.ttft_p50_ms, r.ttft_p90_ms, r.ttft_p99_ms
            )
        }),
        ("e2e p50/p90/p99 ms", |r| {
            format!(
                "{:.0}/{:.0}/{:.0}",
                r.e2e_p50_ms, r.e2e_p90_ms, r.e2e_p99_ms
            )
        }),
        ("retractions", |r| r.retractions.to_string()),
        ("evicted tokens", |r| {
            r.evicted_tokens_per_device.iter().sum::<u64>().to_string()
        }),
        ("pool use at end", |r| {
            r.pool_use_per_device
                .iter()
                .map(|u| format!("{:.0}%", u * 100.0))
                .collect::<Vec<_>>()
                .join(" ")
        }),
        ("wall s", |r| format!("{:.1}", r.wall_s)),
        ("interrupted", |r| {
            if r.interrupted {
                format!("yes ({} not sent)", r.not_sent)
            } else {
                "no".into()
            }
        }),
        ("devices", |r| r.devices.to_string()),
        ("max concurrency", |r| {
            r.max_concurrency
                .map_or_else(|| "none".into(), |c| c.to_string())
        }),
        ("verified requests", |r| r.verified_requests.to_string()),
        ("mismatches", |r| r.mismatches.to_string()),
    ];
    for (name, f) in rows {
        let _ = write!(s, "{name:<24}");
        for r in runs {
            let _ = write!(s, " {:>16}", f(r));
        }
        let _ = writeln!(s);
    }
    s
}
