//! # radixkv-tools
//!
//! The tools that drive radixkv's engine and cache, apart from the serving
//! runtime (`radixkv-engine` and `radixkv-server` depend on none of this,
//! nor on its trace decompression and progress bar). The `radixkv` CLI's
//! `replay`, `hitrate`, `ops` and `stress` commands are these modules.
//!
//! ```
//! use radixkv_tools::trace::gsp;
//! // SGLang's generated-shared-prefix workload: 4 groups of 3 prompts.
//! let w = gsp(4, 3, 64, 8, 16, 42);
//! assert_eq!(w.requests.len(), 12);
//! ```
//!
//! | module | what it is |
//! | --- | --- |
//! | [`trace`] | request traces: one type, the Mooncake and agentic readers, the gsp / chat / tot generators |
//! | [`replay`] | `radixkv replay`: a trace through the engine, summarized |
//! | [`hitrate`] | `radixkv hitrate`: single-device lifecycle replay per policy and capacity, Belady's bound |
//! | [`conformance`] | `radixkv ops`: the SGLang conformance runner |
//! | [`torture`] | `radixkv stress`: random lifecycles under memory pressure, then an audit |
//!
//! ## Cargo features
//!
//! | feature | default | what it adds |
//! | --- | --- | --- |
//! | `candle` | on | `replay` with the tiny candle transformer (`--model tiny`) |
//! | `cuda` | off | its KV pools in GPU memory |

pub mod conformance;
pub mod hitrate;
pub mod replay;
pub mod torture;
pub mod trace;
