//! The `radixkv` command line: one module per command.
//!
//! | command | module | what it runs |
//! | --- | --- | --- |
//! | `replay` | [`replay`] | the main job: a workload through the multi-device engine, summarized |
//! | `serve` | [`serve`] | the engine behind HTTP (`radixkv-server`) |
//! | `index` | [`index`] | the KV index routers ask, fed by workers' KV events (`radixkv-index-service`) |
//! | `ops` | [`ops`] | the SGLang conformance runner |
//! | `hitrate` | [`hitrate`] | hit rates per eviction policy and capacity, with Belady's bound |
//! | `stress` | [`stress`] | random request lifecycles under memory pressure, then an audit |
//!
//! Shared by several commands: `args.rs` (the engine's and workload's
//! options, JSON output), `model.rs` (`--model`: which backend, from
//! `radixkv-models`), `kv_events.rs` (`--kv-events`), `ranges.rs` (the
//! numeric flags' ranges, checked as clap parses them).

mod args;
mod hitrate;
mod index;
mod kv_events;
mod model;
mod ops;
mod ranges;
mod replay;
mod serve;
mod stress;

use clap::{Parser, Subcommand};
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
    Replay(replay::ReplayArgs),
    /// Replay an op trace (SGLang conformance format) on one device and print
    /// one JSON line per op.
    Ops(ops::OpsArgs),
    /// Hit rates of a workload per eviction policy and capacity, with
    /// Belady's MIN as the offline bound: one device, each request's real
    /// lifecycle, every request finished before the next.
    Hitrate(hitrate::HitrateArgs),
    /// Torture run: scheduler threads run request lifecycles at random under
    /// memory pressure; then audit. Exits non-zero if anything is wrong.
    Stress(stress::StressArgs),
    /// Serve the engine over HTTP, OpenAI-style: POST /v1/completions and
    /// /v1/chat/completions (streaming too), GET /v1/models; the cache's
    /// view for routers: POST /query and /query_by_hash (with --kv-events);
    /// GET/POST /admin/config (run-time settings; loopback only by
    /// default); GET /metrics (Prometheus), /stats (JSON), /health. Stops
    /// on SIGINT/SIGTERM after draining in-flight requests (at most
    /// --drain-timeout-s).
    Serve(serve::ServeArgs),
    /// The KV index routers ask: follows workers' KV events (vLLM's,
    /// SGLang's, radixkv's; ZeroMQ) into one tree and answers which worker
    /// holds how much of a prompt. A drop-in for NVIDIA Dynamo's standalone
    /// indexer: its flags and its routes (POST /register, /unregister,
    /// /query, /query_by_hash; GET /workers, /health, /metrics).
    Index(index::IndexArgs),
}

/// What every command returns: a message for stderr on failure.
type CmdResult = Result<(), Box<dyn std::error::Error>>;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let done = match cli.command {
        Command::Replay(a) => replay::run(a),
        Command::Serve(a) => serve::run(a),
        Command::Index(a) => index::run(a),
        Command::Ops(a) => ops::run(a),
        Command::Hitrate(a) => hitrate::run(a),
        Command::Stress(a) => stress::run(a),
    };
    match done {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("radixkv: {e}");
            ExitCode::from(2)
        }
    }
}
