//! The bench's command line.

use clap::Parser;
use std::path::PathBuf;

/// radixkv against Dynamo's KV indexes (dynamo-kv-router 1.6.1) in one run.
#[derive(Parser, Debug, Clone)]
#[command(version, about)]
pub(crate) struct Args {
    /// CI size: 100 requests per prompt instead of 1,000, fewer queries.
    #[arg(long)]
    pub(crate) quick: bool,
    /// Write every figure as flat JSON to this file.
    #[arg(long)]
    pub(crate) json: Option<PathBuf>,
    /// Run the whole bench in N fresh processes and report the median of
    /// each figure (the "medians of 3 fresh processes").
    #[arg(long, default_value_t = 1)]
    pub(crate) processes: usize,
    /// Only the scaling phase, at these thread counts (e.g. 1,2,4,8,16):
    /// queries and mixed 50/50 on W1 with 16 devices.
    #[arg(long, value_delimiter = ',')]
    pub(crate) scaling: Vec<usize>,
    /// Workloads to run (w1, w2, mooncake).
    #[arg(long, value_delimiter = ',', default_value = "w1,w2,mooncake")]
    pub(crate) workloads: Vec<String>,
    /// Requests in prompt order instead of shuffled (the old bench's order).
    #[arg(long)]
    pub(crate) in_order: bool,
    /// Directory of the shipped traces (the Mooncake phase).
    #[arg(long, default_value = "../shared/workloads")]
    pub(crate) traces: PathBuf,
}
