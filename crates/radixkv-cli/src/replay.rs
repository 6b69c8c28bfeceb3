//! `radixkv replay`: the main job. A workload through the multi-device
//! engine, one summary per router.

use crate::args::{EngineArgs, WorkloadArgs};
use crate::model::ModelArg;
use crate::CmdResult;
use radixkv_engine::router::RouterKind;
use radixkv_tools::replay::{format_summaries, replay, ReplayConfig};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

/// `radixkv replay` options.
#[derive(clap::Args, Debug)]
pub struct ReplayArgs {
    /// The requests: a generator or a trace file.
    #[command(flatten)]
    workload: WorkloadArgs,
    /// The engine (pools default to enough for the whole workload).
    #[command(flatten)]
    engine: EngineArgs,
    /// Model time per wall time of the simulated GPUs (0.001 to 10⁹;
    /// --model tiny and gguf:PATH run in wall time and ignore it).
    #[arg(long, default_value_t = 4.0, value_parser = crate::ranges::speedup)]
    speedup: f64,
    /// Requests per second (Poisson, model time) instead of the workload's
    /// arrival times; `inf` sends everything at once.
    #[arg(long)]
    request_rate: Option<f64>,
    /// At most this many requests outstanding at once: a request is sent
    /// at its arrival time or when an earlier one finishes, whichever is
    /// later (as in SGLang's and vLLM's serving benchmarks). `1` replays
    /// one request at a time, the same way on every machine.
    #[arg(long, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    max_concurrency: Option<usize>,
    /// Run the workload under each of these routers instead of --router and
    /// print them side by side (default when given without a list: all
    /// four).
    #[arg(long, value_delimiter = ',', num_args = 0.., default_missing_value = "cache-aware,round-robin,least-loaded,private")]
    compare: Option<Vec<String>>,
    /// Run under each of these copy policies (none, host, peer, all)
    /// instead of --copy, side by side: with --compare, every router under
    /// every policy.
    #[arg(long, value_delimiter = ',')]
    compare_copy: Option<Vec<String>>,
    /// Run under each of these write policies (write-back, write-through,
    /// write-through-selective) instead of --write-policy, side by side:
    /// with --compare or --compare-copy, under every combination.
    #[arg(long, value_delimiter = ',')]
    compare_write: Option<Vec<String>>,
    /// Write the summary (a list with --compare, --compare-copy or
    /// --compare-write) as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// No progress output.
    #[arg(long)]
    quiet: bool,
    /// Every request in a cache namespace of its own: nothing is reused
    /// (the baseline without a prefix cache).
    #[arg(long)]
    no_prefix_sharing: bool,
    /// The model behind the engine: `simulated` or `sim` (a cost model),
    /// `tiny` (a small random-weights candle transformer) or `gguf:PATH`
    /// (a GGUF llama such as SmolLM2-135M-Instruct: scripts/fetch-smollm2.sh
    /// prints its path). The last two compute for real on the CPU, their
    /// K/V in per-device pools at the slots the cache allocates, on 2
    /// devices by default. With `--workload gsp` at the default gsp sizes
    /// and --output-len they run smaller workloads: `tiny` 256 requests of
    /// 64 + 16 tokens and 4 output tokens, 512 KV tokens per device;
    /// `gguf:PATH` 96 requests of 256 + 32 tokens and 16 output tokens, 768
    /// KV tokens per device (about 30 s on 2 cores; --verify adds a dense
    /// recomputation of every checked request). Prefixes get evicted and
    /// come back.
    #[arg(long, default_value = "simulated")]
    model: ModelArg,
    /// With a real model: check each request against a dense
    /// recomputation by separate code (every computed position with
    /// `tiny`, every sampled one with `gguf:PATH`); the command fails if
    /// any mismatches.
    #[arg(long)]
    verify: bool,
    /// With a real model: where the KV pools live, `host` or `cuda` (GPU
    /// memory; needs a build with --features cuda and a CUDA driver).
    #[arg(long, default_value = "host")]
    #[cfg_attr(not(feature = "candle"), allow(dead_code))] // read only with a real model
    kv_pool: String,
    /// Publish the run's KV events, so that a router can watch the trace.
    #[command(flatten)]
    kv_events: crate::kv_events::KvEventArgs,
}

/// KV tokens per device of the default `--model gguf:PATH` replay: less
/// than its workload's distinct tokens, so prefixes are evicted and
/// come back (from the host tier, or recomputed).
const GGUF_DEFAULT_POOL_TOKENS: usize = 768;

/// Set by SIGINT or SIGTERM: the replay stops and prints what it has.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// Watches for SIGINT/SIGTERM (the server's `shutdown_signals`, the one
/// signal mechanism of the binary) on a small thread of its own and sets
/// [`INTERRUPTED`].
fn interrupt_on_signal() {
    let watch = || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        // Made inside the runtime: the handlers are installed there.
        rt.block_on(async { radixkv_server::shutdown_signals().0.await });
        INTERRUPTED.store(true, Ordering::Relaxed);
        Ok::<(), std::io::Error>(())
    };
    let _ = std::thread::Builder::new()
        .name("radixkv-signal".into())
        .spawn(move || {
            if let Err(e) = watch() {
                eprintln!("radixkv replay: no interrupt handler ({e})");
            }
        });
}

/// Loads the workload, runs it under each router, prints the summaries.
pub fn run(a: ReplayArgs) -> CmdResult {
    let model = a.model.clone();
    #[cfg(not(feature = "candle"))]
    if model == ModelArg::Tiny {
        return Err(crate::model::NO_CANDLE.into());
    }
    #[cfg(not(feature = "gguf"))]
    if matches!(model, ModelArg::Gguf(_)) {
        return Err(crate::model::NO_GGUF.into());
    }
    if a.verify && !model.is_real() {
        return Err("--verify needs a real model: --model tiny or gguf:PATH".into());
    }
    // The default gsp sizes with a real model: its own, smaller workload.
    let small_default = model.is_real() && a.workload.is_default_gsp();
    let w = match &model {
        #[cfg(feature = "candle")]
        ModelArg::Tiny if small_default => {
            radixkv_tools::replay::tiny_default_workload(a.workload.seed)
        }
        #[cfg(feature = "gguf")]
        ModelArg::Gguf(_) if small_default => {
            radixkv_tools::replay::gguf_default_workload(a.workload.seed)
        }
        _ => a.workload.load()?,
    };
    let w = w.for_replay(a.workload.output_len, a.workload.max_requests)?;
    if w.requests.is_empty() {
        return Err(format!("workload {} has no requests", w.name).into());
    }
    if let Some(r) = a.request_rate {
        // `inf` is allowed (everything at once); 0, negative and NaN are not.
        if r.is_nan() || r <= 0.0 {
            return Err(format!("--request-rate must be positive (or inf), not {r}").into());
        }
    }
    let routers: Vec<RouterKind> = match &a.compare {
        Some(list) => list.iter().map(|r| r.parse()).collect::<Result<_, _>>()?,
        None => vec![a.engine.router.parse()?],
    };
    let mut cfg = ReplayConfig {
        speedup: a.speedup,
        request_rate: a.request_rate,
        seed: a.workload.seed,
        max_concurrency: a.max_concurrency,
        progress: !a.quiet,
        share_prefixes: !a.no_prefix_sharing,
        ..ReplayConfig::default()
    };
    a.engine.apply(&mut cfg.engine, model.is_real())?;
    match &model {
        #[cfg(feature = "candle")]
        ModelArg::Tiny => {
            cfg.model = radixkv_tools::replay::ReplayModel::Tiny {
                model: radixkv_models::tiny::TinyConfig::default(),
                pool: a.kv_pool.parse()?,
                verify: a.verify,
            }
        }
        #[cfg(feature = "gguf")]
        ModelArg::Gguf(path) => {
            cfg.model = radixkv_tools::replay::ReplayModel::Gguf {
                path: path.clone(),
                pool: a.kv_pool.parse()?,
                verify: a.verify,
            }
        }
        _ => {}
    }
    let ps = a.engine.page_size.max(1);
    cfg.engine.pages_per_device = match a.engine.pages_per_device {
        Some(p) => p,
        #[cfg(feature = "candle")]
        None if small_default && model == ModelArg::Tiny => {
            radixkv_models::tiny::default_pages_per_device(ps)
        }
        None if small_default => GGUF_DEFAULT_POOL_TOKENS / ps + 1,
        // Every request's prompt and output, once: no eviction needed.
        None => (w.total_tokens() / a.engine.page_size.max(1) + 2).min(1 << 22),
    };
    a.engine.apply_tiers(&mut cfg.engine)?;
    // Every router under every copy and write policy compared (each list
    // defaults to the one setting of the run).
    let copies: Vec<radixkv_engine::tiers::CopyPolicy> = match &a.compare_copy {
        Some(list) => list.iter().map(|c| c.parse()).collect::<Result<_, _>>()?,
        None => vec![cfg.engine.tiers.copy],
    };
    let writes: Vec<radixkv_engine::tiers::WritePolicy> = match &a.compare_write {
        Some(list) => list.iter().map(|c| c.parse()).collect::<Result<_, _>>()?,
        None => vec![cfg.engine.tiers.write],
    };
    let mut settings = Vec::new();
    for &r in &routers {
        for &c in &copies {
            for &wp in &writes {
                settings.push((r, c, wp));
            }
        }
    }
    for &(_, c, wp) in &settings {
        let mut t = cfg.engine.tiers.clone();
        (t.copy, t.write) = (c, wp);
        t.validate()?;
    }
    // KV events: one run only (several runs would each start from an empty
    // cache on the same sockets).
    let events_rt = if a.kv_events.kv_events.is_some() {
        if settings.len() > 1 {
            return Err(
                "--kv-events publishes one run: drop --compare, --compare-copy and --compare-write"
                    .into(),
            );
        }
        Some(
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .thread_name("radixkv-kv-events")
                .build()?,
        )
    } else {
        None
    };
    let publisher = match &events_rt {
        Some(rt) => rt.block_on(crate::kv_events::start(
            &a.kv_events,
            &mut cfg.engine,
            false,
        ))?,
        None => None,
    };
    interrupt_on_signal();
    let mut runs = Vec::new();
    for (r, c, wp) in settings {
        cfg.engine.router.kind = r;
        cfg.engine.tiers.copy = c;
        cfg.engine.tiers.write = wp;
        runs.push(replay(&w, &cfg, &INTERRUPTED)?);
        if INTERRUPTED.load(Ordering::Relaxed) {
            break;
        }
    }
    if let (Some(rt), Some(p)) = (&events_rt, publisher) {
        // The engine and its caches are gone with the run: flush what is queued.
        let stats = match std::sync::Arc::try_unwrap(p) {
            Ok(p) => rt.block_on(p.shutdown()),
            Err(p) => p.stats(),
        };
        let sent: u64 = stats.iter().map(|s| s.events).sum();
        let dropped: u64 = stats.iter().map(|s| s.dropped_events).sum();
        eprintln!("radixkv replay: {sent} KV events published, {dropped} dropped");
    }
    print!("{}", format_summaries(&runs));
    if let Some(p) = &a.json {
        if a.compare.is_some() || a.compare_copy.is_some() || a.compare_write.is_some() {
            crate::args::write_json(p, &runs)?;
        } else {
            crate::args::write_json(p, &runs[0])?;
        }
    }
    let mismatches: u64 = runs.iter().map(|r| r.mismatches).sum();
    if mismatches > 0 {
        return Err(format!("{mismatches} requests mismatched the dense reference").into());
    }
    Ok(())
}
