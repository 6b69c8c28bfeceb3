//! `SglangTree` and `SglangNode`: the tree under `radixkv.sglang`'s
//! backend, with the operations SGLang's `RadixCache` performs, each one
//! call (GIL released while the tree is walked).
//!
//! Every call first asks the mirror whether it is consistent: once it is
//! not, each raises `radixkv.errors.CacheError` naming the first
//! inconsistency, and no size is answered.

use crate::convert::array_i64;
use crate::errors::{cache_error, failed, invalid};
use crate::ids::{ids, Ids};
use crate::sglang::mirror::{LockRefused, Mirror, Namespace, RawEvent, Shape, ROOT};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};
use radixkv::{CacheError, ClockKind, DeviceId, EvictionPolicy, HitCounts, TokenKey};
use radixkv_py_macros::py_methods;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, MutexGuard};

/// The one device of an SGLang scheduler's tree.
const DEVICE: DeviceId = DeviceId(0);

/// Tells trees apart (a node of one is refused by another).
static NEXT_TREE: AtomicU64 = AtomicU64::new(1);

/// A node of an `SglangTree`, as SGLang holds it (`req.last_node`, a match
/// result's nodes): opaque, hashable; it names the same end position
/// across splits (the split's upper part is a new node) and is refused
/// once its node left the tree.
#[pyclass(module = "radixkv", frozen)]
pub struct SglangNode {
    tree: u64,
    id: u64,
    handle: Option<radixkv::NodeHandle>,
    mirror: Arc<Mirror>,
}

#[py_methods]
impl SglangNode {
    /// The node's id (unique for its tree's life).
    #[getter]
    fn id(&self) -> u64 {
        self.id
    }

    /// The id of the tree the node belongs to (`SglangTree.id`).
    #[getter]
    fn tree_id(&self) -> u64 {
        self.tree
    }

    /// Whether this is the root (an empty match).
    #[getter]
    fn is_root(&self) -> bool {
        self.id == ROOT
    }

    /// Locks held on this node or below it (the root: 1, as in SGLang);
    /// `None` once the node left the tree. Raises `CacheError` once the
    /// tree's mirror is inconsistent.
    #[getter]
    fn lock_ref(&self, py: Python<'_>) -> PyResult<Option<u64>> {
        Ok(usable(py, &self.mirror)?.lock_ref(self.id))
    }

    fn __hash__(&self) -> u64 {
        self.id ^ self.tree.rotate_left(32)
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other
            .cast::<SglangNode>()
            .is_ok_and(|o| o.get().tree == self.tree && o.get().id == self.id)
    }

    fn __repr__(&self) -> String {
        if self.id == ROOT {
            "SglangNode(root)".into()
        } else {
            format!("SglangNode(id={})", self.id)
        }
    }
}

/// The tree of SGLang's backend: one device, SGLang 0.5.23's rules (hits
/// on insert, slru's threshold, a logical clock), and the mirror that
/// answers sizes, lock counts, the dfs-weight order and KV events.
#[pyclass(module = "radixkv", frozen)]
pub struct SglangTree {
    id: u64,
    cache: Arc<radixkv::RadixCache>,
    mirror: Arc<Mirror>,
    root: Py<SglangNode>,
    page_size: usize,
}

/// The mirror's state, locked, if it is consistent; otherwise the
/// `CacheError` naming its first inconsistency.
fn usable<'m>(py: Python<'_>, mirror: &'m Mirror) -> PyResult<MutexGuard<'m, Shape>> {
    let shape = mirror.shape();
    match shape.usable() {
        Ok(()) => Ok(shape),
        Err(what) => Err(broken(py, &what)),
    }
}

/// The error every call raises once the mirror is inconsistent.
fn broken(py: Python<'_>, what: &str) -> PyErr {
    failed(
        py,
        format!("radixkv's SGLang tree is inconsistent and refuses every call (reset() starts a new one): {what}"),
    )
}

/// A key SGLang passes (a `RadixKey`): its ids up to its limit, floored
/// to whole pages, and its namespace.
struct SgKey {
    ids: Ids,
    len: usize,
    namespace: Option<String>,
}

impl SgKey {
    fn read(key: &Bound<'_, PyAny>, page_size: usize) -> PyResult<SgKey> {
        let py = key.py();
        if key.getattr(intern!(py, "is_bigram"))?.is_truthy()? {
            return Err(invalid(
                py,
                "key: bigram (EAGLE) keys are not supported by radixkv's backend".into(),
            ));
        }
        let ids = ids(&key.getattr(intern!(py, "token_ids"))?, "key.token_ids")?;
        let limit: Option<usize> = key.getattr(intern!(py, "limit"))?.extract()?;
        let raw = limit.map_or(ids.as_slice().len(), |l| l.min(ids.as_slice().len()));
        let extra: Option<String> = key.getattr(intern!(py, "extra_key"))?.extract()?;
        let salt: Option<String> = key.getattr(intern!(py, "cache_salt"))?.extract()?;
        Ok(SgKey {
            len: raw / page_size * page_size,
            namespace: Namespace::encode(extra.as_deref(), salt.as_deref()),
            ids,
        })
    }

    fn key(&self) -> TokenKey<'_> {
        TokenKey::new(&self.ids.as_slice()[..self.len]).in_namespace(self.namespace.as_deref())
    }
}

impl SglangTree {
    /// The mirror, locked, if it is consistent (see [`usable`]).
    fn state(&self, py: Python<'_>) -> PyResult<MutexGuard<'_, Shape>> {
        usable(py, &self.mirror)
    }

    /// Raises if the mirror is inconsistent (before a call, and after a
    /// call that changed the tree).
    fn check_usable(&self, py: Python<'_>) -> PyResult<()> {
        self.state(py).map(drop)
    }

    fn node(&self, py: Python<'_>, handle: radixkv::NodeHandle) -> PyResult<Py<SglangNode>> {
        match handle.id() {
            None => Ok(self.root.clone_ref(py)),
            Some(id) => Py::new(
                py,
                SglangNode {
                    tree: self.id,
                    id,
                    handle: Some(handle),
                    mirror: Arc::clone(&self.mirror),
                },
            ),
        }
    }

    /// `node` if it is this tree's.
    fn own<'a>(&self, py: Python<'_>, node: &'a SglangNode) -> PyResult<&'a SglangNode> {
        if node.tree != self.id {
            return Err(cache_error(py, CacheError::ForeignHandle));
        }
        Ok(node)
    }
}

#[py_methods]
impl SglangTree {
    /// An empty tree of `page_size` tokens a page evicting by
    /// `eviction_policy` (SGLang's lru, lfu, fifo, mru, filo, priority,
    /// slru; tlru is refused, as SGLang's `RadixCache` has no such order);
    /// slru protects a node with `slru_protected_threshold` hits;
    /// with `events`, KV events are kept for `take_events`.
    #[new]
    #[pyo3(signature = (*, page_size, eviction_policy="lru", slru_protected_threshold=None, events=false))]
    fn new(
        py: Python<'_>,
        page_size: usize,
        eviction_policy: &str,
        slru_protected_threshold: Option<u64>,
        events: bool,
    ) -> PyResult<Self> {
        let policy: EvictionPolicy = eviction_policy
            .parse()
            .map_err(|e: radixkv::cache::UnknownPolicy| invalid(py, e.to_string()))?;
        if policy == EvictionPolicy::Tlru {
            return Err(invalid(
                py,
                "eviction policy \"tlru\": SGLang's RadixCache, which this tree is, does not \
                 rank by it (SGLang allows it only for its UnifiedRadixCache)"
                    .to_string(),
            ));
        }
        let mirror = Arc::new(Mirror::new(page_size, events));
        let mut b = radixkv::RadixCache::builder()
            .page_size(page_size)
            .devices(1)
            .eviction_policy(policy)
            .clock(ClockKind::Logical)
            .hit_counts(HitCounts::OnInsert)
            .listener(Arc::clone(&mirror) as Arc<dyn radixkv::events::CacheListener>);
        if let Some(n) = slru_protected_threshold {
            b = b.slru_protected_threshold(n);
        }
        let cache = b.build().map_err(|e| cache_error(py, e))?;
        let id = NEXT_TREE.fetch_add(1, Ordering::Relaxed);
        let root = Py::new(
            py,
            SglangNode {
                tree: id,
                id: ROOT,
                handle: None,
                mirror: Arc::clone(&mirror),
            },
        )?;
        Ok(SglangTree {
            id,
            cache: Arc::new(cache),
            mirror,
            root,
            page_size,
        })
    }

    /// The tree's id (unique in the process; `SglangNode.tree_id`).
    #[getter]
    fn id(&self) -> u64 {
        self.id
    }

    /// The root node (the end of every empty match).
    #[getter]
    fn root(&self, py: Python<'_>) -> Py<SglangNode> {
        self.root.clone_ref(py)
    }

    /// Tokens per page.
    #[getter]
    fn page_size(&self) -> usize {
        self.page_size
    }

    /// Matches SGLang's `RadixKey` `key` (up to its limit, whole pages):
    /// the matched length and the end node (splitting a node where the
    /// match ends inside it).
    fn match_key(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
    ) -> PyResult<(usize, Py<SglangNode>)> {
        self.check_usable(py)?;
        let k = SgKey::read(key, self.page_size)?;
        if k.len == 0 {
            return Ok((0, self.root.clone_ref(py)));
        }
        let cache = Arc::clone(&self.cache);
        let m = crate::gil::walk(py, k.len, || cache.match_prefix(k.key(), DEVICE))
            .map_err(|e| cache_error(py, e))?;
        // A match may split a node.
        self.check_usable(py)?;
        Ok((m.len, self.node(py, m.handle)?))
    }

    /// Inserts `key` (a `RadixKey`, up to its limit, whole pages) with the
    /// first `len(key)` of `values` at `priority`, counting hits past
    /// `inserted_len`: how many leading tokens were cached before.
    fn insert_key(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        values: &Bound<'_, PyAny>,
        priority: i64,
        inserted_len: usize,
    ) -> PyResult<usize> {
        self.check_usable(py)?;
        let k = SgKey::read(key, self.page_size)?;
        let v = ids(values, "value")?;
        if v.as_slice().len() < k.len {
            return Err(invalid(
                py,
                format!(
                    "value: {} values for a key of {} tokens",
                    v.as_slice().len(),
                    k.len
                ),
            ));
        }
        if k.len == 0 {
            return Ok(0);
        }
        let cache = Arc::clone(&self.cache);
        let prefix_len = crate::gil::walk(py, k.len, || {
            cache.insert_counting(
                k.key(),
                DEVICE,
                &v.as_slice()[..k.len],
                priority,
                inserted_len,
            )
        })
        .map(|r| r.prefix_len)
        .map_err(|e| cache_error(py, e))?;
        self.check_usable(py)?;
        Ok(prefix_len)
    }

    /// A request's checkpoint (SGLang's `RadixCache.checkpoint`, the tree
    /// part): inserts the first `key_len` of `ids` (whole pages) with
    /// `values`, at `priority`, counting hits past `inserted_len`; if the
    /// prompt (`prompt_len` tokens, floored to pages) ends inside that key,
    /// re-inserts the prompt one priority higher so that a node ends there;
    /// then matches the key and locks its end node (as `inc_lock_ref`, in
    /// the same call: no other thread's eviction can take the node between
    /// the match and the lock). Returns the first insert's prefix length,
    /// the end node (locked once more), its path's values (int64) and the
    /// lock's change of the evictable size (≤ 0).
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (ids_, values, key_len, extra_key, cache_salt, priority, inserted_len, prompt_len))]
    fn checkpoint(
        &self,
        py: Python<'_>,
        ids_: &Bound<'_, PyAny>,
        values: &Bound<'_, PyAny>,
        key_len: usize,
        extra_key: Option<&str>,
        cache_salt: Option<&str>,
        priority: i64,
        inserted_len: usize,
        prompt_len: usize,
    ) -> PyResult<(usize, Py<SglangNode>, Py<PyAny>, i64)> {
        self.check_usable(py)?;
        let t = ids(ids_, "ids")?;
        let v = ids(values, "values")?;
        let ps = self.page_size;
        if !key_len.is_multiple_of(ps)
            || key_len > t.as_slice().len()
            || v.as_slice().len() != key_len
        {
            return Err(invalid(
                py,
                format!(
                    "checkpoint: key_len {key_len} must be whole pages of the {} ids, with as many values (got {})",
                    t.as_slice().len(),
                    v.as_slice().len()
                ),
            ));
        }
        if key_len == 0 {
            return Ok((0, self.root.clone_ref(py), array_i64(py, &[])?, 0));
        }
        let ns = Namespace::encode(extra_key, cache_salt);
        let tokens = &t.as_slice()[..key_len];
        let vals = v.as_slice();
        let prompt = prompt_len.min(key_len) / ps * ps;
        let cache = Arc::clone(&self.cache);
        let (prefix_len, m) = crate::gil::walk(py, key_len, || -> Result<_, CacheError> {
            let key = TokenKey::new(tokens).in_namespace(ns.as_deref());
            let r = cache.insert_counting(key, DEVICE, vals, priority, inserted_len)?;
            if prompt > 0 && prompt < key_len {
                let pk = TokenKey::new(&tokens[..prompt]).in_namespace(ns.as_deref());
                cache.insert_counting(
                    pk,
                    DEVICE,
                    &vals[..prompt],
                    priority.saturating_add(1),
                    prompt,
                )?;
            }
            // Matched and pinned in one walk: the pin holds the node
            // until the mirror's lock takes it over below.
            let m = cache.match_and_pin(key, DEVICE)?;
            Ok((r.prefix_len, m))
        })
        .map_err(|e| cache_error(py, e))?;
        if m.values.len() != key_len {
            return Err(failed(
                py,
                format!(
                    "checkpoint: the key's {key_len} tokens matched {} after the insert",
                    m.values.len()
                ),
            ));
        }
        let (Some(id), Some(lease)) = (m.handle.id(), m.lease) else {
            return Err(failed(
                py,
                "checkpoint: a non-empty match ended at the root".into(),
            ));
        };
        let delta = self
            .state(py)?
            .lock(id, lease)
            .map_err(|r| refused(py, id, r))?;
        Ok((
            prefix_len,
            self.node(py, m.handle)?,
            array_i64(py, &m.values)?,
            delta,
        ))
    }

    /// Evicts unlocked leaves in policy order until `num_tokens` are gone
    /// (whole nodes): the tokens evicted, their values (int64, in eviction
    /// order) and where each node's values end in them.
    fn evict(&self, py: Python<'_>, num_tokens: usize) -> PyResult<(usize, Py<PyAny>, Vec<usize>)> {
        self.check_usable(py)?;
        let cache = Arc::clone(&self.cache);
        let e = py
            .detach(|| cache.evict(DEVICE, num_tokens))
            .map_err(|e| cache_error(py, e))?;
        // The values are the caller's to free whatever follows: they left
        // the tree. An inconsistency found on the way is raised by the
        // next call.
        Ok((e.tokens, array_i64(py, &e.values)?, e.leaf_ends))
    }

    /// Locks `node`'s path against eviction (locks nest): the change of
    /// the evictable size (≤ 0). The core pin behind the lock, the lock
    /// counts and the sizes change together, under the mirror's lock.
    fn inc_lock_ref(&self, py: Python<'_>, node: &Bound<'_, SglangNode>) -> PyResult<i64> {
        let n = self.own(py, node.get())?;
        let mut shape = self.state(py)?;
        let Some(handle) = &n.handle else {
            return Ok(0);
        };
        shape.lockable(n.id).map_err(|r| refused(py, n.id, r))?;
        let lease = self.cache.pin(handle).map_err(|e| cache_error(py, e))?;
        shape.lock(n.id, lease).map_err(|r| refused(py, n.id, r))
    }

    /// Releases one lock of `node`: the change of the evictable size (≥ 0).
    /// The lock counts, the sizes and the core pin behind the lock change
    /// together, under the mirror's lock.
    fn dec_lock_ref(&self, py: Python<'_>, node: &Bound<'_, SglangNode>) -> PyResult<i64> {
        let n = self.own(py, node.get())?;
        let mut shape = self.state(py)?;
        let (delta, lease) = shape.unlock(n.id).map_err(|r| refused(py, n.id, r))?;
        // Unpinned with the mirror still locked: no other call sees the
        // lock gone and the pin still held, or the reverse.
        drop(lease);
        drop(shape);
        Ok(delta)
    }

    /// The values of the path root → `node` (int64).
    fn path_values(&self, py: Python<'_>, node: &Bound<'_, SglangNode>) -> PyResult<Py<PyAny>> {
        let n = self.own(py, node.get())?;
        self.check_usable(py)?;
        let Some(handle) = &n.handle else {
            return array_i64(py, &[]);
        };
        let cache = Arc::clone(&self.cache);
        let path = py
            .detach(|| cache.path_values(handle))
            .map_err(|e| cache_error(py, e))?;
        array_i64(py, &path)
    }

    /// Tokens no lock protects (O(1)).
    fn evictable_size(&self, py: Python<'_>) -> PyResult<usize> {
        Ok(self.state(py)?.evictable())
    }

    /// Tokens on a locked path (O(1)).
    fn protected_size(&self, py: Python<'_>) -> PyResult<usize> {
        Ok(self.state(py)?.protected())
    }

    /// Nodes in the tree, the root not counted.
    fn node_count(&self, py: Python<'_>) -> PyResult<usize> {
        Ok(self.state(py)?.node_count())
    }

    /// SGLang's dfs-weight order of a waiting queue whose matches ended at
    /// `nodes`: indices into `nodes`.
    fn dfs_weight_order(&self, py: Python<'_>, nodes: &Bound<'_, PyList>) -> PyResult<Vec<usize>> {
        let mut ends = Vec::with_capacity(nodes.len());
        for item in nodes.iter() {
            let node = item.cast::<SglangNode>().map_err(|_| {
                invalid(
                    py,
                    format!("dfs_weight_order: not a node of this tree: {item}"),
                )
            })?;
            ends.push(self.own(py, node.get())?.id);
        }
        Ok(self.state(py)?.dfs_weight_order(&ends))
    }

    /// The KV events since the last call, raw: `("stored", extra_key,
    /// cache_salt, parent_hash, hashes, tokens, block_size)` and
    /// `("removed", extra_key, cache_salt, hashes)`, hashes before SGLang's
    /// namespace seeding.
    fn take_events<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyTuple>>> {
        let raw = self.state(py)?.take_events();
        let mut out = Vec::with_capacity(raw.len());
        for e in raw {
            out.push(match e {
                RawEvent::Stored {
                    ns,
                    parent,
                    hashes,
                    tokens,
                } => (
                    "stored",
                    ns.extra_key.clone(),
                    ns.cache_salt.clone(),
                    parent,
                    hashes,
                    tokens,
                    self.page_size,
                )
                    .into_pyobject(py)?,
                RawEvent::Removed { ns, hashes } => (
                    "removed",
                    ns.extra_key.clone(),
                    ns.cache_salt.clone(),
                    hashes,
                )
                    .into_pyobject(py)?,
            });
        }
        Ok(out)
    }

    /// (depth, tokens, locks) of every node, depth-first, children in the
    /// order they joined.
    fn outline(&self, py: Python<'_>) -> PyResult<Vec<(usize, usize, u64)>> {
        Ok(self.state(py)?.outline())
    }

    /// Checks the core tree's invariants, the mirror against itself and
    /// the sizes against a scan of the tree; raises `CacheError` naming
    /// the first violation.
    fn audit(&self, py: Python<'_>) -> PyResult<()> {
        self.check_usable(py)?;
        let cache = Arc::clone(&self.cache);
        let (checked, sizes) = py.detach(|| (cache.check(), cache.sizes(DEVICE)));
        if let Err(v) = checked {
            return Err(failed(py, format!("audit failed: {v}")));
        }
        let sizes = sizes.map_err(|e| cache_error(py, e))?;
        let shape = self.state(py)?;
        if let Some(v) = shape.check(sizes.total) {
            return Err(failed(py, format!("audit failed: {v}")));
        }
        if (shape.evictable(), shape.protected()) != (sizes.evictable, sizes.protected) {
            return Err(failed(
                py,
                format!(
                    "audit failed: sizes (evictable, protected) ({}, {}) but the tree's scan ({}, {})",
                    shape.evictable(),
                    shape.protected(),
                    sizes.evictable,
                    sizes.protected
                ),
            ));
        }
        Ok(())
    }

    /// Test hook (feature `test-hooks`): marks the mirror inconsistent with
    /// `what`, as a broken invariant would.
    #[cfg(feature = "test-hooks")]
    fn _break_mirror(&self, what: &str) {
        self.mirror.shape().break_with(what.to_string());
    }
}

/// The Python error of a refused lock or unlock of node `id`.
fn refused(py: Python<'_>, id: u64, r: LockRefused) -> PyErr {
    match r {
        LockRefused::Gone => cache_error(py, CacheError::StaleHandle(DEVICE.into())),
        LockRefused::NotLocked => invalid(py, format!("node {id} holds no lock to release")),
        LockRefused::Broken(what) => broken(py, &what),
    }
}
