//! Pools in GPU memory ([`CudaKvPool`]) and in pinned host memory
//! ([`PinnedKvPool`]) through cudarc, loaded at run time.

use super::host::HostSlice;
use super::layout::{outside, Kv, KvLayout, KvPool, KvPoolError, Span};
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
        let mut data =
            unsafe { ctx.alloc_pinned_with_flags::<f32>(floats, sys::CU_MEMHOSTALLOC_PORTABLE) }
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

impl HostSlice for PinnedKvPool {
    fn slice_layout(&self) -> KvLayout {
        self.layout
    }

    fn floats(&self) -> Result<&[f32], KvPoolError> {
        self.as_slice()
    }

    fn floats_mut(&mut self) -> Result<&mut [f32], KvPoolError> {
        self.as_mut_slice()
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
        if let Some(h) = src.host_floats() {
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
    let Some(h) = dst.host_floats_mut() else {
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
