//! The engine's default model backend, a simulator: [`SimulatedBackend`]
//! sleeps for a [`CostModel`]'s duration, scaled, on the scheduler's own
//! thread. The backend trait and the batch types live with the scheduler
//! that uses them ([`crate::sched::batch`]); models that compute for real
//! are the crate `radixkv-models`'.

use crate::sched::batch::{BackendError, Batch, ModelBackend, StepOutput};
use radixkv::device::DeviceId;
use std::time::Duration;

/// A linear cost model of one GPU serving a mid-size model (the defaults
/// are of the order of an 8B model on one H100-class GPU).
///
/// * prefill pass: `prefill_base + Σ new · per_prefill_token +
///   Σ new · (context + new / 2) · per_attention_pair` — linear layers grow
///   with the new tokens, attention with new × context;
/// * decode pass: `decode_base + batch · per_decode_request +
///   Σ context · per_context_token` — a step's weight reads, per-request
///   work, and the KV reads of attention.
///
/// ```
/// use radixkv_engine::sched::batch::{Batch, PrefillWork};
/// use radixkv_engine::simulator::CostModel;
/// let m = CostModel::default();
/// let work = |new_tokens, context_tokens| PrefillWork {
///     request: 0, new_tokens, context_tokens, samples: true, data: None,
/// };
/// let cold = Batch { prefill: vec![work(2048, 0)], ..Batch::default() };
/// let warm = Batch { prefill: vec![work(128, 2048)], ..Batch::default() };
/// assert!(m.cost(&warm) * 5 < m.cost(&cold)); // reuse makes prefill much cheaper
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CostModel {
    /// Fixed cost of a prefill pass.
    pub prefill_base: Duration,
    /// Per new token (linear layers).
    pub per_prefill_token: Duration,
    /// Per (new token, context token) pair, in nanoseconds (attention).
    pub per_attention_pair_ns: f64,
    /// Fixed cost of a decode pass.
    pub decode_base: Duration,
    /// Per request in a decode pass.
    pub per_decode_request: Duration,
    /// Per context token read in a decode pass, in nanoseconds.
    pub per_context_token_ns: f64,
}

impl Default for CostModel {
    fn default() -> Self {
        CostModel {
            prefill_base: Duration::from_millis(3),
            per_prefill_token: Duration::from_micros(50),
            per_attention_pair_ns: 3.0,
            decode_base: Duration::from_millis(6),
            per_decode_request: Duration::from_micros(50),
            per_context_token_ns: 20.0,
        }
    }
}

impl CostModel {
    /// The model time of one pass (zero for an empty batch).
    pub fn cost(&self, b: &Batch) -> Duration {
        let mut ns = 0f64;
        if !b.prefill.is_empty() {
            ns += self.prefill_base.as_nanos() as f64;
            for p in &b.prefill {
                let new = p.new_tokens as f64;
                ns += new * self.per_prefill_token.as_nanos() as f64;
                ns += new * (p.context_tokens as f64 + new / 2.0) * self.per_attention_pair_ns;
            }
        }
        if !b.decode.is_empty() {
            ns += self.decode_base.as_nanos() as f64;
            ns += b.decode.len() as f64 * self.per_decode_request.as_nanos() as f64;
            let ctx: usize = b.decode.iter().map(|d| d.context_tokens).sum();
            ns += ctx as f64 * self.per_context_token_ns;
        }
        Duration::from_nanos(ns as u64)
    }

    /// The time one request's prefill of `new` tokens after `context`
    /// adds to a pass (its linear and attention terms, without the pass's
    /// fixed cost).
    pub fn prefill_cost(&self, new: usize, context: usize) -> Duration {
        let new = new as f64;
        let ns = new * self.per_prefill_token.as_nanos() as f64
            + new * (context as f64 + new / 2.0) * self.per_attention_pair_ns;
        Duration::from_nanos(ns as u64)
    }
}

/// The default backend: sleeps for the cost model's time divided by
/// `speedup`, on the scheduler's own thread, so that devices run in
/// parallel and the engine's real concurrency is exercised. A pass that
/// waits for KV copies overlaps them with its compute layer by layer:
/// `max(compute, copy) + min(compute, copy) / layers` (`crate::tiers`).
///
/// ```
/// use radixkv_engine::sched::batch::{Batch, ModelBackend};
/// use radixkv_engine::simulator::{CostModel, SimulatedBackend};
/// use std::time::Duration;
/// let b = SimulatedBackend::new(CostModel::default(), 0.0).with_layers(32);
/// let copy = Batch { copy_time: Duration::from_millis(64), ..Batch::default() };
/// // Nothing to compute: the pass waits for the copy alone.
/// assert_eq!(b.step(Default::default(), &copy).unwrap().time, Duration::from_millis(64));
/// ```
#[derive(Clone, Debug)]
pub struct SimulatedBackend {
    model: CostModel,
    speedup: f64,
    layers: u32,
}

impl SimulatedBackend {
    /// A simulator running `speedup` times faster than the modelled GPU
    /// (values ≤ 0 or not finite mean no sleeping at all).
    pub fn new(model: CostModel, speedup: f64) -> Self {
        SimulatedBackend {
            model,
            speedup,
            layers: 32,
        }
    }

    /// The layers a copy overlaps with compute over (default 32; at least 1).
    pub fn with_layers(mut self, layers: u32) -> Self {
        self.layers = layers.max(1);
        self
    }

    /// The cost model.
    pub fn model(&self) -> &CostModel {
        &self.model
    }
}

impl ModelBackend for SimulatedBackend {
    fn step(&self, _device: DeviceId, batch: &Batch) -> Result<StepOutput, BackendError> {
        let compute = self.model.cost(batch);
        let copy = batch.copy_time;
        let t = compute.max(copy) + compute.min(copy) / self.layers;
        // A speedup that is not a positive number, or one so small that
        // the wait cannot be represented, waits nothing (`radixkv serve`
        // refuses such values at its edge).
        if self.speedup.is_finite() && self.speedup > 0.0 {
            if let Ok(wait) = Duration::try_from_secs_f64(t.as_secs_f64() / self.speedup) {
                std::thread::sleep(wait);
            }
        }
        Ok(t.into())
    }

    fn prefill_estimate(&self, new_tokens: usize, context_tokens: usize) -> Option<Duration> {
        Some(self.model.prefill_cost(new_tokens, context_tokens))
    }

    fn describe(&self) -> String {
        format!("simulated GPU (cost model, {}× real time)", self.speedup)
    }
}
