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
        let [y] = matmuls([self], kernel, x, rows);
        y
    }

    /// Columns `cols` of `acts Wᵀ` (`acts` is `rows` activation rows of
    /// `k / BLOCK` blocks each): `rows × cols.len()`, row-major.
    fn piece(
        &self,
        kernel: Kernel,
        acts: &[Act],
        rows: usize,
        cols: std::ops::Range<usize>,
    ) -> Vec<f32> {
        let kb = self.k / BLOCK;
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
    }
}

/// `x Wᵀ` for each of `ws` (all of the same `k`) and `x` of `rows × k`
/// (row-major): `rows × n` each, row-major, each the bits of
/// [`QWeight::matmul`]. `x` is quantized once, and the tasks of all the
/// products share one parallel region (the Q, K and V projections of a
/// decode step are a few tasks each).
pub(crate) fn matmuls<const M: usize>(
    ws: [&QWeight; M],
    kernel: Kernel,
    x: &[f32],
    rows: usize,
) -> [Vec<f32>; M] {
    for w in ws {
        assert_eq!(x.len(), rows * w.k, "activations are not rows x k");
    }
    if rows == 0 {
        return std::array::from_fn(|_| Vec::new());
    }
    let acts: Vec<Act> = x.chunks_exact(BLOCK).map(|b| kernel.quantize(b)).collect();
    // Each task computes a run of columns of one product for every row
    // (row-major within the task), copied into place after; a single task
    // stays on the calling thread.
    let per_task = ws.map(|w| w.columns_per_task(rows));
    let tasks: Vec<(usize, std::ops::Range<usize>)> = (0..M)
        .flat_map(|m| {
            let (n, per) = (ws[m].n, per_task[m].max(1));
            (0..n.div_ceil(per)).map(move |t| (m, t * per..((t + 1) * per).min(n)))
        })
        .collect();
    let piece = |(m, cols): &(usize, std::ops::Range<usize>)| {
        ws[*m].piece(kernel, &acts, rows, cols.clone())
    };
    let pieces: Vec<Vec<f32>> = if tasks.len() == 1 {
        tasks.iter().map(piece).collect()
    } else {
        tasks.par_iter().map(piece).collect()
    };
    let mut ys: [Vec<f32>; M] = std::array::from_fn(|m| vec![0f32; rows * ws[m].n]);
    for ((m, cols), piece) in tasks.iter().zip(&pieces) {
        let n = ws[*m].n;
        for (y, p) in ys[*m]
            .chunks_exact_mut(n)
            .zip(piece.chunks_exact(cols.len()))
        {
            y[cols.clone()].copy_from_slice(p);
        }
    }
    ys
}

#[cfg(test)]
mod tests;
