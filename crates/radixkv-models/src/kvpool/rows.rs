//! A layer's K and V rows of some slots, as attention reads them
//! ([`with_kv_rows`]): lent in place by a pool in host memory, copied out
//! of any other kind.

use super::layout::{Kv, KvPool, KvPoolError};

/// Calls `f` with the K rows and the V rows of `slots` in `layer` (one
/// slice of the layout's `row` floats per slot, in the order of `slots`)
/// and returns its result. A pool that is one slice of host memory lends
/// its rows in place, without a copy; any other kind (a GPU pool) is read
/// into two buffers first. A layer or slot outside the pool is an error,
/// and `f` is not called.
///
/// ```
/// use radixkv_models::kvpool::{with_kv_rows, HostKvPool, Kv, KvLayout, KvPool};
/// let mut pool = HostKvPool::new(KvLayout { layers: 1, slots: 4, row: 2 });
/// pool.write_rows(0, Kv::K, &[3, 1], &[1.0, 2.0, 3.0, 4.0]).unwrap();
/// let k = with_kv_rows(&pool, 0, &[1, 3], |k, _v| k.concat()).unwrap();
/// assert_eq!(k, vec![3.0, 4.0, 1.0, 2.0]);
/// assert!(with_kv_rows(&pool, 0, &[4], |_, _| ()).is_err());
/// ```
pub fn with_kv_rows<R>(
    pool: &dyn KvPool,
    layer: usize,
    slots: &[u32],
    f: impl FnOnce(&[&[f32]], &[&[f32]]) -> R,
) -> Result<R, KvPoolError> {
    let layout = pool.layout();
    layout.check(layer, slots)?;
    if let Some(data) = pool.host_floats() {
        let data = data?;
        let rows = |kind: Kv| -> Result<Vec<&[f32]>, KvPoolError> {
            slots
                .iter()
                .map(|&slot| {
                    let at = layout.offset(layer, kind, slot as usize);
                    data.get(at..at + layout.row).ok_or_else(|| {
                        KvPoolError::OutOfRange(format!(
                            "slot {slot}'s row at {at} of a pool of {}",
                            data.len()
                        ))
                    })
                })
                .collect()
        };
        return Ok(f(&rows(Kv::K)?, &rows(Kv::V)?));
    }
    let k = pool.read_rows(layer, Kv::K, slots)?;
    let v = pool.read_rows(layer, Kv::V, slots)?;
    let n = slots.len();
    Ok(f(&split(&k, n, layout.row)?, &split(&v, n, layout.row)?))
}

/// `buf`, read for `n` slots, as their rows of `row` floats.
fn split(buf: &[f32], n: usize, row: usize) -> Result<Vec<&[f32]>, KvPoolError> {
    if buf.len() != n * row {
        return Err(KvPoolError::Shape {
            got: buf.len(),
            slots: n,
            row,
        });
    }
    Ok((0..n).map(|i| &buf[i * row..(i + 1) * row]).collect())
}
