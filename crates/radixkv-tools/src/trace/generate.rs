//! The built-in request generators.
//!
//! | generator | shape |
//! | --- | --- |
//! | [`gsp`] | SGLang's generated-shared-prefix: G groups × P prompts, each a group's S-token system prompt + a Q-token question, O output tokens; all arrive at once, shuffled |
//! | [`chat`] | multi-turn chat: each turn's prompt is the whole conversation so far (its own system prompt, earlier user turns and replies) + a new user message |
//! | [`tree_of_thought`] | branching reasoning: each problem's prompt grows a tree of thoughts, `branching` children per node down to `depth`; each request is a root-to-node path |
//!
//! Token ids of generated prompts are below 2³¹; engines generate output
//! ids at or above it, so outputs never match prompts by accident. All
//! draw from [`SplitMix64`] seeded by the caller: the same seed gives the
//! same requests.

use super::{BlockTrie, Prompt, Trace, TraceRequest};
use radixkv_engine::rng::SplitMix64;
use std::sync::Arc;

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
) -> Trace {
    let mut rng = SplitMix64::new(seed);
    let mut requests = Vec::with_capacity(groups * prompts);
    for _ in 0..groups {
        let sys = rng.tokens(system);
        for _ in 0..prompts {
            let mut t = sys.clone();
            t.extend(rng.tokens(question));
            requests.push(TraceRequest {
                arrival_ms: 0.0,
                prompt: Prompt::Tokens(t.into()),
                output_len: output.max(1),
                output_tokens: None,
            });
        }
    }
    rng.shuffle(&mut requests);
    Trace {
        name: format!("gsp-{groups}x{prompts}-{system}+{question}->{output}"),
        requests,
        blocks: BlockTrie::default(),
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
pub fn chat(shape: &ChatShape, seed: u64) -> Trace {
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
            requests.push(TraceRequest {
                arrival_ms: start + k as f64 * c.think_ms,
                prompt: Prompt::Tokens(history.clone().into()),
                output_len: reply.len(),
                output_tokens: Some(Arc::clone(&reply)),
            });
            history.extend_from_slice(&reply);
        }
    }
    requests.sort_by(|a, b| a.arrival_ms.total_cmp(&b.arrival_ms));
    Trace {
        name: format!("chat-{}x{}", c.conversations, c.turns),
        requests,
        blocks: BlockTrie::default(),
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
pub fn tree_of_thought(shape: &TreeShape, seed: u64) -> Trace {
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
                    requests.push(TraceRequest {
                        arrival_ms: t0 + l as f64 * t.level_ms,
                        prompt: Prompt::Tokens(toks.clone().into()),
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
    Trace {
        name: format!("tot-{}x{}^{}", t.problems, t.branching, t.depth),
        requests,
        blocks: BlockTrie::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(r: &TraceRequest) -> &[u32] {
        match &r.prompt {
            Prompt::Tokens(t) => t,
            Prompt::Blocks { .. } => panic!("generators make literal prompts"),
        }
    }

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
        let w = Trace {
            name: "t".into(),
            blocks: BlockTrie::default(),
            requests: [a, b]
                .into_iter()
                .map(|t| TraceRequest {
                    arrival_ms: 0.0,
                    prompt: Prompt::Tokens(t.into()),
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
        let mut by_len: Vec<&TraceRequest> = w.requests.iter().collect();
        by_len.sort_by_key(|r| toks(r).len());
        let long = by_len.last().unwrap();
        assert_eq!(toks(long).len(), 32 + 4 * 16 + 3 * 16);
        let shorter = w
            .requests
            .iter()
            .find(|r| toks(r).len() == 32 + 3 * 16 + 2 * 16 && toks(long).starts_with(toks(r)))
            .unwrap();
        let reply = shorter.output_tokens.as_ref().unwrap();
        assert_eq!(&toks(long)[toks(shorter).len()..][..16], &reply[..]);
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
            let parent_len = toks(r).len() - 32;
            if parent_len > 64 {
                assert!(w
                    .requests
                    .iter()
                    .any(|p| toks(p).len() == parent_len && toks(r).starts_with(toks(p))));
            }
        }
        assert!(w.infinite_cache_hit_rate(16) > 0.5);
    }
}
