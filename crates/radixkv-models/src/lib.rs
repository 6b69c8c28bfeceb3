//! # radixkv-models
//!
//! Models for the radixkv engine, apart from its runtime: KV memory per
//! device, the seam a model computing for real plugs into, and two models.
//! A model here is run by the engine through
//! [`ModelBackend`](radixkv_engine::sched::batch::ModelBackend)
//! ([`backend::PagedBackend`] implements it); the engine itself imports
//! nothing from this crate, and the CLI and the server pick the model.
//!
//! ## Modules
//!
//! | module | what it is |
//! | --- | --- |
//! | [`kvpool`] | KV memory per device: host, or CUDA and pinned host memory (feature `cuda`) |
//! | `backend` | the engine's backend for models that compute for real: the model interface ([`PagedModel`](backend::PagedModel): K/V in [`kvpool`] pools at the cache's slots), the backend that runs any of them, verification against a model's reference (feature `candle`) |
//! | `tiny` | a tiny random-weights candle transformer, a paged model (feature `candle`) |
//! | `gguf` | GGUF llamas (SmolLM2-135M): tokenizer, chat template, the paged model and its reference (feature `gguf`) |
//!
//! ## Cargo features
//!
//! | feature | default | what it adds |
//! | --- | --- | --- |
//! | `candle` | on | the backend for models that compute (`backend`) and the tiny candle transformer (`tiny`) |
//! | `gguf` | on | GGUF llamas: tokenizer, chat template, the paged model and its reference (`gguf`) |
//! | `cuda` | off | KV pools in GPU memory through cudarc, loaded at run time (builds without a toolkit) |

#[cfg(feature = "candle")]
pub mod backend;
#[cfg(feature = "gguf")]
pub mod gguf;
pub mod kvpool;
#[cfg(feature = "candle")]
pub mod tiny;
