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
        /// A Mooncake trace (.jsonl or .jsonl.zst), or `gsp` for the built-in
        /// generated-shared-prefix workload (64 groups x 16, 2048 + 128).
        #[arg(long)]
        trace: String,
        /// Capacities as shares of the trace's distinct tokens.
        #[arg(long, value_delimiter = ',', default_value = "0.1,0.25,0.5")]
        capacity: Vec<f64>,
        /// Policies (default: all).
        #[arg(long, value_delimiter = ',')]
        policy: Vec<String>,
        /// Tokens per page.
        #[arg(long, default_value_t = 16)]
        page_size: usize,
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
            policy,
            page_size,
            json,
        } => {
            use radixkv::hitrate;
            let policies: Vec<EvictionPolicy> = if policy.is_empty() {
                EvictionPolicy::ALL.to_vec()
            } else {
                policy.iter().map(|p| p.parse()).collect::<Result<_, _>>()?
            };
            let t = if trace == "gsp" {
                hitrate::gsp(64, 16, 2048, 128, 1)
            } else {
                hitrate::read_mooncake(std::path::Path::new(&trace))?
            };
            let distinct = if page_size == 0 {
                0
            } else {
                t.distinct_tokens(page_size)
            };
            let rows = hitrate::evaluate_sized(&t, &policies, &capacity, page_size, distinct)?;
            println!(
                "{} ({} requests, {distinct} distinct tokens, page size {page_size})",
                t.name,
                t.requests.len()
            );
            println!(
                "{:<10} {:>9} {:>10} {:>16}",
                "policy", "capacity", "hit rate", "evicted tokens"
            );
            for r in &rows {
                println!(
                    "{:<10} {:>8.0}% {:>9.1}% {:>16}",
                    r.policy,
                    r.capacity * 100.0,
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
