//! The kernels with AVX2, FMA and F16C (x86-64 only). A block's integer
//! products are summed exactly in eight 32-bit lanes and scaled into eight
//! float lanes; the lanes are added in one fixed order at the end
//! ([`hsum`], which attention's vector path shares): the results' bits
//! depend on that order.
//!
//! Every function here needs the CPU features it enables: only a
//! [`Kernel`](super::Kernel) made after the CPU reported them calls in.

use super::blocks::{Act, Scale, Q41, Q80};
use std::arch::x86_64::*;

/// Eight lanes of `Σ u × i` over 32 pairs of unsigned `u` (below 128)
/// and signed `i` bytes (no overflow: each 16-bit pair sum is at most
/// 2 × 127 × 128).
#[target_feature(enable = "avx2,fma")]
fn dot_u8_i8(u: __m256i, i: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(u, i), _mm256_set1_epi16(1))
}

/// [`Kernel::q4_1`](super::Kernel): per row, one vector accumulator and one
/// scalar sum of offsets, block by block.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q4_1<S: Scale, const N: usize>(w: [&[Q41<S>]; N], a: &[Act]) -> [f32; N] {
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

/// [`Kernel::q8_0`](super::Kernel): per row, one vector accumulator, block by
/// block.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q8_0<S: Scale, const N: usize>(w: [&[Q80<S>]; N], a: &[Act]) -> [f32; N] {
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

/// [`portable::quantize`](super::portable::quantize) compiled for AVX2 (vector rounding instead of a
/// call per element; the same bits).
///
/// # Safety
/// The CPU must support AVX2.
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn quantize(x: &[f32]) -> Act {
    super::portable::quantize(x)
}

/// `((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))` for the lanes `l`
/// of `v`.
#[target_feature(enable = "avx2")]
pub(crate) fn hsum(v: __m256) -> f32 {
    // (l0 + l4, l1 + l5, l2 + l6, l3 + l7), then pairs 0 + 2 and 1 + 3.
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}
