//! Where each of the engine's devices keeps its KV: the one place that maps
//! an engine device to its cache and its device id in that cache (the
//! backend and the router know devices by their engine ids; the host tier
//! is [`Tier::Host`](radixkv::Tier::Host) everywhere).

use super::config::{EngineConfig, EngineError};
use crate::sched::batch::ModelBackend;
use radixkv::cache::{PagedCache, RadixCache};
use radixkv::device::DeviceId;
use std::sync::Arc;

/// The engine's caches and its devices' places in them: one shared tree
/// where engine device `d` is the tree's device `d`, or (routers with
/// private trees) one tree per device where each is its tree's device 0.
#[derive(Debug)]
pub(super) struct Placement {
    caches: Vec<Arc<PagedCache>>,
    devices: usize,
}

impl Placement {
    /// Builds the cache(s) `cfg` asks for. With private trees each gets its
    /// own share of the host tier (as HiCache gives each DP rank its own),
    /// and none with a `backend` that holds KV, whose one host pool cannot
    /// hold several trees' slots (each numbers its pages from 0).
    pub(super) fn build(
        cfg: &EngineConfig,
        backend: &dyn ModelBackend,
    ) -> Result<Placement, EngineError> {
        let build = |devices: usize, host: Option<usize>, private: Option<usize>| {
            let mut b = RadixCache::builder()
                .devices(devices)
                .page_size(cfg.page_size)
                .eviction_policy(cfg.eviction_policy)
                .tlru_threshold(cfg.tlru.0)
                .tlru_next_prompt_estimate(cfg.tlru.1)
                .pages_per_device(cfg.pages_per_device);
            if let Some((low, high)) = cfg.watermarks {
                b = b.watermarks(low, high);
            }
            if let Some(h) = host {
                b = b.host_pages(h);
            }
            if let Some(l) = &cfg.listeners {
                b = b.listener(l.make(private));
            }
            b.build().map(Arc::new)
        };
        let caches = if cfg.router.kind.private_trees() {
            let share = cfg
                .tiers
                .host_pages
                .filter(|_| !backend.wants_data())
                .map(|h| (h / cfg.devices).max(2));
            (0..cfg.devices)
                .map(|d| build(1, share, Some(d)))
                .collect::<Result<_, _>>()?
        } else {
            vec![build(cfg.devices, cfg.tiers.host_pages, None)?]
        };
        Ok(Placement {
            caches,
            devices: cfg.devices,
        })
    }

    /// The cache holding engine device `device` and the device's id there;
    /// `None` for a device the engine does not have.
    pub(super) fn get(&self, device: usize) -> Option<(&Arc<PagedCache>, DeviceId)> {
        if device >= self.devices {
            return None;
        }
        Some(match self.shared() {
            Some(c) => (c, DeviceId(device as u32)),
            None => (&self.caches[device], DeviceId(0)),
        })
    }

    /// The one tree every device shares, if they share one.
    pub(super) fn shared(&self) -> Option<&Arc<PagedCache>> {
        match self.caches.as_slice() {
            [one] => Some(one),
            _ => None,
        }
    }

    /// Every cache (one, or one per device).
    pub(super) fn caches(&self) -> &[Arc<PagedCache>] {
        &self.caches
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::router::{RouterConfig, RouterKind};
    use crate::simulator::{CostModel, SimulatedBackend};

    fn placement(kind: RouterKind) -> Placement {
        let cfg = EngineConfig {
            devices: 3,
            pages_per_device: 8,
            router: RouterConfig {
                kind,
                ..RouterConfig::default()
            },
            ..EngineConfig::default()
        };
        Placement::build(&cfg, &SimulatedBackend::new(CostModel::default(), 1.0)).unwrap()
    }

    #[test]
    fn one_shared_tree_or_one_per_device() {
        let shared = placement(RouterKind::CacheAware);
        assert_eq!(shared.caches().len(), 1);
        let (c, t) = shared.get(2).unwrap();
        assert!(Arc::ptr_eq(c, &shared.caches()[0]));
        assert_eq!(t, DeviceId(2));

        let private = placement(RouterKind::Private);
        assert_eq!(private.caches().len(), 3);
        assert!(private.shared().is_none());
        let (c, t) = private.get(2).unwrap();
        assert!(Arc::ptr_eq(c, &private.caches()[2]));
        assert_eq!(t, DeviceId(0));
        assert!(private.get(3).is_none());
    }
}
