//! What a scheduler hands to the model: one forward pass's work, and the
//! [`ModelBackend`] trait that runs it. The engine provides backends (the
//! default simulator: [`crate::simulator::SimulatedBackend`]).

use super::sampling::Sampling;
use radixkv::cache::SlotRun;
use radixkv::device::{DeviceId, Tier};
use std::time::Duration;

/// The token ids and KV slots of one request's work, filled in only for
/// backends that ask for them ([`ModelBackend::wants_data`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WorkData {
    /// Every token of the request's context up to and including the ones
    /// this pass computes: `tokens[p]` is the token at position `p`. The
    /// computed ones are the last `new_tokens` of a prefill, the last one
    /// of a decode step; the earlier ones are only read (their K/V is in
    /// the cache: the matched prefix and earlier chunks and steps).
    pub tokens: Vec<u32>,
    /// The KV slot of every position (same length as `tokens`): `slots[p]`
    /// holds the K/V of token `p`; the computed positions' slots are
    /// written by this pass, the others read.
    pub slots: Vec<u32>,
    /// How the request's next token is picked (greedy by default).
    pub sampling: Sampling,
}

/// One request's share of a prefill (extend) pass.
#[derive(Clone, Debug, PartialEq)]
pub struct PrefillWork {
    /// The request.
    pub request: u64,
    /// Tokens computed in this pass.
    pub new_tokens: usize,
    /// Tokens before them whose KV is read, not computed (the cached
    /// prefix, plus earlier chunks).
    pub context_tokens: usize,
    /// Whether this pass completes the prompt (and so samples the first
    /// output token); false for a chunk that is not the last.
    pub samples: bool,
    /// Tokens and slots, for backends that want them.
    pub data: Option<WorkData>,
}

/// One request's share of a decode pass (one new token each).
#[derive(Clone, Debug, PartialEq)]
pub struct DecodeWork {
    /// The request.
    pub request: u64,
    /// Tokens in its context, the new one included.
    pub context_tokens: usize,
    /// Tokens and slots, for backends that want them.
    pub data: Option<WorkData>,
}

/// One forward pass on one device: either prefill or decode work.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Batch {
    /// Requests extended by this pass.
    pub prefill: Vec<PrefillWork>,
    /// Requests decoding one token in this pass.
    pub decode: Vec<DecodeWork>,
    /// Model time of the KV copies (loads from the host tier, copies from
    /// other devices) that this pass's requests wait for; a cost model
    /// overlaps them with the pass (see `crate::tiers`). Zero without.
    pub copy_time: Duration,
}

impl Batch {
    /// Whether the pass has no work.
    pub fn is_empty(&self) -> bool {
        self.prefill.is_empty() && self.decode.is_empty()
    }
}

/// An error of a backend (a real model's failure; the simulator has none).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("model backend failed on {device:?}: {reason}")]
pub struct BackendError {
    /// The device (for a copy, its device end: the destination when both
    /// ends are devices, since that is the scheduler that asked).
    pub device: DeviceId,
    /// What went wrong.
    pub reason: String,
}

impl BackendError {
    /// The error of a copy from `from` to `to`.
    pub fn of_copy(from: Tier, to: Tier, reason: String) -> BackendError {
        BackendError {
            device: to.device().or(from.device()).unwrap_or_default(),
            reason,
        }
    }
}

/// What a pass produced.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StepOutput {
    /// Model time of the pass (simulated time for the simulator, wall time
    /// for a real model).
    pub time: Duration,
    /// The sampled next token of each request that samples in this pass
    /// (`(request, token)`); a request missing here gets the scheduler's
    /// own token (the workload's, or a synthetic id). A workload that fixes
    /// its outputs wins over the model's (teacher forcing).
    pub next_tokens: Vec<(u64, u32)>,
}

impl From<Duration> for StepOutput {
    fn from(time: Duration) -> Self {
        StepOutput {
            time,
            next_tokens: Vec::new(),
        }
    }
}

/// Checks of reused KV against recomputation, counted by a backend that
/// verifies (see [`ModelBackend::verification`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Verification {
    /// Requests (or passes) checked.
    pub verified: u64,
    /// Checks that failed.
    pub mismatches: u64,
}

/// Runs forward passes. Implementations must be callable from one thread
/// per device at once.
pub trait ModelBackend: Send + Sync {
    /// Runs one pass on `device`.
    fn step(&self, device: DeviceId, batch: &Batch) -> Result<StepOutput, BackendError>;

    /// Whether the scheduler must fill in [`WorkData`] (token ids and KV
    /// slots); a cost model does not need them (default false).
    fn wants_data(&self) -> bool {
        false
    }

    /// A request left its device (finished, retracted, cancelled or
    /// failed): per-request state can go (default: nothing to do).
    fn release(&self, _device: DeviceId, _request: u64) {}

    /// Verification counters, for a backend that checks reused KV against
    /// recomputation (default `None`).
    fn verification(&self) -> Option<Verification> {
        None
    }

    /// Moves the KV of `runs` from tier `from` to tier `to` (devices by
    /// their ids in the engine, or the host tier shared by them all),
    /// before the copy is completed in the cache. A cost model has no KV to move
    /// (default: nothing to do); a backend that holds KV
    /// ([`wants_data`](Self::wants_data)) must move it, and by default it
    /// refuses, so that no copy ever completes without its data. Empty
    /// `runs` ask whether the backend can copy at all (a scheduler whose
    /// backend cannot makes no copies and no host writes).
    fn copy(&self, from: Tier, to: Tier, runs: &[SlotRun]) -> Result<(), BackendError> {
        let _ = runs;
        if self.wants_data() {
            return Err(BackendError::of_copy(
                from,
                to,
                "this backend cannot copy KV between tiers".into(),
            ));
        }
        Ok(())
    }

    /// The model time of computing `new_tokens` after `context_tokens`
    /// of one request, for the copy-or-recompute decision (default `None`:
    /// unknown, and a copy is made whenever it passes the load-back
    /// threshold).
    fn prefill_estimate(&self, new_tokens: usize, context_tokens: usize) -> Option<Duration> {
        let _ = (new_tokens, context_tokens);
        None
    }

    /// A short description for reports.
    fn describe(&self) -> String;
}
