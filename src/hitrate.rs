//! Hit-rate evaluation (`radixkv hitrate`): replays a request trace through
//! a single-device cache that owns a pool of a given size, with each
//! request's real lifecycle (match and pin the cached prefix, allocate the
//! rest, evicting on shortage, insert at completion), and reports the share
//! of input tokens served from the cache, per policy and capacity, beside
//! an offline bound: Belady's MIN over the same pages.
//!
//! Traces: the Mooncake JSONL format (`timestamp`, `input_length`,
//! `hash_ids` of 512-token blocks; `.zst` read directly), where block id `h`
//! expands to tokens `h·B + j`; and a built-in generator of SGLang's
//! generated-shared-prefix workload.

use crate::{CacheError, DeviceId, EvictionPolicy, RadixCache, TokenKey};
use serde::Serialize;
use std::collections::{BTreeSet, HashMap};
use std::io::{BufRead, BufReader, Read};
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

/// One request of a trace, in arrival order.
#[derive(Clone, Debug)]
pub struct TraceRequest {
    /// Arrival time in milliseconds.
    pub time: f64,
    /// Input tokens.
    pub tokens: Vec<u32>,
}

/// A named sequence of requests.
#[derive(Clone, Debug)]
pub struct Trace {
    /// Name for the report.
    pub name: String,
    /// Requests in arrival order.
    pub requests: Vec<TraceRequest>,
}

impl Trace {
    /// Distinct tokens: the size of a cache that never evicts, counted as
    /// distinct prefix pages of `page_size` tokens times `page_size`.
    pub fn distinct_tokens(&self, page_size: usize) -> usize {
        let mut seen = std::collections::HashSet::new();
        for r in &self.requests {
            for p in page_ids(&r.tokens, page_size) {
                seen.insert(p);
            }
        }
        seen.len() * page_size
    }
}

/// Identity of each whole page of `tokens`: a hash of the whole prefix up to
/// the page's end (two pages are the same only with the same prefix).
fn page_ids(tokens: &[u32], ps: usize) -> Vec<u64> {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut out = Vec::with_capacity(tokens.len() / ps);
    for (i, &t) in tokens.iter().enumerate() {
        h = (h ^ u64::from(t))
            .wrapping_mul(0x0100_0000_01b3)
            .rotate_left(7);
        if (i + 1) % ps == 0 {
            out.push(h);
        }
    }
    out
}

/// Reads a Mooncake trace (`.jsonl` or `.jsonl.zst`).
pub fn read_mooncake(path: &Path) -> Result<Trace, HitrateError> {
    let name = path.display().to_string();
    let err = |why: String| HitrateError::Read {
        path: name.clone(),
        why,
    };
    let file = std::fs::File::open(path).map_err(|e| err(e.to_string()))?;
    let reader: Box<dyn Read> = if path.extension().is_some_and(|e| e == "zst") {
        Box::new(ruzstd::decoding::StreamingDecoder::new(file).map_err(|e| err(e.to_string()))?)
    } else {
        Box::new(file)
    };
    #[derive(serde::Deserialize)]
    struct Line {
        timestamp: f64,
        input_length: usize,
        hash_ids: Vec<u64>,
    }
    const BLOCK: usize = 512;
    let mut requests = Vec::new();
    for (i, line) in BufReader::new(reader).lines().enumerate() {
        let line = line.map_err(|e| err(e.to_string()))?;
        if line.trim().is_empty() {
            continue;
        }
        let l: Line = serde_json::from_str(&line).map_err(|e| HitrateError::Parse {
            path: name.clone(),
            line: i + 1,
            why: e.to_string(),
        })?;
        let mut tokens = Vec::with_capacity(l.input_length);
        for &h in &l.hash_ids {
            for j in 0..BLOCK {
                if tokens.len() == l.input_length {
                    break;
                }
                // Token ids stay below 2^32 for the shipped traces' id range.
                tokens.push((h as usize * BLOCK + j) as u32);
            }
        }
        requests.push(TraceRequest {
            time: l.timestamp,
            tokens,
        });
    }
    requests.sort_by(|a, b| a.time.total_cmp(&b.time));
    let name = path.file_name().map_or(name.clone(), |n| {
        n.to_string_lossy()
            .trim_end_matches(".jsonl.zst")
            .to_string()
    });
    Ok(Trace { name, requests })
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
            requests.push(TraceRequest {
                time: (p * groups + g) as f64,
                tokens,
            });
        }
    }
    Trace {
        name: format!("gsp-{groups}x{prompts}-{system}+{question}"),
        requests,
    }
}

/// One row of the report.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct HitRow {
    /// Trace name.
    pub trace: String,
    /// Policy (or `belady`).
    pub policy: String,
    /// Capacity as a share of the trace's distinct tokens.
    pub capacity: f64,
    /// Input tokens served from the cache / all input tokens.
    pub hit_rate_tokens: f64,
    /// Tokens evicted during the replay.
    pub evicted_tokens: u64,
}

/// Replays `trace` with `policy` through a pool of `pages` pages.
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
            .pages_per_device(pages + 1)
            .build()?,
    );
    let d = DeviceId(0);
    let (mut hit, mut total, mut adopted) = (0u64, 0u64, 0u64);
    for r in &trace.requests {
        let mut req = cache.begin(TokenKey::new(&r.tokens), d)?;
        hit += req.cached_len() as u64;
        total += r.tokens.len() as u64;
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

/// Belady's MIN over pages: the cache holds `pages` pages; misses are
/// inserted, evicting the page whose next use is farthest (or not inserting
/// a page needed later than every cached one). It maximizes page hits, and
/// every page of a request counts, whether its prefix is cached or not; it
/// ignores the tree's constraints (a page is usable only with its prefix,
/// eviction takes leaves, pinned pages stay), so it bounds every policy
/// from above, loosely.
pub fn belady(trace: &Trace, page_size: usize, pages: usize) -> (f64, u64) {
    let reqs: Vec<Vec<u64>> = trace
        .requests
        .iter()
        .map(|r| page_ids(&r.tokens, page_size))
        .collect();
    let n: usize = reqs.iter().map(Vec::len).sum();
    // Next use of each access, by position in the flattened sequence.
    let mut next = vec![usize::MAX; n];
    let mut last: HashMap<u64, usize> = HashMap::new();
    let flat: Vec<u64> = reqs.iter().flatten().copied().collect();
    for i in (0..n).rev() {
        next[i] = last.insert(flat[i], i).unwrap_or(usize::MAX);
    }
    let mut cached: HashMap<u64, usize> = HashMap::new(); // page -> its next use
    let mut by_next: BTreeSet<(usize, u64)> = BTreeSet::new();
    let (mut hit, mut total, mut evicted) = (0u64, 0u64, 0u64);
    let mut at = 0;
    for (r, ids) in trace.requests.iter().zip(&reqs) {
        total += r.tokens.len() as u64;
        // Every cached page counts, prefix or not: MIN maximizes page hits,
        // and any policy's prefix hits are at most its page hits.
        let present = ids.iter().filter(|p| cached.contains_key(p)).count();
        hit += (present * page_size) as u64;
        for &p in ids {
            let nu = next[at];
            at += 1;
            if let Some(old) = cached.insert(p, nu) {
                by_next.remove(&(old, p));
                by_next.insert((nu, p));
                continue;
            }
            cached.remove(&p);
            if pages == 0 {
                continue;
            }
            if cached.len() >= pages {
                let Some(&(far, q)) = by_next.iter().next_back() else {
                    continue;
                };
                if far <= nu {
                    continue; // the new page is needed last: do not keep it
                }
                by_next.remove(&(far, q));
                cached.remove(&q);
                evicted += page_size as u64;
            }
            cached.insert(p, nu);
            by_next.insert((nu, p));
        }
    }
    (hit as f64 / total.max(1) as f64, evicted)
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
    let mut rows = Vec::new();
    for &c in capacities {
        if !(c > 0.0 && c.is_finite()) {
            return Err(HitrateError::Invalid(format!(
                "capacity {c} is not a positive fraction"
            )));
        }
        let pages = ((distinct as f64 * c) / page_size as f64).ceil().max(2.0) as usize;
        for &p in policies {
            let (rate, evicted) = replay(trace, p, page_size, pages)?;
            rows.push(HitRow {
                trace: trace.name.clone(),
                policy: p.to_string(),
                capacity: c,
                hit_rate_tokens: rate,
                evicted_tokens: evicted,
            });
        }
        let (rate, evicted) = belady(trace, page_size, pages);
        rows.push(HitRow {
            trace: trace.name.clone(),
            policy: "belady".into(),
            capacity: c,
            hit_rate_tokens: rate,
            evicted_tokens: evicted,
        });
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
}
