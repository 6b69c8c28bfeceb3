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
