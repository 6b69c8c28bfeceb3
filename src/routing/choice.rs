//! The cache-aware choice of a device (or a data-parallel rank) for a
//! request, from each one's load and the prefix of the request it holds or
//! was sent: [`choose`] under a [`CacheAwarePolicy`]. The engine's router
//! and the index's data-parallel router (`radixkv_index::dp`) both route
//! by it.
//!
//! The rule is sgl-router's: when the load is imbalanced (the busiest has
//! more than [`CacheAwarePolicy::balance_abs`] and more than
//! [`CacheAwarePolicy::balance_rel`] times the least busy), the least
//! loaded; otherwise the longest prefix, ties to the less loaded, then to
//! the one caching fewer tokens (a prefix nobody has goes to the smallest
//! cache, so that new prefixes spread), then to the lower index.

/// The knobs of [`choose`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CacheAwarePolicy {
    /// Imbalanced only if the busiest has a load above this (default 32).
    pub balance_abs: usize,
    /// …and above this many times the least busy one's (default 1.5).
    pub balance_rel: f64,
    /// Devices can copy prefixes from each other: a prefix held elsewhere
    /// costs a copy, not a recomputation, so only the devices within
    /// [`copy_slack`](Self::copy_slack) of the least loaded compete on
    /// their prefixes (default false: all do).
    pub copies: bool,
    /// With `copies`: how much more loaded than the least loaded a device
    /// may be and still win on its prefix (default 2).
    pub copy_slack: usize,
    /// With `copies`: the slack when the longest prefix has at least
    /// [`long_prefix_tokens`](Self::long_prefix_tokens) tokens (default 16).
    pub copy_slack_long: usize,
    /// What counts as a long prefix (default: never).
    pub long_prefix_tokens: usize,
}

impl Default for CacheAwarePolicy {
    fn default() -> Self {
        CacheAwarePolicy {
            balance_abs: 32,
            balance_rel: 1.5,
            copies: false,
            copy_slack: 2,
            copy_slack_long: 16,
            long_prefix_tokens: usize::MAX,
        }
    }
}

/// Where a request goes, and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Choice {
    /// The device (or rank).
    pub device: usize,
    /// The prefix expected there (cached or dispatched), in tokens; 0 when
    /// balancing chose.
    pub expected_prefix: usize,
    /// Whether load balancing overrode the longest prefix.
    pub balanced: bool,
}

impl CacheAwarePolicy {
    /// Whether `load` is imbalanced under this policy.
    pub fn imbalanced(&self, load: &[usize]) -> bool {
        let max = load.iter().copied().max().unwrap_or(0);
        let min = load.iter().copied().min().unwrap_or(0);
        max > self.balance_abs && max as f64 > min as f64 * self.balance_rel
    }
}

/// The least loaded of `load` (the lowest index among equals); 0 if empty.
pub fn least_loaded(load: &[usize]) -> usize {
    (0..load.len()).min_by_key(|&d| (load[d], d)).unwrap_or(0)
}

/// Chooses among `load.len()` devices: see the module docs. `prefixes`
/// gives each device's prefix of the request in tokens (read only when
/// the load is balanced; missing entries count as 0), `resident` each
/// device's cached tokens (read once per device at most).
///
/// ```
/// use radixkv::routing::{choose, CacheAwarePolicy};
/// let p = CacheAwarePolicy::default();
/// // The longest prefix wins...
/// let c = choose(&p, &[3, 0], || vec![64, 16], |_| 0);
/// assert_eq!((c.device, c.expected_prefix, c.balanced), (0, 64, false));
/// // ...unless the load is imbalanced (40 > 32 and 40 > 1.5 x 2).
/// let c = choose(&p, &[40, 2], || vec![64, 16], |_| 0);
/// assert_eq!((c.device, c.balanced), (1, true));
/// // Equal prefixes: the less loaded, then the smaller cache.
/// assert_eq!(choose(&p, &[1, 0], || vec![0, 0], |_| 0).device, 1);
/// assert_eq!(choose(&p, &[0, 0], || vec![0, 0], |d| [500, 100][d]).device, 1);
/// ```
pub fn choose(
    policy: &CacheAwarePolicy,
    load: &[usize],
    prefixes: impl FnOnce() -> Vec<usize>,
    resident: impl Fn(usize) -> usize,
) -> Choice {
    if policy.imbalanced(load) {
        return Choice {
            device: least_loaded(load),
            expected_prefix: 0,
            balanced: true,
        };
    }
    let n = load.len();
    let mut best = prefixes();
    best.resize(n, 0);
    let min = load.iter().copied().min().unwrap_or(0);
    let slack = if policy.copies {
        let longest = best.iter().copied().max().unwrap_or(0);
        min + if longest >= policy.long_prefix_tokens {
            policy.copy_slack_long
        } else {
            policy.copy_slack
        }
    } else {
        usize::MAX
    };
    // `max_by_key` keys each device once: `resident` is read once each.
    let device = (0..n)
        .filter(|&d| load[d] <= slack)
        .max_by_key(|&d| {
            (
                best[d],
                std::cmp::Reverse(load[d]),
                std::cmp::Reverse(resident(d)),
                std::cmp::Reverse(d),
            )
        })
        .unwrap_or(0);
    Choice {
        device,
        expected_prefix: best.get(device).copied().unwrap_or(0),
        balanced: false,
    }
}
