//! Matmuls over the quantized weight types SmolLM2's GGUF stores
//! (`Q4_1` and `Q8_0`), computed the way llama.cpp computes them: each
//! activation row is quantized to 8 bits in blocks of 32 (`q8_1`: a scale
//! `d`, the sum `s = d × Σq`, 32 signed bytes), and a weight block's dot
//! with it is an exact integer sum scaled by the blocks' scales. This file
//! reads the blocks out of a tensor and splits a product over rayon's
//! threads by output columns; the block dots are the given [`Kernel`]'s
//! (`super::kernels`: plain Rust, or AVX2 with FMA and F16C). The blocks
//! stay as the GGUF stores them, f16 scales included; a product of several
//! activation rows widens its weights' scales once, into a copy.
//!
//! A row's outputs depend only on that row and the weights, never on the
//! other rows of the call or on how the columns were split: the paged
//! passes and the dense reference agree exactly however they batch. These
//! are the only matmuls the model computes: a weight of any other type is
//! refused at load (`super::tensors`).

use super::kernels::blocks::{widen, Act, Rows, BLOCK, Q41, Q80};
use super::kernels::Kernel;
use candle_core::quantized::{GgmlDType, QTensor};
use rayon::prelude::*;

/// Multiply-adds per task when a product is split over rayon's threads
/// (a few microseconds of work: the model's pass runs inside the pool,
/// where handing a task to a spinning thread costs far less).
const MACS_PER_TASK: usize = 1 << 15;

/// A weight matrix of `n` output rows of `k` inputs, in blocks.
enum Blocks {
    Q41(Vec<Q41>),
    Q80(Vec<Q80>),
}

/// A `Q4_1` or `Q8_0` weight matrix, `(n, k)` as the GGUF stores it
/// (`y = x Wᵀ`).
pub(crate) struct QWeight {
    n: usize,
    k: usize,
    blocks: Blocks,
}

fn f16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

impl QWeight {
    /// The weights of `t` when it is `Q4_1` or `Q8_0` of shape `(n, k)`
    /// with `k` a multiple of 32; `None` for anything else.
    pub(crate) fn new(t: &QTensor) -> candle_core::Result<Option<QWeight>> {
        let (n, k) = match t.shape().dims() {
            &[n, k] if k % BLOCK == 0 => (n, k),
            _ => return Ok(None),
        };
        let size = match t.dtype() {
            GgmlDType::Q4_1 => 20,
            GgmlDType::Q8_0 => 34,
            _ => return Ok(None),
        };
        let raw = t.data()?;
        let count = n * k / BLOCK;
        if raw.len() != count * size {
            candle_core::bail!(
                "{:?} tensor of {} bytes, not {}",
                t.dtype(),
                raw.len(),
                count * size
            );
        }
        let chunks = raw.chunks_exact(size);
        let blocks = match t.dtype() {
            GgmlDType::Q4_1 => Blocks::Q41(
                chunks
                    .map(|b| {
                        let mut qs = [0u8; 16];
                        qs.copy_from_slice(&b[4..20]);
                        Q41 {
                            d: f16_at(b, 0),
                            m: f16_at(b, 2),
                            qs,
                        }
                    })
                    .collect(),
            ),
            _ => Blocks::Q80(
                chunks
                    .map(|b| {
                        let mut qs = [0i8; 32];
                        for (q, &byte) in qs.iter_mut().zip(&b[2..34]) {
                            *q = byte as i8;
                        }
                        Q80 {
                            d: f16_at(b, 0),
                            qs,
                        }
                    })
                    .collect(),
            ),
        };
        Ok(Some(QWeight { n, k, blocks }))
    }

    /// Row `r` dequantized into `out` (`k` floats appended), as candle
    /// (and llama.cpp) dequantize it: `q × d + m` (`Q4_1`), `q × d`
    /// (`Q8_0`), in f32, the same bits as a dequantized copy of the whole
    /// matrix.
    pub(crate) fn row_into(&self, r: usize, out: &mut Vec<f32>) {
        let kb = self.k / BLOCK;
        match &self.blocks {
            Blocks::Q41(w) => {
                for b in &w[r * kb..(r + 1) * kb] {
                    let (d, m) = (widen(b.d), widen(b.m));
                    let at = out.len();
                    out.resize(at + BLOCK, 0.0);
                    for (j, &q) in b.qs.iter().enumerate() {
                        out[at + j] = f32::from(q & 0x0F) * d + m;
                        out[at + j + BLOCK / 2] = f32::from(q >> 4) * d + m;
                    }
                }
            }
            Blocks::Q80(w) => {
                for b in &w[r * kb..(r + 1) * kb] {
                    let d = widen(b.d);
                    out.extend(b.qs.iter().map(|&q| f32::from(q) * d));
                }
            }
        }
    }

    /// Output columns each task of a product of `rows` activation rows
    /// computes: about [`MACS_PER_TASK`] multiply-adds, a multiple of four
    /// (the kernels' widest step); all `n` when the product is small.
    fn columns_per_task(&self, rows: usize) -> usize {
        let tasks = (rows * self.n * self.k / MACS_PER_TASK).clamp(1, self.n.max(1));
        self.n.div_ceil(tasks).next_multiple_of(4)
    }

    /// `x Wᵀ` for `x` of `rows × k` (row-major): `rows × n`, row-major,
    /// with `kernel`'s block dots.
    pub(crate) fn matmul(&self, kernel: Kernel, x: &[f32], rows: usize) -> Vec<f32> {
        assert_eq!(x.len(), rows * self.k, "activations are not rows x k");
        if rows == 0 || self.n == 0 {
            return Vec::new();
        }
        let kb = self.k / BLOCK;
        let acts: Vec<Act> = x.chunks_exact(BLOCK).map(|b| kernel.quantize(b)).collect();
        // Each task computes a run of columns for every row (row-major
        // within the task), copied into place after; a product of one task
        // stays on the calling thread.
        let per_task = self.columns_per_task(rows);
        let piece = |task: usize| {
            let cols = task * per_task..((task + 1) * per_task).min(self.n);
            let mut out = vec![0f32; cols.len() * rows];
            let blocks = cols.start * kb..cols.end * kb;
            // One activation row reads each weight block once: its scales
            // are widened in the dot. Several reread the task's blocks, so
            // their scales are widened once, into a copy.
            macro_rules! each_row {
                ($w:expr) => {{
                    let w = $w;
                    for (a, out) in acts.chunks_exact(kb).zip(out.chunks_exact_mut(cols.len())) {
                        kernel.columns(w, kb, cols.len(), a, out);
                    }
                }};
            }
            match (&self.blocks, rows) {
                (Blocks::Q41(w), 1) => each_row!(Rows::Q41(&w[blocks])),
                (Blocks::Q80(w), 1) => each_row!(Rows::Q80(&w[blocks])),
                (Blocks::Q41(w), _) => {
                    let wide: Vec<Q41<f32>> = w[blocks].iter().map(Q41::widened).collect();
                    each_row!(Rows::Q41(&wide))
                }
                (Blocks::Q80(w), _) => {
                    let wide: Vec<Q80<f32>> = w[blocks].iter().map(Q80::widened).collect();
                    each_row!(Rows::Q80(&wide))
                }
            }
            out
        };
        let tasks = self.n.div_ceil(per_task);
        let pieces: Vec<Vec<f32>> = if tasks == 1 {
            vec![piece(0)]
        } else {
            (0..tasks).into_par_iter().map(piece).collect()
        };
        let mut y = vec![0f32; rows * self.n];
        for (task, piece) in pieces.iter().enumerate() {
            let first = task * per_task;
            let width = piece.len() / rows;
            for (y, p) in y.chunks_exact_mut(self.n).zip(piece.chunks_exact(width)) {
                y[first..first + width].copy_from_slice(p);
            }
        }
        y
    }
}

#[cfg(test)]
mod tests;
