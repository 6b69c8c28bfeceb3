//! The pool in host memory ([`HostKvPool`]) and the row access every pool
//! held as one host slice shares ([`HostSlice`]).

use super::layout::{Kv, KvLayout, KvPool, KvPoolError};
use std::any::Any;

/// A pool in host memory: one contiguous run of floats that starts on a
/// cache line, so a row whose size is a multiple of 64 bytes (and each
/// head's part of it) occupies whole lines, and attention reading one
/// head's part of every row touches no line twice.
#[derive(Clone, Debug)]
pub struct HostKvPool {
    layout: KvLayout,
    lines: Vec<Line>,
}

/// Sixteen floats on one 64-byte cache line.
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C, align(64))]
struct Line([f32; 16]);

impl HostKvPool {
    /// A zeroed pool.
    pub fn new(layout: KvLayout) -> Self {
        HostKvPool {
            layout,
            lines: vec![Line([0.0; 16]); layout.len().div_ceil(16)],
        }
    }

    /// The whole pool, `layers × 2 × slots × row`.
    pub fn as_slice(&self) -> &[f32] {
        &bytemuck::cast_slice(&self.lines)[..self.layout.len()]
    }
}

impl HostSlice for HostKvPool {
    fn slice_layout(&self) -> KvLayout {
        self.layout
    }

    fn floats(&self) -> Result<&[f32], KvPoolError> {
        Ok(self.as_slice())
    }

    fn floats_mut(&mut self) -> Result<&mut [f32], KvPoolError> {
        let len = self.layout.len();
        Ok(&mut bytemuck::cast_slice_mut(&mut self.lines)[..len])
    }
}

/// A pool held as one slice of host memory (the host pool, a pinned
/// pool): its [`KvPool`] methods are the slice's row access below.
///
/// Public in a private module: nothing outside the crate can name it.
pub trait HostSlice: Send + 'static {
    /// The pool's shape.
    fn slice_layout(&self) -> KvLayout;
    /// The whole pool, `layers × 2 × slots × row` floats.
    fn floats(&self) -> Result<&[f32], KvPoolError>;
    /// [`floats`](Self::floats), writable.
    fn floats_mut(&mut self) -> Result<&mut [f32], KvPoolError>;
}

impl<T: HostSlice> KvPool for T {
    fn layout(&self) -> KvLayout {
        self.slice_layout()
    }

    fn write_rows(
        &mut self,
        layer: usize,
        kv: Kv,
        slots: &[u32],
        rows: &[f32],
    ) -> Result<(), KvPoolError> {
        let l = self.slice_layout();
        l.check_rows(layer, slots, rows.len())?;
        let data = self.floats_mut()?;
        let n = data.len();
        for (buf, pool) in l.row_ranges(layer, kv, slots) {
            let what = || KvPoolError::OutOfRange(format!("row {pool:?} of a pool of {n}"));
            let to = data.get_mut(pool.clone()).ok_or_else(what)?;
            to.copy_from_slice(&rows[buf]);
        }
        Ok(())
    }

    fn read_rows(&self, layer: usize, kv: Kv, slots: &[u32]) -> Result<Vec<f32>, KvPoolError> {
        let l = self.slice_layout();
        l.check(layer, slots)?;
        let data = self.floats()?;
        let mut out = vec![0.0f32; slots.len() * l.row];
        for (buf, pool) in l.row_ranges(layer, kv, slots) {
            let what =
                || KvPoolError::OutOfRange(format!("row {pool:?} of a pool of {}", data.len()));
            out[buf].copy_from_slice(data.get(pool.clone()).ok_or_else(what)?);
        }
        Ok(out)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }

    fn in_host_memory(&self) -> bool {
        true
    }

    fn host_floats(&self) -> Option<Result<&[f32], KvPoolError>> {
        Some(self.floats())
    }

    fn host_floats_mut(&mut self) -> Option<Result<&mut [f32], KvPoolError>> {
        Some(self.floats_mut())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The floats start on a cache line, are as many as the layout says
    /// (also when that is not a whole number of lines), and start zeroed.
    #[test]
    fn the_pool_starts_on_a_cache_line() {
        for slots in [1, 3, 16, 1000] {
            let layout = KvLayout {
                layers: 3,
                slots,
                row: 7,
            };
            let mut pool = HostKvPool::new(layout);
            assert_eq!(pool.as_slice().as_ptr() as usize % 64, 0);
            assert_eq!(pool.as_slice().len(), layout.len());
            assert!(pool.as_slice().iter().all(|&x| x == 0.0));
            let len = pool.floats_mut().expect("a host pool").len();
            assert_eq!(len, layout.len());
        }
    }
}
