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
/// use radixkv_engine::kvpool::{with_kv_rows, HostKvPool, Kv, KvLayout, KvPool};
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kvpool::{HostKvPool, KvLayout};
    use std::any::Any;

    /// A pool that is not host memory: every read goes through
    /// `read_rows` of an inner host pool.
    struct Staged(HostKvPool);

    impl KvPool for Staged {
        fn layout(&self) -> KvLayout {
            self.0.layout()
        }
        fn write_rows(
            &mut self,
            layer: usize,
            kv: Kv,
            slots: &[u32],
            rows: &[f32],
        ) -> Result<(), KvPoolError> {
            self.0.write_rows(layer, kv, slots, rows)
        }
        fn read_rows(&self, layer: usize, kv: Kv, slots: &[u32]) -> Result<Vec<f32>, KvPoolError> {
            self.0.read_rows(layer, kv, slots)
        }
        fn as_any(&self) -> &dyn Any {
            self
        }
        fn as_any_mut(&mut self) -> &mut dyn Any {
            self
        }
    }

    /// In place or staged, the same rows in the order of the slots; a
    /// bad layer or slot is an error either way.
    #[test]
    fn host_and_staged_pools_give_the_same_rows() {
        let layout = KvLayout {
            layers: 2,
            slots: 8,
            row: 3,
        };
        let mut host = HostKvPool::new(layout);
        let rows: Vec<f32> = (0..8 * 3).map(|i| i as f32).collect();
        let all: Vec<u32> = (0..8).collect();
        host.write_rows(1, Kv::K, &all, &rows).unwrap();
        let neg: Vec<f32> = rows.iter().map(|x| -x).collect();
        host.write_rows(1, Kv::V, &all, &neg).unwrap();
        let staged = Staged(host.clone());
        let slots = [6, 0, 3];
        let read = |p: &dyn KvPool| with_kv_rows(p, 1, &slots, |k, v| (k.concat(), v.concat()));
        let (k, v) = read(&host).unwrap();
        assert_eq!(k, [18.0, 19.0, 20.0, 0.0, 1.0, 2.0, 9.0, 10.0, 11.0]);
        assert_eq!(v, k.iter().map(|x| -x).collect::<Vec<_>>());
        assert_eq!(read(&staged).unwrap(), (k, v));
        for p in [&host as &dyn KvPool, &staged] {
            assert!(with_kv_rows(p, 2, &[0], |_, _| ()).is_err());
            assert!(with_kv_rows(p, 0, &[8], |_, _| ()).is_err());
        }
    }
}
