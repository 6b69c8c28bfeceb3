//! `#[py_methods]` and `#[py_function]`: PyO3's `#[pymethods]` and
//! `#[pyfunction]` with every function's body run inside
//! `crate::errors::guarded`, which turns a Rust panic into a
//! `RuntimeError` (an `Exception`: PyO3's own `PanicException` is a
//! `BaseException` that passes `except Exception`).
//!
//! radixkv-py writes no bare `#[pymethods]` or `#[pyfunction]`
//! (`scripts/python-package-check.sh` checks), so a new entry point cannot
//! forget the guard. A function that returns `PyResult<T>` keeps its
//! signature; one that returns a plain `T` (or nothing) returns
//! `PyResult<T>` (`PyResult<()>`) instead, which Python cannot tell apart.

use proc_macro::TokenStream;
use quote::quote;
use syn::{parse_macro_input, Block, ImplItem, ItemFn, ItemImpl, ReturnType, Type};

/// `#[pymethods]` on an `impl` block, each method's body guarded.
#[proc_macro_attribute]
pub fn py_methods(attr: TokenStream, item: TokenStream) -> TokenStream {
    if !attr.is_empty() {
        return error(attr.into(), "#[py_methods] takes no arguments");
    }
    let mut block = parse_macro_input!(item as ItemImpl);
    for item in &mut block.items {
        if let ImplItem::Fn(f) = item {
            guard(&mut f.sig.output, &mut f.block);
        }
    }
    quote!(#[::pyo3::pymethods] #block).into()
}

/// `#[pyfunction]` on a function, its body guarded.
#[proc_macro_attribute]
pub fn py_function(attr: TokenStream, item: TokenStream) -> TokenStream {
    if !attr.is_empty() {
        return error(attr.into(), "#[py_function] takes no arguments");
    }
    let mut f = parse_macro_input!(item as ItemFn);
    guard(&mut f.sig.output, &mut f.block);
    quote!(#[::pyo3::pyfunction] #f).into()
}

fn error(at: proc_macro2::TokenStream, message: &str) -> TokenStream {
    syn::Error::new_spanned(at, message)
        .to_compile_error()
        .into()
}

/// Whether `ty` is spelled `PyResult<…>` (the crate's only result type at
/// the boundary).
fn is_py_result(ty: &Type) -> bool {
    match ty {
        Type::Path(p) => p
            .path
            .segments
            .last()
            .is_some_and(|s| s.ident == "PyResult"),
        _ => false,
    }
}

/// Rewrites `-> R { body }` so that the body runs inside the guard. The
/// body stays a closure of its own, so its `return`s and `?`s mean what
/// they meant.
fn guard(output: &mut ReturnType, block: &mut Block) {
    let body = &*block;
    let (ret, wrapped) = match output {
        ReturnType::Type(_, ty) if is_py_result(ty) => {
            let ty = &**ty;
            (
                quote!(#ty),
                quote!({ crate::errors::guarded(|| -> #ty #body) }),
            )
        }
        ReturnType::Type(_, ty) => {
            let ty = &**ty;
            (
                quote!(::pyo3::PyResult<#ty>),
                quote!({ crate::errors::guarded(|| ::pyo3::PyResult::Ok((|| -> #ty #body)())) }),
            )
        }
        ReturnType::Default => (
            quote!(::pyo3::PyResult<()>),
            quote!({ crate::errors::guarded(|| { (|| #body)(); ::pyo3::PyResult::Ok(()) }) }),
        ),
    };
    *output = syn::parse_quote!(-> #ret);
    *block = syn::parse_quote!(#wrapped);
}
