//! Trace file readers: Mooncake JSONL ([`read_mooncake`]: `timestamp`,
//! `input_length`, `output_length`, `hash_ids` of 512-token blocks, where
//! block id `h` expands to tokens `h·512 + j`) and agentic conversations
//! ([`read_agentic`]: one conversation per line, blocks of 64 tokens with
//! conversation-local ids, sub-agents nested), merged by starting the
//! conversations as a Poisson process. Files are read streaming, plain or
//! zstd-compressed (told apart by the zstd magic bytes); [`read_trace`]
//! tells the formats apart by the first line.

use super::{BlockTrie, Prompt, Trace, TraceError, TraceRequest, NONE};
use radixkv_engine::rng::SplitMix64;
use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::ops::ControlFlow;
use std::path::Path;

/// Opens a trace file, decompressing it if it starts with the zstd magic
/// bytes.
fn open(path: &Path) -> Result<Box<dyn BufRead>, TraceError> {
    let err = |why: String| TraceError::Read {
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
) -> Result<(), TraceError> {
    let mut reader = open(path)?;
    let mut line = String::new();
    let mut no = 0;
    loop {
        line.clear();
        no += 1;
        let n = reader.read_line(&mut line).map_err(|e| TraceError::Parse {
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
                return Err(TraceError::Parse {
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
pub fn read_mooncake(path: &Path) -> Result<Trace, TraceError> {
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
        requests.push(TraceRequest::new(
            l.timestamp,
            tokens,
            l.output_length as usize,
        ));
        Ok(ControlFlow::Continue(()))
    })?;
    requests.sort_by(|a, b| a.arrival_ms.total_cmp(&b.arrival_ms));
    Ok(Trace {
        name: trace_name(path),
        requests,
        blocks: BlockTrie::default(),
    })
}

/// Mean gap between the starts of merged agentic conversations, in seconds
/// (BENCHMARKS.md's reference figures use 1 s).
pub const AGENTIC_MEAN_GAP_S: f64 = 1.0;

/// Reads agentic conversations ([`read_agentic_with_gap`]) with a mean gap
/// of [`AGENTIC_MEAN_GAP_S`] between conversation starts.
pub fn read_agentic(path: &Path, seed: u64) -> Result<Trace, TraceError> {
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
pub fn read_agentic_with_gap(path: &Path, seed: u64, mean_gap_s: f64) -> Result<Trace, TraceError> {
    if !(mean_gap_s.is_finite() && mean_gap_s >= 0.0) {
        return Err(TraceError::Invalid(format!(
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
                    arrival_ms: (start_s + e.t) * 1000.0,
                    output_len: e.out.map_or(0, |o| o.min(u64::from(u32::MAX)) as usize),
                    output_tokens: None,
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
    let mut rng = SplitMix64::new(seed);
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
        return Err(TraceError::Invalid(format!(
            "{base} block tokens and {} tail tokens do not fit 32-bit ids",
            r.fresh
        )));
    }
    for q in &mut r.requests {
        if let Prompt::Blocks { tail_start, .. } = &mut q.prompt {
            *tail_start = (base + u64::from(*tail_start)) as u32;
        }
    }
    r.requests
        .sort_by(|a, b| a.arrival_ms.total_cmp(&b.arrival_ms));
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
pub fn read_trace(path: &Path, seed: u64, mean_gap_s: f64) -> Result<Trace, TraceError> {
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
        None => Err(TraceError::Read {
            path: path.display().to_string(),
            why: "the file has no requests".into(),
        }),
    }
}
