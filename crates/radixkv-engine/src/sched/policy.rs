//! Waiting-queue ordering: SGLang 0.5.9's `SchedulePolicy.calc_priority`
//! (`python/sglang/srt/managers/schedule_policy.py`) over a [`RadixCache`].
//!
//! Before each prefill round a per-device scheduler reorders its waiting
//! queue with [`QueueOrderer::order`]; requests are then admitted from the
//! front. The rules, as in SGLang:
//!
//! | policy | order |
//! |---|---|
//! | `fcfs` (default) | the queue as it is (it is kept in arrival order); with priority scheduling, by priority, then [`Waiting::arrival`] |
//! | `lof` | longest [`Waiting::max_new_tokens`] first; with priority scheduling, by priority first |
//! | `random` | a seeded shuffle |
//! | `lpm` | longest cached prefix first, requests deprioritized by in-batch prefix caching last; `fcfs` when more than [`PolicyConfig::lpm_fallback_queue_len`] (128) wait |
//! | `dfs-weight` | a depth-first walk of the matched prefixes' tree, heavier subtrees first, each node's requests after its subtrees' |
//!
//! Every sort is stable: ties keep the queue's order (Python's `list.sort`).
//!
//! ## Prefix matching
//!
//! The cache-aware policies (`lpm`, `dfs-weight`) match every waiting
//! request against the cache with [`RadixCache::match_prefix`], which stamps
//! and splits like SGLang's `match_prefix`. The match never covers a
//! request's last token (it is on `tokens[..len - 1]`, whole pages), so
//! [`Waiting::prefix_len`] is the prefix the request will actually reuse at
//! admission ([`RadixCache::begin`](radixkv::RadixCache::begin); SGLang's
//! `Req._compute_max_prefix_len`, `input_len - 1`).
//!
//! ## In-batch prefix caching (`lpm`)
//!
//! A request whose cached prefix is at most
//! [`PolicyConfig::in_batch_check_threshold`] (32) tokens is matched against
//! a scratch radix tree of the queue, rebuilt on each call. If it shares at
//! least [`PolicyConfig::in_batch_deprioritize_threshold`] (32) tokens with
//! an earlier such request, it is deprioritized for this round (sorted after
//! all others): the earlier one computes the shared prefix once and caches
//! it; otherwise its tokens are added to the scratch tree. SGLang runs this
//! for `dfs-weight` as well but only `lpm` uses the result, so here it runs
//! for `lpm` only.
//!
//! ## `dfs-weight`
//!
//! SGLang groups the requests by the tree node their match ended at, weighs
//! every node by the number of requests ending in its subtree, and walks the
//! tree from the root: children by descending weight, then the node's own
//! requests (post-order), so requests at the root (no match) come last.
//! radixkv has no public node walk, so the tree is rebuilt from the
//! requests' matched prefixes (`namespace`, `tokens[..prefix_len]`): every
//! end node is a node of the real tree (the match splits there), and the real
//! tree restricted to the paths to those end nodes has the same branching,
//! so the walk emits the same order. Nodes of the real tree off those paths
//! weigh 0 and emit nothing. As in SGLang all namespaces hang off one root.
//! One deviation: SGLang breaks weight ties between siblings by the order the
//! children were created in the real tree, which is not observable here;
//! ties go to the sibling whose first request comes first in the queue.

use crate::rng::SplitMix64;
use crate::sched::scratch::PrefixSet;
use radixkv::{CacheError, DeviceId, Ownership, RadixCache, TokenKey};
use std::cmp::{Ordering, Reverse};
use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

/// A waiting-queue scheduling policy (SGLang's `--schedule-policy`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum SchedulePolicy {
    /// First come, first served: the queue order (arrival order).
    #[default]
    Fcfs,
    /// Longest output (`max_new_tokens`) first.
    Lof,
    /// A seeded random permutation.
    Random,
    /// Longest cached prefix first, with in-batch prefix caching.
    Lpm,
    /// Depth-first over the matched prefixes' tree, heavier subtrees first.
    DfsWeight,
}

impl SchedulePolicy {
    /// Every policy, in documentation order.
    pub const ALL: [SchedulePolicy; 5] = [
        SchedulePolicy::Fcfs,
        SchedulePolicy::Lof,
        SchedulePolicy::Random,
        SchedulePolicy::Lpm,
        SchedulePolicy::DfsWeight,
    ];

    /// The SGLang name: `fcfs`, `lof`, `random`, `lpm` or `dfs-weight`.
    pub fn name(self) -> &'static str {
        match self {
            SchedulePolicy::Fcfs => "fcfs",
            SchedulePolicy::Lof => "lof",
            SchedulePolicy::Random => "random",
            SchedulePolicy::Lpm => "lpm",
            SchedulePolicy::DfsWeight => "dfs-weight",
        }
    }

    /// Whether the policy matches the queue against the cache (SGLang's
    /// `CacheAwarePolicy`: `lpm`, `dfs-weight`).
    pub fn is_cache_aware(self) -> bool {
        matches!(self, SchedulePolicy::Lpm | SchedulePolicy::DfsWeight)
    }
}

/// An unknown scheduling policy name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown schedule policy {0:?} (expected one of fcfs, lof, random, lpm, dfs-weight)")]
pub struct UnknownSchedulePolicy(pub String);

impl FromStr for SchedulePolicy {
    type Err = UnknownSchedulePolicy;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        SchedulePolicy::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| UnknownSchedulePolicy(s.to_string()))
    }
}

impl fmt::Display for SchedulePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Settings of a [`QueueOrderer`]; [`Default`] is SGLang 0.5.9's defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyConfig {
    /// The policy (SGLang `--schedule-policy`, default `fcfs`).
    pub policy: SchedulePolicy,
    /// Order by [`Waiting::priority`] first, under `fcfs` and `lof` only
    /// (SGLang `--enable-priority-scheduling`, default off; the cache-aware
    /// policies and `random` ignore priorities, as in SGLang).
    pub priority_scheduling: bool,
    /// With priority scheduling, smaller priority values go first (SGLang
    /// `--schedule-low-priority-values-first`). Default `false`: larger
    /// values go first.
    pub low_priority_values_first: bool,
    /// `lpm` orders as `fcfs` (and matches nothing) when more than this many
    /// requests wait (128 in SGLang). `dfs-weight` never falls back.
    pub lpm_fallback_queue_len: usize,
    /// In-batch prefix caching checks requests whose cached prefix is at
    /// most this many tokens (SGLang `IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD`,
    /// 32); `None` turns in-batch prefix caching off (SGLang's `-1`).
    pub in_batch_check_threshold: Option<usize>,
    /// A checked request sharing at least this many tokens with an earlier
    /// checked one is deprioritized (SGLang
    /// `IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD`, 32).
    pub in_batch_deprioritize_threshold: usize,
    /// Seed of the `random` policy's generator.
    pub seed: u64,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig {
            policy: SchedulePolicy::Fcfs,
            priority_scheduling: false,
            low_priority_values_first: false,
            lpm_fallback_queue_len: 128,
            in_batch_check_threshold: Some(32),
            in_batch_deprioritize_threshold: 32,
            seed: 0,
        }
    }
}

impl PolicyConfig {
    /// The defaults with `policy`.
    pub fn new(policy: SchedulePolicy) -> Self {
        PolicyConfig {
            policy,
            ..PolicyConfig::default()
        }
    }
}

/// A request waiting for prefill, as the orderer sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Waiting {
    /// The caller's request id (reported back in
    /// [`OrderReport::deprioritized`]).
    pub id: u64,
    /// The request's tokens so far (prompt, then any generated ones).
    pub tokens: Arc<[u32]>,
    /// The cache namespace of its key (SGLang's `extra_key`).
    pub namespace: Option<Arc<str>>,
    /// Its priority (meaning set by [`PolicyConfig::low_priority_values_first`]).
    pub priority: i64,
    /// When it entered the waiting queue (SGLang's `wait_queue_entry_time`);
    /// any monotonic unit.
    pub arrival: u64,
    /// Its output budget (SGLang's `sampling_params.max_new_tokens`).
    pub max_new_tokens: usize,
    /// Tokens of its cached prefix on the device, set by
    /// [`QueueOrderer::order`] under a cache-aware policy, else 0.
    pub prefix_len: usize,
}

impl Waiting {
    /// A request in the default namespace with priority 0, `max_new_tokens`
    /// 0 and no prefix computed.
    pub fn new(id: u64, tokens: impl Into<Arc<[u32]>>, arrival: u64) -> Self {
        Waiting {
            id,
            tokens: tokens.into(),
            namespace: None,
            priority: 0,
            arrival,
            max_new_tokens: 0,
            prefix_len: 0,
        }
    }

    /// The same request in namespace `ns`.
    pub fn with_namespace(mut self, ns: impl Into<Arc<str>>) -> Self {
        self.namespace = Some(ns.into());
        self
    }

    /// The same request with priority `p`.
    pub fn with_priority(mut self, p: i64) -> Self {
        self.priority = p;
        self
    }

    /// The same request with output budget `n`.
    pub fn with_max_new_tokens(mut self, n: usize) -> Self {
        self.max_new_tokens = n;
        self
    }
}

/// What one [`QueueOrderer::order`] call did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OrderReport {
    /// The configured policy.
    pub configured: SchedulePolicy,
    /// The policy applied: the configured one, or `fcfs` when `lpm` fell
    /// back on a long queue.
    pub applied: SchedulePolicy,
    /// Ids of the requests that in-batch prefix caching deprioritized, in
    /// their order before the call (empty unless `lpm` was applied).
    pub deprioritized: Vec<u64>,
}

impl OrderReport {
    /// Whether `lpm` fell back to `fcfs` because the queue was too long.
    pub fn fell_back(&self) -> bool {
        self.applied != self.configured
    }

    /// Whether the queue was matched against the cache (a cache-aware
    /// policy applied) and [`Waiting::prefix_len`] is set.
    pub fn prefix_computed(&self) -> bool {
        self.applied.is_cache_aware()
    }
}

/// Orders a device's waiting queue by a [`SchedulePolicy`] (SGLang's
/// `SchedulePolicy`). One per scheduler; it keeps the `random` policy's
/// generator between calls.
///
/// ```
/// use radixkv_engine::sched::policy::{PolicyConfig, QueueOrderer, SchedulePolicy, Waiting};
/// use radixkv::{DeviceId, RadixCache, TokenKey};
///
/// let cache = RadixCache::builder().build()?;
/// cache.insert(TokenKey::new(&[1, 2, 3, 4]), DeviceId(0), &[10, 11, 12, 13], 0)?;
///
/// let mut queue = vec![
///     Waiting::new(7, vec![9, 9, 9], 0),       // nothing cached
///     Waiting::new(8, vec![1, 2, 5], 1),       // [1, 2] cached
///     Waiting::new(9, vec![1, 2, 3, 4, 5], 2), // [1, 2, 3, 4] cached
/// ];
/// let mut orderer = QueueOrderer::new(PolicyConfig::new("lpm".parse()?));
/// let report = orderer.order(&mut queue, &cache, DeviceId(0))?;
/// assert_eq!(report.applied, SchedulePolicy::Lpm);
/// let ids: Vec<u64> = queue.iter().map(|w| w.id).collect();
/// assert_eq!(ids, [9, 8, 7]);
/// assert_eq!(queue[0].prefix_len, 4);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct QueueOrderer {
    cfg: PolicyConfig,
    rng: SplitMix64,
}

impl QueueOrderer {
    /// An orderer with settings `cfg`.
    pub fn new(cfg: PolicyConfig) -> Self {
        let rng = SplitMix64::new(cfg.seed);
        QueueOrderer { cfg, rng }
    }

    /// Its settings.
    pub fn config(&self) -> &PolicyConfig {
        &self.cfg
    }

    /// The policy applied to a queue of `queue_len` requests (SGLang's
    /// `_determine_active_policy`): `fcfs` for `lpm` above
    /// [`PolicyConfig::lpm_fallback_queue_len`], else the configured one.
    pub fn active_policy(&self, queue_len: usize) -> SchedulePolicy {
        if self.cfg.policy == SchedulePolicy::Lpm && queue_len > self.cfg.lpm_fallback_queue_len {
            SchedulePolicy::Fcfs
        } else {
            self.cfg.policy
        }
    }

    /// Reorders `queue` in place, front first (SGLang's `calc_priority`),
    /// matching it against `cache` on `device` for the cache-aware policies.
    ///
    /// Sets every request's [`Waiting::prefix_len`] (0 unless a cache-aware
    /// policy applied). Fails only for a device the cache does not have,
    /// leaving the queue and the cache unchanged.
    pub fn order<P: Ownership>(
        &mut self,
        queue: &mut [Waiting],
        cache: &RadixCache<P>,
        device: DeviceId,
    ) -> Result<OrderReport, CacheError> {
        if device.index() >= cache.devices() {
            return Err(CacheError::UnknownDevice {
                device,
                devices: cache.devices(),
            });
        }
        let configured = self.cfg.policy;
        let applied = self.active_policy(queue.len());
        let mut report = OrderReport {
            configured,
            applied,
            deprioritized: Vec::new(),
        };
        if !applied.is_cache_aware() {
            for w in queue.iter_mut() {
                w.prefix_len = 0;
            }
        }
        match applied {
            // SGLang sorts by priority only when fcfs is the configured
            // policy, not when lpm falls back to it.
            SchedulePolicy::Fcfs => {
                if configured == SchedulePolicy::Fcfs && self.cfg.priority_scheduling {
                    let low_first = self.cfg.low_priority_values_first;
                    queue.sort_by(|a, b| {
                        by_priority(a.priority, b.priority, low_first)
                            .then(a.arrival.cmp(&b.arrival))
                    });
                }
            }
            SchedulePolicy::Lof => {
                if self.cfg.priority_scheduling {
                    let low_first = self.cfg.low_priority_values_first;
                    queue.sort_by(|a, b| {
                        by_priority(a.priority, b.priority, low_first)
                            .then(b.max_new_tokens.cmp(&a.max_new_tokens))
                    });
                } else {
                    queue.sort_by_key(|w| Reverse(w.max_new_tokens));
                }
            }
            SchedulePolicy::Random => self.rng.shuffle(queue),
            SchedulePolicy::Lpm => {
                match_queue(queue, cache, device)?;
                let dep = self.in_batch_deprioritized(queue);
                // SGLang's key: -prefix_len, or +inf when deprioritized (so
                // deprioritized requests keep their relative order).
                let mut order: Vec<usize> = (0..queue.len()).collect();
                order.sort_by_key(|&i| {
                    if dep[i] {
                        (1, 0)
                    } else {
                        (0, usize::MAX - queue[i].prefix_len)
                    }
                });
                report.deprioritized = (0..queue.len())
                    .filter(|&i| dep[i])
                    .map(|i| queue[i].id)
                    .collect();
                permute(queue, &order);
            }
            SchedulePolicy::DfsWeight => {
                match_queue(queue, cache, device)?;
                let order = dfs_weight_order(queue);
                permute(queue, &order);
            }
        }
        Ok(report)
    }

    /// In-batch prefix caching (SGLang's second half of
    /// `_compute_prefix_matches`): which requests, in queue order, to
    /// deprioritize. Uses full token lists in a [`PrefixSet`] (page size 1), as
    /// SGLang's simulated `waiting_queue_radix_tree` does.
    fn in_batch_deprioritized(&self, queue: &[Waiting]) -> Vec<bool> {
        let mut dep = vec![false; queue.len()];
        let Some(check) = self.cfg.in_batch_check_threshold else {
            return dep;
        };
        let mut scratch = PrefixSet::default();
        for (i, w) in queue.iter().enumerate() {
            if w.prefix_len > check {
                continue;
            }
            let ns = w.namespace.as_deref();
            if scratch.match_len(ns, &w.tokens) >= self.cfg.in_batch_deprioritize_threshold {
                dep[i] = true;
            } else {
                scratch.insert(ns, &w.tokens);
            }
        }
        dep
    }
}

/// Priority order: larger values first, or smaller ones with `low_first`.
fn by_priority(a: i64, b: i64, low_first: bool) -> Ordering {
    if low_first {
        a.cmp(&b)
    } else {
        b.cmp(&a)
    }
}

/// Sets every request's `prefix_len` to its match on `tokens[..len - 1]`
/// (all or none: on an error no `prefix_len` changes).
fn match_queue<P: Ownership>(
    queue: &mut [Waiting],
    cache: &RadixCache<P>,
    device: DeviceId,
) -> Result<(), CacheError> {
    let mut lens = Vec::with_capacity(queue.len());
    for w in queue.iter() {
        let n = w.tokens.len().saturating_sub(1);
        let key = TokenKey::new(&w.tokens[..n]).in_namespace(w.namespace.as_deref());
        lens.push(cache.match_prefix(key, device)?.len);
    }
    for (w, len) in queue.iter_mut().zip(lens) {
        w.prefix_len = len;
    }
    Ok(())
}

/// Rearranges `items` so that the new `items[i]` is the old
/// `items[order[i]]`; `order` must be a permutation of `0..items.len()`.
fn permute<T>(items: &mut [T], order: &[usize]) {
    debug_assert_eq!(items.len(), order.len());
    let mut done = vec![false; items.len()];
    for start in 0..items.len() {
        if done[start] {
            continue;
        }
        let mut j = start;
        loop {
            done[j] = true;
            let k = order[j];
            if k == start {
                break;
            }
            items.swap(j, k);
            j = k;
        }
    }
}

/// The `dfs-weight` order of `queue` (indices), from each request's
/// matched prefix `(namespace, tokens[..prefix_len])`: see the module docs.
///
/// Walks a compressed trie of the prefixes with an explicit stack: a node is
/// a group of requests sharing `tokens[..depth]` (and the namespace below
/// the root); its requests are those whose prefix ends at `depth`, its
/// children the other requests grouped by next token. A child's depth skips
/// to its next branch or end point (chains of one child emit nothing).
fn dfs_weight_order(queue: &[Waiting]) -> Vec<usize> {
    enum Task {
        Visit(Vec<usize>, usize),
        Emit(Vec<usize>),
    }
    let prefix = |i: usize| &queue[i].tokens[..queue[i].prefix_len.min(queue[i].tokens.len())];
    let mut out = Vec::with_capacity(queue.len());
    let mut stack = vec![Task::Visit((0..queue.len()).collect(), 0)];
    while let Some(task) = stack.pop() {
        let (group, depth) = match task {
            Task::Emit(here) => {
                out.extend(here);
                continue;
            }
            Task::Visit(group, depth) => (group, depth),
        };
        let mut here = Vec::new();
        let mut children: Vec<Vec<usize>> = Vec::new();
        let mut slot: HashMap<(Option<&str>, u32), usize> = HashMap::new();
        for i in group {
            let p = prefix(i);
            match p.get(depth) {
                None => here.push(i),
                Some(&t) => {
                    let key = (queue[i].namespace.as_deref(), t);
                    let c = *slot.entry(key).or_insert_with(|| {
                        children.push(Vec::new());
                        children.len() - 1
                    });
                    children[c].push(i);
                }
            }
        }
        // Heavier subtrees first; ties keep first appearance (stable).
        children.sort_by_key(|c| Reverse(c.len()));
        stack.push(Task::Emit(here));
        for child in children.into_iter().rev() {
            // Skip to where the child's requests branch or one ends.
            let first = prefix(child[0]);
            let end = child
                .iter()
                .map(|&i| prefix(i).len())
                .min()
                .unwrap_or(depth);
            let mut d = depth + 1;
            while d < end && child.iter().all(|&i| prefix(i)[d] == first[d]) {
                d += 1;
            }
            stack.push(Task::Visit(child, d));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(id: u64, tokens: &[u32], prefix_len: usize) -> Waiting {
        let mut w = Waiting::new(id, tokens.to_vec(), id);
        w.prefix_len = prefix_len;
        w
    }

    #[test]
    fn permute_applies_the_order() {
        let mut v = vec!['a', 'b', 'c', 'd', 'e'];
        permute(&mut v, &[3, 0, 4, 1, 2]);
        assert_eq!(v, ['d', 'a', 'e', 'b', 'c']);
        let mut v = vec![1, 2, 3];
        permute(&mut v, &[0, 1, 2]);
        assert_eq!(v, [1, 2, 3]);
    }

    #[test]
    fn dfs_weight_post_order_by_descending_weight() {
        // Prefixes: root ─ [1,2] ─┬─ [3] (ids 1, 2) ─ [4,5] (id 3)
        //                         └─ [7] (id 4)
        //                ─ [9] (id 5, 6)
        // and id 0 at the root. Weights: [1,2]=4, [9]=2; [3]=3, [7]=1.
        let q = vec![
            w(0, &[8, 8], 0),
            w(1, &[1, 2, 3, 0], 3),
            w(2, &[1, 2, 3, 1], 3),
            w(3, &[1, 2, 3, 4, 5, 0], 5),
            w(4, &[1, 2, 7, 0], 3),
            w(5, &[9, 0], 1),
            w(6, &[9, 1], 1),
        ];
        let order: Vec<u64> = dfs_weight_order(&q).iter().map(|&i| q[i].id).collect();
        assert_eq!(order, [3, 1, 2, 4, 5, 6, 0]);
    }

    #[test]
    fn dfs_weight_ties_go_to_first_appearance_and_namespaces_split() {
        let q = vec![
            w(0, &[5, 0], 1).with_namespace("b"),
            w(1, &[5, 0], 1),
            w(2, &[5, 1], 1).with_namespace("b"),
            w(3, &[6, 0], 1),
        ];
        // Root children: (b,5) weight 2, (None,5) weight 1, (None,6) weight 1.
        let order: Vec<u64> = dfs_weight_order(&q).iter().map(|&i| q[i].id).collect();
        assert_eq!(order, [0, 2, 1, 3]);
    }

    #[test]
    fn shuffle_is_a_seeded_permutation() {
        let mut a: Vec<u32> = (0..50).collect();
        let mut b = a.clone();
        SplitMix64::new(7).shuffle(&mut a);
        SplitMix64::new(7).shuffle(&mut b);
        assert_eq!(a, b);
        assert_ne!(a, (0..50).collect::<Vec<_>>());
        let mut s = a.clone();
        s.sort_unstable();
        assert_eq!(s, (0..50).collect::<Vec<_>>());
    }
}
