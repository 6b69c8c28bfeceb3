//! Matmuls over the quantized weight types SmolLM2's GGUF stores
//! (`Q4_1` and `Q8_0`), computed the way llama.cpp computes them: each
//! activation row is quantized to 8 bits in blocks of 32 (`q8_1`: a scale
//! `d`, the sum `s = d × Σq`, 32 signed bytes), and a weight block's dot
//! with it is an exact integer sum scaled by the blocks' scales. candle
//! computes `Q4_1` with a scalar loop only; here it runs with AVX2 where the
//! CPU has it (detected at run time) and over rayon's threads, split by
//! output columns.
//!
//! A row's outputs depend only on that row and the weights, never on the
//! other rows of the call or on how the columns were split: the paged
//! passes and the dense reference agree exactly however they batch. These
//! are the only matmuls the model computes: a weight of any other type is
//! refused at load (`super::tensors`).

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::Tensor;
use half::f16;
use rayon::prelude::*;

/// Elements in one quantization block (both weight types and the
/// activations).
const BLOCK: usize = 32;

/// Multiply-adds per task when a product is split over rayon's threads
/// (a few microseconds of work: the model's pass runs inside the pool,
/// where handing a task to a spinning thread costs far less).
const MACS_PER_TASK: usize = 1 << 15;

/// A `Q4_1` weight block: `w = d × q + m` for the 4-bit `q` (the low
/// nibbles are elements 0..16, the high ones 16..32).
#[derive(Clone, Copy)]
struct Q41 {
    d: f32,
    m: f32,
    qs: [u8; 16],
}

/// A `Q8_0` weight block: `w = d × q`.
#[derive(Clone, Copy)]
struct Q80 {
    d: f32,
    qs: [i8; 32],
}

/// An activation block (llama.cpp's `q8_1`): `x ≈ d × q`, and
/// `s = d × Σq` for the offset term of `Q4_1`.
#[derive(Clone, Copy)]
struct Act {
    d: f32,
    s: f32,
    qs: [i8; 32],
}

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

fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f32()
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

    /// `x Wᵀ` for `x` of `rows × k` (row-major): `rows × n`, row-major.
    pub(crate) fn matmul(&self, x: &[f32], rows: usize) -> Vec<f32> {
        assert_eq!(x.len(), rows * self.k, "activations are not rows x k");
        if rows == 0 || self.n == 0 {
            return Vec::new();
        }
        let kb = self.k / BLOCK;
        let kernel = Kernel::detect();
        let acts: Vec<Act> = x.chunks_exact(BLOCK).map(|b| kernel.quantize(b)).collect();
        // Each task computes a run of columns for every row (row-major
        // within the task), copied into place after. The columns per task
        // are a multiple of four (the kernel's widest step); a product of
        // one task stays on the calling thread.
        let tasks = (rows * self.n * self.k / MACS_PER_TASK).clamp(1, self.n);
        let per_task = self.n.div_ceil(tasks).next_multiple_of(4);
        let piece = |task: usize| {
            let cols = task * per_task..((task + 1) * per_task).min(self.n);
            let mut out = vec![0f32; cols.len() * rows];
            for (a, out) in acts.chunks_exact(kb).zip(out.chunks_exact_mut(cols.len())) {
                kernel.columns(&self.blocks, kb, cols.clone(), a, out);
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

    /// `x Wᵀ` for `x` of shape `(rows, k)`: shape `(rows, n)`.
    pub(crate) fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let (rows, k) = x.dims2()?;
        if k != self.k {
            candle_core::bail!("{k} inputs into a {} x {} weight", self.n, self.k);
        }
        let y = self.matmul(&x.flatten_all()?.to_vec1::<f32>()?, rows);
        Tensor::from_vec(y, (rows, self.n), x.device())
    }
}

/// [`quantize_portable`] compiled for AVX2 (vector rounding instead of a
/// call per element; the same bits).
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn quantize_avx2(x: &[f32]) -> Act {
    quantize_portable(x)
}

/// One activation block quantized as llama.cpp's `q8_1`: `d = max|x| /
/// 127` (stored as f16), `q = round(x × 127 / max|x|)` (ties to even),
/// `s = d × Σq` (f16).
#[inline(always)]
fn quantize_portable(x: &[f32]) -> Act {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    let mut qs = [0i8; 32];
    let mut sum = 0i32;
    for (q, &v) in qs.iter_mut().zip(x) {
        *q = (v * id).round_ties_even() as i8;
        sum += *q as i32;
    }
    Act {
        d: f16::from_f32(d).to_f32(),
        s: f16::from_f32(d * sum as f32).to_f32(),
        qs,
    }
}

/// The block dot products, with AVX2 and FMA or without.
#[derive(Clone, Copy)]
enum Kernel {
    Portable,
    #[cfg(target_arch = "x86_64")]
    Avx2,
}

impl Kernel {
    fn detect() -> Kernel {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            return Kernel::Avx2;
        }
        Kernel::Portable
    }

    /// One activation block, as [`quantize_portable`].
    fn quantize(self, x: &[f32]) -> Act {
        match self {
            Kernel::Portable => quantize_portable(x),
            // SAFETY: `Avx2` is only made by `detect` after the CPU
            // reported AVX2 (and FMA).
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => unsafe { quantize_avx2(x) },
        }
    }

    /// `Σ_blocks (d_w d_a Σ q_w q_a + m_w s_a)` over each of `N` `Q4_1`
    /// rows with the same activations. Each row's sum is taken as if alone:
    /// several at once only keep more independent work in flight.
    fn q4_1<const N: usize>(self, w: [&[Q41]; N], a: &[Act]) -> [f32; N] {
        match self {
            Kernel::Portable => w.map(|w| q4_1_portable(w, a)),
            // SAFETY: `Avx2` is only made by `detect` after the CPU
            // reported both AVX2 and FMA.
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => unsafe { avx2::q4_1(w, a) },
        }
    }

    /// `Σ_blocks d_w d_a Σ q_w q_a` over each of `N` `Q8_0` rows, as
    /// [`q4_1`](Self::q4_1).
    fn q8_0<const N: usize>(self, w: [&[Q80]; N], a: &[Act]) -> [f32; N] {
        match self {
            Kernel::Portable => w.map(|w| q8_0_portable(w, a)),
            // SAFETY: as in `q4_1`: the CPU has AVX2 and FMA.
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => unsafe { avx2::q8_0(w, a) },
        }
    }

    /// One activation row `a` (`kb` blocks) against weight rows `cols` of
    /// `blocks`, into `out[c - cols.start]`.
    fn columns(
        self,
        blocks: &Blocks,
        kb: usize,
        cols: std::ops::Range<usize>,
        a: &[Act],
        out: &mut [f32],
    ) {
        let first = cols.start;
        let mut c = first;
        macro_rules! run {
            ($w:expr, $f:ident) => {{
                let row = |c: usize| &$w[c * kb..(c + 1) * kb];
                while c + 4 <= cols.end {
                    let ys = self.$f([row(c), row(c + 1), row(c + 2), row(c + 3)], a);
                    out[c - first..c - first + 4].copy_from_slice(&ys);
                    c += 4;
                }
                while c < cols.end {
                    out[c - first] = self.$f([row(c)], a)[0];
                    c += 1;
                }
            }};
        }
        match blocks {
            Blocks::Q41(w) => run!(w, q4_1),
            Blocks::Q80(w) => run!(w, q8_0),
        }
    }
}

fn q4_1_portable(w: &[Q41], a: &[Act]) -> f32 {
    let mut sum = 0f32;
    for (w, a) in w.iter().zip(a) {
        let mut isum = 0i32;
        for j in 0..16 {
            isum += (w.qs[j] & 0x0F) as i32 * a.qs[j] as i32;
            isum += (w.qs[j] >> 4) as i32 * a.qs[j + 16] as i32;
        }
        sum += w.d * a.d * isum as f32 + w.m * a.s;
    }
    sum
}

fn q8_0_portable(w: &[Q80], a: &[Act]) -> f32 {
    let mut sum = 0f32;
    for (w, a) in w.iter().zip(a) {
        let isum: i32 =
            w.qs.iter()
                .zip(&a.qs)
                .map(|(&x, &y)| x as i32 * y as i32)
                .sum();
        sum += w.d * a.d * isum as f32;
    }
    sum
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    //! The block dots with AVX2: the integer products of a block summed
    //! exactly in eight 32-bit lanes, scaled into eight float lanes, and
    //! the lanes added in one fixed order at the end.
    use super::super::lanes::hsum;
    use super::{Act, Q41, Q80};
    use std::arch::x86_64::*;

    /// Eight lanes of `Σ u × i` over 32 pairs of unsigned `u` (below 128)
    /// and signed `i` bytes (no overflow: each 16-bit pair sum is at most
    /// 2 × 127 × 128).
    #[target_feature(enable = "avx2,fma")]
    fn dot_u8_i8(u: __m256i, i: __m256i) -> __m256i {
        _mm256_madd_epi16(_mm256_maddubs_epi16(u, i), _mm256_set1_epi16(1))
    }

    /// [`super::Kernel::q4_1`]: per row, one vector accumulator and one
    /// scalar sum of offsets, block by block.
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn q4_1<const N: usize>(w: [&[Q41]; N], a: &[Act]) -> [f32; N] {
        let low = _mm_set1_epi8(0x0F);
        let mut acc = [_mm256_setzero_ps(); N];
        let mut offsets = [0f32; N];
        for (b, a) in a.iter().enumerate() {
            // SAFETY: `qs` is 32 bytes; unaligned load.
            let y = unsafe { _mm256_loadu_si256(a.qs.as_ptr().cast()) };
            for i in 0..N {
                let w = &w[i][b];
                // SAFETY: `qs` is 16 bytes and `loadu` has no alignment
                // requirement.
                let packed = unsafe { _mm_loadu_si128(w.qs.as_ptr().cast()) };
                let lo = _mm_and_si128(packed, low);
                let hi = _mm_and_si128(_mm_srli_epi16(packed, 4), low);
                let q = _mm256_set_m128i(hi, lo);
                let dots = _mm256_cvtepi32_ps(dot_u8_i8(q, y));
                acc[i] = _mm256_fmadd_ps(_mm256_set1_ps(w.d * a.d), dots, acc[i]);
                offsets[i] += w.m * a.s;
            }
        }
        std::array::from_fn(|i| hsum(acc[i]) + offsets[i])
    }

    /// [`super::Kernel::q8_0`]: per row, one vector accumulator, block by
    /// block.
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn q8_0<const N: usize>(w: [&[Q80]; N], a: &[Act]) -> [f32; N] {
        let mut acc = [_mm256_setzero_ps(); N];
        for (b, a) in a.iter().enumerate() {
            // SAFETY: `qs` is 32 bytes; unaligned load.
            let y = unsafe { _mm256_loadu_si256(a.qs.as_ptr().cast()) };
            for i in 0..N {
                let w = &w[i][b];
                // SAFETY: `qs` is 32 bytes; unaligned load.
                let x = unsafe { _mm256_loadu_si256(w.qs.as_ptr().cast()) };
                // |x| × (y with x's sign) = x × y, with an unsigned left side.
                let dots =
                    _mm256_cvtepi32_ps(dot_u8_i8(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x)));
                acc[i] = _mm256_fmadd_ps(_mm256_set1_ps(w.d * a.d), dots, acc[i]);
            }
        }
        std::array::from_fn(|i| hsum(acc[i]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::QMatMul;
    use candle_core::{Device, Module};

    fn random(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2_654_435_761).max(1);
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s as f32 / u32::MAX as f32) * 2.0 - 1.0
            })
            .collect()
    }

    fn weight(dtype: GgmlDType, n: usize, k: usize) -> (QTensor, QWeight) {
        let w = Tensor::from_vec(random(n * k, 7), (n, k), &Device::Cpu).unwrap();
        let q = QTensor::quantize(&w, dtype).unwrap();
        let own = QWeight::new(&q).unwrap().unwrap();
        (q, own)
    }

    /// Each output against candle's quantized matmul of the same tensor
    /// (the same block math, with `s` rounded once more): within 1e-3 of
    /// the row's `Σ|w x|` scale.
    #[test]
    fn matmul_agrees_with_candles_quantized_matmul() {
        for dtype in [GgmlDType::Q4_1, GgmlDType::Q8_0] {
            let (n, k, rows) = (40, 96, 5);
            let (q, own) = weight(dtype, n, k);
            let x = random(rows * k, 3);
            let ours = own.matmul(&x, rows);
            let xt = Tensor::from_vec(x, (rows, k), &Device::Cpu).unwrap();
            let theirs = QMatMul::from_qtensor(q).unwrap().forward(&xt).unwrap();
            let theirs = theirs.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            for (i, (a, b)) in ours.iter().zip(&theirs).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-3 * k as f32,
                    "{dtype:?} [{i}]: {a} vs {b}"
                );
            }
        }
    }

    /// No rows (a dense pass asked for no positions) give no outputs.
    #[test]
    fn no_rows_give_no_outputs() {
        let (_, own) = weight(GgmlDType::Q4_1, 8, 32);
        assert!(own.matmul(&[], 0).is_empty());
        let x = Tensor::zeros((0, 32), candle_core::DType::F32, &Device::Cpu).unwrap();
        let y = own.forward(&x).unwrap();
        assert_eq!(y.dims(), &[0, 8]);
    }

    /// A row's outputs are the same alone or among other rows, to the bit.
    #[test]
    fn a_rows_outputs_do_not_depend_on_the_other_rows() {
        for dtype in [GgmlDType::Q4_1, GgmlDType::Q8_0] {
            let (n, k, rows) = (50, 64, 7);
            let (_, own) = weight(dtype, n, k);
            let x = random(rows * k, 11);
            let all = own.matmul(&x, rows);
            for r in 0..rows {
                let one = own.matmul(&x[r * k..(r + 1) * k], 1);
                assert_eq!(one, all[r * n..(r + 1) * n], "{dtype:?} row {r}");
            }
        }
    }

    /// The AVX2 kernel (where this CPU has it) against the portable one.
    #[test]
    fn the_vector_kernel_matches_the_portable_one() {
        let kernel = Kernel::detect();
        let acts: Vec<Act> = random(256, 5)
            .chunks_exact(BLOCK)
            .map(|b| kernel.quantize(b))
            .collect();
        for dtype in [GgmlDType::Q4_1, GgmlDType::Q8_0] {
            let (_, own) = weight(dtype, 3, 256);
            for c in 0..3 {
                let (fast, slow) = match &own.blocks {
                    Blocks::Q41(w) => (
                        kernel.q4_1([&w[c * 8..(c + 1) * 8]], &acts)[0],
                        q4_1_portable(&w[c * 8..(c + 1) * 8], &acts),
                    ),
                    Blocks::Q80(w) => (
                        kernel.q8_0([&w[c * 8..(c + 1) * 8]], &acts)[0],
                        q8_0_portable(&w[c * 8..(c + 1) * 8], &acts),
                    ),
                };
                assert!(
                    (fast - slow).abs() <= 1e-4 * slow.abs().max(1.0),
                    "{fast} vs {slow}"
                );
            }
        }
    }

    /// Four rows at once give each row's bits alone.
    #[test]
    fn rows_taken_four_at_once_give_their_bits_alone() {
        let kernel = Kernel::detect();
        let acts: Vec<Act> = random(256, 9)
            .chunks_exact(BLOCK)
            .map(|b| kernel.quantize(b))
            .collect();
        for dtype in [GgmlDType::Q4_1, GgmlDType::Q8_0] {
            let (_, own) = weight(dtype, 4, 256);
            let (four, alone): (Vec<f32>, Vec<f32>) = match &own.blocks {
                Blocks::Q41(w) => {
                    let row = |c: usize| &w[c * 8..(c + 1) * 8];
                    (
                        kernel
                            .q4_1([row(0), row(1), row(2), row(3)], &acts)
                            .to_vec(),
                        (0..4).map(|c| kernel.q4_1([row(c)], &acts)[0]).collect(),
                    )
                }
                Blocks::Q80(w) => {
                    let row = |c: usize| &w[c * 8..(c + 1) * 8];
                    (
                        kernel
                            .q8_0([row(0), row(1), row(2), row(3)], &acts)
                            .to_vec(),
                        (0..4).map(|c| kernel.q8_0([row(c)], &acts)[0]).collect(),
                    )
                }
            };
            let bits = |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&four), bits(&alone), "{dtype:?}");
        }
    }

    #[test]
    fn quantize_rounds_ties_to_even_and_sums() {
        let mut x = [0f32; 32];
        x[0] = 127.0;
        x[1] = 2.5;
        x[2] = -3.5;
        let a = Kernel::detect().quantize(&x);
        assert_eq!((a.qs[0], a.qs[1], a.qs[2]), (127, 2, -4));
        assert_eq!(a.d, 1.0);
        assert_eq!(a.s, 125.0);
        let zero = Kernel::detect().quantize(&[0f32; 32]);
        assert_eq!((zero.d, zero.s, zero.qs), (0.0, 0.0, [0; 32]));
    }
}
