//! The running engine: scheduler threads, the router and the shared cache
//! ([`Engine`]), and the state its schedulers' callbacks share.

use super::config::{EngineConfig, EngineError, EngineRequest};
use super::placement::Placement;
use super::report::{
    DeviceLatencies, DeviceLive, DeviceMetrics, DeviceReport, EngineReport, HostTierMetrics,
    Latencies,
};
use crate::router::{PendingIndex, Router, RouterConfig};
use crate::sched::batch::ModelBackend;
use crate::sched::scheduler::RequestError;
use crate::sched::scheduler::{
    CacheOp, Completion, Inbox, Job, Scheduler, SchedulerEvents, SchedulerStats, StreamEvent,
    StreamSink,
};
use radixkv::cache::{EvictionPolicy, PagedCache, TokenKey};
use radixkv::device::DeviceId;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

/// Router state and live figures shared with the schedulers' callbacks.
struct Shared {
    router: Router,
    done: Sender<Completion>,
    live: Vec<Mutex<DeviceLive>>,
    /// Prompts being computed per device (admitted, not yet in the tree),
    /// for schedulers that would rather copy them than compute them too.
    /// Only with one shared tree (peer copies need it).
    computing: Option<PendingIndex>,
    /// Why the engine cannot serve any more (the first scheduler thread
    /// that panicked), once one did.
    failure: std::sync::OnceLock<String>,
    /// Requests submitted without a stream sink and not yet completed, with
    /// the device they went to: if that device's scheduler thread dies,
    /// each completes with [`RequestError::SchedulerFailed`] on the
    /// completions channel (a streamed request learns it from its sink,
    /// which the dying thread drops).
    unanswered: Mutex<HashMap<u64, usize>>,
}

impl Shared {
    /// Device `d`'s scheduler thread died (`why`): the engine is failed,
    /// and every request it held that waits on the completions channel
    /// completes with the failure.
    fn scheduler_failed(&self, d: usize, why: String) {
        let _ = self.failure.set(why.clone());
        let held: Vec<u64> = {
            let mut m = lock(&self.unanswered);
            let ids: Vec<u64> = m
                .iter()
                .filter(|&(_, &dev)| dev == d)
                .map(|(&id, _)| id)
                .collect();
            for id in &ids {
                m.remove(id);
            }
            ids
        };
        for id in held {
            self.router.finished(d);
            if let Some(Ok(mut l)) = self.live.get(d).map(|m| m.lock()) {
                l.failed += 1;
            }
            let _ = self.done.send(Completion {
                id,
                device: DeviceId(d as u32),
                tokens: Default::default(),
                output_tokens: 0,
                ttft: std::time::Duration::ZERO,
                e2e: std::time::Duration::ZERO,
                retractions: 0,
                error: Some(RequestError::SchedulerFailed(why.clone())),
            });
        }
    }
}

/// `m`, locked; a panic elsewhere while it was held leaves it usable (every
/// change under it is one insert or removal).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl SchedulerEvents for Shared {
    fn prompt_settled(&self, job: &Job, device: DeviceId) {
        let key = TokenKey::new(&job.tokens).in_namespace(job.namespace.as_deref());
        self.router.settled(key, device.index());
    }

    fn completed(&self, job: &Job, c: Completion) {
        self.router.finished(c.device.index());
        if let Some(Ok(mut l)) = self.live.get(c.device.index()).map(|m| m.lock()) {
            if c.error.is_none() {
                l.finished += 1;
                l.tokens += c.tokens;
                l.output_tokens += c.output_tokens as u64;
                l.ttft.record(c.ttft);
                l.e2e.record(c.e2e);
            } else {
                l.failed += 1;
            }
        }
        // A streaming client got its `Done` from the scheduler.
        if job.stream.is_none() {
            lock(&self.unanswered).remove(&job.id);
            let _ = self.done.send(c);
        }
    }

    fn computing(&self, key: TokenKey<'_>, device: DeviceId) {
        if let Some(c) = &self.computing {
            c.add(key.tokens(), key.namespace(), device.index());
        }
    }

    fn computed(&self, key: TokenKey<'_>, device: DeviceId) {
        if let Some(c) = &self.computing {
            c.remove(key.tokens(), key.namespace(), device.index());
        }
    }

    fn computing_now(&self, key: TokenKey<'_>) -> Vec<usize> {
        self.computing
            .as_ref()
            .map(|c| c.longest(key.tokens(), key.namespace()))
            .unwrap_or_default()
    }

    fn cache_op(&self, device: DeviceId, op: CacheOp, took: std::time::Duration) {
        if let Some(Ok(mut l)) = self.live.get(device.index()).map(|m| m.lock()) {
            match op {
                CacheOp::Match => l.matches.record(took),
                CacheOp::Insert => l.inserts.record(took),
            }
        }
    }
}

/// A running engine. Dropping it stops the schedulers (requests still in
/// flight complete with an error) and joins them; [`shutdown`](Self::shutdown)
/// first lets them finish their work.
pub struct Engine {
    cfg: EngineConfig,
    placement: Placement,
    shared: Arc<Shared>,
    inboxes: Vec<Sender<Inbox>>,
    threads: Vec<JoinHandle<SchedulerStats>>,
    completions: Mutex<Receiver<Completion>>,
    next_id: AtomicU64,
    stop: Arc<AtomicBool>,
    evictor: Vec<radixkv::cache::Evictor>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("devices", &self.cfg.devices)
            .field("router", &self.cfg.router.kind)
            .finish()
    }
}

// The engine is shared by reference between threads (the HTTP server's
// handlers hold it in an `Arc`, without a lock): it must stay `Send + Sync`.
const _: fn() = || {
    fn shared<T: Send + Sync>() {}
    shared::<Engine>();
};

impl Engine {
    /// Builds the cache(s) and starts one scheduler thread per device.
    pub fn start(cfg: EngineConfig, backend: Arc<dyn ModelBackend>) -> Result<Engine, EngineError> {
        if cfg.devices == 0 {
            return Err(EngineError::InvalidConfig("at least one device".into()));
        }
        if cfg.pages_per_device < 2 {
            return Err(EngineError::InvalidConfig(
                "pages_per_device must be at least 2 (page 0 is reserved)".into(),
            ));
        }
        cfg.tiers.validate().map_err(EngineError::InvalidConfig)?;
        let private = cfg.router.kind.private_trees();
        let placement = Placement::build(&cfg, backend.as_ref())?;
        let mut evictor = Vec::new();
        if cfg.watermarks.is_some() {
            for c in placement.caches() {
                evictor.push(c.start_evictor()?);
            }
        }
        let mut router_cfg = cfg.router;
        router_cfg.copies = !private && cfg.tiers.copy.peer();
        // A prefix of a thirty-second of a pool or more is "long" for the
        // router (RouterConfig::copy_slack_long).
        router_cfg.long_prefix_tokens = cfg.pages_per_device.saturating_mul(cfg.page_size) / 32;
        let (done_tx, done_rx) = channel();
        let shared = Arc::new(Shared {
            router: Router::new(router_cfg, cfg.devices, cfg.page_size),
            done: done_tx,
            live: (0..cfg.devices).map(|_| Mutex::default()).collect(),
            computing: (!private && cfg.tiers.copy.peer())
                .then(|| PendingIndex::new(cfg.devices, cfg.page_size)),
            failure: std::sync::OnceLock::new(),
            unanswered: Mutex::new(HashMap::new()),
        });
        let stop = Arc::new(AtomicBool::new(false));
        let mut inboxes = Vec::new();
        let mut threads = Vec::new();
        for d in 0..cfg.devices {
            let (cache, dev) = placement
                .get(d)
                .map(|(c, dev)| (Arc::clone(c), dev))
                .ok_or_else(|| EngineError::InvalidConfig(format!("no cache for device {d}")))?;
            let (tx, rx) = channel();
            let sched = Scheduler::new(
                cfg.scheduler.clone(),
                cache,
                dev,
                Arc::clone(&backend),
                Arc::clone(&shared) as Arc<dyn SchedulerEvents>,
            )
            .reporting_as(DeviceId(d as u32))
            .with_tiers(cfg.tiers.clone());
            let (stop, shared) = (Arc::clone(&stop), Arc::clone(&shared));
            let t = std::thread::Builder::new()
                .name(format!("radixkv-sched-{d}"))
                .spawn(move || {
                    // A panic ends this device's scheduler (its requests'
                    // stream sinks and its inbox drop with it): the engine
                    // is marked failed instead of serving on with a device
                    // gone, and its requests that wait on the completions
                    // channel complete with the failure.
                    let run = std::panic::AssertUnwindSafe(|| sched.run(rx, &stop));
                    std::panic::catch_unwind(run).unwrap_or_else(|p| {
                        let why = p
                            .downcast_ref::<&str>()
                            .map(|s| s.to_string())
                            .or_else(|| p.downcast_ref::<String>().cloned())
                            .unwrap_or_else(|| "a panic without a message".into());
                        shared.scheduler_failed(
                            d,
                            format!("the scheduler of device {d} failed: {why}"),
                        );
                        SchedulerStats::default()
                    })
                })
                .map_err(|e| {
                    EngineError::InvalidConfig(format!("cannot start a scheduler: {e}"))
                })?;
            inboxes.push(tx);
            threads.push(t);
        }
        Ok(Engine {
            cfg,
            placement,
            shared,
            inboxes,
            threads,
            completions: Mutex::new(done_rx),
            next_id: AtomicU64::new(0),
            stop,
            evictor,
        })
    }

    /// Why the engine can no longer serve, once a scheduler thread failed
    /// (panicked); `None` while it is sound. A failed engine refuses new
    /// requests with [`EngineError::Failed`].
    pub fn failure(&self) -> Option<&str> {
        self.shared.failure.get().map(String::as_str)
    }

    /// The configuration.
    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    /// The cache serving `device` and the device's id in it (the shared
    /// tree and `device`, or with the `private` router that device's own
    /// tree and device 0).
    pub fn cache(&self, device: usize) -> Option<(&Arc<PagedCache>, DeviceId)> {
        self.placement.get(device)
    }

    /// Tokens one request may hold at most on a device (its prompt plus
    /// output, in whole pages).
    pub fn max_request_tokens(&self) -> usize {
        (self.cfg.pages_per_device - 1) * self.cfg.page_size
    }

    /// Routes and queues a request; returns its id. Its [`Completion`]
    /// arrives on [`completions`](Self::completions).
    pub fn submit(&self, req: EngineRequest) -> Result<u64, EngineError> {
        self.submit_inner(req, None)
    }

    /// Like [`submit`](Self::submit), but every generated token and then
    /// the completion arrive on the returned receiver (and not on
    /// [`completions`](Self::completions)). Dropping the receiver does not
    /// stop the request: call [`cancel`](Self::cancel).
    ///
    /// ```
    /// use radixkv_engine::{Engine, EngineConfig, EngineRequest};
    /// use radixkv_engine::simulator::{CostModel, SimulatedBackend};
    /// use radixkv_engine::sched::scheduler::StreamEvent;
    /// use std::sync::Arc;
    /// let backend = Arc::new(SimulatedBackend::new(CostModel::default(), 1000.0));
    /// let cfg = EngineConfig { devices: 1, pages_per_device: 64, ..EngineConfig::default() };
    /// let engine = Engine::start(cfg, backend)?;
    /// let (_, rx) = engine.submit_streaming(EngineRequest::new(vec![1, 2, 3], 4))?;
    /// let events: Vec<StreamEvent> = rx.iter().collect();
    /// assert_eq!(events.len(), 5); // four tokens, then Done
    /// assert!(matches!(events[4], StreamEvent::Done(ref c) if c.output_tokens == 4));
    /// # Ok::<(), radixkv_engine::EngineError>(())
    /// ```
    pub fn submit_streaming(
        &self,
        req: EngineRequest,
    ) -> Result<(u64, Receiver<StreamEvent>), EngineError> {
        let (tx, rx) = channel();
        let id = self.submit_inner(req, Some(StreamSink::channel(tx)))?;
        Ok((id, rx))
    }

    /// Like [`submit_streaming`](Self::submit_streaming), with the events
    /// delivered to `sink` on the scheduler's thread (no thread or blocking
    /// receiver of the caller's: an async server hands them to a tokio
    /// channel from the callback).
    ///
    /// ```
    /// use radixkv_engine::{Engine, EngineConfig, EngineRequest};
    /// use radixkv_engine::simulator::{CostModel, SimulatedBackend};
    /// use radixkv_engine::sched::scheduler::{StreamEvent, StreamSink};
    /// use std::sync::Arc;
    /// let backend = Arc::new(SimulatedBackend::new(CostModel::default(), 1000.0));
    /// let cfg = EngineConfig { devices: 1, pages_per_device: 64, ..EngineConfig::default() };
    /// let engine = Engine::start(cfg, backend)?;
    /// let (tx, rx) = std::sync::mpsc::channel();
    /// engine.submit_to(EngineRequest::new(vec![1, 2, 3], 2), StreamSink::callback(move |e| tx.send(e).is_ok()))?;
    /// assert_eq!(rx.iter().count(), 3); // two tokens, then Done
    /// # Ok::<(), radixkv_engine::EngineError>(())
    /// ```
    pub fn submit_to(&self, req: EngineRequest, sink: StreamSink) -> Result<u64, EngineError> {
        self.submit_inner(req, Some(sink))
    }

    /// Drops request `id` wherever it is: its pages and pins are released
    /// and it completes with [`RequestError::Cancelled`](crate::RequestError::Cancelled). Unknown or finished ids
    /// are ignored.
    pub fn cancel(&self, id: u64) {
        for inbox in &self.inboxes {
            let _ = inbox.send(Inbox::Cancel(id));
        }
    }

    /// Ends request `id`'s generation now (a stop sequence was met): the
    /// tokens it generated so far are cached as at a natural end, its pages
    /// and pins are released, and it completes without error, its
    /// [`Completion::output_tokens`] counting what it generated. Unknown or
    /// finished ids are ignored.
    pub fn end_generation(&self, id: u64) {
        for inbox in &self.inboxes {
            let _ = inbox.send(Inbox::Finish(id));
        }
    }

    /// Arrival-to-first-token and arrival-to-completion latencies (wall
    /// time) of every request finished so far, all devices merged: the
    /// engine's one record of them, which the replay, the per-device
    /// [`DeviceMetrics`] summaries and [`latency_histograms`](Self::latency_histograms)
    /// read.
    pub fn latencies(&self) -> Latencies {
        let mut out = Latencies::default();
        for l in &self.shared.live {
            if let Ok(l) = l.lock() {
                out.ttft.merge(&l.ttft);
                out.e2e.merge(&l.e2e);
            }
        }
        out
    }

    /// Each device's raw latency histograms: TTFT, end to end, match and
    /// insert (copied under the device's live-figures lock) and `evict`
    /// (copied under the cache's eviction lock of that device). Each
    /// latency is recorded in one place only; this reads those records.
    ///
    /// ```
    /// use radixkv_engine::{Engine, EngineConfig, EngineRequest};
    /// use radixkv_engine::simulator::{CostModel, SimulatedBackend};
    /// use std::sync::Arc;
    /// let backend = Arc::new(SimulatedBackend::new(CostModel::default(), 1000.0));
    /// let cfg = EngineConfig { devices: 2, pages_per_device: 64, ..EngineConfig::default() };
    /// let engine = Engine::start(cfg, backend)?;
    /// engine.submit(EngineRequest::new(vec![1, 2, 3], 4))?;
    /// let c = engine.completions().recv().unwrap();
    /// let h = engine.latency_histograms();
    /// assert_eq!(h.len(), 2);
    /// let d = &h[c.device.index()];
    /// assert_eq!(d.device, c.device.0);
    /// assert_eq!((d.ttft.len(), d.e2e.len()), (1, 1));
    /// assert!(d.matches.len() >= 1 && d.inserts.len() >= 1);
    /// # Ok::<(), radixkv_engine::EngineError>(())
    /// ```
    pub fn latency_histograms(&self) -> Vec<DeviceLatencies> {
        (0..self.cfg.devices)
            .map(|d| {
                let mut out = DeviceLatencies {
                    device: d as u32,
                    ..DeviceLatencies::default()
                };
                if let Some(Ok(l)) = self.shared.live.get(d).map(|x| x.lock()) {
                    out.ttft = l.ttft.clone();
                    out.e2e = l.e2e.clone();
                    out.matches = l.matches.clone();
                    out.inserts = l.inserts.clone();
                }
                if let Some((cache, dev)) = self.cache(d) {
                    out.evict = cache.eviction_latency(dev).unwrap_or_default();
                }
                out
            })
            .collect()
    }

    /// Live figures per device.
    pub fn metrics(&self) -> Vec<DeviceMetrics> {
        let load = self.load();
        (0..self.cfg.devices)
            .map(|d| {
                let mut m = DeviceMetrics {
                    device: d as u32,
                    outstanding: load.get(d).copied().unwrap_or(0),
                    ..DeviceMetrics::default()
                };
                if let Some(Ok(l)) = self.shared.live.get(d).map(|x| x.lock()) {
                    m.finished = l.finished;
                    m.failed = l.failed;
                    m.tokens = l.tokens;
                    m.output_tokens = l.output_tokens;
                    m.ttft = l.ttft.summary();
                    m.e2e = l.e2e.summary();
                    m.match_latency = l.matches.summary();
                    m.insert_latency = l.inserts.summary();
                }
                if let Some((cache, dev)) = self.cache(d) {
                    if let Ok(a) = cache.allocator(dev) {
                        m.pages_free = a.free_pages();
                        m.pages_used = a.num_pages() - 1 - a.free_pages();
                    }
                    m.eviction = cache.eviction_metrics(dev).unwrap_or_default();
                }
                m
            })
            .collect()
    }

    /// The host tier's figures, when the engine has one.
    pub fn host_tier(&self) -> Option<HostTierMetrics> {
        let mut out: Option<HostTierMetrics> = None;
        for c in self.placement.caches() {
            if !c.has_host_tier() {
                continue;
            }
            let h = radixkv::Tier::Host;
            let m = out.get_or_insert_with(HostTierMetrics::default);
            if let Ok(a) = c.allocator(h) {
                m.pages_free += a.free_pages();
                m.pages_used += a.num_pages() - 1 - a.free_pages();
            }
            m.tokens += c.resident_tokens(h).unwrap_or(0);
        }
        out
    }

    /// Checks every cache's invariants and page conservation
    /// ([`RadixCache::check`](radixkv::RadixCache::check)); meaningful when no request is in flight.
    /// With requests in flight, pages they hold count as held, so a
    /// failure then may be a false alarm: quiesce first.
    pub fn audit(&self) -> Result<(), String> {
        self.placement.caches().iter().try_for_each(|c| c.check())
    }

    fn submit_inner(
        &self,
        req: EngineRequest,
        stream: Option<StreamSink>,
    ) -> Result<u64, EngineError> {
        if req.tokens.is_empty() {
            return Err(EngineError::Rejected("empty prompt".into()));
        }
        if req.output_len == 0 {
            return Err(EngineError::Rejected(
                "output_len must be at least 1".into(),
            ));
        }
        let need = req.tokens.len() + req.output_len + self.cfg.page_size;
        if need > self.max_request_tokens() {
            return Err(EngineError::Rejected(format!(
                "{} prompt + {} output tokens exceed a device's pool of {} tokens",
                req.tokens.len(),
                req.output_len,
                self.max_request_tokens()
            )));
        }
        // Relaxed: the flag is advisory (a request racing with `stop` fails
        // with `RequestError::Stopped` through the scheduler instead).
        if self.stop.load(Ordering::Relaxed) {
            return Err(EngineError::Stopped);
        }
        // Relaxed: ids only need to be unique.
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let job = Job {
            id,
            tokens: req.tokens,
            namespace: req.namespace,
            priority: req.priority,
            output_len: req.output_len,
            output_tokens: req.output_tokens,
            sampling: req.sampling,
            arrival: Instant::now(),
            stream,
        };
        let device = {
            let key = TokenKey::new(&job.tokens).in_namespace(job.namespace.as_deref());
            let shared = self.placement.shared().map(|c| &**c);
            self.shared.router.route(key, shared).device
        };
        let answered_here = job.stream.is_none();
        // Under the lock, the failure check, the record and the send are
        // one step against `scheduler_failed` (which sets the failure,
        // then takes the lock): a request either reaches a live scheduler
        // and is recorded, or is refused here; none falls between.
        let mut unanswered = lock(&self.shared.unanswered);
        if let Some(why) = self.failure() {
            return Err(EngineError::Failed(why.to_string()));
        }
        if self.inboxes[device].send(Inbox::Job(job)).is_err() {
            return Err(match self.failure() {
                Some(why) => EngineError::Failed(why.to_string()),
                None => EngineError::Stopped,
            });
        }
        if answered_here {
            unanswered.insert(id, device);
        }
        Ok(id)
    }

    /// Finished (or failed) requests, in completion order. The receiver is
    /// behind a lock (so that the engine is `Sync`): hold the guard only
    /// while receiving. Every request submitted without a stream completes
    /// here exactly once, a scheduler thread's failure included (with
    /// [`RequestError::SchedulerFailed`]).
    pub fn completions(&self) -> std::sync::MutexGuard<'_, Receiver<Completion>> {
        // A panic while holding the guard leaves the receiver intact.
        self.completions
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Outstanding requests per device, as the router counts them.
    pub fn load(&self) -> Vec<usize> {
        self.shared.router.load()
    }

    /// Switches every cache's eviction policy at run time (see
    /// [`RadixCache::set_eviction_policy`](radixkv::RadixCache::set_eviction_policy)).
    pub fn set_eviction_policy(&self, p: EvictionPolicy) {
        for c in self.placement.caches() {
            c.set_eviction_policy(p);
        }
    }

    /// The eviction policy now.
    pub fn eviction_policy(&self) -> EvictionPolicy {
        self.placement.caches()[0].eviction_policy()
    }

    /// Moves every cache's watermarks at run time (the engine must have
    /// been started with watermarks: see [`RadixCache::set_watermarks`](radixkv::RadixCache::set_watermarks)).
    pub fn set_watermarks(&self, low: usize, high: usize) -> Result<(), EngineError> {
        for c in self.placement.caches() {
            c.set_watermarks(low, high)?;
        }
        Ok(())
    }

    /// The watermarks now (none without a background evictor).
    pub fn watermarks(&self) -> Option<(usize, usize)> {
        self.placement.caches()[0].watermarks()
    }

    /// The router's configuration now.
    pub fn router_config(&self) -> Arc<RouterConfig> {
        self.shared.router.config()
    }

    /// Replaces the router's configuration at run time (balance
    /// thresholds, copy slack; not its kind): see [`Router::set_config`].
    pub fn set_router_config(&self, cfg: RouterConfig) -> Result<(), EngineError> {
        self.shared
            .router
            .set_config(cfg)
            .map_err(EngineError::InvalidConfig)
    }

    /// Asks the schedulers to stop now: requests still queued or running
    /// complete with [`RequestError::Stopped`](crate::RequestError::Stopped).
    pub fn stop(&self) {
        // Relaxed: polled by each scheduler once per round.
        self.stop.store(true, Ordering::Relaxed);
    }

    /// Lets the schedulers finish everything submitted, joins them and
    /// reports per device.
    pub fn shutdown(mut self) -> EngineReport {
        self.inboxes.clear(); // schedulers exit once idle
        let stats: Vec<SchedulerStats> = self
            .threads
            .drain(..)
            .map(|t| t.join().unwrap_or_default())
            .collect();
        self.evictor.clear();
        let devices = stats
            .into_iter()
            .enumerate()
            .map(|(d, scheduler)| {
                let (pool_pages, used_pages, eviction) =
                    self.cache(d)
                        .map_or((0, 0, Default::default()), |(cache, dev)| {
                            let (pool, used) = cache.allocator(dev).map_or((0, 0), |a| {
                                let pool = a.num_pages() - 1;
                                (pool, pool - a.free_pages())
                            });
                            (pool, used, cache.eviction_metrics(dev).unwrap_or_default())
                        });
                DeviceReport {
                    device: DeviceId(d as u32),
                    scheduler,
                    eviction,
                    pool_pages,
                    used_pages,
                }
            })
            .collect();
        EngineReport { devices }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        if self.threads.is_empty() {
            return;
        }
        self.stop();
        self.inboxes.clear();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
