//! The objects of a cache that owns its pages: page spans, requests (the
//! lifecycle SGLang's scheduler drives: begin, reserve, commit chunks,
//! finish), copies between tiers, and the background evictor.
//!
//! Each holds its core object in a `Mutex<Option<…>>`: a call takes it
//! out, works with the GIL released, and puts it back, so no lock is held
//! while the GIL is released (a second thread using the same object at
//! that moment gets `LeaseClosed` instead of a deadlock).

use crate::convert::{array, tier_to_py};
use crate::errors::{cache_error, guarded};
use crate::ids::ids;
use crate::results::{put_back, take_out, InsertResult};
use pyo3::prelude::*;
use radixkv_py_macros::py_methods;
use std::sync::Mutex;

/// Pages a caller owns (from `PagedCache.alloc`): closing (or collecting)
/// it returns them to their allocator; `insert_pages` hands them to the
/// tree.
#[pyclass(module = "radixkv", frozen)]
pub struct PageSpan {
    span: Mutex<Option<radixkv::alloc::PageSpan>>,
}

impl PageSpan {
    pub(crate) fn new(s: radixkv::alloc::PageSpan) -> PageSpan {
        PageSpan {
            span: Mutex::new(Some(s)),
        }
    }

    /// The span, taken out for good (inserting it consumes it).
    pub(crate) fn take(&self, py: Python<'_>) -> PyResult<radixkv::alloc::PageSpan> {
        take_out(py, &self.span, "page span")
    }

    fn with<T>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&radixkv::alloc::PageSpan) -> T,
    ) -> PyResult<T> {
        let g = self.span.lock().unwrap_or_else(|p| p.into_inner());
        g.as_ref()
            .map(f)
            .ok_or_else(|| crate::errors::closed(py, "page span"))
    }
}

#[py_methods]
impl PageSpan {
    /// The page ids, in order (`numpy.uint32`).
    #[getter]
    fn pages(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let p = self.with(py, |s| s.pages().to_vec())?;
        array(py, &p)
    }

    /// The slot of every token the span covers, in order (`numpy.uint32`).
    #[getter]
    fn slots(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let s: Vec<u32> = self.with(py, |s| s.slots().collect())?;
        array(py, &s)
    }

    /// Token slots the span covers.
    #[getter]
    fn tokens(&self, py: Python<'_>) -> PyResult<usize> {
        self.with(py, radixkv::alloc::PageSpan::tokens)
    }

    /// The tier whose pages these are.
    #[getter]
    fn tier(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let t = self.with(py, radixkv::alloc::PageSpan::tier)?;
        tier_to_py(py, t)
    }

    /// Returns the pages to their allocator (again: nothing).
    fn close(&self) {
        let s = self.span.lock().unwrap_or_else(|p| p.into_inner()).take();
        drop(s);
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, _args: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<bool> {
        self.close()?;
        Ok(false)
    }
}

/// One request's hold on a `PagedCache`: the cached prefix it reuses
/// (pinned) and the pages it owns for the rest. Closing (or collecting) it
/// aborts: its pages go back and its pin is released.
#[pyclass(module = "radixkv", frozen)]
pub struct Request {
    req: Mutex<Option<radixkv::Request>>,
}

impl Request {
    pub(crate) fn new(r: radixkv::Request) -> Request {
        Request {
            req: Mutex::new(Some(r)),
        }
    }

    fn with<T>(&self, py: Python<'_>, f: impl FnOnce(&radixkv::Request) -> T) -> PyResult<T> {
        let g = self.req.lock().unwrap_or_else(|p| p.into_inner());
        g.as_ref()
            .map(f)
            .ok_or_else(|| crate::errors::closed(py, "request"))
    }

    /// Runs `f` on the request with the GIL released (taken out meanwhile;
    /// its own guard puts it back even after a panic).
    fn detached<T: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut radixkv::Request) -> Result<T, radixkv::CacheError> + Send,
    ) -> PyResult<T> {
        let mut r = take_out(py, &self.req, "request")?;
        let out = guarded(|| Ok(py.detach(|| f(&mut r))));
        put_back(&self.req, r);
        out?.map_err(|e| cache_error(py, e))
    }
}

#[py_methods]
impl Request {
    /// Tokens whose KV comes from the cache (a multiple of the page size).
    #[getter]
    fn cached_len(&self, py: Python<'_>) -> PyResult<usize> {
        self.with(py, radixkv::Request::cached_len)
    }

    /// Tokens that have a slot: the cached prefix plus the owned pages.
    #[getter]
    fn backed_len(&self, py: Python<'_>) -> PyResult<usize> {
        self.with(py, radixkv::Request::backed_len)
    }

    /// Tokens the host tier held beyond nothing when the request began.
    #[getter]
    fn host_len(&self, py: Python<'_>) -> PyResult<usize> {
        self.with(py, radixkv::Request::host_len)
    }

    /// Another device holding a longer prefix when it began: `(device, len)`.
    #[getter]
    fn peer(&self, py: Python<'_>) -> PyResult<Option<(u32, usize)>> {
        self.with(py, |r| r.peer().map(|(d, l)| (d.0, l)))
    }

    /// The request's tokens so far (`numpy.uint32`).
    #[getter]
    fn tokens(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let t = self.with(py, |r| r.tokens().to_vec())?;
        array(py, &t)
    }

    /// The KV slot of every backed token (`numpy.uint32`): the cached
    /// prefix's, then the request's own.
    fn slots(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let s = self.with(py, radixkv::Request::slots)?;
        array(py, &s)
    }

    /// Appends generated tokens (reserve before writing their KV).
    fn extend(&self, py: Python<'_>, tokens: &Bound<'_, PyAny>) -> PyResult<()> {
        let t = ids(tokens, "tokens")?;
        let mut r = take_out(py, &self.req, "request")?;
        r.extend(t.as_slice());
        put_back(&self.req, r);
        Ok(())
    }

    /// Allocates pages so that every token has a slot.
    fn reserve(&self, py: Python<'_>) -> PyResult<()> {
        self.detached(py, |r| r.reserve())
    }

    /// Caches the first `upto` tokens (whole pages) while the request goes
    /// on; the new end is pinned before the old pin is released.
    fn commit_chunk(&self, py: Python<'_>, upto: usize) -> PyResult<InsertResult> {
        self.detached(py, |r| r.commit_chunk(upto)).map(Into::into)
    }

    /// Caches every backed, page-aligned token and ends the request.
    fn finish(&self, py: Python<'_>) -> PyResult<InsertResult> {
        let r = take_out(py, &self.req, "request")?;
        py.detach(|| r.finish())
            .map(Into::into)
            .map_err(|e| cache_error(py, e))
    }

    /// Loads into the request the part of its tokens `source` (a device or
    /// `"host"`) holds beyond its cached prefix: `write(copy)` moves the KV
    /// (`copy.runs()`) and returns whether it did; then the copy completes
    /// and the request's cached prefix grows. Returns the tokens loaded.
    fn load_from(
        &self,
        py: Python<'_>,
        source: &Bound<'_, PyAny>,
        write: &Bound<'_, PyAny>,
    ) -> PyResult<usize> {
        let s = crate::convert::tier(source, "source")?;
        let mut r = take_out(py, &self.req, "request")?;
        // Guarded here too, so that the request is put back after a panic.
        let out = guarded(|| {
            let planned = py.detach(|| r.copy_from(s));
            let Some(copy) = planned.map_err(|e| cache_error(py, e))? else {
                return Ok(0);
            };
            let n = copy.range().len();
            let moved = write.call1((CopyView::of(&copy),))?.is_truthy()?;
            if !moved {
                return Ok(0);
            }
            py.detach(|| copy.complete())
                .map_err(|e| cache_error(py, e))?;
            Ok(n)
        });
        put_back(&self.req, r);
        out
    }

    /// Aborts: pages back, pin released (again: nothing).
    fn close(&self) {
        let r = self.req.lock().unwrap_or_else(|p| p.into_inner()).take();
        drop(r);
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, _args: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<bool> {
        self.close()?;
        Ok(false)
    }
}

/// What a copy moves, for the callable that moves it: the source and
/// destination tiers, the token range, both tiers' slots, and the runs.
#[pyclass(module = "radixkv", frozen, get_all)]
pub struct CopyView {
    /// The tier the KV comes from.
    pub source: Py<PyAny>,
    /// The tier the KV goes to.
    pub dest: Py<PyAny>,
    /// `(start, end)`: the tokens of the key the copy moves.
    pub range: (usize, usize),
    /// The source's slot of every copied token (`numpy.uint32`).
    pub source_slots: Py<PyAny>,
    /// The destination's slot of every copied token (`numpy.uint32`).
    pub dest_slots: Py<PyAny>,
    /// Contiguous runs `(src, dst, len)`: one transfer each.
    pub runs: Vec<(u32, u32, u32)>,
}

impl CopyView {
    /// The view of `c` (with the GIL: it builds Python objects).
    pub(crate) fn of(c: &radixkv::PrefixCopy) -> CopyView {
        Python::attach(|py| CopyView {
            source: tier_to_py(py, c.source()).unwrap_or_else(|_| py.None()),
            dest: tier_to_py(py, c.dest()).unwrap_or_else(|_| py.None()),
            range: (c.range().start, c.range().end),
            source_slots: array(py, c.source_slots()).unwrap_or_else(|_| py.None()),
            dest_slots: array(py, &c.dest_slots()).unwrap_or_else(|_| py.None()),
            runs: c.runs().iter().map(|r| (r.src, r.dst, r.len)).collect(),
        })
    }
}

/// A planned copy between tiers (`PagedCache.copy_prefix`): move the KV
/// run by run, then `complete()`; closing (or collecting) it cancels it.
#[pyclass(module = "radixkv", frozen)]
pub struct PrefixCopy {
    copy: Mutex<Option<radixkv::PrefixCopy>>,
}

impl PrefixCopy {
    pub(crate) fn new(c: radixkv::PrefixCopy) -> PrefixCopy {
        PrefixCopy {
            copy: Mutex::new(Some(c)),
        }
    }
}

#[py_methods]
impl PrefixCopy {
    /// What the copy moves.
    fn view(&self, py: Python<'_>) -> PyResult<CopyView> {
        let g = self.copy.lock().unwrap_or_else(|p| p.into_inner());
        g.as_ref()
            .map(CopyView::of)
            .ok_or_else(|| crate::errors::closed(py, "copy"))
    }

    /// Makes the copied tokens resident on the destination (call it once
    /// the KV is there); duplicates go back, the pins are released.
    fn complete(&self, py: Python<'_>) -> PyResult<InsertResult> {
        let c = take_out(py, &self.copy, "copy")?;
        py.detach(|| c.complete())
            .map(Into::into)
            .map_err(|e| cache_error(py, e))
    }

    /// Cancels the copy: pages back, pins released.
    fn close(&self) {
        let c = self.copy.lock().unwrap_or_else(|p| p.into_inner()).take();
        drop(c);
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, _args: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<bool> {
        self.close()?;
        Ok(false)
    }
}

/// A running background evictor; `stop()` (or collecting it) stops the
/// thread and waits for it.
#[pyclass(module = "radixkv", frozen)]
pub struct Evictor {
    evictor: Mutex<Option<radixkv::Evictor>>,
}

impl Evictor {
    pub(crate) fn new(e: radixkv::Evictor) -> Evictor {
        Evictor {
            evictor: Mutex::new(Some(e)),
        }
    }
}

#[py_methods]
impl Evictor {
    /// `(wakeups, evictions, evicted_pages)` so far.
    fn stats(&self, py: Python<'_>) -> PyResult<(u64, u64, u64)> {
        let g = self.evictor.lock().unwrap_or_else(|p| p.into_inner());
        g.as_ref()
            .map(|e| {
                let s = e.stats();
                (s.wakeups(), s.evictions(), s.evicted_pages())
            })
            .ok_or_else(|| crate::errors::closed(py, "evictor"))
    }

    /// Stops the thread and waits for it (with the GIL released).
    fn stop(&self, py: Python<'_>) {
        let e = self
            .evictor
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        py.detach(move || drop(e));
    }
}
