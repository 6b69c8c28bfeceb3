//! KV-cache memory per device: `layers × 2 (K, V) × slots × row` floats.
//!
//! A slot is where one token's K (or V) row lives; slot `p * page_size + j`
//! belongs to page `p` (see [`radixkv::alloc`]). [`HostKvPool`] keeps the pool
//! in host memory (the default, and what tests use); `CudaKvPool` (feature
//! `cuda`) keeps it in GPU memory through cudarc, loaded at run time.
//! [`copy_pages`] moves whole pages between pools of any kind.
//!
//! ```
//! use radixkv_engine::kvpool::{copy_pages, HostKvPool, Kv, KvLayout, KvPool};
//! let layout = KvLayout { layers: 2, slots: 16, row: 4 };
//! let mut a = HostKvPool::new(layout);
//! a.write_rows(1, Kv::V, &[5], &[1.0, 2.0, 3.0, 4.0]).unwrap();
//! let mut b = HostKvPool::new(layout);
//! copy_pages(&a, &mut b, &[(1, 3)], 4).unwrap(); // page 1 (slots 4..8) -> page 3
//! assert_eq!(b.read_rows(1, Kv::V, &[13]).unwrap(), vec![1.0, 2.0, 3.0, 4.0]);
//! ```

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

    /// For every layer, K and V and page pair: the offsets of the source
    /// run in `self` and the destination run in `dst` (`page_size` rows).
    fn page_runs(
        &self,
        dst: &KvLayout,
        pairs: &[(u32, u32)],
        page_size: usize,
    ) -> Vec<(usize, usize)> {
        let mut v = Vec::with_capacity(self.layers * 2 * pairs.len());
        for layer in 0..self.layers {
            for kv in [Kv::K, Kv::V] {
                for &(a, b) in pairs {
                    v.push((
                        self.offset(layer, kv, a as usize * page_size),
                        dst.offset(layer, kv, b as usize * page_size),
                    ));
                }
            }
        }
        v
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
        let l = self.layout;
        l.check_rows(layer, slots, rows.len())?;
        for (buf, pool) in l.row_ranges(layer, kv, slots) {
            self.data[pool].copy_from_slice(&rows[buf]);
        }
        Ok(())
    }

    fn read_rows(&self, layer: usize, kv: Kv, slots: &[u32]) -> Result<Vec<f32>, KvPoolError> {
        let l = self.layout;
        l.check(layer, slots)?;
        let mut out = vec![0.0f32; slots.len() * l.row];
        for (buf, pool) in l.row_ranges(layer, kv, slots) {
            out[buf].copy_from_slice(&self.data[pool]);
        }
        Ok(out)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

/// Copies whole pages (`(source page, destination page)` pairs, `page_size`
/// slots each, every layer, K and V) from `src` to `dst`. Host to host is a
/// `memcpy` per page run; CUDA to CUDA a device-to-device copy; anything
/// else is staged through host memory.
pub fn copy_pages(
    src: &dyn KvPool,
    dst: &mut dyn KvPool,
    pairs: &[(u32, u32)],
    page_size: usize,
) -> Result<(), KvPoolError> {
    let (ls, ld) = (src.layout(), dst.layout());
    if ls.layers != ld.layers || ls.row != ld.row {
        return Err(KvPoolError::LayoutMismatch);
    }
    for &(a, b) in pairs {
        let (a, b) = (a as usize, b as usize);
        if (a + 1) * page_size > ls.slots || (b + 1) * page_size > ld.slots {
            return Err(KvPoolError::OutOfRange(format!(
                "page {a} -> {b} of {page_size} slots"
            )));
        }
    }
    if let Some(s) = src.as_any().downcast_ref::<HostKvPool>() {
        if let Some(d) = dst.as_any_mut().downcast_mut::<HostKvPool>() {
            let n = page_size * ls.row;
            for (so, dof) in ls.page_runs(&ld, pairs, page_size) {
                d.data[dof..dof + n].copy_from_slice(&s.data[so..so + n]);
            }
            return Ok(());
        }
    }
    #[cfg(feature = "cuda")]
    if cuda::copy_pages_device(src, dst, pairs, page_size)?.is_some() {
        return Ok(());
    }
    // Staged through the host.
    for layer in 0..ls.layers {
        for kv in [Kv::K, Kv::V] {
            for &(a, b) in pairs {
                let from: Vec<u32> = (0..page_size as u32)
                    .map(|j| a * page_size as u32 + j)
                    .collect();
                let to: Vec<u32> = (0..page_size as u32)
                    .map(|j| b * page_size as u32 + j)
                    .collect();
                let rows = src.read_rows(layer, kv, &from)?;
                dst.write_rows(layer, kv, &to, &rows)?;
            }
        }
    }
    Ok(())
}

#[cfg(feature = "cuda")]
pub use cuda::CudaKvPool;

#[cfg(feature = "cuda")]
mod cuda {
    use super::{Kv, KvLayout, KvPool, KvPoolError};
    use cudarc::driver::{CudaContext, CudaSlice, CudaStream};
    use std::any::Any;
    use std::sync::Arc;

    fn err(e: impl std::fmt::Debug) -> KvPoolError {
        KvPoolError::Cuda(format!("{e:?}"))
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
                .finish()
        }
    }

    impl CudaKvPool {
        /// A zeroed pool on GPU `ordinal`. Without a loadable CUDA driver
        /// this is [`KvPoolError::NoCudaDriver`], never a panic.
        pub fn new(ordinal: usize, layout: KvLayout) -> Result<Self, KvPoolError> {
            // SAFETY: only probes whether the driver library can be loaded;
            // cudarc documents this as the check to make before any call
            // that would otherwise panic without a driver.
            if !unsafe { cudarc::driver::sys::is_culib_present() } {
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

    /// Page copies that involve a CUDA pool: device to device, or host to
    /// device and back, one copy per page run; `None` for other pairs.
    pub(super) fn copy_pages_device(
        src: &dyn KvPool,
        dst: &mut dyn KvPool,
        pairs: &[(u32, u32)],
        page_size: usize,
    ) -> Result<Option<()>, KvPoolError> {
        let runs = |ls: KvLayout, ld: KvLayout| ls.page_runs(&ld, pairs, page_size);
        let host_src = src.as_any().downcast_ref::<super::HostKvPool>();
        let cuda_src = src.as_any().downcast_ref::<CudaKvPool>();
        if let (Some(h), Some(d)) = (host_src, dst.as_any_mut().downcast_mut::<CudaKvPool>()) {
            let n = page_size * h.layout.row;
            for (so, dof) in runs(h.layout, d.layout) {
                let mut to = d.data.slice_mut(dof..dof + n);
                d.stream
                    .memcpy_htod(&h.data[so..so + n], &mut to)
                    .map_err(err)?;
            }
            d.synchronize()?;
            return Ok(Some(()));
        }
        if let (Some(c), Some(h)) = (
            cuda_src,
            dst.as_any_mut().downcast_mut::<super::HostKvPool>(),
        ) {
            let n = page_size * c.layout.row;
            for (so, dof) in runs(c.layout, h.layout) {
                let from = c.data.slice(so..so + n);
                c.stream
                    .memcpy_dtoh(&from, &mut h.data[dof..dof + n])
                    .map_err(err)?;
            }
            c.synchronize()?;
            return Ok(Some(()));
        }
        let Some(s) = cuda_src else {
            return Ok(None);
        };
        let Some(d) = dst.as_any_mut().downcast_mut::<CudaKvPool>() else {
            return Ok(None);
        };
        let (ls, ld) = (s.layout, d.layout);
        let n = page_size * ls.row;
        // Order the destination's stream after everything on the source's.
        d.stream.join(&s.stream).map_err(err)?;
        for (so, dof) in runs(ls, ld) {
            let from = s.data.slice(so..so + n);
            let mut to = d.data.slice_mut(dof..dof + n);
            d.stream.memcpy_dtod(&from, &mut to).map_err(err)?;
        }
        d.synchronize()?;
        Ok(Some(()))
    }
}
