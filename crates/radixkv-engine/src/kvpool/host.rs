//! The pool in host memory ([`HostKvPool`]) and the row access every pool
//! held as one host slice shares.

use super::layout::{Kv, KvLayout, KvPool, KvPoolError};
use std::any::Any;

/// [`KvPool::write_rows`] on a pool held as one host slice.
pub(super) fn write_host_rows(
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
pub(super) fn read_host_rows(
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

    fn in_host_memory(&self) -> bool {
        true
    }

    fn host_floats(&self) -> Option<Result<&[f32], KvPoolError>> {
        Some(Ok(&self.data))
    }

    fn host_floats_mut(&mut self) -> Option<Result<&mut [f32], KvPoolError>> {
        Some(Ok(self.data.as_mut_slice()))
    }
}
