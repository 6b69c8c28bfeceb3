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

/// [`Kernel::q4_1`](super::Kernel): per row, one vector accumulator and
/// one sum of offsets, block by block. Up to four rows at a time
/// (`N <= 4`): their blocks' scales and offsets are widened in one F16C
/// conversion and multiplied by the activation block's in one vector
/// product (lane by lane the products a scalar path takes), and the
/// offsets summed in that vector's lanes; each row's 32 weights come from
/// one 16-byte load, the high nibbles shifted down in the upper half.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q4_1<S: Scale, const N: usize>(w: [&[Q41<S>]; N], a: &[Act]) -> [f32; N] {
    const { assert!(N >= 1 && N <= 4, "one to four rows at a time") };
    let low = _mm256_set1_epi8(0x0F);
    // Lanes 0..4 keep the low nibbles, 4..8 take the high ones.
    let shift = _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4);
    let lane = |i: usize| _mm256_set1_epi32(2 * i as i32);
    let mut acc = [_mm256_setzero_ps(); N];
    // Lane 2i + 1: row i's sum of offsets (the even lanes are not read).
    let mut offsets = _mm256_setzero_ps();
    for (b, a) in a.iter().enumerate() {
        // SAFETY: `qs` is 32 bytes; unaligned load.
        let y = unsafe { _mm256_loadu_si256(a.qs.as_ptr().cast()) };
        // (d, m) of rows 0..4 (the last row again where `N < 4`).
        let blocks: [&Q41<S>; 4] = std::array::from_fn(|i| &w[i.min(N - 1)][b]);
        // SAFETY: this function's features include F16C.
        let dm = unsafe {
            S::eight_f16c(std::array::from_fn(|i| {
                let w = blocks[i / 2];
                if i % 2 == 0 {
                    w.d
                } else {
                    w.m
                }
            }))
        };
        // (d_i × a.d, m_i × a.s) for each row i.
        let products = _mm256_mul_ps(dm, _mm256_setr_ps(a.d, a.s, a.d, a.s, a.d, a.s, a.d, a.s));
        offsets = _mm256_add_ps(offsets, products);
        for i in 0..N {
            // SAFETY: `qs` is 16 bytes and `loadu` has no alignment
            // requirement.
            let packed = unsafe { _mm_loadu_si128(blocks[i].qs.as_ptr().cast()) };
            let q = _mm256_and_si256(
                _mm256_srlv_epi32(_mm256_broadcastsi128_si256(packed), shift),
                low,
            );
            let dots = _mm256_cvtepi32_ps(dot_u8_i8(q, y));
            let scale = _mm256_permutevar8x32_ps(products, lane(i));
            acc[i] = _mm256_fmadd_ps(scale, dots, acc[i]);
        }
    }
    let mut off = [0f32; 8];
    // SAFETY: `off` is 8 floats; unaligned store.
    unsafe { _mm256_storeu_ps(off.as_mut_ptr(), offsets) };
    std::array::from_fn(|i| hsum(acc[i]) + off[2 * i + 1])
}

/// [`Kernel::q8_0`](super::Kernel): per row, one vector accumulator, block by
/// block; up to four rows at a time (`N <= 4`), their blocks' scales
/// widened in one F16C conversion and multiplied by the activation
/// block's in one vector product, as in [`q4_1`].
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q8_0<S: Scale, const N: usize>(w: [&[Q80<S>]; N], a: &[Act]) -> [f32; N] {
    const { assert!(N >= 1 && N <= 4, "one to four rows at a time") };
    let lane = |i: usize| _mm256_set1_epi32(i as i32);
    let mut acc = [_mm256_setzero_ps(); N];
    for (b, a) in a.iter().enumerate() {
        // SAFETY: `qs` is 32 bytes; unaligned load.
        let y = unsafe { _mm256_loadu_si256(a.qs.as_ptr().cast()) };
        let blocks: [&Q80<S>; 4] = std::array::from_fn(|i| &w[i.min(N - 1)][b]);
        // SAFETY: this function's features include F16C.
        let d = unsafe { S::eight_f16c(std::array::from_fn(|i| blocks[i % 4].d)) };
        // d_i × a.d in lane i.
        let products = _mm256_mul_ps(d, _mm256_set1_ps(a.d));
        for i in 0..N {
            // SAFETY: `qs` is 32 bytes; unaligned load.
            let x = unsafe { _mm256_loadu_si256(blocks[i].qs.as_ptr().cast()) };
            // |x| × (y with x's sign) = x × y, with an unsigned left side.
            let dots =
                _mm256_cvtepi32_ps(dot_u8_i8(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x)));
            let scale = _mm256_permutevar8x32_ps(products, lane(i));
            acc[i] = _mm256_fmadd_ps(scale, dots, acc[i]);
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
