//! Per-device scheduling, SGLang 0.5.9-compatible: the waiting queue's
//! order ([`policy`]) and the scheduler loop that admits, batches, runs and
//! caches requests ([`scheduler`]), and the model interface it drives
//! ([`batch`]).

pub mod batch;
pub mod policy;
pub mod scheduler;
pub mod scratch;
