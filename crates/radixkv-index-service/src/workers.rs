//! The `--workers` list of Dynamo's indexer: `ID[:RANK]=ENDPOINT`, comma
//! separated (rank 0 when left out).
//!
//! ```
//! use radixkv_index_service::workers::{parse_workers, WorkerSpec};
//! let w = parse_workers("1=tcp://127.0.0.1:5557, 2:1=tcp://127.0.0.1:5558").unwrap();
//! assert_eq!(w[1], WorkerSpec { instance_id: 2, dp_rank: 1, endpoint: "tcp://127.0.0.1:5558".into() });
//! assert!(parse_workers("1").is_err());
//! ```

use crate::registry::check_endpoint;

/// One entry of the list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerSpec {
    /// The worker.
    pub instance_id: u64,
    /// Its rank.
    pub dp_rank: u32,
    /// The endpoint.
    pub endpoint: String,
}

/// Why the list is malformed (the entry named).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid worker entry {entry:?}: {why} (expected ID[:RANK]=ENDPOINT)")]
pub struct WorkersError {
    /// The entry.
    pub entry: String,
    /// What is wrong with it.
    pub why: String,
}

/// Parses the list; empty entries are skipped.
pub fn parse_workers(s: &str) -> Result<Vec<WorkerSpec>, WorkersError> {
    let mut out = Vec::new();
    for entry in s.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let bad = |why: String| WorkersError {
            entry: entry.to_string(),
            why,
        };
        let (id, endpoint) = entry.split_once('=').ok_or_else(|| bad("no `=`".into()))?;
        let id = id.trim();
        let (instance, rank) = id.split_once(':').unwrap_or((id, "0"));
        let instance_id = instance
            .parse::<u64>()
            .map_err(|e| bad(format!("worker id: {e}")))?;
        let dp_rank = rank.parse::<u32>().map_err(|e| bad(format!("rank: {e}")))?;
        let endpoint = endpoint.trim().to_string();
        check_endpoint(&endpoint).map_err(|e| bad(e.to_string()))?;
        out.push(WorkerSpec {
            instance_id,
            dp_rank,
            endpoint,
        });
    }
    Ok(out)
}
