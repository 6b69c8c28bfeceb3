//! [`PagedBackend`]: any [`PagedModel`] as the engine's [`ModelBackend`]:
//! one KV pool per device, host or CUDA as [`PoolKind`] says, and the host
//! tier's pool, built from a [`PoolConfig`]; its copies between pools (one
//! memcpy per run, layer and K/V: [`copy_runs`](crate::kvpool::copy_runs)),
//! its paged passes with slot provenance tags, the next token sampled as
//! each request asks ([`Sampling`](radixkv_engine::sched::sampling::Sampling)), the
//! verification log it keeps, and its counters ([`PagedStats`]).

use super::verify::{Comparison, RequestLog};
use super::{Logits, ModelError, PagedModel, PagedSeq};
use crate::kvpool::{HostKvPool, KvLayout, KvPool};
use radixkv::cache::SlotRun;
use radixkv::device::{DeviceId, Tier};
use radixkv_engine::sched::batch::{BackendError, Batch, ModelBackend, StepOutput, Verification};
use radixkv_engine::EngineConfig;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

/// Where the backend keeps each device's KV pool.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PoolKind {
    /// Host memory ([`HostKvPool`]).
    #[default]
    Host,
    /// GPU memory (`CudaKvPool`, feature `cuda`): device `d`'s pool on GPU
    /// `d % GPUs` (with peer access on between the GPUs used), and the host
    /// tier's pool in pinned host memory (`PinnedKvPool`). Without the
    /// feature, or without a CUDA driver, building the backend is an error.
    Cuda,
}

impl std::str::FromStr for PoolKind {
    type Err = ModelError;
    fn from_str(s: &str) -> Result<Self, ModelError> {
        match s {
            "host" => Ok(PoolKind::Host),
            "cuda" | "gpu" => Ok(PoolKind::Cuda),
            _ => Err(ModelError::InvalidConfig(format!(
                "unknown KV pool {s:?} (host or cuda)"
            ))),
        }
    }
}

/// A [`PagedBackend`]'s pools.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolConfig {
    /// Devices, one pool each.
    pub devices: usize,
    /// Slots per pool: the engine's pages per device × page size.
    pub slots_per_device: usize,
    /// Slots of the host tier's pool (0: none): the engine's host pages ×
    /// page size. Always in host memory (pinned with [`PoolKind::Cuda`]);
    /// copies between it and the devices' pools are the engine's host
    /// loads and writes.
    pub host_slots: usize,
    /// Host or GPU pools.
    pub pool: PoolKind,
    /// Check every request against the model's dense reference (when the
    /// request leaves the device, on that device's scheduler thread:
    /// latencies then include the check).
    pub verify: bool,
}

impl PoolConfig {
    /// Pools that fit `engine`'s devices and pages, host memory, no
    /// verification.
    pub fn for_engine(engine: &EngineConfig) -> Self {
        PoolConfig {
            devices: engine.devices,
            slots_per_device: engine.pages_per_device.saturating_mul(engine.page_size),
            host_slots: engine
                .tiers
                .host_pages
                .map_or(0, |h| h.saturating_mul(engine.page_size)),
            pool: PoolKind::Host,
            verify: false,
        }
    }
}

/// What a [`PagedBackend`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PagedStats {
    /// Prefill passes run.
    pub prefill_passes: u64,
    /// Decode passes run.
    pub decode_passes: u64,
    /// Positions computed (K/V written to the pool).
    pub computed_positions: u64,
    /// Positions whose K/V was read from the pool rather than computed.
    pub reused_positions: u64,
    /// Reads of a slot whose K/V was not written for the reader's token
    /// prefix (stale or foreign KV handed out by the cache).
    pub stale_reads: u64,
    /// Positions whose K/V was copied between pools (host loads and
    /// writes, copies between devices).
    pub copied_positions: u64,
    /// Requests verified (a retracted request counts once per admission).
    pub verified_requests: u64,
    /// Passes whose computed positions were verified.
    pub verified_passes: u64,
    /// Requests with at least one mismatching position.
    pub mismatches: u64,
    /// The positions' comparison.
    pub comparison: Comparison,
}

struct DeviceState {
    pool: Box<dyn KvPool>,
    /// Per slot: the tag of the token prefix whose K/V it holds (0: none).
    tags: Vec<u64>,
    logs: HashMap<u64, RequestLog>,
}

/// A pool's size in bytes, if it fits in memory's address range.
fn layout_bytes(layout: &KvLayout) -> Option<usize> {
    layout
        .layers
        .checked_mul(2 * layout.row)
        .and_then(|x| x.checked_mul(layout.slots))
        .filter(|&n| n <= isize::MAX as usize / 4)
        .map(|n| n * 4)
}

/// Tags of the prefixes `tokens[..=p]` for every `p` (never 0).
fn prefix_tags(tokens: &[u32]) -> Vec<u64> {
    let mut h = 0x6A09_E667_F3BC_C908u64;
    tokens
        .iter()
        .map(|&t| {
            h = (h ^ u64::from(t)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            h ^= h >> 29;
            h | 1
        })
        .collect()
}

/// A [`PagedModel`] as the engine's backend: one KV pool per device,
/// sized for the cache's slots, and one for the host tier.
///
/// ```
/// use radixkv_engine::{Engine, EngineConfig, EngineRequest};
/// use radixkv_models::backend::{PagedBackend, PoolConfig};
/// use radixkv_models::tiny::{TinyConfig, TinyModel};
/// use std::sync::Arc;
/// let cfg = EngineConfig { devices: 2, pages_per_device: 64, ..EngineConfig::default() };
/// let model = TinyModel::new(TinyConfig::default())?;
/// let pools = PoolConfig { verify: true, ..PoolConfig::for_engine(&cfg) };
/// let backend = Arc::new(PagedBackend::new(model, pools)?);
/// let engine = Engine::start(cfg, backend.clone()).unwrap();
/// let system: Vec<u32> = (0..40).collect();
/// for q in 0..4u32 {
///     let mut prompt = system.clone();
///     prompt.extend([1000 + q; 8]);
///     engine.submit(EngineRequest::new(prompt, 3)).unwrap();
/// }
/// for _ in 0..4 {
///     assert!(engine.completions().recv().unwrap().error.is_none());
/// }
/// engine.shutdown();
/// let s = backend.stats();
/// assert_eq!((s.verified_requests, s.mismatches, s.stale_reads), (4, 0, 0));
/// # Ok::<(), radixkv_models::backend::ModelError>(())
/// ```
pub struct PagedBackend<M> {
    model: M,
    pool: PoolKind,
    verify: bool,
    devices: Vec<Mutex<DeviceState>>,
    /// The host tier's pool ([`Tier::Host`]).
    host: Option<Mutex<DeviceState>>,
    stats: Mutex<PagedStats>,
}

impl<M: PagedModel> std::fmt::Debug for PagedBackend<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PagedBackend")
            .field("model", &self.model.describe())
            .field("devices", &self.devices.len())
            .field("pool", &self.pool)
            .field("verify", &self.verify)
            .finish()
    }
}

#[cfg(feature = "cuda")]
fn cuda_pools(devices: usize, layout: KvLayout) -> Result<Vec<Box<dyn KvPool>>, ModelError> {
    use crate::kvpool::{CudaKvPool, KvPoolError};
    let mut pools = Vec::with_capacity(devices);
    // The first pool proves a driver is there (a typed error otherwise);
    // only then is the GPU count asked for.
    pools.push(CudaKvPool::new(0, layout)?);
    let gpus = cudarc::driver::CudaContext::device_count()
        .map_err(|e| KvPoolError::Cuda(format!("{e:?}")))?
        .max(1) as usize;
    for d in 1..devices {
        pools.push(CudaKvPool::new(d % gpus, layout)?);
    }
    // Pools 0..min(devices, GPUs) are on distinct GPUs: peer access
    // between each pair, so copies between devices go GPU to GPU.
    let distinct = &pools[..devices.min(gpus)];
    for (i, a) in distinct.iter().enumerate() {
        for b in &distinct[i + 1..] {
            // Without peer access the driver stages copies between the
            // GPUs through host memory: slower, still correct, so a
            // refusal or failure here is not fatal.
            let _ = a.enable_peer_access(b);
        }
    }
    Ok(pools
        .into_iter()
        .map(|p| Box::new(p) as Box<dyn KvPool>)
        .collect())
}

#[cfg(not(feature = "cuda"))]
fn cuda_pools(_devices: usize, _layout: KvLayout) -> Result<Vec<Box<dyn KvPool>>, ModelError> {
    Err(ModelError::CudaNotBuilt)
}

/// The host tier's pool: pinned host memory (allocated in GPU 0's
/// context, usable from every GPU's) next to GPU pools, so host loads and
/// writes run at the link's speed; a [`HostKvPool`] otherwise.
#[cfg(feature = "cuda")]
fn host_tier_pool(kind: PoolKind, layout: KvLayout) -> Result<Box<dyn KvPool>, ModelError> {
    Ok(match kind {
        PoolKind::Host => Box::new(HostKvPool::new(layout)),
        PoolKind::Cuda => Box::new(crate::kvpool::PinnedKvPool::new(0, layout)?),
    })
}

#[cfg(not(feature = "cuda"))]
fn host_tier_pool(_kind: PoolKind, layout: KvLayout) -> Result<Box<dyn KvPool>, ModelError> {
    Ok(Box::new(HostKvPool::new(layout)))
}

impl<M: PagedModel> PagedBackend<M> {
    /// One zeroed pool per device (and one for the host tier) for `model`.
    /// A CUDA pool without feature `cuda` or without a driver is an error,
    /// not a panic.
    pub fn new(model: M, cfg: PoolConfig) -> Result<Self, ModelError> {
        if cfg.devices == 0 {
            return Err(ModelError::InvalidConfig("at least one device".into()));
        }
        if cfg.slots_per_device == 0 || cfg.slots_per_device > u32::MAX as usize {
            return Err(ModelError::InvalidConfig(format!(
                "{} slots per device (1..=2^32-1)",
                cfg.slots_per_device
            )));
        }
        let layout = model.pool_layout(cfg.slots_per_device);
        if layout_bytes(&layout).is_none() {
            return Err(ModelError::InvalidConfig(format!(
                "a pool of {} slots is too large",
                cfg.slots_per_device
            )));
        }
        let pools: Vec<Box<dyn KvPool>> = match cfg.pool {
            PoolKind::Host => (0..cfg.devices)
                .map(|_| Box::new(HostKvPool::new(layout)) as Box<dyn KvPool>)
                .collect(),
            PoolKind::Cuda => cuda_pools(cfg.devices, layout)?,
        };
        let state = |pool: Box<dyn KvPool>, slots: usize| {
            Mutex::new(DeviceState {
                pool,
                tags: vec![0; slots],
                logs: HashMap::new(),
            })
        };
        let devices = pools
            .into_iter()
            .map(|pool| state(pool, cfg.slots_per_device))
            .collect();
        let host = if cfg.host_slots == 0 {
            None
        } else if cfg.host_slots > u32::MAX as usize
            || layout_bytes(&model.pool_layout(cfg.host_slots)).is_none()
        {
            return Err(ModelError::InvalidConfig(format!(
                "a host pool of {} slots is too large",
                cfg.host_slots
            )));
        } else {
            let layout = model.pool_layout(cfg.host_slots);
            Some(state(host_tier_pool(cfg.pool, layout)?, cfg.host_slots))
        };
        Ok(PagedBackend {
            model,
            pool: cfg.pool,
            verify: cfg.verify,
            devices,
            host,
            stats: Mutex::new(PagedStats::default()),
        })
    }

    /// The model.
    pub fn model(&self) -> &M {
        &self.model
    }

    /// What the backend did so far.
    pub fn stats(&self) -> PagedStats {
        self.stats.lock().map(|s| *s).unwrap_or_default()
    }

    /// Runs `f` on the pool of `tier` (a device, or [`Tier::Host`]; tests
    /// read it, or corrupt a slot as a negative control).
    pub fn with_pool<R>(
        &self,
        tier: impl Into<Tier>,
        f: impl FnOnce(&mut dyn KvPool) -> R,
    ) -> Result<R, ModelError> {
        let mut st = self.state(tier.into())?;
        Ok(f(st.pool.as_mut()))
    }

    fn state(&self, tier: Tier) -> Result<std::sync::MutexGuard<'_, DeviceState>, ModelError> {
        self.tier(tier)?
            .lock()
            .map_err(|_| ModelError::Input(format!("{tier}'s state is poisoned")))
    }

    /// A device's state, or the host tier's.
    fn tier(&self, tier: Tier) -> Result<&Mutex<DeviceState>, ModelError> {
        match tier {
            Tier::Host => self.host.as_ref(),
            Tier::Device(d) => self.devices.get(d.index()),
        }
        .ok_or(ModelError::UnknownTier(tier))
    }

    /// Copies the K/V of `runs` (every layer) from `from`'s pool to `to`'s,
    /// one memcpy per run, layer and K or V ([`crate::kvpool::copy_runs`]:
    /// host to GPU, GPU to host, GPU to GPU, host to host), and the slots'
    /// provenance tags with them (so a copied slot is checked as its
    /// source was). Runs outside either pool are an error and copy nothing.
    fn copy_runs(&self, from: Tier, to: Tier, runs: &[SlotRun]) -> Result<(), ModelError> {
        if from == to {
            return Err(ModelError::Input(format!("a copy from {from} to itself")));
        }
        let (a, b) = (self.tier(from)?, self.tier(to)?);
        // Two locks, always in address order: two copies in opposite
        // directions cannot deadlock.
        let (first, second) = if (a as *const _) < (b as *const _) {
            (a, b)
        } else {
            (b, a)
        };
        let poisoned = |t: Tier| ModelError::Input(format!("{t}'s state is poisoned"));
        let g1 = first.lock().map_err(|_| poisoned(from))?;
        let g2 = second.lock().map_err(|_| poisoned(to))?;
        let (src, mut dst) = if std::ptr::eq(first, a) {
            (g1, g2)
        } else {
            (g2, g1)
        };
        crate::kvpool::copy_runs(src.pool.as_ref(), dst.pool.as_mut(), runs)?;
        let mut copied = 0u64;
        for r in runs {
            // In range of both pools: copy_runs checked it.
            let (s, d, n) = (r.src as usize, r.dst as usize, r.len as usize);
            for (i, t) in dst.tags.iter_mut().skip(d).take(n).enumerate() {
                *t = src.tags.get(s + i).copied().unwrap_or(0);
            }
            copied += u64::from(r.len);
        }
        drop((src, dst));
        self.bump(|s| s.copied_positions += copied);
        Ok(())
    }

    fn bump(&self, f: impl FnOnce(&mut PagedStats)) {
        if let Ok(mut s) = self.stats.lock() {
            f(&mut s);
        }
    }

    /// Runs one pass (see [`ModelBackend::step`]).
    fn pass(&self, device: DeviceId, batch: &Batch) -> Result<StepOutput, ModelError> {
        let t0 = Instant::now();
        // (request, work, whether it samples)
        let mut works = Vec::with_capacity(batch.prefill.len() + batch.decode.len());
        for p in &batch.prefill {
            let data = p.data.as_ref().ok_or_else(|| {
                ModelError::Input(format!("request {} came without token data", p.request))
            })?;
            works.push((p.request, data, p.new_tokens, p.samples));
        }
        for d in &batch.decode {
            let data = d.data.as_ref().ok_or_else(|| {
                ModelError::Input(format!("request {} came without token data", d.request))
            })?;
            works.push((d.request, data, 1, true));
        }
        let mut seqs = Vec::with_capacity(works.len());
        for &(req, data, new, _) in &works {
            let n = data.tokens.len();
            if data.slots.len() != n || new == 0 || new > n {
                return Err(ModelError::Input(format!(
                    "request {req}: {n} tokens, {} slots, {new} to compute",
                    data.slots.len()
                )));
            }
            seqs.push(PagedSeq {
                tokens: &data.tokens,
                slots: &data.slots,
                start: n - new,
            });
        }
        let mut st = self.state(Tier::Device(device))?;
        let st = &mut *st;
        // Provenance: every read slot must hold its reader's prefix.
        let mut stale = 0u64;
        let mut reused = 0u64;
        let tags: Vec<Vec<u64>> = seqs.iter().map(|s| prefix_tags(s.tokens)).collect();
        for (s, tg) in seqs.iter().zip(&tags) {
            for (&slot, tag) in s.slots[..s.start].iter().zip(tg) {
                reused += 1;
                if st.tags.get(slot as usize) != Some(tag) {
                    stale += 1;
                }
            }
        }
        // Every computed row only when verification keeps them all.
        let all_rows = self.verify && self.model.verifies_every_position();
        let logits = self
            .model
            .forward_paged(st.pool.as_mut(), &seqs, all_rows)?;
        let mut computed = 0u64;
        for (s, tg) in seqs.iter().zip(&tags) {
            let new = &s.slots[s.start..s.tokens.len()];
            for (&slot, &tag) in new.iter().zip(&tg[s.start..]) {
                if let Some(t) = st.tags.get_mut(slot as usize) {
                    *t = tag;
                }
                computed += 1;
            }
        }
        let mut next_tokens = Vec::new();
        for (&(req, data, _, samples), lg) in works.iter().zip(&logits) {
            if samples {
                // The sampled position is the context's last.
                let at = data.tokens.len() - 1;
                if let Some(tok) = lg.last().and_then(|row| data.sampling.sample(row, at)) {
                    next_tokens.push((req, tok));
                }
            }
            if self.verify {
                self.log(st, req, &data.tokens, lg);
            }
        }
        let prefill = !batch.prefill.is_empty();
        let decode = !batch.decode.is_empty();
        self.bump(|s| {
            s.prefill_passes += u64::from(prefill);
            s.decode_passes += u64::from(decode);
            s.computed_positions += computed;
            s.reused_positions += reused;
            s.stale_reads += stale;
        });
        Ok(StepOutput {
            time: t0.elapsed(),
            next_tokens,
        })
    }

    /// Keeps a pass's logits of `req` for verification at release.
    fn log(&self, st: &mut DeviceState, req: u64, tokens: &[u32], lg: &Logits) {
        let log = st.logs.entry(req).or_default();
        let common = log.tokens.len().min(tokens.len());
        if log.tokens[..common] != tokens[..common] {
            // Not a continuation (cannot happen with the scheduler): check
            // what was kept and start again.
            let old = std::mem::take(log);
            self.check(old);
        }
        let log = st.logs.entry(req).or_default();
        if tokens.len() > log.tokens.len() {
            log.tokens = tokens.to_vec();
        }
        log.passes += 1;
        for i in 0..lg.rows() {
            let pos = lg.start + i;
            if let Some(row) = lg.position(pos) {
                log.rows.push((pos, row.to_vec()));
            }
        }
    }

    /// Recomputes a request's context densely and compares every kept row.
    fn check(&self, log: RequestLog) {
        let Some((c, bad)) = log.verify(&self.model) else {
            return;
        };
        self.bump(|s| {
            s.verified_requests += 1;
            s.verified_passes += log.passes;
            s.mismatches += u64::from(bad);
            s.comparison.merge(&c);
        });
    }
}

impl<M: PagedModel> ModelBackend for PagedBackend<M> {
    fn step(&self, device: DeviceId, batch: &Batch) -> Result<StepOutput, BackendError> {
        self.pass(device, batch).map_err(|e| BackendError {
            device,
            reason: e.to_string(),
        })
    }

    fn wants_data(&self) -> bool {
        true
    }

    fn copy(&self, from: Tier, to: Tier, runs: &[SlotRun]) -> Result<(), BackendError> {
        if runs.is_empty() {
            return Ok(()); // yes, this backend copies
        }
        self.copy_runs(from, to, runs)
            .map_err(|e| BackendError::of_copy(from, to, e.to_string()))
    }

    fn release(&self, device: DeviceId, request: u64) {
        if !self.verify {
            return;
        }
        let log = match self.state(Tier::Device(device)) {
            Ok(mut st) => st.logs.remove(&request),
            Err(_) => None,
        };
        if let Some(log) = log {
            self.check(log);
        }
    }

    fn verification(&self) -> Option<Verification> {
        self.verify.then(|| {
            let s = self.stats();
            Verification {
                verified: s.verified_requests,
                mismatches: s.mismatches,
            }
        })
    }

    fn describe(&self) -> String {
        format!(
            "{}; {} KV pools{}",
            self.model.describe(),
            match self.pool {
                PoolKind::Host => "host",
                PoolKind::Cuda => "CUDA",
            },
            if self.verify { ", verifying" } else { "" }
        )
    }
}
