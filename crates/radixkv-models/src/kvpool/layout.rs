//! The pools' memory layout ([`KvLayout`]), their interface ([`KvPool`])
//! and errors, and the spans a copy between two layouts moves.

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
    pub(super) fn row_ranges<'a>(
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
    pub(super) fn check_rows(
        &self,
        layer: usize,
        slots: &[u32],
        rows: usize,
    ) -> Result<(), KvPoolError> {
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

    pub(super) fn check(&self, layer: usize, slots: &[u32]) -> Result<(), KvPoolError> {
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
pub(super) struct Span {
    pub(super) src: usize,
    pub(super) dst: usize,
    pub(super) len: usize,
}

/// The copies of `runs` from a pool of layout `ls` to one of layout `ld`
/// (same layers and row): for every layer, K and V and non-empty run, in
/// that order, one [`Span`]. Checks every run first.
pub(super) fn spans(
    ls: &KvLayout,
    ld: &KvLayout,
    runs: &[SlotRun],
) -> Result<Vec<Span>, KvPoolError> {
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
pub(super) fn outside(span: &Span) -> KvPoolError {
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
    /// Whether the pool is one slice in host memory (the host pool, a
    /// pinned pool): known without reaching the memory, which for a pinned
    /// pool waits on its event. Default: no.
    fn in_host_memory(&self) -> bool {
        false
    }
    /// The floats of a pool that is one slice in host memory, for copies
    /// between such pools; `None` for other kinds (the default).
    fn host_floats(&self) -> Option<Result<&[f32], KvPoolError>> {
        None
    }
    /// [`host_floats`](Self::host_floats), writable.
    fn host_floats_mut(&mut self) -> Option<Result<&mut [f32], KvPoolError>> {
        None
    }
}
