//! The cache-aware choice of a device (or a data-parallel rank) for a
//! request, from each one's load and the prefix of the request it holds or
//! was sent: [`choose`] under a [`CacheAwarePolicy`]. The engine's router
//! and the index's data-parallel router (`radixkv_index::dp`) both route
//! by it.
//!
//! The longest prefix wins, ties to the less loaded, then to the one under
//! less cache pressure (the caller's measure: the engine's router gives
//! each device's cached tokens, so that a prefix nobody has goes to the
//! smallest cache and new prefixes spread), then to the lower index,
//! unless the load says otherwise, by one of two rules ([`BalanceRule`]).
//! Under [`NewPrefix::LeastPressure`] a request no device holds any of
//! goes to the least pressed first, and the load only breaks its ties.
//!
//! The two load rules:
//!
//! * [`BalanceRule::Global`], sgl-router's (the default): when the load is
//!   imbalanced (the busiest has more than
//!   [`CacheAwarePolicy::balance_abs`] and more than
//!   [`CacheAwarePolicy::balance_rel`] times the least busy), the least
//!   loaded, whatever the prefixes.
//! * [`BalanceRule::AboveMean`]: a device whose own load is above both
//!   `balance_abs` and `balance_rel` times the mean steps aside, and the
//!   longest prefix among the others wins. Only an overloaded device loses
//!   its requests: with many devices the least busy one is often nearly
//!   idle, and the global rule would then send most requests to it, cached
//!   elsewhere or not.
//!
//! Under either rule, a device holding at least
//! [`CacheAwarePolicy::keep_prefix_tokens`] of the request never steps
//! aside for load: sending the request elsewhere would recompute that
//! prefix there, and a long context is worth its device's queue.

/// When the load overrides the longest prefix in [`choose`]: under
/// [`Global`](BalanceRule::Global), an imbalance anywhere sends the
/// request to the least loaded device; under
/// [`AboveMean`](BalanceRule::AboveMean), only an overloaded device steps
/// aside and the others compete on their prefixes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BalanceRule {
    /// The busiest against the least busy; when imbalanced, the least
    /// loaded takes the request (sgl-router's rule).
    #[default]
    Global,
    /// Each device against the mean; the overloaded ones step aside.
    AboveMean,
}

/// Where [`choose`] sends a request that no device (among those the load
/// rule leaves) holds any of: a new prefix, whose device then keeps its
/// following requests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum NewPrefix {
    /// The less loaded, then the less pressed (the default).
    #[default]
    LeastLoaded,
    /// The less pressed, then the less loaded. With the pressure a
    /// device's recent writes into its cache (as the data-parallel router
    /// gives it), new conversations go where the cache has been written
    /// least lately: separate caches evict at the rate they are written,
    /// so spreading the writes keeps each one's prefixes as long as one
    /// shared cache would.
    LeastPressure,
}

/// The knobs of [`choose`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CacheAwarePolicy {
    /// Which rule weighs the thresholds (default [`BalanceRule::Global`]).
    pub rule: BalanceRule,
    /// Imbalanced (or, under [`BalanceRule::AboveMean`], overloaded) only
    /// with a load above this (default 32).
    pub balance_abs: usize,
    /// …and above this many times the least busy one's (under
    /// [`BalanceRule::AboveMean`]: the mean's; default 1.5).
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
    /// A device whose prefix of the request has at least this many tokens
    /// keeps competing on it however loaded it is, under either
    /// [`BalanceRule`] (the copy slack of [`copies`](Self::copies) still
    /// applies; default `usize::MAX`: the rules apply to every device).
    pub keep_prefix_tokens: usize,
    /// Where a prefix no device holds goes (default
    /// [`NewPrefix::LeastLoaded`]).
    pub new_prefix: NewPrefix,
}

impl Default for CacheAwarePolicy {
    fn default() -> Self {
        CacheAwarePolicy {
            rule: BalanceRule::Global,
            balance_abs: 32,
            balance_rel: 1.5,
            copies: false,
            copy_slack: 2,
            copy_slack_long: 16,
            long_prefix_tokens: usize::MAX,
            keep_prefix_tokens: usize::MAX,
            new_prefix: NewPrefix::LeastLoaded,
        }
    }
}

/// Where a request goes, and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Choice {
    /// The device (or rank).
    pub device: usize,
    /// The prefix expected there (cached or dispatched), in tokens; 0 when
    /// the global rule sent it to the least loaded without reading the
    /// prefixes.
    pub expected_prefix: usize,
    /// Whether load balancing overrode the longest prefix.
    pub balanced: bool,
}

impl CacheAwarePolicy {
    /// Whether `load` is imbalanced under [`BalanceRule::Global`]'s test
    /// (whichever rule the policy names).
    pub fn imbalanced(&self, load: &[usize]) -> bool {
        let max = load.iter().copied().max().unwrap_or(0);
        let min = load.iter().copied().min().unwrap_or(0);
        max > self.balance_abs && max as f64 > min as f64 * self.balance_rel
    }

    /// The load above which a device steps aside under
    /// [`BalanceRule::AboveMean`]: `balance_abs`, or `balance_rel` times the
    /// mean of `load` if that is more. The least loaded device is never
    /// above it (`balance_rel` is at least 1 where the policy is checked).
    pub fn overload_bound(&self, load: &[usize]) -> f64 {
        let mean = load.iter().map(|&l| l as f64).sum::<f64>() / load.len().max(1) as f64;
        (self.balance_abs as f64).max(mean * self.balance_rel)
    }
}

/// The least loaded of `load` (the lowest index among equals); 0 if empty.
pub fn least_loaded(load: &[usize]) -> usize {
    (0..load.len()).min_by_key(|&d| (load[d], d)).unwrap_or(0)
}

/// Chooses among `load.len()` devices: see the module docs. `prefixes`
/// gives each device's prefix of the request in tokens (read only when
/// the load is balanced; missing entries count as 0), `pressure` each
/// device's cache pressure, lower first among equals (the engine's router
/// gives its cached tokens; read once per device at most).
///
/// ```
/// use radixkv::routing::{choose, CacheAwarePolicy, NewPrefix};
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
/// // A prefix of at least `keep_prefix_tokens` keeps its device.
/// let keep = CacheAwarePolicy { keep_prefix_tokens: 64, ..p };
/// assert_eq!(choose(&keep, &[40, 2], || vec![64, 16], |_| 0).device, 0);
/// // A prefix nobody holds: by default the less loaded, under
/// // `NewPrefix::LeastPressure` the less pressed.
/// let spread = CacheAwarePolicy { new_prefix: NewPrefix::LeastPressure, ..p };
/// assert_eq!(choose(&p, &[1, 0], || vec![0, 0], |d| [100, 500][d]).device, 1);
/// assert_eq!(choose(&spread, &[1, 0], || vec![0, 0], |d| [100, 500][d]).device, 0);
/// ```
pub fn choose(
    policy: &CacheAwarePolicy,
    load: &[usize],
    prefixes: impl FnOnce() -> Vec<usize>,
    pressure: impl Fn(usize) -> usize,
) -> Choice {
    let keep = policy.keep_prefix_tokens;
    let imbalanced = policy.rule == BalanceRule::Global && policy.imbalanced(load);
    if imbalanced && keep == usize::MAX {
        // No prefix can keep a device: the prefixes are not read.
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
    // Whom the load keeps from the longest prefix: under the global rule,
    // when imbalanced, every device but the least loaded; under the other,
    // those above the bound.
    let least = imbalanced.then(|| least_loaded(load));
    let bound = match policy.rule {
        BalanceRule::Global => f64::INFINITY,
        BalanceRule::AboveMean => policy.overload_bound(load),
    };
    let overloaded = |d: usize| least.is_some_and(|l| l != d) || load[d] as f64 > bound;
    let steps_aside = |d: usize| overloaded(d) && best[d] < keep;
    let candidates = || (0..n).filter(|&d| load[d] <= slack && !steps_aside(d));
    use std::cmp::Reverse;
    // `max_by_key` keys each device once: `pressure` is read once each.
    let device = if policy.new_prefix == NewPrefix::LeastPressure
        && candidates().all(|d| best[d] == 0)
    {
        candidates().max_by_key(|&d| (Reverse(pressure(d)), Reverse(load[d]), Reverse(d)))
    } else {
        candidates().max_by_key(|&d| (best[d], Reverse(load[d]), Reverse(pressure(d)), Reverse(d)))
    }
    .unwrap_or_else(|| least_loaded(load));
    // Balancing chose if a device that stepped aside had a longer prefix.
    let balanced = (0..n).any(|d| steps_aside(d) && best[d] > best[device]);
    Choice {
        device,
        expected_prefix: best.get(device).copied().unwrap_or(0),
        balanced,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn above_mean() -> CacheAwarePolicy {
        CacheAwarePolicy {
            rule: BalanceRule::AboveMean,
            balance_abs: 4,
            balance_rel: 1.5,
            ..CacheAwarePolicy::default()
        }
    }

    #[test]
    fn above_mean_keeps_prefixes_where_the_global_rule_balances() {
        // The least busy device is idle: the global rule calls this
        // imbalanced (10 > 4, 10 > 1.5 x 0) and sends the request there.
        let load = [10, 8, 9, 0];
        let g = choose(
            &CacheAwarePolicy {
                balance_abs: 4,
                ..Default::default()
            },
            &load,
            || vec![0, 64, 0, 0],
            |_| 0,
        );
        assert_eq!((g.device, g.balanced), (3, true));
        // Against the mean (6.75, bound 10.1) nobody is overloaded: the
        // prefix wins.
        let c = choose(&above_mean(), &load, || vec![0, 64, 0, 0], |_| 0);
        assert_eq!((c.device, c.expected_prefix, c.balanced), (1, 64, false));
    }

    #[test]
    fn above_mean_passes_an_overloaded_device_to_the_next_longest_prefix() {
        // Mean 5, bound 7.5: device 0 (12) steps aside; device 2 has the
        // next longest prefix, though device 1 is less loaded.
        let load = [12, 0, 3, 5];
        let c = choose(&above_mean(), &load, || vec![64, 0, 32, 16], |_| 0);
        assert_eq!((c.device, c.expected_prefix, c.balanced), (2, 32, true));
        // Below balance_abs nobody steps aside.
        let p = CacheAwarePolicy {
            balance_abs: 20,
            ..above_mean()
        };
        let c = choose(&p, &load, || vec![64, 0, 32, 16], |_| 0);
        assert_eq!((c.device, c.balanced), (0, false));
        // A prefix nobody has: the least loaded, not balanced.
        let c = choose(&above_mean(), &load, || vec![0; 4], |_| 0);
        assert_eq!((c.device, c.balanced), (1, false));
    }

    #[test]
    fn a_kept_prefix_stays_with_its_device_under_either_rule() {
        use BalanceRule::{AboveMean, Global};
        // Device 0 runs 12: above the mean's bound (7.5) and, under the
        // global rule, imbalanced (12 > 4 and 12 > 1.5 x 0).
        let load = [12, 0, 3, 5];
        // (rule, prefixes, device, expected prefix, balanced)
        let cases = [
            // Its 64 tokens keep it under either rule.
            (AboveMean, [64, 0, 32, 16], 0, 64, false),
            (Global, [64, 0, 32, 16], 0, 64, false),
            // One token short, it steps aside as before: to the next
            // longest prefix, or under the global rule the least loaded.
            (AboveMean, [63, 0, 32, 16], 2, 32, true),
            (Global, [63, 0, 32, 16], 1, 0, true),
            // Two kept prefixes: the longer, then the less loaded.
            (Global, [64, 0, 96, 16], 2, 96, false),
            (Global, [64, 0, 64, 16], 2, 64, false),
        ];
        for (rule, prefixes, device, prefix, balanced) in cases {
            let p = CacheAwarePolicy {
                rule,
                keep_prefix_tokens: 64,
                ..above_mean()
            };
            let c = choose(&p, &load, || prefixes.to_vec(), |_| 0);
            assert_eq!(
                (c.device, c.expected_prefix, c.balanced),
                (device, prefix, balanced),
                "{rule:?}, prefixes {prefixes:?}"
            );
        }
    }

    #[test]
    fn a_new_prefix_goes_to_the_least_pressed_under_least_pressure() {
        let p = CacheAwarePolicy {
            new_prefix: NewPrefix::LeastPressure,
            ..above_mean()
        };
        // Mean 4.25, bound 6.375: device 0 (9) steps aside.
        let load = [9, 3, 1, 4];
        let pressure = |d: usize| [0, 50, 200, 50][d];
        // (policy, prefixes, device): a prefix nobody holds goes to the
        // least pressed of those the load leaves (not device 0), ties to
        // the less loaded; by default to the less loaded. A prefix held
        // anywhere wins as before, and pressure only breaks its ties.
        let cases = [
            (p, [0, 0, 0, 0], 1),
            (above_mean(), [0, 0, 0, 0], 2),
            (p, [0, 0, 16, 0], 2),
            (p, [0, 16, 0, 16], 1),
            // Held only by the device that steps aside: new to the rest.
            (p, [16, 0, 0, 0], 1),
        ];
        for (policy, prefixes, device) in cases {
            let c = choose(&policy, &load, || prefixes.to_vec(), pressure);
            assert_eq!(c.device, device, "{:?}, {prefixes:?}", policy.new_prefix);
        }
        // Equal load and prefixes: the less pressed under either.
        let c = choose(&above_mean(), &[2, 2], || vec![8, 8], |d| [9, 1][d]);
        assert_eq!(c.device, 1);
    }

    #[test]
    fn above_mean_never_excludes_the_least_loaded() {
        // Every load is far above balance_abs; the least loaded is at or
        // below the mean, so some device always remains.
        for load in [[100, 100, 100, 100], [1000, 900, 800, 700], [5, 0, 0, 0]] {
            let c = choose(&above_mean(), &load, || vec![16, 16, 16, 16], |_| 0);
            assert!(load[c.device] as f64 <= above_mean().overload_bound(&load));
        }
    }
}
