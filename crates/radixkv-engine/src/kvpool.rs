//! KV-cache memory per device: `layers × 2 (K, V) × slots × row` floats.
//!
//! A slot is where one token's K (or V) row lives; slot `p * page_size + j`
//! belongs to page `p` (see [`radixkv::alloc`]). [`HostKvPool`] keeps the pool
//! in host memory (the default, and what tests use); `CudaKvPool` (feature
//! `cuda`) keeps it in GPU memory through cudarc, loaded at run time, and
//! `PinnedKvPool` (feature `cuda`) in page-locked host memory, which the
//! GPU's copy engines read and write directly (no staging buffer).
//!
//! # Copies
//!
//! [`copy_runs`] moves [`SlotRun`]s (`len` consecutive slots from `src` on
//! one pool to `dst` on another) between pools of any kind. Within a
//! (layer, K or V) block a run's rows are contiguous, so a run is **one**
//! copy per layer and K/V, however many pages it spans:
//!
//! ```text
//! pool:  [ layer 0 K: slot 0 | slot 1 | … ][ layer 0 V: … ][ layer 1 K: … ] …
//! run {src: 4, dst: 20, len: 8}:  layer l, K: floats [off(l,K,4), off(l,K,12))
//!                                 → one memcpy to [off(l,K,20), off(l,K,28))
//! ```
//!
//! | source → destination | one copy per run, layer and K/V |
//! | --- | --- |
//! | host (`HostKvPool` or `PinnedKvPool`) → host | a slice `copy_from_slice` |
//! | host → `CudaKvPool` | `cuMemcpyHtoDAsync` on the GPU pool's stream |
//! | `CudaKvPool` → host | `cuMemcpyDtoHAsync` on the GPU pool's stream |
//! | `CudaKvPool` → `CudaKvPool` | `cuMemcpyDtoDAsync` (`cuMemcpyPeerAsync` across GPUs) on the destination's stream, after everything on the source's |
//! | anything else | staged: `read_rows` then `write_rows`, one of each per run, layer and K/V |
//!
//! Every call is synchronous: it returns once its copies are done (the
//! stream that did them is synchronized, even when issuing failed half
//! way, so no transfer outlives the borrow of the memory it touches).
//! Every run is checked before anything is copied: a bad run is a typed
//! error and leaves the destination as it was. [`copy_pages`] copies whole
//! pages: [`page_runs`] merges consecutive page pairs into runs and it
//! delegates to [`copy_runs`].
//!
//! ```
//! use radixkv::SlotRun;
//! use radixkv_engine::kvpool::{copy_pages, copy_runs, HostKvPool, Kv, KvLayout, KvPool};
//! let layout = KvLayout { layers: 2, slots: 16, row: 4 };
//! let mut a = HostKvPool::new(layout);
//! a.write_rows(1, Kv::V, &[5], &[1.0, 2.0, 3.0, 4.0]).unwrap();
//! let mut b = HostKvPool::new(layout);
//! copy_pages(&a, &mut b, &[(1, 3)], 4).unwrap(); // page 1 (slots 4..8) -> page 3
//! assert_eq!(b.read_rows(1, Kv::V, &[13]).unwrap(), vec![1.0, 2.0, 3.0, 4.0]);
//! // Slots 5..7 -> 9..11: one copy per layer and K/V, pages or not.
//! let mut c = HostKvPool::new(layout);
//! copy_runs(&a, &mut c, &[SlotRun { src: 5, dst: 9, len: 2 }]).unwrap();
//! assert_eq!(c.read_rows(1, Kv::V, &[9]).unwrap(), vec![1.0, 2.0, 3.0, 4.0]);
//! ```

use radixkv::SlotRun;
use std::any::Any;

/// Which half of the KV cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kv {
    /// Keys.
    K = 0,
    /// Values.
    V = 1,
}

/// The shape of a pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvLayout {
    /// Transformer layers.
    pub layers: usize,
    /// Token slots (pages × page size).
    pub slots: usize,
    /// Floats per token row (heads × head dimension).
    pub row: usize,
}

impl KvLayout {
    /// Floats in the whole pool.
    pub fn len(&self) -> usize {
        self.layers * 2 * self.slots * self.row
    }

    /// Whether the pool holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Offset of the row of `slot` in (`layer`, `kv`).
    pub fn offset(&self, layer: usize, kv: Kv, slot: usize) -> usize {
        ((layer * 2 + kv as usize) * self.slots + slot) * self.row
    }

    /// For each of `slots`, in order: the range of its row in a rows
    /// buffer, and the range of its row in the pool's (`layer`, `kv`).
    fn row_ranges<'a>(
        &'a self,
        layer: usize,
        kv: Kv,
        slots: &'a [u32],
    ) -> impl Iterator<Item = (std::ops::Range<usize>, std::ops::Range<usize>)> + 'a {
        slots.iter().enumerate().map(move |(i, &s)| {
            let o = self.offset(layer, kv, s as usize);
            (i * self.row..(i + 1) * self.row, o..o + self.row)
        })
    }

    /// Validates a write of `rows` floats to `slots` of `layer`.
    fn check_rows(&self, layer: usize, slots: &[u32], rows: usize) -> Result<(), KvPoolError> {
        self.check(layer, slots)?;
        if rows != slots.len() * self.row {
            return Err(KvPoolError::Shape {
                got: rows,
                slots: slots.len(),
                row: self.row,
            });
        }
        Ok(())
    }

    fn check(&self, layer: usize, slots: &[u32]) -> Result<(), KvPoolError> {
        if layer >= self.layers {
            return Err(KvPoolError::OutOfRange(format!(
                "layer {layer} of {}",
                self.layers
            )));
        }
        if let Some(s) = slots.iter().find(|&&s| s as usize >= self.slots) {
            return Err(KvPoolError::OutOfRange(format!(
                "slot {s} of {}",
                self.slots
            )));
        }
        Ok(())
    }

    /// Validates that slots `start..start + len` lie in the pool (`which`
    /// names the side in the error). Computed in `u64`: `start + len` never
    /// wraps, and afterwards every slot of the run fits in a `u32`.
    fn check_run(&self, which: &str, start: u32, len: u32) -> Result<(), KvPoolError> {
        let end = u64::from(start) + u64::from(len);
        // Slots are `u32`s: slot 2^32 and beyond cannot be named.
        if end > (self.slots as u64).min(1 << 32) {
            return Err(KvPoolError::OutOfRange(format!(
                "{which} slots {start}..{end} of {}",
                self.slots
            )));
        }
        Ok(())
    }
}

/// One contiguous copy in floats: `len` from offset `src` of the source
/// pool to offset `dst` of the destination.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Span {
    src: usize,
    dst: usize,
    len: usize,
}

/// The copies of `runs` from a pool of layout `ls` to one of layout `ld`
/// (same layers and row): for every layer, K and V and non-empty run, in
/// that order, one [`Span`]. Checks every run first.
fn spans(ls: &KvLayout, ld: &KvLayout, runs: &[SlotRun]) -> Result<Vec<Span>, KvPoolError> {
    if ls.layers != ld.layers || ls.row != ld.row {
        return Err(KvPoolError::LayoutMismatch);
    }
    for r in runs {
        ls.check_run("source", r.src, r.len)?;
        ld.check_run("destination", r.dst, r.len)?;
    }
    let runs: Vec<&SlotRun> = runs.iter().filter(|r| r.len > 0).collect();
    let mut v = Vec::with_capacity(ls.layers * 2 * runs.len());
    for layer in 0..ls.layers {
        for kv in [Kv::K, Kv::V] {
            for r in &runs {
                v.push(Span {
                    src: ls.offset(layer, kv, r.src as usize),
                    dst: ld.offset(layer, kv, r.dst as usize),
                    len: r.len as usize * ls.row,
                });
            }
        }
    }
    Ok(v)
}

/// An offset range that validation said is inside the pool was not: a bug
/// in this module, reported rather than panicking.
fn outside(span: &Span) -> KvPoolError {
    KvPoolError::OutOfRange(format!("copy {span:?} outside its pool"))
}

/// KV pool errors (never panics on bad input).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KvPoolError {
    /// A layer, slot or page outside the pool.
    #[error("out of range: {0}")]
    OutOfRange(String),
    /// Rows whose length does not match the slots and the layout.
    #[error("{got} floats for {slots} rows of {row}")]
    Shape {
        /// Floats given.
        got: usize,
        /// Rows asked for.
        slots: usize,
        /// Floats per row.
        row: usize,
    },
    /// Pools of different layers or row sizes.
    #[error("pools of different shapes")]
    LayoutMismatch,
    /// No CUDA driver could be loaded on this machine.
    #[error("no CUDA driver")]
    NoCudaDriver,
    /// A CUDA call failed.
    #[error("CUDA: {0}")]
    Cuda(String),
}

/// A device's KV memory.
pub trait KvPool: Send {
    /// The pool's shape.
    fn layout(&self) -> KvLayout;
    /// Writes one row per slot (`rows.len() == slots.len() * row`).
    fn write_rows(
        &mut self,
        layer: usize,
        kv: Kv,
        slots: &[u32],
        rows: &[f32],
    ) -> Result<(), KvPoolError>;
    /// Reads one row per slot.
    fn read_rows(&self, layer: usize, kv: Kv, slots: &[u32]) -> Result<Vec<f32>, KvPoolError>;
    /// For fast paths between pools of the same kind.
    fn as_any(&self) -> &dyn Any;
    /// For fast paths between pools of the same kind.
    fn as_any_mut(&mut self) -> &mut dyn Any;
}

/// [`KvPool::write_rows`] on a pool held as one host slice.
fn write_host_rows(
    l: &KvLayout,
    data: &mut [f32],
    layer: usize,
    kv: Kv,
    slots: &[u32],
    rows: &[f32],
) -> Result<(), KvPoolError> {
    l.check_rows(layer, slots, rows.len())?;
    let n = data.len();
    for (buf, pool) in l.row_ranges(layer, kv, slots) {
        let what = || KvPoolError::OutOfRange(format!("row {pool:?} of a pool of {n}"));
        let to = data.get_mut(pool.clone()).ok_or_else(what)?;
        to.copy_from_slice(&rows[buf]);
    }
    Ok(())
}

/// [`KvPool::read_rows`] on a pool held as one host slice.
fn read_host_rows(
    l: &KvLayout,
    data: &[f32],
    layer: usize,
    kv: Kv,
    slots: &[u32],
) -> Result<Vec<f32>, KvPoolError> {
    l.check(layer, slots)?;
    let mut out = vec![0.0f32; slots.len() * l.row];
    for (buf, pool) in l.row_ranges(layer, kv, slots) {
        let what = || KvPoolError::OutOfRange(format!("row {pool:?} of a pool of {}", data.len()));
        out[buf].copy_from_slice(data.get(pool.clone()).ok_or_else(what)?);
    }
    Ok(out)
}

/// A pool in host memory: one contiguous `Vec<f32>`.
#[derive(Clone, Debug)]
pub struct HostKvPool {
    layout: KvLayout,
    data: Vec<f32>,
}

impl HostKvPool {
    /// A zeroed pool.
    pub fn new(layout: KvLayout) -> Self {
        HostKvPool {
            layout,
            data: vec![0.0; layout.len()],
        }
    }

    /// The whole pool, `layers × 2 × slots × row`.
    pub fn as_slice(&self) -> &[f32] {
        &self.data
    }
}

impl KvPool for HostKvPool {
    fn layout(&self) -> KvLayout {
        self.layout
    }

    fn write_rows(
        &mut self,
        layer: usize,
        kv: Kv,
        slots: &[u32],
        rows: &[f32],
    ) -> Result<(), KvPoolError> {
        write_host_rows(&self.layout, &mut self.data, layer, kv, slots, rows)
    }

    fn read_rows(&self, layer: usize, kv: Kv, slots: &[u32]) -> Result<Vec<f32>, KvPoolError> {
        read_host_rows(&self.layout, &self.data, layer, kv, slots)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

/// Whether a pool is in host memory (a [`HostKvPool`], or with feature
/// `cuda` a `PinnedKvPool`): a type check, without reaching the memory
/// (which for a pinned pool waits on its event).
fn is_host(p: &dyn KvPool) -> bool {
    #[cfg(feature = "cuda")]
    if p.as_any().is::<PinnedKvPool>() {
        return true;
    }
    p.as_any().is::<HostKvPool>()
}

/// The floats of a pool in host memory (a [`HostKvPool`], or with feature
/// `cuda` a `PinnedKvPool`); `None` for other kinds.
fn host_floats(p: &dyn KvPool) -> Option<Result<&[f32], KvPoolError>> {
    let any = p.as_any();
    if let Some(h) = any.downcast_ref::<HostKvPool>() {
        return Some(Ok(&h.data));
    }
    #[cfg(feature = "cuda")]
    if let Some(h) = any.downcast_ref::<PinnedKvPool>() {
        return Some(h.as_slice());
    }
    None
}

/// [`host_floats`], writable.
fn host_floats_mut(p: &mut dyn KvPool) -> Option<Result<&mut [f32], KvPoolError>> {
    let any = p.as_any_mut();
    if any.is::<HostKvPool>() {
        return any
            .downcast_mut::<HostKvPool>()
            .map(|h| Ok(h.data.as_mut_slice()));
    }
    #[cfg(feature = "cuda")]
    if let Some(h) = any.downcast_mut::<PinnedKvPool>() {
        return Some(h.as_mut_slice());
    }
    None
}

/// Page pairs (`(source page, destination page)`, `page_size` slots each)
/// as slot runs, consecutive pairs merged: `(a, b), (a + 1, b + 1)` is one
/// run of two pages. Pairs keep their order (a later pair that overlaps an
/// earlier one still overwrites it). A page whose slots do not fit in a
/// `u32` is [`KvPoolError::OutOfRange`]; `page_size` 0 gives no run.
///
/// ```
/// use radixkv::SlotRun;
/// use radixkv_engine::kvpool::page_runs;
/// let runs = page_runs(&[(1, 6), (2, 7), (3, 8), (9, 0)], 4).unwrap();
/// assert_eq!(runs, vec![
///     SlotRun { src: 4, dst: 24, len: 12 }, // pages 1..4 -> 6..9
///     SlotRun { src: 36, dst: 0, len: 4 },  // page 9 -> 0
/// ]);
/// ```
pub fn page_runs(pairs: &[(u32, u32)], page_size: usize) -> Result<Vec<SlotRun>, KvPoolError> {
    if page_size == 0 {
        return Ok(Vec::new());
    }
    let too_large = |p: u32| {
        KvPoolError::OutOfRange(format!("page {p} of {page_size} slots is past slot 2^32"))
    };
    let ps = u32::try_from(page_size).map_err(|_| too_large(0))?;
    let mut runs: Vec<SlotRun> = Vec::new();
    for &(a, b) in pairs {
        let src = a.checked_mul(ps).ok_or_else(|| too_large(a))?;
        let dst = b.checked_mul(ps).ok_or_else(|| too_large(b))?;
        if let Some(last) = runs.last_mut() {
            let follows = last.src.checked_add(last.len) == Some(src)
                && last.dst.checked_add(last.len) == Some(dst);
            if let (true, Some(len)) = (follows, last.len.checked_add(ps)) {
                last.len = len;
                continue;
            }
        }
        runs.push(SlotRun { src, dst, len: ps });
    }
    Ok(runs)
}

/// Copies `runs` (every layer, K and V) from `src` to `dst`: one copy per
/// run, layer and K/V (a slice copy host to host, one CUDA memcpy when a
/// GPU pool is involved, the staged `read_rows`/`write_rows` path for pool
/// kinds it does not know; see the [module docs](self)). Runs are checked
/// first: a run outside either pool (however large its `src + len`) is
/// [`KvPoolError::OutOfRange`], pools of different layers or rows are
/// [`KvPoolError::LayoutMismatch`], and then nothing was copied. An empty
/// run copies nothing; runs are copied in order.
///
/// ```
/// use radixkv::SlotRun;
/// use radixkv_engine::kvpool::{copy_runs, HostKvPool, Kv, KvLayout, KvPool, KvPoolError};
/// let layout = KvLayout { layers: 1, slots: 8, row: 2 };
/// let mut a = HostKvPool::new(layout);
/// a.write_rows(0, Kv::K, &[1, 2, 3], &[1.0, 1.5, 2.0, 2.5, 3.0, 3.5]).unwrap();
/// let mut b = HostKvPool::new(layout);
/// // Slots 1..4 of `a` -> 5..8 of `b`: one memcpy for K, one for V.
/// copy_runs(&a, &mut b, &[SlotRun { src: 1, dst: 5, len: 3 }]).unwrap();
/// assert_eq!(b.read_rows(0, Kv::K, &[5, 7]).unwrap(), vec![1.0, 1.5, 3.0, 3.5]);
/// // Past the end: a typed error, and `b` is unchanged.
/// let bad = [SlotRun { src: 0, dst: 0, len: 1 }, SlotRun { src: 6, dst: 0, len: 3 }];
/// assert!(matches!(copy_runs(&a, &mut b, &bad), Err(KvPoolError::OutOfRange(_))));
/// assert_eq!(b.read_rows(0, Kv::K, &[0]).unwrap(), vec![0.0, 0.0]);
/// ```
pub fn copy_runs(
    src: &dyn KvPool,
    dst: &mut dyn KvPool,
    runs: &[SlotRun],
) -> Result<(), KvPoolError> {
    let (ls, ld) = (src.layout(), dst.layout());
    let spans = spans(&ls, &ld, runs)?;
    if spans.is_empty() {
        return Ok(());
    }
    // Both slices only when both pools are in host memory: a GPU copy
    // reaches its host side itself.
    if is_host(src) && is_host(dst) {
        if let (Some(s), Some(d)) = (host_floats(src), host_floats_mut(dst)) {
            let (s, d) = (s?, d?);
            for sp in &spans {
                let from = s.get(sp.src..sp.src + sp.len).ok_or_else(|| outside(sp))?;
                let to = d
                    .get_mut(sp.dst..sp.dst + sp.len)
                    .ok_or_else(|| outside(sp))?;
                to.copy_from_slice(from);
            }
            return Ok(());
        }
    }
    #[cfg(feature = "cuda")]
    if cuda::copy_spans(src, dst, &spans)? {
        return Ok(());
    }
    // Staged through the host: one read and one write per run, layer and
    // K/V (the runs were checked above).
    for layer in 0..ls.layers {
        for kv in [Kv::K, Kv::V] {
            for r in runs.iter().filter(|r| r.len > 0) {
                let from: Vec<u32> = (0..r.len).map(|j| r.src + j).collect();
                let to: Vec<u32> = (0..r.len).map(|j| r.dst + j).collect();
                let rows = src.read_rows(layer, kv, &from)?;
                dst.write_rows(layer, kv, &to, &rows)?;
            }
        }
    }
    Ok(())
}

/// Copies whole pages (`(source page, destination page)` pairs, `page_size`
/// slots each, every layer, K and V) from `src` to `dst`: consecutive
/// pairs are merged into runs ([`page_runs`]) and copied by [`copy_runs`],
/// one copy per run, layer and K/V. Errors as [`copy_runs`]'s.
pub fn copy_pages(
    src: &dyn KvPool,
    dst: &mut dyn KvPool,
    pairs: &[(u32, u32)],
    page_size: usize,
) -> Result<(), KvPoolError> {
    copy_runs(src, dst, &page_runs(pairs, page_size)?)
}

#[cfg(feature = "cuda")]
pub use cuda::{CudaKvPool, PinnedKvPool};

#[cfg(feature = "cuda")]
mod cuda {
    use super::{host_floats, host_floats_mut, outside, read_host_rows, write_host_rows};
    use super::{Kv, KvLayout, KvPool, KvPoolError, Span};
    use cudarc::driver::sys::{self, CUresult};
    use cudarc::driver::{CudaContext, CudaSlice, CudaStream, PinnedHostSlice};
    use std::any::Any;
    use std::sync::Arc;

    fn err(e: impl std::fmt::Debug) -> KvPoolError {
        KvPoolError::Cuda(format!("{e:?}"))
    }

    /// Whether a CUDA driver library can be loaded: without one, every
    /// cudarc call would panic, so this is checked before the first.
    fn driver_present() -> bool {
        // SAFETY: only probes whether the driver library can be loaded
        // (loading it and dropping the handle); cudarc documents this as
        // the check to make before any call that would otherwise panic
        // without a driver.
        unsafe { sys::is_culib_present() }
    }

    /// A pool in GPU memory (one `cuMemAlloc` of `layers × 2 × slots × row`
    /// floats), with its own stream; every call is synchronous.
    pub struct CudaKvPool {
        layout: KvLayout,
        stream: Arc<CudaStream>,
        data: CudaSlice<f32>,
    }

    impl std::fmt::Debug for CudaKvPool {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("CudaKvPool")
                .field("layout", &self.layout)
                .field("gpu", &self.stream.context().ordinal())
                .finish()
        }
    }

    impl CudaKvPool {
        /// A zeroed pool on GPU `ordinal`. Without a loadable CUDA driver
        /// this is [`KvPoolError::NoCudaDriver`], never a panic.
        pub fn new(ordinal: usize, layout: KvLayout) -> Result<Self, KvPoolError> {
            if !driver_present() {
                return Err(KvPoolError::NoCudaDriver);
            }
            let ctx = CudaContext::new(ordinal).map_err(err)?;
            let stream = ctx.new_stream().map_err(err)?;
            let data = stream
                .alloc_zeros::<f32>(layout.len().max(1))
                .map_err(err)?;
            Ok(CudaKvPool {
                layout,
                stream,
                data,
            })
        }

        /// Waits for every copy issued on the pool's stream.
        pub fn synchronize(&self) -> Result<(), KvPoolError> {
            self.stream.synchronize().map_err(err)
        }

        /// The GPU the pool is on.
        pub fn ordinal(&self) -> usize {
            self.stream.context().ordinal()
        }

        /// Lets this pool's GPU and `peer`'s access each other's memory
        /// (`cuCtxEnablePeerAccess`, both ways), so that copies between
        /// them go GPU to GPU (NVLink or PCIe peer to peer) instead of
        /// being staged through host memory by the driver. `Ok(true)` when
        /// peer access is on (it stays on for the GPUs' contexts: every
        /// pool on these two GPUs benefits), `Ok(false)` when both pools
        /// are on one GPU (nothing to enable) or the two GPUs cannot reach
        /// each other (copies still work, staged).
        pub fn enable_peer_access(&self, peer: &CudaKvPool) -> Result<bool, KvPoolError> {
            let (a, b) = (self.stream.context(), peer.stream.context());
            if a.ordinal() == b.ordinal() {
                return Ok(false);
            }
            for (x, y) in [(a, b), (b, a)] {
                let mut can: std::ffi::c_int = 0;
                // SAFETY: `can` is a live, writable c_int the call writes
                // once; both device handles come from contexts this
                // function holds (`Arc`s of the pools' streams), so they
                // are valid devices of the loaded driver.
                unsafe { sys::cuDeviceCanAccessPeer(&mut can, x.cu_device(), y.cu_device()) }
                    .result()
                    .map_err(err)?;
                if can == 0 {
                    return Ok(false);
                }
            }
            for (x, y) in [(a, b), (b, a)] {
                x.bind_to_thread().map_err(err)?;
                // SAFETY: enables the current context (`x`, bound just
                // above) to access `y`'s memory; `y` is a live context
                // (held through `peer`'s or `self`'s stream), flags must be
                // 0, and no memory is passed. Enabling twice is the error
                // ALREADY_ENABLED, which is success here.
                match unsafe { sys::cuCtxEnablePeerAccess(y.cu_ctx(), 0) } {
                    CUresult::CUDA_SUCCESS | CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => {}
                    // Refused (more than 8 peers, or a virtualised GPU that
                    // said it could): copies still work, staged by the
                    // driver.
                    CUresult::CUDA_ERROR_TOO_MANY_PEERS
                    | CUresult::CUDA_ERROR_PEER_ACCESS_UNSUPPORTED => return Ok(false),
                    e => return Err(err(e)),
                }
            }
            Ok(true)
        }
    }

    impl KvPool for CudaKvPool {
        fn layout(&self) -> KvLayout {
            self.layout
        }

        fn write_rows(
            &mut self,
            layer: usize,
            kv: Kv,
            slots: &[u32],
            rows: &[f32],
        ) -> Result<(), KvPoolError> {
            let l = self.layout;
            l.check_rows(layer, slots, rows.len())?;
            for (buf, pool) in l.row_ranges(layer, kv, slots) {
                let mut dst = self.data.slice_mut(pool);
                self.stream.memcpy_htod(&rows[buf], &mut dst).map_err(err)?;
            }
            self.synchronize()
        }

        fn read_rows(&self, layer: usize, kv: Kv, slots: &[u32]) -> Result<Vec<f32>, KvPoolError> {
            let l = self.layout;
            l.check(layer, slots)?;
            let mut out = vec![0.0f32; slots.len() * l.row];
            for (buf, pool) in l.row_ranges(layer, kv, slots) {
                let src = self.data.slice(pool);
                self.stream.memcpy_dtoh(&src, &mut out[buf]).map_err(err)?;
            }
            self.synchronize()?;
            Ok(out)
        }

        fn as_any(&self) -> &dyn Any {
            self
        }

        fn as_any_mut(&mut self) -> &mut dyn Any {
            self
        }
    }

    /// A pool in page-locked ("pinned") host memory: one `cuMemHostAlloc`
    /// of `layers × 2 × slots × row` floats, zeroed. The GPU's copy
    /// engines read and write it directly, so copies to and from a
    /// [`CudaKvPool`] run at the link's speed without the driver staging
    /// them through a pinned buffer of its own (as it must for a
    /// [`HostKvPool`](super::HostKvPool)'s pageable memory). Otherwise it
    /// is a host pool: rows are read and written by the CPU, and copies
    /// with other host pools are slice copies.
    ///
    /// The memory is allocated portable (pinned for every CUDA context, so
    /// pools on any GPU copy to and from it at full speed) and not
    /// write-combined (the CPU reads it too: `read_rows`, the staged
    /// path, the model reading a host tier). Page-locked memory cannot be
    /// swapped: size it for what the machine can spare.
    pub struct PinnedKvPool {
        layout: KvLayout,
        /// At least one float (`cuMemHostAlloc` of 0 bytes gives no
        /// pointer); the pool is the first `layout.len()`.
        data: PinnedHostSlice<f32>,
    }

    impl std::fmt::Debug for PinnedKvPool {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("PinnedKvPool")
                .field("layout", &self.layout)
                .finish()
        }
    }

    impl PinnedKvPool {
        /// A zeroed pool in page-locked host memory, allocated in GPU
        /// `ordinal`'s (primary) context. Without a loadable CUDA driver
        /// this is [`KvPoolError::NoCudaDriver`], never a panic; a layout
        /// too large to address is [`KvPoolError::OutOfRange`].
        pub fn new(ordinal: usize, layout: KvLayout) -> Result<Self, KvPoolError> {
            let floats = layout
                .layers
                .checked_mul(2)
                .and_then(|x| x.checked_mul(layout.slots))
                .and_then(|x| x.checked_mul(layout.row))
                .filter(|&n| n < isize::MAX as usize / std::mem::size_of::<f32>())
                .ok_or_else(|| KvPoolError::OutOfRange(format!("a pinned pool of {layout:?}")))?
                .max(1);
            if !driver_present() {
                return Err(KvPoolError::NoCudaDriver);
            }
            let ctx = CudaContext::new(ordinal).map_err(err)?;
            // SAFETY: the allocation's contents are uninitialized; nothing
            // reads them before the `write_bytes` below zeroes all
            // `floats` of them (all bits zero is 0.0f32). The size was
            // checked above not to overflow `isize` in bytes (cudarc would
            // panic otherwise). The flags are the driver's documented
            // `cuMemHostAlloc` flags.
            let mut data = unsafe {
                ctx.alloc_pinned_with_flags::<f32>(floats, sys::CU_MEMHOSTALLOC_PORTABLE)
            }
            .map_err(err)?;
            let ptr = data.as_mut_ptr().map_err(err)?;
            // SAFETY: `ptr` is the start of the allocation just made, of
            // `floats` f32s, aligned (cudarc asserts it), valid for writes
            // and not yet shared: no copy was issued on it. Writing zero
            // bytes needs no initialized contents.
            unsafe { std::ptr::write_bytes(ptr, 0, floats) };
            Ok(PinnedKvPool { layout, data })
        }

        /// The whole pool, `layers × 2 × slots × row` (after waiting for
        /// any copy still recorded on it; the copies of this module are
        /// finished when they return).
        pub fn as_slice(&self) -> Result<&[f32], KvPoolError> {
            let n = self.layout.len();
            let all = self.data.as_slice().map_err(err)?;
            all.get(..n)
                .ok_or_else(|| KvPoolError::OutOfRange(format!("{n} floats of {}", all.len())))
        }

        /// [`as_slice`](Self::as_slice), writable.
        pub fn as_mut_slice(&mut self) -> Result<&mut [f32], KvPoolError> {
            let n = self.layout.len();
            let all = self.data.as_mut_slice().map_err(err)?;
            let len = all.len();
            all.get_mut(..n)
                .ok_or_else(|| KvPoolError::OutOfRange(format!("{n} floats of {len}")))
        }
    }

    impl KvPool for PinnedKvPool {
        fn layout(&self) -> KvLayout {
            self.layout
        }

        fn write_rows(
            &mut self,
            layer: usize,
            kv: Kv,
            slots: &[u32],
            rows: &[f32],
        ) -> Result<(), KvPoolError> {
            let l = self.layout;
            write_host_rows(&l, self.as_mut_slice()?, layer, kv, slots, rows)
        }

        fn read_rows(&self, layer: usize, kv: Kv, slots: &[u32]) -> Result<Vec<f32>, KvPoolError> {
            read_host_rows(&self.layout, self.as_slice()?, layer, kv, slots)
        }

        fn as_any(&self) -> &dyn Any {
            self
        }

        fn as_any_mut(&mut self) -> &mut dyn Any {
            self
        }
    }

    /// Waits for everything on `stream`, whether or not issuing the copies
    /// succeeded: a copy from or into pinned memory runs asynchronously,
    /// and none may still be in flight when the borrow of the host memory
    /// it reads or writes ends (the caller could then write it, or drop
    /// and free it).
    ///
    /// cudarc's `synchronize` first returns (and clears) an error recorded
    /// on the context while the copies were issued, *without* waiting; so
    /// when it fails it is called once more, which then waits (unless the
    /// context itself is broken, when the driver has stopped its copies).
    fn finish(stream: &CudaStream, issued: Result<(), KvPoolError>) -> Result<bool, KvPoolError> {
        let synced = stream.synchronize().map_err(err);
        if synced.is_err() {
            let _ = stream.synchronize();
        }
        issued?;
        synced?;
        Ok(true)
    }

    /// The copies of [`copy_runs`](super::copy_runs) that involve a GPU
    /// pool, one memcpy per span: host (pageable or pinned) to GPU, GPU to
    /// host, GPU to GPU. `Ok(false)` (nothing copied) for other pairs.
    pub(super) fn copy_spans(
        src: &dyn KvPool,
        dst: &mut dyn KvPool,
        spans: &[Span],
    ) -> Result<bool, KvPoolError> {
        let cuda_src = src.as_any().downcast_ref::<CudaKvPool>();
        if let Some(d) = dst.as_any_mut().downcast_mut::<CudaKvPool>() {
            if let Some(h) = host_floats(src) {
                let h = h?;
                let issued = spans.iter().try_for_each(|sp| {
                    let from = h.get(sp.src..sp.src + sp.len).ok_or_else(|| outside(sp))?;
                    let mut to = d
                        .data
                        .try_slice_mut(sp.dst..sp.dst + sp.len)
                        .ok_or_else(|| outside(sp))?;
                    d.stream.memcpy_htod(from, &mut to).map_err(err)
                });
                return finish(&d.stream, issued);
            }
            let Some(s) = cuda_src else {
                return Ok(false);
            };
            // Order the destination's stream after everything on the
            // source's (across GPUs too: a stream may wait on another
            // context's event).
            d.stream.join(&s.stream).map_err(err)?;
            let issued = spans.iter().try_for_each(|sp| {
                let from = s
                    .data
                    .try_slice(sp.src..sp.src + sp.len)
                    .ok_or_else(|| outside(sp))?;
                let mut to = d
                    .data
                    .try_slice_mut(sp.dst..sp.dst + sp.len)
                    .ok_or_else(|| outside(sp))?;
                d.stream.memcpy_dtod(&from, &mut to).map_err(err)
            });
            return finish(&d.stream, issued);
        }
        let Some(s) = cuda_src else {
            return Ok(false);
        };
        let Some(h) = host_floats_mut(dst) else {
            return Ok(false);
        };
        let h = h?;
        let issued = spans.iter().try_for_each(|sp| {
            let from = s
                .data
                .try_slice(sp.src..sp.src + sp.len)
                .ok_or_else(|| outside(sp))?;
            let to = h
                .get_mut(sp.dst..sp.dst + sp.len)
                .ok_or_else(|| outside(sp))?;
            s.stream.memcpy_dtoh(&from, to).map_err(err)
        });
        finish(&s.stream, issued)
    }
}
