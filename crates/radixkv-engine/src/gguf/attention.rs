//! Grouped-query attention of one query row over the K/V rows of its
//! positions, for [`LlamaModel`](super::LlamaModel): each head's keys in
//! order, its softmax as llama.cpp computes it, and the same bits with or
//! without AVX2 (the dot products have no fused multiply-adds to contract).

/// The query heads that read one K/V head, and what they attend over.
pub(super) struct Group<'a> {
    /// Floats of one head.
    pub head_dim: usize,
    /// The group's query heads, `g × head_dim` floats.
    pub q: &'a [f32],
    /// The K/V head they read.
    pub kvh: usize,
    /// K rows of the positions (one slice of `kv_heads × head_dim` each).
    pub k: &'a [&'a [f32]],
    /// V rows, as `k`.
    pub v: &'a [&'a [f32]],
    /// Positions attended over: the first `keys` of `k` and `v`.
    pub keys: usize,
}

/// The attention of the group's query heads into `out` (the shape of
/// `g.q`); `w` is scratch for the weights. Each head is computed as alone,
/// keys in order; reading each K/V row once for the whole group is what
/// the grouping saves. With AVX2 the same code is compiled for it, with
/// [`dot_avx2`]: neither has fused multiply-adds to contract, so both
/// versions give the same bits.
pub(super) fn attention_group(g: &Group<'_>, out: &mut [f32], w: &mut Vec<f32>) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: this CPU supports AVX2 (checked just above).
        return unsafe { attention_group_avx2(g, out, w) };
    }
    attention_group_portable(g, out, w, dot)
}

/// [`attention_group_portable`] compiled for AVX2.
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn attention_group_avx2(g: &Group<'_>, out: &mut [f32], w: &mut Vec<f32>) {
    // SAFETY (of the calls to `dot_avx2`): this function runs only where
    // the CPU supports AVX2, its own precondition.
    let dot = |a: &[f32], b: &[f32]| unsafe { dot_avx2(a, b) };
    attention_group_portable(g, out, w, dot)
}

#[inline(always)]
fn attention_group_portable(
    group: &Group<'_>,
    out: &mut [f32],
    w: &mut Vec<f32>,
    dot: impl Fn(&[f32], &[f32]) -> f32,
) {
    let Group {
        head_dim: hd,
        q,
        kvh,
        k,
        v,
        keys,
    } = *group;
    let g = q.len() / hd;
    let at = kvh * hd;
    let scale = 1.0 / (hd as f32).sqrt();
    // w: the g heads' scores, head-major.
    w.clear();
    w.resize(g * keys, 0.0);
    for (j, kj) in k[..keys].iter().enumerate() {
        let kj = &kj[at..][..hd];
        for (h, qh) in q.chunks_exact(hd).enumerate() {
            w[h * keys + j] = dot(qh, kj) * scale;
        }
    }
    // Softmax as llama.cpp computes it: the exponentials summed in f64,
    // then each multiplied by the reciprocal of the sum.
    for wh in w.chunks_exact_mut(keys) {
        let max = wh.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
        let mut sum = 0f64;
        for x in wh.iter_mut() {
            *x = (*x - max).exp();
            sum += *x as f64;
        }
        let inv = (1.0 / sum) as f32;
        for x in wh.iter_mut() {
            *x *= inv;
        }
    }
    out.fill(0.0);
    for (j, vj) in v[..keys].iter().enumerate() {
        let vj = &vj[at..][..hd];
        for (h, oh) in out.chunks_exact_mut(hd).enumerate() {
            let p = w[h * keys + j];
            for (acc, &x) in oh.iter_mut().zip(vj) {
                *acc += p * x;
            }
        }
    }
}

/// `Σ a b` in eight lanes (element `i` into lane `i % 8`, multiplied then
/// added, no fused multiply-add), the lanes added as `((l0 + l4) + (l2 +
/// l6)) + ((l1 + l5) + (l3 + l7))`, then the elements past the last eight.
/// [`dot_avx2`] computes the same bits.
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut l = [0f32; 8];
    let (a8, b8) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = a8
        .remainder()
        .iter()
        .zip(b8.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in a8.zip(b8) {
        for i in 0..8 {
            l[i] += x[i] * y[i];
        }
    }
    (((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]))) + tail
}

/// [`dot`] with AVX2 registers.
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let (a8, b8) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = a8
        .remainder()
        .iter()
        .zip(b8.remainder())
        .map(|(x, y)| x * y)
        .sum();
    let mut acc = _mm256_setzero_ps();
    for (x, y) in a8.zip(b8) {
        // SAFETY: `x` and `y` are 8 floats each; unaligned loads.
        let (x, y) = unsafe { (_mm256_loadu_ps(x.as_ptr()), _mm256_loadu_ps(y.as_ptr())) };
        acc = _mm256_add_ps(acc, _mm256_mul_ps(x, y));
    }
    // (l0 + l4, l1 + l5, l2 + l6, l3 + l7), then pairs 0 + 2 and 1 + 3.
    let s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s) + tail
}

#[cfg(test)]
mod tests {
    /// The AVX2 dot (where this CPU has it) gives the portable one's bits.
    #[test]
    fn the_vector_dot_equals_the_portable_one() {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            let a: Vec<f32> = (0..67).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
            let b: Vec<f32> = (0..67).map(|i| (i as f32 * 1.91).cos() / 7.0).collect();
            for n in [0, 5, 8, 64, 67] {
                // SAFETY: AVX2 is present (checked above).
                let fast = unsafe { super::dot_avx2(&a[..n], &b[..n]) };
                assert_eq!(
                    fast.to_bits(),
                    super::dot(&a[..n], &b[..n]).to_bits(),
                    "{n}"
                );
            }
        }
    }
}
