//! What the cache's calls return to Python: leases (closable, context
//! managers, keeping their cache alive), node handles, and plain result
//! objects with the core's fields.

use crate::convert::{array, tier_to_py};
use crate::errors::closed;
use pyo3::prelude::*;
use radixkv_py_macros::py_methods;
use std::sync::Mutex;

/// A pin on a matched prefix on one tier: while it is open, the prefix's
/// values stay resident there, unchanged. `close()` (or leaving a `with`
/// block, or the lease being collected) releases it. A lease keeps its
/// cache alive.
#[pyclass(module = "radixkv", frozen)]
pub struct Lease {
    lease: Mutex<Option<radixkv::Lease>>,
    tier: radixkv::Tier,
    /// The Python cache object the lease belongs to (kept alive).
    _cache: Py<PyAny>,
}

impl Lease {
    pub(crate) fn new(lease: radixkv::Lease, cache: Py<PyAny>) -> Lease {
        Lease {
            tier: lease.tier(),
            lease: Mutex::new(Some(lease)),
            _cache: cache,
        }
    }
}

impl Lease {
    fn release(&self) {
        let l = self.lease.lock().unwrap_or_else(|p| p.into_inner()).take();
        drop(l);
    }

    fn is_closed(&self) -> bool {
        self.lease
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_none()
    }
}

#[py_methods]
impl Lease {
    /// Releases the pin (again: nothing).
    fn close(&self) {
        self.release();
    }

    /// Whether the lease was closed.
    #[getter]
    fn closed(&self) -> bool {
        self.is_closed()
    }

    /// Whether the lease protects nothing (the match was empty).
    #[getter]
    fn empty(&self) -> bool {
        self.lease
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .is_none_or(radixkv::Lease::is_empty)
    }

    /// The tier the lease holds pages on (a device index, or `"host"`).
    #[getter]
    fn tier(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        tier_to_py(py, self.tier)
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, _args: &Bound<'_, pyo3::types::PyTuple>) -> bool {
        self.release();
        false
    }

    fn __repr__(&self) -> String {
        format!(
            "Lease(tier={}, closed={})",
            match self.tier {
                radixkv::Tier::Host => "'host'".to_string(),
                radixkv::Tier::Device(d) => d.0.to_string(),
            },
            self.is_closed()
        )
    }
}

/// The end node of a match, to pin later with `cache.pin(handle)`.
#[pyclass(module = "radixkv", frozen)]
pub struct NodeHandle {
    pub(crate) handle: radixkv::NodeHandle,
}

#[py_methods]
impl NodeHandle {
    /// Whether the match matched nothing.
    #[getter]
    fn is_root(&self) -> bool {
        self.handle.is_root()
    }

    /// The tier of the match.
    #[getter]
    fn tier(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        tier_to_py(py, self.handle.tier())
    }
}

/// The result of a match on one tier.
#[pyclass(module = "radixkv", frozen, get_all)]
pub struct MatchResult {
    /// Tokens of the key resident on the tier (a multiple of the page size).
    pub len: usize,
    /// Their values (`numpy.uint32`); empty unless the match was pinned.
    pub values: Py<PyAny>,
    /// The pin of `match_and_pin` (`None` for `match_prefix`).
    pub lease: Option<Py<Lease>>,
    /// The end node, to pin later.
    pub handle: Py<NodeHandle>,
    /// The longest prefix resident on any device…
    pub any_len: usize,
    /// …and that device (`None`: no device holds any of it).
    pub any_device: Option<u32>,
    /// Tokens resident on the host tier (0 without one).
    pub host_len: usize,
    /// Hits of the end node on the tier, this match included.
    pub hits: u64,
}

impl MatchResult {
    pub(crate) fn new(
        py: Python<'_>,
        m: radixkv::MatchResult,
        cache: Py<PyAny>,
    ) -> PyResult<MatchResult> {
        let lease = match m.lease {
            Some(l) => Some(Py::new(py, Lease::new(l, cache))?),
            None => None,
        };
        Ok(MatchResult {
            len: m.len,
            values: array(py, &m.values)?,
            lease,
            handle: Py::new(py, NodeHandle { handle: m.handle })?,
            any_len: m.any_len,
            any_device: m.any_device.map(|d| d.0),
            host_len: m.host_len,
            hits: m.hits,
        })
    }
}

#[py_methods]
impl MatchResult {
    fn __repr__(&self) -> String {
        format!(
            "MatchResult(len={}, any_len={}, any_device={:?}, host_len={}, hits={}, pinned={})",
            self.len,
            self.any_len,
            self.any_device,
            self.host_len,
            self.hits,
            self.lease.is_some()
        )
    }
}

/// What an insert did with the caller's values.
#[pyclass(module = "radixkv", frozen, get_all)]
pub struct InsertResult {
    /// Leading tokens that were already cached on the tier: the caller's
    /// values for them are duplicates.
    pub prefix_len: usize,
    /// `(start, end)` ranges of the caller's values the cache now owns.
    pub adopted: Vec<(usize, usize)>,
    /// `(start, end)` ranges of the caller's values the cache did not take.
    pub duplicates: Vec<(usize, usize)>,
}

impl From<radixkv::InsertResult> for InsertResult {
    fn from(r: radixkv::InsertResult) -> Self {
        InsertResult {
            prefix_len: r.prefix_len,
            adopted: r.adopted.iter().map(|a| (a.start, a.end)).collect(),
            duplicates: r.duplicates().iter().map(|a| (a.start, a.end)).collect(),
        }
    }
}

#[py_methods]
impl InsertResult {
    fn __repr__(&self) -> String {
        format!(
            "InsertResult(prefix_len={}, adopted={:?})",
            self.prefix_len, self.adopted
        )
    }
}

/// What an eviction freed.
#[pyclass(module = "radixkv", frozen, get_all)]
pub struct Evicted {
    /// Tokens evicted (whole leaves, so possibly more than asked).
    pub tokens: usize,
    /// Leaves evicted.
    pub leaves: usize,
    /// Their values, in eviction order (`numpy.uint32`; empty when the
    /// cache owns its pages, which it returned to its allocator).
    pub values: Py<PyAny>,
    /// Pages returned to the allocator (a cache that owns its pages).
    pub pages: usize,
    /// Tokens copied to the host tier first (`evict_with_write_back`).
    pub written_back: usize,
    /// Candidates the call looked at.
    pub examined: usize,
}

impl Evicted {
    pub(crate) fn new(py: Python<'_>, e: radixkv::Evicted) -> PyResult<Evicted> {
        Ok(Evicted {
            tokens: e.tokens,
            leaves: e.leaves,
            values: array(py, &e.values)?,
            pages: e.pages,
            written_back: e.written_back,
            examined: e.examined,
        })
    }
}

#[py_methods]
impl Evicted {
    fn __repr__(&self) -> String {
        format!(
            "Evicted(tokens={}, leaves={}, pages={}, written_back={})",
            self.tokens, self.leaves, self.pages, self.written_back
        )
    }
}

/// Cached token counts on one tier.
#[pyclass(module = "radixkv", frozen, get_all)]
pub struct Sizes {
    /// Tokens eviction may take now.
    pub evictable: usize,
    /// Tokens on a pinned node's path.
    pub protected: usize,
    /// All tokens resident on the tier.
    pub total: usize,
    /// Nodes resident on the tier.
    pub nodes: usize,
}

impl From<radixkv::Sizes> for Sizes {
    fn from(s: radixkv::Sizes) -> Self {
        Sizes {
            evictable: s.evictable,
            protected: s.protected,
            total: s.total,
            nodes: s.nodes,
        }
    }
}

#[py_methods]
impl Sizes {
    fn __repr__(&self) -> String {
        format!(
            "Sizes(evictable={}, protected={}, total={}, nodes={})",
            self.evictable, self.protected, self.total, self.nodes
        )
    }
}

/// `LeaseClosed` unless `slot` still holds its object; the object taken
/// out while a call uses it (so that no lock is held while the GIL is
/// released), to be put back with [`put_back`].
pub(crate) fn take_out<T>(py: Python<'_>, slot: &Mutex<Option<T>>, what: &str) -> PyResult<T> {
    slot.lock()
        .unwrap_or_else(|p| p.into_inner())
        .take()
        .ok_or_else(|| closed(py, what))
}

/// Puts an object taken with [`take_out`] back.
pub(crate) fn put_back<T>(slot: &Mutex<Option<T>>, v: T) {
    *slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(v);
}
