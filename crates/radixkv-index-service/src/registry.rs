//! [`Registry`]: the workers the service follows, by partition (model name
//! and routing group, as Dynamo's indexer keeps one tree per pair), each
//! partition one [`KvIndex`], each (worker, rank) one listener task.
//!
//! Registering starts the listener; unregistering stops it and forgets
//! what the worker held (its tiers are freed for others). A partition
//! whose last worker leaves is removed (a query for it is then a 404, as
//! in Dynamo's).

use arc_swap::ArcSwap;
use radixkv_index::listen::{listen, Feedpoint, ListenOptions, SourceCounters};
use radixkv_index::{KvIndex, Source};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A model name and routing group: one tree.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PartitionKey {
    /// The model served.
    pub model_name: String,
    /// Dynamo's routing group (a tenant, a pool of workers).
    pub routing_group: String,
}

/// A worker's (rank's) registration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Registration {
    /// Its id (Dynamo's `instance_id`).
    pub instance_id: u64,
    /// Its data-parallel rank.
    pub dp_rank: u32,
    /// Its PUB endpoint.
    pub endpoint: String,
    /// Its replay (ROUTER) endpoint, if it has one.
    pub replay_endpoint: Option<String>,
    /// Where its blocks are indexed.
    pub partition: PartitionKey,
    /// Tokens per block of its events.
    pub block_size: usize,
}

/// Why a registration or removal was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    /// An endpoint that is not `tcp://HOST:PORT` or `ipc://PATH`.
    #[error("bad endpoint {0:?}: expected tcp://HOST:PORT or ipc://PATH")]
    BadEndpoint(String),
    /// The (worker, rank) is registered in that partition already.
    #[error("instance {0} dp_rank {1} already registered")]
    Duplicate(u64, u32),
    /// The partition's blocks are of another size.
    #[error(
        "model {model:?} (routing group {group:?}) indexes blocks of {have} tokens, not {got}"
    )]
    BlockSize {
        /// The model.
        model: String,
        /// The routing group.
        group: String,
        /// The partition's block size.
        have: usize,
        /// The one registered.
        got: usize,
    },
    /// Block size 0.
    #[error("block_size must be at least 1")]
    ZeroBlockSize,
    /// The index could not be built (an unsupported block size).
    #[error("cannot index blocks of {0} tokens: {1}")]
    Index(usize, String),
    /// Nothing registered matched an unregistration.
    #[error("instance {instance_id} is not registered for model {model:?}{}", routing_group.as_ref().map(|g| format!(" in routing group {g:?}")).unwrap_or_default())]
    NotFound {
        /// The worker.
        instance_id: u64,
        /// The model.
        model: String,
        /// The routing group, if one was named.
        routing_group: Option<String>,
    },
}

/// Checks an endpoint's shape (what the listener can connect to).
pub fn check_endpoint(e: &str) -> Result<(), RegistryError> {
    let bad = || RegistryError::BadEndpoint(e.to_string());
    if let Some(rest) = e.strip_prefix("tcp://") {
        let (host, port) = rest.rsplit_once(':').ok_or_else(bad)?;
        if host.is_empty() || port.parse::<u16>().map_or(true, |p| p == 0) {
            return Err(bad());
        }
        return Ok(());
    }
    match e.strip_prefix("ipc://") {
        Some(path) if !path.is_empty() => Ok(()),
        _ => Err(bad()),
    }
}

/// Aborts the listener when the worker is dropped.
#[derive(Debug)]
struct Task(Option<tokio::task::JoinHandle<()>>);

impl Task {
    /// Aborts the listener and waits until it has stopped (an apply under
    /// way finishes first).
    async fn stop(mut self) {
        if let Some(h) = self.0.take() {
            h.abort();
            let _ = h.await;
        }
    }
}

impl Drop for Task {
    fn drop(&mut self) {
        if let Some(h) = &self.0 {
            h.abort();
        }
    }
}

/// One followed (worker, rank).
#[derive(Debug)]
struct Worker {
    registration: Registration,
    counters: Arc<SourceCounters>,
    /// Milliseconds since the epoch when it was registered.
    since_ms: u64,
    task: Task,
}

/// One tree and the workers feeding it.
#[derive(Debug)]
pub struct Partition {
    /// The tree.
    pub index: Arc<KvIndex>,
    /// Tokens per block.
    pub block_size: usize,
    workers: Mutex<BTreeMap<Source, Worker>>,
    /// What queries read of `workers` (whom to score), as last published
    /// under its lock: no query takes it.
    scoring: ArcSwap<BTreeMap<Source, Scoring>>,
}

/// What a query needs of a worker: whether it fell silent.
#[derive(Debug)]
struct Scoring {
    counters: Arc<SourceCounters>,
    since_ms: u64,
}

impl Partition {
    /// Publishes `workers` for queries (called under its lock after each
    /// change).
    fn publish(&self, workers: &BTreeMap<Source, Worker>) {
        let snapshot = workers
            .iter()
            .map(|(s, w)| {
                (
                    *s,
                    Scoring {
                        counters: Arc::clone(&w.counters),
                        since_ms: w.since_ms,
                    },
                )
            })
            .collect();
        self.scoring.store(Arc::new(snapshot));
    }
}

/// A worker as [`Registry::workers`] reports it.
#[derive(Clone, Debug)]
pub struct WorkerView {
    /// Its registration.
    pub registration: Registration,
    /// Its listener's counters.
    pub counters: Arc<SourceCounters>,
    /// Silent past the service's limit (not scored).
    pub silent: bool,
    /// Blocks the index knows of it.
    pub blocks: usize,
}

/// How the registry builds partitions and listeners.
#[derive(Clone, Copy, Debug)]
pub struct RegistryOptions {
    /// Tiers ((worker, rank, medium) triples) a partition's tree holds.
    pub max_tiers: usize,
    /// The listeners' queue and replay timeout.
    pub listen: ListenOptions,
    /// A worker silent (no batch) this long is reported and not scored;
    /// `None`: never.
    pub silent_after: Option<Duration>,
}

impl Default for RegistryOptions {
    /// 64 tiers, [`ListenOptions::default`], no silence limit.
    fn default() -> Self {
        RegistryOptions {
            max_tiers: 64,
            listen: ListenOptions::default(),
            silent_after: None,
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// See the module docs.
#[derive(Debug)]
pub struct Registry {
    partitions: RwLock<HashMap<PartitionKey, Arc<Partition>>>,
    options: RegistryOptions,
}

impl Registry {
    /// An empty registry.
    pub fn new(options: RegistryOptions) -> Registry {
        Registry {
            partitions: RwLock::new(HashMap::new()),
            options,
        }
    }

    /// Its options.
    pub fn options(&self) -> &RegistryOptions {
        &self.options
    }

    /// The partition of `key`, if any worker feeds it.
    pub fn partition(&self, key: &PartitionKey) -> Option<Arc<Partition>> {
        self.partitions
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(key)
            .cloned()
    }

    /// Every partition.
    pub fn partitions(&self) -> Vec<(PartitionKey, Arc<Partition>)> {
        let p = self
            .partitions
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut v: Vec<_> = p.iter().map(|(k, v)| (k.clone(), Arc::clone(v))).collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    /// Follows a worker's rank from now on (a listener on the runtime this
    /// is called from).
    pub fn register(&self, r: Registration) -> Result<(), RegistryError> {
        check_endpoint(&r.endpoint)?;
        if let Some(e) = &r.replay_endpoint {
            check_endpoint(e)?;
        }
        if r.block_size == 0 {
            return Err(RegistryError::ZeroBlockSize);
        }
        let mut parts = self
            .partitions
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let part = match parts.get(&r.partition) {
            Some(p) => {
                if p.block_size != r.block_size {
                    return Err(RegistryError::BlockSize {
                        model: r.partition.model_name.clone(),
                        group: r.partition.routing_group.clone(),
                        have: p.block_size,
                        got: r.block_size,
                    });
                }
                Arc::clone(p)
            }
            None => {
                let index = KvIndex::new(r.block_size, self.options.max_tiers)
                    .map_err(|e| RegistryError::Index(r.block_size, e.to_string()))?;
                let p = Arc::new(Partition {
                    index: Arc::new(index),
                    block_size: r.block_size,
                    workers: Mutex::new(BTreeMap::new()),
                    scoring: ArcSwap::from_pointee(BTreeMap::new()),
                });
                parts.insert(r.partition.clone(), Arc::clone(&p));
                p
            }
        };
        let source = Source {
            worker: r.instance_id,
            rank: r.dp_rank,
        };
        let mut workers = lock(&part.workers);
        if workers.contains_key(&source) {
            return Err(RegistryError::Duplicate(r.instance_id, r.dp_rank));
        }
        // What an earlier registration of it left (none: unregistering
        // forgets), and any block a stray listener added.
        part.index.forget(source);
        let counters = Arc::new(SourceCounters::default());
        let fp = Feedpoint {
            source,
            endpoint: r.endpoint.clone(),
            replay: r.replay_endpoint.clone(),
            topic: String::new(),
        };
        let task = tokio::spawn(listen(
            Arc::clone(&part.index),
            fp,
            Arc::clone(&counters),
            self.options.listen,
        ));
        workers.insert(
            source,
            Worker {
                registration: r,
                counters,
                since_ms: now_ms(),
                task: Task(Some(task)),
            },
        );
        part.publish(&workers);
        Ok(())
    }

    /// Stops following `instance_id` of `model_name`: in `routing_group`
    /// (every group when `None`), rank `dp_rank` (every rank when `None`).
    /// Returns how many ranks were removed.
    pub async fn unregister(
        &self,
        instance_id: u64,
        model_name: &str,
        routing_group: Option<&str>,
        dp_rank: Option<u32>,
    ) -> Result<usize, RegistryError> {
        let removed = self.take(instance_id, model_name, routing_group, dp_rank);
        let n = removed.len();
        for (part, s, w) in removed {
            // The listener stops before its blocks are forgotten, so none
            // comes back.
            w.task.stop().await;
            part.index.forget(s);
        }
        if n == 0 {
            return Err(RegistryError::NotFound {
                instance_id,
                model: model_name.to_string(),
                routing_group: routing_group.map(str::to_string),
            });
        }
        Ok(n)
    }

    /// Takes the matching workers out of their partitions (and the
    /// partitions left empty out of the registry).
    fn take(
        &self,
        instance_id: u64,
        model_name: &str,
        routing_group: Option<&str>,
        dp_rank: Option<u32>,
    ) -> Vec<(Arc<Partition>, Source, Worker)> {
        let mut parts = self
            .partitions
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut removed = Vec::new();
        let mut emptied = Vec::new();
        for (key, part) in parts.iter() {
            if key.model_name != model_name || routing_group.is_some_and(|g| g != key.routing_group)
            {
                continue;
            }
            let mut workers = lock(&part.workers);
            let gone: Vec<Source> = workers
                .keys()
                .filter(|s| s.worker == instance_id && dp_rank.is_none_or(|r| r == s.rank))
                .copied()
                .collect();
            for s in gone {
                if let Some(w) = workers.remove(&s) {
                    removed.push((Arc::clone(part), s, w));
                }
            }
            part.publish(&workers);
            if workers.is_empty() {
                emptied.push(key.clone());
            }
        }
        for k in emptied {
            parts.remove(&k);
        }
        removed
    }

    /// Whether `s` of `part` is scored now: registered, and not silent past
    /// the limit.
    pub fn scored(&self, part: &Partition, s: Source) -> bool {
        part.scoring
            .load()
            .get(&s)
            .is_some_and(|w| !self.silent(&w.counters, w.since_ms))
    }

    fn silent(&self, counters: &SourceCounters, since_ms: u64) -> bool {
        let Some(limit) = self.options.silent_after else {
            return false;
        };
        // Relaxed: a timestamp read for a report.
        let last = counters.last_batch_ms.load(Ordering::Relaxed).max(since_ms);
        now_ms().saturating_sub(last) > u64::try_from(limit.as_millis()).unwrap_or(u64::MAX)
    }

    /// Every worker (rank) of the partitions matching the filters, in
    /// partition, worker and rank order.
    pub fn workers(
        &self,
        model_name: Option<&str>,
        routing_group: Option<&str>,
    ) -> Vec<WorkerView> {
        let mut out = Vec::new();
        for (key, part) in self.partitions() {
            if model_name.is_some_and(|m| m != key.model_name)
                || routing_group.is_some_and(|g| g != key.routing_group)
            {
                continue;
            }
            let workers = lock(&part.workers);
            for (s, w) in workers.iter() {
                out.push(WorkerView {
                    registration: w.registration.clone(),
                    counters: Arc::clone(&w.counters),
                    silent: self.silent(&w.counters, w.since_ms),
                    blocks: part.index.known_blocks(*s),
                });
            }
        }
        out
    }

    /// Whether every registered listener has its subscription.
    pub fn all_subscribed(&self) -> bool {
        self.workers(None, None)
            .iter()
            // Relaxed: a status flag.
            .all(|w| w.counters.subscribed.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_checked() {
        for ok in ["tcp://127.0.0.1:5557", "tcp://[::1]:1", "ipc:///tmp/x"] {
            assert!(check_endpoint(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "tcp://",
            "tcp://h",
            "tcp://h:0",
            "tcp://:5",
            "tcp://h:99999",
            "udp://h:1",
            "ipc://",
        ] {
            assert!(check_endpoint(bad).is_err(), "{bad}");
        }
    }
}
