//! The `radixkv` command line.

use clap::{Parser, Subcommand};
use radixkv::conformance::Runner;
use radixkv::EvictionPolicy;
use std::io::{self, BufReader};
use std::path::PathBuf;
use std::process::ExitCode;

/// radixkv: a concurrent prefix (KV) cache for multi-GPU LLM serving.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The main job: replay a workload through the multi-device engine
    /// (simulated GPUs) and summarize what prefix caching bought. With no
    /// flags: SGLang's generated-shared-prefix workload (64 groups x 16
    /// prompts, 2048 + 128 tokens, 256 output tokens, seed 42) on 4
    /// devices, cache-aware routing, lpm scheduling.
    Replay(ReplayArgs),
    /// Replay an op trace (SGLang conformance format) on one device and print
    /// one JSON line per op.
    Ops {
        /// Tokens per page.
        #[arg(long, default_value_t = 1)]
        page_size: usize,
        /// Eviction policy: lru, lfu, fifo, mru, filo or priority.
        #[arg(long, default_value = "lru")]
        policy: String,
        /// The trace file; standard input when absent.
        trace: Option<PathBuf>,
    },
    /// Hit rates of a request trace per eviction policy and capacity, with
    /// Belady's MIN as the offline bound.
    Hitrate {
        /// The trace: a file (Mooncake requests or agentic conversations,
        /// JSONL, plain or zstd-compressed; the first line tells which),
        /// `gsp` for the built-in generated-shared-prefix workload (64
        /// groups x 16 prompts, 2048 + 128 tokens), or `chat` for the
        /// built-in multi-turn chat (64 conversations x 8 turns, a shared
        /// 1024-token system prompt, 128-token user messages, 256-token
        /// replies).
        #[arg(long)]
        trace: String,
        /// Capacities as shares of the trace's distinct tokens (default
        /// 0.1,0.25,0.5; not with --pages).
        #[arg(long, value_delimiter = ',')]
        capacity: Vec<f64>,
        /// Capacities as pool sizes in pages (not with --capacity); rows
        /// report the share pages x page size / distinct tokens.
        #[arg(long, value_delimiter = ',')]
        pages: Vec<usize>,
        /// Policies (default: all).
        #[arg(long, value_delimiter = ',')]
        policy: Vec<String>,
        /// Tokens per page.
        #[arg(long, default_value_t = 16)]
        page_size: usize,
        /// Seed of the generators and of the agentic conversations' start
        /// times.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Agentic traces: mean gap in seconds between the starts of the
        /// merged conversations (a Poisson process).
        #[arg(long, default_value_t = radixkv::hitrate::AGENTIC_MEAN_GAP_S)]
        gap_s: f64,
        /// Also write the rows as JSON to this file.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Torture run: scheduler threads run request lifecycles at random under
    /// memory pressure; then audit. Exits non-zero if anything is wrong.
    Stress {
        /// Devices.
        #[arg(long, default_value_t = 4)]
        devices: usize,
        /// Pages per device (page 0 reserved).
        #[arg(long, default_value_t = 4096)]
        pages: usize,
        /// Tokens per page.
        #[arg(long, default_value_t = 16)]
        page_size: usize,
        /// Scheduler threads.
        #[arg(long, default_value_t = 4)]
        threads: usize,
        /// Duration in seconds.
        #[arg(long, default_value_t = 10.0)]
        seconds: f64,
        /// PRNG seed.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Also write the report as JSON to this file.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Serve the engine over HTTP: POST /v1/completions (OpenAI-style),
    /// GET /metrics (Prometheus), /stats (JSON), /health. Stops on
    /// SIGINT/SIGTERM after draining in-flight requests.
    Serve(ServeArgs),
}

/// `radixkv serve` options.
#[derive(clap::Args, Debug)]
struct ServeArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: std::net::IpAddr,
    /// Port (0: an ephemeral port, printed at start).
    #[arg(long, default_value_t = 8000)]
    port: u16,
    #[command(flatten)]
    engine: EngineArgs,
    /// Model backend: `sim` (the cost-model simulator) or `tiny` (the tiny
    /// candle transformer on the CPU, K/V in host pools). Pools default to
    /// 16,384 pages per device, or 4,096 tokens' worth with `tiny`.
    #[arg(long, default_value = "sim")]
    model: String,
    /// Model time per wall time of the simulated GPUs (`--model sim`).
    #[arg(long, default_value_t = 50.0)]
    speedup: f64,
    /// Requests admitted at once (queued, running or streaming); more are
    /// answered 429 with Retry-After.
    #[arg(long, default_value_t = 256)]
    max_queue: usize,
    /// Largest max_tokens a request may ask for.
    #[arg(long, default_value_t = 4096)]
    max_tokens_limit: usize,
    /// Largest request body in bytes (larger: 413).
    #[arg(long, default_value_t = 4 << 20)]
    max_body_bytes: usize,
    /// Seconds a shutdown waits for in-flight requests before stopping them.
    #[arg(long, default_value_t = 30.0)]
    drain_timeout_s: f64,
}

fn serve_cmd(a: ServeArgs) -> Result<(), Box<dyn std::error::Error>> {
    use radixkv::engine::backend::{CostModel, ModelBackend, SimulatedBackend};
    use radixkv::engine::{Engine, EngineConfig};
    use radixkv::server::{shutdown_signal, Server, ServerConfig};
    if !(a.drain_timeout_s.is_finite() && a.drain_timeout_s >= 0.0) {
        return Err(format!(
            "--drain-timeout-s must be a non-negative number, not {}",
            a.drain_timeout_s
        )
        .into());
    }
    let tiny = a.model == "tiny";
    let e = &a.engine;
    let pages_per_device = e.pages_per_device.unwrap_or(if tiny {
        4096 / e.page_size.max(1) + 1
    } else {
        16_384
    });
    let mut cfg = EngineConfig {
        pages_per_device,
        ..EngineConfig::default()
    };
    e.apply(&mut cfg)?;
    let backend: std::sync::Arc<dyn ModelBackend> = match a.model.as_str() {
        "sim" | "simulated" => {
            std::sync::Arc::new(SimulatedBackend::new(CostModel::default(), a.speedup))
        }
        "tiny" => {
            use radixkv::engine::tiny::{TinyBackend, TinyBackendConfig};
            std::sync::Arc::new(TinyBackend::new(TinyBackendConfig::for_engine(&cfg))?)
        }
        other => return Err(format!("unknown --model {other} (sim or tiny)").into()),
    };
    let scfg = ServerConfig {
        max_queue: a.max_queue,
        max_tokens_limit: a.max_tokens_limit,
        max_body_bytes: a.max_body_bytes,
        drain_timeout: std::time::Duration::from_secs_f64(a.drain_timeout_s),
        model_name: format!("radixkv-{}", a.model),
        ..ServerConfig::default()
    };
    let engine = Engine::start(cfg, backend)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("radixkv-http")
        .build()?;
    let report = rt.block_on(async move {
        let server = Server::bind(std::net::SocketAddr::new(a.host, a.port), engine, scfg).await?;
        let addr = server.local_addr()?;
        {
            use std::io::Write as _;
            let mut out = io::stdout().lock();
            writeln!(out, "radixkv serve: listening on http://{addr}")?;
            out.flush()?;
        }
        let report = server.run(shutdown_signal()).await?;
        Ok::<_, Box<dyn std::error::Error>>(report)
    })?;
    rt.shutdown_timeout(std::time::Duration::from_secs(2));
    if report.drained {
        eprintln!("radixkv serve: shut down, all in-flight requests finished");
    } else {
        eprintln!(
            "radixkv serve: shut down, drain timed out; {} requests stopped",
            report.abandoned
        );
    }
    Ok(())
}

/// `radixkv replay` options.
#[derive(clap::Args, Debug)]
struct ReplayArgs {
    /// The workload: `gsp`, `chat` or `tot` (built-in generators), or a
    /// trace file (Mooncake or agentic JSONL, plain or zstd-compressed).
    #[arg(long, default_value = "gsp")]
    workload: String,
    /// GSP: groups (system prompts).
    #[arg(long, default_value_t = 64)]
    gsp_groups: usize,
    /// GSP: prompts per group.
    #[arg(long, default_value_t = 16)]
    gsp_prompts: usize,
    /// GSP: system prompt tokens.
    #[arg(long, default_value_t = 2048)]
    gsp_system: usize,
    /// GSP: question tokens.
    #[arg(long, default_value_t = 128)]
    gsp_question: usize,
    /// Output tokens per request (generators; traces bring their own and
    /// use this only where they record none).
    #[arg(long, default_value_t = 256)]
    output_len: usize,
    /// Trace files: replay only the first N requests.
    #[arg(long)]
    max_requests: Option<usize>,
    /// Seed of the generators and of Poisson arrivals.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// The engine (pools default to enough for the whole workload).
    #[command(flatten)]
    engine: EngineArgs,
    /// Model time per wall time of the simulated GPUs.
    #[arg(long, default_value_t = 4.0)]
    speedup: f64,
    /// Requests per second (Poisson, model time) instead of the workload's
    /// arrival times; `inf` sends everything at once.
    #[arg(long)]
    request_rate: Option<f64>,
    /// Run the workload under several routers and print them side by side
    /// (default when given without a list: all four).
    #[arg(long, value_delimiter = ',', num_args = 0.., default_missing_value = "cache-aware,round-robin,least-loaded,private")]
    compare: Option<Vec<String>>,
    /// Write the summary (a list with --compare) as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// No progress output.
    #[arg(long)]
    quiet: bool,
    /// The model behind the engine: `simulated` (a cost model) or `tiny` (a
    /// small candle transformer computing for real on the CPU, its KV in
    /// per-device pools at the slots the cache allocates). With `tiny` and
    /// the default gsp sizes and pool, a smaller workload runs: 256
    /// requests of 64 + 16 tokens, 4 output tokens, 512 KV tokens per
    /// device (prefixes get evicted and inserted again).
    #[arg(long, default_value = "simulated")]
    model: String,
    /// With --model tiny: check every computed position against a dense
    /// recomputation; the command fails if any mismatches.
    #[arg(long)]
    verify: bool,
    /// With --model tiny: where the KV pools live, `host` or `cuda` (GPU
    /// memory; needs a build with --features cuda and a CUDA driver).
    #[arg(long, default_value = "host")]
    kv_pool: String,
}

/// The engine's options, shared by `serve` and `replay`.
#[derive(clap::Args, Debug)]
struct EngineArgs {
    /// Devices (simulated GPUs), one scheduler thread each.
    #[arg(long, default_value_t = 4)]
    devices: usize,
    /// Tokens per KV page.
    #[arg(long, default_value_t = 16)]
    page_size: usize,
    /// KV pages per device, page 0 reserved (default: see the command).
    #[arg(long)]
    pages_per_device: Option<usize>,
    /// Router: cache-aware, round-robin, least-loaded or private.
    #[arg(long, default_value = "cache-aware")]
    router: String,
    /// Waiting-queue policy: fcfs, lof, random, lpm or dfs-weight.
    #[arg(long, default_value = "lpm")]
    schedule_policy: String,
    /// Eviction policy of the tree.
    #[arg(long, default_value = "lru")]
    eviction: String,
}

impl EngineArgs {
    /// Sets everything but the pool size, validating the names.
    fn apply(
        &self,
        cfg: &mut radixkv::engine::EngineConfig,
    ) -> Result<(), Box<dyn std::error::Error>> {
        cfg.devices = self.devices;
        cfg.page_size = self.page_size;
        cfg.eviction_policy = self.eviction.parse()?;
        cfg.router.kind = self.router.parse()?;
        cfg.scheduler.policy.policy = self.schedule_policy.parse()?;
        Ok(())
    }
}

/// Set by Ctrl-C: the replay stops and prints what it has.
static INTERRUPTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn replay_cmd(a: ReplayArgs) -> Result<(), Box<dyn std::error::Error>> {
    use radixkv::engine::router::RouterKind;
    use radixkv::replay::{format_summaries, replay, ReplayConfig};
    let tiny = match a.model.as_str() {
        "simulated" | "sim" => false,
        "tiny" => true,
        m => return Err(format!("unknown model {m:?} (simulated or tiny)").into()),
    };
    if a.verify && !tiny {
        return Err("--verify needs --model tiny".into());
    }
    // The default gsp sizes with the tiny model: its own, smaller workload.
    let gsp_sizes = (a.gsp_groups, a.gsp_prompts, a.gsp_system, a.gsp_question);
    let tiny_default =
        tiny && a.workload == "gsp" && gsp_sizes == (64, 16, 2048, 128) && a.output_len == 256;
    let w = match a.workload.as_str() {
        "gsp" if tiny_default => radixkv::engine::tiny::default_workload(a.seed),
        "gsp" => radixkv::workload::gsp(
            a.gsp_groups,
            a.gsp_prompts,
            a.gsp_system,
            a.gsp_question,
            a.output_len,
            a.seed,
        ),
        "chat" => radixkv::workload::chat(
            &radixkv::workload::ChatShape {
                assistant: a.output_len,
                ..Default::default()
            },
            a.seed,
        ),
        "tot" => radixkv::workload::tree_of_thought(
            &radixkv::workload::TreeShape {
                output: a.output_len,
                ..Default::default()
            },
            a.seed,
        ),
        path => radixkv::workload::from_trace_file(
            std::path::Path::new(path),
            a.seed,
            a.output_len,
            a.max_requests,
        )?,
    };
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
        seed: a.seed,
        progress: !a.quiet,
        ..ReplayConfig::default()
    };
    a.engine.apply(&mut cfg.engine)?;
    if tiny {
        cfg.model = radixkv::replay::ReplayModel::Tiny {
            model: radixkv::engine::tiny::TinyConfig::default(),
            pool: a.kv_pool.parse()?,
            verify: a.verify,
        };
    }
    cfg.engine.pages_per_device = match a.engine.pages_per_device {
        Some(p) => p,
        None if tiny_default => radixkv::engine::tiny::default_pages_per_device(a.engine.page_size),
        None => {
            // Every request's prompt and output, once: no eviction needed.
            let tokens: usize = w
                .requests
                .iter()
                .map(|r| r.tokens.len() + r.output_len)
                .sum();
            (tokens / a.engine.page_size.max(1) + 2).min(1 << 22)
        }
    };
    let _ = ctrlc::set_handler(|| {
        INTERRUPTED.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    let mut runs = Vec::new();
    for r in routers {
        cfg.engine.router.kind = r;
        runs.push(replay(&w, &cfg, &INTERRUPTED)?);
        if INTERRUPTED.load(std::sync::atomic::Ordering::Relaxed) {
            break;
        }
    }
    print!("{}", format_summaries(&runs));
    if let Some(p) = a.json {
        let text = if a.compare.is_some() {
            serde_json::to_string_pretty(&runs)?
        } else {
            serde_json::to_string_pretty(&runs[0])?
        };
        std::fs::write(&p, text).map_err(|e| format!("cannot write {}: {e}", p.display()))?;
    }
    let mismatches: u64 = runs.iter().map(|r| r.mismatches).sum();
    if mismatches > 0 {
        return Err(format!("{mismatches} requests mismatched the dense reference").into());
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("radixkv: {e}");
            ExitCode::from(2)
        }
    }
}

fn run(cli: Cli) -> Result<(), Box<dyn std::error::Error>> {
    match cli.command {
        Command::Replay(a) => replay_cmd(a),
        Command::Serve(a) => serve_cmd(a),
        Command::Ops {
            page_size,
            policy,
            trace,
        } => {
            let policy: EvictionPolicy = policy.parse()?;
            let mut runner = Runner::new(page_size, policy)?;
            let out = io::BufWriter::new(io::stdout().lock());
            match trace {
                Some(p) => {
                    let f = std::fs::File::open(&p)
                        .map_err(|e| format!("cannot open {}: {e}", p.display()))?;
                    runner.run(BufReader::new(f), out)?;
                }
                None => runner.run(io::stdin().lock(), out)?,
            }
            Ok(())
        }
        Command::Hitrate {
            trace,
            capacity,
            pages,
            policy,
            page_size,
            seed,
            gap_s,
            json,
        } => {
            use radixkv::hitrate;
            if !capacity.is_empty() && !pages.is_empty() {
                return Err("give --capacity (shares) or --pages (pool sizes), not both".into());
            }
            if pages.contains(&0) {
                return Err("--pages must be at least 1".into());
            }
            if page_size == 0 {
                return Err("--page-size must be at least 1".into());
            }
            if !(gap_s.is_finite() && gap_s >= 0.0) {
                return Err(format!("--gap-s must be a non-negative number, not {gap_s}").into());
            }
            let policies: Vec<EvictionPolicy> = if policy.is_empty() {
                EvictionPolicy::ALL.to_vec()
            } else {
                policy.iter().map(|p| p.parse()).collect::<Result<_, _>>()?
            };
            let t = match trace.as_str() {
                "gsp" => hitrate::gsp(64, 16, 2048, 128, seed),
                "chat" => hitrate::chat(64, 8, 1024, 128, 256, seed),
                path => hitrate::read_trace(std::path::Path::new(path), seed, gap_s)?,
            };
            let distinct = t.distinct_tokens(page_size);
            println!(
                "{} ({} requests, {} input tokens, {distinct} distinct tokens, page size {page_size})",
                t.name,
                t.requests.len(),
                t.input_tokens()
            );
            let rows = if pages.is_empty() {
                let capacity = if capacity.is_empty() {
                    vec![0.1, 0.25, 0.5]
                } else {
                    capacity
                };
                hitrate::evaluate_sized(&t, &policies, &capacity, page_size, distinct)?
            } else {
                hitrate::evaluate_pages(&t, &policies, &pages, page_size, distinct)?
            };
            println!(
                "{:<10} {:>9} {:>12} {:>10} {:>16}",
                "policy", "capacity", "pages", "hit rate", "evicted tokens"
            );
            for r in &rows {
                println!(
                    "{:<10} {:>8.1}% {:>12} {:>9.1}% {:>16}",
                    r.policy,
                    r.capacity * 100.0,
                    r.pages,
                    r.hit_rate_tokens * 100.0,
                    r.evicted_tokens
                );
            }
            if let Some(p) = json {
                std::fs::write(&p, serde_json::to_string_pretty(&rows)?)
                    .map_err(|e| format!("cannot write {}: {e}", p.display()))?;
            }
            Ok(())
        }
        Command::Stress {
            devices,
            pages,
            page_size,
            threads,
            seconds,
            seed,
            json,
        } => {
            if !(seconds.is_finite() && seconds >= 0.0) {
                return Err(
                    format!("--seconds must be a non-negative number, not {seconds}").into(),
                );
            }
            let cfg = radixkv::torture::TortureConfig {
                devices,
                pages,
                page_size,
                threads: threads.max(1),
                duration: std::time::Duration::from_secs_f64(seconds),
                seed,
            };
            let report = radixkv::torture::run(&cfg)?;
            let text = serde_json::to_string_pretty(&report)?;
            println!("{text}");
            if let Some(p) = json {
                std::fs::write(&p, &text)
                    .map_err(|e| format!("cannot write {}: {e}", p.display()))?;
            }
            if !report.ok() {
                return Err("torture run found a problem (see the report)".into());
            }
            Ok(())
        }
    }
}
