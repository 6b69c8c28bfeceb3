//! The blocks the kernels read: `Q4_1` and `Q8_0` weight blocks as the
//! GGUF stores them (or with their scales widened), and the 8-bit
//! activation blocks (`q8_1`) the activations are quantized into.

use half::f16;

/// Elements in one quantization block (both weight types and the
/// activations).
pub(crate) const BLOCK: usize = 32;

/// A `Q4_1` weight block: `w = d × q + m` for the 4-bit `q` (the low
/// nibbles are elements 0..16, the high ones 16..32). As the GGUF stores
/// it (20 bytes), the scales are the bits of f16s (`S = u16`), widened
/// where a dot uses them; a product of many activation rows widens its
/// weights' scales once (`S = f32`). Widening is exact: every f16 is an
/// f32.
#[derive(Clone, Copy)]
pub(crate) struct Q41<S = u16> {
    pub(crate) d: S,
    pub(crate) m: S,
    pub(crate) qs: [u8; 16],
}

/// A `Q8_0` weight block: `w = d × q` (34 bytes as stored), its scale as
/// in [`Q41`].
#[derive(Clone, Copy)]
pub(crate) struct Q80<S = u16> {
    pub(crate) d: S,
    pub(crate) qs: [i8; 32],
}

/// An f16's bits as an f32 (exact), without F16C.
pub(crate) fn widen(bits: u16) -> f32 {
    f16::from_bits(bits).to_f32()
}

/// A block's scale as stored (f16 bits) or widened (f32).
pub(crate) trait Scale: Copy + Send + Sync {
    /// As an f32, by the portable path.
    fn get(self) -> f32;
    /// Eight scales as f32s in one vector (element `i` in lane `i`), with
    /// F16C.
    ///
    /// # Safety
    /// The CPU must support F16C (and AVX2 and FMA, which the kernels
    /// that call it enable).
    #[cfg(target_arch = "x86_64")]
    unsafe fn eight_f16c(x: [Self; 8]) -> std::arch::x86_64::__m256;
}

impl Scale for u16 {
    #[inline(always)]
    fn get(self) -> f32 {
        widen(self)
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn eight_f16c(x: [u16; 8]) -> std::arch::x86_64::__m256 {
        // SAFETY: the caller's CPU has F16C, AVX2 and FMA.
        unsafe { widen8_f16c(x) }
    }
}

impl Scale for f32 {
    #[inline(always)]
    fn get(self) -> f32 {
        self
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn eight_f16c(x: [f32; 8]) -> std::arch::x86_64::__m256 {
        // SAFETY: the caller's CPU has AVX (AVX2 implies it).
        unsafe { std::arch::x86_64::_mm256_loadu_ps(x.as_ptr()) }
    }
}

impl Q41 {
    pub(crate) fn widened(&self) -> Q41<f32> {
        Q41 {
            d: widen(self.d),
            m: widen(self.m),
            qs: self.qs,
        }
    }
}

impl Q80 {
    pub(crate) fn widened(&self) -> Q80<f32> {
        Q80 {
            d: widen(self.d),
            qs: self.qs,
        }
    }
}

/// An activation block (llama.cpp's `q8_1`): `x ≈ d × q`, and
/// `s = d × Σq` for the offset term of `Q4_1`.
#[derive(Clone, Copy)]
pub(crate) struct Act {
    pub(crate) d: f32,
    pub(crate) s: f32,
    pub(crate) qs: [i8; 32],
}

/// Consecutive weight rows (their blocks, row after row), as stored or
/// with widened scales.
#[derive(Clone, Copy)]
pub(crate) enum Rows<'a, S> {
    Q41(&'a [Q41<S>]),
    Q80(&'a [Q80<S>]),
}

/// Eight f16s' bits as f32s (exact), in one conversion.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn widen8_f16c(x: [u16; 8]) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    let half = |h: usize| (0..4).fold(0u64, |v, i| v | u64::from(x[4 * h + i]) << (16 * i)) as i64;
    _mm256_cvtph_ps(_mm_set_epi64x(half(1), half(0)))
}
