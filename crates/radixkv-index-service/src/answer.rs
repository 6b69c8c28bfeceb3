//! A query's answer, from the index's scores per (worker, rank, medium),
//! in the two shapes routers read.
//!
//! **Dynamo's** (`/query` with `model_name`, and `/query_by_hash`), in
//! tokens:
//!
//! ```json
//! {"scores": {"7": {"0": 32, "1": 16}},
//!  "frequencies": [2, 2, 1],
//!  "instances": {"7": {"longest_matched": 48, "gpu": 32, "dp": {"0": 32, "1": 16}, "cpu": 48, "disk": 48}}}
//! ```
//!
//! `scores` holds each rank's device prefix (ranks with none are left
//! out), `frequencies[i]` how many ranks hold block `i` on a device, and
//! `instances` each worker's tiers, cumulative as Dynamo's are: `cpu` is
//! the longest prefix held on a device or in host memory, `disk` on any
//! medium (disk and external pools together), each the most of any rank,
//! so `gpu ≤ cpu ≤ disk`. A rank's lower tier is scored as its own
//! prefix there; Dynamo's continues a device prefix block by block on the
//! host. They agree whenever a host tier holds what it continues (as
//! SGLang's and radixkv's hierarchies do).
//!
//! **The Mooncake RFC's** (`/query` with `model`), the form `radixkv
//! serve` answers too:
//!
//! ```json
//! {"data": {"7": {"matched_tokens": 48, "L1": {"dp0": 32, "dp1": 16}, "L2": 48, "L3": 48}}}
//! ```

use radixkv_index::decode::Medium;
use radixkv_index::{Score, Source};
use serde::Serialize;
use std::collections::BTreeMap;

/// One rank's prefix per tier, in tokens.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct RankTiers {
    gpu: usize,
    cpu: usize,
    disk: usize,
}

/// One worker in Dynamo's `instances`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Instance {
    /// The longest of its tiers.
    pub longest_matched: usize,
    /// Its longest device prefix (any rank).
    pub gpu: usize,
    /// Each rank's device prefix.
    pub dp: BTreeMap<String, usize>,
    /// Device or host.
    pub cpu: usize,
    /// Any medium.
    pub disk: usize,
}

/// Dynamo's answer to `/query` and `/query_by_hash`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DynamoAnswer {
    /// Worker → rank → device prefix, for ranks with one.
    pub scores: BTreeMap<String, BTreeMap<String, usize>>,
    /// Ranks holding each block on a device, from the first block.
    pub frequencies: Vec<usize>,
    /// Each worker's tiers.
    pub instances: BTreeMap<String, Instance>,
}

/// Dynamo's shape of `scores` (blocks of `block_size`), counting only the
/// sources `scored` admits.
pub fn dynamo(
    scores: &[Score],
    block_size: usize,
    scored: impl Fn(Source) -> bool,
) -> DynamoAnswer {
    let ranks = per_rank(scores, scored);
    let mut out = DynamoAnswer::default();
    let mut most = 0;
    for (s, t) in &ranks {
        let w = s.worker.to_string();
        if t.gpu > 0 {
            out.scores
                .entry(w.clone())
                .or_default()
                .insert(s.rank.to_string(), t.gpu);
        }
        most = most.max(t.gpu / block_size.max(1));
        let i = out.instances.entry(w).or_default();
        i.dp.insert(s.rank.to_string(), t.gpu);
        i.gpu = i.gpu.max(t.gpu);
        i.cpu = i.cpu.max(t.cpu);
        i.disk = i.disk.max(t.disk);
        i.longest_matched = i.gpu.max(i.cpu).max(i.disk);
    }
    out.frequencies = (0..most)
        .map(|b| {
            ranks
                .iter()
                .filter(|(_, t)| t.gpu / block_size.max(1) > b)
                .count()
        })
        .collect();
    out
}

/// [`dynamo`]'s answer written as JSON: the same fields and values (keys
/// in numeric order), with no map or string built on the way. `/query`
/// answers with it.
///
/// ```
/// use radixkv_index::decode::Medium;
/// use radixkv_index::{Score, Source};
/// use radixkv_index_service::answer;
///
/// let scores = [Score { source: Source { worker: 7, rank: 1 }, medium: Medium::Gpu, tokens: 32 }];
/// let json: serde_json::Value = serde_json::from_slice(&answer::dynamo_json(&scores, 16, |_| true)).unwrap();
/// assert_eq!(json, serde_json::to_value(answer::dynamo(&scores, 16, |_| true)).unwrap());
/// assert_eq!(json["scores"]["7"]["1"], 32);
/// ```
pub fn dynamo_json(
    scores: &[Score],
    block_size: usize,
    scored: impl Fn(Source) -> bool,
) -> Vec<u8> {
    let ranks = per_rank(scores, scored);
    let block = block_size.max(1);
    let mut out = Vec::with_capacity(64 + 112 * ranks.len());
    let mut num = itoa::Buffer::new();
    let mut put = |out: &mut Vec<u8>, n: u64| out.extend_from_slice(num.format(n).as_bytes());
    // Each worker's ranks, in order.
    let workers = || ranks.chunk_by(|a, b| a.0.worker == b.0.worker);
    out.extend_from_slice(b"{\"scores\":{");
    let mut first = true;
    for w in workers() {
        let mut held = w.iter().filter(|(_, t)| t.gpu > 0).peekable();
        if held.peek().is_none() {
            continue;
        }
        if !std::mem::take(&mut first) {
            out.push(b',');
        }
        out.push(b'"');
        put(&mut out, w[0].0.worker);
        out.extend_from_slice(b"\":");
        put_device_prefixes(&mut out, held);
    }
    out.extend_from_slice(b"},\"frequencies\":[");
    // Ranks holding block b: those whose device prefix passes it.
    let mut passing: Vec<usize> = ranks.iter().map(|(_, t)| t.gpu / block).collect();
    passing.sort_unstable();
    let most = passing.last().copied().unwrap_or(0);
    let mut below = 0;
    for b in 0..most {
        while below < passing.len() && passing[below] <= b {
            below += 1;
        }
        if b > 0 {
            out.push(b',');
        }
        put(&mut out, (passing.len() - below) as u64);
    }
    out.extend_from_slice(b"],\"instances\":{");
    for (k, w) in workers().enumerate() {
        if k > 0 {
            out.push(b',');
        }
        let gpu = w.iter().map(|(_, t)| t.gpu).max().unwrap_or(0);
        let cpu = w.iter().map(|(_, t)| t.cpu).max().unwrap_or(0);
        let disk = w.iter().map(|(_, t)| t.disk).max().unwrap_or(0);
        out.push(b'"');
        put(&mut out, w[0].0.worker);
        out.extend_from_slice(b"\":{\"longest_matched\":");
        put(&mut out, gpu.max(cpu).max(disk) as u64);
        out.extend_from_slice(b",\"gpu\":");
        put(&mut out, gpu as u64);
        out.extend_from_slice(b",\"dp\":");
        put_device_prefixes(&mut out, w.iter());
        out.extend_from_slice(b",\"cpu\":");
        put(&mut out, cpu as u64);
        out.extend_from_slice(b",\"disk\":");
        put(&mut out, disk as u64);
        out.push(b'}');
    }
    out.extend_from_slice(b"}}");
    out
}

/// `{"rank": device prefix, …}` of `ranks`.
fn put_device_prefixes<'a>(
    out: &mut Vec<u8>,
    ranks: impl Iterator<Item = &'a (Source, RankTiers)>,
) {
    let mut num = itoa::Buffer::new();
    out.push(b'{');
    for (k, (s, t)) in ranks.enumerate() {
        if k > 0 {
            out.push(b',');
        }
        out.push(b'"');
        out.extend_from_slice(num.format(s.rank).as_bytes());
        out.extend_from_slice(b"\":");
        out.extend_from_slice(num.format(t.gpu).as_bytes());
    }
    out.push(b'}');
}

/// Each scored (worker, rank)'s tiers, cumulative (see the module
/// docs), in (worker, rank) order.
fn per_rank(scores: &[Score], scored: impl Fn(Source) -> bool) -> Vec<(Source, RankTiers)> {
    let mut raw: Vec<(Source, RankTiers)> = Vec::with_capacity(scores.len());
    for s in scores.iter().filter(|s| scored(s.source)) {
        let mut t = RankTiers::default();
        match s.medium {
            Medium::Gpu => t.gpu = s.tokens,
            Medium::Cpu => t.cpu = s.tokens,
            Medium::Disk | Medium::External => t.disk = s.tokens,
        }
        raw.push((s.source, t));
    }
    raw.sort_unstable_by_key(|(s, _)| *s);
    raw.dedup_by(|later, kept| {
        if later.0 != kept.0 {
            return false;
        }
        kept.1.gpu = kept.1.gpu.max(later.1.gpu);
        kept.1.cpu = kept.1.cpu.max(later.1.cpu);
        kept.1.disk = kept.1.disk.max(later.1.disk);
        true
    });
    for (_, t) in &mut raw {
        t.cpu = t.cpu.max(t.gpu);
        t.disk = t.disk.max(t.cpu);
    }
    raw
}

/// One worker in the Mooncake RFC's answer.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Engine {
    /// The longest of its levels.
    pub matched_tokens: usize,
    /// Each rank's device prefix, as `dp<rank>`.
    #[serde(rename = "L1")]
    pub l1: BTreeMap<String, usize>,
    /// Device or host (cumulative, as `cpu` above).
    #[serde(rename = "L2")]
    pub l2: usize,
    /// Any medium.
    #[serde(rename = "L3")]
    pub l3: usize,
}

/// The Mooncake RFC's answer: `{"data": {worker: …}}`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct MooncakeAnswer {
    /// Per worker.
    pub data: BTreeMap<String, Engine>,
}

/// The Mooncake RFC's shape of `scores`.
pub fn mooncake(scores: &[Score], scored: impl Fn(Source) -> bool) -> MooncakeAnswer {
    let mut out = MooncakeAnswer::default();
    for (s, t) in per_rank(scores, scored) {
        let e = out.data.entry(s.worker.to_string()).or_default();
        e.l1.insert(format!("dp{}", s.rank), t.gpu);
        e.l2 = e.l2.max(t.cpu);
        e.l3 = e.l3.max(t.disk);
        e.matched_tokens =
            e.l1.values()
                .copied()
                .max()
                .unwrap_or(0)
                .max(e.l2)
                .max(e.l3);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn medium() -> impl Strategy<Value = Medium> {
        prop_oneof![
            Just(Medium::Gpu),
            Just(Medium::Cpu),
            Just(Medium::Disk),
            Just(Medium::External)
        ]
    }

    proptest! {
        /// The written answer reads as the serialized one, for any scores
        /// (a source seen on several media, or twice on one), block size
        /// and filter.
        #[test]
        fn the_written_answer_is_the_serialized_one(
            raw in prop::collection::vec((0u64..12, 0u32..4, medium(), 0usize..200), 0..40),
            block in 1usize..20,
            skip in 0u64..14,
        ) {
            let scores: Vec<Score> = raw
                .into_iter()
                .map(|(worker, rank, medium, tokens)| Score { source: Source { worker, rank }, medium, tokens })
                .collect();
            let scored = |s: Source| s.worker != skip;
            let written: serde_json::Value = serde_json::from_slice(&dynamo_json(&scores, block, scored))
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(written, serde_json::to_value(dynamo(&scores, block, scored)).unwrap());
        }
    }

    fn score(worker: u64, rank: u32, medium: Medium, tokens: usize) -> Score {
        Score {
            source: Source { worker, rank },
            medium,
            tokens,
        }
    }

    #[test]
    fn tiers_are_cumulative_and_ranks_apart() {
        let s = [
            score(7, 0, Medium::Gpu, 32),
            score(7, 1, Medium::Gpu, 16),
            score(7, 1, Medium::Cpu, 48),
            score(9, 0, Medium::Disk, 16),
            score(11, 0, Medium::Gpu, 64),
        ];
        let a = dynamo(&s, 16, |src| src.worker != 11);
        let json = serde_json::to_value(&a).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "scores": {"7": {"0": 32, "1": 16}},
                "frequencies": [2, 1],
                "instances": {
                    "7": {"longest_matched": 48, "gpu": 32, "dp": {"0": 32, "1": 16}, "cpu": 48, "disk": 48},
                    "9": {"longest_matched": 16, "gpu": 0, "dp": {"0": 0}, "cpu": 0, "disk": 16}
                }
            })
        );
        let m = serde_json::to_value(mooncake(&s, |_| true)).unwrap();
        assert_eq!(
            m["data"]["7"],
            serde_json::json!({"matched_tokens": 48, "L1": {"dp0": 32, "dp1": 16}, "L2": 48, "L3": 48})
        );
        assert_eq!(m["data"]["11"]["matched_tokens"], 64);
    }
}
