//! Request workloads for the engine's replay: built-in generators and the
//! infinite-cache hit rate a workload allows.
//!
//! | generator | shape |
//! | --- | --- |
//! | [`gsp`] | SGLang's generated-shared-prefix: G groups × P prompts, each a group's S-token system prompt + a Q-token question, O output tokens; all arrive at once, shuffled |
//! | [`chat`] | multi-turn chat: each turn's prompt is the whole conversation so far (system prompt, earlier user turns and replies) + a new user message |
//! | [`tree_of_thought`] | branching reasoning: each problem's prompt grows a tree of thoughts, `branching` children per node down to `depth`; each request is a root-to-node path |
//!
//! Token ids of generated prompts are below 2³¹; engines generate output
//! ids at or above it, so outputs never match prompts by accident.
//!
//! ```
//! use radixkv::workload::gsp;
//! let w = gsp(4, 3, 64, 8, 16, 42);
//! assert_eq!(w.requests.len(), 12);
//! // 3 prompts per group: the last 2 reuse the group's 64-token system prompt.
//! let expected = (4.0 * 2.0 * 64.0) / (12.0 * 72.0);
//! assert!((w.infinite_cache_hit_rate(16) - expected).abs() < 1e-9);
//! ```

use crate::cache::{RadixCache, TokenKey};
use crate::device::DeviceId;
use crate::rng::SplitMix64;
use std::sync::Arc;

/// One request of a workload.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkloadRequest {
    /// Arrival time in milliseconds of model time from the start.
    pub arrival_ms: f64,
    /// Prompt tokens.
    pub tokens: Arc<[u32]>,
    /// Output tokens to generate.
    pub output_len: usize,
    /// The output's token ids, when the workload fixes them (a later turn
    /// quotes them).
    pub output_tokens: Option<Arc<[u32]>>,
}

/// A named list of requests in arrival order.
#[derive(Clone, Debug, PartialEq)]
pub struct Workload {
    /// For reports.
    pub name: String,
    /// Requests, sorted by arrival.
    pub requests: Vec<WorkloadRequest>,
}

impl Workload {
    /// Prompt tokens over all requests.
    pub fn prompt_tokens(&self) -> usize {
        self.requests.iter().map(|r| r.tokens.len()).sum()
    }

    /// The token hit rate of a cache that never evicts and sees every
    /// request finish before the next one arrives: each request reuses the
    /// longest whole-page prefix (never its last token) of the earlier
    /// requests' prompts and outputs (outputs count only where the
    /// workload fixes their ids), cached in whole pages.
    pub fn infinite_cache_hit_rate(&self, page_size: usize) -> f64 {
        let Ok(cache) = RadixCache::builder().page_size(page_size.max(1)).build() else {
            return 0.0;
        };
        let (mut hit, mut total) = (0usize, 0usize);
        for r in &self.requests {
            let n = r.tokens.len();
            total += n;
            let probe = &r.tokens[..n.saturating_sub(1)];
            hit += cache
                .match_prefix(TokenKey::new(probe), DeviceId(0))
                .map_or(0, |m| m.len);
            let mut all = r.tokens.to_vec();
            if let Some(o) = &r.output_tokens {
                all.extend_from_slice(o);
            }
            // Whole pages only, as a request caches them.
            all.truncate(all.len() / page_size.max(1) * page_size.max(1));
            let values = vec![0u32; all.len()];
            let _ = cache.insert(TokenKey::new(&all), DeviceId(0), &values, 0);
        }
        if total == 0 {
            0.0
        } else {
            hit as f64 / total as f64
        }
    }

    /// The largest prompt + output of any request, in tokens.
    pub fn max_request_tokens(&self) -> usize {
        self.requests
            .iter()
            .map(|r| r.tokens.len() + r.output_len)
            .max()
            .unwrap_or(0)
    }
}

/// Why a trace cannot be replayed.
#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    /// The trace could not be read.
    #[error(transparent)]
    Trace(#[from] crate::hitrate::HitrateError),
    /// Expanding the trace would take too much memory.
    #[error(
        "the first {requests} requests of the trace hold {tokens} prompt tokens, more than the \
         {limit} a replay expands in memory: replay fewer with --max-requests"
    )]
    TooLarge {
        /// Requests asked for.
        requests: usize,
        /// Their prompt tokens.
        tokens: u64,
        /// The limit.
        limit: u64,
    },
}

/// Prompt tokens a replay expands in memory at most (4 bytes each).
pub const MAX_TRACE_TOKENS: u64 = 500_000_000;

/// The first `max_requests` requests of a trace file (Mooncake or agentic
/// JSONL, plain or zstd; see [`crate::hitrate::read_trace`]), expanded to
/// tokens, with the output lengths the trace records (`default_output`
/// where it records none). `seed` places the agentic conversations' starts.
pub fn from_trace_file(
    path: &std::path::Path,
    seed: u64,
    default_output: usize,
    max_requests: Option<usize>,
) -> Result<Workload, WorkloadError> {
    let t = crate::hitrate::read_trace(path, seed, crate::hitrate::AGENTIC_MEAN_GAP_S)?;
    from_trace(&t, default_output, max_requests)
}

/// A [`Trace`](crate::hitrate::Trace)'s first `max_requests` requests as a
/// workload (arrival times and recorded output lengths kept; requests with
/// an empty prompt dropped).
pub fn from_trace(
    t: &crate::hitrate::Trace,
    default_output: usize,
    max_requests: Option<usize>,
) -> Result<Workload, WorkloadError> {
    let n = max_requests.unwrap_or(usize::MAX).min(t.requests.len());
    let tokens: u64 = (0..n).map(|i| t.input_len(i) as u64).sum();
    if tokens > MAX_TRACE_TOKENS {
        return Err(WorkloadError::TooLarge {
            requests: n,
            tokens,
            limit: MAX_TRACE_TOKENS,
        });
    }
    let requests = (0..n)
        .map(|i| WorkloadRequest {
            arrival_ms: t.requests[i].time,
            tokens: t.tokens(i).into(),
            output_len: match t.requests[i].output {
                0 => default_output.max(1),
                o => o as usize,
            },
            output_tokens: None,
        })
        .filter(|r| !r.tokens.is_empty())
        .collect();
    Ok(Workload {
        name: t.name.clone(),
        requests,
    })
}

/// Prompt tokens from the seeded generator.
trait PromptTokens {
    /// A prompt token (below 2³¹).
    fn token(&mut self) -> u32;
    /// `n` prompt tokens.
    fn tokens(&mut self, n: usize) -> Vec<u32> {
        (0..n).map(|_| self.token()).collect()
    }
}

impl PromptTokens for SplitMix64 {
    fn token(&mut self) -> u32 {
        (self.next_u64() >> 33) as u32
    }
}

/// SGLang's generated-shared-prefix workload (`bench_serving
/// --dataset-name generated-shared-prefix`): `groups` system prompts of
/// `system` random tokens, `prompts` questions of `question` tokens per
/// group, `output` output tokens each; all requests arrive at time 0 in a
/// seeded random order. SGLang's defaults: 64, 16, 2048, 128, 256.
pub fn gsp(
    groups: usize,
    prompts: usize,
    system: usize,
    question: usize,
    output: usize,
    seed: u64,
) -> Workload {
    let mut rng = SplitMix64::new(seed);
    let mut requests = Vec::with_capacity(groups * prompts);
    for _ in 0..groups {
        let sys = rng.tokens(system);
        for _ in 0..prompts {
            let mut t = sys.clone();
            t.extend(rng.tokens(question));
            requests.push(WorkloadRequest {
                arrival_ms: 0.0,
                tokens: t.into(),
                output_len: output.max(1),
                output_tokens: None,
            });
        }
    }
    rng.shuffle(&mut requests);
    Workload {
        name: format!("gsp-{groups}x{prompts}-{system}+{question}->{output}"),
        requests,
    }
}

/// The multi-turn chat generator's shape ([`chat`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ChatShape {
    /// Conversations (default 64).
    pub conversations: usize,
    /// Turns per conversation (default 8).
    pub turns: usize,
    /// System prompt tokens, one per conversation (default 1,024).
    pub system: usize,
    /// Tokens of each user message (default 128).
    pub user: usize,
    /// Tokens of each reply (default 256).
    pub assistant: usize,
    /// Mean gap between conversation starts, ms (Poisson; default 500).
    pub gap_ms: f64,
    /// Time between a conversation's turns, ms (default 20,000).
    pub think_ms: f64,
}

impl Default for ChatShape {
    fn default() -> Self {
        ChatShape {
            conversations: 64,
            turns: 8,
            system: 1024,
            user: 128,
            assistant: 256,
            gap_ms: 500.0,
            think_ms: 20_000.0,
        }
    }
}

/// Multi-turn chat: turn k's prompt is the conversation's system prompt,
/// every earlier user message and reply (fixed by the workload so the next
/// turn can quote them) and the new user message. Conversations start as a
/// Poisson process; turns follow each other `think_ms` apart (the workload
/// does not know when the previous reply ends: a turn may arrive before
/// its predecessor finished, as in real traffic).
pub fn chat(shape: &ChatShape, seed: u64) -> Workload {
    let c = shape;
    let mut rng = SplitMix64::new(seed ^ 0xC4A7);
    let mut requests = Vec::new();
    let mut start = 0.0;
    for _ in 0..c.conversations {
        start += rng.exp(c.gap_ms);
        let mut history = rng.tokens(c.system);
        for k in 0..c.turns {
            history.extend(rng.tokens(c.user));
            let reply: Arc<[u32]> = rng.tokens(c.assistant.max(1)).into();
            requests.push(WorkloadRequest {
                arrival_ms: start + k as f64 * c.think_ms,
                tokens: history.clone().into(),
                output_len: reply.len(),
                output_tokens: Some(Arc::clone(&reply)),
            });
            history.extend_from_slice(&reply);
        }
    }
    requests.sort_by(|a, b| a.arrival_ms.total_cmp(&b.arrival_ms));
    Workload {
        name: format!("chat-{}x{}", c.conversations, c.turns),
        requests,
    }
}

/// The tree-of-thought generator's shape ([`tree_of_thought`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TreeShape {
    /// Problems, one tree each (default 32).
    pub problems: usize,
    /// Question tokens at each tree's root (default 1,024).
    pub question: usize,
    /// Children per thought (default 3).
    pub branching: usize,
    /// Levels of thoughts below the question (default 3).
    pub depth: usize,
    /// Tokens per thought (default 128).
    pub step: usize,
    /// Output tokens per request (default 256).
    pub output: usize,
    /// Time between problem starts, ms (default 2,000).
    pub gap_ms: f64,
    /// Time between a tree's levels, ms (default 5,000).
    pub level_ms: f64,
}

impl Default for TreeShape {
    fn default() -> Self {
        TreeShape {
            problems: 32,
            question: 1024,
            branching: 3,
            depth: 3,
            step: 128,
            output: 256,
            gap_ms: 2_000.0,
            level_ms: 5_000.0,
        }
    }
}

/// Tree-of-thought reasoning: per problem, the question grows a tree of
/// thoughts, `branching` children per node down to `depth`; one request
/// per node below the root (its prompt is the path from the question down
/// to it), issued level by level.
pub fn tree_of_thought(shape: &TreeShape, seed: u64) -> Workload {
    let t = shape;
    let mut rng = SplitMix64::new(seed ^ 0x7077);
    let mut requests = Vec::new();
    for p in 0..t.problems {
        let t0 = p as f64 * t.gap_ms;
        let mut level: Vec<Vec<u32>> = vec![rng.tokens(t.question)];
        for l in 0..t.depth {
            let mut next = Vec::new();
            for parent in &level {
                for _ in 0..t.branching {
                    let mut toks = parent.clone();
                    toks.extend(rng.tokens(t.step));
                    requests.push(WorkloadRequest {
                        arrival_ms: t0 + l as f64 * t.level_ms,
                        tokens: toks.clone().into(),
                        output_len: t.output.max(1),
                        output_tokens: None,
                    });
                    next.push(toks);
                }
            }
            level = next;
        }
    }
    requests.sort_by(|a, b| a.arrival_ms.total_cmp(&b.arrival_ms));
    Workload {
        name: format!("tot-{}x{}^{}", t.problems, t.branching, t.depth),
        requests,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gsp_defaults_allow_88_percent() {
        let w = gsp(64, 16, 2048, 128, 256, 42);
        assert_eq!(w.requests.len(), 1024);
        let r = w.infinite_cache_hit_rate(16);
        assert!((r - 0.882).abs() < 0.001, "{r}");
        // Shuffled, but the same for the same seed.
        assert_eq!(w, gsp(64, 16, 2048, 128, 256, 42));
        assert_ne!(w.requests[0], gsp(64, 16, 2048, 128, 256, 43).requests[0]);
    }

    #[test]
    fn unaligned_prompts_count_their_whole_pages() {
        // Two 20-token prompts sharing 18 tokens: one whole page of 16 hits.
        let a: Vec<u32> = (0..20).collect();
        let mut b: Vec<u32> = (0..18).collect();
        b.extend([98, 99]);
        let w = Workload {
            name: "t".into(),
            requests: [a, b]
                .into_iter()
                .map(|t| WorkloadRequest {
                    arrival_ms: 0.0,
                    tokens: t.into(),
                    output_len: 1,
                    output_tokens: None,
                })
                .collect(),
        };
        assert!((w.infinite_cache_hit_rate(16) - 16.0 / 40.0).abs() < 1e-12);
        assert!((w.infinite_cache_hit_rate(1) - 18.0 / 40.0).abs() < 1e-12);
    }

    #[test]
    fn chat_turns_quote_the_history() {
        let shape = ChatShape {
            conversations: 3,
            turns: 4,
            system: 32,
            user: 16,
            assistant: 16,
            gap_ms: 100.0,
            think_ms: 1000.0,
        };
        let w = chat(&shape, 1);
        assert_eq!(w.requests.len(), 12);
        // Turn k of a conversation starts with turn k-1's prompt and reply.
        let mut by_len: Vec<&WorkloadRequest> = w.requests.iter().collect();
        by_len.sort_by_key(|r| r.tokens.len());
        let long = by_len.last().unwrap();
        assert_eq!(long.tokens.len(), 32 + 4 * 16 + 3 * 16);
        let shorter = w
            .requests
            .iter()
            .find(|r| r.tokens.len() == 32 + 3 * 16 + 2 * 16 && long.tokens.starts_with(&r.tokens))
            .unwrap();
        let reply = shorter.output_tokens.as_ref().unwrap();
        assert_eq!(&long.tokens[shorter.tokens.len()..][..16], &reply[..]);
        // Page-aligned reuse: the later turns hit most of their prompt.
        assert!(w.infinite_cache_hit_rate(16) > 0.5);
    }

    #[test]
    fn tree_of_thought_paths_share_their_ancestors() {
        let shape = TreeShape {
            problems: 2,
            question: 64,
            branching: 2,
            depth: 3,
            step: 32,
            output: 8,
            gap_ms: 1000.0,
            level_ms: 100.0,
        };
        let w = tree_of_thought(&shape, 5);
        assert_eq!(w.requests.len(), 2 * (2 + 4 + 8));
        for r in &w.requests {
            let parent_len = r.tokens.len() - 32;
            if parent_len > 64 {
                assert!(w
                    .requests
                    .iter()
                    .any(|p| p.tokens.len() == parent_len && r.tokens.starts_with(&p.tokens)));
            }
        }
        assert!(w.infinite_cache_hit_rate(16) > 0.5);
    }
}
