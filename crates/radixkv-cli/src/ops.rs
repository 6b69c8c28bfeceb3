//! `radixkv ops`: the SGLang conformance runner over an op trace.

use crate::CmdResult;
use radixkv::EvictionPolicy;
use radixkv_tools::conformance::Runner;
use std::io::{self, BufReader};
use std::path::PathBuf;

/// `radixkv ops` options.
#[derive(clap::Args, Debug)]
pub struct OpsArgs {
    /// Tokens per page.
    #[arg(long, default_value_t = 1)]
    page_size: usize,
    /// Eviction policy: lru, lfu, fifo, mru, filo, priority, slru or sieve.
    #[arg(long, default_value = "lru")]
    policy: String,
    /// The trace file; standard input when absent.
    trace: Option<PathBuf>,
}

/// Runs the op trace, one JSON line per op on standard output.
pub fn run(a: OpsArgs) -> CmdResult {
    let policy: EvictionPolicy = a.policy.parse()?;
    let mut runner = Runner::new(a.page_size, policy)?;
    let out = io::BufWriter::new(io::stdout().lock());
    match a.trace {
        Some(p) => {
            let f =
                std::fs::File::open(&p).map_err(|e| format!("cannot open {}: {e}", p.display()))?;
            runner.run(BufReader::new(f), out)?;
        }
        None => runner.run(io::stdin().lock(), out)?,
    }
    Ok(())
}
