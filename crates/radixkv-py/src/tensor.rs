//! Ids from a torch tensor, which has no buffer protocol.
//!
//! A one-dimensional, contiguous CPU tensor of `torch.int64` or
//! `torch.int32` is read where it lies (`data_ptr()`, `numel()`): one
//! narrowing copy, every id checked, as for an int64 numpy array. Any
//! other tensor (on a GPU, strided, another dtype or shape) goes through
//! `tensor.numpy(force=True)` (detached, on the CPU) and the buffer path,
//! which says what is wrong with it.
//!
//! torch is never imported here: the first tensor is recognised by its
//! type's module (torch is imported by then), after which `torch.Tensor`
//! is compared by pointer.

use crate::narrow::narrow;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyType};

/// What is kept of torch, once a tensor was seen.
struct Torch {
    tensor: Py<PyType>,
    int64: Py<PyAny>,
    int32: Py<PyAny>,
    /// `numpy`'s keyword arguments, `force=True` (never changed).
    force: Py<PyDict>,
}

static TORCH: PyOnceLock<Torch> = PyOnceLock::new();

impl Torch {
    fn load(py: Python<'_>) -> PyResult<Torch> {
        let torch = py.import("torch")?;
        let force = PyDict::new(py);
        force.set_item("force", true)?;
        Ok(Torch {
            tensor: torch.getattr("Tensor")?.cast_into::<PyType>()?.unbind(),
            int64: torch.getattr("int64")?.unbind(),
            int32: torch.getattr("int32")?.unbind(),
            force: force.unbind(),
        })
    }
}

/// What a torch tensor gives.
pub(crate) enum FromTensor<'py> {
    /// Its ids, read where they lie.
    Read(Vec<u32>),
    /// Its `numpy(force=True)` array, for the buffer path to read.
    Array(Bound<'py, PyAny>),
}

/// What `obj` gives if it is a torch tensor, `None` if it is not. Cheap
/// for anything else once torch is known; before that, it looks at the
/// type's module only when `probe` is set (the caller found no buffer).
pub(crate) fn tensor_ids<'py>(
    obj: &Bound<'py, PyAny>,
    what: &str,
    probe: bool,
) -> PyResult<Option<FromTensor<'py>>> {
    let py = obj.py();
    let torch = match TORCH.get(py) {
        Some(torch) => torch,
        None if probe && from_torch(obj)? => TORCH.get_or_try_init(py, || Torch::load(py))?,
        None => return Ok(None),
    };
    if !obj.get_type().is(torch.tensor.bind(py)) && !obj.is_instance(torch.tensor.bind(py))? {
        return Ok(None);
    }
    if let Some(out) = in_place(obj, torch, what)? {
        return Ok(Some(FromTensor::Read(out)));
    }
    let array = obj.call_method(intern!(py, "numpy"), (), Some(torch.force.bind(py)))?;
    Ok(Some(FromTensor::Array(array)))
}

/// Whether `obj`'s type is defined in torch.
fn from_torch(obj: &Bound<'_, PyAny>) -> PyResult<bool> {
    let module = obj.get_type().module()?;
    let module = module.to_cow()?;
    Ok(module == "torch" || module.starts_with("torch."))
}

/// The ids of a contiguous one-dimensional int64 or int32 CPU tensor,
/// read at its data pointer; `None` for any other tensor.
fn in_place(obj: &Bound<'_, PyAny>, torch: &Torch, what: &str) -> PyResult<Option<Vec<u32>>> {
    let py = obj.py();
    let dtype = obj.getattr(intern!(py, "dtype"))?;
    let wide = if dtype.is(torch.int64.bind(py)) {
        true
    } else if dtype.is(torch.int32.bind(py)) {
        false
    } else {
        return Ok(None);
    };
    let plain = obj.getattr(intern!(py, "is_cpu"))?.is_truthy()?
        && obj.call_method0(intern!(py, "dim"))?.extract::<usize>()? == 1
        && obj
            .call_method0(intern!(py, "is_contiguous"))?
            .is_truthy()?
        && !obj.call_method0(intern!(py, "is_neg"))?.is_truthy()?;
    if !plain {
        return Ok(None);
    }
    let n: usize = obj.call_method0(intern!(py, "numel"))?.extract()?;
    if n == 0 {
        return Ok(Some(Vec::new()));
    }
    let ptr: usize = obj.call_method0(intern!(py, "data_ptr"))?.extract()?;
    let base = ptr as *const u8;
    // SAFETY: a contiguous one-dimensional CPU tensor of `n > 0` elements
    // of its dtype (8 bytes for int64, 4 for int32) holds them at
    // `data_ptr()`, in host memory its storage owns. The tensor is alive
    // (borrowed by this call) and the GIL is held while they are copied,
    // so its storage is not freed or swapped under the copy by Python
    // code; a torch kernel running in another thread without the GIL
    // could resize it, which no caller of a prefix cache does, and which
    // `tensor.numpy()` (a view of the same memory) would not survive
    // either.
    let out = unsafe {
        if wide {
            narrow::<i64>(base, n, what)
        } else {
            narrow::<i32>(base, n, what)
        }
    }?;
    Ok(Some(out))
}
