//! `radixkv.RadixCache` (the caller's values) and `radixkv.PagedCache` (a
//! cache that owns its pages): the core's two kinds of cache, with every
//! builder option and every operation. What both do is written once
//! (`shared_methods!`); every call that walks the tree releases the GIL.

use crate::convert::tier;
use crate::errors::{cache_error, invalid};
use crate::events::{Event, EventLog};
use crate::ids::{ids, Ids};
use crate::results::{Evicted, InsertResult, Lease, MatchResult, NodeHandle, Sizes};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};
use radixkv::{ClockKind, EvictionPolicy, HitCounts, Ownership, TokenKey};
use radixkv_py_macros::py_methods;
use std::sync::Arc;

/// The options both kinds of cache are built with.
pub(crate) struct Options<'a> {
    pub(crate) page_size: usize,
    pub(crate) devices: usize,
    pub(crate) eviction_policy: &'a str,
    pub(crate) clock: &'a str,
    pub(crate) host_pages: Option<usize>,
    pub(crate) replica_aware: bool,
    pub(crate) events: bool,
    pub(crate) hit_counts: &'a str,
    pub(crate) slru_protected_threshold: Option<u64>,
    pub(crate) tlru_threshold: u64,
    pub(crate) tlru_next_prompt_estimate: u64,
}

/// Applies `o` to a builder of either kind; the event log it installs.
pub(crate) fn configure<P: Ownership>(
    py: Python<'_>,
    mut b: radixkv::RadixCacheBuilder<P>,
    o: &Options<'_>,
) -> PyResult<(radixkv::RadixCacheBuilder<P>, Option<Arc<EventLog>>)> {
    let policy: EvictionPolicy = o
        .eviction_policy
        .parse()
        .map_err(|e: radixkv::cache::UnknownPolicy| invalid(py, e.to_string()))?;
    let clock = match o.clock {
        "logical" => ClockKind::Logical,
        "monotonic" => ClockKind::Monotonic,
        other => {
            return Err(invalid(
                py,
                format!("clock: \"logical\" or \"monotonic\", not {other:?}"),
            ))
        }
    };
    let hits = match o.hit_counts {
        "match" => HitCounts::OnMatch,
        "insert" => HitCounts::OnInsert,
        other => {
            return Err(invalid(
                py,
                format!("hit_counts: \"match\" or \"insert\", not {other:?}"),
            ))
        }
    };
    b = b
        .page_size(o.page_size)
        .devices(o.devices)
        .eviction_policy(policy)
        .clock(clock)
        .replica_aware(o.replica_aware)
        .hit_counts(hits)
        .tlru_threshold(o.tlru_threshold)
        .tlru_next_prompt_estimate(o.tlru_next_prompt_estimate);
    if let Some(n) = o.slru_protected_threshold {
        b = b.slru_protected_threshold(n);
    }
    if let Some(h) = o.host_pages {
        b = b.host_pages(h);
    }
    let log = o.events.then(|| Arc::new(EventLog::default()));
    if let Some(l) = &log {
        b = b.listener(Arc::clone(l) as Arc<dyn radixkv::events::CacheListener>);
    }
    Ok((b, log))
}

/// A key from Python arguments: the ids and the namespace.
pub(crate) struct Key {
    pub(crate) ids: Ids,
    pub(crate) namespace: Option<String>,
}

impl Key {
    pub(crate) fn read(tokens: &Bound<'_, PyAny>, namespace: Option<String>) -> PyResult<Key> {
        Ok(Key {
            ids: ids(tokens, "tokens")?,
            namespace,
        })
    }

    pub(crate) fn key(&self) -> TokenKey<'_> {
        TokenKey::new(self.ids.as_slice()).in_namespace(self.namespace.as_deref())
    }

    /// Tokens in the key.
    pub(crate) fn len(&self) -> usize {
        self.ids.as_slice().len()
    }
}

/// An event as Python gets it: a tuple whose first item names its kind.
pub(crate) fn event_to_py<'py>(py: Python<'py>, e: Event) -> PyResult<Bound<'py, PyTuple>> {
    use crate::convert::tier_to_py;
    Ok(match e {
        Event::Stored {
            tier,
            node,
            parent,
            namespace,
            prefix_len,
            tokens,
        } => PyTuple::new(
            py,
            [
                "stored".into_pyobject(py)?.into_any(),
                tier_to_py(py, tier)?.into_bound(py),
                node.into_pyobject(py)?.into_any(),
                parent.into_pyobject(py)?.into_any(),
                namespace.into_pyobject(py)?.into_any(),
                prefix_len.into_pyobject(py)?.into_any(),
                crate::convert::array(py, &tokens)?.into_bound(py),
            ],
        )?,
        Event::Removed { tier, node, tokens } => PyTuple::new(
            py,
            [
                "removed".into_pyobject(py)?.into_any(),
                tier_to_py(py, tier)?.into_bound(py),
                node.into_pyobject(py)?.into_any(),
                tokens.into_pyobject(py)?.into_any(),
            ],
        )?,
        Event::Split {
            tier,
            node,
            prefix,
            moved,
        } => PyTuple::new(
            py,
            [
                "split".into_pyobject(py)?.into_any(),
                tier_to_py(py, tier)?.into_bound(py),
                node.into_pyobject(py)?.into_any(),
                prefix.into_pyobject(py)?.into_any(),
                moved.into_pyobject(py)?.into_any(),
            ],
        )?,
        Event::Cleared => PyTuple::new(py, ["cleared".into_pyobject(py)?.into_any()])?,
    })
}

/// The methods both kinds of cache have, on `$ty` (whose `inner` is an
/// `Arc` of the core's cache and `events` its optional event log), plus
/// `$($extra)*`, the kind's own.
macro_rules! shared_methods {
    ($ty:ident, { $($extra:tt)* }) => {
        #[py_methods]
        impl $ty {
            $($extra)*

            /// Tokens per page.
            #[getter]
            fn page_size(&self) -> usize {
                self.inner.page_size()
            }

            /// Number of devices (the host tier is not counted).
            #[getter]
            fn devices(&self) -> usize {
                self.inner.devices()
            }

            /// Whether the cache has a host tier (named `"host"`).
            #[getter]
            fn has_host_tier(&self) -> bool {
                self.inner.has_host_tier()
            }

            /// The eviction policy's name; assigning switches it at run time.
            #[getter]
            fn get_eviction_policy(&self) -> String {
                self.inner.eviction_policy().to_string()
            }

            #[setter]
            fn set_eviction_policy(&self, py: Python<'_>, name: &str) -> PyResult<()> {
                let p: EvictionPolicy = name
                    .parse()
                    .map_err(|e: radixkv::cache::UnknownPolicy| invalid(py, e.to_string()))?;
                let inner = Arc::clone(&self.inner);
                py.detach(move || inner.set_eviction_policy(p));
                Ok(())
            }

            /// Resident prefix length of `tokens` on every device (index =
            /// device). Takes no lock and writes nothing: for routing.
            #[pyo3(signature = (tokens, *, namespace=None))]
            fn peek(&self, py: Python<'_>, tokens: &Bound<'_, PyAny>, namespace: Option<String>) -> PyResult<Vec<usize>> {
                let k = Key::read(tokens, namespace)?;
                let inner = Arc::clone(&self.inner);
                Ok(crate::gil::walk(py, k.len(), || inner.peek(k.key())))
            }

            /// Resident prefix lengths of `tokens` on every device and on the
            /// host tier (0 without one), in one walk: `(devices, host)`.
            #[pyo3(signature = (tokens, *, namespace=None))]
            fn peek_tiers(&self, py: Python<'_>, tokens: &Bound<'_, PyAny>, namespace: Option<String>) -> PyResult<(Vec<usize>, usize)> {
                let k = Key::read(tokens, namespace)?;
                let inner = Arc::clone(&self.inner);
                let t = crate::gil::walk(py, k.len(), || inner.peek_tiers(k.key()));
                Ok((t.devices, t.host))
            }

            /// The longest prefix of `tokens` resident on `tier` (whole
            /// pages), without a pin (the handle can be pinned later).
            /// Splits the node the match ends inside, as SGLang does.
            #[pyo3(signature = (tokens, *, tier=None, namespace=None))]
            fn match_prefix(slf: &Bound<'_, Self>, tokens: &Bound<'_, PyAny>, tier: Option<&Bound<'_, PyAny>>, namespace: Option<String>) -> PyResult<MatchResult> {
                let py = slf.py();
                let t = tier_or_zero(tier)?;
                let k = Key::read(tokens, namespace)?;
                let inner = Arc::clone(&slf.get().inner);
                let m = crate::gil::walk(py, k.len(), || inner.match_prefix(k.key(), t)).map_err(|e| cache_error(py, e))?;
                MatchResult::new(py, m, slf.clone().into_any().unbind())
            }

            /// As `match_prefix`, and pins the match: `values` are read after
            /// the pin, and stay valid until the lease is closed.
            #[pyo3(signature = (tokens, *, tier=None, namespace=None))]
            fn match_and_pin(slf: &Bound<'_, Self>, tokens: &Bound<'_, PyAny>, tier: Option<&Bound<'_, PyAny>>, namespace: Option<String>) -> PyResult<MatchResult> {
                let py = slf.py();
                let t = tier_or_zero(tier)?;
                let k = Key::read(tokens, namespace)?;
                let inner = Arc::clone(&slf.get().inner);
                let m = crate::gil::walk(py, k.len(), || inner.match_and_pin(k.key(), t)).map_err(|e| cache_error(py, e))?;
                MatchResult::new(py, m, slf.clone().into_any().unbind())
            }

            /// Pins the end node of an earlier match; `StaleHandle` if it
            /// left the tree on the handle's tier since.
            fn pin(slf: &Bound<'_, Self>, handle: &Bound<'_, NodeHandle>) -> PyResult<Lease> {
                let py = slf.py();
                let l = slf.get().inner.pin(&handle.get().handle).map_err(|e| cache_error(py, e))?;
                Ok(Lease::new(l, slf.clone().into_any().unbind()))
            }

            /// Evicts whole unpinned leaves of `tier` in policy order until at
            /// least `num_tokens` tokens are freed or nothing evictable is left.
            #[pyo3(signature = (num_tokens, *, tier=None))]
            fn evict(&self, py: Python<'_>, num_tokens: usize, tier: Option<&Bound<'_, PyAny>>) -> PyResult<Evicted> {
                let t = tier_or_zero(tier)?;
                let inner = Arc::clone(&self.inner);
                let e = py.detach(|| inner.evict(t, num_tokens)).map_err(|e| cache_error(py, e))?;
                Evicted::new(py, e)
            }

            /// Takes `tier`'s residency from the last page of `tokens` and
            /// every page below it on `tier` (a block and what continues it:
            /// a router's index applying a removal), whatever the policy.
            #[pyo3(signature = (tokens, *, tier=None, namespace=None))]
            fn evict_from(&self, py: Python<'_>, tokens: &Bound<'_, PyAny>, tier: Option<&Bound<'_, PyAny>>, namespace: Option<String>) -> PyResult<Evicted> {
                let t = tier_or_zero(tier)?;
                let k = Key::read(tokens, namespace)?;
                let inner = Arc::clone(&self.inner);
                let e = py.detach(|| inner.evict_from(k.key(), t)).map_err(|e| cache_error(py, e))?;
                Evicted::new(py, e)
            }

            /// Token counts on `tier` by a scan of the tree (exact when no
            /// operation is in flight).
            #[pyo3(signature = (tier=None))]
            fn sizes(&self, py: Python<'_>, tier: Option<&Bound<'_, PyAny>>) -> PyResult<Sizes> {
                let t = tier_or_zero(tier)?;
                let inner = Arc::clone(&self.inner);
                Ok(py.detach(|| inner.sizes(t)).map_err(|e| cache_error(py, e))?.into())
            }

            /// Tokens resident on `tier`, from a counter (no scan).
            #[pyo3(signature = (tier=None))]
            fn resident_tokens(&self, py: Python<'_>, tier: Option<&Bound<'_, PyAny>>) -> PyResult<usize> {
                let t = tier_or_zero(tier)?;
                self.inner.resident_tokens(t).map_err(|e| cache_error(py, e))
            }

            /// Non-root nodes in the tree, over all tiers.
            fn node_count(&self) -> u64 {
                self.inner.node_count()
            }

            /// The first violated invariant (I1, I2, I4–I6, the counters), or
            /// `None`. Meaningful when no operation is in flight.
            fn check(&self, py: Python<'_>) -> PyResult<Option<String>> {
                let inner = Arc::clone(&self.inner);
                Ok(py.detach(|| inner.check()).err())
            }

            /// As `check`, raising `CacheError` with the violation.
            fn audit(&self, py: Python<'_>) -> PyResult<()> {
                match self.check(py)? {
                    None => Ok(()),
                    Some(v) => Err(cache_error(py, radixkv::CacheError::InvalidConfig(format!("audit failed: {v}")))),
                }
            }

            /// Frees what earlier changes unlinked, once no reader can hold it.
            fn reclaim(&self, py: Python<'_>) -> PyResult<()> {
                let inner = Arc::clone(&self.inner);
                py.detach(|| inner.reclaim());
                Ok(())
            }

            /// What eviction did on `tier`: calls, leaves, tokens, pages,
            /// latency (ns) and the background evictor's figures, as a dict.
            #[pyo3(signature = (tier=None))]
            fn eviction_metrics<'py>(&self, py: Python<'py>, tier: Option<&Bound<'py, PyAny>>) -> PyResult<Bound<'py, PyDict>> {
                let t = tier_or_zero(tier)?;
                let m = self.inner.eviction_metrics(t).map_err(|e| cache_error(py, e))?;
                let d = PyDict::new(py);
                d.set_item("evict_calls", m.evict_calls)?;
                d.set_item("evicted_leaves", m.evicted_leaves)?;
                d.set_item("evicted_tokens", m.evicted_tokens)?;
                d.set_item("evicted_pages", m.evicted_pages)?;
                d.set_item("latency_count", m.latency.count)?;
                d.set_item("latency_p50_ns", m.latency.p50_ns)?;
                d.set_item("latency_p99_ns", m.latency.p99_ns)?;
                d.set_item("latency_max_ns", m.latency.max_ns)?;
                d.set_item("evictor_wakeups", m.evictor_wakeups)?;
                Ok(d)
            }

            /// The residency events queued since the last call (a cache built
            /// with `events=True`): tuples `("stored", tier, node, parent,
            /// namespace, prefix_len, tokens)`, `("removed", tier, node,
            /// tokens)`, `("split", tier, node, prefix, moved)`,
            /// `("cleared",)`.
            fn take_events<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
                let log = self.events.as_ref().ok_or_else(|| invalid(py, "this cache was built without events=True".into()))?;
                let items = log
                    .take()
                    .into_iter()
                    .map(|e| event_to_py(py, e))
                    .collect::<PyResult<Vec<_>>>()?;
                PyList::new(py, items)
            }

            /// Test hook: the next store parks its thread inside the insert
            /// (events on), until released or for `timeout_s` at most.
            #[cfg(feature = "test-hooks")]
            #[pyo3(signature = (timeout_s=30.0))]
            fn _hold_next_store(&self, py: Python<'_>, timeout_s: f64) -> PyResult<()> {
                let limit = std::time::Duration::try_from_secs_f64(timeout_s).unwrap_or_default();
                self.log(py)?.gate.hold_next_store(limit);
                Ok(())
            }

            /// Test hook: waits (GIL released) until a store is parked.
            #[cfg(feature = "test-hooks")]
            fn _wait_store_parked(&self, py: Python<'_>, timeout_s: f64) -> PyResult<bool> {
                let log = Arc::clone(self.log(py)?);
                let limit = std::time::Duration::try_from_secs_f64(timeout_s).unwrap_or_default();
                Ok(py.detach(move || log.gate.wait_parked(limit)))
            }

            /// Test hook: lets a parked store go; whether one was parked.
            #[cfg(feature = "test-hooks")]
            fn _release_store(&self, py: Python<'_>) -> PyResult<bool> {
                Ok(self.log(py)?.gate.release())
            }

            /// Test hook: whether the parked store gave up waiting.
            #[cfg(feature = "test-hooks")]
            fn _store_timed_out(&self, py: Python<'_>) -> PyResult<bool> {
                Ok(self.log(py)?.gate.timed_out())
            }
        }

        #[cfg(feature = "test-hooks")]
        impl $ty {
            fn log(&self, py: Python<'_>) -> PyResult<&Arc<EventLog>> {
                self.events.as_ref().ok_or_else(|| invalid(py, "this cache was built without events=True".into()))
            }
        }
    };
}

/// `tier`, or device 0 when not given.
pub(crate) fn tier_or_zero(t: Option<&Bound<'_, PyAny>>) -> PyResult<radixkv::Tier> {
    match t {
        None => Ok(radixkv::DeviceId(0).into()),
        Some(t) => tier(t, "tier"),
    }
}

/// A radix-tree prefix cache over token ids whose values (KV slot indices)
/// come from the caller: `insert(tokens, values)`, and eviction returns
/// them. Thread-safe; every call that walks the tree releases the GIL.
#[pyclass(module = "radixkv", frozen)]
pub struct RadixCache {
    inner: Arc<radixkv::RadixCache>,
    events: Option<Arc<EventLog>>,
}

shared_methods!(RadixCache, {
    /// A cache of `devices` devices (tiers `0..devices`, plus `"host"`
    /// with `host_pages`), `page_size` tokens a page.
    #[new]
    #[pyo3(signature = (*, page_size=1, devices=1, eviction_policy="lru", clock="logical", host_pages=None, replica_aware=false, events=false, hit_counts="match", slru_protected_threshold=None, tlru_threshold=0, tlru_next_prompt_estimate=0))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        page_size: usize,
        devices: usize,
        eviction_policy: &str,
        clock: &str,
        host_pages: Option<usize>,
        replica_aware: bool,
        events: bool,
        hit_counts: &str,
        slru_protected_threshold: Option<u64>,
        tlru_threshold: u64,
        tlru_next_prompt_estimate: u64,
    ) -> PyResult<Self> {
        let o = Options {
            page_size,
            devices,
            eviction_policy,
            clock,
            host_pages,
            replica_aware,
            events,
            hit_counts,
            slru_protected_threshold,
            tlru_threshold,
            tlru_next_prompt_estimate,
        };
        let (b, events) = configure(py, radixkv::RadixCache::builder(), &o)?;
        let inner = b.build().map_err(|e| cache_error(py, e))?;
        Ok(RadixCache {
            inner: Arc::new(inner),
            events,
        })
    }

    /// Caches `tokens` on `tier` with one value per token; returns how many
    /// leading tokens were already cached there (their values are
    /// duplicates the caller keeps). Existing values are never replaced.
    /// `inserted_len`: the tokens the same request inserted before (with
    /// `hit_counts="insert"`, only nodes ending past it count a hit).
    #[pyo3(signature = (tokens, values, *, tier=None, namespace=None, priority=0, inserted_len=0))]
    #[allow(clippy::too_many_arguments)]
    fn insert(
        &self,
        py: Python<'_>,
        tokens: &Bound<'_, PyAny>,
        values: &Bound<'_, PyAny>,
        tier: Option<&Bound<'_, PyAny>>,
        namespace: Option<String>,
        priority: i64,
        inserted_len: usize,
    ) -> PyResult<InsertResult> {
        let t = tier_or_zero(tier)?;
        let k = Key::read(tokens, namespace)?;
        let v = ids(values, "values")?;
        let inner = Arc::clone(&self.inner);
        let r = crate::gil::walk(py, k.len(), || {
            inner.insert_counting(k.key(), t, v.as_slice(), priority, inserted_len)
        })
        .map_err(|e| cache_error(py, e))?;
        Ok(r.into())
    }
});

/// A prefix cache that owns its pages: a page allocator per tier, page
/// spans, requests, copies between tiers, write-back, a background
/// evictor. Thread-safe; every call that walks the tree releases the GIL.
#[pyclass(module = "radixkv", frozen)]
pub struct PagedCache {
    pub(crate) inner: Arc<radixkv::PagedCache>,
    events: Option<Arc<EventLog>>,
}

shared_methods!(PagedCache, {
    /// A cache of `devices` devices with `pages_per_device` pages each
    /// (page 0 reserved) of `page_size` slots; `host_pages` adds a host
    /// tier with its own allocator; `watermarks=(low, high)` in free pages
    /// drive the background evictor.
    #[new]
    #[pyo3(signature = (*, pages_per_device, page_size=1, devices=1, eviction_policy="lru", clock="logical", host_pages=None, replica_aware=false, watermarks=None, events=false, hit_counts="match", slru_protected_threshold=None, tlru_threshold=0, tlru_next_prompt_estimate=0))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        pages_per_device: usize,
        page_size: usize,
        devices: usize,
        eviction_policy: &str,
        clock: &str,
        host_pages: Option<usize>,
        replica_aware: bool,
        watermarks: Option<(usize, usize)>,
        events: bool,
        hit_counts: &str,
        slru_protected_threshold: Option<u64>,
        tlru_threshold: u64,
        tlru_next_prompt_estimate: u64,
    ) -> PyResult<Self> {
        let o = Options {
            page_size,
            devices,
            eviction_policy,
            clock,
            host_pages,
            replica_aware,
            events,
            hit_counts,
            slru_protected_threshold,
            tlru_threshold,
            tlru_next_prompt_estimate,
        };
        let (b, events) = configure(py, radixkv::RadixCache::builder(), &o)?;
        let mut b = b.pages_per_device(pages_per_device);
        if let Some((low, high)) = watermarks {
            b = b.watermarks(low, high);
        }
        let inner = b.build().map_err(|e| cache_error(py, e))?;
        Ok(PagedCache {
            inner: Arc::new(inner),
            events,
        })
    }

    /// Allocates pages for `num_tokens` tokens on `tier`, evicting the
    /// shortfall if the tier is short.
    #[pyo3(signature = (num_tokens, *, tier=None))]
    fn alloc(
        &self,
        py: Python<'_>,
        num_tokens: usize,
        tier: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<crate::pages::PageSpan> {
        let t = tier_or_zero(tier)?;
        let inner = Arc::clone(&self.inner);
        let s = py
            .detach(|| inner.alloc(t, num_tokens))
            .map_err(|e| cache_error(py, e))?;
        Ok(crate::pages::PageSpan::new(s))
    }

    /// Caches `tokens` on the span's tier with the span's pages; pages of
    /// tokens already cached go back. The span is consumed either way.
    #[pyo3(signature = (tokens, span, *, namespace=None, priority=0))]
    fn insert_pages(
        &self,
        py: Python<'_>,
        tokens: &Bound<'_, PyAny>,
        span: &Bound<'_, crate::pages::PageSpan>,
        namespace: Option<String>,
        priority: i64,
    ) -> PyResult<InsertResult> {
        let k = Key::read(tokens, namespace)?;
        let s = span.get().take(py)?;
        let inner = Arc::clone(&self.inner);
        let r = py
            .detach(|| inner.insert_pages(k.key(), s, priority))
            .map_err(|e| cache_error(py, e))?;
        Ok(r.into())
    }

    /// Free pages on `tier` now.
    #[pyo3(signature = (tier=None))]
    fn free_pages(&self, py: Python<'_>, tier: Option<&Bound<'_, PyAny>>) -> PyResult<usize> {
        let t = tier_or_zero(tier)?;
        Ok(self
            .inner
            .allocator(t)
            .map_err(|e| cache_error(py, e))?
            .free_pages())
    }

    /// Pages of `tier`'s pool, page 0 included.
    #[pyo3(signature = (tier=None))]
    fn num_pages(&self, py: Python<'_>, tier: Option<&Bound<'_, PyAny>>) -> PyResult<usize> {
        let t = tier_or_zero(tier)?;
        Ok(self
            .inner
            .allocator(t)
            .map_err(|e| cache_error(py, e))?
            .num_pages())
    }

    /// The watermarks `(low, high)` now, or `None`.
    #[getter]
    fn watermarks(&self) -> Option<(usize, usize)> {
        self.inner.watermarks()
    }

    /// Moves the watermarks (a cache built with them).
    fn set_watermarks(&self, py: Python<'_>, low: usize, high: usize) -> PyResult<()> {
        self.inner
            .set_watermarks(low, high)
            .map_err(|e| cache_error(py, e))
    }

    /// Starts a request for `tokens` on `device`: matches and pins the
    /// longest cached prefix short of the last token.
    #[pyo3(signature = (tokens, *, device=0, namespace=None))]
    fn begin(
        &self,
        py: Python<'_>,
        tokens: &Bound<'_, PyAny>,
        device: u32,
        namespace: Option<String>,
    ) -> PyResult<crate::pages::Request> {
        let k = Key::read(tokens, namespace)?;
        let inner = Arc::clone(&self.inner);
        let r = py
            .detach(|| inner.begin(k.key(), radixkv::DeviceId(device)))
            .map_err(|e| cache_error(py, e))?;
        Ok(crate::pages::Request::new(r))
    }

    /// Plans a copy of the part of `tokens` that `source` holds beyond
    /// what `dest` holds (`None` if nothing): pins both, allocates on
    /// `dest`. Move the KV run by run, then `complete()`.
    #[pyo3(signature = (tokens, source, dest, *, namespace=None))]
    fn copy_prefix(
        &self,
        py: Python<'_>,
        tokens: &Bound<'_, PyAny>,
        source: &Bound<'_, PyAny>,
        dest: &Bound<'_, PyAny>,
        namespace: Option<String>,
    ) -> PyResult<Option<crate::pages::PrefixCopy>> {
        let (s, d) = (tier(source, "source")?, tier(dest, "dest")?);
        let k = Key::read(tokens, namespace)?;
        let inner = Arc::clone(&self.inner);
        let c = py
            .detach(|| inner.copy_prefix(k.key(), s, d))
            .map_err(|e| cache_error(py, e))?;
        Ok(c.map(crate::pages::PrefixCopy::new))
    }

    /// `evict` with write-back to the host tier: `write(copy)` moves each
    /// victim's KV to the host (runs of `copy.runs()`) and returns whether
    /// it did.
    #[pyo3(signature = (num_tokens, write, *, tier=None))]
    fn evict_with_write_back(
        &self,
        py: Python<'_>,
        num_tokens: usize,
        write: Py<PyAny>,
        tier: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Evicted> {
        let t = tier_or_zero(tier)?;
        let inner = Arc::clone(&self.inner);
        // The eviction runs with the GIL released; each write takes it
        // back to call Python (a write that raises counts as failed:
        // its victim is evicted without a copy, as the core says).
        let e = py
            .detach(|| {
                inner.evict_with_write_back(t, num_tokens, |copy| {
                    Python::attach(|py| {
                        let view = crate::pages::CopyView::of(copy);
                        write
                            .bind(py)
                            .call1((view,))
                            .and_then(|r| r.is_truthy())
                            .unwrap_or(false)
                    })
                })
            })
            .map_err(|e| cache_error(py, e))?;
        Evicted::new(py, e)
    }

    /// Starts the background evictor (a cache built with watermarks).
    fn start_evictor(&self, py: Python<'_>) -> PyResult<crate::pages::Evictor> {
        let e = self.inner.start_evictor().map_err(|e| cache_error(py, e))?;
        Ok(crate::pages::Evictor::new(e))
    }
});
