//! [`DpRouter`]: what each data-parallel rank of one engine has cached, as
//! its KV events say, and the rank a request should go to: the cache-aware
//! choice the engine's router makes ([`radixkv::routing::choose`]), over
//! the ranks' caches and the prefixes already sent to each rank and not
//! yet stored there.
//!
//! Each rank is one [`Source`] (worker 0) of a [`KvIndex`]. A batch comes
//! in as the rank published it ([`DpRouter::ingest`]); with its sequence
//! number, a gap or a restart is seen as [`Feed`] sees it, and a gap the
//! caller cannot replay leaves the rank cleared and stale (scored 0,
//! reported by [`DpRouter::stale_ranks`]) until its next
//! `AllBlocksCleared`.
//!
//! Or the router follows a rank's sockets itself ([`DpRouter::subscribe`]:
//! its PUB endpoint and, when it has one, its replay endpoint), on a
//! runtime thread of its own, as `radixkv index` follows a worker: gaps
//! replayed, reconnections caught up, a rank that cannot be caught up
//! stale until it clears. The caller's thread never waits for it.
//!
//! Under [`NewPrefix::LeastPressure`] a request no rank holds any of
//! goes to the rank written least lately (and ties between equal
//! prefixes and loads go to it too; otherwise to the lower rank). A
//! rank's writes are the tokens of the requests routed to it that it did
//! not hold and was not sent already (what its prefills will write into
//! its cache), decayed as all ranks write: each routed request multiplies
//! every rank's count by `exp(-w / W)`, `w` being its own new tokens and
//! `W` the tokens the ranks hold ([`KvIndex::held_blocks`], at least a
//! block). A rank's count thus covers about the writes that take one
//! whole set of pools to hold.
//!
//! A request routed to a rank counts as dispatched there for
//! [`DpPolicy::pending_ttl`] (or until [`DpRouter::settled`]): a burst of
//! requests with one prefix follows the first to its rank before that
//! rank's events say it cached it.
//!
//! ```
//! use radixkv_index::dp::{DpPolicy, DpRouter, RankLoad};
//! let r = DpRouter::new(2, 2, DpPolicy::default()).unwrap();
//! // Nothing cached: the first request of a prefix goes to rank 0...
//! let a = r.route(&[1, 2, 3, 4], None, &[RankLoad::idle(); 2]).unwrap().unwrap();
//! // ...and the next one with that prefix follows it there.
//! let b = r.route(&[1, 2, 3, 4, 5, 6], None, &[RankLoad::idle(); 2]).unwrap().unwrap();
//! assert_eq!((a.device, b.device, b.expected_prefix), (0, 0, 4));
//! ```

use crate::decode::{decode_batch, DecodeError, Event};
use crate::feed::{Feed, Step};
use crate::index::{ApplyError, KvIndex, Source};
use crate::listen::{listen, Feedpoint, ListenOptions, SourceCounters};
use radixkv::routing::{choose, CacheAwarePolicy, Choice, NewPrefix, PageChain, PendingIndex};
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// Which load the imbalance rule weighs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LoadMeasure {
    /// Requests running and waiting on the rank (the engine's measure).
    #[default]
    Requests,
    /// Tokens of those requests (SGLang's `total_tokens`).
    Tokens,
}

/// How [`DpRouter::route`] chooses.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DpPolicy {
    /// The cache-aware rule and its thresholds (in units of `load`).
    pub cache_aware: CacheAwarePolicy,
    /// What the thresholds weigh.
    pub load: LoadMeasure,
    /// How long a routed request counts as dispatched to its rank
    /// (default 10 s).
    pub pending_ttl: Duration,
    /// Tokens of dispatched requests kept at most (the oldest are
    /// forgotten first; default 2²⁰).
    pub pending_tokens: usize,
}

impl Default for DpPolicy {
    fn default() -> Self {
        DpPolicy {
            cache_aware: CacheAwarePolicy::default(),
            load: LoadMeasure::Requests,
            pending_ttl: Duration::from_secs(10),
            pending_tokens: 1 << 20,
        }
    }
}

/// A rank's load as the dispatcher counts it, and whether it takes work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RankLoad {
    /// Requests running and waiting.
    pub requests: usize,
    /// Their tokens.
    pub tokens: usize,
    /// Whether the rank takes requests.
    pub active: bool,
}

impl RankLoad {
    /// An active rank with nothing to do.
    pub const fn idle() -> RankLoad {
        RankLoad {
            requests: 0,
            tokens: 0,
            active: true,
        }
    }
}

/// Why a router or a batch was refused.
#[derive(Debug, thiserror::Error)]
pub enum DpError {
    /// A router of no ranks, of more ranks than the tree has tiers, or of
    /// blocks of 0 tokens.
    #[error("a router of {ranks} ranks and blocks of {block_size} tokens: {why}")]
    Config {
        /// Ranks asked for.
        ranks: usize,
        /// Tokens per block asked for.
        block_size: usize,
        /// What is wrong.
        why: String,
    },
    /// A rank past the router's.
    #[error("rank {rank} of a router of {ranks}")]
    NoRank {
        /// The rank named.
        rank: usize,
        /// The router's ranks.
        ranks: usize,
    },
    /// The payload is not a batch.
    #[error(transparent)]
    Decode(#[from] DecodeError),
    /// The rank's events already come from a subscription.
    #[error("rank {0} is already subscribed")]
    Subscribed(usize),
    /// The runtime that follows the sockets could not start.
    #[error("cannot start the subscription runtime: {0}")]
    Runtime(String),
}

/// What [`DpRouter::ingest`] did with a batch.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ingested {
    /// Events applied.
    pub events: u64,
    /// Events skipped: unreadable, or not applicable (why, each).
    pub skipped: Vec<String>,
    /// The batch was a duplicate (or came while the rank was stale) and
    /// was dropped whole.
    pub dropped: bool,
    /// Batches were missing before it: the rank was cleared and is stale
    /// until its next `AllBlocksCleared`.
    pub gap: bool,
}

/// A request counted as dispatched: its blocks (their hashes in its
/// namespace, [`KvIndex::block_hashes`], chained as the pending index
/// keeps them).
#[derive(Debug)]
struct Sent {
    at: Instant,
    chain: PageChain,
    rank: usize,
}

/// A rank followed on its sockets: its listener's counters, and the task
/// (aborted with the router).
#[derive(Debug)]
struct Subscription {
    counters: Arc<SourceCounters>,
    task: tokio::task::JoinHandle<()>,
}

/// See the module docs.
#[derive(Debug)]
pub struct DpRouter {
    index: Arc<KvIndex>,
    ranks: usize,
    policy: DpPolicy,
    feeds: Vec<Mutex<Feed>>,
    pending: PendingIndex,
    sent: Mutex<(VecDeque<Sent>, usize)>,
    /// Each rank's recent writes, decayed (see the module docs).
    writes: Mutex<Vec<f64>>,
    subscriptions: Vec<OnceLock<Subscription>>,
    runtime: OnceLock<tokio::runtime::Runtime>,
}

impl Drop for DpRouter {
    fn drop(&mut self) {
        for s in self.subscriptions.iter().filter_map(OnceLock::get) {
            s.task.abort();
        }
        // Not waiting for its thread: the router may be dropped inside
        // another runtime, where a blocking shutdown would panic.
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn source(rank: usize) -> Source {
    Source {
        worker: 0,
        rank: rank as u32,
    }
}

impl DpRouter {
    /// A router over `ranks` ranks whose events name blocks of
    /// `block_size` tokens.
    pub fn new(ranks: usize, block_size: usize, policy: DpPolicy) -> Result<DpRouter, DpError> {
        let refuse = |why: &str| DpError::Config {
            ranks,
            block_size,
            why: why.to_owned(),
        };
        if ranks == 0 {
            return Err(refuse("no ranks"));
        }
        // Each rank's device, host, disk and external media are tiers.
        let tiers = ranks * crate::decode::Medium::ALL.len();
        let index = KvIndex::new(block_size, tiers).map_err(|e| refuse(&e.to_string()))?;
        if !(policy.cache_aware.balance_rel.is_finite() && policy.cache_aware.balance_rel >= 1.0) {
            return Err(refuse("balance_rel must be a number of at least 1"));
        }
        Ok(DpRouter {
            index: Arc::new(index),
            subscriptions: (0..ranks).map(|_| OnceLock::new()).collect(),
            runtime: OnceLock::new(),
            ranks,
            policy,
            feeds: (0..ranks).map(|_| Mutex::new(Feed::new())).collect(),
            pending: PendingIndex::new(ranks, block_size),
            sent: Mutex::new((VecDeque::new(), 0)),
            writes: Mutex::new(vec![0.0; ranks]),
        })
    }

    /// Ranks.
    pub fn ranks(&self) -> usize {
        self.ranks
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.index.block_size()
    }

    /// The policy routes follow.
    pub fn policy(&self) -> DpPolicy {
        self.policy
    }

    fn check_rank(&self, rank: usize) -> Result<(), DpError> {
        if rank < self.ranks {
            Ok(())
        } else {
            Err(DpError::NoRank {
                rank,
                ranks: self.ranks,
            })
        }
    }

    /// Applies one batch `payload` (msgpack, as rank `rank` published it:
    /// SGLang's or vLLM's encoding) with its sequence number `seq`, if
    /// known (then duplicates are dropped, and a gap or a restart is seen).
    /// A rank followed by [`DpRouter::subscribe`] takes no other batches.
    pub fn ingest(
        &self,
        rank: usize,
        payload: &[u8],
        seq: Option<u64>,
    ) -> Result<Ingested, DpError> {
        self.check_rank(rank)?;
        if self.subscriptions[rank].get().is_some() {
            return Err(DpError::Subscribed(rank));
        }
        let batch = decode_batch(payload)?;
        let mut out = Ingested {
            skipped: batch.skipped.iter().map(|(_, why)| why.clone()).collect(),
            ..Ingested::default()
        };
        let s = source(rank);
        let clears = matches!(batch.events.first(), Some(Event::Cleared));
        let mut feed = lock(&self.feeds[rank]);
        let step = match seq {
            Some(seq) => feed.offer(seq, clears),
            None => Step::Apply { clear: false },
        };
        match step {
            Step::Apply { clear } => {
                if clear {
                    self.index.clear(s);
                }
                let (done, errors) = self.index.apply(s, &batch.events);
                out.events = done.events;
                out.skipped.extend(
                    errors
                        .iter()
                        .map(|(i, e): &(usize, ApplyError)| format!("event {i}: {e}")),
                );
            }
            Step::Drop | Step::Stale => out.dropped = true,
            Step::Gap { .. } => {
                // No replay to ask from here: the rank's blocks are
                // unknown until it clears.
                feed.lost();
                self.index.clear(s);
                out.gap = true;
                out.dropped = true;
            }
        }
        Ok(out)
    }

    /// Ranks whose blocks are unknown since a gap (scored 0 until their
    /// next `AllBlocksCleared`).
    pub fn stale_ranks(&self) -> Vec<usize> {
        (0..self.ranks)
            .filter(|&r| {
                // Relaxed: a status flag; nothing is published through it.
                let followed = self.subscriptions[r]
                    .get()
                    .is_some_and(|s| s.counters.stale.load(Ordering::Relaxed));
                followed || lock(&self.feeds[r]).is_stale()
            })
            .collect()
    }

    /// Follows rank `rank`'s KV events on its sockets from now on (see the
    /// module docs): `endpoint` its PUB endpoint (`tcp://HOST:PORT`),
    /// `replay` its replay endpoint, `topic` the topic to subscribe to
    /// (empty: every message). Returns at once; the connection is made
    /// (and retried) on the router's runtime thread.
    pub fn subscribe(
        &self,
        rank: usize,
        endpoint: &str,
        replay: Option<&str>,
        topic: &str,
        options: ListenOptions,
    ) -> Result<(), DpError> {
        self.check_rank(rank)?;
        if self.subscriptions[rank].get().is_some() {
            return Err(DpError::Subscribed(rank));
        }
        let rt = match self.runtime.get() {
            Some(rt) => rt,
            None => {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(1)
                    .thread_name("radixkv-dp")
                    .enable_all()
                    .build()
                    .map_err(|e| DpError::Runtime(e.to_string()))?;
                self.runtime.get_or_init(|| rt)
            }
        };
        let counters = Arc::new(SourceCounters::default());
        let fp = Feedpoint {
            source: source(rank),
            endpoint: endpoint.to_owned(),
            replay: replay.map(str::to_owned),
            topic: topic.to_owned(),
        };
        let task = rt.spawn(listen(
            Arc::clone(&self.index),
            fp,
            Arc::clone(&counters),
            options,
        ));
        if let Err(s) = self.subscriptions[rank].set(Subscription { counters, task }) {
            // Another thread subscribed the rank meanwhile.
            s.task.abort();
            return Err(DpError::Subscribed(rank));
        }
        Ok(())
    }

    /// The counters of rank `rank`'s subscription, if it has one.
    pub fn subscription(&self, rank: usize) -> Option<Arc<SourceCounters>> {
        self.subscriptions
            .get(rank)
            .and_then(OnceLock::get)
            .map(|s| Arc::clone(&s.counters))
    }

    /// Forgets everything rank `rank` held (it restarted or left).
    pub fn clear(&self, rank: usize) -> Result<(), DpError> {
        self.check_rank(rank)?;
        self.index.clear(source(rank));
        Ok(())
    }

    /// Tokens of `tokens`' longest prefix (whole blocks, in `namespace`:
    /// [`radixkv::TokenKey::namespace_for`]) each rank holds on any medium.
    pub fn scores(&self, tokens: &[u32], namespace: Option<&str>) -> Vec<usize> {
        self.scores_of(&self.index.block_hashes(tokens, namespace))
    }

    fn scores_of(&self, pages: &[u64]) -> Vec<usize> {
        let mut out = vec![0; self.ranks];
        for s in self.index.scores_by_hash(pages) {
            if let Some(o) = out.get_mut(s.source.rank as usize) {
                *o = (*o).max(s.tokens);
            }
        }
        out
    }

    /// The rank for a request of `tokens` in `namespace`, its ranks' loads
    /// being `loads` (one per rank; see [`DpPolicy::load`]); the request
    /// then counts as dispatched there. `None` when no rank is active.
    pub fn route(
        &self,
        tokens: &[u32],
        namespace: Option<&str>,
        loads: &[RankLoad],
    ) -> Result<Option<Choice>, DpError> {
        if loads.len() != self.ranks {
            return Err(DpError::NoRank {
                rank: loads.len(),
                ranks: self.ranks,
            });
        }
        let active: Vec<usize> = (0..self.ranks).filter(|&r| loads[r].active).collect();
        if active.is_empty() {
            return Ok(None);
        }
        self.expire(Instant::now());
        let load: Vec<usize> = active
            .iter()
            .map(|&r| match self.policy.load {
                LoadMeasure::Requests => loads[r].requests,
                LoadMeasure::Tokens => loads[r].tokens,
            })
            .collect();
        let (pages, chain) = self.hashed(tokens, namespace);
        // Writes are counted only where they choose (see the module docs).
        let spread = self.policy.cache_aware.new_prefix == NewPrefix::LeastPressure;
        let mut writes = spread.then(|| lock(&self.writes));
        let c = choose(
            &self.policy.cache_aware,
            &load,
            || {
                let cached = self.scores_of(&pages);
                let sent = self.pending.longest_chain(&chain);
                active.iter().map(|&r| cached[r].max(sent[r])).collect()
            },
            // Rounded to whole tokens: a pressure compares as an integer.
            |d| writes.as_ref().map_or(0, |w| w[active[d]].round() as usize),
        );
        let rank = active[c.device];
        if let Some(w) = writes.as_mut() {
            self.wrote(w, rank, tokens.len().saturating_sub(c.expected_prefix));
        }
        drop(writes);
        self.dispatched(chain, rank);
        Ok(Some(Choice { device: rank, ..c }))
    }

    /// `tokens`' block hashes in `namespace` ([`KvIndex::block_hashes`]),
    /// made once: the index walks them, and the prompts sent are chained
    /// from them, once for the lookup and the record.
    fn hashed(&self, tokens: &[u32], namespace: Option<&str>) -> (Vec<u64>, PageChain) {
        let pages = self.index.block_hashes(tokens, namespace);
        let chain = self.pending.chain_pages(&pages);
        (pages, chain)
    }

    /// `rank` was sent `new` tokens it neither holds nor was sent: every
    /// rank's writes decay by them, then `rank`'s grow by them.
    fn wrote(&self, writes: &mut [f64], rank: usize, new: usize) {
        let window = (self.index.held_blocks().max(1) * self.block_size()) as f64;
        let decay = (-(new as f64) / window).exp();
        for w in writes.iter_mut() {
            *w *= decay;
        }
        if let Some(w) = writes.get_mut(rank) {
            *w += new as f64;
        }
    }

    fn dispatched(&self, chain: PageChain, rank: usize) {
        if chain.pages() == 0 {
            return;
        }
        self.pending.add_chain(chain.clone(), rank);
        let mut sent = lock(&self.sent);
        sent.1 += chain.pages() * self.block_size();
        sent.0.push_back(Sent {
            at: Instant::now(),
            chain,
            rank,
        });
    }

    /// Forgets dispatched requests past their time, or past the token
    /// budget (the oldest first).
    fn expire(&self, now: Instant) {
        let mut sent = lock(&self.sent);
        while let Some(front) = sent.0.front() {
            let old = now.duration_since(front.at) >= self.policy.pending_ttl;
            if !old && sent.1 <= self.policy.pending_tokens {
                break;
            }
            if let Some(s) = sent.0.pop_front() {
                sent.1 -= s.chain.pages() * self.block_size();
                self.pending.remove_chain(&s.chain, s.rank);
            }
        }
    }

    /// A request routed to `rank` is cached there (or was aborted): it no
    /// longer counts as dispatched.
    pub fn settled(&self, tokens: &[u32], namespace: Option<&str>, rank: usize) {
        let (_, chain) = self.hashed(tokens, namespace);
        let mut sent = lock(&self.sent);
        let at = sent
            .0
            .iter()
            .position(|s| s.rank == rank && s.chain == chain);
        if let Some(s) = at.and_then(|i| sent.0.remove(i)) {
            sent.1 -= s.chain.pages() * self.block_size();
            self.pending.remove_chain(&s.chain, rank);
        }
    }

    /// Requests counted as dispatched now.
    pub fn dispatched_len(&self) -> usize {
        lock(&self.sent).0.len()
    }
}
