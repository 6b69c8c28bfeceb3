//! Integer elements narrowed to ids (`0..2^32`), every one checked: the
//! one conversion that buffers and tensors share.

use pyo3::exceptions::PyValueError;
use pyo3::{PyErr, PyResult};

/// The `ValueError` for `what[i] = v`, outside the ids' range.
pub(crate) fn out_of_range(v: i128, what: &str, i: usize) -> PyErr {
    PyValueError::new_err(format!(
        "{what}[{i}] = {v} is outside 0..2^32 (ids are unsigned 32-bit)"
    ))
}

/// An integer element type of a buffer, narrowed to an id.
pub(crate) trait Element: Copy {
    /// The value widened to 64 bits (sign-extended if signed): its top 32
    /// bits are zero exactly when it lies in `0..2^32`.
    fn bits(self) -> u64;
    /// The value as an id (truncating; call once `bits` showed it in range).
    fn narrow(self) -> u32;
    /// The value, for an error message.
    fn wide(self) -> i128;
}

macro_rules! element {
    ($($t:ty),*) => {$(
        impl Element for $t {
            #[inline(always)]
            fn bits(self) -> u64 {
                // Widening sign-extends a signed value (a negative one
                // sets the top bits) and zero-extends an unsigned one.
                self as i64 as u64
            }
            #[inline(always)]
            fn narrow(self) -> u32 {
                self as u32
            }
            fn wide(self) -> i128 {
                self as i128
            }
        }
    )*};
}
element!(u8, u16, u32, u64, i8, i16, i32, i64);

/// The `n` elements of type `T` at `base` as ids, each checked to lie in
/// `0..2^32`. An aligned buffer is read as a slice, a chunk at a time:
/// one branch-free loop narrows the chunk and one checks it whole while
/// it is in the L1 cache.
///
/// # Safety
/// `base` points at `n` initialised elements of `T` (any alignment) that
/// stay valid and unchanged while this runs.
pub(crate) unsafe fn narrow<T: Element>(
    base: *const u8,
    n: usize,
    what: &str,
) -> PyResult<Vec<u32>> {
    if (base as usize).is_multiple_of(std::mem::align_of::<T>()) {
        // SAFETY: aligned, and `n` initialised `T`s (the caller's contract).
        let src = unsafe { std::slice::from_raw_parts(base.cast::<T>(), n) };
        // Chunk by chunk, the elements are narrowed, then their top bits
        // ORed together while the chunk is still in the L1 cache (an error
        // is then located in a second pass).
        let mut out = Vec::with_capacity(n);
        let mut top = 0u64;
        for chunk in src.chunks(2048) {
            out.extend(chunk.iter().map(|v| v.narrow()));
            top |= chunk.iter().fold(0u64, |acc, v| acc | v.bits());
        }
        if top >> 32 == 0 {
            return Ok(out);
        }
        let i = src.iter().position(|v| v.bits() >> 32 != 0).unwrap_or(0);
        return Err(out_of_range(src[i].wide(), what, i));
    }
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        // SAFETY: `i < n`, so the element lies inside the caller's range;
        // an unaligned read takes any alignment.
        let v = unsafe { base.cast::<T>().add(i).read_unaligned() };
        if v.bits() >> 32 != 0 {
            return Err(out_of_range(v.wide(), what, i));
        }
        out.push(v.narrow());
    }
    Ok(out)
}
