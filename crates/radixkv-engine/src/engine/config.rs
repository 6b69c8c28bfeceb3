//! The engine's configuration, its cache listeners, a request and the
//! engine's errors.

use crate::router::RouterConfig;
use crate::sched::sampling::Sampling;
use crate::sched::scheduler::SchedulerConfig;
use crate::tiers::TierConfig;
use radixkv::cache::{CacheError, EvictionPolicy};
use radixkv::events::CacheListener;
use std::sync::Arc;

/// The engine's configuration; every field has a default.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineConfig {
    /// Devices, one scheduler thread each (default 4).
    pub devices: usize,
    /// Tokens per KV page (default 16).
    pub page_size: usize,
    /// KV pages per device, page 0 reserved (default 65,536).
    pub pages_per_device: usize,
    /// Eviction policy of the tree (default lru).
    pub eviction_policy: EvictionPolicy,
    /// Tlru's prefill budget and next prompt estimate, in tokens (default
    /// 0 and 0: tlru's order is then lru's; see
    /// [`RadixCacheBuilder::tlru_threshold`](radixkv::RadixCacheBuilder::tlru_threshold)).
    /// The caches keep them whatever the policy, for a switch to tlru later.
    pub tlru: (u64, u64),
    /// Low and high watermarks in free pages: with them, a background
    /// evictor keeps the high watermark free (default none: eviction is
    /// synchronous, when an allocation needs it).
    pub watermarks: Option<(usize, usize)>,
    /// Routing.
    pub router: RouterConfig,
    /// Each device's scheduler.
    pub scheduler: SchedulerConfig,
    /// The host tier, copies and host writes (default: no host tier; peer
    /// copies on).
    pub tiers: TierConfig,
    /// Residency listeners for the engine's caches (default none): a KV-event
    /// publisher, a mirror index.
    pub listeners: Option<CacheListeners>,
}

/// Makes the residency listener of each cache the engine builds: called
/// with `None` for the one shared tree (its device ids are the engine's),
/// or with `Some(d)` for device `d`'s private tree (routers with private
/// trees: that tree's device 0 is the engine's device `d`).
///
/// ```
/// use radixkv::events::{CacheListener, PageEvent};
/// use radixkv_engine::CacheListeners;
/// use std::sync::Arc;
/// struct Quiet;
/// impl CacheListener for Quiet {
///     fn stored(&self, _: &PageEvent<'_>) {}
///     fn removed(&self, _: &PageEvent<'_>) {}
/// }
/// let l = CacheListeners::new(|_private_device| Arc::new(Quiet) as Arc<dyn CacheListener>);
/// let _for_the_shared_tree = l.make(None);
/// ```
#[derive(Clone)]
pub struct CacheListeners(Arc<ListenerFactory>);

type ListenerFactory = dyn Fn(Option<usize>) -> Arc<dyn CacheListener> + Send + Sync;

impl CacheListeners {
    /// Listeners made by `f` (see the type's docs for its argument).
    pub fn new(
        f: impl Fn(Option<usize>) -> Arc<dyn CacheListener> + Send + Sync + 'static,
    ) -> Self {
        CacheListeners(Arc::new(f))
    }

    /// The listener of the shared tree (`None`) or of device `d`'s private tree.
    pub fn make(&self, private_device: Option<usize>) -> Arc<dyn CacheListener> {
        (self.0)(private_device)
    }
}

impl std::fmt::Debug for CacheListeners {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CacheListeners")
    }
}

impl PartialEq for CacheListeners {
    fn eq(&self, o: &Self) -> bool {
        Arc::ptr_eq(&self.0, &o.0)
    }
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            devices: 4,
            page_size: 16,
            pages_per_device: 65_536,
            eviction_policy: EvictionPolicy::Lru,
            tlru: (0, 0),
            watermarks: None,
            router: RouterConfig::default(),
            scheduler: SchedulerConfig::default(),
            tiers: TierConfig::default(),
            listeners: None,
        }
    }
}

/// A request to the engine.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineRequest {
    /// Prompt tokens (not empty).
    pub tokens: Arc<[u32]>,
    /// Cache namespace (LoRA id, tenant…).
    pub namespace: Option<Arc<str>>,
    /// Scheduling priority.
    pub priority: i64,
    /// Output tokens to generate (at least 1).
    pub output_len: usize,
    /// The output's token ids, when known.
    pub output_tokens: Option<Arc<[u32]>>,
    /// How a model backend picks the output tokens (greedy by default;
    /// a workload's fixed `output_tokens` win over the model's).
    pub sampling: Sampling,
}

impl EngineRequest {
    /// A request for `output_len` tokens after `tokens`.
    pub fn new(tokens: impl Into<Arc<[u32]>>, output_len: usize) -> Self {
        EngineRequest {
            tokens: tokens.into(),
            namespace: None,
            priority: 0,
            output_len,
            output_tokens: None,
            sampling: Sampling::default(),
        }
    }
}

/// Why the engine refused something.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// Bad configuration.
    #[error("invalid engine configuration: {0}")]
    InvalidConfig(String),
    /// The cache refused its configuration.
    #[error(transparent)]
    Cache(#[from] CacheError),
    /// A request that can never run here.
    #[error("request rejected: {0}")]
    Rejected(String),
    /// The engine is stopping or its schedulers are gone.
    #[error("the engine is stopped")]
    Stopped,
    /// A scheduler thread failed: the engine serves no more
    /// ([`Engine::failure`](crate::Engine::failure) says why).
    #[error("the engine failed: {0}")]
    Failed(String),
}
