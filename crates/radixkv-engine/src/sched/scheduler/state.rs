//! The scheduler's state, its requests' records, its thread's loop and
//! its inbox.

use super::interface::{
    Completion, Inbox, Job, RequestError, SchedulerConfig, SchedulerEvents, SchedulerStats,
    StreamEvent,
};
use crate::accounting::{CopiedIn, PromptTokens};
use crate::sched::batch::ModelBackend;
use crate::sched::policy::{QueueOrderer, Waiting};
use crate::tiers::TierConfig;
use radixkv::cache::{PagedCache, Request, TokenKey};
use radixkv::device::DeviceId;
use radixkv::Tier;
use std::collections::HashMap;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub(super) struct Entry {
    pub(super) job: Job,
    pub(super) generated: Vec<u32>,
    pub(super) first_cached: Option<usize>,
    pub(super) first_loaded: Option<CopiedIn>,
    pub(super) first_token: Option<Instant>,
    pub(super) retractions: u32,
    pub(super) settled: bool,
}

impl Entry {
    /// The request's completion as of `now` on `device`; `error` when it
    /// did not finish.
    pub(super) fn completion(
        &self,
        device: DeviceId,
        now: Instant,
        error: Option<RequestError>,
    ) -> Completion {
        Completion {
            id: self.job.id,
            device,
            tokens: PromptTokens {
                prompt_tokens: self.job.tokens.len() as u64,
                cached_tokens: self.first_cached.unwrap_or(0) as u64,
                copied: self.first_loaded.unwrap_or_default(),
            },
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

pub(super) struct Running {
    pub(super) entry: Entry,
    pub(super) req: Request,
    /// Tokens whose KV exists (cached prefix + computed).
    pub(super) computed: usize,
    /// Prompt length of this admission (prompt + output so far after a
    /// retraction).
    pub(super) prompt: usize,
    /// Tokens this admission reused (the device's cache and copies).
    pub(super) reused: usize,
    /// Whether its prompt is registered as being computed here
    /// ([`SchedulerEvents::computing`]).
    pub(super) computing: bool,
}

/// One device's scheduler; [`run`](Self::run) is its thread's body.
pub struct Scheduler {
    pub(super) cfg: SchedulerConfig,
    pub(super) cache: Arc<PagedCache>,
    pub(super) device: DeviceId,
    /// The device's id in the engine (differs from `device` when each
    /// device has a private tree, where it is device 0 of its own cache).
    pub(super) reported: DeviceId,
    pub(super) backend: Arc<dyn ModelBackend>,
    pub(super) events: Arc<dyn SchedulerEvents>,
    pub(super) orderer: QueueOrderer,
    pub(super) waiting: Vec<Waiting>,
    pub(super) entries: HashMap<u64, Entry>,
    pub(super) running: Vec<Running>,
    pub(super) arrivals: u64,
    pub(super) ratio: f64,
    pub(super) stats: SchedulerStats,
    pub(super) tiers: TierConfig,
    /// The cache's host tier, if it has one and the backend copies.
    pub(super) host: Option<Tier>,
    /// Model time of the copies the next prefill pass waits for.
    pub(super) copy_wait: Duration,
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
        if self
            .backend
            .copy(Tier::Device(self.reported), Tier::Host, &[])
            .is_err()
        {
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
    /// says so (then the requests left fail with
    /// [`RequestError::Stopped`]).
    pub fn run(
        mut self,
        inbox: Receiver<Inbox>,
        stop: &std::sync::atomic::AtomicBool,
    ) -> SchedulerStats {
        let mut open = true;
        loop {
            // Relaxed: a flag polled every round; nothing is published by it.
            if stop.load(std::sync::atomic::Ordering::Relaxed) {
                self.fail_all(RequestError::Stopped);
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
                self.fail_all(e);
            }
        }
    }

    pub(super) fn receive(&mut self, m: Inbox) {
        match m {
            Inbox::Job(j) => self.enqueue(j, None),
            Inbox::Cancel(id) => self.cancel(id),
            Inbox::Finish(id) => self.finish_now(id),
        }
    }

    /// Drops request `id` wherever it is (waiting or running).
    pub(super) fn cancel(&mut self, id: u64) {
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
            self.fail(e, RequestError::Cancelled);
        }
    }

    /// Ends request `id`'s generation now ([`Inbox::Finish`]): a decoding
    /// request finishes as at its last token; one still computing its
    /// prompt, or waiting, leaves as a cancel does but completes without
    /// error.
    pub(super) fn finish_now(&mut self, id: u64) {
        let Some(i) = self.running.iter().position(|r| r.entry.job.id == id) else {
            self.waiting.retain(|w| w.id != id);
            if let Some(e) = self.entries.remove(&id) {
                self.end(e, None);
            }
            return;
        };
        if self.running[i].computed >= self.running[i].prompt {
            let Running { entry, mut req, .. } = self.running.remove(i);
            // The last token was appended for the next pass and has no KV
            // yet: cache up to it, not including it (a natural end never
            // appends its last token).
            let t = Instant::now();
            let upto = req.tokens().len().saturating_sub(1);
            let result = req.commit_chunk(upto).map(|_| ());
            drop(req); // the rest of its pages back, its pin released
            self.events.cache_op(
                self.reported,
                super::interface::CacheOp::Insert,
                t.elapsed(),
            );
            self.backend.release(self.reported, entry.job.id);
            let c = entry.completion(self.reported, t, result.err().map(RequestError::from));
            self.complete(&entry, c);
        } else {
            let r = self.running.remove(i);
            self.done_computing(&r);
            drop(r.req); // pages back, pin released
            self.end(r.entry, None);
        }
    }

    pub(super) fn enqueue(&mut self, job: Job, back: Option<Entry>) {
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
        // The job's prompt buffer itself, until a retraction brings back
        // output tokens too.
        let tokens: Arc<[u32]> = if entry.generated.is_empty() {
            Arc::clone(&entry.job.tokens)
        } else {
            entry
                .job
                .tokens
                .iter()
                .chain(&entry.generated)
                .copied()
                .collect()
        };
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
}

/// A request's prompt key in whole pages of `ps` tokens: the in-flight
/// registry's key ([`SchedulerEvents::computing`]).
pub(super) fn prompt_key(req: &Request, ps: usize) -> TokenKey<'_> {
    let ps = ps.max(1);
    let n = req.tokens().len() / ps * ps;
    TokenKey::new(&req.tokens()[..n]).in_namespace(req.namespace())
}

/// The most of a request's tokens a copy may bring: the whole pages before
/// its last token, which is always computed (as
/// [`Request::copy_from`] caps it).
pub(super) fn copy_cap(req: &Request, ps: usize) -> usize {
    let ps = ps.max(1);
    req.tokens().len().saturating_sub(1) / ps * ps
}

/// Sends a generated token to a streaming client (a gone client is not an
/// error here: the engine cancels the request when it notices).
pub(super) fn emit(e: &Entry, tok: u32) {
    if let Some(s) = &e.job.stream {
        let _ = s.send(StreamEvent::Token(tok));
    }
}

/// The next output token: the job's own when given (teacher forcing), else
/// the model's, else an id unique to (request, position) in the top half of
/// the id space, so generated text never matches a prompt by accident.
pub(super) fn next_token(e: &Entry, model: Option<u32>) -> u32 {
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
