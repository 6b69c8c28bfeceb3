//! Token ids and KV values from Python objects, as the core's `u32`s.
//!
//! | input | how it is read | copies |
//! | --- | --- | --- |
//! | a read-only C-contiguous buffer of 32-bit unsigned ints (a `numpy.uint32` array with `writeable=False`, `memoryview(bytes).cast('I')`) | borrowed through the buffer protocol, held (so it cannot be resized) until the call returns | none |
//! | a writable C-contiguous buffer of 32-bit unsigned ints (`array('I')`, a writable `numpy.uint32` array) | copied while the GIL is held: the walk runs without it, and another thread could write the buffer meanwhile | one |
//! | a C-contiguous buffer of other integers (`array('q')`, `numpy.int64`, …) | converted, every id checked to lie in `0..2^32` | one |
//! | a contiguous one-dimensional int64 or int32 torch tensor on the CPU | read at its `data_ptr()`, every id checked (see `tensor.rs`) | one |
//! | any other torch tensor (no buffer protocol) | `tensor.numpy(force=True)` (detached, on the CPU), then as above | one more |
//! | a list, a tuple, any sequence of ints | extracted, checked | one |
//!
//! The buffer protocol is reached through `PyObject_GetBuffer` and
//! `PyBuffer_Release` directly: they and their `Py_buffer` are in the
//! stable ABI from CPython 3.11 and unchanged since 3.3, so an abi3 wheel
//! built for 3.9 uses them as they are on 3.9 and 3.10 too.

use crate::narrow::{narrow, out_of_range};
use crate::tensor::{tensor_ids, FromTensor};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use std::os::raw::{c_char, c_int, c_void};

/// CPython's `Py_buffer` (`Include/pybuffer.h`; the same since 3.3).
#[repr(C)]
struct RawBuffer {
    buf: *mut c_void,
    obj: *mut pyo3::ffi::PyObject,
    len: isize,
    itemsize: isize,
    readonly: c_int,
    ndim: c_int,
    format: *mut c_char,
    shape: *mut isize,
    strides: *mut isize,
    suboffsets: *mut isize,
    internal: *mut c_void,
}

extern "C" {
    fn PyObject_GetBuffer(
        obj: *mut pyo3::ffi::PyObject,
        view: *mut RawBuffer,
        flags: c_int,
    ) -> c_int;
    fn PyBuffer_Release(view: *mut RawBuffer);
}

/// `PyBUF_C_CONTIGUOUS | PyBUF_FORMAT`: a C-contiguous view with its
/// struct-module format.
const C_CONTIGUOUS_WITH_FORMAT: c_int = 0x0038 | 0x0004;

/// A buffer view held until dropped (with the GIL held: the caller's
/// method frame drops it). Neither `Send` nor `Sync` (it holds raw
/// pointers): it never leaves the thread that made it.
struct View(Box<RawBuffer>);

impl Drop for View {
    fn drop(&mut self) {
        // SAFETY: the view was filled by a successful `PyObject_GetBuffer`
        // and is released once, here, on the thread that holds the GIL
        // (views live in a method's frame, which holds it when it ends).
        unsafe { PyBuffer_Release(&mut *self.0) };
    }
}

/// Integer element types a buffer may hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Elem {
    Unsigned(usize),
    Signed(usize),
}

/// The element type of a struct-module format (native or little-endian
/// order; `None` for anything else).
fn elem_of(format: &str, itemsize: usize) -> Option<Elem> {
    let f = format.trim_start_matches(['@', '=', '<']);
    if format.starts_with(['>', '!']) && itemsize > 1 {
        return None;
    }
    let code = f.chars().next()?;
    if f.len() != 1 {
        return None;
    }
    match code {
        'B' | 'H' | 'I' | 'L' | 'Q' | 'N' => Some(Elem::Unsigned(itemsize)),
        'b' | 'h' | 'i' | 'l' | 'q' | 'n' => Some(Elem::Signed(itemsize)),
        _ => None,
    }
}

/// Ids read from a Python object: borrowed from its buffer, or converted.
pub(crate) struct Ids {
    /// The borrowed slice's view (keeps it alive and unresizable).
    view: Option<View>,
    owned: Vec<u32>,
    /// The borrowed slice (when `view` is some).
    borrowed: (*const u32, usize),
}

// SAFETY: shared access only reads: `as_slice` hands out `&[u32]`, which
// a walk may read on another thread while the GIL is released. The
// borrowed pointer stays valid while `view` is held (the exporter cannot
// free or resize a buffer with an export outstanding), and only a buffer
// its exporter declared read-only is borrowed (a writable one is copied),
// so no Python code writes it through that object meanwhile. `Ids` is not
// `Send`: the view is released (`PyBuffer_Release`, which needs the GIL)
// on the thread that made it, when the method's frame ends.
unsafe impl Sync for Ids {}

impl Ids {
    /// The ids.
    pub(crate) fn as_slice(&self) -> &[u32] {
        match self.view {
            // SAFETY: `borrowed` points at `len` initialised, aligned
            // `u32`s of the buffer `view` holds (checked when it was made).
            Some(_) => unsafe { std::slice::from_raw_parts(self.borrowed.0, self.borrowed.1) },
            None => &self.owned,
        }
    }

    /// Whether the ids are borrowed without a copy.
    pub(crate) fn is_borrowed(&self) -> bool {
        self.view.is_some()
    }

    fn owned(owned: Vec<u32>) -> Ids {
        Ids {
            view: None,
            owned,
            borrowed: (std::ptr::null(), 0),
        }
    }
}

/// Reads `obj` (argument `what`) as ids in `0..2^32`.
pub(crate) fn ids(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Ids> {
    match tensor_ids(obj, what, false)? {
        Some(FromTensor::Read(ids)) => return Ok(Ids::owned(ids)),
        Some(FromTensor::Array(array)) => return ids(&array, what),
        None => {}
    }
    if let Some(ids) = from_buffer(obj, what)? {
        return Ok(ids);
    }
    // No buffer: a torch tensor (the first one seen), or a sequence.
    match tensor_ids(obj, what, true)? {
        Some(FromTensor::Read(ids)) => return Ok(Ids::owned(ids)),
        Some(FromTensor::Array(array)) => return ids(&array, what),
        None => {}
    }
    if obj.is_instance_of::<pyo3::types::PyString>() || obj.is_instance_of::<pyo3::types::PyBytes>()
    {
        return Err(PyTypeError::new_err(format!(
            "{what}: expected a sequence or array of integers, got {}",
            obj.get_type().name()?
        )));
    }
    let values: Vec<i64> = obj.extract().map_err(|_| {
        PyTypeError::new_err(format!(
            "{what}: expected a sequence or array of integers, got {}",
            obj.get_type()
                .name()
                .map_or_else(|_| "?".into(), |n| n.to_string())
        ))
    })?;
    let mut out = Vec::with_capacity(values.len());
    for (i, v) in values.into_iter().enumerate() {
        out.push(checked(v as i128, what, i)?);
    }
    Ok(Ids::owned(out))
}

/// `v` as an id, or a `ValueError` naming the argument and the index.
fn checked(v: i128, what: &str, i: usize) -> PyResult<u32> {
    u32::try_from(v).map_err(|_| out_of_range(v, what, i))
}

/// The ids of `obj`'s buffer, if it exports a C-contiguous one of
/// integers; `None` (and no error) for an object without a buffer.
fn from_buffer(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Option<Ids>> {
    let mut raw = Box::new(RawBuffer {
        buf: std::ptr::null_mut(),
        obj: std::ptr::null_mut(),
        len: 0,
        itemsize: 0,
        readonly: 0,
        ndim: 0,
        format: std::ptr::null_mut(),
        shape: std::ptr::null_mut(),
        strides: std::ptr::null_mut(),
        suboffsets: std::ptr::null_mut(),
        internal: std::ptr::null_mut(),
    });
    // SAFETY: `obj` is a live object (bound to the GIL, held); `raw` is a
    // writable `Py_buffer`-shaped struct that the call fills on success.
    if unsafe { PyObject_GetBuffer(obj.as_ptr(), &mut *raw, C_CONTIGUOUS_WITH_FORMAT) } != 0 {
        // No buffer, or not a C-contiguous one: read it another way.
        let _ = PyErr::take(obj.py());
        return Ok(None);
    }
    let view = View(raw);
    let raw = &*view.0;
    if raw.ndim > 1 {
        return Err(PyValueError::new_err(format!(
            "{what}: expected a one-dimensional array, got {} dimensions",
            raw.ndim
        )));
    }
    let itemsize = usize::try_from(raw.itemsize).unwrap_or(0);
    let format = if raw.format.is_null() {
        "B".to_string()
    } else {
        // SAFETY: a non-null `format` is a NUL-terminated string the
        // exporter keeps while the view lives.
        unsafe { std::ffi::CStr::from_ptr(raw.format) }
            .to_string_lossy()
            .into_owned()
    };
    let Some(elem) = elem_of(&format, itemsize) else {
        return Err(PyTypeError::new_err(format!(
            "{what}: expected an array of integers, got elements of format {format:?}"
        )));
    };
    let n = usize::try_from(raw.len)
        .unwrap_or(0)
        .checked_div(itemsize)
        .unwrap_or(0);
    let base = raw.buf as *const u8;
    if elem == Elem::Unsigned(4)
        && raw.readonly != 0
        && (base as usize).is_multiple_of(std::mem::align_of::<u32>())
    {
        return Ok(Some(Ids {
            borrowed: (base.cast::<u32>(), n),
            view: Some(view),
            owned: Vec::new(),
        }));
    }
    let read: unsafe fn(*const u8, usize, &str) -> PyResult<Vec<u32>> = match elem {
        Elem::Unsigned(1) => narrow::<u8>,
        Elem::Unsigned(2) => narrow::<u16>,
        Elem::Unsigned(4) => narrow::<u32>,
        Elem::Unsigned(8) => narrow::<u64>,
        Elem::Signed(1) => narrow::<i8>,
        Elem::Signed(2) => narrow::<i16>,
        Elem::Signed(4) => narrow::<i32>,
        Elem::Signed(8) => narrow::<i64>,
        _ => {
            return Err(PyTypeError::new_err(format!(
                "{what}: integers of {itemsize} bytes are not supported"
            )))
        }
    };
    // SAFETY: `read` takes elements of `itemsize` bytes, and the view holds
    // `n` of them at `base`, kept alive and unresized by `view` until this
    // function returns.
    let out = unsafe { read(base, n, what) }?;
    Ok(Some(Ids::owned(out)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_map_to_integer_types() {
        assert_eq!(elem_of("I", 4), Some(Elem::Unsigned(4)));
        assert_eq!(elem_of("<q", 8), Some(Elem::Signed(8)));
        assert_eq!(elem_of("=l", 8), Some(Elem::Signed(8)));
        assert_eq!(elem_of(">q", 8), None, "big-endian is refused");
        assert_eq!(elem_of("d", 8), None, "floats are refused");
        assert_eq!(elem_of("2I", 8), None, "repeats are refused");
    }
}
