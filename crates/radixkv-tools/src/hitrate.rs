//! Hit-rate evaluation (`radixkv hitrate`): replays a [`Trace`] through a
//! single-device cache that owns a pool of a given size, with each
//! request's real lifecycle (match and pin the cached prefix, allocate the
//! rest, evicting on shortage, insert at completion), and reports the share
//! of input tokens served from the cache, per policy and capacity, beside
//! an offline bound: Belady's MIN over the same pages.
//!
//! Requests come from [`crate::trace`], the same readers and generators as
//! the engine's replay; this is the fast policy sweep (one device, no
//! timing, every request finishes before the next one starts).

use crate::trace::{PageIds, Trace, TraceError, UNIQUE};
use radixkv::{CacheError, DeviceId, EvictionPolicy, PagedCache, RadixCache, TokenKey};
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Errors of the evaluation.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HitrateError {
    /// The trace could not be read or used.
    #[error(transparent)]
    Trace(#[from] TraceError),
    /// The cache could not be built or used.
    #[error(transparent)]
    Cache(#[from] CacheError),
    /// Settings that cannot work.
    #[error("{0}")]
    Invalid(String),
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
    /// The host tier's capacity as a share of the distinct tokens (0:
    /// none; Belady's row is always without one).
    pub host_capacity: f64,
    /// The host tier's pages (0: none).
    pub host_pages: usize,
    /// Input tokens loaded from the host tier (written back there before
    /// the device evicted them) / all input tokens.
    pub host_rate_tokens: f64,
    /// The prefill budget the next two fields count against, in tokens
    /// (the setup's tlru threshold, for every policy alike).
    pub budget_tokens: u64,
    /// Requests that had to compute more than the budget (input tokens
    /// neither cached nor loaded from the host) / all requests: those
    /// whose first token is late (tlru's aim). `None` for Belady's row.
    pub over_budget_requests: Option<f64>,
    /// Tokens computed past the budget, summed over requests, / all input
    /// tokens (how late, in tokens). `None` for Belady's row.
    pub excess_tokens: Option<f64>,
}

/// What a replay measured.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Replayed {
    /// Input tokens served from the device's cache / all input tokens.
    pub hit_rate: f64,
    /// Input tokens loaded from the host tier / all input tokens.
    pub host_rate: f64,
    /// Tokens the device evicted.
    pub evicted_tokens: u64,
    /// Requests that computed more than the budget / all requests (see
    /// [`HitRow::over_budget_requests`]).
    pub over_budget_requests: f64,
    /// Tokens computed past the budget / all input tokens.
    pub excess_tokens: f64,
}

/// An eviction policy with the settings the evaluation builds its cache
/// with; an [`EvictionPolicy`] alone converts with the defaults.
///
/// ```
/// use radixkv::EvictionPolicy;
/// use radixkv_tools::hitrate::PolicySetup;
/// let lru = PolicySetup::from(EvictionPolicy::Lru);
/// assert_eq!(lru.tlru_threshold, 0);
/// let tlru = PolicySetup { policy: EvictionPolicy::Tlru, ..lru }.with_tlru(4096, 512);
/// assert_eq!((tlru.tlru_threshold, tlru.tlru_next_prompt_estimate), (4096, 512));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PolicySetup {
    /// The order.
    pub policy: EvictionPolicy,
    /// Tlru's prefill budget in tokens
    /// ([`RadixCacheBuilder::tlru_threshold`](radixkv::RadixCacheBuilder::tlru_threshold)).
    pub tlru_threshold: u64,
    /// Tlru's next prompt estimate in tokens
    /// ([`RadixCacheBuilder::tlru_next_prompt_estimate`](radixkv::RadixCacheBuilder::tlru_next_prompt_estimate)).
    pub tlru_next_prompt_estimate: u64,
}

impl PolicySetup {
    /// The same policy with tlru's budget `threshold` and estimate
    /// `next_prompt_estimate`, in tokens (other policies ignore them).
    pub fn with_tlru(self, threshold: u64, next_prompt_estimate: u64) -> Self {
        PolicySetup {
            tlru_threshold: threshold,
            tlru_next_prompt_estimate: next_prompt_estimate,
            ..self
        }
    }
}

impl From<EvictionPolicy> for PolicySetup {
    fn from(policy: EvictionPolicy) -> Self {
        PolicySetup {
            policy,
            tlru_threshold: 0,
            tlru_next_prompt_estimate: 0,
        }
    }
}

/// Replays `trace` with `policy` through a pool of `pages` pages; returns
/// the hit rate in tokens and the tokens evicted.
pub fn replay(
    trace: &Trace,
    policy: impl Into<PolicySetup>,
    page_size: usize,
    pages: usize,
) -> Result<(f64, u64), HitrateError> {
    replay_with_host(trace, policy, page_size, pages, None).map(|r| (r.hit_rate, r.evicted_tokens))
}

/// [`replay`] with a host tier of `host_pages` pages behind the device
/// (write-back: the device's victims are written there before they go, by
/// the same policy; a request loads from it what the device lacks).
/// Returns the device's hit rate, the host's load rate (both shares of
/// the input tokens), the tokens the device evicted, and what requests
/// computed past a budget of the setup's tlru threshold.
pub fn replay_with_host(
    trace: &Trace,
    policy: impl Into<PolicySetup>,
    page_size: usize,
    pages: usize,
    host_pages: Option<usize>,
) -> Result<Replayed, HitrateError> {
    let setup = policy.into();
    let mut b = RadixCache::builder()
        .page_size(page_size)
        .eviction_policy(setup.policy)
        .tlru_threshold(setup.tlru_threshold)
        .tlru_next_prompt_estimate(setup.tlru_next_prompt_estimate)
        .pages_per_device(pages.saturating_add(1));
    if let Some(h) = host_pages {
        b = b.host_pages(h.saturating_add(1));
    }
    let cache = Arc::new(b.build()?);
    let d = DeviceId(0);
    let host = cache.has_host_tier().then_some(radixkv::Tier::Host);
    let (mut hit, mut loaded, mut total, mut adopted) = (0u64, 0u64, 0u64, 0u64);
    let (mut over, mut excess) = (0u64, 0u64);
    let mut tokens = Vec::new();
    let ps = page_size as u64;
    let free = |c: &PagedCache| c.allocator(d).map_or(0, |a| a.free_pages() as u64 * ps);
    for i in 0..trace.requests.len() {
        trace.tokens_into(i, &mut tokens);
        let mut req = cache.begin(TokenKey::new(&tokens), d)?;
        hit += req.cached_len() as u64;
        total += tokens.len() as u64;
        let mut computed = (tokens.len() - req.cached_len()) as u64;
        if let Some(h) = host {
            // Room for the load and the rest first, writing victims back.
            let need = (tokens.len() - req.cached_len()) as u64;
            let have = free(&cache);
            if have < need {
                cache.evict_with_write_back(d, (need - have) as usize, |_| true)?;
            }
            if let Ok(Some(copy)) = req.copy_from(h) {
                let n = copy.range().len() as u64;
                if copy.complete().is_ok() {
                    loaded += n;
                    computed = computed.saturating_sub(n);
                }
            }
        }
        if computed > setup.tlru_threshold {
            over += 1;
            excess += computed - setup.tlru_threshold;
        }
        // The request computes the rest; with no room even after eviction
        // (a request larger than the pool), nothing of it is cached.
        if req.reserve().is_ok() {
            let done = req.finish()?;
            adopted += done.adopted.iter().map(|a| a.len() as u64).sum::<u64>();
        }
    }
    // Every adopted token is either still cached or was evicted.
    let cached = cache.sizes(d)?.total as u64;
    let share = |n: u64| n as f64 / total.max(1) as f64;
    Ok(Replayed {
        hit_rate: share(hit),
        host_rate: share(loaded),
        evicted_tokens: adopted.saturating_sub(cached),
        over_budget_requests: over as f64 / trace.requests.len().max(1) as f64,
        excess_tokens: share(excess),
    })
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
    policies: &[impl Into<PolicySetup> + Copy],
    capacities: &[f64],
    page_size: usize,
) -> Result<Vec<HitRow>, HitrateError> {
    check_page_size(page_size)?;
    let distinct = trace.distinct_tokens(page_size);
    evaluate_sized(trace, policies, capacities, page_size, distinct)
}

/// Like [`evaluate`], for a caller that already knows
/// [`Trace::distinct_tokens`] at this page size.
pub fn evaluate_sized(
    trace: &Trace,
    policies: &[impl Into<PolicySetup> + Copy],
    capacities: &[f64],
    page_size: usize,
    distinct: usize,
) -> Result<Vec<HitRow>, HitrateError> {
    let sizes = share_sizes(capacities, distinct, page_size)?;
    evaluate_at(trace, policies, &sizes, page_size, None)
}

/// Pages for a capacity given as a share of `distinct` tokens.
fn pages_of(c: f64, distinct: usize, page_size: usize) -> Result<usize, HitrateError> {
    if !(c > 0.0 && c.is_finite()) {
        return Err(HitrateError::Invalid(format!(
            "capacity {c} is not a positive fraction"
        )));
    }
    Ok(((distinct as f64 * c) / page_size as f64).ceil().max(2.0) as usize)
}

fn check_page_size(page_size: usize) -> Result<(), HitrateError> {
    if page_size == 0 {
        return Err(HitrateError::Invalid("page size must be at least 1".into()));
    }
    Ok(())
}

/// `(share, pages)` of capacities given as shares of `distinct` tokens.
fn share_sizes(
    capacities: &[f64],
    distinct: usize,
    page_size: usize,
) -> Result<Vec<(f64, usize)>, HitrateError> {
    check_page_size(page_size)?;
    capacities
        .iter()
        .map(|&c| Ok((c, pages_of(c, distinct, page_size)?)))
        .collect()
}

/// `(share, pages)` of pool sizes given in pages.
fn page_sizes(
    pages: &[usize],
    distinct: usize,
    page_size: usize,
) -> Result<Vec<(f64, usize)>, HitrateError> {
    check_page_size(page_size)?;
    if distinct == 0 {
        return Err(HitrateError::Invalid(format!(
            "the trace has no whole page of {page_size} tokens: a capacity in pages has no share"
        )));
    }
    pages
        .iter()
        .map(|&p| {
            if p == 0 {
                return Err(HitrateError::Invalid("a pool needs at least 1 page".into()));
            }
            Ok(((p as f64 * page_size as f64) / distinct as f64, p))
        })
        .collect()
}

/// Like [`evaluate_sized`] (or, with `pages`, [`evaluate_pages`]) with a
/// host tier of `host` × the distinct tokens behind the device, written
/// back on eviction (`radixkv hitrate --host-capacity`). Belady's rows
/// stay the device-only bound.
pub fn evaluate_with_host(
    trace: &Trace,
    policies: &[impl Into<PolicySetup> + Copy],
    capacities: &[f64],
    pages: &[usize],
    page_size: usize,
    distinct: usize,
    host: f64,
) -> Result<Vec<HitRow>, HitrateError> {
    let mut sizes = share_sizes(capacities, distinct, page_size)?;
    if !pages.is_empty() {
        sizes.extend(page_sizes(pages, distinct, page_size)?);
    }
    let host_pages = pages_of(host, distinct, page_size).map_err(|_| {
        HitrateError::Invalid(format!("host capacity {host} is not a positive fraction"))
    })?;
    evaluate_at(trace, policies, &sizes, page_size, Some((host, host_pages)))
}

/// Like [`evaluate_sized`] with absolute pool sizes in pages; each row's
/// capacity is `pages · page_size / distinct`.
pub fn evaluate_pages(
    trace: &Trace,
    policies: &[impl Into<PolicySetup> + Copy],
    pages: &[usize],
    page_size: usize,
    distinct: usize,
) -> Result<Vec<HitRow>, HitrateError> {
    let sizes = page_sizes(pages, distinct, page_size)?;
    evaluate_at(trace, policies, &sizes, page_size, None)
}

/// Rows for every `(capacity share, pages)` and policy, plus Belady's.
fn evaluate_at(
    trace: &Trace,
    policies: &[impl Into<PolicySetup> + Copy],
    sizes: &[(f64, usize)],
    page_size: usize,
    host: Option<(f64, usize)>,
) -> Result<Vec<HitRow>, HitrateError> {
    let plan = next_uses(trace, page_size)?;
    let mut rows = Vec::new();
    for &(capacity, pages) in sizes {
        let row = |policy: String, r: Replayed, budget: Option<u64>| {
            let (host_capacity, host_pages) = match host {
                Some(h) if budget.is_some() => h,
                _ => (0.0, 0),
            };
            HitRow {
                trace: trace.name.clone(),
                policy,
                capacity,
                pages,
                hit_rate_tokens: r.hit_rate,
                evicted_tokens: r.evicted_tokens,
                host_capacity,
                host_pages,
                host_rate_tokens: r.host_rate,
                budget_tokens: budget.unwrap_or(0),
                over_budget_requests: budget.map(|_| r.over_budget_requests),
                excess_tokens: budget.map(|_| r.excess_tokens),
            }
        };
        for &p in policies {
            let p: PolicySetup = p.into();
            let r = replay_with_host(trace, p, page_size, pages, host.map(|h| h.1))?;
            rows.push(row(p.policy.to_string(), r, Some(p.tlru_threshold)));
        }
        let (rate, evicted) = belady_with(&plan, page_size, pages);
        let bound = Replayed {
            hit_rate: rate,
            host_rate: 0.0,
            evicted_tokens: evicted,
            over_budget_requests: 0.0,
            excess_tokens: 0.0,
        };
        rows.push(row("belady".into(), bound, None));
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{chat, gsp, BlockTrie, ChatShape, Prompt, TraceRequest};

    fn small_chat(seed: u64) -> Trace {
        let shape = ChatShape {
            conversations: 3,
            turns: 3,
            system: 16,
            user: 8,
            assistant: 8,
            ..ChatShape::default()
        };
        chat(&shape, seed)
    }

    #[test]
    fn requests_over_the_budget_are_counted_from_what_each_computed() {
        // With room for everything, a request computes what no earlier
        // request shares with it, in whole pages: counted here directly.
        let t = small_chat(5);
        let ps = 4;
        let reqs: Vec<Vec<u32>> = (0..t.requests.len())
            .map(|i| {
                let mut v = Vec::new();
                t.tokens_into(i, &mut v);
                v
            })
            .collect();
        let computed: Vec<u64> = (0..reqs.len())
            .map(|i| {
                let shared = (0..i)
                    .map(|j| {
                        let n = reqs[i]
                            .iter()
                            .zip(&reqs[j])
                            .take_while(|(a, b)| a == b)
                            .count();
                        n / ps * ps
                    })
                    .max()
                    .unwrap_or(0);
                (reqs[i].len() - shared) as u64
            })
            .collect();
        let input: u64 = reqs.iter().map(|r| r.len() as u64).sum();
        for budget in [0, 8, 20] {
            let setup = PolicySetup::from(EvictionPolicy::Lru).with_tlru(budget, 0);
            let r = replay_with_host(&t, setup, ps, 1 << 16, None).unwrap();
            let over = computed.iter().filter(|&&c| c > budget).count();
            let excess: u64 = computed.iter().map(|&c| c.saturating_sub(budget)).sum();
            assert!(over > 0, "budget {budget}: the trace has requests past it");
            assert_eq!(r.over_budget_requests, over as f64 / reqs.len() as f64);
            assert_eq!(r.excess_tokens, excess as f64 / input as f64);
        }
    }

    #[test]
    fn belady_bounds_every_policy_and_infinite_capacity_hits_the_shared_part() {
        let t = gsp(8, 6, 256, 32, 4, 3);
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
            let traces = [gsp(3, 4, 32, 8, 4, seed), small_chat(seed)];
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
                    arrival_ms: 0.0,
                    output_len: 0,
                    output_tokens: None,
                    prompt: Prompt::Blocks {
                        last: Some(b),
                        blocks: 2,
                        tail_start: base,
                        tail: 3,
                    },
                },
                TraceRequest {
                    arrival_ms: 1.0,
                    output_len: 0,
                    output_tokens: None,
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
        assert_eq!(t.tokens(0)[..], [0, 1, 2, 3, 4, 5, 6, 7, 12, 13, 14]);
        assert_eq!(t.tokens(1)[..], [0, 1, 2, 3, 8, 9, 10, 11]);
        assert_eq!(t.input_len(0), 11);
        // Pages of 2: block a's two pages are shared; b's, c's and the
        // tail's are not (the last tail token makes no whole page).
        assert_eq!(t.distinct_tokens(2), (2 + 2 + 2 + 1) * 2);
        // Pages of 3 straddle blocks: [0 1 2] is shared; [3 4 5] and
        // [6 7 12] (tail) are request 0's, [3 8 9] request 1's.
        assert_eq!(t.distinct_tokens(3), (1 + 2 + 1) * 3);
        for ps in 1..=9 {
            let literal = Trace::from_tokens(
                "l",
                vec![(0.0, t.tokens(0).to_vec()), (1.0, t.tokens(1).to_vec())],
            );
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
