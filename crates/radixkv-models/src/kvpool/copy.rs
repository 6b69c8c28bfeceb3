//! Copies between pools: page pairs to slot runs, runs to float spans.

use super::layout::{outside, spans, Kv, KvPool, KvPoolError};
use radixkv::SlotRun;

/// Page pairs (`(source page, destination page)`, `page_size` slots each)
/// as slot runs, consecutive pairs merged: `(a, b), (a + 1, b + 1)` is one
/// run of two pages. Pairs keep their order (a later pair that overlaps an
/// earlier one still overwrites it). A page whose slots do not fit in a
/// `u32` is [`KvPoolError::OutOfRange`]; `page_size` 0 gives no run.
///
/// ```
/// use radixkv::SlotRun;
/// use radixkv_models::kvpool::page_runs;
/// let runs = page_runs(&[(1, 6), (2, 7), (3, 8), (9, 0)], 4).unwrap();
/// assert_eq!(runs, vec![
///     SlotRun { src: 4, dst: 24, len: 12 }, // pages 1..4 -> 6..9
///     SlotRun { src: 36, dst: 0, len: 4 },  // page 9 -> 0
/// ]);
/// ```
pub fn page_runs(pairs: &[(u32, u32)], page_size: usize) -> Result<Vec<SlotRun>, KvPoolError> {
    if page_size == 0 {
        return Ok(Vec::new());
    }
    let too_large = |p: u32| {
        KvPoolError::OutOfRange(format!("page {p} of {page_size} slots is past slot 2^32"))
    };
    let ps = u32::try_from(page_size).map_err(|_| too_large(0))?;
    let mut runs: Vec<SlotRun> = Vec::new();
    for &(a, b) in pairs {
        let src = a.checked_mul(ps).ok_or_else(|| too_large(a))?;
        let dst = b.checked_mul(ps).ok_or_else(|| too_large(b))?;
        if let Some(last) = runs.last_mut() {
            let follows = last.src.checked_add(last.len) == Some(src)
                && last.dst.checked_add(last.len) == Some(dst);
            if let (true, Some(len)) = (follows, last.len.checked_add(ps)) {
                last.len = len;
                continue;
            }
        }
        runs.push(SlotRun { src, dst, len: ps });
    }
    Ok(runs)
}

/// Copies `runs` (every layer, K and V) from `src` to `dst`: one copy per
/// run, layer and K/V (a slice copy host to host, one CUDA memcpy when a
/// GPU pool is involved, the staged `read_rows`/`write_rows` path for pool
/// kinds it does not know; see the [module docs](crate::kvpool)). Runs are checked
/// first: a run outside either pool (however large its `src + len`) is
/// [`KvPoolError::OutOfRange`], pools of different layers or rows are
/// [`KvPoolError::LayoutMismatch`], and then nothing was copied. An empty
/// run copies nothing; runs are copied in order.
///
/// ```
/// use radixkv::SlotRun;
/// use radixkv_models::kvpool::{copy_runs, HostKvPool, Kv, KvLayout, KvPool, KvPoolError};
/// let layout = KvLayout { layers: 1, slots: 8, row: 2 };
/// let mut a = HostKvPool::new(layout);
/// a.write_rows(0, Kv::K, &[1, 2, 3], &[1.0, 1.5, 2.0, 2.5, 3.0, 3.5]).unwrap();
/// let mut b = HostKvPool::new(layout);
/// // Slots 1..4 of `a` -> 5..8 of `b`: one memcpy for K, one for V.
/// copy_runs(&a, &mut b, &[SlotRun { src: 1, dst: 5, len: 3 }]).unwrap();
/// assert_eq!(b.read_rows(0, Kv::K, &[5, 7]).unwrap(), vec![1.0, 1.5, 3.0, 3.5]);
/// // Past the end: a typed error, and `b` is unchanged.
/// let bad = [SlotRun { src: 0, dst: 0, len: 1 }, SlotRun { src: 6, dst: 0, len: 3 }];
/// assert!(matches!(copy_runs(&a, &mut b, &bad), Err(KvPoolError::OutOfRange(_))));
/// assert_eq!(b.read_rows(0, Kv::K, &[0]).unwrap(), vec![0.0, 0.0]);
/// ```
pub fn copy_runs(
    src: &dyn KvPool,
    dst: &mut dyn KvPool,
    runs: &[SlotRun],
) -> Result<(), KvPoolError> {
    let (ls, ld) = (src.layout(), dst.layout());
    let spans = spans(&ls, &ld, runs)?;
    if spans.is_empty() {
        return Ok(());
    }
    // Both slices only when both pools are in host memory: a GPU copy
    // reaches its host side itself.
    if src.in_host_memory() && dst.in_host_memory() {
        if let (Some(s), Some(d)) = (src.host_floats(), dst.host_floats_mut()) {
            let (s, d) = (s?, d?);
            for sp in &spans {
                let from = s.get(sp.src..sp.src + sp.len).ok_or_else(|| outside(sp))?;
                let to = d
                    .get_mut(sp.dst..sp.dst + sp.len)
                    .ok_or_else(|| outside(sp))?;
                to.copy_from_slice(from);
            }
            return Ok(());
        }
    }
    #[cfg(feature = "cuda")]
    if super::cuda::copy_spans(src, dst, &spans)? {
        return Ok(());
    }
    // Staged through the host: one read and one write per run, layer and
    // K/V (the runs were checked above).
    for layer in 0..ls.layers {
        for kv in [Kv::K, Kv::V] {
            for r in runs.iter().filter(|r| r.len > 0) {
                let from: Vec<u32> = (0..r.len).map(|j| r.src + j).collect();
                let to: Vec<u32> = (0..r.len).map(|j| r.dst + j).collect();
                let rows = src.read_rows(layer, kv, &from)?;
                dst.write_rows(layer, kv, &to, &rows)?;
            }
        }
    }
    Ok(())
}

/// Copies whole pages (`(source page, destination page)` pairs, `page_size`
/// slots each, every layer, K and V) from `src` to `dst`: consecutive
/// pairs are merged into runs ([`page_runs`]) and copied by [`copy_runs`],
/// one copy per run, layer and K/V. Errors as [`copy_runs`]'s.
pub fn copy_pages(
    src: &dyn KvPool,
    dst: &mut dyn KvPool,
    pairs: &[(u32, u32)],
    page_size: usize,
) -> Result<(), KvPoolError> {
    copy_runs(src, dst, &page_runs(pairs, page_size)?)
}
