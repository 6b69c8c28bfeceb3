//! Per-device scheduling, SGLang 0.5.9-compatible: the waiting queue's
//! order ([`policy`]) and the scheduler loop that admits, batches, runs and
//! caches requests ([`scheduler`]), the model interface it drives
//! ([`batch`]), and how a model picks each next token ([`sampling`]).
//!
//! | file | what it holds |
//! | --- | --- |
//! | `policy.rs` | the waiting queue's order: fcfs, lpm, dfs-weight, lof, random |
//! | `scheduler/` | the scheduler thread: admission, the step, its state, its interface to the engine |
//! | `batch.rs` | what a model backend is given and returns ([`batch::ModelBackend`]) |
//! | `sampling.rs` | a request's sampling: temperature, top-p, seed |
//! | `scratch.rs` | the in-batch prefix tree of the requests picked this round |

pub mod batch;
pub mod policy;
pub mod sampling;
pub mod scheduler;
pub mod scratch;
