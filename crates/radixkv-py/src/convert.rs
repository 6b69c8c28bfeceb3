//! Small conversions at the boundary: tiers from Python (`0`, `1`, …, or
//! `"host"`), and `u32` slices to numpy arrays.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyByteArray;
use radixkv::{DeviceId, Tier};

/// The name of the host tier in Python.
pub(crate) const HOST: &str = "host";

/// A tier from Python: a device index (`int >= 0`) or `"host"`.
pub(crate) fn tier(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Tier> {
    if let Ok(s) = obj.extract::<String>() {
        return if s == HOST {
            Ok(Tier::Host)
        } else {
            Err(PyValueError::new_err(format!(
                "{what}: a tier is a device index or \"host\", not {s:?}"
            )))
        };
    }
    if obj.is_instance_of::<pyo3::types::PyBool>() {
        return Err(PyTypeError::new_err(format!(
            "{what}: a tier is a device index or \"host\", not a bool"
        )));
    }
    match obj.extract::<i64>() {
        Ok(d) => u32::try_from(d)
            .map(|d| Tier::Device(DeviceId(d)))
            .map_err(|_| {
                PyValueError::new_err(format!("{what}: device {d} is not an index (0..2^32)"))
            }),
        Err(_) => Err(PyTypeError::new_err(format!(
            "{what}: a tier is a device index or \"host\", not {}",
            obj.get_type()
                .name()
                .map_or_else(|_| "?".into(), |n| n.to_string())
        ))),
    }
}

/// A tier as Python names it.
pub(crate) fn tier_to_py(py: Python<'_>, t: Tier) -> PyResult<Py<PyAny>> {
    Ok(match t {
        Tier::Host => HOST.into_pyobject(py)?.into_any().unbind(),
        Tier::Device(d) => d.0.into_pyobject(py)?.into_any().unbind(),
    })
}

static FROMBUFFER: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// `v` as a one-dimensional `numpy.uint32` array (one copy, into memory the
/// array owns).
pub(crate) fn array(py: Python<'_>, v: &[u32]) -> PyResult<Py<PyAny>> {
    let frombuffer = FROMBUFFER.import(py, "numpy", "frombuffer")?;
    // SAFETY: any `u32` slice is a valid byte slice of 4 bytes per element
    // (no padding, every bit pattern of a byte is valid).
    let bytes =
        unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) };
    let buf = PyByteArray::new(py, bytes);
    Ok(frombuffer.call1((buf, "<u4"))?.unbind())
}

/// `v` as a one-dimensional `numpy.int64` array (SGLang's slot indices;
/// one copy, widened, into memory the array owns: writable, so
/// `torch.from_numpy` shares it).
pub(crate) fn array_i64(py: Python<'_>, v: &[u32]) -> PyResult<Py<PyAny>> {
    let frombuffer = FROMBUFFER.import(py, "numpy", "frombuffer")?;
    let mut bytes = Vec::with_capacity(8 * v.len());
    for &x in v {
        bytes.extend_from_slice(&i64::from(x).to_le_bytes());
    }
    let buf = PyByteArray::new(py, &bytes);
    Ok(frombuffer.call1((buf, "<i8"))?.unbind())
}
