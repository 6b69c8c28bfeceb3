//! # radixkv-index-service
//!
//! `radixkv index`: [`radixkv_index`] behind HTTP, a drop-in for NVIDIA
//! Dynamo's standalone KV indexer (`python -m dynamo.indexer`): the same
//! flags, routes and JSON shapes, so that a router written against
//! Dynamo's asks this one unchanged; plus the Mooncake RFC's `/query`.
//!
//! | module | what it holds |
//! | --- | --- |
//! | [`registry`] | the workers followed, one tree per (model name, routing group), one listener per (worker, rank) |
//! | [`api`] | the routes and their shapes |
//! | [`answer`] | a query's scores in Dynamo's and the Mooncake RFC's shapes |
//! | [`metrics`] | `GET /metrics` |
//! | [`token_ids`] | a query's token ids read by a reader of their own |
//! | [`workers`] | the `--workers` list |
//!
//! Where it differs from Dynamo 1.6.1's: a worker that restarts is
//! followed through the restart (its sequence starting again, or an
//! `AllBlocksCleared` at any sequence, clears it) where Dynamo's ignores
//! it until it is registered again; a gap with no replay endpoint leaves
//! the worker cleared and reported stale until its next clearing rather
//! than holding blocks it may have lost; a worker silent past
//! `--silent-after-s` is reported and not scored; and `/health` is 503
//! until every registered worker's listener is subscribed.

pub mod answer;
pub mod api;
pub mod metrics;
pub mod registry;
pub mod token_ids;
pub mod workers;

use registry::{PartitionKey, Registration, Registry, RegistryError, RegistryOptions};
use std::sync::Arc;

/// The workers to follow from the start (the `--workers` flags).
#[derive(Clone, Debug, Default)]
pub struct InitialWorkers {
    /// Their PUB endpoints.
    pub workers: Vec<workers::WorkerSpec>,
    /// Replay endpoints of some of them (matched by worker and rank).
    pub replay: Vec<workers::WorkerSpec>,
    /// Tokens per block of their events.
    pub block_size: usize,
    /// Their partition.
    pub partition: Option<PartitionKey>,
}

/// A registry with `initial`'s workers registered (on the current
/// runtime).
pub fn start(
    options: RegistryOptions,
    initial: &InitialWorkers,
) -> Result<Arc<Registry>, RegistryError> {
    let registry = Arc::new(Registry::new(options));
    let partition = initial.partition.clone().unwrap_or(PartitionKey {
        model_name: "default".into(),
        routing_group: "default".into(),
    });
    for w in &initial.workers {
        let replay_endpoint = initial
            .replay
            .iter()
            .find(|r| r.instance_id == w.instance_id && r.dp_rank == w.dp_rank)
            .map(|r| r.endpoint.clone());
        registry.register(Registration {
            instance_id: w.instance_id,
            dp_rank: w.dp_rank,
            endpoint: w.endpoint.clone(),
            replay_endpoint,
            partition: partition.clone(),
            block_size: initial.block_size,
        })?;
    }
    Ok(registry)
}

/// Serves the routes on `listener` until `shutdown` completes, each
/// connection with `TCP_NODELAY` (an answer is sent at once, not held
/// for the client's acknowledgement of the one before).
pub async fn serve(
    listener: tokio::net::TcpListener,
    registry: Arc<Registry>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use axum::serve::ListenerExt;
    let app = api::router(api::AppState::new(registry));
    let listener = listener.tap_io(|tcp| {
        // A socket that refuses the option still serves, unhurried.
        let _ = tcp.set_nodelay(true);
    });
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}
