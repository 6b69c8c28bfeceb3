//! `radixkv index`: the KV index routers ask (`radixkv-index-service`),
//! with the flags of Dynamo's standalone indexer.

use crate::ranges;
use crate::CmdResult;
use radixkv_index::listen::ListenOptions;
use radixkv_index_service::registry::{PartitionKey, RegistryOptions};
use radixkv_index_service::workers::parse_workers;
use radixkv_index_service::InitialWorkers;
use std::time::Duration;

/// `radixkv index` options.
#[derive(clap::Args, Debug)]
pub struct IndexArgs {
    /// Address to listen on.
    #[arg(long, default_value = "0.0.0.0")]
    host: std::net::IpAddr,
    /// Port (0: an ephemeral port, printed at start).
    #[arg(long, default_value_t = 8090)]
    port: u16,
    /// Tokens per block of the initial workers' events (required with
    /// --workers; 1 to 65,536).
    #[arg(long, value_parser = ranges::count(ranges::PAGE_SIZE))]
    block_size: Option<usize>,
    /// Workers to follow from the start: `ID[:RANK]=ENDPOINT`, comma
    /// separated (rank 0 when left out). More register by `POST /register`.
    #[arg(long)]
    workers: Option<String>,
    /// Replay endpoints of initial workers, in the same form: a gap in a
    /// worker's sequence is filled from there (without one, the worker is
    /// cleared and reported stale until its next AllBlocksCleared).
    #[arg(long)]
    replay_workers: Option<String>,
    /// The initial workers' model name.
    #[arg(long, default_value = "default")]
    model_name: String,
    /// The initial workers' routing group.
    #[arg(long, default_value = "default")]
    routing_group: String,
    /// Runtime threads (1 to 1,024).
    #[arg(long, default_value_t = 4, value_parser = ranges::count(1..=1024))]
    threads: usize,
    /// Accepted and ignored, as Dynamo's indexer does.
    #[arg(long)]
    tenant_id: Option<String>,
    /// Peers to recover from (Dynamo's P2P recovery): not supported; given,
    /// the command refuses to start.
    #[arg(long)]
    peers: Option<String>,
    /// (worker, rank, medium) tiers one model's tree holds (1 to 1,024).
    #[arg(long, default_value_t = 64, value_parser = ranges::count(1..=1024))]
    max_tiers: usize,
    /// Batches a worker's listener holds unapplied (1 to 2²⁰); a batch
    /// that finds the queue full is dropped, counted and replayed as a gap.
    #[arg(long, default_value_t = 4096, value_parser = ranges::count(1..=1 << 20))]
    queue: usize,
    /// Seconds a replay may take before the gap counts as lost (0.001 to
    /// 86,400).
    #[arg(long, default_value_t = 5.0, value_parser = ranges::timeout)]
    replay_timeout_s: f64,
    /// A worker with no batch for this many seconds is reported silent and
    /// not scored (0.001 to 86,400; default: never).
    #[arg(long, value_parser = ranges::timeout)]
    silent_after_s: Option<f64>,
}

/// Runs `radixkv index` until SIGINT or SIGTERM.
pub fn run(a: IndexArgs) -> CmdResult {
    if a.peers.is_some() {
        return Err("--peers (recovery from peer indexers) is not supported".into());
    }
    let workers = a
        .workers
        .as_deref()
        .map(parse_workers)
        .transpose()?
        .unwrap_or_default();
    let replay = a
        .replay_workers
        .as_deref()
        .map(parse_workers)
        .transpose()?
        .unwrap_or_default();
    for r in &replay {
        if !workers
            .iter()
            .any(|w| w.instance_id == r.instance_id && w.dp_rank == r.dp_rank)
        {
            return Err(format!(
                "--replay-workers names {}:{}, which --workers does not",
                r.instance_id, r.dp_rank
            )
            .into());
        }
    }
    let block_size = match (a.block_size, workers.is_empty()) {
        (Some(b), _) => b,
        (None, true) => 1,
        (None, false) => return Err("--block-size is required with --workers".into()),
    };
    let options = RegistryOptions {
        max_tiers: a.max_tiers,
        listen: ListenOptions {
            queue: a.queue,
            replay_timeout: Duration::from_secs_f64(a.replay_timeout_s),
        },
        silent_after: a.silent_after_s.map(Duration::from_secs_f64),
    };
    let initial = InitialWorkers {
        workers,
        replay,
        block_size,
        partition: Some(PartitionKey {
            model_name: a.model_name,
            routing_group: a.routing_group,
        }),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(a.threads)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let registry = radixkv_index_service::start(options, &initial)?;
        let listener =
            tokio::net::TcpListener::bind(std::net::SocketAddr::new(a.host, a.port)).await?;
        let (shutdown, _force) = radixkv_server::shutdown_signals();
        {
            use std::io::Write as _;
            let mut out = std::io::stdout().lock();
            writeln!(
                out,
                "radixkv index: listening on http://{}",
                listener.local_addr()?
            )?;
            out.flush()?;
        }
        radixkv_index_service::serve(listener, registry, shutdown).await?;
        Ok::<_, Box<dyn std::error::Error>>(())
    })?;
    rt.shutdown_timeout(Duration::from_secs(2));
    eprintln!("radixkv index: shut down");
    Ok(())
}
