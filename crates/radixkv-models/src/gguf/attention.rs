//! Grouped-query attention of query rows over the K/V rows of their
//! positions, for [`LlamaModel`](super::LlamaModel): how the rows and
//! heads are shared among rayon's threads ([`attend_rows`]), and each
//! group of heads' keys in order, its softmax as llama.cpp computes it, and the same bits with or
//! without AVX2 (no fused multiply-adds to contract; each head's sums are
//! taken in the same order however many heads are computed together).

use super::config::LlamaConfig;
use super::kernels::Kernel;
use rayon::prelude::*;

/// Query heads that read one K/V head, and what they attend over.
pub(super) struct Group<'a> {
    /// Floats of one head.
    pub head_dim: usize,
    /// The query heads, `heads × head_dim` floats (all of a K/V head's
    /// query heads, or some of them).
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
/// `g.q`); `w` is scratch for the weights. Each head's result is the same
/// bits as when it is computed alone; computing a K/V head's query heads
/// together reads each K row once for all of them. On the AVX2 kernel
/// (and a head width that is a multiple of 8) the same sums are taken in
/// vector registers, to the same bits.
pub(super) fn attention_group(kernel: Kernel, g: &Group<'_>, out: &mut [f32], w: &mut Vec<f32>) {
    let (hd, keys) = (g.head_dim, g.keys);
    let heads = g.q.len() / hd;
    w.clear();
    w.resize(heads * keys, 0.0);
    #[cfg(target_arch = "x86_64")]
    if hd % 8 == 0 && kernel.is_avx2() {
        // SAFETY: an AVX2 `Kernel` is only made after this CPU reported
        // AVX2, and the head width is a multiple of 8.
        unsafe { avx2::scores(g, w) };
        softmax(w, keys);
        // SAFETY: as above.
        unsafe { avx2::weighted_sums(g, w, out) };
        return;
    }
    scores(g, w);
    softmax(w, keys);
    weighted_sums(g, w, out);
}

/// Grouped-query causal attention of `q` `(n, heads × head_dim)` at
/// positions `start..start + n` over the K and V rows of positions
/// `0..len` (one slice of `kv_heads × head_dim` each): query head `h`
/// reads K/V head `h / (heads / kv_heads)`. Query rows run in parallel,
/// each head's keys in order: the result of a row never depends on the
/// others, nor on how the heads were grouped.
pub(super) fn attend_rows(
    kernel: Kernel,
    c: &LlamaConfig,
    q: &[f32],
    k: &[&[f32]],
    v: &[&[f32]],
    start: usize,
) -> Vec<f32> {
    let group = c.heads / c.kv_heads;
    let rows = q.len() / (c.heads * c.head_dim);
    // One item per query row and K/V head: the query heads that read
    // that K/V head, so each K row is read once per item. With too few
    // of those to share among the threads (a decode step's one row),
    // one item per query head instead.
    let threads = rayon::current_num_threads();
    let per_item = if rows * c.kv_heads >= 4 * threads {
        group
    } else {
        1
    };
    let span = per_item * c.head_dim;
    let items_per_row = c.heads / per_item;
    let mut out = vec![0f32; q.len()];
    let item = |w: &mut Vec<f32>, (idx, o): (usize, &mut [f32])| {
        let (i, first) = (idx / items_per_row, idx % items_per_row * per_item);
        let heads = Group {
            head_dim: c.head_dim,
            q: &q[idx * span..][..span],
            kvh: first / group,
            k,
            v,
            keys: start + i + 1,
        };
        attention_group(kernel, &heads, o, w)
    };
    // Floats of K and V read over all rows' heads; parallel only when
    // that is worth a thread, with enough of it per task.
    let items = rows * items_per_row;
    let work = rows * (start + rows) * c.heads * c.head_dim;
    if work < 1 << 16 {
        let mut w = Vec::new();
        out.chunks_mut(span)
            .enumerate()
            .for_each(|x| item(&mut w, x));
    } else {
        let min_len = (items << 14).div_ceil(work).max(1);
        out.par_chunks_mut(span)
            .enumerate()
            .with_min_len(min_len)
            .for_each_init(Vec::new, item);
    }
    out
}

/// `w[h × keys + j]`: query head `h`'s dot with key `j` (by [`dot`]),
/// times `1 / √head_dim`.
fn scores(g: &Group<'_>, w: &mut [f32]) {
    let (hd, keys, at) = (g.head_dim, g.keys, g.kvh * g.head_dim);
    let scale = 1.0 / (hd as f32).sqrt();
    for (j, kj) in g.k[..keys].iter().enumerate() {
        let kj = &kj[at..][..hd];
        for (h, qh) in g.q.chunks_exact(hd).enumerate() {
            w[h * keys + j] = dot(qh, kj) * scale;
        }
    }
}

/// Each head's softmax over its `keys` scores, as llama.cpp computes it:
/// the exponentials summed in f64, then each multiplied by the reciprocal
/// of the sum.
fn softmax(w: &mut [f32], keys: usize) {
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
}

/// Each head's `Σ_j w_j v_j`, element by element: `0 + w_0 v_0 + w_1 v_1
/// + …` in key order, each product rounded before its addition.
fn weighted_sums(g: &Group<'_>, w: &[f32], out: &mut [f32]) {
    let (hd, keys, at) = (g.head_dim, g.keys, g.kvh * g.head_dim);
    out.fill(0.0);
    for (j, vj) in g.v[..keys].iter().enumerate() {
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
/// [`avx2::scores`] computes the same bits.
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

#[cfg(target_arch = "x86_64")]
mod avx2 {
    //! [`super::scores`] and [`super::weighted_sums`] in AVX2 registers,
    //! for head widths that are multiples of 8: several independent sums
    //! at once (up to four heads' dots with one key, eight vectors of one
    //! head's output over all keys), each in the portable code's order.
    use super::super::kernels::avx2::hsum;
    use super::Group;
    use std::arch::x86_64::*;

    /// [`super::scores`].
    ///
    /// # Safety
    /// The CPU must support AVX2; `g.head_dim` must be a multiple of 8.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn scores(g: &Group<'_>, w: &mut [f32]) {
        let hd = g.head_dim;
        let heads = g.q.len() / hd;
        let mut h = 0;
        while h < heads {
            // SAFETY (of each call): AVX2 is present and `hd` is a
            // multiple of 8, this function's own preconditions.
            h += unsafe {
                match heads - h {
                    1 => scores_of::<1>(g, h, w),
                    2 => scores_of::<2>(g, h, w),
                    3 => scores_of::<3>(g, h, w),
                    _ => scores_of::<4>(g, h, w),
                }
            };
        }
    }

    /// The scores of query heads `first..first + N`; returns `N`.
    ///
    /// # Safety
    /// As [`scores`].
    #[target_feature(enable = "avx2")]
    unsafe fn scores_of<const N: usize>(g: &Group<'_>, first: usize, w: &mut [f32]) -> usize {
        let (hd, keys, at) = (g.head_dim, g.keys, g.kvh * g.head_dim);
        let scale = 1.0 / (hd as f32).sqrt();
        let q = &g.q[first * hd..][..N * hd];
        for (j, kj) in g.k[..keys].iter().enumerate() {
            let kj = &kj[at..][..hd];
            let mut acc = [_mm256_setzero_ps(); N];
            for c in (0..hd).step_by(8) {
                // SAFETY: `c + 8 <= hd` (`hd` is a multiple of 8) and `kj`
                // is `hd` floats; unaligned load.
                let kc = unsafe { _mm256_loadu_ps(kj.as_ptr().add(c)) };
                for (i, a) in acc.iter_mut().enumerate() {
                    // SAFETY: `i * hd + c + 8 <= N * hd`, the length of `q`.
                    let qc = unsafe { _mm256_loadu_ps(q.as_ptr().add(i * hd + c)) };
                    *a = _mm256_add_ps(*a, _mm256_mul_ps(qc, kc));
                }
            }
            for (i, a) in acc.iter().enumerate() {
                w[(first + i) * keys + j] = hsum(*a) * scale;
            }
        }
        N
    }

    /// [`super::weighted_sums`].
    ///
    /// # Safety
    /// The CPU must support AVX2; `g.head_dim` must be a multiple of 8.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn weighted_sums(g: &Group<'_>, w: &[f32], out: &mut [f32]) {
        let (hd, keys) = (g.head_dim, g.keys);
        for (h, oh) in out.chunks_exact_mut(hd).enumerate() {
            let wh = &w[h * keys..][..keys];
            let mut c = 0;
            // SAFETY (of each call): AVX2 is present (this function's
            // precondition).
            while c + 64 <= hd {
                unsafe { sums_of::<8>(g, wh, c, &mut oh[c..c + 64]) };
                c += 64;
            }
            while c < hd {
                unsafe { sums_of::<1>(g, wh, c, &mut oh[c..c + 8]) };
                c += 8;
            }
        }
    }

    /// Elements `c..c + 8N` of one head's weighted sum of the V rows, by
    /// the weights `wh`, into `out` (`8N` floats; the slices of rows and
    /// of `out` are bounds-checked).
    ///
    /// # Safety
    /// The CPU must support AVX2.
    #[target_feature(enable = "avx2")]
    unsafe fn sums_of<const N: usize>(g: &Group<'_>, wh: &[f32], c: usize, out: &mut [f32]) {
        let at = g.kvh * g.head_dim + c;
        let mut acc = [_mm256_setzero_ps(); N];
        for (vj, &p) in g.v[..wh.len()].iter().zip(wh) {
            let vj = &vj[at..][..8 * N];
            let p = _mm256_set1_ps(p);
            for (i, a) in acc.iter_mut().enumerate() {
                // SAFETY: `8 i + 8 <= 8 N`, the length of `vj`.
                let x = unsafe { _mm256_loadu_ps(vj.as_ptr().add(8 * i)) };
                *a = _mm256_add_ps(*a, _mm256_mul_ps(p, x));
            }
        }
        for (o, a) in out.chunks_exact_mut(8).zip(&acc) {
            // SAFETY: `o` is 8 floats; unaligned store.
            unsafe { _mm256_storeu_ps(o.as_mut_ptr(), *a) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wave(n: usize, a: f32, b: f32) -> Vec<f32> {
        (0..n).map(|i| (i as f32 * a).sin() * b).collect()
    }

    /// Every kernel's path (AVX2 where this CPU has it) gives the portable
    /// code's bits, for one to five heads at a time and head widths with
    /// and without a run of 64; and a head computed with others gives the
    /// bits it gives alone.
    #[test]
    fn every_path_gives_the_portable_bits() {
        for (kernel, hd) in Kernel::available()
            .into_iter()
            .flat_map(|k| [8, 64, 72].map(|hd| (k, hd)))
        {
            let (kv_heads, keys) = (2, 37);
            let row = kv_heads * hd;
            let kr: Vec<Vec<f32>> = (0..keys).map(|j| wave(row, 0.37 + j as f32, 3.0)).collect();
            let vr: Vec<Vec<f32>> = (0..keys).map(|j| wave(row, 1.91 - j as f32, 0.5)).collect();
            let k: Vec<&[f32]> = kr.iter().map(Vec::as_slice).collect();
            let v: Vec<&[f32]> = vr.iter().map(Vec::as_slice).collect();
            for heads in 1..=5 {
                let q = wave(heads * hd, 0.77, 1.3);
                let g = Group {
                    head_dim: hd,
                    q: &q,
                    kvh: 1,
                    k: &k,
                    v: &v,
                    keys,
                };
                let mut fast = vec![0f32; q.len()];
                attention_group(kernel, &g, &mut fast, &mut Vec::new());
                let mut w = vec![0f32; heads * keys];
                scores(&g, &mut w);
                softmax(&mut w, keys);
                let mut slow = vec![0f32; q.len()];
                weighted_sums(&g, &w, &mut slow);
                let bits = |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&fast),
                    bits(&slow),
                    "{kernel}: head width {hd}, {heads} heads"
                );
                for h in 0..heads {
                    let one = Group {
                        q: &q[h * hd..][..hd],
                        ..g
                    };
                    let mut alone = vec![0f32; hd];
                    attention_group(kernel, &one, &mut alone, &mut Vec::new());
                    assert_eq!(bits(&alone), bits(&fast[h * hd..][..hd]), "head {h}");
                }
            }
        }
    }
}
