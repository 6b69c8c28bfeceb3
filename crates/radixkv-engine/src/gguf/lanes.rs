//! The eight float lanes of an AVX2 register added in one fixed order,
//! shared by the matmul and attention kernels: their results' bits depend
//! on that order, and the portable versions follow it.

use std::arch::x86_64::*;

/// `((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))` for the lanes `l`
/// of `v`.
#[target_feature(enable = "avx2")]
pub(super) fn hsum(v: __m256) -> f32 {
    // (l0 + l4, l1 + l5, l2 + l6, l3 + l7), then pairs 0 + 2 and 1 + 3.
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}
