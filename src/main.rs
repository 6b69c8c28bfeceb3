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
    }
}
