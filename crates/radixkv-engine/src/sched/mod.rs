//! Per-device scheduling, SGLang 0.5.9-compatible: the waiting queue's
//! order ([`policy`]) and the scheduler loop that admits, batches, runs and
//! caches requests ([`scheduler`]), the model interface it drives
//! ([`batch`]), and how a model picks each next token ([`sampling`]).

pub mod batch;
pub mod policy;
pub mod sampling;
pub mod scheduler;
pub mod scratch;
