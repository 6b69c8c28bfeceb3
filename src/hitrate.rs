//! Hit-rate evaluation (`radixkv hitrate`): replays a request trace through
//! a single-device cache that owns a pool of a given size, with each
//! request's real lifecycle (match and pin the cached prefix, allocate the
//! rest, evicting on shortage, insert at completion), and reports the share
//! of input tokens served from the cache, per policy and capacity, beside
//! an offline bound: Belady's MIN over the same pages.
//!
//! Traces (files are read streaming, zstd-compressed or plain, told apart
//! by the zstd magic bytes; [`read_trace`] tells the formats apart by the
//! first line):
//! * Mooncake JSONL ([`read_mooncake`]: `timestamp`, `input_length`,
//!   `hash_ids` of 512-token blocks), where block id `h` expands to tokens
//!   `h·512 + j`;
//! * agentic conversations ([`read_agentic`]: one conversation per line,
//!   blocks of 64 tokens with conversation-local ids, sub-agents nested),
//!   merged by starting the conversations as a Poisson process. Such a
//!   trace is billions of tokens, so its requests are kept as paths in a
//!   [`BlockTrie`] ([`Prompt::Blocks`]) and expanded one at a time;
//! * built-in generators: SGLang's generated-shared-prefix workload
//!   ([`gsp`]) and a multi-turn chat ([`chat`]).

use crate::{CacheError, DeviceId, EvictionPolicy, RadixCache, TokenKey};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader};
use std::ops::ControlFlow;
use std::path::Path;
use std::sync::Arc;

/// Errors of the evaluation.
#[derive(Debug, thiserror::Error)]
pub enum HitrateError {
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
    /// The cache could not be built or used.
    #[error(transparent)]
    Cache(#[from] CacheError),
    /// Settings that cannot work.
    #[error("{0}")]
    Invalid(String),
}

/// The input tokens of one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Prompt {
    /// Literal token ids.
    Tokens(Vec<u32>),
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

/// One request of a trace, in arrival order.
#[derive(Clone, Debug)]
pub struct TraceRequest {
    /// Arrival time in milliseconds.
    pub time: f64,
    /// Output tokens the trace records (0 when it does not say).
    pub output: u32,
    /// Input tokens.
    pub prompt: Prompt,
}

/// Blocks shared between requests, as a trie: every block has one parent
/// (the block before it in every request that holds it), so a block
/// identifies the whole prefix that ends with it and a request's whole
/// blocks are the root path to its last one. Block `b` stands for tokens
/// `b·B + j`, `j < B`.
#[derive(Clone, Debug, Default)]
pub struct BlockTrie {
    block_size: usize,
    parent: Vec<u32>,
}

/// No parent (a root-level block), or no value.
const NONE: u32 = u32::MAX;

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
    fn push(&mut self, parent: Option<u32>) -> Result<u32, HitrateError> {
        let id = self.parent.len();
        if (id + 1) * self.block_size > 1 << 32 {
            return Err(HitrateError::Invalid(format!(
                "more than 2^32 distinct block tokens (block size {})",
                self.block_size
            )));
        }
        self.parent.push(parent.unwrap_or(NONE));
        Ok(id as u32)
    }

    /// The root path ending at `last`, `blocks` long (shorter if the trie
    /// has fewer ancestors), into `out`, root first.
    fn path_into(&self, last: Option<u32>, blocks: u32, out: &mut Vec<u32>) {
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

/// A named sequence of requests.
#[derive(Clone, Debug)]
pub struct Trace {
    /// Name for the report.
    pub name: String,
    /// Requests in arrival order.
    pub requests: Vec<TraceRequest>,
    /// The blocks that [`Prompt::Blocks`] requests name (empty otherwise).
    pub blocks: BlockTrie,
}

impl Trace {
    /// A trace of literal-token requests `(time in ms, tokens)`.
    pub fn from_tokens(name: impl Into<String>, requests: Vec<(f64, Vec<u32>)>) -> Trace {
        Trace {
            name: name.into(),
            requests: requests
                .into_iter()
                .map(|(time, t)| TraceRequest {
                    time,
                    output: 0,
                    prompt: Prompt::Tokens(t),
                })
                .collect(),
            blocks: BlockTrie::default(),
        }
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

    /// The input tokens of request `i` (empty past the end).
    pub fn tokens(&self, i: usize) -> Vec<u32> {
        let mut v = Vec::new();
        self.tokens_into(i, &mut v);
        v
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
}

/// A page no other request has (it holds a request's own tail tokens).
const UNIQUE: usize = usize::MAX;

/// Dense ids of a trace's whole pages at one page size. Two pages get the
/// same id exactly when their prefixes (up to the page's end) are equal:
/// a page of [`Prompt::Blocks`] is named by its last token (a block token
/// identifies its whole prefix; a tail token is the request's own), a page
/// of [`Prompt::Tokens`] by a hash of its prefix. Ids under `block_space`
/// are block pages; literal pages follow.
struct PageIds<'a> {
    trace: &'a Trace,
    ps: usize,
    /// Block size (1 without blocks) and gcd(page size, block size): page
    /// ends inside a block fall on multiples of `g`.
    b: usize,
    g: usize,
    block_space: usize,
    literal: HashMap<u64, usize>,
    path: Vec<u32>,
}

impl<'a> PageIds<'a> {
    fn new(trace: &'a Trace, ps: usize) -> Self {
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
    fn pages(&mut self, i: usize, out: &mut Vec<usize>) {
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

/// A small seeded generator (SplitMix64), so that traces are reproducible
/// without a dependency.
struct SplitMix(u64);

impl SplitMix {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Exponential with mean `mean`.
    fn exp(&mut self, mean: f64) -> f64 {
        -mean * (1.0 - self.unit()).ln()
    }

    /// Uniform in `0..n` (`n > 0`).
    fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// Opens a trace file, decompressing it if it starts with the zstd magic
/// bytes.
fn open(path: &Path) -> Result<Box<dyn BufRead>, HitrateError> {
    let err = |why: String| HitrateError::Read {
        path: path.display().to_string(),
        why,
    };
    let file = std::fs::File::open(path).map_err(|e| err(e.to_string()))?;
    let mut file = BufReader::with_capacity(1 << 16, file);
    let head = file.fill_buf().map_err(|e| err(e.to_string()))?;
    if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        let dec = ruzstd::decoding::StreamingDecoder::new(file).map_err(|e| err(e.to_string()))?;
        Ok(Box::new(BufReader::with_capacity(1 << 16, dec)))
    } else {
        Ok(Box::new(file))
    }
}

/// The file name without its `.jsonl` / `.jsonl.zst` / `.zst` ending.
fn trace_name(path: &Path) -> String {
    path.file_name().map_or(path.display().to_string(), |n| {
        let n = n.to_string_lossy();
        let n = n.strip_suffix(".zst").unwrap_or(&n);
        n.strip_suffix(".jsonl").unwrap_or(n).to_string()
    })
}

/// Calls `f(line number, line)` for every non-blank line of `path`, with
/// one reused buffer (agentic lines are megabytes).
fn for_lines(
    path: &Path,
    mut f: impl FnMut(&str) -> Result<ControlFlow<()>, String>,
) -> Result<(), HitrateError> {
    let mut reader = open(path)?;
    let mut line = String::new();
    let mut no = 0;
    loop {
        line.clear();
        no += 1;
        let n = reader
            .read_line(&mut line)
            .map_err(|e| HitrateError::Parse {
                path: path.display().to_string(),
                line: no,
                why: format!("cannot read the line: {e}"),
            })?;
        if n == 0 {
            return Ok(());
        }
        if line.trim().is_empty() {
            continue;
        }
        // A bad line's reason becomes an error naming the file and line.
        match f(&line) {
            Ok(ControlFlow::Continue(())) => {}
            Ok(ControlFlow::Break(())) => return Ok(()),
            Err(why) => {
                return Err(HitrateError::Parse {
                    path: path.display().to_string(),
                    line: no,
                    why,
                })
            }
        }
    }
}

/// Reads a Mooncake trace (`.jsonl`, plain or zstd-compressed): block id
/// `h` expands to tokens `h·512 + j`, the last block cut to
/// `input_length`; requests sorted by `timestamp` (ms), stably.
pub fn read_mooncake(path: &Path) -> Result<Trace, HitrateError> {
    #[derive(serde::Deserialize)]
    struct Line {
        timestamp: f64,
        input_length: usize,
        #[serde(default)]
        output_length: u32,
        hash_ids: Vec<u64>,
    }
    const BLOCK: u64 = 512;
    let mut requests = Vec::new();
    for_lines(path, |line| {
        let l: Line = serde_json::from_str(line).map_err(|e| e.to_string())?;
        if l.input_length > l.hash_ids.len() * BLOCK as usize {
            return Err(format!(
                "input_length {} is more than {} blocks of {BLOCK}",
                l.input_length,
                l.hash_ids.len()
            ));
        }
        let mut tokens = Vec::with_capacity(l.input_length);
        'ids: for &h in &l.hash_ids {
            for j in 0..BLOCK {
                if tokens.len() == l.input_length {
                    break 'ids;
                }
                let t = h
                    .checked_mul(BLOCK)
                    .map(|t| t + j)
                    .filter(|&t| t <= u64::from(u32::MAX))
                    .ok_or_else(|| format!("block id {h} is too large for 32-bit tokens"))?;
                tokens.push(t as u32);
            }
        }
        requests.push(TraceRequest {
            time: l.timestamp,
            output: l.output_length,
            prompt: Prompt::Tokens(tokens),
        });
        Ok(ControlFlow::Continue(()))
    })?;
    requests.sort_by(|a, b| a.time.total_cmp(&b.time));
    Ok(Trace {
        name: trace_name(path),
        requests,
        blocks: BlockTrie::default(),
    })
}

/// Mean gap between the starts of merged agentic conversations, in seconds
/// (the README's reference figures use 1 s).
pub const AGENTIC_MEAN_GAP_S: f64 = 1.0;

/// Reads agentic conversations ([`read_agentic_with_gap`]) with a mean gap
/// of [`AGENTIC_MEAN_GAP_S`] between conversation starts.
pub fn read_agentic(path: &Path, seed: u64) -> Result<Trace, HitrateError> {
    read_agentic_with_gap(path, seed, AGENTIC_MEAN_GAP_S)
}

/// Reads agentic conversations (kv-cache-tester's format, one conversation
/// per line, plain or zstd-compressed) and merges them into one trace.
///
/// * Conversations start as a Poisson process: the first at 0, each next
///   one an exponential gap of mean `mean_gap_s` seconds later (seeded by
///   `seed`); a request arrives at its conversation's start plus its `t`
///   (seconds). All requests are then ordered by time, stably (ties keep
///   file order).
/// * A `subagent` entry is flattened: its `requests` run from the
///   sub-agent's start, which is its `t` minus `duration_ms` when that is
///   given (a completed sub-agent's `t` is when its result came back) and
///   its `t` otherwise (an `async_launched` one's `t` is its launch).
/// * `hash_ids` name whole blocks of `block_size` tokens; with
///   `hash_id_scope` `"local"` (the default) ids are unique only within a
///   conversation (its sub-agents included), so each (conversation, id) —
///   in fact (parent block, id), the same thing for prefix-chained ids —
///   becomes a block of one [`BlockTrie`]. `"global"` shares ids across
///   conversations.
/// * The `in - len(hash_ids)·block_size` tokens past the last whole block
///   are the request's own: fresh ids that occur nowhere else.
///
/// Errors name the 1-based line.
pub fn read_agentic_with_gap(
    path: &Path,
    seed: u64,
    mean_gap_s: f64,
) -> Result<Trace, HitrateError> {
    if !(mean_gap_s.is_finite() && mean_gap_s >= 0.0) {
        return Err(HitrateError::Invalid(format!(
            "the mean gap between conversations must be a non-negative number of seconds, not {mean_gap_s}"
        )));
    }
    #[derive(serde::Deserialize)]
    struct Conversation {
        block_size: usize,
        #[serde(default)]
        hash_id_scope: Option<String>,
        requests: Vec<Entry>,
    }
    #[derive(serde::Deserialize)]
    struct Entry {
        t: f64,
        #[serde(rename = "type")]
        kind: String,
        #[serde(rename = "in")]
        input: Option<u64>,
        #[serde(default)]
        out: Option<u64>,
        hash_ids: Option<Vec<u64>>,
        duration_ms: Option<f64>,
        requests: Option<Vec<Entry>>,
    }
    struct Reader {
        blocks: BlockTrie,
        /// (parent block or NONE, id) -> block.
        ids: HashMap<(u32, u64), u32>,
        fresh: u64,
        /// Requests with tail_start relative to the fresh tokens' base.
        requests: Vec<TraceRequest>,
    }
    impl Reader {
        fn flatten(&mut self, entries: &[Entry], start_s: f64) -> Result<(), String> {
            for e in entries {
                if !e.t.is_finite() {
                    return Err(format!("time {} is not a number", e.t));
                }
                if e.kind == "subagent" {
                    let Some(inner) = &e.requests else {
                        return Err(format!("the sub-agent at t = {} has no requests", e.t));
                    };
                    let began = match e.duration_ms {
                        Some(d) if d.is_finite() && d >= 0.0 => e.t - d / 1000.0,
                        Some(d) => return Err(format!("duration_ms {d} is not a duration")),
                        None => e.t,
                    };
                    self.flatten(inner, start_s + began)?;
                    continue;
                }
                let (Some(input), Some(hash_ids)) = (e.input, &e.hash_ids) else {
                    return Err(format!(
                        "the {:?} request at t = {} lacks `in` or `hash_ids`",
                        e.kind, e.t
                    ));
                };
                let b = self.blocks.block_size as u64;
                let whole = hash_ids.len() as u64 * b;
                if whole > input || input > u64::from(u32::MAX) {
                    return Err(format!(
                        "{} blocks of {b} do not fit `in` = {input} tokens",
                        hash_ids.len()
                    ));
                }
                let mut last: Option<u32> = None;
                for &h in hash_ids {
                    let key = (last.unwrap_or(NONE), h);
                    let block = match self.ids.get(&key) {
                        Some(&n) => n,
                        None => {
                            let n = self.blocks.push(last).map_err(|e| e.to_string())?;
                            self.ids.insert(key, n);
                            n
                        }
                    };
                    last = Some(block);
                }
                let tail = input - whole;
                if self.fresh + tail > 1 << 32 {
                    return Err("more than 2^32 tail tokens".into());
                }
                self.requests.push(TraceRequest {
                    time: (start_s + e.t) * 1000.0,
                    output: e.out.map_or(0, |o| o.min(u64::from(u32::MAX)) as u32),
                    prompt: Prompt::Blocks {
                        last,
                        blocks: hash_ids.len() as u32,
                        tail_start: self.fresh as u32,
                        tail: tail as u32,
                    },
                });
                self.fresh += tail;
            }
            Ok(())
        }
    }
    let mut rng = SplitMix(seed);
    let mut r = Reader {
        blocks: BlockTrie::default(),
        ids: HashMap::new(),
        fresh: 0,
        requests: Vec::new(),
    };
    let mut start_s: Option<f64> = None;
    for_lines(path, |line| {
        let c: Conversation = serde_json::from_str(line).map_err(|e| e.to_string())?;
        if c.block_size == 0 || c.block_size > 1 << 20 {
            return Err(format!("block_size {} is not usable", c.block_size));
        }
        if r.blocks.block_size == 0 {
            r.blocks.block_size = c.block_size;
        } else if r.blocks.block_size != c.block_size {
            return Err(format!(
                "block_size {} differs from the trace's {}",
                c.block_size, r.blocks.block_size
            ));
        }
        match c.hash_id_scope.as_deref() {
            None | Some("local") => r.ids.clear(),
            Some("global") => {}
            Some(s) => return Err(format!("unknown hash_id_scope {s:?}")),
        }
        let s = match start_s {
            None => 0.0,
            Some(prev) => prev + rng.exp(mean_gap_s),
        };
        start_s = Some(s);
        r.flatten(&c.requests, s)?;
        Ok(ControlFlow::Continue(()))
    })?;
    // Tail tokens follow the block tokens.
    let base = r.blocks.len() as u64 * r.blocks.block_size as u64;
    if base + r.fresh > 1 << 32 {
        return Err(HitrateError::Invalid(format!(
            "{base} block tokens and {} tail tokens do not fit 32-bit ids",
            r.fresh
        )));
    }
    for q in &mut r.requests {
        if let Prompt::Blocks { tail_start, .. } = &mut q.prompt {
            *tail_start = (base + u64::from(*tail_start)) as u32;
        }
    }
    r.requests.sort_by(|a, b| a.time.total_cmp(&b.time));
    Ok(Trace {
        name: trace_name(path),
        requests: r.requests,
        blocks: r.blocks,
    })
}

/// Reads a trace file of either format, told apart by its first line: an
/// object with `requests` is an agentic conversation ([`read_agentic`],
/// with `seed` and `mean_gap_s`), one with `hash_ids` a Mooncake request
/// ([`read_mooncake`]).
pub fn read_trace(path: &Path, seed: u64, mean_gap_s: f64) -> Result<Trace, HitrateError> {
    #[derive(serde::Deserialize)]
    struct Probe {
        requests: Option<serde::de::IgnoredAny>,
        hash_ids: Option<serde::de::IgnoredAny>,
    }
    let mut kind = None;
    for_lines(path, |line| {
        let p: Probe = serde_json::from_str(line).map_err(|e| e.to_string())?;
        kind = match (p.requests, p.hash_ids) {
            (Some(_), _) => Some(true),
            (None, Some(_)) => Some(false),
            (None, None) => {
                return Err(
                    "neither an agentic conversation (`requests`) nor a Mooncake \
                            request (`hash_ids`)"
                        .into(),
                )
            }
        };
        Ok(ControlFlow::Break(())) // the first line tells
    })?;
    match kind {
        Some(true) => read_agentic_with_gap(path, seed, mean_gap_s),
        Some(false) => read_mooncake(path),
        None => Err(HitrateError::Read {
            path: path.display().to_string(),
            why: "the file has no requests".into(),
        }),
    }
}

/// SGLang's generated-shared-prefix workload: `groups` system prompts of
/// `system` tokens, each followed by `prompts` questions of `question`
/// tokens, arriving group-interleaved; seeded.
pub fn gsp(groups: usize, prompts: usize, system: usize, question: usize, seed: u64) -> Trace {
    let mut x = seed | 1;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x % 100_000) as u32
    };
    let systems: Vec<Vec<u32>> = (0..groups)
        .map(|_| (0..system).map(|_| next()).collect())
        .collect();
    let mut requests = Vec::new();
    for p in 0..prompts {
        for (g, s) in systems.iter().enumerate() {
            let mut tokens = s.clone();
            tokens.extend((0..question).map(|_| next()));
            requests.push(((p * groups + g) as f64, tokens));
        }
    }
    Trace::from_tokens(
        format!("gsp-{groups}x{prompts}-{system}+{question}"),
        requests,
    )
}

/// A multi-turn chat: `conversations` conversations of `turns` turns share
/// one system prompt of `system` tokens; turn `k`'s prompt is the whole
/// conversation so far (system prompt, then every earlier user message and
/// assistant reply) plus a new user message of `user` tokens, and its
/// reply of `assistant` tokens joins the next turn's prompt. Turns arrive
/// one per millisecond, each from a conversation drawn at random (seeded
/// by `seed`) among those with turns left, so conversations interleave
/// while each keeps its order. Every message's tokens are fresh ids, so
/// prompts share exactly the system prompt and their own conversation's
/// history.
///
/// With a cache that never evicts and page size `P`, turn 1 reuses
/// `⌊system/P⌋·P` tokens (all but the very first conversation's) and turn
/// `k > 1` reuses `⌊L(k−1)/P⌋·P`, where
/// `L(k) = system + k·user + (k−1)·assistant`.
///
/// The CLI's `--trace chat` is `chat(64, 8, 1024, 128, 256, seed)`.
pub fn chat(
    conversations: usize,
    turns: usize,
    system: usize,
    user: usize,
    assistant: usize,
    seed: u64,
) -> Trace {
    let mut next_token: u32 = 0;
    let mut fresh = |n: usize| -> Vec<u32> {
        let v: Vec<u32> = (0..n as u32).map(|k| next_token.wrapping_add(k)).collect();
        next_token = next_token.wrapping_add(n as u32);
        v
    };
    let name = format!("chat-{conversations}x{turns}-{system}+{user}+{assistant}");
    let system = fresh(system);
    let mut history: Vec<Vec<u32>> = vec![system; conversations];
    let mut left: Vec<usize> = vec![turns; conversations];
    // Conversations with turns left, for uniform draws.
    let mut live: Vec<usize> = if turns == 0 {
        Vec::new()
    } else {
        (0..conversations).collect()
    };
    let mut rng = SplitMix(seed);
    let mut requests = Vec::with_capacity(conversations * turns);
    while !live.is_empty() {
        let at = rng.below(live.len());
        let c = live[at];
        history[c].extend(fresh(user));
        requests.push((requests.len() as f64, history[c].clone()));
        history[c].extend(fresh(assistant));
        left[c] -= 1;
        if left[c] == 0 {
            live.swap_remove(at);
            history[c] = Vec::new();
        }
    }
    Trace::from_tokens(name, requests)
}

/// One row of the report.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct HitRow {
    /// Trace name.
    pub trace: String,
    /// Policy (or `belady`).
    pub policy: String,
    /// Capacity as a share of the trace's distinct tokens: the share asked
    /// for, or (with a page count) `pages · page_size / distinct`.
    pub capacity: f64,
    /// The pool's usable pages.
    pub pages: usize,
    /// Input tokens served from the cache / all input tokens.
    pub hit_rate_tokens: f64,
    /// Tokens evicted during the replay.
    pub evicted_tokens: u64,
}

/// Replays `trace` with `policy` through a pool of `pages` pages; returns
/// the hit rate in tokens and the tokens evicted.
pub fn replay(
    trace: &Trace,
    policy: EvictionPolicy,
    page_size: usize,
    pages: usize,
) -> Result<(f64, u64), HitrateError> {
    let cache = Arc::new(
        RadixCache::builder()
            .page_size(page_size)
            .eviction_policy(policy)
            .pages_per_device(pages.saturating_add(1))
            .build()?,
    );
    let d = DeviceId(0);
    let (mut hit, mut total, mut adopted) = (0u64, 0u64, 0u64);
    let mut tokens = Vec::new();
    for i in 0..trace.requests.len() {
        trace.tokens_into(i, &mut tokens);
        let mut req = cache.begin(TokenKey::new(&tokens), d)?;
        hit += req.cached_len() as u64;
        total += tokens.len() as u64;
        // The request computes the rest; with no room even after eviction
        // (a request larger than the pool), nothing of it is cached.
        if req.reserve().is_ok() {
            let done = req.finish()?;
            adopted += done.adopted.iter().map(|a| a.len() as u64).sum::<u64>();
        }
    }
    // Every adopted token is either still cached or was evicted.
    let cached = cache.sizes(d)?.total as u64;
    Ok((
        hit as f64 / total.max(1) as f64,
        adopted.saturating_sub(cached),
    ))
}

/// Not used again.
const NEVER: u32 = u32::MAX;

/// For every request, the next request that uses each of its pages, as
/// runs `(next request or NEVER, pages)` in page order: Belady's MIN
/// needs only these. Along a request the values never decrease (a request
/// that holds a page holds every page before it), so a request is a few
/// runs however long it is.
struct NextUses {
    runs: Vec<(u32, u32)>,
    /// Per request, its range in `runs`.
    bounds: Vec<(usize, usize)>,
    total_tokens: u64,
}

fn next_uses(trace: &Trace, page_size: usize) -> Result<NextUses, HitrateError> {
    let n = trace.requests.len();
    if n >= NEVER as usize {
        return Err(HitrateError::Invalid(format!(
            "{n} requests are too many for Belady's bound"
        )));
    }
    let mut ids = PageIds::new(trace, page_size);
    let mut next = vec![NEVER; ids.block_space];
    let mut runs: Vec<(u32, u32)> = Vec::new();
    let mut bounds = vec![(0, 0); n];
    let mut pages = Vec::new();
    for r in (0..n).rev() {
        ids.pages(r, &mut pages);
        let start = runs.len();
        for &p in &pages {
            let v = if p == UNIQUE {
                NEVER
            } else {
                if p >= next.len() {
                    next.resize(p + 1, NEVER);
                }
                std::mem::replace(&mut next[p], r as u32)
            };
            let here = runs.len() > start;
            match runs.last_mut() {
                Some((k, c)) if here && *k == v => *c += 1,
                _ => runs.push((v, 1)),
            }
        }
        bounds[r] = (start, runs.len());
    }
    Ok(NextUses {
        runs,
        bounds,
        total_tokens: trace.input_tokens(),
    })
}

/// Belady's MIN over pages from precomputed next uses: before each
/// request, the cached pages it uses are hits; then the cache keeps the
/// `pages` pages, among those it held and those of the request, whose next
/// use is nearest (ties keep the pages held before). Pages with the same
/// next use are interchangeable, so the cache is a count per next use.
fn belady_with(plan: &NextUses, page_size: usize, pages: usize) -> (f64, u64) {
    let mut cache: BTreeMap<u32, u64> = BTreeMap::new();
    let (mut size, mut hit, mut evicted) = (0u64, 0u64, 0u64);
    let cap = pages as u64;
    let mut new: Vec<(u32, u64)> = Vec::new();
    for (r, &(lo, hi)) in plan.bounds.iter().enumerate() {
        if let Some(h) = cache.remove(&(r as u32)) {
            hit += h;
            size -= h;
        }
        new.clear();
        new.extend(plan.runs[lo..hi].iter().map(|&(k, c)| (k, u64::from(c))));
        if !new.is_sorted_by_key(|x| x.0) {
            new.sort_unstable_by_key(|x| x.0);
        }
        new.dedup_by(|b, a| {
            let same = a.0 == b.0;
            if same {
                a.1 += b.1;
            }
            same
        });
        let k: u64 = new.iter().map(|x| x.1).sum();
        let mut excess = (size + k).saturating_sub(cap);
        while excess > 0 {
            let top_old = cache.last_key_value().map(|(&key, _)| key);
            match new.last_mut() {
                Some(top) if top_old.is_none_or(|o| top.0 >= o) => {
                    let d = excess.min(top.1);
                    top.1 -= d;
                    excess -= d;
                    if top.1 == 0 {
                        new.pop();
                    }
                }
                _ => {
                    let Some(mut e) = cache.last_entry() else {
                        break;
                    };
                    let d = excess.min(*e.get());
                    *e.get_mut() -= d;
                    if *e.get() == 0 {
                        e.remove();
                    }
                    size -= d;
                    evicted += d;
                    excess -= d;
                }
            }
        }
        for &(key, c) in &new {
            *cache.entry(key).or_insert(0) += c;
            size += c;
        }
    }
    let ps = page_size as u64;
    (
        (hit * ps) as f64 / plan.total_tokens.max(1) as f64,
        evicted * ps,
    )
}

/// Belady's MIN over pages: the cache holds `pages` pages; after each
/// request it keeps, among the pages it held and the request's, those
/// whose next use is nearest. It maximizes page hits, and every page of a
/// request counts, whether its prefix is cached or not; it ignores the
/// tree's constraints (a page is usable only with its prefix, eviction
/// takes leaves, pinned pages stay), so it bounds every policy from above,
/// loosely. Returns the hit rate in tokens and the tokens evicted (pages
/// dropped that the request at hand did not use).
pub fn belady(trace: &Trace, page_size: usize, pages: usize) -> Result<(f64, u64), HitrateError> {
    if page_size == 0 {
        return Err(HitrateError::Invalid("page size must be at least 1".into()));
    }
    Ok(belady_with(&next_uses(trace, page_size)?, page_size, pages))
}

/// Runs every (policy, capacity) pair and Belady's bound for each capacity.
pub fn evaluate(
    trace: &Trace,
    policies: &[EvictionPolicy],
    capacities: &[f64],
    page_size: usize,
) -> Result<Vec<HitRow>, HitrateError> {
    if page_size == 0 {
        return Err(HitrateError::Invalid("page size must be at least 1".into()));
    }
    let distinct = trace.distinct_tokens(page_size);
    evaluate_sized(trace, policies, capacities, page_size, distinct)
}

/// Like [`evaluate`], for a caller that already knows
/// [`Trace::distinct_tokens`] at this page size.
pub fn evaluate_sized(
    trace: &Trace,
    policies: &[EvictionPolicy],
    capacities: &[f64],
    page_size: usize,
    distinct: usize,
) -> Result<Vec<HitRow>, HitrateError> {
    if page_size == 0 {
        return Err(HitrateError::Invalid("page size must be at least 1".into()));
    }
    let mut sizes = Vec::new();
    for &c in capacities {
        if !(c > 0.0 && c.is_finite()) {
            return Err(HitrateError::Invalid(format!(
                "capacity {c} is not a positive fraction"
            )));
        }
        let pages = ((distinct as f64 * c) / page_size as f64).ceil().max(2.0) as usize;
        sizes.push((c, pages));
    }
    evaluate_at(trace, policies, &sizes, page_size)
}

/// Like [`evaluate_sized`] with absolute pool sizes in pages; each row's
/// capacity is `pages · page_size / distinct`.
pub fn evaluate_pages(
    trace: &Trace,
    policies: &[EvictionPolicy],
    pages: &[usize],
    page_size: usize,
    distinct: usize,
) -> Result<Vec<HitRow>, HitrateError> {
    if page_size == 0 {
        return Err(HitrateError::Invalid("page size must be at least 1".into()));
    }
    if distinct == 0 {
        return Err(HitrateError::Invalid(format!(
            "the trace has no whole page of {page_size} tokens: a capacity in pages has no share"
        )));
    }
    let mut sizes = Vec::new();
    for &p in pages {
        if p == 0 {
            return Err(HitrateError::Invalid("a pool needs at least 1 page".into()));
        }
        sizes.push(((p as f64 * page_size as f64) / distinct as f64, p));
    }
    evaluate_at(trace, policies, &sizes, page_size)
}

/// Rows for every `(capacity share, pages)` and policy, plus Belady's.
fn evaluate_at(
    trace: &Trace,
    policies: &[EvictionPolicy],
    sizes: &[(f64, usize)],
    page_size: usize,
) -> Result<Vec<HitRow>, HitrateError> {
    let plan = next_uses(trace, page_size)?;
    let mut rows = Vec::new();
    for &(capacity, pages) in sizes {
        let row = |policy: String, (rate, evicted): (f64, u64)| HitRow {
            trace: trace.name.clone(),
            policy,
            capacity,
            pages,
            hit_rate_tokens: rate,
            evicted_tokens: evicted,
        };
        for &p in policies {
            rows.push(row(p.to_string(), replay(trace, p, page_size, pages)?));
        }
        rows.push(row("belady".into(), belady_with(&plan, page_size, pages)));
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn belady_bounds_every_policy_and_infinite_capacity_hits_the_shared_part() {
        let t = gsp(8, 6, 256, 32, 3);
        let rows = evaluate(&t, &EvictionPolicy::ALL, &[0.2, 2.0], 16).unwrap();
        for c in [0.2, 2.0] {
            let bound = rows
                .iter()
                .find(|r| r.policy == "belady" && r.capacity == c)
                .unwrap()
                .hit_rate_tokens;
            for r in rows
                .iter()
                .filter(|r| r.capacity == c && r.policy != "belady")
            {
                assert!(
                    r.hit_rate_tokens <= bound + 1e-9,
                    "{r:?} above Belady's {bound}"
                );
            }
        }
        // With room for everything, every request after the first of its
        // group reuses the whole system prompt: 5 of 6 per group.
        let lru = rows
            .iter()
            .find(|r| r.policy == "lru" && r.capacity == 2.0)
            .unwrap();
        let want = (5.0 * 256.0) / (6.0 * (256.0 + 32.0));
        assert!(
            (lru.hit_rate_tokens - want).abs() < 0.01,
            "{} vs {want}",
            lru.hit_rate_tokens
        );
        assert_eq!(lru.evicted_tokens, 0);
        // Tight capacity evicts.
        let small = rows
            .iter()
            .find(|r| r.policy == "lru" && r.capacity == 0.2)
            .unwrap();
        assert!(small.evicted_tokens > 0 && small.hit_rate_tokens < lru.hit_rate_tokens);
    }

    /// Belady's MIN page by page, the plain way: hits are the pages cached
    /// before a request; then each page of the request in turn is kept if
    /// there is room or some cached page's next use (by request) is later.
    fn belady_plain(trace: &Trace, ps: usize, pages: usize) -> f64 {
        let mut ids = PageIds::new(trace, ps);
        let mut reqs: Vec<Vec<usize>> = Vec::new();
        let mut fresh = usize::MAX / 2;
        for i in 0..trace.requests.len() {
            let mut v = Vec::new();
            ids.pages(i, &mut v);
            for p in &mut v {
                if *p == UNIQUE {
                    fresh += 1;
                    *p = fresh;
                }
            }
            reqs.push(v);
        }
        let next_use = |p: usize, after: usize| {
            (after + 1..reqs.len())
                .find(|&r| reqs[r].contains(&p))
                .unwrap_or(usize::MAX)
        };
        let mut cached: Vec<usize> = Vec::new();
        let mut hit = 0;
        for (r, ids) in reqs.iter().enumerate() {
            hit += ids.iter().filter(|p| cached.contains(p)).count();
            for &p in ids {
                if cached.contains(&p) {
                    continue;
                }
                if cached.len() < pages {
                    cached.push(p);
                    continue;
                }
                let nu = next_use(p, r);
                let (far_at, far) = cached
                    .iter()
                    .enumerate()
                    .map(|(k, &q)| (k, next_use(q, r)))
                    .max_by_key(|x| x.1)
                    .unwrap_or((0, 0));
                if far > nu {
                    cached[far_at] = p;
                }
            }
        }
        (hit * ps) as f64 / trace.input_tokens().max(1) as f64
    }

    #[test]
    fn belady_by_counts_matches_the_plain_algorithm() {
        for seed in 1..4 {
            let traces = [gsp(3, 4, 32, 8, seed), chat(3, 3, 16, 8, 8, seed)];
            for t in &traces {
                for ps in [1, 4, 5] {
                    let distinct = t.distinct_tokens(ps) / ps;
                    for pages in [0, 1, 3, distinct / 4, distinct / 2, distinct + 1] {
                        let fast = belady(t, ps, pages).unwrap().0;
                        let plain = belady_plain(t, ps, pages);
                        assert!(
                            (fast - plain).abs() < 1e-12,
                            "{} ps {ps} pages {pages}: {fast} vs {plain}",
                            t.name
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn block_prompts_expand_along_the_trie_and_pages_name_prefixes() {
        let mut blocks = BlockTrie {
            block_size: 4,
            parent: Vec::new(),
        };
        let a = blocks.push(None).unwrap();
        let b = blocks.push(Some(a)).unwrap();
        let c = blocks.push(Some(a)).unwrap();
        let base = 3 * 4;
        let t = Trace {
            name: "t".into(),
            requests: vec![
                TraceRequest {
                    time: 0.0,
                    output: 0,
                    prompt: Prompt::Blocks {
                        last: Some(b),
                        blocks: 2,
                        tail_start: base,
                        tail: 3,
                    },
                },
                TraceRequest {
                    time: 1.0,
                    output: 0,
                    prompt: Prompt::Blocks {
                        last: Some(c),
                        blocks: 2,
                        tail_start: base + 3,
                        tail: 0,
                    },
                },
            ],
            blocks,
        };
        assert_eq!(t.tokens(0), vec![0, 1, 2, 3, 4, 5, 6, 7, 12, 13, 14]);
        assert_eq!(t.tokens(1), vec![0, 1, 2, 3, 8, 9, 10, 11]);
        assert_eq!(t.input_len(0), 11);
        // Pages of 2: block a's two pages are shared; b's, c's and the
        // tail's are not (the last tail token makes no whole page).
        assert_eq!(t.distinct_tokens(2), (2 + 2 + 2 + 1) * 2);
        // Pages of 3 straddle blocks: [0 1 2] is shared; [3 4 5] and
        // [6 7 12] (tail) are request 0's, [3 8 9] request 1's.
        assert_eq!(t.distinct_tokens(3), (1 + 2 + 1) * 3);
        for ps in 1..=9 {
            let literal = Trace::from_tokens("l", vec![(0.0, t.tokens(0)), (1.0, t.tokens(1))]);
            assert_eq!(
                t.distinct_tokens(ps),
                literal.distinct_tokens(ps),
                "page size {ps}"
            );
            for pages in 0..8 {
                assert_eq!(
                    belady(&t, ps, pages).unwrap(),
                    belady(&literal, ps, pages).unwrap()
                );
            }
        }
    }
}
