//! Routing requests to devices.
//!
//! | router | picks |
//! | --- | --- |
//! | `cache-aware` | the device holding the longest prefix of the request — resident in the shared tree ([`radixkv::RadixCache::peek`]) or dispatched there and not yet inserted (the routing-only [`PendingIndex`]) — unless the load is imbalanced, then the least loaded |
//! | `round-robin` | devices in turn |
//! | `least-loaded` | the device with the fewest outstanding requests |
//! | `private` | devices in turn, each device with its own private tree (the per-rank caches of today's data-parallel serving: the baseline) |
//!
//! Load is the number of outstanding requests (dispatched, not finished)
//! per device. The cache-aware router chooses by the core's rule
//! ([`radixkv::routing::choose`], shared with the index's data-parallel
//! router): the load is imbalanced when `max > balance_abs` and
//! `max > min · balance_rel` (sgl-router's rule and defaults: 32 requests,
//! 1.5×); ties between devices with equally long prefixes go to the less
//! loaded, then to the one caching fewer tokens
//! ([`radixkv::RadixCache::resident_tokens`]; sgl-router sends a prefix no
//! worker has to its smallest tree).

use arc_swap::ArcSwap;
use radixkv::cache::{PagedCache, TokenKey};
use radixkv::routing::{BalanceRule, CacheAwarePolicy};
use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Why a request went where it went (the core's [`radixkv::routing::Choice`]).
pub use radixkv::routing::Choice as Route;
/// The prefixes dispatched to each device and not yet inserted into the
/// tree (the core's, shared with the index's data-parallel router).
pub use radixkv::routing::PendingIndex;

/// Which router the engine uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum RouterKind {
    /// Longest cached or dispatched prefix, with load balancing.
    #[default]
    CacheAware,
    /// Devices in turn.
    RoundRobin,
    /// Fewest outstanding requests.
    LeastLoaded,
    /// Devices in turn, one private tree per device (the baseline).
    Private,
}

impl RouterKind {
    /// Every router.
    pub const ALL: [RouterKind; 4] = [
        RouterKind::CacheAware,
        RouterKind::RoundRobin,
        RouterKind::LeastLoaded,
        RouterKind::Private,
    ];

    /// The name `FromStr` accepts.
    pub fn name(self) -> &'static str {
        match self {
            RouterKind::CacheAware => "cache-aware",
            RouterKind::RoundRobin => "round-robin",
            RouterKind::LeastLoaded => "least-loaded",
            RouterKind::Private => "private",
        }
    }

    /// Whether each device gets its own tree.
    pub fn private_trees(self) -> bool {
        self == RouterKind::Private
    }
}

impl fmt::Display for RouterKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An unknown router name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown router {0:?} (expected cache-aware, round-robin, least-loaded or private)")]
pub struct UnknownRouter(pub String);

impl FromStr for RouterKind {
    type Err = UnknownRouter;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        RouterKind::ALL
            .into_iter()
            .find(|r| r.name() == s)
            .ok_or_else(|| UnknownRouter(s.to_string()))
    }
}

/// The cache-aware router's knobs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RouterConfig {
    /// The router.
    pub kind: RouterKind,
    /// Imbalanced only if the busiest device has more outstanding
    /// requests than this (default 32).
    pub balance_abs: usize,
    /// …and more than this many times the least busy one's (default 1.5).
    pub balance_rel: f64,
    /// Devices can copy prefixes from each other (the engine sets it from
    /// its tier settings): then a prefix held elsewhere costs a copy, not a
    /// recomputation, and the cache-aware router weighs queueing behind
    /// the device that has it against copying it to a less loaded one: it
    /// picks the longest prefix among the devices within
    /// [`copy_slack`](Self::copy_slack) outstanding requests of the least
    /// loaded (default false).
    pub copies: bool,
    /// With `copies`: how many more outstanding requests than the least
    /// loaded device a device may have and still win on its prefix
    /// (default 2: among the devices at most 2 requests busier than the
    /// least loaded, the longest prefix; on GSP's all-at-once arrival 2
    /// gives a TTFT p99 of 3.78–3.98 s against 3.84–4.11 s with 0, and 16
    /// gives 12 s; BENCHMARKS.md).
    pub copy_slack: usize,
    /// With `copies`: the slack for a request whose longest cached prefix
    /// has at least [`long_prefix_tokens`](Self::long_prefix_tokens)
    /// tokens (default 16): copying a long context means finding that
    /// many free pages on a busier device's neighbour, and a refused copy
    /// is a recomputation, so a long prefix stays with its device longer.
    pub copy_slack_long: usize,
    /// What counts as a long prefix (default: never; the engine sets a
    /// thirty-second of a device's pool).
    pub long_prefix_tokens: usize,
}

impl RouterConfig {
    /// The cache-aware rule's knobs, as the core's routing takes them.
    pub fn policy(&self) -> CacheAwarePolicy {
        CacheAwarePolicy {
            rule: BalanceRule::Global,
            balance_abs: self.balance_abs,
            balance_rel: self.balance_rel,
            copies: self.copies,
            copy_slack: self.copy_slack,
            copy_slack_long: self.copy_slack_long,
            long_prefix_tokens: self.long_prefix_tokens,
            ..CacheAwarePolicy::default()
        }
    }
}

impl Default for RouterConfig {
    fn default() -> Self {
        let p = CacheAwarePolicy::default();
        RouterConfig {
            kind: RouterKind::CacheAware,
            balance_abs: p.balance_abs,
            balance_rel: p.balance_rel,
            copies: p.copies,
            copy_slack: p.copy_slack,
            copy_slack_long: p.copy_slack_long,
            long_prefix_tokens: p.long_prefix_tokens,
        }
    }
}

/// Chooses a device for each request and tracks outstanding requests.
///
/// Shared by every submitting thread and every scheduler's completion
/// callback without a global lock: the outstanding counts are atomics, the
/// pending prefixes a sharded [`PendingIndex`], the configuration an
/// [`ArcSwap`] that [`set_config`](Self::set_config) replaces at run time.
/// Two requests routed at the same instant may see the same loads (and
/// both pick the same device): routing is a heuristic, and the counts
/// themselves are exact.
#[derive(Debug)]
pub struct Router {
    cfg: ArcSwap<RouterConfig>,
    load: Box<[AtomicUsize]>,
    next: AtomicUsize,
    pending: PendingIndex,
}

impl Router {
    /// A router over `devices` devices with pages of `page_size` tokens.
    pub fn new(cfg: RouterConfig, devices: usize, page_size: usize) -> Self {
        Router {
            cfg: ArcSwap::from_pointee(cfg),
            load: (0..devices.max(1)).map(|_| AtomicUsize::new(0)).collect(),
            next: AtomicUsize::new(0),
            pending: PendingIndex::new(devices.max(1), page_size),
        }
    }

    /// The configuration now.
    pub fn config(&self) -> Arc<RouterConfig> {
        self.cfg.load_full()
    }

    /// Replaces the configuration; requests routed from now on follow it.
    /// The kind cannot change (a cache-aware router's pending prefixes, a
    /// private router's trees are built for it).
    ///
    /// ```
    /// use radixkv_engine::router::{Router, RouterConfig, RouterKind};
    /// let r = Router::new(RouterConfig::default(), 2, 16);
    /// r.set_config(RouterConfig { balance_abs: 4, ..RouterConfig::default() }).unwrap();
    /// assert_eq!(r.config().balance_abs, 4);
    /// let e = r.set_config(RouterConfig { kind: RouterKind::RoundRobin, ..RouterConfig::default() });
    /// assert!(e.unwrap_err().contains("kind"));
    /// ```
    pub fn set_config(&self, cfg: RouterConfig) -> Result<(), String> {
        let now = self.cfg.load();
        if cfg.kind != now.kind {
            return Err(format!(
                "the router's kind is fixed at start ({}; asked for {})",
                now.kind.name(),
                cfg.kind.name()
            ));
        }
        if !(cfg.balance_rel.is_finite() && cfg.balance_rel >= 1.0) {
            return Err(format!(
                "balance_rel must be a number of at least 1, not {}",
                cfg.balance_rel
            ));
        }
        self.cfg.store(Arc::new(cfg));
        Ok(())
    }

    /// Outstanding requests per device (each count read once: a snapshot
    /// per device).
    pub fn load(&self) -> Vec<usize> {
        // SeqCst: plain reads of the counts; nothing else is ordered by them.
        self.load.iter().map(|l| l.load(Ordering::SeqCst)).collect()
    }

    /// Picks a device for `key` and counts the request as outstanding
    /// there; the cache-aware router also records its prefix as pending.
    /// `cache` is the shared tree (ignored by the other routers).
    pub fn route(&self, key: TokenKey<'_>, cache: Option<&PagedCache>) -> Route {
        let cfg = self.cfg.load();
        let n = self.load.len();
        // The loads are read only by the routers that look at them.
        let route = match cfg.kind {
            RouterKind::RoundRobin | RouterKind::Private => Route {
                device: self.next.fetch_add(1, Ordering::SeqCst) % n,
                expected_prefix: 0,
                balanced: false,
            },
            RouterKind::LeastLoaded => Route {
                device: radixkv::routing::least_loaded(&self.load()),
                expected_prefix: 0,
                balanced: false,
            },
            RouterKind::CacheAware => self.cache_aware(&cfg, &self.load(), key, cache),
        };
        self.load[route.device].fetch_add(1, Ordering::SeqCst);
        if cfg.kind == RouterKind::CacheAware {
            self.pending
                .add(key.tokens(), key.namespace(), route.device);
        }
        route
    }

    fn cache_aware(
        &self,
        cfg: &RouterConfig,
        load: &[usize],
        key: TokenKey<'_>,
        cache: Option<&PagedCache>,
    ) -> Route {
        let n = load.len();
        // `d < n`, the engine's device count, a u32.
        let resident = |d: usize| {
            cache
                .and_then(|c| c.resident_tokens(radixkv::DeviceId(d as u32)).ok())
                .unwrap_or(0)
        };
        radixkv::routing::choose(
            &cfg.policy(),
            load,
            || {
                let mut best = self.pending.longest(key.tokens(), key.namespace());
                if let Some(c) = cache {
                    for (d, l) in c.peek(key).into_iter().enumerate().take(n) {
                        best[d] = best[d].max(l);
                    }
                }
                best
            },
            resident,
        )
    }

    /// The request's prompt is now in the tree on `device` (or it was
    /// aborted): forget its pending prefix.
    pub fn settled(&self, key: TokenKey<'_>, device: usize) {
        if self.cfg.load().kind == RouterKind::CacheAware {
            self.pending.remove(key.tokens(), key.namespace(), device);
        }
    }

    /// The request finished (or failed) on `device`.
    pub fn finished(&self, device: usize) {
        if let Some(l) = self.load.get(device) {
            // SeqCst: a count; saturating, so a stray call cannot wrap it.
            let _ = l.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |x| x.checked_sub(1));
        }
    }

    /// Whether no prefix is pending (every dispatched prompt settled).
    pub fn nothing_pending(&self) -> bool {
        self.pending.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_aware_follows_pending_prefixes_then_balances() {
        let cfg = RouterConfig {
            balance_abs: 4,
            ..RouterConfig::default()
        };
        let r = Router::new(cfg, 2, 1);
        let a: Vec<u32> = (0..10).collect();
        let b: Vec<u32> = (100..110).collect();
        // First request of a: no prefix anywhere: least loaded (device 0).
        assert_eq!(r.route(TokenKey::new(&a), None).device, 0);
        // b goes to the other device (tie on prefix 0, lower load).
        assert_eq!(r.route(TokenKey::new(&b), None).device, 1);
        // Siblings of a follow the pending prefix.
        for _ in 0..3 {
            let rt = r.route(TokenKey::new(&a[..9]), None);
            assert_eq!((rt.device, rt.expected_prefix), (0, 9));
        }
        // Device 0 now has 4 outstanding: not above balance_abs yet.
        assert_eq!(r.route(TokenKey::new(&a), None).device, 0);
        // 5 > 4 and 5 > 1·1.5: imbalanced, so the least loaded wins.
        let rt = r.route(TokenKey::new(&a), None);
        assert!(rt.balanced);
        assert_eq!(rt.device, 1);
        // Settling removes the pending prefix of one dispatch only.
        r.settled(TokenKey::new(&b), 1);
        r.finished(1);
        assert_eq!(r.load(), &[5, 1]);
    }

    #[test]
    fn round_robin_private_and_least_loaded() {
        for kind in [RouterKind::RoundRobin, RouterKind::Private] {
            let r = Router::new(
                RouterConfig {
                    kind,
                    ..Default::default()
                },
                3,
                1,
            );
            let got: Vec<usize> = (0..6)
                .map(|_| r.route(TokenKey::new(&[1]), None).device)
                .collect();
            assert_eq!(got, vec![0, 1, 2, 0, 1, 2]);
        }
        let r = Router::new(
            RouterConfig {
                kind: RouterKind::LeastLoaded,
                ..Default::default()
            },
            2,
            1,
        );
        assert_eq!(r.route(TokenKey::new(&[1]), None).device, 0);
        assert_eq!(r.route(TokenKey::new(&[1]), None).device, 1);
        r.finished(1);
        assert_eq!(r.route(TokenKey::new(&[1]), None).device, 1);
        assert!("nope".parse::<RouterKind>().is_err());
        assert_eq!("private".parse::<RouterKind>(), Ok(RouterKind::Private));
    }

    #[test]
    fn pending_index_respects_namespaces_and_counts() {
        let p = PendingIndex::new(1, 2);
        p.add(&[1, 2, 3, 4], Some("a"), 0);
        assert_eq!(p.longest(&[1, 2, 3, 4], None), vec![0]);
        assert_eq!(p.longest(&[1, 2, 3, 4], Some("a")), vec![4]);
        p.add(&[1, 2], Some("a"), 0);
        p.remove(&[1, 2, 3, 4], Some("a"), 0);
        assert_eq!(p.longest(&[1, 2, 3, 4], Some("a")), vec![2]);
        p.remove(&[1, 2], Some("a"), 0);
        assert!(p.is_empty());
    }
}
