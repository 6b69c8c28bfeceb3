//! Admission: page budgets, eviction and host write-back, copies into the
//! device, and the wait for a prefix another request is computing.

use super::interface::{CacheOp, RequestError};
use super::state::{copy_cap, prompt_key, Running, Scheduler};
use crate::accounting::CopiedIn;
use crate::sched::policy::Waiting;
use crate::tiers::{CopySource, WritePolicy};
use radixkv::cache::{CacheError, Request, TokenKey};
use radixkv::device::DeviceId;
use radixkv::Tier;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

impl Scheduler {
    /// Tokens the running requests may still generate, as reserved at
    /// admission (clipped, times the new-token ratio).
    pub(super) fn reserved_output(&self) -> usize {
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

    pub(super) fn free_tokens(&self) -> usize {
        self.cache
            .allocator(self.device)
            .map_or(0, |a| a.free_pages() * a.page_size())
    }

    /// Makes `tokens` free tokens available by evicting, if possible.
    pub(super) fn ensure_free(&mut self, tokens: usize) -> bool {
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
    pub(super) fn make_room(&mut self, tokens: usize) {
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
        let (backend, from) = (Arc::clone(&self.backend), Tier::Device(self.reported));
        let ev = self
            .cache
            .evict_with_write_back(self.device, tokens - free, |copy| {
                backend.copy(from, Tier::Host, &copy.runs()).is_ok()
            });
        if let Ok(ev) = ev {
            self.count_host_write(ev.written_back);
        }
    }

    pub(super) fn count_host_write(&mut self, tokens: usize) {
        self.stats.host_written_tokens += tokens as u64;
        self.stats.host_write_bytes += self.tiers.bytes(tokens);
        if tokens > 0 {
            self.stats.host_write_time += self.tiers.copy_time(CopySource::Host, tokens);
        }
    }

    /// Writes `key` (whole pages, resident on this device) to the host
    /// tier where it lacks it.
    pub(super) fn write_to_host(&mut self, key: TokenKey<'_>) {
        let Some(host) = self.host else {
            return;
        };
        let Ok(Some(copy)) = self.cache.copy_prefix(key, self.device, host) else {
            return; // nothing to write, or the host is full of pinned pages
        };
        let n = copy.range().len();
        if self
            .backend
            .copy(Tier::Device(self.reported), Tier::Host, &copy.runs())
            .is_ok()
            && copy.complete().is_ok()
        {
            self.count_host_write(n);
        }
    }

    /// Before a request's prefill: loads from the host tier or copies from
    /// another device the part of its prompt they hold beyond the device's
    /// cached prefix, when the cost model says that beats computing it.
    pub(super) fn load_prefix(&mut self, req: &mut Request) -> CopiedIn {
        let mut out = CopiedIn::default();
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
        if self
            .backend
            .copy(src.tier(), Tier::Device(self.reported), &copy.runs())
            .is_err()
        {
            return out;
        }
        if copy.complete().is_err() {
            return out;
        }
        let (bytes, time) = (self.tiers.bytes(n), self.tiers.copy_time(src, n));
        match src {
            CopySource::Host => out.host_loaded_tokens = n as u64,
            CopySource::Peer(_) => out.peer_copied_tokens = n as u64,
        }
        out.bytes = bytes;
        out.time = time;
        self.stats.copied += out;
        self.copy_wait += time;
        out
    }

    pub(super) fn round(&mut self) -> Result<(), RequestError> {
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
        let out = self.backend.step(self.reported, &batch)?;
        self.stats.busy += out.time;
        let sampled: HashMap<u64, u32> = out.next_tokens.into_iter().collect();
        if admitted {
            self.after_prefill(&batch, &sampled)?;
        } else {
            self.after_decode(&sampled)?;
        }
        Ok(())
    }

    /// Admits waiting requests in policy order; returns whether any
    /// prefill work is ready (new admissions or a chunked request's next
    /// chunk).
    pub(super) fn admit(&mut self) -> Result<bool, CacheError> {
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
    pub(super) fn computing_here(&self, req: &Request, computing: &[usize]) -> bool {
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
    pub(super) fn worth_waiting(&self, req: &Request, computing: &[usize]) -> bool {
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
    pub(super) fn done_computing(&self, r: &Running) {
        if r.computing {
            self.events
                .computed(prompt_key(&r.req, self.cache.page_size()), self.reported);
        }
    }
}
