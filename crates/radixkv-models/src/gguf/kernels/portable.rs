//! The kernels in plain Rust, on any CPU: the reference the vector ones
//! are tested against, and what runs where AVX2, FMA or F16C is missing.

use super::blocks::{Act, Scale, Q41, Q80};
use half::f16;

/// One activation block quantized as llama.cpp's `q8_1`: `d = max|x| /
/// 127` (stored as f16), `q = round(x × 127 / max|x|)` (ties to even),
/// `s = d × Σq` (f16).
#[inline(always)]
pub(crate) fn quantize(x: &[f32]) -> Act {
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

/// [`Kernel::q4_1`](super::Kernel) for one row, block by block in order.
pub(crate) fn q4_1<S: Scale>(w: &[Q41<S>], a: &[Act]) -> f32 {
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

/// [`Kernel::q8_0`](super::Kernel) for one row, block by block in order.
pub(crate) fn q8_0<S: Scale>(w: &[Q80<S>], a: &[Act]) -> f32 {
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
