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
    let heads = g.q.len() / g.head_dim;
    w.clear();
    w.resize(heads * g.keys, 0.0);
    group_scores(kernel, g, w);
    softmax(w, g.keys);
    group_sums(kernel, g, w, 0..g.head_dim, out);
}

/// Whether the AVX2 paths serve this kernel and head width.
#[cfg(target_arch = "x86_64")]
fn vector(kernel: Kernel, head_dim: usize) -> bool {
    head_dim.is_multiple_of(8) && kernel.is_avx2()
}

/// [`scores`] of the group, in vector registers where [`vector`] says so
/// (the same bits).
fn group_scores(kernel: Kernel, g: &Group<'_>, w: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if vector(kernel, g.head_dim) {
        // SAFETY: an AVX2 `Kernel` is only made after this CPU reported
        // AVX2, and the head width is a multiple of 8.
        unsafe { avx2::scores(g, w) };
        return;
    }
    scores(g, w);
}

/// [`weighted_sums`] of the group's elements `elems` (multiples of 8 on
/// the vector path), in vector registers where [`vector`] says so (the
/// same bits).
fn group_sums(
    kernel: Kernel,
    g: &Group<'_>,
    w: &[f32],
    elems: std::ops::Range<usize>,
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if vector(kernel, g.head_dim) && elems.start.is_multiple_of(8) && elems.end.is_multiple_of(8) {
        // SAFETY: as in `group_scores`; the range's ends are multiples
        // of 8.
        unsafe { avx2::weighted_sums(g, w, elems, out) };
        return;
    }
    weighted_sums(g, w, elems, out);
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
    let (hd, group) = (c.head_dim, c.heads / c.kv_heads);
    let rows = q.len() / (c.heads * hd);
    let threads = rayon::current_num_threads();
    let mut out = vec![0f32; q.len()];
    // Floats of K and V read over all rows' heads; parallel only when
    // that is worth a thread, with enough of it per task.
    let work = rows * (start + rows) * c.heads * hd;
    // One item per query row and K/V head: the query heads that read
    // that K/V head, so each K and V row is read once per item.
    let span = group * hd;
    let item = |w: &mut Vec<f32>, (idx, o): (usize, &mut [f32])| {
        let (i, kvh) = (idx / c.kv_heads, idx % c.kv_heads);
        let heads = Group {
            head_dim: hd,
            q: &q[idx * span..][..span],
            kvh,
            k,
            v,
            keys: start + i + 1,
        };
        attention_group(kernel, &heads, o, w)
    };
    let items = rows * c.kv_heads;
    if work < 1 << 16 {
        let mut w = Vec::new();
        out.chunks_mut(span)
            .enumerate()
            .for_each(|x| item(&mut w, x));
    } else if items >= 4 * threads {
        let min_len = (items << 14).div_ceil(work).max(1);
        out.par_chunks_mut(span)
            .enumerate()
            .with_min_len(min_len)
            .for_each_init(Vec::new, item);
    } else {
        // Too few items to share among the threads (a decode step's one
        // row): each row's work is split instead.
        let row = c.heads * hd;
        for (i, (qi, oi)) in q
            .chunks_exact(row)
            .zip(out.chunks_exact_mut(row))
            .enumerate()
        {
            attend_split(kernel, c, qi, k, v, start + i + 1, oi, threads);
        }
    }
    out
}

/// One query row's attention over the first `keys` K and V rows, each
/// step split among `threads`: the scores by ranges of keys (every K/V
/// head's query heads together, so each K row is read once), each head's
/// softmax, then the weighted sums by K/V head and range of elements
/// (each V row read once). Every score and every element's sum is the
/// computation [`attention_group`] makes, in the same order: the same
/// bits.
#[allow(clippy::too_many_arguments)]
fn attend_split(
    kernel: Kernel,
    c: &LlamaConfig,
    q: &[f32],
    k: &[&[f32]],
    v: &[&[f32]],
    keys: usize,
    out: &mut [f32],
    threads: usize,
) {
    let (hd, group) = (c.head_dim, c.heads / c.kv_heads);
    let span = group * hd;
    let heads_of = |kvh: usize, lo: usize, n: usize| Group {
        head_dim: hd,
        q: &q[kvh * span..][..span],
        kvh,
        k: &k[lo..lo + n],
        v: &v[lo..lo + n],
        keys: n,
    };
    // Scores, `w[h × keys + j]`: each range of keys gets its part of
    // every head's row.
    let len = keys.div_ceil(2 * threads);
    let mut w = vec![0f32; c.heads * keys];
    let mut ranges: Vec<Vec<&mut [f32]>> = (0..keys.div_ceil(len))
        .map(|_| Vec::with_capacity(c.heads))
        .collect();
    for wh in w.chunks_mut(keys) {
        for (r, part) in ranges.iter_mut().zip(wh.chunks_mut(len)) {
            r.push(part);
        }
    }
    ranges
        .into_par_iter()
        .enumerate()
        .for_each_init(Vec::new, |scratch, (r, mut parts)| {
            let n = parts[0].len();
            for kvh in 0..c.kv_heads {
                scratch.clear();
                scratch.resize(group * n, 0.0);
                group_scores(kernel, &heads_of(kvh, r * len, n), scratch);
                for (dst, s) in parts[kvh * group..].iter_mut().zip(scratch.chunks_exact(n)) {
                    dst.copy_from_slice(s);
                }
            }
        });
    w.par_chunks_mut(keys).for_each(|wh| softmax(wh, keys));
    // Weighted sums: each K/V head's elements in `split` ranges (whole
    // runs of 8), enough items for every thread.
    let mut split = 1;
    while c.kv_heads * split < 2 * threads && hd.is_multiple_of(16 * split) {
        split *= 2;
    }
    let part = hd / split;
    let sums: Vec<(usize, usize, Vec<f32>)> = (0..c.kv_heads * split)
        .into_par_iter()
        .map(|i| {
            let (kvh, e) = (i / split, i % split * part);
            let mut o = vec![0f32; span];
            let wg = &w[kvh * group * keys..][..group * keys];
            group_sums(kernel, &heads_of(kvh, 0, keys), wg, e..e + part, &mut o);
            (kvh, e, o)
        })
        .collect();
    for (kvh, e, o) in sums {
        for (dst, src) in out[kvh * span..][..span]
            .chunks_exact_mut(hd)
            .zip(o.chunks_exact(hd))
        {
            dst[e..e + part].copy_from_slice(&src[e..e + part]);
        }
    }
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

/// Elements `elems` of each head's `Σ_j w_j v_j`, element by element:
/// `0 + w_0 v_0 + w_1 v_1 + …` in key order, each product rounded before
/// its addition; `out` is the shape of `g.q`, and only `elems` of each
/// head's row are written.
fn weighted_sums(g: &Group<'_>, w: &[f32], elems: std::ops::Range<usize>, out: &mut [f32]) {
    let (hd, keys, at) = (g.head_dim, g.keys, g.kvh * g.head_dim);
    for oh in out.chunks_exact_mut(hd) {
        oh[elems.clone()].fill(0.0);
    }
    for (j, vj) in g.v[..keys].iter().enumerate() {
        let vj = &vj[at..][..hd][elems.clone()];
        for (h, oh) in out.chunks_exact_mut(hd).enumerate() {
            let p = w[h * keys + j];
            for (acc, &x) in oh[elems.clone()].iter_mut().zip(vj) {
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
    //! for head widths that are multiples of 8: many independent sums at
    //! once, so that no one chain of additions sets the pace (a few heads'
    //! dots with a few keys; a few heads' outputs, a few vectors each, over
    //! all keys), each sum in the portable code's order.
    use super::super::kernels::avx2::hsum;
    use super::Group;
    use std::arch::x86_64::*;

    /// Rows ahead of the one being read whose lines are asked for.
    const AHEAD: usize = 12;

    /// Asks for every cache line of `x`, which need not start on one (a
    /// hint: reads nothing).
    #[inline(always)]
    fn prefetch(x: &[f32]) {
        let (start, end) = (x.as_ptr() as usize, x.as_ptr_range().end as usize);
        for line in (start & !63..end).step_by(64) {
            // SAFETY: a prefetch reads nothing and never faults, whatever
            // the address.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(line as *const i8) };
        }
    }

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
                    1 => scores_of::<1, 4>(g, h, w),
                    2 => scores_of::<2, 4>(g, h, w),
                    3 => scores_of::<3, 3>(g, h, w),
                    _ => scores_of::<4, 2>(g, h, w),
                }
            };
        }
    }

    /// The scores of query heads `first..first + N`, `K` keys at a time
    /// (then the rest one by one); returns `N`.
    ///
    /// # Safety
    /// As [`scores`].
    #[target_feature(enable = "avx2")]
    unsafe fn scores_of<const N: usize, const K: usize>(
        g: &Group<'_>,
        first: usize,
        w: &mut [f32],
    ) -> usize {
        let keys = g.keys;
        let mut j = 0;
        // SAFETY (of each call): this function's preconditions.
        while j + K <= keys {
            unsafe { scores_block::<N, K>(g, first, j, w) };
            j += K;
        }
        while j < keys {
            unsafe { scores_block::<N, 1>(g, first, j, w) };
            j += 1;
        }
        N
    }

    /// The scores of query heads `first..first + N` with keys `j..j + K`.
    ///
    /// # Safety
    /// As [`scores`].
    #[target_feature(enable = "avx2")]
    unsafe fn scores_block<const N: usize, const K: usize>(
        g: &Group<'_>,
        first: usize,
        j: usize,
        w: &mut [f32],
    ) {
        let (hd, keys, at) = (g.head_dim, g.keys, g.kvh * g.head_dim);
        let scale = 1.0 / (hd as f32).sqrt();
        let q = &g.q[first * hd..][..N * hd];
        for t in 0..K {
            if let Some(r) = g.k.get(j + t + AHEAD) {
                prefetch(&r[at..][..hd]);
            }
        }
        let k: [&[f32]; K] = std::array::from_fn(|t| &g.k[j + t][at..][..hd]);
        let mut acc = [[_mm256_setzero_ps(); K]; N];
        for c in (0..hd).step_by(8) {
            // SAFETY: `c + 8 <= hd` (`hd` is a multiple of 8) and each
            // key is `hd` floats; unaligned loads.
            let kc: [__m256; K] =
                std::array::from_fn(|t| unsafe { _mm256_loadu_ps(k[t].as_ptr().add(c)) });
            for (i, a) in acc.iter_mut().enumerate() {
                // SAFETY: `i * hd + c + 8 <= N * hd`, the length of `q`.
                let qc = unsafe { _mm256_loadu_ps(q.as_ptr().add(i * hd + c)) };
                for (a, &kc) in a.iter_mut().zip(&kc) {
                    *a = _mm256_add_ps(*a, _mm256_mul_ps(qc, kc));
                }
            }
        }
        for (i, a) in acc.iter().enumerate() {
            for (t, a) in a.iter().enumerate() {
                w[(first + i) * keys + j + t] = hsum(*a) * scale;
            }
        }
    }

    /// [`super::weighted_sums`].
    ///
    /// # Safety
    /// The CPU must support AVX2; `g.head_dim` and both ends of `elems`
    /// must be multiples of 8.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn weighted_sums(
        g: &Group<'_>,
        w: &[f32],
        elems: std::ops::Range<usize>,
        out: &mut [f32],
    ) {
        let hd = g.head_dim;
        let heads = g.q.len() / hd;
        let mut h = 0;
        while h < heads {
            // SAFETY (of each call): AVX2 is present and the ends of
            // `elems` are multiples of 8, this function's preconditions.
            h += unsafe {
                match heads - h {
                    1 => sums_of::<1, 8>(g, w, h, elems.clone(), out),
                    2 => sums_of::<2, 4>(g, w, h, elems.clone(), out),
                    3 => sums_of::<3, 4>(g, w, h, elems.clone(), out),
                    _ => sums_of::<4, 3>(g, w, h, elems.clone(), out),
                }
            };
        }
    }

    /// Elements `elems` of heads `first..first + H`'s weighted sums, `8N`
    /// elements at a time (then 8 at a time); returns `H`.
    ///
    /// # Safety
    /// As [`weighted_sums`].
    #[target_feature(enable = "avx2")]
    unsafe fn sums_of<const H: usize, const N: usize>(
        g: &Group<'_>,
        w: &[f32],
        first: usize,
        elems: std::ops::Range<usize>,
        out: &mut [f32],
    ) -> usize {
        let mut c = elems.start;
        // SAFETY (of each call): AVX2 is present.
        while c + 8 * N <= elems.end {
            unsafe { sums_block::<H, N>(g, w, first, c, out) };
            c += 8 * N;
        }
        while c < elems.end {
            unsafe { sums_block::<H, 1>(g, w, first, c, out) };
            c += 8;
        }
        H
    }

    /// Elements `c..c + 8N` of heads `first..first + H`'s weighted sums
    /// of the V rows, by their weights in `w`, into `out` (the shape of
    /// `g.q`; the slices of rows, weights and `out` are bounds-checked).
    ///
    /// # Safety
    /// The CPU must support AVX2.
    #[target_feature(enable = "avx2")]
    unsafe fn sums_block<const H: usize, const N: usize>(
        g: &Group<'_>,
        w: &[f32],
        first: usize,
        c: usize,
        out: &mut [f32],
    ) {
        let (hd, keys) = (g.head_dim, g.keys);
        let at = g.kvh * hd + c;
        let wh: [&[f32]; H] = std::array::from_fn(|i| &w[(first + i) * keys..][..keys]);
        let mut acc = [[_mm256_setzero_ps(); N]; H];
        for (j, vj) in g.v[..keys].iter().enumerate() {
            if let Some(r) = g.v.get(j + AHEAD) {
                prefetch(&r[at..][..8 * N]);
            }
            let vj = &vj[at..][..8 * N];
            let p: [__m256; H] = std::array::from_fn(|i| _mm256_set1_ps(wh[i][j]));
            for t in 0..N {
                // SAFETY: `8 t + 8 <= 8 N`, the length of `vj`.
                let x = unsafe { _mm256_loadu_ps(vj.as_ptr().add(8 * t)) };
                for (a, p) in acc.iter_mut().zip(&p) {
                    a[t] = _mm256_add_ps(a[t], _mm256_mul_ps(*p, x));
                }
            }
        }
        for (i, a) in acc.iter().enumerate() {
            let o = &mut out[(first + i) * hd + c..][..8 * N];
            for (o, a) in o.chunks_exact_mut(8).zip(a) {
                // SAFETY: `o` is 8 floats; unaligned store.
                unsafe { _mm256_storeu_ps(o.as_mut_ptr(), *a) };
            }
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
                weighted_sums(&g, &w, 0..hd, &mut slow);
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

    /// Rows attended by [`attend_rows`] (a decode step's single row, split
    /// among the threads by keys and by elements; and several rows, one
    /// task per row and K/V head) give the bits of [`attention_group`]
    /// computed head group by head group, on every kernel and with 1 to 3
    /// threads in the pool.
    #[test]
    fn split_rows_give_the_bits_of_whole_groups() {
        let arch = super::super::arch::Architecture::named("llama").expect("llama is known");
        for (kernel, hd, threads) in Kernel::available()
            .into_iter()
            .flat_map(|k| [8, 64, 72].map(|hd| (k, hd)))
            .flat_map(|(k, hd)| [1, 2, 3].map(|t| (k, hd, t)))
        {
            let c = LlamaConfig {
                arch: *arch,
                layers: 1,
                heads: 6,
                kv_heads: 2,
                head_dim: hd,
                hidden: 6 * hd,
                vocab: 1,
                context: 4096,
                rope_base: 10_000.0,
                rms_eps: 1e-5,
            };
            let keys = 1100;
            let row = c.kv_heads * hd;
            let kr: Vec<Vec<f32>> = (0..keys).map(|j| wave(row, 0.37 + j as f32, 3.0)).collect();
            let vr: Vec<Vec<f32>> = (0..keys).map(|j| wave(row, 1.91 - j as f32, 0.5)).collect();
            let k: Vec<&[f32]> = kr.iter().map(Vec::as_slice).collect();
            let v: Vec<&[f32]> = vr.iter().map(Vec::as_slice).collect();
            let width = c.heads * hd;
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .expect("a thread pool");
            for rows in [1, 2, 9] {
                let start = keys - rows;
                let q = wave(rows * width, 0.77, 1.3);
                let got = pool.install(|| attend_rows(kernel, &c, &q, &k, &v, start));
                let span = width / c.kv_heads;
                for (i, (qi, gi)) in q.chunks(width).zip(got.chunks(width)).enumerate() {
                    for kvh in 0..c.kv_heads {
                        let g = Group {
                            head_dim: hd,
                            q: &qi[kvh * span..][..span],
                            kvh,
                            k: &k,
                            v: &v,
                            keys: start + i + 1,
                        };
                        let mut want = vec![0f32; span];
                        attention_group(kernel, &g, &mut want, &mut Vec::new());
                        let bits = |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                        assert_eq!(
                            bits(&gi[kvh * span..][..span]),
                            bits(&want),
                            "{kernel}: head width {hd}, {threads} threads, {rows} rows, row {i}, K/V head {kvh}"
                        );
                    }
                }
            }
        }
    }
}
