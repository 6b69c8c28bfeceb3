//! One device's scheduler loop (SGLang 0.5.9's event loop, reduced to what
//! a prefix cache sees): order the waiting queue, admit prefills within
//! token budgets (chunking a long one), run prefill or decode passes on the
//! model backend, cache prompts after prefill and whole sequences at the
//! end, and retract decoding requests when the device runs out of pages.
//!
//! Each round:
//!
//! 1. take new requests from the inbox;
//! 2. order the waiting queue ([`QueueOrderer`](crate::sched::policy::QueueOrderer));
//! 3. admit requests in that order while the budgets hold
//!    (`max_prefill_tokens` new tokens per pass, one chunked request of at
//!    most `chunked_prefill_size` tokens, `max_running_requests`, and pages:
//!    the prompt's uncached pages are allocated — evicting as needed — and
//!    the running requests' future output, `remaining · new_token_ratio`
//!    tokens, must fit beside them, else the request waits);
//! 4. if anything was admitted, one prefill pass (prefill has priority, as
//!    in SGLang without mixed chunks); otherwise one decode pass over the
//!    running requests, allocating a page when a request crosses into a
//!    new one, and retracting requests (fewest output tokens first, then
//!    longest prompt) when even eviction cannot provide it;
//! 5. after a request's prefill its prompt is cached and pinned
//!    ([`Request::commit_chunk`](radixkv::cache::Request::commit_chunk), SGLang's `cache_unfinished_req`); after
//!    its last token, prompt and output are cached and the pin released
//!    ([`Request::finish`](radixkv::cache::Request::finish)).
//!
//! `new_token_ratio` starts at `init_new_token_ratio`, decays linearly to
//! `min_new_token_ratio` over `new_token_ratio_decay_steps` decode passes,
//! and is raised back by a retraction (SGLang's rule of thumb).

//!
//! | file | what it holds |
//! | --- | --- |
//! | `interface.rs` | what the engine and a scheduler exchange: its config, jobs, stream sinks and events, inbox messages, completions, the events it reports, its counters |
//! | `state.rs` | the [`Scheduler`], its requests' records, its thread's loop and inbox |
//! | `admit.rs` | admission: page budgets, eviction and host write-back, copies in, the in-flight wait |
//! | `step.rs` | prefill and decode passes, retraction, finishing and failing requests |

mod admit;
mod interface;
mod state;
mod step;

pub use interface::{
    CacheOp, Completion, Inbox, Job, RequestError, SchedulerConfig, SchedulerEvents,
    SchedulerStats, StreamEvent, StreamSink,
};
pub use state::Scheduler;
