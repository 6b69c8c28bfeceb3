//! The request streams: W1, W2 and a Mooncake trace, in arrival order, with
//! each request's device, values and Dynamo block hashes precomputed.

use crate::dynamo;
use dynamo_kv_router::protocols::LocalBlockHash;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

/// One request: its tokens (whole pages), the device it is stored on, and
/// Dynamo's hashes of its blocks.
pub struct Request {
    /// Token ids, a multiple of the page size long.
    pub tokens: Vec<u32>,
    /// The device (Dynamo worker) that stores it.
    pub device: usize,
    /// First value of its page run (values are `base..base + len`).
    pub base: u32,
    /// Dynamo's local block hashes.
    pub local: Vec<LocalBlockHash>,
    /// Dynamo's sequence hashes (external block ids).
    pub seq: Vec<u64>,
    /// The local hashes as SMG's index takes its content hashes.
    pub content: Vec<u64>,
}

impl Request {
    /// The values radixkv stores for it (a fresh allocator's page run).
    pub fn values_into(&self, out: &mut Vec<u32>) {
        out.clear();
        out.extend(self.base..self.base + self.tokens.len() as u32);
    }
}

/// A workload: requests stored in `stored` order, then queried; `fresh`
/// requests (same prompts, new suffixes) for the mixed phases.
pub struct Workload {
    /// Short name used in JSON keys.
    pub name: String,
    /// What it is, for the report.
    pub about: String,
    /// Requests in arrival order.
    pub stored: Vec<Request>,
    /// Requests not stored before the mixed phases.
    pub fresh: Vec<Request>,
    /// Page size (Dynamo block size).
    pub page: usize,
    /// The tokens every request of a prompt shares (whole pages), for the
    /// shared-prefix workloads.
    pub shared_len: Option<usize>,
    /// Devices (Dynamo workers).
    pub devices: usize,
}

fn random_tokens(rng: &mut StdRng, n: usize) -> Vec<u32> {
    (0..n).map(|_| rng.random_range(0..128_000)).collect()
}

/// The content hashes of `local` as SMG's index takes them
/// (Dynamo's local hashes, as they are).
pub(crate) fn contents(local: &[LocalBlockHash]) -> Vec<u64> {
    local.iter().map(|h| h.0).collect()
}

/// Builds a request, hashing it once with Dynamo's functions.
pub fn request(tokens: Vec<u32>, device: usize, base: u32, page: usize) -> Request {
    let local = dynamo::local_hashes(&tokens, page as u32);
    let seq = dynamo::sequence_hashes(&local);
    let content = contents(&local);
    Request {
        tokens,
        device,
        base,
        local,
        seq,
        content,
    }
}

/// `groups` prompts of `prompt` tokens, `per_group` requests each with a
/// unique `suffix`-token suffix, cut to whole pages; arrival shuffled
/// (requests of different prompts interleave, as in serving) unless
/// `in_order`; device = arrival index mod `devices`.
#[allow(clippy::too_many_arguments)]
pub fn shared_prefix(
    name: &str,
    groups: usize,
    per_group: usize,
    prompt: usize,
    suffix: usize,
    page: usize,
    devices: usize,
    in_order: bool,
    seed: u64,
) -> Workload {
    let mut rng = StdRng::seed_from_u64(seed);
    let prompts: Vec<Vec<u32>> = (0..groups)
        .map(|_| random_tokens(&mut rng, prompt))
        .collect();
    let len = (prompt + suffix) / page * page;
    let mut next_base = 0u32;
    let mut make = |rng: &mut StdRng, n: usize| -> Vec<Request> {
        let mut keys: Vec<Vec<u32>> = Vec::with_capacity(groups * n);
        for _ in 0..n {
            for p in &prompts {
                let mut k = p.clone();
                k.extend(random_tokens(rng, suffix));
                k.truncate(len);
                keys.push(k);
            }
        }
        if !in_order {
            keys.shuffle(rng);
        }
        keys.into_iter()
            .enumerate()
            .map(|(i, k)| {
                let base = next_base;
                next_base += k.len() as u32;
                request(k, i % devices, base, page)
            })
            .collect()
    };
    let stored = make(&mut rng, per_group);
    let fresh = make(&mut rng, per_group.div_ceil(2));
    Workload {
        name: name.to_string(),
        about: format!(
            "{groups} prompts x {prompt} tokens, {per_group} requests each with a unique {suffix}-token suffix ({len} tokens), page {page}, {devices} devices, {} arrival",
            if in_order { "prompt-order" } else { "shuffled" }
        ),
        stored,
        fresh,
        page,
        shared_len: Some(prompt / page * page),
        devices,
    }
}

/// A Mooncake trace in its own order, cut to whole pages; device = request
/// index mod `devices`. `limit` caps the requests (0: all).
pub fn mooncake(
    path: &std::path::Path,
    page: usize,
    devices: usize,
    limit: usize,
) -> Result<Workload, String> {
    let trace = radixkv_tools::trace::read_mooncake(path).map_err(|e| e.to_string())?;
    let n = if limit == 0 {
        trace.requests.len()
    } else {
        trace.requests.len().min(limit)
    };
    let mut next_base = 0u32;
    let mut stored = Vec::with_capacity(n);
    for i in 0..n {
        let mut t = trace.tokens(i).to_vec();
        t.truncate(t.len() / page * page);
        if t.is_empty() {
            continue;
        }
        let base = next_base;
        next_base = next_base
            .checked_add(t.len() as u32)
            .ok_or("trace too large for 32-bit values")?;
        stored.push(request(t, i % devices, base, page));
    }
    Ok(Workload {
        name: "mooncake".into(),
        about: format!(
            "{} ({} requests in trace order, page {page}, {devices} devices)",
            path.display(),
            stored.len()
        ),
        stored,
        fresh: Vec::new(),
        page,
        shared_len: None,
        devices,
    })
}
