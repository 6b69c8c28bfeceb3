//! Request traces: one type for every workload radixkv replays, whether a
//! built-in generator made it or a file was read.
//!
//! * [`Trace`]: requests in arrival order, each a [`Prompt`] (literal
//!   tokens, or a path in the trace's [`BlockTrie`] expanded on demand: the
//!   agentic trace is billions of tokens), an output length, and the
//!   output's tokens where the workload fixes them.
//! * Readers ([`read`]): Mooncake JSONL and agentic conversations, plain
//!   or zstd-compressed; [`read_trace`] tells them apart by the first line.
//! * Generators ([`generate`]): SGLang's generated-shared-prefix
//!   ([`gsp`]), multi-turn [`chat`], [`tree_of_thought`].
//!
//! Both `radixkv replay` (the engine) and `radixkv hitrate` (the
//! single-device policy sweep) take their requests from here.
//!
//! ```
//! use radixkv_tools::trace::gsp;
//! let w = gsp(4, 3, 64, 8, 16, 42);
//! assert_eq!(w.requests.len(), 12);
//! // 3 prompts per group: the last 2 reuse the group's 64-token system prompt.
//! let expected = (4.0 * 2.0 * 64.0) / (12.0 * 72.0);
//! assert!((w.infinite_cache_hit_rate(16) - expected).abs() < 1e-9);
//! ```

pub mod generate;
pub mod read;

pub use generate::{chat, gsp, tree_of_thought, ChatShape, TreeShape};
pub use read::{
    read_agentic, read_agentic_with_gap, read_mooncake, read_trace, AGENTIC_MEAN_GAP_S,
};

use radixkv::{DeviceId, RadixCache, TokenKey};
use std::collections::HashMap;
use std::sync::Arc;

/// Why a trace cannot be read or used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TraceError {
    /// The trace could not be read.
    #[error("cannot read {path}: {why}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        why: String,
    },
    /// A trace line is not a request.
    #[error("{path}:{line}: {why}")]
    Parse {
        /// The file.
        path: String,
        /// 1-based line number.
        line: usize,
        /// Why.
        why: String,
    },
    /// Settings or contents that cannot work.
    #[error("{0}")]
    Invalid(String),
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

/// The input tokens of one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Prompt {
    /// Literal token ids.
    Tokens(Arc<[u32]>),
    /// `blocks` whole blocks, the root path of the trace's [`BlockTrie`]
    /// that ends at block `last` (block `b` holds tokens `b·B .. b·B + B`,
    /// `B` the trie's block size), then `tail` tokens
    /// `tail_start .. tail_start + tail` that no other request has.
    Blocks {
        /// The last whole block; `None` when `blocks` is 0.
        last: Option<u32>,
        /// Number of whole blocks (the depth of `last`).
        blocks: u32,
        /// The first tail token id.
        tail_start: u32,
        /// Tail tokens past the last whole block.
        tail: u32,
    },
}

/// One request of a trace.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceRequest {
    /// Arrival time in milliseconds (model time) from the start.
    pub arrival_ms: f64,
    /// Input tokens.
    pub prompt: Prompt,
    /// Output tokens to generate; 0 where a trace file records none (see
    /// [`Trace::for_replay`]).
    pub output_len: usize,
    /// The output's token ids, when the workload fixes them (a later turn
    /// quotes them).
    pub output_tokens: Option<Arc<[u32]>>,
}

impl TraceRequest {
    /// A request of literal tokens.
    pub fn new(arrival_ms: f64, tokens: impl Into<Arc<[u32]>>, output_len: usize) -> Self {
        TraceRequest {
            arrival_ms,
            prompt: Prompt::Tokens(tokens.into()),
            output_len,
            output_tokens: None,
        }
    }
}

/// Blocks shared between requests, as a trie: every block has one parent
/// (the block before it in every request that holds it), so a block
/// identifies the whole prefix that ends with it and a request's whole
/// blocks are the root path to its last one. Block `b` stands for tokens
/// `b·B + j`, `j < B`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BlockTrie {
    pub(crate) block_size: usize,
    pub(crate) parent: Vec<u32>,
}

/// No parent (a root-level block), or no value.
pub(crate) const NONE: u32 = u32::MAX;

impl BlockTrie {
    /// Tokens per block (0 for a trace without blocks).
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Number of blocks.
    pub fn len(&self) -> usize {
        self.parent.len()
    }

    /// Whether there are no blocks.
    pub fn is_empty(&self) -> bool {
        self.parent.is_empty()
    }

    /// The block before `block`; `None` at the root or for an unknown block.
    pub fn parent(&self, block: u32) -> Option<u32> {
        self.parent
            .get(block as usize)
            .copied()
            .filter(|&p| p != NONE)
    }

    /// Adds a block under `parent`. Errors when its tokens would no longer
    /// fit 32-bit ids.
    pub(crate) fn push(&mut self, parent: Option<u32>) -> Result<u32, TraceError> {
        let id = self.parent.len();
        if (id + 1) * self.block_size > 1 << 32 {
            return Err(TraceError::Invalid(format!(
                "more than 2^32 distinct block tokens (block size {})",
                self.block_size
            )));
        }
        self.parent.push(parent.unwrap_or(NONE));
        Ok(id as u32)
    }

    /// The root path ending at `last`, `blocks` long (shorter if the trie
    /// has fewer ancestors), into `out`, root first.
    pub(crate) fn path_into(&self, last: Option<u32>, blocks: u32, out: &mut Vec<u32>) {
        out.clear();
        let mut at = last;
        while let Some(b) = at {
            if out.len() == blocks as usize {
                break;
            }
            out.push(b);
            at = self.parent(b);
        }
        out.reverse();
    }
}

/// A named sequence of requests in arrival order.
#[derive(Clone, Debug, PartialEq)]
pub struct Trace {
    /// Name for the report.
    pub name: String,
    /// Requests, sorted by arrival.
    pub requests: Vec<TraceRequest>,
    /// The blocks that [`Prompt::Blocks`] requests name (empty otherwise).
    pub blocks: BlockTrie,
}

/// Prompt tokens a replay expands in memory at most (4 bytes each).
pub const MAX_TRACE_TOKENS: u64 = 500_000_000;

impl Trace {
    /// A trace of literal-token requests `(time in ms, tokens)` with no
    /// recorded output.
    pub fn from_tokens(name: impl Into<String>, requests: Vec<(f64, Vec<u32>)>) -> Trace {
        Trace {
            name: name.into(),
            requests: requests
                .into_iter()
                .map(|(time, t)| TraceRequest::new(time, t, 0))
                .collect(),
            blocks: BlockTrie::default(),
        }
    }

    /// The first `max_requests` requests, ready for the engine: requests
    /// with an empty prompt dropped, and `default_output` (at least 1)
    /// where the trace records no output length. Errors when their prompts
    /// hold more than [`MAX_TRACE_TOKENS`] tokens (the replay expands
    /// them in memory).
    pub fn for_replay(
        mut self,
        default_output: usize,
        max_requests: Option<usize>,
    ) -> Result<Trace, TraceError> {
        let n = max_requests.unwrap_or(usize::MAX).min(self.requests.len());
        let tokens: u64 = (0..n).map(|i| self.input_len(i) as u64).sum();
        if tokens > MAX_TRACE_TOKENS {
            return Err(TraceError::TooLarge {
                requests: n,
                tokens,
                limit: MAX_TRACE_TOKENS,
            });
        }
        self.requests.truncate(n);
        let mut requests = Vec::with_capacity(n);
        for (i, r) in self.requests.iter().enumerate() {
            if self.input_len(i) == 0 {
                continue;
            }
            let mut r = r.clone();
            if r.output_len == 0 {
                r.output_len = default_output.max(1);
            }
            requests.push(r);
        }
        self.requests = requests;
        Ok(self)
    }

    /// Input length of request `i` in tokens (0 past the end).
    pub fn input_len(&self, i: usize) -> usize {
        match self.requests.get(i).map(|r| &r.prompt) {
            None => 0,
            Some(Prompt::Tokens(t)) => t.len(),
            Some(Prompt::Blocks { blocks, tail, .. }) => {
                *blocks as usize * self.blocks.block_size + *tail as usize
            }
        }
    }

    /// Input tokens of all requests together.
    pub fn input_tokens(&self) -> u64 {
        (0..self.requests.len())
            .map(|i| self.input_len(i) as u64)
            .sum()
    }

    /// The input tokens of request `i` into `out` (replacing its contents;
    /// empty past the end).
    pub fn tokens_into(&self, i: usize, out: &mut Vec<u32>) {
        out.clear();
        match self.requests.get(i).map(|r| &r.prompt) {
            None => {}
            Some(Prompt::Tokens(t)) => out.extend_from_slice(t),
            Some(&Prompt::Blocks {
                last,
                blocks,
                tail_start,
                tail,
            }) => {
                let b = self.blocks.block_size as u64;
                let mut path = Vec::new();
                self.blocks.path_into(last, blocks, &mut path);
                out.reserve(path.len() * b as usize + tail as usize);
                for &n in &path {
                    let base = u64::from(n) * b;
                    out.extend((base..base + b).map(|t| t as u32));
                }
                let end = u64::from(tail_start) + u64::from(tail);
                out.extend((u64::from(tail_start)..end).map(|t| t as u32));
            }
        }
    }

    /// The input tokens of request `i` (empty past the end); literal
    /// prompts are shared, not copied.
    pub fn tokens(&self, i: usize) -> Arc<[u32]> {
        if let Some(Prompt::Tokens(t)) = self.requests.get(i).map(|r| &r.prompt) {
            return Arc::clone(t);
        }
        let mut v = Vec::new();
        self.tokens_into(i, &mut v);
        v.into()
    }

    /// The largest prompt + output of any request, in tokens.
    pub fn max_request_tokens(&self) -> usize {
        (0..self.requests.len())
            .map(|i| self.input_len(i) + self.requests[i].output_len)
            .max()
            .unwrap_or(0)
    }

    /// Prompt and output tokens of all requests together.
    pub fn total_tokens(&self) -> usize {
        (0..self.requests.len())
            .map(|i| self.input_len(i) + self.requests[i].output_len)
            .sum()
    }

    /// Distinct tokens: the size of a cache that never evicts, counted as
    /// distinct prefix pages of `page_size` tokens times `page_size`.
    pub fn distinct_tokens(&self, page_size: usize) -> usize {
        if page_size == 0 {
            return 0;
        }
        let mut ids = PageIds::new(self, page_size);
        let mut seen = vec![0u64; ids.block_space.div_ceil(64)];
        let (mut unique, mut buf) = (0usize, Vec::new());
        for i in 0..self.requests.len() {
            ids.pages(i, &mut buf);
            for &p in &buf {
                if p == UNIQUE {
                    unique += 1;
                } else if p < ids.block_space {
                    seen[p / 64] |= 1 << (p % 64);
                }
            }
        }
        let blocks: usize = seen.iter().map(|w| w.count_ones() as usize).sum();
        (blocks + ids.literal.len() + unique) * page_size
    }

    /// The token hit rate of a cache that never evicts and sees every
    /// request finish before the next one arrives: each request reuses the
    /// longest whole-page prefix (never its last token) of the earlier
    /// requests' prompts and outputs (outputs count only where the
    /// workload fixes their ids), cached in whole pages.
    pub fn infinite_cache_hit_rate(&self, page_size: usize) -> f64 {
        let ps = page_size.max(1);
        let Ok(cache) = RadixCache::builder().page_size(ps).build() else {
            return 0.0;
        };
        let (mut hit, mut total) = (0usize, 0usize);
        let mut all = Vec::new();
        for (i, r) in self.requests.iter().enumerate() {
            self.tokens_into(i, &mut all);
            let n = all.len();
            total += n;
            let probe = &all[..n.saturating_sub(1)];
            hit += cache
                .match_prefix(TokenKey::new(probe), DeviceId(0))
                .map_or(0, |m| m.len);
            if let Some(o) = &r.output_tokens {
                all.extend_from_slice(o);
            }
            // Whole pages only, as a request caches them.
            all.truncate(all.len() / ps * ps);
            let values = vec![0u32; all.len()];
            let _ = cache.insert(TokenKey::new(&all), DeviceId(0), &values, 0);
        }
        if total == 0 {
            0.0
        } else {
            hit as f64 / total as f64
        }
    }
}

/// A page no other request has (it holds a request's own tail tokens).
pub(crate) const UNIQUE: usize = usize::MAX;

/// Dense ids of a trace's whole pages at one page size. Two pages get the
/// same id exactly when their prefixes (up to the page's end) are equal:
/// a page of [`Prompt::Blocks`] is named by its last token (a block token
/// identifies its whole prefix; a tail token is the request's own), a page
/// of [`Prompt::Tokens`] by a hash of its prefix. Ids under `block_space`
/// are block pages; literal pages follow.
pub(crate) struct PageIds<'a> {
    trace: &'a Trace,
    ps: usize,
    /// Block size (1 without blocks) and gcd(page size, block size): page
    /// ends inside a block fall on multiples of `g`.
    b: usize,
    g: usize,
    pub(crate) block_space: usize,
    pub(crate) literal: HashMap<u64, usize>,
    path: Vec<u32>,
}

impl<'a> PageIds<'a> {
    pub(crate) fn new(trace: &'a Trace, ps: usize) -> Self {
        let b = trace.blocks.block_size.max(1);
        let g = gcd(ps, b);
        PageIds {
            trace,
            ps,
            b,
            g,
            block_space: trace.blocks.len() * b / g,
            literal: HashMap::new(),
            path: Vec::new(),
        }
    }

    /// The whole pages of request `i`, first to last, into `out`.
    pub(crate) fn pages(&mut self, i: usize, out: &mut Vec<usize>) {
        out.clear();
        let trace = self.trace;
        let ps = self.ps;
        match trace.requests.get(i).map(|r| &r.prompt) {
            None => {}
            Some(Prompt::Tokens(tokens)) => {
                let mut h: u64 = 0xcbf2_9ce4_8422_2325;
                for (k, &t) in tokens.iter().enumerate() {
                    h = (h ^ u64::from(t))
                        .wrapping_mul(0x0100_0000_01b3)
                        .rotate_left(7);
                    if (k + 1) % ps == 0 {
                        let next = self.block_space + self.literal.len();
                        out.push(*self.literal.entry(h).or_insert(next));
                    }
                }
            }
            Some(&Prompt::Blocks {
                last, blocks, tail, ..
            }) => {
                trace.blocks.path_into(last, blocks, &mut self.path);
                let whole = self.path.len() * self.b;
                let len = blocks as usize * self.b + tail as usize;
                for e in (ps..=len).step_by(ps) {
                    if e <= whole {
                        let node = self.path[(e - 1) / self.b] as usize;
                        let off = (e - 1) % self.b;
                        out.push((node * self.b + off + 1) / self.g - 1);
                    } else {
                        out.push(UNIQUE);
                    }
                }
            }
        }
    }
}

fn gcd(mut a: usize, mut b: usize) -> usize {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a.max(1)
}
