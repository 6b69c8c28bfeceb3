//! One device's scheduler loop (SGLang 0.5.9's event loop, reduced to what
//! a prefix cache sees): order the waiting queue, admit prefills within
//! token budgets (chunking a long one), run prefill or decode passes on the
//! model backend, cache prompts after prefill and whole sequences at the
//! end, and retract decoding requests when the device runs out of pages.
//!
//! Each round:
//!
//! 1. take new requests from the inbox;
//! 2. order the waiting queue ([`QueueOrderer`]);
//! 3. admit requests in that order while the budgets hold
//!    (`max_prefill_tokens` new tokens per pass, one chunked request of at
//!    most `chunked_prefill_size` tokens, `max_running_requests`, and pages:
//!    the prompt's uncached pages are allocated — evicting as needed — and
//!    the running requests' future output, `remaining · new_token_ratio`
//!    tokens, must fit beside them, else the request waits);
//! 4. if anything was admitted, one prefill pass (prefill has priority, as
//!    in SGLang without mixed chunks); otherwise one decode pass over the
//!    running requests, allocating a page when a request crosses into a
//!    new one, and retracting requests (fewest output tokens first, then
//!    longest prompt) when even eviction cannot provide it;
//! 5. after a request's prefill its prompt is cached and pinned
//!    ([`Request::commit_chunk`], SGLang's `cache_unfinished_req`); after
//!    its last token, prompt and output are cached and the pin released
//!    ([`Request::finish`]).
//!
//! `new_token_ratio` starts at `init_new_token_ratio`, decays linearly to
//! `min_new_token_ratio` over `new_token_ratio_decay_steps` decode passes,
//! and is raised back by a retraction (SGLang's rule of thumb).

use super::batch::{Batch, DecodeWork, ModelBackend, PrefillWork, WorkData};
use super::policy::{PolicyConfig, QueueOrderer, Waiting};
use crate::tiers::{CopySource, TierConfig, WritePolicy, HOST_TIER};
use radixkv::cache::{CacheError, PagedCache, Request, TokenKey};
use radixkv::device::DeviceId;
use radixkv::Tier;
use std::collections::HashMap;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The scheduler's budgets and knobs (defaults: SGLang 0.5.9's).
#[derive(Clone, Debug, PartialEq)]
pub struct SchedulerConfig {
    /// Waiting-queue ordering (default `lpm`, the cache-aware policy;
    /// SGLang's own default is `fcfs`).
    pub policy: PolicyConfig,
    /// Do not admit a request that in-batch prefix caching deprioritized in
    /// the same round as others (default true): it shares a prefix with a
    /// request being admitted, and waiting one round lets it reuse that
    /// prefix from the tree instead of computing it again. radixkv's
    /// addition: SGLang only sorts such requests last and may still admit
    /// them together.
    pub defer_in_batch_duplicates: bool,
    /// New tokens per prefill pass (default 16,384).
    pub max_prefill_tokens: usize,
    /// Largest chunk of one prompt per pass; 0 disables chunking (default 8,192).
    pub chunked_prefill_size: usize,
    /// Requests decoding at once (default 256).
    pub max_running_requests: usize,
    /// Output tokens of a request counted against the pool at most
    /// (default 4,096).
    pub clip_max_new_tokens: usize,
    /// Share of the remaining output reserved at admission, at first
    /// (default 0.7).
    pub init_new_token_ratio: f64,
    /// …and at least (default 0.1).
    pub min_new_token_ratio: f64,
    /// Decode passes over which the ratio decays (default 600).
    pub new_token_ratio_decay_steps: usize,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            policy: PolicyConfig::new(super::policy::SchedulePolicy::Lpm),
            defer_in_batch_duplicates: true,
            max_prefill_tokens: 16_384,
            chunked_prefill_size: 8_192,
            max_running_requests: 256,
            clip_max_new_tokens: 4_096,
            init_new_token_ratio: 0.7,
            min_new_token_ratio: 0.1,
            new_token_ratio_decay_steps: 600,
        }
    }
}

/// A request handed to a scheduler.
#[derive(Clone, Debug)]
pub struct Job {
    /// Unique id.
    pub id: u64,
    /// Prompt tokens.
    pub tokens: Arc<[u32]>,
    /// Cache namespace.
    pub namespace: Option<Arc<str>>,
    /// Scheduling priority.
    pub priority: i64,
    /// Output tokens to generate (at least 1).
    pub output_len: usize,
    /// The output's token ids when known (a trace's next turn reuses them);
    /// otherwise each generated token is a fresh id unique to the request.
    pub output_tokens: Option<Arc<[u32]>>,
    /// When the request arrived at the engine.
    pub arrival: Instant,
    /// Where to send each generated token and the completion (streaming
    /// clients); `None`: the completion goes to
    /// [`SchedulerEvents::completed`] only.
    pub stream: Option<StreamSink>,
}

/// Where a streaming request's events go: a channel, or a callback that
/// the scheduler calls on its own thread (it must not block: hand the
/// event on, e.g. to an async channel, and return).
///
/// ```
/// use radixkv_engine::sched::scheduler::{StreamEvent, StreamSink};
/// let (tx, rx) = std::sync::mpsc::channel();
/// let sink = StreamSink::callback(move |e| tx.send(e).is_ok());
/// sink.send(StreamEvent::Token(7));
/// assert_eq!(rx.recv().unwrap(), StreamEvent::Token(7));
/// ```
#[derive(Clone)]
pub struct StreamSink(Arc<dyn Fn(StreamEvent) -> bool + Send + Sync>);

impl StreamSink {
    /// Events into a standard channel.
    pub fn channel(tx: Sender<StreamEvent>) -> Self {
        let tx = std::sync::Mutex::new(tx);
        StreamSink(Arc::new(move |e| {
            tx.lock().map(|t| t.send(e).is_ok()).unwrap_or(false)
        }))
    }

    /// Events to `f`, which returns false once nobody listens.
    pub fn callback(f: impl Fn(StreamEvent) -> bool + Send + Sync + 'static) -> Self {
        StreamSink(Arc::new(f))
    }

    /// Delivers one event; false if nobody listens any more.
    pub fn send(&self, e: StreamEvent) -> bool {
        (self.0)(e)
    }
}

impl std::fmt::Debug for StreamSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StreamSink")
    }
}

/// What a streaming request receives.
#[derive(Clone, Debug, PartialEq)]
pub enum StreamEvent {
    /// The next generated token.
    Token(u32),
    /// The request is done (also on failure: see [`Completion::error`]).
    Done(Completion),
}

/// A message to a scheduler.
#[derive(Clone, Debug)]
pub enum Inbox {
    /// A new request.
    Job(Job),
    /// Drop request `id` if it is here (its client went away): its pages
    /// and pins are released and it completes with the error "cancelled".
    Cancel(u64),
}

/// A cache operation the scheduler timed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheOp {
    /// Matching and pinning a request's prefix at admission.
    Match,
    /// Caching a request's tokens (after prefill, and at the end).
    Insert,
}

/// A finished request.
#[derive(Clone, Debug, PartialEq)]
pub struct Completion {
    /// The request.
    pub id: u64,
    /// Where it ran.
    pub device: DeviceId,
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Prompt tokens served from the device's own cache at its (first)
    /// admission.
    pub cached_tokens: usize,
    /// Prompt tokens loaded from the host tier instead of computed, at its
    /// first admission.
    pub host_loaded_tokens: usize,
    /// Prompt tokens copied from another device instead of computed, at
    /// its first admission.
    pub peer_copied_tokens: usize,
    /// Bytes of KV copied into the device for those tokens.
    pub copy_bytes: u64,
    /// Model time of those copies (per the tier cost model).
    pub copy_time: Duration,
    /// Output tokens generated.
    pub output_tokens: usize,
    /// Arrival to first output token.
    pub ttft: Duration,
    /// Arrival to last output token.
    pub e2e: Duration,
    /// Times it was retracted and re-queued.
    pub retractions: u32,
    /// `Some(reason)` when it failed instead of finishing.
    pub error: Option<String>,
}

/// What a scheduler tells the engine.
pub trait SchedulerEvents: Send + Sync {
    /// The request's prompt is in the tree (or it failed): routing can
    /// forget its pending prefix.
    fn prompt_settled(&self, job: &Job, device: DeviceId);
    /// The request is done (finished or failed). Called for every request,
    /// streaming or not (a streaming one also gets [`StreamEvent::Done`]).
    fn completed(&self, job: &Job, completion: Completion);
    /// A cache operation took `took` (default: ignored).
    fn cache_op(&self, _device: DeviceId, _op: CacheOp, _took: Duration) {}
    /// `device` starts computing `key`'s prompt (its prefill was admitted);
    /// until [`computed`](Self::computed), later requests sharing a prefix
    /// of it, on other devices or on this one, may wait for it rather than
    /// compute that prefix too (default: not tracked).
    fn computing(&self, _key: TokenKey<'_>, _device: DeviceId) {}
    /// `device` is done computing `key`'s prompt: it is in the tree, or the
    /// request left (default: not tracked).
    fn computed(&self, _key: TokenKey<'_>, _device: DeviceId) {}
    /// Per device, the longest prefix of `key` (whole pages) that it is
    /// computing now, for requests admitted earlier (the asking device's
    /// own included); empty when not tracked (the default).
    fn computing_now(&self, _key: TokenKey<'_>) -> Vec<usize> {
        Vec::new()
    }
}

/// Counters of one scheduler.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SchedulerStats {
    /// Prefill passes.
    pub prefill_passes: u64,
    /// Decode passes.
    pub decode_passes: u64,
    /// Tokens computed by prefill passes.
    pub prefill_tokens: u64,
    /// Retractions.
    pub retractions: u64,
    /// Most requests running at once.
    pub max_running: usize,
    /// Model time of all passes.
    pub busy: Duration,
    /// Prompt tokens loaded from the host tier.
    pub host_loaded_tokens: u64,
    /// Prompt tokens copied from other devices.
    pub peer_copied_tokens: u64,
    /// Bytes of KV copied into this device (host loads and peer copies).
    pub copy_bytes: u64,
    /// Model time of those copies.
    pub copy_time: Duration,
    /// Tokens this device wrote to the host tier (write-through, or
    /// write-back before evictions).
    pub host_written_tokens: u64,
    /// Admissions postponed to copy a prefix another device was computing.
    pub waits_for_peers: u64,
    /// Admissions postponed for a prefix this device was computing for a
    /// request admitted before (it is then a hit, not computed twice).
    pub waits_for_self: u64,
    /// Bytes of those writes.
    pub host_write_bytes: u64,
    /// Model time of those writes (on the copy engine, beside the passes).
    pub host_write_time: Duration,
}

/// What a request's first admission copied into its device.
#[derive(Clone, Copy, Debug, Default)]
struct Loaded {
    host: usize,
    peer: usize,
    bytes: u64,
    time: Duration,
}

struct Entry {
    job: Job,
    generated: Vec<u32>,
    first_cached: Option<usize>,
    first_loaded: Option<Loaded>,
    first_token: Option<Instant>,
    retractions: u32,
    settled: bool,
}

impl Entry {
    /// The request's completion as of `now` on `device`; `error` when it
    /// did not finish.
    fn completion(&self, device: DeviceId, now: Instant, error: Option<String>) -> Completion {
        let loaded = self.first_loaded.unwrap_or_default();
        Completion {
            id: self.job.id,
            device,
            prompt_tokens: self.job.tokens.len(),
            cached_tokens: self.first_cached.unwrap_or(0),
            host_loaded_tokens: loaded.host,
            peer_copied_tokens: loaded.peer,
            copy_bytes: loaded.bytes,
            copy_time: loaded.time,
            output_tokens: self.generated.len(),
            ttft: self
                .first_token
                .unwrap_or(now)
                .saturating_duration_since(self.job.arrival),
            e2e: now.saturating_duration_since(self.job.arrival),
            retractions: self.retractions,
            error,
        }
    }
}

struct Running {
    entry: Entry,
    req: Request,
    /// Tokens whose KV exists (cached prefix + computed).
    computed: usize,
    /// Prompt length of this admission (prompt + output so far after a
    /// retraction).
    prompt: usize,
    /// Tokens this admission reused (the device's cache and copies).
    reused: usize,
    /// Whether its prompt is registered as being computed here
    /// ([`SchedulerEvents::computing`]).
    computing: bool,
}

/// One device's scheduler; [`run`](Self::run) is its thread's body.
pub struct Scheduler {
    cfg: SchedulerConfig,
    cache: Arc<PagedCache>,
    device: DeviceId,
    /// The device's id in the engine (differs from `device` when each
    /// device has a private tree, where it is device 0 of its own cache).
    reported: DeviceId,
    backend: Arc<dyn ModelBackend>,
    events: Arc<dyn SchedulerEvents>,
    orderer: QueueOrderer,
    waiting: Vec<Waiting>,
    entries: HashMap<u64, Entry>,
    running: Vec<Running>,
    arrivals: u64,
    ratio: f64,
    stats: SchedulerStats,
    tiers: TierConfig,
    /// The cache's host tier, if it has one and the backend copies.
    host: Option<Tier>,
    /// Model time of the copies the next prefill pass waits for.
    copy_wait: Duration,
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler")
            .field("device", &self.device)
            .field("waiting", &self.waiting.len())
            .field("running", &self.running.len())
            .finish()
    }
}

impl Scheduler {
    /// A scheduler for `device` of `cache` (which must own its pages).
    pub fn new(
        cfg: SchedulerConfig,
        cache: Arc<PagedCache>,
        device: DeviceId,
        backend: Arc<dyn ModelBackend>,
        events: Arc<dyn SchedulerEvents>,
    ) -> Self {
        let ratio = cfg.init_new_token_ratio;
        Scheduler {
            orderer: QueueOrderer::new(cfg.policy.clone()),
            cfg,
            cache,
            device,
            reported: device,
            backend,
            events,
            waiting: Vec::new(),
            entries: HashMap::new(),
            running: Vec::new(),
            arrivals: 0,
            ratio,
            stats: SchedulerStats::default(),
            tiers: TierConfig::default(),
            host: None,
            copy_wait: Duration::ZERO,
        }
    }

    /// Copies and host writes by `tiers` (default: [`TierConfig::default`];
    /// the cache's host tier, if it has one, is used as it finds it).
    pub fn with_tiers(mut self, mut tiers: TierConfig) -> Self {
        self.host = self.cache.has_host_tier().then_some(Tier::Host);
        if self.backend.copy(self.reported, HOST_TIER, &[]).is_err() {
            // A backend that cannot move KV: every token is the device's
            // own, cached or computed.
            tiers.copy = crate::tiers::CopyPolicy::None;
            self.host = None;
        }
        self.tiers = tiers;
        self
    }

    /// Reports completions and settled prompts as device `d` (for a device
    /// with a private tree, whose id in its own cache is 0).
    pub fn reporting_as(mut self, d: DeviceId) -> Self {
        self.reported = d;
        self
    }

    /// Requests waiting or running.
    pub fn outstanding(&self) -> usize {
        self.waiting.len() + self.running.len()
    }

    /// Runs until the inbox is closed and every request is done, or `stop`
    /// says so (then the requests left fail with "stopped").
    pub fn run(
        mut self,
        inbox: Receiver<Inbox>,
        stop: &std::sync::atomic::AtomicBool,
    ) -> SchedulerStats {
        let mut open = true;
        loop {
            // Relaxed: a flag polled every round; nothing is published by it.
            if stop.load(std::sync::atomic::Ordering::Relaxed) {
                self.fail_all("stopped");
                return self.stats;
            }
            if open {
                let idle = self.outstanding() == 0;
                let first = if idle {
                    match inbox.recv_timeout(Duration::from_millis(20)) {
                        Ok(j) => Some(j),
                        Err(RecvTimeoutError::Timeout) => None,
                        Err(RecvTimeoutError::Disconnected) => {
                            open = false;
                            None
                        }
                    }
                } else {
                    None
                };
                first.into_iter().for_each(|m| self.receive(m));
                loop {
                    match inbox.try_recv() {
                        Ok(m) => self.receive(m),
                        Err(std::sync::mpsc::TryRecvError::Empty) => break,
                        Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                            open = false;
                            break;
                        }
                    }
                }
            }
            if !open && self.outstanding() == 0 {
                return self.stats;
            }
            if self.outstanding() == 0 {
                continue;
            }
            if let Err(e) = self.round() {
                self.fail_all(&format!("scheduler error: {e}"));
            }
        }
    }

    fn receive(&mut self, m: Inbox) {
        match m {
            Inbox::Job(j) => self.enqueue(j, None),
            Inbox::Cancel(id) => self.cancel(id),
        }
    }

    /// Drops request `id` wherever it is (waiting or running).
    fn cancel(&mut self, id: u64) {
        let entry = if let Some(i) = self.running.iter().position(|r| r.entry.job.id == id) {
            let r = self.running.remove(i);
            self.done_computing(&r);
            drop(r.req); // pages back, pin released, nothing cached
            Some(r.entry)
        } else {
            self.waiting.retain(|w| w.id != id);
            self.entries.remove(&id)
        };
        if let Some(e) = entry {
            self.fail(e, "cancelled");
        }
    }

    fn enqueue(&mut self, job: Job, back: Option<Entry>) {
        self.arrivals += 1;
        let entry = back.unwrap_or(Entry {
            job,
            generated: Vec::new(),
            first_cached: None,
            first_loaded: None,
            first_token: None,
            retractions: 0,
            settled: false,
        });
        let mut tokens: Vec<u32> = entry.job.tokens.to_vec();
        tokens.extend_from_slice(&entry.generated);
        let remaining = entry.job.output_len.saturating_sub(entry.generated.len());
        let mut w = Waiting::new(entry.job.id, tokens, self.arrivals)
            .with_priority(entry.job.priority)
            .with_max_new_tokens(remaining);
        if let Some(ns) = &entry.job.namespace {
            w = w.with_namespace(Arc::clone(ns));
        }
        self.waiting.push(w);
        self.entries.insert(entry.job.id, entry);
    }

    /// Tokens the running requests may still generate, as reserved at
    /// admission (clipped, times the new-token ratio).
    fn reserved_output(&self) -> usize {
        self.running
            .iter()
            .map(|r| {
                let left = r
                    .entry
                    .job
                    .output_len
                    .saturating_sub(r.entry.generated.len());
                (left.min(self.cfg.clip_max_new_tokens) as f64 * self.ratio) as usize
            })
            .sum()
    }

    fn free_tokens(&self) -> usize {
        self.cache
            .allocator(self.device)
            .map_or(0, |a| a.free_pages() * a.page_size())
    }

    /// Makes `tokens` free tokens available by evicting, if possible.
    fn ensure_free(&mut self, tokens: usize) -> bool {
        let free = self.free_tokens();
        if free >= tokens {
            return true;
        }
        self.make_room(tokens);
        let free = self.free_tokens();
        if free < tokens {
            let _ = self.cache.evict(self.device, tokens - free);
        }
        self.free_tokens() >= tokens
    }

    /// With write-back to a host tier: evicts what `tokens` free tokens
    /// need, writing the victims to the host first (an allocation that
    /// falls short would evict without writing them).
    fn make_room(&mut self, tokens: usize) {
        // Nothing is written to a host tier nothing will load from.
        if self.tiers.write != WritePolicy::WriteBack
            || self.host.is_none()
            || !self.tiers.copy.host()
        {
            return;
        }
        let free = self.free_tokens();
        if free >= tokens {
            return;
        }
        let (backend, from) = (Arc::clone(&self.backend), self.reported);
        let ev = self
            .cache
            .evict_with_write_back(self.device, tokens - free, |copy| {
                backend.copy(from, HOST_TIER, &copy.runs()).is_ok()
            });
        if let Ok(ev) = ev {
            self.count_host_write(ev.written_back);
        }
    }

    fn count_host_write(&mut self, tokens: usize) {
        self.stats.host_written_tokens += tokens as u64;
        self.stats.host_write_bytes += self.tiers.bytes(tokens);
        if tokens > 0 {
            self.stats.host_write_time += self.tiers.copy_time(CopySource::Host, tokens);
        }
    }

    /// Writes `key` (whole pages, resident on this device) to the host
    /// tier where it lacks it.
    fn write_to_host(&mut self, key: TokenKey<'_>) {
        let Some(host) = self.host else {
            return;
        };
        let Ok(Some(copy)) = self.cache.copy_prefix(key, self.device, host) else {
            return; // nothing to write, or the host is full of pinned pages
        };
        let n = copy.range().len();
        if self
            .backend
            .copy(self.reported, HOST_TIER, &copy.runs())
            .is_ok()
            && copy.complete().is_ok()
        {
            self.count_host_write(n);
        }
    }

    /// Before a request's prefill: loads from the host tier or copies from
    /// another device the part of its prompt they hold beyond the device's
    /// cached prefix, when the cost model says that beats computing it.
    fn load_prefix(&mut self, req: &mut Request) -> Loaded {
        let mut out = Loaded::default();
        let cached = req.cached_len();
        let cap = copy_cap(req, self.cache.page_size());
        let mut best: Option<(CopySource, Tier, usize)> = None;
        let mut consider = |src: CopySource, tier: Tier, len: usize| {
            let len = len.min(cap);
            if len > cached && best.is_none_or(|(_, _, l)| len > l) {
                best = Some((src, tier, len));
            }
        };
        if let (true, Some(h)) = (self.tiers.copy.peer(), req.peer()) {
            consider(CopySource::Peer(h.0), h.0.into(), h.1);
        }
        if let (true, Some(host)) = (self.tiers.copy.host(), self.host) {
            consider(CopySource::Host, host, req.host_len());
        }
        let Some((src, tier, len)) = best else {
            return out;
        };
        let extra = len - cached;
        let recompute = self.backend.prefill_estimate(extra, cached);
        if !self.tiers.worth_copying(src, extra, recompute) {
            return out;
        }
        // A copy that cannot be planned (no pages, the source evicted
        // meanwhile) or moved is not made: the tokens are computed.
        let Ok(Some(copy)) = req.copy_from(tier) else {
            return out;
        };
        let n = copy.range().len();
        let from = match src {
            CopySource::Host => HOST_TIER,
            CopySource::Peer(e) => e,
        };
        if self
            .backend
            .copy(from, self.reported, &copy.runs())
            .is_err()
        {
            return out;
        }
        if copy.complete().is_err() {
            return out;
        }
        let (bytes, time) = (self.tiers.bytes(n), self.tiers.copy_time(src, n));
        match src {
            CopySource::Host => {
                out.host = n;
                self.stats.host_loaded_tokens += n as u64;
            }
            CopySource::Peer(_) => {
                out.peer = n;
                self.stats.peer_copied_tokens += n as u64;
            }
        }
        out.bytes = bytes;
        out.time = time;
        self.stats.copy_bytes += bytes;
        self.stats.copy_time += time;
        self.copy_wait += time;
        out
    }

    fn round(&mut self) -> Result<(), CacheError> {
        let admitted = self.admit()?;
        let batch = if admitted {
            self.prefill_batch()
        } else {
            self.decode_batch()?
        };
        if batch.is_empty() {
            // Nothing can run: wait for pages (another device's evictor or
            // finishing requests elsewhere cannot help here, so this only
            // happens transiently).
            std::thread::sleep(Duration::from_millis(1));
            return Ok(());
        }
        let out = self
            .backend
            .step(self.reported, &batch)
            .map_err(|e| CacheError::InvalidConfig(e.to_string()))?;
        self.stats.busy += out.time;
        let sampled: HashMap<u64, u32> = out.next_tokens.into_iter().collect();
        if admitted {
            self.after_prefill(&batch, &sampled)
        } else {
            self.after_decode(&sampled)
        }
    }

    /// Admits waiting requests in policy order; returns whether any
    /// prefill work is ready (new admissions or a chunked request's next
    /// chunk).
    fn admit(&mut self) -> Result<bool, CacheError> {
        let chunked_pending = self.running.iter().any(|r| r.computed < r.prompt);
        if self.waiting.is_empty() || self.running.len() >= self.cfg.max_running_requests {
            return Ok(chunked_pending);
        }
        let report = self
            .orderer
            .order(&mut self.waiting, &self.cache, self.device)?;
        let deferred: std::collections::HashSet<u64> = if self.cfg.defer_in_batch_duplicates {
            report.deprioritized.iter().copied().collect()
        } else {
            Default::default()
        };
        let mut admitted_now = false;
        let mut budget = self.cfg.max_prefill_tokens;
        // A chunked request in progress takes its chunk first.
        for r in &self.running {
            if r.computed < r.prompt {
                budget = budget.saturating_sub(self.chunk_of(r.prompt - r.computed));
            }
        }
        let mut chunking = chunked_pending;
        let mut admitted_any = chunked_pending;
        // The running requests' reserved output, kept up to date as
        // requests are admitted (the ratio does not change meanwhile).
        let mut reserved = self.reserved_output();
        // Requests that wait for a prefix another device is computing: back
        // at the head of the queue, in order, after this round.
        let mut parked: Vec<Waiting> = Vec::new();
        // Always the head of the ordered queue: admitted requests leave it.
        while let Some(w) = self.waiting.first() {
            if self.running.len() >= self.cfg.max_running_requests || budget == 0 {
                break;
            }
            if admitted_now && deferred.contains(&w.id) {
                break; // the deprioritized tail waits for the next round
            }
            let key = TokenKey::new(&w.tokens).in_namespace(w.namespace.as_deref());
            let t = Instant::now();
            let mut req = self.cache.begin(key, self.device)?;
            self.events
                .cache_op(self.reported, CacheOp::Match, t.elapsed());
            let (w_id, w_len, w_max_new) = (w.id, w.tokens.len(), w.max_new_tokens);
            let device_hit = req.cached_len();
            // One look at the registry for both waits below.
            let computing = if self.tiers.copy.peer() {
                self.events
                    .computing_now(prompt_key(&req, self.cache.page_size()))
            } else {
                Vec::new()
            };
            if self.computing_here(&req, &computing) {
                // This device is computing more of this prompt for a
                // request admitted before it (in this pass, or a chunked
                // one): wait for that and hit it, rather than compute it
                // twice (and before copying any of it from elsewhere).
                drop(req);
                parked.push(self.waiting.remove(0));
                self.stats.waits_for_self += 1;
                continue;
            }
            let loaded = self.load_prefix(&mut req);
            if self.worth_waiting(&req, &computing) {
                // Another device is computing more of this prompt right
                // now: wait for it and copy it then, rather than compute it
                // a second time.
                drop(req);
                parked.push(self.waiting.remove(0));
                self.stats.waits_for_peers += 1;
                continue;
            }
            let extend = w_len - req.cached_len();
            let chunk = self.chunk_of(extend);
            if chunk < extend && chunking {
                break; // one chunked request at a time
            }
            if chunk > budget && admitted_any {
                break;
            }
            // Pages for the whole prompt now (evicting if needed), then room
            // for the running requests' reserved output and this one's.
            self.make_room(extend);
            if req.reserve().is_err() {
                break;
            }
            let own_out =
                (w_max_new.min(self.cfg.clip_max_new_tokens) as f64 * self.ratio) as usize;
            if !self.ensure_free(reserved + own_out) {
                drop(req); // pages back, pin released
                break;
            }
            self.waiting.remove(0);
            let Some(mut entry) = self.entries.remove(&w_id) else {
                continue;
            };
            entry.first_cached.get_or_insert(device_hit);
            entry.first_loaded.get_or_insert(loaded);
            reserved += own_out;
            let computed = req.cached_len();
            let computing = computed < w_len;
            if computing {
                self.events
                    .computing(prompt_key(&req, self.cache.page_size()), self.reported);
            }
            self.running.push(Running {
                entry,
                req,
                computed,
                prompt: w_len,
                reused: computed,
                computing,
            });
            budget = budget.saturating_sub(chunk);
            chunking |= chunk < extend;
            admitted_any = true;
            admitted_now = true;
        }
        if !parked.is_empty() {
            self.waiting.splice(0..0, parked);
        }
        self.stats.max_running = self.stats.max_running.max(self.running.len());
        Ok(admitted_any)
    }

    /// Whether this device is computing, for a request admitted before
    /// `req`, at least the load-back threshold more of `req`'s prompt than
    /// it has cached (`computing`: [`SchedulerEvents::computing_now`]):
    /// then `req` waits and hits it. Known only while the engine keeps its
    /// registry of prompts being computed, that is with peer copies on and
    /// one shared tree (otherwise, as in SGLang, `lpm`'s in-batch rule is
    /// the only guard).
    fn computing_here(&self, req: &Request, computing: &[usize]) -> bool {
        let cached = req.cached_len();
        let here = computing
            .get(self.reported.index())
            .map_or(0, |&l| l.min(copy_cap(req, self.cache.page_size())));
        here > cached && here - cached >= self.tiers.load_back_threshold.max(1)
    }

    /// Whether `req` should wait for a prefix another device is computing
    /// (`computing`: [`SchedulerEvents::computing_now`]; the longest, the
    /// lower device on a tie): it covers at least the load-back threshold
    /// more than `req` has, and copying that part costs less than computing
    /// it.
    fn worth_waiting(&self, req: &Request, computing: &[usize]) -> bool {
        let Some((e, &len)) = computing
            .iter()
            .enumerate()
            .filter(|&(e, &l)| e != self.reported.index() && l > 0)
            .max_by_key(|&(e, &l)| (l, std::cmp::Reverse(e)))
        else {
            return false;
        };
        let cached = req.cached_len();
        let len = len.min(copy_cap(req, self.cache.page_size()));
        if len <= cached {
            return false;
        }
        let extra = len - cached;
        let recompute = self.backend.prefill_estimate(extra, cached);
        // `e` indexes the engine's devices, a u32.
        self.tiers
            .worth_copying(CopySource::Peer(DeviceId(e as u32)), extra, recompute)
    }

    /// Unregisters a request's prompt from the in-flight registry.
    fn done_computing(&self, r: &Running) {
        if r.computing {
            self.events
                .computed(prompt_key(&r.req, self.cache.page_size()), self.reported);
        }
    }

    fn chunk_of(&self, extend: usize) -> usize {
        match self.cfg.chunked_prefill_size {
            0 => extend,
            c => extend.min(c),
        }
    }

    fn prefill_batch(&mut self) -> Batch {
        let mut b = Batch {
            copy_time: std::mem::take(&mut self.copy_wait),
            ..Batch::default()
        };
        let data = self.backend.wants_data();
        for r in &self.running {
            if r.computed < r.prompt {
                let new = self.chunk_of(r.prompt - r.computed);
                let end = r.computed + new;
                b.prefill.push(PrefillWork {
                    request: r.entry.job.id,
                    new_tokens: new,
                    context_tokens: r.computed,
                    samples: end >= r.prompt,
                    data: data.then(|| {
                        let mut slots = r.req.slots();
                        slots.truncate(end);
                        WorkData {
                            tokens: r.req.tokens()[..end].to_vec(),
                            slots,
                        }
                    }),
                });
            }
        }
        b
    }

    fn after_prefill(
        &mut self,
        batch: &Batch,
        sampled: &HashMap<u64, u32>,
    ) -> Result<(), CacheError> {
        let now = Instant::now();
        self.stats.prefill_passes += 1;
        let mut done = Vec::new();
        // Prompts settled in this pass that the write policy sends to the
        // host: (tokens, namespace).
        let mut writes: Vec<(Vec<u32>, Option<Arc<str>>)> = Vec::new();
        let ps = self.cache.page_size().max(1);
        for (i, r) in self.running.iter_mut().enumerate() {
            let Some(p) = batch.prefill.iter().find(|p| p.request == r.entry.job.id) else {
                continue;
            };
            self.stats.prefill_tokens += p.new_tokens as u64;
            r.computed += p.new_tokens;
            // Cache what is computed so far (the whole prompt once done),
            // pinning the new end before the old pin goes.
            let t = Instant::now();
            r.req.commit_chunk(r.computed)?;
            self.events
                .cache_op(self.reported, CacheOp::Insert, t.elapsed());
            if r.computed < r.prompt {
                continue;
            }
            if r.computing {
                r.computing = false;
                self.events.computed(prompt_key(&r.req, ps), self.reported);
            }
            if !r.entry.settled {
                r.entry.settled = true;
                self.events.prompt_settled(&r.entry.job, self.reported);
                let upto = match self.tiers.write {
                    WritePolicy::WriteThrough => r.prompt / ps * ps,
                    // The reused prefix, once hit often enough.
                    WritePolicy::WriteThroughSelective
                        if r.req.prefix_hits() >= self.tiers.selective_hits =>
                    {
                        r.reused
                    }
                    _ => 0,
                };
                if upto > 0 && self.host.is_some() && self.tiers.copy.host() {
                    writes.push((
                        r.req.tokens()[..upto].to_vec(),
                        r.entry.job.namespace.clone(),
                    ));
                }
            }
            // The pass also produced the first output token.
            let tok = next_token(&r.entry, sampled.get(&r.entry.job.id).copied());
            emit(&r.entry, tok);
            r.entry.generated.push(tok);
            r.entry.first_token.get_or_insert(now);
            if r.entry.generated.len() >= r.entry.job.output_len {
                // The last token is never fed back, so it has no KV: it must
                // not join the request's tokens, or `finish` would cache a
                // slot nothing wrote.
                done.push(i);
            } else {
                r.req.extend(&[tok]);
            }
        }
        for (tokens, ns) in writes {
            self.write_to_host(TokenKey::new(&tokens).in_namespace(ns.as_deref()));
        }
        self.finish(done)
    }

    fn decode_batch(&mut self) -> Result<Batch, CacheError> {
        let mut b = Batch::default();
        let mut i = 0;
        while i < self.running.len() {
            let r = &mut self.running[i];
            if r.computed < r.prompt {
                i += 1;
                continue;
            }
            // The token produced last pass needs a slot before this pass.
            let short = r.req.backed_len() < r.req.tokens().len();
            if short {
                self.make_room(self.cache.page_size());
            }
            let r = &mut self.running[i];
            if short && r.req.reserve().is_err() {
                match self.retract_for(i) {
                    None => break,
                    // Someone else was retracted: look at `i` again (it
                    // moved down by one if the victim came before it).
                    Some(v) if v < i => i -= 1,
                    // `i` itself, or one after it: `i` is the next one now.
                    Some(_) => {}
                }
                continue;
            }
            let r = &self.running[i];
            let len = r.req.tokens().len();
            b.decode.push(DecodeWork {
                request: r.entry.job.id,
                context_tokens: len,
                data: self.backend.wants_data().then(|| {
                    let mut slots = r.req.slots();
                    slots.truncate(len);
                    WorkData {
                        tokens: r.req.tokens().to_vec(),
                        slots,
                    }
                }),
            });
            i += 1;
        }
        // Retraction may have removed requests already in the batch.
        b.decode
            .retain(|d| self.running.iter().any(|r| r.entry.job.id == d.request));
        Ok(b)
    }

    /// Retracts one decoding request (fewest output tokens, then longest
    /// prompt; SGLang's order) so that request `i` can get a page; returns
    /// the victim's index, or `None` when nothing could be retracted.
    fn retract_for(&mut self, i: usize) -> Option<usize> {
        let victim = (0..self.running.len())
            .filter(|&j| self.running[j].computed >= self.running[j].prompt)
            .min_by_key(|&j| {
                let r = &self.running[j];
                (
                    r.entry.generated.len(),
                    std::cmp::Reverse(r.entry.job.tokens.len()),
                    j != i,
                )
            });
        let v = victim?;
        let r = self.running.remove(v);
        self.done_computing(&r);
        drop(r.req); // pages back, pin released, nothing cached
        self.backend.release(self.reported, r.entry.job.id);
        let mut entry = r.entry;
        entry.retractions += 1;
        self.stats.retractions += 1;
        let span = self.cfg.init_new_token_ratio - self.cfg.min_new_token_ratio;
        self.ratio = (self.ratio + span / 2.0).min(1.0);
        let job = entry.job.clone();
        self.enqueue(job, Some(entry));
        Some(v)
    }

    fn after_decode(&mut self, sampled: &HashMap<u64, u32>) -> Result<(), CacheError> {
        self.stats.decode_passes += 1;
        let steps = self.cfg.new_token_ratio_decay_steps.max(1) as f64;
        let decay = (self.cfg.init_new_token_ratio - self.cfg.min_new_token_ratio) / steps;
        self.ratio = (self.ratio - decay).max(self.cfg.min_new_token_ratio);
        let mut done = Vec::new();
        for (i, r) in self.running.iter_mut().enumerate() {
            if r.computed < r.prompt {
                continue;
            }
            let tok = next_token(&r.entry, sampled.get(&r.entry.job.id).copied());
            emit(&r.entry, tok);
            r.entry.generated.push(tok);
            if r.entry.generated.len() >= r.entry.job.output_len {
                done.push(i); // the last token has no KV: not cached (above)
            } else {
                r.req.extend(&[tok]);
            }
        }
        self.finish(done)
    }

    /// Finishes the running requests at `done` (ascending indices).
    fn finish(&mut self, done: Vec<usize>) -> Result<(), CacheError> {
        let now = Instant::now();
        for i in done.into_iter().rev() {
            let r = self.running.remove(i);
            // Prompt and every generated token but the last (which has no
            // KV), in whole pages.
            let t = Instant::now();
            let result = r.req.finish();
            self.events
                .cache_op(self.reported, CacheOp::Insert, t.elapsed());
            self.backend.release(self.reported, r.entry.job.id);
            let c = r
                .entry
                .completion(self.reported, now, result.err().map(|x| x.to_string()));
            self.complete(&r.entry, c);
        }
        Ok(())
    }

    fn fail_all(&mut self, why: &str) {
        let mut entries: Vec<Entry> = Vec::new();
        for r in std::mem::take(&mut self.running) {
            self.done_computing(&r);
            drop(r.req);
            entries.push(r.entry);
        }
        self.waiting.clear();
        entries.extend(self.entries.drain().map(|(_, e)| e));
        for e in entries {
            self.fail(e, why);
        }
    }

    /// Ends a request that did not finish (its pages are already back).
    fn fail(&mut self, e: Entry, why: &str) {
        let now = Instant::now();
        self.backend.release(self.reported, e.job.id);
        if !e.settled {
            self.events.prompt_settled(&e.job, self.reported);
        }
        let c = e.completion(self.reported, now, Some(why.to_string()));
        self.complete(&e, c);
    }

    fn complete(&self, e: &Entry, c: Completion) {
        // The engine's accounting first: a client that sees `Done` sees the
        // request no longer outstanding.
        let done = e.job.stream.as_ref().map(|s| (s, c.clone()));
        self.events.completed(&e.job, c);
        if let Some((s, c)) = done {
            let _ = s.send(StreamEvent::Done(c));
        }
    }
}

/// A request's prompt key in whole pages of `ps` tokens: the in-flight
/// registry's key ([`SchedulerEvents::computing`]).
fn prompt_key(req: &Request, ps: usize) -> TokenKey<'_> {
    let ps = ps.max(1);
    let n = req.tokens().len() / ps * ps;
    TokenKey::new(&req.tokens()[..n]).in_namespace(req.namespace())
}

/// The most of a request's tokens a copy may bring: the whole pages before
/// its last token, which is always computed (as
/// [`Request::copy_from`] caps it).
fn copy_cap(req: &Request, ps: usize) -> usize {
    let ps = ps.max(1);
    req.tokens().len().saturating_sub(1) / ps * ps
}

/// Sends a generated token to a streaming client (a gone client is not an
/// error here: the engine cancels the request when it notices).
fn emit(e: &Entry, tok: u32) {
    if let Some(s) = &e.job.stream {
        let _ = s.send(StreamEvent::Token(tok));
    }
}

/// The next output token: the job's own when given (teacher forcing), else
/// the model's, else an id unique to (request, position) in the top half of
/// the id space, so generated text never matches a prompt by accident.
fn next_token(e: &Entry, model: Option<u32>) -> u32 {
    let pos = e.generated.len();
    if let Some(t) = e.job.output_tokens.as_ref().and_then(|o| o.get(pos)) {
        return *t;
    }
    if let Some(t) = model {
        return t;
    }
    let mut x = e.job.id.wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ (pos as u64).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 31;
    (x as u32) | 0x8000_0000
}
