//! Matmuls over the quantized weight types SmolLM2's GGUF stores
//! (`Q4_1` and `Q8_0`), computed the way llama.cpp computes them: each
//! activation row is quantized to 8 bits in blocks of 32 (`q8_1`: a scale
//! `d`, the sum `s = d × Σq`, 32 signed bytes), and a weight block's dot
//! with it is an exact integer sum scaled by the blocks' scales. candle
//! computes `Q4_1` with a scalar loop only; here it runs with AVX2 (with FMA
//! and F16C) where the CPU has it (detected at run time) and over rayon's
//! threads, split by output columns. The blocks stay as the GGUF stores
//! them, f16 scales included; a product of several activation rows widens
//! its weights' scales once, into a copy.
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
/// nibbles are elements 0..16, the high ones 16..32). As the GGUF stores
/// it (20 bytes), the scales are the bits of f16s (`S = u16`), widened
/// where a dot uses them; a product of many activation rows widens its
/// weights' scales once (`S = f32`). Widening is exact: every f16 is an
/// f32.
#[derive(Clone, Copy)]
struct Q41<S = u16> {
    d: S,
    m: S,
    qs: [u8; 16],
}

/// A `Q8_0` weight block: `w = d × q` (34 bytes as stored), its scale as
/// in [`Q41`].
#[derive(Clone, Copy)]
struct Q80<S = u16> {
    d: S,
    qs: [i8; 32],
}

/// An f16's bits as an f32 (exact), without F16C.
fn widen(bits: u16) -> f32 {
    f16::from_bits(bits).to_f32()
}

/// A block's scale as stored (f16 bits) or widened (f32).
trait Scale: Copy + Send + Sync {
    /// As an f32, by the portable path.
    fn get(self) -> f32;
    /// Two scales as f32s, with F16C.
    ///
    /// # Safety
    /// The CPU must support F16C (and AVX2 and FMA, which the kernels
    /// that call it enable).
    #[cfg(target_arch = "x86_64")]
    unsafe fn pair_f16c(a: Self, b: Self) -> (f32, f32);
}

impl Scale for u16 {
    #[inline(always)]
    fn get(self) -> f32 {
        widen(self)
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn pair_f16c(a: u16, b: u16) -> (f32, f32) {
        // SAFETY: the caller's CPU has F16C, AVX2 and FMA.
        unsafe { avx2::widen2(a, b) }
    }
}

impl Scale for f32 {
    #[inline(always)]
    fn get(self) -> f32 {
        self
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn pair_f16c(a: f32, b: f32) -> (f32, f32) {
        (a, b)
    }
}

impl Q41 {
    fn widened(&self) -> Q41<f32> {
        Q41 {
            d: widen(self.d),
            m: widen(self.m),
            qs: self.qs,
        }
    }
}

impl Q80 {
    fn widened(&self) -> Q80<f32> {
        Q80 {
            d: widen(self.d),
            qs: self.qs,
        }
    }
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

/// Consecutive weight rows (their blocks, row after row), as stored or
/// with widened scales.
#[derive(Clone, Copy)]
enum Rows<'a, S> {
    Q41(&'a [Q41<S>]),
    Q80(&'a [Q80<S>]),
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
        if std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
            && std::arch::is_x86_feature_detected!("f16c")
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
    fn q4_1<S: Scale, const N: usize>(self, w: [&[Q41<S>]; N], a: &[Act]) -> [f32; N] {
        match self {
            Kernel::Portable => w.map(|w| q4_1_portable(w, a)),
            // SAFETY: `Avx2` is only made by `detect` after the CPU
            // reported AVX2, FMA and F16C.
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => unsafe { avx2::q4_1(w, a) },
        }
    }

    /// `Σ_blocks d_w d_a Σ q_w q_a` over each of `N` `Q8_0` rows, as
    /// [`q4_1`](Self::q4_1).
    fn q8_0<S: Scale, const N: usize>(self, w: [&[Q80<S>]; N], a: &[Act]) -> [f32; N] {
        match self {
            Kernel::Portable => w.map(|w| q8_0_portable(w, a)),
            // SAFETY: as in `q4_1`: the CPU has AVX2, FMA and F16C.
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => unsafe { avx2::q8_0(w, a) },
        }
    }

    /// One activation row `a` (`kb` blocks) against the `n` weight rows of
    /// `rows`, into `out[..n]`.
    fn columns<S: Scale>(self, rows: Rows<'_, S>, kb: usize, n: usize, a: &[Act], out: &mut [f32]) {
        let mut c = 0;
        macro_rules! run {
            ($w:expr, $f:ident) => {{
                let row = |c: usize| &$w[c * kb..(c + 1) * kb];
                while c + 4 <= n {
                    let ys = self.$f([row(c), row(c + 1), row(c + 2), row(c + 3)], a);
                    out[c..c + 4].copy_from_slice(&ys);
                    c += 4;
                }
                while c < n {
                    out[c] = self.$f([row(c)], a)[0];
                    c += 1;
                }
            }};
        }
        match rows {
            Rows::Q41(w) => run!(w, q4_1),
            Rows::Q80(w) => run!(w, q8_0),
        }
    }
}

fn q4_1_portable<S: Scale>(w: &[Q41<S>], a: &[Act]) -> f32 {
    let mut sum = 0f32;
    for (w, a) in w.iter().zip(a) {
        let mut isum = 0i32;
        for j in 0..16 {
            isum += (w.qs[j] & 0x0F) as i32 * a.qs[j] as i32;
            isum += (w.qs[j] >> 4) as i32 * a.qs[j + 16] as i32;
        }
        sum += w.d.get() * a.d * isum as f32 + w.m.get() * a.s;
    }
    sum
}

fn q8_0_portable<S: Scale>(w: &[Q80<S>], a: &[Act]) -> f32 {
    let mut sum = 0f32;
    for (w, a) in w.iter().zip(a) {
        let isum: i32 =
            w.qs.iter()
                .zip(&a.qs)
                .map(|(&x, &y)| x as i32 * y as i32)
                .sum();
        sum += w.d.get() * a.d * isum as f32;
    }
    sum
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    //! The block dots with AVX2: the integer products of a block summed
    //! exactly in eight 32-bit lanes, scaled into eight float lanes, and
    //! the lanes added in one fixed order at the end.
    use super::super::lanes::hsum;
    use super::{Act, Scale, Q41, Q80};
    use std::arch::x86_64::*;

    /// Eight lanes of `Σ u × i` over 32 pairs of unsigned `u` (below 128)
    /// and signed `i` bytes (no overflow: each 16-bit pair sum is at most
    /// 2 × 127 × 128).
    #[target_feature(enable = "avx2,fma")]
    fn dot_u8_i8(u: __m256i, i: __m256i) -> __m256i {
        _mm256_madd_epi16(_mm256_maddubs_epi16(u, i), _mm256_set1_epi16(1))
    }

    /// Two f16s' bits (`lo`, `hi`) as f32s (exact), in one conversion.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn widen2(lo: u16, hi: u16) -> (f32, f32) {
        let both = i32::from(lo) | (i32::from(hi) << 16);
        let v = _mm_cvtph_ps(_mm_cvtsi32_si128(both));
        (_mm_cvtss_f32(v), _mm_cvtss_f32(_mm_movehdup_ps(v)))
    }

    /// [`super::Kernel::q4_1`]: per row, one vector accumulator and one
    /// scalar sum of offsets, block by block.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q4_1<S: Scale, const N: usize>(w: [&[Q41<S>]; N], a: &[Act]) -> [f32; N] {
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
                // SAFETY: this function's features include F16C.
                let (d, m) = unsafe { S::pair_f16c(w.d, w.m) };
                acc[i] = _mm256_fmadd_ps(_mm256_set1_ps(d * a.d), dots, acc[i]);
                offsets[i] += m * a.s;
            }
        }
        std::array::from_fn(|i| hsum(acc[i]) + offsets[i])
    }

    /// [`super::Kernel::q8_0`]: per row, one vector accumulator, block by
    /// block.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q8_0<S: Scale, const N: usize>(w: [&[Q80<S>]; N], a: &[Act]) -> [f32; N] {
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
                // SAFETY: this function's features include F16C.
                let (d, _) = unsafe { S::pair_f16c(w.d, w.d) };
                acc[i] = _mm256_fmadd_ps(_mm256_set1_ps(d * a.d), dots, acc[i]);
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

    #[test]
    fn several_rows_at_once_give_each_rows_bits_alone() {
        // Several activation rows read the task's blocks with their scales
        // widened once into a copy; one row widens them in the dot. The
        // two must agree to the bit, on whichever kernel this CPU runs.
        for dtype in [GgmlDType::Q4_1, GgmlDType::Q8_0] {
            let (_, own) = weight(dtype, 40, 96);
            let x = random(3 * 96, 5);
            let all = own.matmul(&x, 3);
            for r in 0..3 {
                let one = own.matmul(&x[r * 96..(r + 1) * 96], 1);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&all[r * 40..(r + 1) * 40]),
                    bits(&one),
                    "{dtype:?} row {r}"
                );
            }
        }
    }

    #[test]
    fn rows_dequantize_to_candles_bits() {
        for dtype in [GgmlDType::Q4_1, GgmlDType::Q8_0] {
            let (q, own) = weight(dtype, 6, 64);
            let all = q
                .dequantize(&Device::Cpu)
                .unwrap()
                .to_vec2::<f32>()
                .unwrap();
            for (r, want) in all.iter().enumerate() {
                let mut got = Vec::new();
                own.row_into(r, &mut got);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(want), "{dtype:?} row {r}");
            }
        }
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
