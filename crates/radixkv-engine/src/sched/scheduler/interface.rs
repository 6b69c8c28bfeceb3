//! What the engine and a scheduler exchange.

use crate::accounting::{CopiedIn, PromptTokens};
use crate::sched::batch::BackendError;
use crate::sched::policy::PolicyConfig;
use crate::sched::sampling::Sampling;
use radixkv::cache::{CacheError, TokenKey};
use radixkv::device::DeviceId;
use std::sync::mpsc::Sender;
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
            policy: PolicyConfig::new(crate::sched::policy::SchedulePolicy::Lpm),
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
    /// How a model backend picks its next tokens.
    pub sampling: Sampling,
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
    /// and pins are released and it completes with
    /// [`RequestError::Cancelled`].
    Cancel(u64),
    /// End request `id`'s generation now (its client met a stop
    /// sequence): what it generated so far is cached as at a natural end,
    /// its pages and pin are released and it completes without error.
    /// Unknown or finished ids are ignored.
    Finish(u64),
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
    /// Its prompt tokens, and where they came from at its first
    /// admission: the device's own cache, the host tier, another device.
    pub tokens: PromptTokens,
    /// Output tokens generated.
    pub output_tokens: usize,
    /// Arrival to first output token.
    pub ttft: Duration,
    /// Arrival to last output token.
    pub e2e: Duration,
    /// Times it was retracted and re-queued.
    pub retractions: u32,
    /// `Some(why)` when it failed instead of finishing.
    pub error: Option<RequestError>,
}

/// Why a request ended without finishing.
///
/// The first two are the client's or the operator's doing (retrying
/// elsewhere may help); the last two are failures of this server.
///
/// ```
/// use radixkv_engine::RequestError;
///
/// assert_eq!(RequestError::Cancelled.to_string(), "cancelled");
/// assert!(RequestError::Stopped.is_shutdown_or_cancel());
/// ```
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// Cancelled by its submitter ([`Inbox::Cancel`]: its client went
    /// away).
    #[error("cancelled")]
    Cancelled,
    /// The engine stopped before the request finished.
    #[error("stopped")]
    Stopped,
    /// A cache operation of its scheduler failed (every request on that
    /// device fails with it).
    #[error("cache failed: {0}")]
    Cache(#[from] CacheError),
    /// The model backend failed a pass (every request on that device fails
    /// with it).
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// Its device's scheduler thread failed (panicked) while it held the
    /// request: the engine serves no more (why, as
    /// [`Engine::failure`](crate::Engine::failure) says).
    #[error("{0}")]
    SchedulerFailed(String),
}

impl RequestError {
    /// Whether the request was cancelled or the engine stopped, rather
    /// than the server failing.
    pub fn is_shutdown_or_cancel(&self) -> bool {
        matches!(self, RequestError::Cancelled | RequestError::Stopped)
    }
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
    /// Prompt tokens loaded from the host tier or copied from other
    /// devices into this one, at every admission (a retracted request's
    /// readmission included).
    pub copied: CopiedIn,
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
